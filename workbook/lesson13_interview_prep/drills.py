"""Interview drills: numeric questions from lessons 00–12, with new numbers on every seed.

Each drill is a small generator registered with :func:`drill`: it takes a
``random.Random``, draws the question's numbers, and returns the question's text and
an answer **computed** by the simulator's cost model (:mod:`simcluster.costmodel`), the
planner (:mod:`simcluster.planner`), the serving and scheduling simulators, or a
formula that already lives in a lesson's package — never a typed-in number. So the
answer is right for any numbers drawn, and a learner can drill the same question with
``seed=1, 2, 3, ...``::

    from workbook.lesson13_interview_prep import drills
    q = drills.make("ring_allreduce_time", seed=3)   # one drill
    print(q.text)
    drills.grade(q, "about 1.2 ms")                  # -> Grade(correct=..., message=...)
    qs = drills.draw(level="interview", n=5, seed=0) # a set
    drills.timed(level="hard", n=3, seed=7)          # the countdown widget (Jupyter)

Answers are graded with a tolerance (``rel_tol``, by level) and units: "1.5 GB",
"1500 MB", "1.4 GiB", "12%", "0.12", "about 3e9", "3 × 10^9", "2.5 ms", "250 µs",
"400 TFLOP/s" (:func:`parse`). A bare number is read in the unit the question asks for.

docs/drills.md says how drills are built and how to add one.
"""

import importlib
import math
import random
import re
from dataclasses import dataclass

from simcluster import costmodel, planner, serving
from simcluster import scheduling as sched
from simcluster import spec as sc_spec
from simcluster.goodput import daly_interval, expected_goodput, young_interval
from workbook import outputs
from workbook.checking import Failure, check, number, on_a_rank, refuse_reference
from workbook.formulas import (korthikanti_bytes, model_state_bytes, p2p_formula,
                               tp_comm_elements)
from workbook.models import activation_bytes
from workbook.pipeline import bubble_formula, bubble_uneven

LEVELS = ("warm-up", "interview", "hard")
# How far from the computed answer a response may be. Warm-ups are one formula; an
# interview question is an estimate (a rounded intermediate is fine); a hard one chains
# several, or compares with the simulator's NCCL model. All stay far below 2× (a factor
# forgotten, such as the 2 of a ring's two phases, is always wrong).
REL_TOL = {"warm-up": 0.05, "interview": 0.1, "hard": 0.2}
SECONDS = {"warm-up": 90, "interview": 180, "hard": 300}   # the countdown, per question

# ------------------------------------------------------------------ units

# unit -> (kind, factor to the base unit: s, B, B/s, FLOP, FLOP/s, 1)
_UNITS = {}
for _name, _f in (("ns", 1e-9), ("µs", 1e-6), ("μs", 1e-6), ("us", 1e-6), ("ms", 1e-3),
                  ("s", 1.0), ("sec", 1.0), ("second", 1.0), ("seconds", 1.0),
                  ("min", 60.0), ("mins", 60.0), ("minute", 60.0), ("minutes", 60.0),
                  ("h", 3600.0), ("hr", 3600.0), ("hrs", 3600.0), ("hour", 3600.0),
                  ("hours", 3600.0), ("day", 86400.0), ("days", 86400.0)):
    _UNITS[_name] = ("time", _f)
for _prefix, _f in (("", 1.0), ("K", 1e3), ("k", 1e3), ("M", 1e6), ("G", 1e9), ("T", 1e12),
                    ("P", 1e15), ("E", 1e18)):
    _UNITS[f"{_prefix}B"] = ("bytes", _f)
    _UNITS[f"{_prefix}B/s"] = ("bandwidth", _f)
    _UNITS[f"{_prefix}FLOP"] = ("flops", _f)
    _UNITS[f"{_prefix}FLOPs"] = ("flops", _f)
    _UNITS[f"{_prefix}FLOP/s"] = ("flop_rate", _f)
    _UNITS[f"{_prefix}FLOPS"] = ("flop_rate", _f)
for _prefix, _f in (("Ki", 2**10), ("Mi", 2**20), ("Gi", 2**30), ("Ti", 2**40), ("Pi", 2**50)):
    _UNITS[f"{_prefix}B"] = ("bytes", _f)
    _UNITS[f"{_prefix}B/s"] = ("bandwidth", _f)
_UNITS.update({"byte": ("bytes", 1.0), "bytes": ("bytes", 1.0), "%": ("fraction", 0.01),
               "percent": ("fraction", 0.01), "": ("count", 1.0)})
for _label in ("GPUs", "GPU", "nodes", "node", "tokens", "token", "steps", "step",
               "micro-batches", "microbatches", "buckets", "bucket", "replicas", "replica",
               "sequences", "failures", "requests", "parameters", "params", "x", "×",
               "FLOP/B", "FLOP/byte", "times", "jobs"):
    _UNITS[_label] = ("count", 1.0)
for _label in ("tokens/s", "requests/s", "req/s", "/s"):
    _UNITS[_label] = ("rate", 1.0)
# Case-insensitive fallback for what people type ("gb", "TB/S", "Ms" stays ms): only the
# units whose lower-case spelling is not ambiguous.
_LOWER = {}
for _name in _UNITS:
    _LOWER.setdefault(_name.lower(), set()).add(_name)
_LOWER = {k: next(iter(v)) for k, v in _LOWER.items() if len(v) == 1 or k in ("kb", "kb/s")}
_LOWER.update({"kb": "KB", "kb/s": "KB/s", "b": "B", "b/s": "B/s"})

KIND_WORDS = {"time": "a time", "bytes": "a size in bytes", "bandwidth": "a bandwidth",
              "flops": "a number of FLOPs", "flop_rate": "a rate in FLOP/s",
              "fraction": "a fraction or percentage", "count": "a plain number",
              "rate": "a rate per second"}
_EXAMPLES = {"time": "2.5 ms, 300 µs, 1.2 s, 4 h", "bytes": "1.5 GB, 1500 MB, 1.4 GiB",
             "bandwidth": "50 GB/s", "flops": "3e18 FLOP, 3 × 10^18",
             "flop_rate": "400 TFLOP/s", "fraction": "12% or 0.12",
             "count": "42, 1.5e3, 3 × 10^9", "rate": "1200 tokens/s"}


def unit_kind(unit):
    """``(kind, factor)`` of a unit's spelling (``"GB"`` -> ``("bytes", 1e9)``), or None."""
    unit = unit.strip()
    if unit in _UNITS:
        return _UNITS[unit]
    name = _LOWER.get(unit.lower())
    return _UNITS[name] if name else None


_ABOUT = re.compile(r"^(about|approx\.?|approximately|roughly|around|circa|ca\.|~|≈|=)\s*",
                    re.IGNORECASE)
_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁻", "0123456789-")
_MANTISSA = r"[+-]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d*)?|[+-]?\.\d+"
_NUMBER = re.compile(
    rf"^(?P<m>{_MANTISSA})\s*"
    r"(?:[eE](?P<e>[+-]?\d+)"
    r"|\s*(?:[x×*·]|\*\*)?\s*10\s*(?:\^|\*\*)\s*\(?(?P<p>[+-]?\d+)\)?"
    r"|\s*(?:[x×*·])\s*10(?P<sup>[⁻]?[⁰¹²³⁴⁵⁶⁷⁸⁹]+))?\s*")
_WORDS = {"thousand": 1e3, "million": 1e6, "billion": 1e9, "trillion": 1e12}


class ParseError(ValueError):
    """A response that is not a number in a unit of the right kind; the message says why."""


def parse(text, unit=""):
    """The value, in base units (s, B, B/s, FLOP, FLOP/s, a fraction), of a typed answer.

    ``unit`` is the unit the question asks for: a bare number is read in it ("1.5" for
    GB is 1.5e9 B) and a unit typed must be of its kind (a time for ms, ...). For a
    percentage (``unit="%"``), "12%" and "0.12" are both 0.12; a bare number above 1 is
    taken as a percentage. Raises :class:`ParseError` with a message a learner can act on.
    """
    want = unit_kind(unit)
    if want is None:
        raise ValueError(f"unknown unit {unit!r}")
    kind, factor = want
    if isinstance(text, bool):
        raise ParseError(f"{text!r} is not a number")
    if isinstance(text, (int, float)):
        if not math.isfinite(text):
            raise ParseError(f"{text!r} is not a finite number")
        return _bare(float(text), kind, factor)
    raw = "" if text is None else str(text)
    s = raw.strip().replace("\u2212", "-").replace("\u2009", " ").replace("\u202f", " ")
    if not s:
        raise ParseError("type an answer first, e.g. " + _EXAMPLES[kind])
    s = _ABOUT.sub("", s)
    match = _NUMBER.match(s)
    if not match or not re.search(r"\d", match.group("m")):
        raise ParseError(f"{raw!r} is not a number: write it like {_EXAMPLES[kind]}")
    value = float(match.group("m").replace(",", ""))
    exponent = match.group("e") or match.group("p") or (
        match.group("sup") and match.group("sup").translate(_SUPERSCRIPT))
    if exponent:
        value *= 10.0 ** int(exponent)
    rest = s[match.end():].strip()
    word = rest.split(" ")[0].lower() if rest else ""
    if word in _WORDS:
        value *= _WORDS[word]
        rest = rest[len(word):].strip()
    if not math.isfinite(value):
        raise ParseError(f"{raw!r} is too large a number")
    if not rest:
        return _bare(value, kind, factor)
    got = unit_kind(rest.replace(" ", "")) or unit_kind(rest)
    if got is None:
        raise ParseError(f"{raw!r}: unknown unit {rest!r}; this answer is "
                         f"{KIND_WORDS[kind]}, like {_EXAMPLES[kind]}")
    if got[0] != kind:
        if kind == "count" and got[0] == "fraction":
            return value * got[1]
        raise ParseError(f"{raw!r}: {rest!r} is {KIND_WORDS[got[0]]}, but this answer is "
                         f"{KIND_WORDS[kind]} (in {unit or 'no unit'})")
    return value * got[1]


def _bare(value, kind, factor):
    if kind == "fraction":       # "0.12" is a fraction, "12" a percentage
        return value if abs(value) <= 1 else value / 100
    return value * factor


# ------------------------------------------------------------------ formatting


def sig(value, digits=3):
    """``value`` with ``digits`` significant digits (fewer if float noise could move the
    last one, as :func:`workbook.outputs.fixed` decides): ``1,530``, ``0.0823``,
    ``2.7e24``; trailing zeros dropped."""
    value = float(value)
    if value == 0 or not math.isfinite(value):
        return str(value)
    magnitude = math.floor(math.log10(abs(value)))
    for d in range(digits, 0, -1):
        shift = magnitude - d + 1                   # the last digit kept is 10**shift
        try:
            text = outputs.fixed(value / 10.0 ** shift, 0)   # d digits, as an integer
        except ValueError:
            continue
        if len(text.lstrip("-")) > d:               # 999.7 rounded up to 1000
            shift, text = shift + 1, str(round(int(text) / 10))
        if magnitude >= 6:                          # 2.7e24 FLOP, 1.29e10 parameters
            mantissa = int(text) / 10 ** (d - 1)
            exp = shift + d - 1
            return f"{_trim(f'{mantissa:.{d - 1}f}')}e{exp}"
        if shift >= 0:
            return f"{int(text) * 10 ** shift:,}"
        return _trim(f"{int(text) * 10.0 ** shift:.{-shift}f}")
    return f"{value:.1e}"


def _trim(text):
    """``"16"`` for ``"16.0"``, ``"1.5"`` for ``"1.50"``."""
    return text.rstrip("0").rstrip(".") if "." in text else text


def show(value, unit):
    """``value`` (base units) written in ``unit``: ``show(1.53e9, "GB") == "1.53 GB"``."""
    kind, factor = unit_kind(unit)
    if kind == "fraction":
        return f"{sig(value * 100)}%"
    number_text = sig(value / factor)
    return f"{number_text} {unit}".strip()


# Units a question may switch between when its answer would read 1,000 or more, or below
# 0.1, in the drill's unit (3,900 MB is asked as 3.9 GB, 0.02 GB as 20 MB; 0.36 ms stays).
# Hours, minutes and days are chosen by the drill.
_LADDERS = (("B", "KB", "MB", "GB", "TB", "PB"), ("µs", "ms", "s"),
            ("FLOP", "GFLOP", "TFLOP", "PFLOP", "EFLOP"), ("GB/s", "TB/s"),
            ("GFLOP/s", "TFLOP/s", "PFLOP/s"))


def readable_unit(value, unit):
    """``unit``, or the unit of its ladder in which ``value`` (base units) reads from 1 to
    999 when in ``unit`` it would read 1,000 or more, or below 0.1:
    ``readable_unit(3.9e9, "MB") == "GB"``; other units are kept."""
    ladder = next((lad for lad in _LADDERS if unit in lad), None)
    if ladder is None or value <= 0 or 0.1 <= value / unit_kind(unit)[1] < 1000:
        return unit
    fitting = [u for u in ladder if value / unit_kind(u)[1] >= 1]
    return fitting[-1] if fitting else ladder[0]


def _n(x):
    """An input of a question: 1,024 for 1024, 0.5 for 0.5."""
    if float(x).is_integer():
        return f"{int(x):,}"
    return f"{x:g}"


# ------------------------------------------------------------------ drills


@dataclass(frozen=True)
class Question:
    """One drawn drill. ``answer`` is in base units (s, B, B/s, FLOP, FLOP/s, a fraction,
    a count); ``unit`` is the unit the question asks for; ``worked`` the worked answer
    (markdown, ending with the answer); ``takeaway`` one line to remember."""

    name: str
    level: str
    lesson: str
    seed: int
    text: str
    answer: float
    unit: str
    rel_tol: float
    worked: str
    takeaway: str

    @property
    def answer_text(self):
        """The answer written in the question's unit, e.g. ``"1.53 GB"``."""
        return show(self.answer, self.unit)

    def __repr__(self):     # never the answer: a repr can end up in a stored output
        return f"<drill {self.name} (lesson {self.lesson}, {self.level}, seed={self.seed})>"


@dataclass(frozen=True)
class Drill:
    """A registered generator: ``make(rng) -> dict(text, answer, unit, worked, takeaway)``."""

    name: str
    level: str
    lesson: str
    make: object
    rel_tol: float

    def __call__(self, seed=0):
        """The question this drill draws for ``seed``."""
        rng = random.Random(f"{self.name}:{seed}")   # its own stream: adding a drill moves none
        out = self.make(rng)
        answer = float(out["answer"])
        if not math.isfinite(answer):
            raise ValueError(f"drill {self.name}, seed {seed}: the answer is {answer}")
        unit = readable_unit(answer, out["unit"])
        worked = f"{out['worked']}\n\n**Answer: {show(answer, unit)}**"
        return Question(self.name, self.level, self.lesson, seed, out["text"], answer, unit,
                        self.rel_tol, worked, out["takeaway"])


DRILLS = {}


def drill(level, lesson, rel_tol=None):
    """Register ``make(rng)`` as a drill of ``level`` from lesson ``lesson`` ("05")."""
    if level not in LEVELS:
        raise ValueError(f"level must be one of {LEVELS}, got {level!r}")

    def register(make):
        if make.__name__ in DRILLS:
            raise ValueError(f"a drill called {make.__name__!r} exists already")
        make.__doc__ = make.__doc__ or (f"Lesson {lesson}'s {level} drill: draws its "
                                        "numbers from ``rng``; see :func:`make`.")
        DRILLS[make.__name__] = Drill(make.__name__, level, lesson, make,
                                      REL_TOL[level] if rel_tol is None else rel_tol)
        return make

    return register


def _q(text, answer, unit, worked, takeaway):
    return dict(text=text, answer=answer, unit=unit, worked=worked, takeaway=takeaway)


# The numbers questions draw from: sizes people meet in interviews.
P = (4, 8, 16, 32, 64)
SIZES = (16e6, 64e6, 256e6, 1e9, 4e9)              # bytes
ALPHAS = (2e-6, 5e-6, 10e-6, 20e-6)                 # seconds
BANDWIDTHS = (25e9, 50e9, 100e9, 200e9, 400e9)      # bytes/s
PARAMS = (1.3e9, 7e9, 13e9, 30e9, 70e9, 175e9)
NO_COMPUTE = float("inf")                           # gamma = 0: reductions are free here


def _link(alpha, bandwidth):
    return costmodel.LinkCost(alpha, bandwidth, NO_COMPUTE)


def _size(nbytes):
    return show(nbytes, "GB") if nbytes >= 1e9 else show(nbytes, "MB")


def _gpt(rng, sizes=((24, 2048, 16), (32, 4096, 32), (40, 5120, 40), (48, 6144, 48),
                     (80, 8192, 64), (96, 12288, 96))):
    layers, hidden, heads = rng.choice(sizes)
    seq = rng.choice((1024, 2048, 4096))
    return planner.TransformerConfig(layers=layers, hidden=hidden, heads=heads, seq_len=seq,
                                     vocab=51200)


def _llama(rng):
    layers, hidden, heads, kv = rng.choice(((32, 4096, 32, 32), (32, 4096, 32, 8),
                                            (40, 5120, 40, 40), (80, 8192, 64, 8),
                                            (60, 6656, 52, 52), (48, 6144, 48, 8)))
    return planner.TransformerConfig(layers=layers, hidden=hidden, heads=heads, kv_heads=kv,
                                     seq_len=4096, vocab=32000, ffn_hidden=int(hidden * 8 / 3)
                                     // 256 * 256, swiglu=True, tied_embeddings=False)


def _model_text(cfg):
    kv = "" if cfg.kv == cfg.heads else f", {cfg.kv} KV heads (GQA)"
    return (f"{cfg.layers} layers, hidden {_n(cfg.hidden)}, {cfg.heads} heads{kv}")


H100 = sc_spec.preset("dgx-h100").device_of(0)
A100 = sc_spec.preset("dgx-a100").device_of(0)


# ----------------------------------------------- lesson 00: the simulated GPU


@drill("warm-up", "00")
def matmul_time(rng):
    m, n, k = (rng.choice((4096, 8192, 16384)) for _ in range(3))
    gpu = rng.choice((H100, A100))
    flops = 2 * m * n * k
    nbytes = 2 * (m * k + k * n + m * n)
    cost = costmodel.CostModel(sc_spec.ClusterSpec("one", (sc_spec.NodeSpec(
        "n", 1, gpu, sc_spec.LINKS["nvlink4"]),), sc_spec.NetworkSpec(sc_spec.LINKS["ndr-ib"])))
    t = cost.roofline(0, flops, sc_spec.DTYPES["bfloat16"], nbytes)
    return _q(f"A bf16 matmul ({_n(m)}×{_n(k)}) @ ({_n(k)}×{_n(n)}) on one {gpu.name} "
              f"({show(gpu.peak_flops['bfloat16'], 'TFLOP/s')} dense bf16, "
              f"{show(gpu.hbm_bandwidth, 'TB/s')} HBM). How long at the roofline?",
              t, "ms",
              f"FLOPs = 2·m·n·k = {show(flops, 'TFLOP')}; bytes = 2·(mk + kn + mn) = "
              f"{show(nbytes, 'MB')}. Compute {show(flops / gpu.peak_flops['bfloat16'], 'ms')} "
              f"vs memory {show(nbytes / gpu.hbm_bandwidth, 'ms')}: the larger wins "
              "(simcluster's CostModel.roofline).",
              "A big square matmul is compute-bound: time = 2mnk / peak.")


@drill("warm-up", "00")
def ridge_point(rng):
    gpu = rng.choice((H100, A100))
    dtype = rng.choice(("bfloat16", "float32", "tf32"))
    ridge = gpu.peak_flops[dtype] / gpu.hbm_bandwidth
    return _q(f"{gpu.name}: {show(gpu.peak_flops[dtype], 'TFLOP/s')} in {dtype}, "
              f"{show(gpu.hbm_bandwidth, 'TB/s')} of HBM. Above how many FLOPs per byte "
              "of memory traffic is a kernel compute-bound (the ridge point)?",
              ridge, "FLOP/B",
              f"peak / bandwidth = {show(gpu.peak_flops[dtype], 'TFLOP/s')} / "
              f"{show(gpu.hbm_bandwidth, 'TB/s')}.",
              "Below the ridge point a kernel waits on memory, above it on the ALUs.")


@drill("interview", "00")
def skinny_matmul_time(rng):
    b = rng.choice((1, 4, 16, 64))
    h = rng.choice((4096, 8192, 12288))
    gpu = rng.choice((H100, A100))
    flops, nbytes = 2 * b * h * h, 2 * (h * h + 2 * b * h)
    t = max(flops / gpu.peak_flops["bfloat16"], nbytes / gpu.hbm_bandwidth)
    return _q(f"A bf16 layer y = x·W with x of {b}×{_n(h)} and W of {_n(h)}×{_n(h)} on a "
              f"{gpu.name} ({show(gpu.peak_flops['bfloat16'], 'TFLOP/s')}, "
              f"{show(gpu.hbm_bandwidth, 'TB/s')}). Time at the roofline?",
              t, "µs",
              f"{show(flops, 'GFLOP')} over {show(nbytes, 'MB')} (W dominates): arithmetic "
              f"intensity {sig(flops / nbytes)} FLOP/B, far below the ridge "
              f"({sig(gpu.peak_flops['bfloat16'] / gpu.hbm_bandwidth)}): memory time "
              f"{show(nbytes / gpu.hbm_bandwidth, 'µs')} wins.",
              "Small batches read the whole weight matrix for little work: memory-bound.")


# ----------------------------------------------- lesson 01: collectives and their cost


def _ab(rng):
    return rng.choice(P), rng.choice(SIZES), rng.choice(ALPHAS), rng.choice(BANDWIDTHS)


def _ab_text(p, n, alpha, bw):
    return (f"{p} GPUs, {_size(n)} per GPU, α = {show(alpha, 'µs')} per message, "
            f"link bandwidth {show(bw, 'GB/s')} (ignore the reduction's compute)")


@drill("warm-up", "01")
def ring_allreduce_bytes(rng):
    p, n = rng.choice(P), rng.choice(SIZES)
    sent = 2 * (p - 1) / p * n
    return _q(f"A ring all-reduce of {_size(n)} over {p} GPUs: how many bytes does each GPU "
              "send?", sent, "MB",
              f"reduce-scatter then all-gather, each p − 1 steps of n/p: 2(p−1)/p · n = "
              f"2·{p - 1}/{p} · {_size(n)}.",
              "A ring sends ~2n per GPU, whatever p: bandwidth-optimal.")


@drill("warm-up", "01")
def allgather_bytes(rng):
    p, n = rng.choice(P), rng.choice(SIZES)
    got = (p - 1) / p * n
    return _q(f"An all-gather builds a {_size(n)} tensor on each of {p} GPUs from equal "
              "shards. How many bytes does each GPU receive?", got, "MB",
              f"every shard but its own: (p−1)/p · n = {p - 1}/{p} · {_size(n)}.",
              "All-gather and reduce-scatter each move half of an all-reduce.")


@drill("interview", "01")
def ring_allreduce_time(rng):
    p, n, alpha, bw = _ab(rng)
    t = costmodel.flat_time("all_reduce", "flat_ring", p, n, _link(alpha, bw))
    return _q(f"Ring all-reduce, α-β model: {_ab_text(p, n, alpha, bw)}. How long?", t, "ms",
              f"2(p−1)·α + 2(p−1)/p · n/B = {2 * (p - 1)}·{show(alpha, 'µs')} + "
              f"{show(2 * (p - 1) / p * n / bw, 'ms')} (simcluster's costmodel.flat_time).",
              "Ring: latency grows with p, bandwidth term stays ~2n/B.")


@drill("interview", "01")
def tree_allreduce_time(rng):
    p, n, alpha, bw = _ab(rng)
    t = costmodel.flat_time("all_reduce", "binomial_tree", p, n, _link(alpha, bw))
    lg = math.ceil(math.log2(p))
    return _q(f"Binomial-tree all-reduce (reduce then broadcast, whole buffer each step), "
              f"α-β model: {_ab_text(p, n, alpha, bw)}. How long?", t, "ms",
              f"2·⌈log₂p⌉·(α + n/B) = 2·{lg}·({show(alpha, 'µs')} + {show(n / bw, 'ms')}).",
              "A binomial tree has log p latency but sends the whole buffer log p times.")


@drill("interview", "01")
def halving_doubling_time(rng):
    p, n, alpha, bw = _ab(rng)
    t = costmodel.flat_time("all_reduce", "halving_doubling", p, n, _link(alpha, bw))
    lg = int(math.log2(p))
    return _q(f"Recursive halving-doubling all-reduce (Rabenseifner), α-β model: "
              f"{_ab_text(p, n, alpha, bw)}. How long?", t, "ms",
              f"2·log₂p·α + 2(p−1)/p · n/B = 2·{lg}·{show(alpha, 'µs')} + "
              f"{show(2 * (p - 1) / p * n / bw, 'ms')}.",
              "Halving-doubling: the ring's bandwidth with the tree's log p latency.")


@drill("hard", "01")
def ring_tree_crossover(rng):
    p, alpha, bw = rng.choice((16, 32, 64, 128)), rng.choice(ALPHAS), rng.choice(BANDWIDTHS)
    c = _link(alpha, bw)

    def gap(n):
        return (costmodel.flat_time("all_reduce", "flat_ring", p, n, c)
                - costmodel.flat_time("all_reduce", "binomial_tree", p, n, c))

    # both are linear in n: the crossover is where the difference changes sign
    crossover = -gap(0.0) / (gap(1.0) - gap(0.0))
    lg = math.ceil(math.log2(p))
    return _q(f"{p} GPUs, α = {show(alpha, 'µs')}, B = {show(bw, 'GB/s')}. Above what "
              "message size is a ring all-reduce faster than a binomial tree (α-β model)?",
              crossover, "KB",
              f"ring 2(p−1)α + 2(p−1)/p·nβ = tree 2⌈log₂p⌉(α + nβ) → n = "
              f"(2(p−1) − 2·{lg})α / ((2·{lg} − 2(p−1)/p)β).",
              "Small messages: trees (latency); large ones: rings (bandwidth). NCCL picks by size.")


@drill("warm-up", "01")
def bus_bandwidth(rng):
    p = rng.choice(P)
    n, t = rng.choice(SIZES), rng.choice((1e-3, 2e-3, 5e-3, 20e-3, 50e-3))
    algbw = n / t
    busbw = algbw * 2 * (p - 1) / p
    return _q(f"nccl-tests reports an all-reduce of {_size(n)} on {p} GPUs in "
              f"{show(t, 'ms')}. What bus bandwidth does it print?", busbw, "GB/s",
              f"algbw = n/t = {show(algbw, 'GB/s')}; busbw = algbw · 2(p−1)/p.",
              "Bus bandwidth normalises by the ring's 2(p−1)/p, so it compares with the link.")


@drill("interview", "01")
def reduce_scatter_time(rng):
    p, n, alpha, bw = _ab(rng)
    t = costmodel.flat_time("reduce_scatter", "flat_ring", p, n, _link(alpha, bw))
    return _q(f"Ring reduce-scatter, α-β model: {_ab_text(p, n, alpha, bw)}. How long?",
              t, "ms",
              f"(p−1)·α + (p−1)/p · n/B = {p - 1}·{show(alpha, 'µs')} + "
              f"{show((p - 1) / p * n / bw, 'ms')}.",
              "Reduce-scatter is half an all-reduce: what ZeRO-2 and FSDP run on gradients.")


@drill("hard", "01")
def nccl_cross_node_allreduce(rng):
    nodes = rng.choice((2, 4, 8, 16, 32))
    n = rng.choice((256e6, 1e9, 4e9))
    cluster = sc_spec.preset("dgx-h100", nodes=nodes)
    ranks = list(range(0, 8 * nodes, 8))       # one GPU per node: every step crosses IB
    t = costmodel.CostModel(cluster).collective_time("all_reduce", ranks, n).seconds
    link = cluster.inter_node_link
    estimate = 2 * (nodes - 1) / nodes * n / link.effective_bandwidth
    return _q(f"{nodes} DGX H100 nodes, one GPU per node all-reducing {_size(n)} over "
              f"{show(link.bandwidth, 'GB/s')} NDR InfiniBand NICs (95 % efficient, "
              f"α ≈ {show(link.latency, 'µs')}). Estimate the time.", t, "ms",
              f"bandwidth term 2(p−1)/p · n / ({show(link.effective_bandwidth, 'GB/s')}) = "
              f"{show(estimate, 'ms')}; latency adds little at this size. simcluster's NCCL "
              f"model (ring or tree, LL/LL128/Simple, whichever is fastest) says:",
              "At hundreds of MB, one NIC's bandwidth sets the time: count bytes, not hops.")


# ----------------------------------------------- lesson 02: gradient aggregation


@drill("warm-up", "02")
def int8_compression_ratio(rng):
    chunk = rng.choice((64, 128, 256, 1024))
    ratio = 4 / (1 + 4 / chunk)
    return _q(f"Gradients in fp32 are sent as int8 with one fp32 scale per chunk of "
              f"{chunk} values. By what factor does the traffic shrink?", ratio, "x",
              f"4 bytes → 1 + 4/{chunk} bytes per value.",
              "int8 quantisation: ~4× fewer bytes, plus a small scale overhead.")


@drill("interview", "02")
def topk_allgather_bytes(rng):
    params, p = rng.choice(PARAMS[:3]), rng.choice(P)
    share = rng.choice((0.001, 0.01, 0.05))
    k = share * params
    got = (p - 1) * k * 8
    return _q(f"Top-k sparsification: each of {p} GPUs keeps {sig(share * 100)}% of "
              f"{sig(params / 1e9)} B gradients as (int32 index, fp32 value) pairs and "
              "all-gathers them. How many bytes does each GPU receive?", got, "GB",
              f"k = {sig(k / 1e6)} M values × 8 bytes from each of p − 1 = {p - 1} others.",
              "Sparse all-gathers grow with p: top-k beats a dense ring only for small p·k.")


@drill("interview", "02")
def parameter_server_vs_ring(rng):
    workers = rng.choice((8, 16, 32, 64))
    ratio = workers * 2 / (2 * (workers - 1) / workers)
    return _q(f"One parameter server on one link serves {workers} workers: each pushes its "
              "gradients (n bytes) and pulls the parameters (n bytes). How many times longer "
              f"does the server's link take than one GPU's link in a ring all-reduce of n "
              f"over the {workers} workers?", ratio, "x",
              f"server: 2·W·n = {2 * workers} n; ring: 2(W−1)/W · n per GPU.",
              "A single server's link is the bottleneck: shard the server or use a ring.")


# ----------------------------------------------- lesson 03: data parallelism


@drill("warm-up", "03")
def ddp_buckets(rng):
    params = rng.choice((25.6e6, 110e6, 350e6, 1.3e9))
    dtype_bytes = rng.choice((2, 4))
    cap = rng.choice((25, 50, 100))
    buckets = math.ceil(params * dtype_bytes / (cap * 2**20))
    return _q(f"DDP with bucket_cap_mb={cap} (MiB) on a model of {sig(params / 1e6)} M "
              f"parameters with {dtype_bytes}-byte gradients. About how many buckets "
              "(all-reduces) per step? (ignore the small first bucket)", buckets, "buckets",
              f"⌈{sig(params / 1e6)} M · {dtype_bytes} B / {cap} MiB⌉.",
              "Buckets batch small gradients into few large all-reduces that overlap backward.")


@drill("warm-up", "03")
def gradient_accumulation(rng):
    dp, micro = rng.choice((8, 16, 32, 64)), rng.choice((1, 2, 4, 8))
    accum = rng.choice((2, 4, 8, 16))
    global_batch = dp * micro * accum
    return _q(f"Global batch {_n(global_batch)} sequences on {dp} data-parallel GPUs, each "
              f"fitting {micro} sequences at a time. How many gradient-accumulation steps?",
              global_batch / (dp * micro), "steps",
              f"{_n(global_batch)} / ({dp} · {micro}).",
              "Accumulate under no_sync(): one all-reduce per step, not per micro-batch.")


@drill("interview", "03")
def ddp_exposed_communication(rng):
    params = rng.choice((110e6, 350e6, 1.3e9))
    p, alpha, bw = rng.choice(P), rng.choice(ALPHAS), rng.choice(BANDWIDTHS[:3])
    backward = rng.choice((0.05, 0.1, 0.2, 0.4))
    buckets = math.ceil(params * 4 / (25 * 2**20))
    per_bucket = costmodel.flat_time("all_reduce", "flat_ring", p, params * 4 / buckets,
                                     _link(alpha, bw))
    total = buckets * per_bucket
    # Buckets go out as backward produces them: all but the last overlap backward; the
    # last starts when backward ends.
    exposed = max(total - per_bucket - backward, 0.0) + per_bucket
    return _q(f"DDP: {sig(params / 1e6)} M fp32 gradients in {buckets} equal buckets, ring "
              f"all-reduce over {p} GPUs (α = {show(alpha, 'µs')}, B = {show(bw, 'GB/s')}); "
              f"backward takes {show(backward, 'ms')}. Assuming buckets overlap backward "
              "except the last, how much communication is exposed after backward?",
              exposed, "ms",
              f"one bucket: {show(per_bucket, 'ms')}, all {buckets}: {show(total, 'ms')}. "
              f"Exposed = max(total − last − backward, 0) + last.",
              "Overlap hides all but the last bucket — unless communication outlasts backward.")


@drill("interview", "03")
def ddp_resnet_allreduce(rng):
    p, alpha, bw = rng.choice(P), rng.choice(ALPHAS), rng.choice(BANDWIDTHS)
    n = 25.6e6 * 4
    t = costmodel.flat_time("all_reduce", "flat_ring", p, n, _link(alpha, bw))
    return _q(f"DDP on ResNet-50 (25.6 M fp32 parameters) over {p} GPUs, ring all-reduce, "
              f"α = {show(alpha, 'µs')}, B = {show(bw, 'GB/s')}. Time to all-reduce all "
              "gradients once (one bucket)?", t, "ms",
              f"n = {show(n, 'MB')}; 2(p−1)α + 2(p−1)/p · n/B.",
              "ResNet-50's ~100 MB of gradients cost a few ms per step on a fast link.")


# ----------------------------------------------- lesson 04: model parallelism


@drill("warm-up", "04")
def naive_split_idle(rng):
    p = rng.choice((2, 3, 4, 8))
    return _q(f"A model split over {p} GPUs, one batch at a time (no micro-batches): what "
              "fraction of the time is each GPU idle?", bubble_formula(p, 1), "%",
              f"only one stage works at a time: (p−1)/(m + p − 1) with m = 1 = {p - 1}/{p}.",
              "A naive model split wastes (p−1)/p of the GPUs: pipeline it.")


@drill("interview", "04")
def stage_boundary_transfer(rng):
    b, s, h = rng.choice((1, 4, 8)), rng.choice((1024, 2048, 4096)), rng.choice((4096, 8192))
    nbytes = 2 * b * s * h
    cluster = sc_spec.preset("dgx-h100", nodes=2)
    alpha, beta, t = p2p_formula(type("C", (), {"spec": cluster})(), 0, 8, nbytes)
    return _q(f"Pipeline stages on two DGX H100 nodes: the bf16 activation (b={b}, "
              f"s={_n(s)}, h={_n(h)}) crosses one {show(1 / beta, 'GB/s')} NIC "
              f"(α = {show(alpha, 'µs')}). How long does one send take?", t, "µs",
              f"n = 2·b·s·h = {show(nbytes, 'MB')}; α + n·β.",
              "Pipeline sends are small (one activation): PP crosses nodes well.")


# ----------------------------------------------- lesson 05: pipeline parallelism


@drill("warm-up", "05")
def gpipe_bubble(rng):
    p, m = rng.choice((4, 8, 16)), rng.choice((4, 8, 16, 32, 64))
    return _q(f"GPipe or 1F1B with p = {p} stages and m = {m} micro-batches: what fraction "
              "of the step is bubble?", bubble_formula(p, m), "%",
              f"(p−1)/(m + p − 1) = {p - 1}/{m + p - 1}.",
              "The bubble is (p−1) slots out of m + p − 1: more micro-batches shrink it.")


@drill("warm-up", "05")
def interleaved_bubble(rng):
    p, m, v = rng.choice((4, 8, 16)), rng.choice((8, 16, 32)), rng.choice((2, 4))
    return _q(f"Interleaved 1F1B: p = {p} devices, v = {v} model chunks per device, m = {m} "
              "micro-batches. Bubble fraction of the step?", bubble_formula(p, m, v), "%",
              f"(p−1)/(v·m + p − 1) = {p - 1}/{v * m + p - 1}.",
              "Interleaving divides the bubble by v, at v× the pipeline messages.")


@drill("interview", "05")
def micro_batches_for_bubble(rng):
    p, target = rng.choice((4, 8, 16, 32)), rng.choice((0.05, 0.1, 0.2))
    m = next(m for m in range(1, 10**6) if bubble_formula(p, m) <= target)
    return _q(f"p = {p} pipeline stages. Smallest number of micro-batches m for a bubble of "
              f"at most {sig(target * 100)}% of the step?", m, "micro-batches",
              f"(p−1)/(m + p − 1) ≤ {target} → m ≥ (p−1)(1 − {target})/{target}; round up.",
              "Rule of thumb: m ≥ 4p for a bubble under ~20 %.")


@drill("interview", "05")
def pipeline_activation_memory(rng):
    p, m = rng.choice((4, 8)), rng.choice((16, 32, 64))
    s, b, h, a = rng.choice((1024, 2048)), rng.choice((1, 2, 4)), rng.choice((4096, 8192)), 32
    layers = rng.choice((4, 8))
    per_micro = layers * korthikanti_bytes(s, b, h, a)
    gpipe, one_f_one_b = m * per_micro, min(m, p) * per_micro
    return _q(f"A stage of {layers} layers (s={_n(s)}, b={b}, h={_n(h)}, a={a}, no "
              f"recomputation: Korthikanti's sbh(34 + 5as/h) per layer), p = {p}, m = {m}. "
              "How much activation memory does GPipe keep on stage 0 at its peak?",
              gpipe, "GB",
              f"per micro-batch {show(per_micro, 'GB')}; GPipe keeps all m = {m} "
              f"(1F1B only min(m, p) = {min(m, p)}: {show(one_f_one_b, 'GB')}).",
              "1F1B caps in-flight micro-batches at p; GPipe keeps all m.")


@drill("hard", "05")
def uneven_stage_bubble(rng):
    p, m = rng.choice((3, 4)), rng.choice((4, 8, 16))
    costs = [rng.choice((1.0, 1.5, 2.0, 3.0)) for _ in range(p)]
    return _q(f"{p} pipeline stages whose micro-batch times are {', '.join(map(_n, costs))} "
              f"(ms), m = {m}. What fraction of the step is bubble (GPipe or 1F1B)?",
              bubble_uneven(costs, m), "%",
              f"wall = Σcosts + (m−1)·max = {_n(sum(costs))} + {m - 1}·{_n(max(costs))}; "
              f"each stage computes m·cost; bubble = 1 − m·Σcosts/(p·wall).",
              "The slowest stage sets the pace: balance stages before adding micro-batches.")


@drill("interview", "05")
def pipeline_step_time(rng):
    p, m = rng.choice((4, 8)), rng.choice((8, 16, 32))
    tf = rng.choice((1e-3, 2e-3, 5e-3))
    tb = 2 * tf
    step = m * (tf + tb) / (1 - bubble_formula(p, m))
    return _q(f"1F1B, p = {p} equal stages, m = {m} micro-batches; a micro-batch's forward "
              f"on one stage takes {show(tf, 'ms')}, its backward twice that. Step time?",
              step, "ms",
              f"(m + p − 1)·(t_f + t_b) = {m + p - 1}·{show(tf + tb, 'ms')}.",
              "A pipeline step is m + p − 1 slots of forward+backward.")


# ----------------------------------------------- lesson 06: tensor parallelism


@drill("warm-up", "06")
def tp_bytes_per_layer(rng):
    b, s, h, t = rng.choice((1, 4, 8)), rng.choice((1024, 2048)), rng.choice((4096, 8192)), \
        rng.choice((2, 4, 8))
    nbytes = 2 * tp_comm_elements(b, s, h, t)
    return _q(f"Megatron tensor parallelism, t = {t}: bytes each GPU sends per layer, "
              f"forward + backward, for one micro-batch (b={b}, s={_n(s)}, h={_n(h)}, bf16)?",
              nbytes, "MB",
              "four ring all-reduces of b·s·h values (2 forward, 2 backward), each sending "
              "2(t−1)/t of it: 8·b·s·h·(t−1)/t values × 2 bytes.",
              "TP moves activations every layer: it needs NVLink.")


@drill("interview", "06")
def tp_allreduce_time(rng):
    b, s, h, t = rng.choice((1, 4)), rng.choice((2048, 4096)), rng.choice((8192, 12288)), \
        rng.choice((4, 8))
    alpha, bw = rng.choice(ALPHAS[:2]), rng.choice((200e9, 300e9, 450e9))
    n = 2 * b * s * h
    t_layer = 4 * costmodel.flat_time("all_reduce", "flat_ring", t, n, _link(alpha, bw))
    return _q(f"TP t = {t} inside a node (α = {show(alpha, 'µs')}, "
              f"{show(bw, 'GB/s')} per GPU): four ring all-reduces of the bf16 activation "
              f"(b={b}, s={_n(s)}, h={_n(h)}) per layer. Communication time per layer?",
              t_layer, "ms",
              f"n = {show(n, 'MB')}; 4 × (2(t−1)α + 2(t−1)/t · n/B).",
              "Multiply by layers and micro-batches: TP traffic is on the critical path.")


@drill("interview", "06")
def tp_across_nodes_slowdown(rng):
    t = rng.choice((8, 16))
    n = 2 * rng.choice((1, 4)) * 2048 * rng.choice((8192, 12288))
    nvlink, ib = _link(3e-6, 360e9), _link(14e-6, rng.choice((25e9, 50e9)))
    inside = costmodel.flat_time("all_reduce", "flat_ring", t, n, nvlink)
    across = costmodel.flat_time("all_reduce", "flat_ring", t, n, ib)
    return _q(f"A TP all-reduce of {_size(n)} over t = {t} GPUs: how many times slower if the "
              f"ring runs over {show(1 / ib.beta, 'GB/s')} NICs (α = 14 µs) instead of "
              "NVLink at 360 GB/s (α = 3 µs)?", across / inside, "x",
              f"ring time 2(t−1)α + 2(t−1)/t·n/B on each: {show(across, 'ms')} vs "
              f"{show(inside, 'ms')}.",
              "Keep TP inside the NVLink domain; put PP and DP across nodes.")


@drill("warm-up", "06")
def sequence_parallel_saving(rng):
    s, b, h, a, t = rng.choice((2048, 4096)), rng.choice((1, 2)), rng.choice((8192, 12288)), \
        rng.choice((64, 96)), rng.choice((4, 8))
    without = activation_bytes(s, b, h, a, t)
    with_sp = activation_bytes(s, b, h, a, t, sequence_parallel=True)
    return _q(f"Activation memory per layer per GPU (Korthikanti): s={_n(s)}, b={b}, "
              f"h={_n(h)}, a={a}, t={t}. How much does sequence parallelism save per layer?",
              without - with_sp, "MB",
              f"TP: sbh(10 + 24/t + 5as/(ht)); TP+SP: sbh(34/t + 5as/(ht)). Difference "
              f"sbh·10(1 − 1/t).",
              "SP splits the LayerNorm/dropout activations TP left replicated.")


@drill("warm-up", "06")
def tp_weights_per_gpu(rng):
    params, t = rng.choice(PARAMS[2:]), rng.choice((2, 4, 8))
    return _q(f"A {sig(params / 1e9)} B-parameter model served in bf16 with t = {t} tensor "
              "parallelism: weight bytes per GPU?", 2 * params / t, "GB",
              f"2 bytes × {sig(params / 1e9)} B / {t}.",
              "Weights: 2 bytes per parameter in bf16, split t ways by TP.")


# ----------------------------------------------- lesson 07: ZeRO and FSDP


@drill("warm-up", "07")
def adam_model_states(rng):
    psi = rng.choice(PARAMS)
    return _q(f"Mixed-precision Adam, no sharding: model-state bytes for {sig(psi / 1e9)} B "
              "parameters?", model_state_bytes(psi, 1, 0), "GB",
              "2Ψ (bf16 weights) + 2Ψ (bf16 grads) + 12Ψ (fp32 master, m, v) = 16Ψ.",
              "16 bytes per parameter before a single activation.")


@drill("warm-up", "07")
def zero1_per_gpu(rng):
    psi, n = rng.choice(PARAMS), rng.choice((8, 16, 64, 256))
    return _q(f"ZeRO stage 1, {sig(psi / 1e9)} B parameters, {n} data-parallel GPUs: model "
              "states per GPU?", model_state_bytes(psi, n, 1), "GB",
              f"(2 + 2)Ψ + 12Ψ/{n}.", "ZeRO-1 shards only the optimizer state.")


@drill("interview", "07")
def zero2_per_gpu(rng):
    psi, n = rng.choice(PARAMS), rng.choice((8, 16, 64, 256))
    return _q(f"ZeRO stage 2, {sig(psi / 1e9)} B parameters, {n} data-parallel GPUs: model "
              "states per GPU?", model_state_bytes(psi, n, 2), "GB",
              f"2Ψ + (2 + 12)Ψ/{n}.", "ZeRO-2 shards gradients too: the same traffic as DDP.")


@drill("interview", "07")
def zero3_per_gpu(rng):
    psi, n = rng.choice(PARAMS), rng.choice((8, 16, 64, 256, 1024))
    return _q(f"ZeRO stage 3 / FSDP full sharding, {sig(psi / 1e9)} B parameters, {n} GPUs: "
              "model states per GPU?", model_state_bytes(psi, n, 3), "GB",
              f"16Ψ/{n}.", "ZeRO-3 divides all 16 bytes per parameter by the GPUs.")


@drill("interview", "07")
def zero3_min_gpus(rng):
    psi, cap = rng.choice(PARAMS[2:]), rng.choice((40e9, 80e9))
    budget = rng.choice((0.5, 0.75))
    n = next(n for n in range(1, 10**6) if model_state_bytes(psi, n, 3) <= budget * cap)
    return _q(f"{sig(psi / 1e9)} B parameters, ZeRO-3, GPUs of {show(cap, 'GB')} of which "
              f"{sig(budget * 100)}% may hold model states. Fewest GPUs?", n, "GPUs",
              f"16Ψ/n ≤ {show(budget * cap, 'GB')} → n ≥ 16Ψ/{show(budget * cap, 'GB')}; "
              "round up.",
              "Sizing starts from 16Ψ: divide by the memory you allow per GPU.")


@drill("hard", "07")
def fsdp_bytes_per_step(rng):
    psi, n = rng.choice(PARAMS[:4]), rng.choice((8, 16, 64))
    f = (n - 1) / n
    sent = 3 * f * 2 * psi
    return _q(f"FSDP (ZeRO-3), {sig(psi / 1e9)} B bf16 parameters on {n} GPUs: bytes each "
              "GPU sends per step (all-gather forward, all-gather backward, reduce-scatter "
              "gradients, ring)?", sent, "GB",
              f"3 × (n−1)/n × 2Ψ (DDP sends 2 × (n−1)/n × 2Ψ: FSDP costs 1.5×).",
              "ZeRO-3 trades 1.5× DDP's traffic for 1/n of the memory.")


@drill("hard", "07")
def zero3_step_comm_time(rng):
    psi, n = rng.choice(PARAMS[:3]), rng.choice((8, 16, 32))
    alpha, bw = rng.choice(ALPHAS), rng.choice((25e9, 50e9, 100e9))
    c, nbytes = _link(alpha, bw), 2 * psi
    t = 2 * costmodel.flat_time("all_gather", "flat_ring", n, nbytes, c) + \
        costmodel.flat_time("reduce_scatter", "flat_ring", n, nbytes, c)
    return _q(f"ZeRO-3 on {n} GPUs, {sig(psi / 1e9)} B bf16 parameters, ring collectives at "
              f"{show(bw, 'GB/s')} (α = {show(alpha, 'µs')}), no overlap. Communication time "
              "per step?", t, "s",
              "two all-gathers and one reduce-scatter of 2Ψ bytes, each (n−1)α + "
              "(n−1)/n·2Ψ/B.",
              "Unoverlapped, ZeRO-3 traffic can exceed compute: prefetch the next layer.")


# ----------------------------------------------- lesson 08: memory and precision


@drill("warm-up", "08")
def gpt_parameter_count(rng):
    cfg = _gpt(rng)
    n = planner.parameter_count(cfg)
    return _q(f"A GPT with {_model_text(cfg)}, vocabulary {_n(cfg.vocab)}, sequence "
              f"{_n(cfg.seq_len)}. How many parameters?", n, "parameters",
              f"12·l·h² (+ embeddings V·h + s·h, biases, norms) = 12·{cfg.layers}·"
              f"{_n(cfg.hidden)}² + … (planner.parameter_count).",
              "12·l·h² is the rule; embeddings add V·h.")


@drill("warm-up", "08")
def activation_per_layer(rng):
    s, b, h, a = rng.choice((1024, 2048, 4096)), rng.choice((1, 2, 4, 8)), \
        rng.choice((2048, 4096, 8192)), rng.choice((16, 32, 64))
    return _q(f"Activation memory one transformer layer keeps for backward (Korthikanti, "
              f"16-bit, no recomputation): s={_n(s)}, b={b}, h={_n(h)}, a={a}?",
              korthikanti_bytes(s, b, h, a), "GB",
              "s·b·h·(34 + 5·a·s/h).", "The 5as/h term — attention scores — grows with s².")


@drill("interview", "08")
def selective_recompute_saving(rng):
    s, b, h, a = rng.choice((2048, 4096)), rng.choice((1, 2, 4)), \
        rng.choice((4096, 8192)), rng.choice((32, 64))
    layers = rng.choice((24, 32, 48))
    saved = layers * (korthikanti_bytes(s, b, h, a) - korthikanti_bytes(s, b, h, a,
                                                                         "selective"))
    return _q(f"{layers} layers, s={_n(s)}, b={b}, h={_n(h)}, a={a}: how many bytes does "
              "selective recomputation (recompute only attention's softmax/dropout) save "
              "over all layers?", saved, "GB",
              "per layer: sbh(34 + 5as/h) − 34sbh = 5·a·s²·b.",
              "Selective recomputation drops the s² part for a few % more FLOPs.")


@drill("interview", "08")
def full_recompute_memory(rng):
    s, b, h = rng.choice((2048, 4096)), rng.choice((1, 2, 4, 8)), rng.choice((4096, 8192))
    layers = rng.choice((32, 48, 80))
    return _q(f"Full activation recomputation, {layers} layers, s={_n(s)}, b={b}, "
              f"h={_n(h)}, bf16: bytes of the layer inputs kept?",
              layers * korthikanti_bytes(s, b, h, 1, "full"), "GB",
              "only each layer's input: 2·s·b·h bytes per layer.",
              "Full recomputation: 2sbh per layer, for ~33 % more compute.")


@drill("hard", "08")
def max_micro_batch(rng):
    psi = rng.choice((1.3e9, 2.7e9, 3.5e9))
    s, h, a, layers = rng.choice((512, 1024)), 4096, 32, 32
    cap = 80e9
    free = cap - model_state_bytes(psi, 1, 0)
    per_sample = layers * korthikanti_bytes(s, 1, h, a)
    b = math.floor(free / per_sample)         # >= 1 for every model and length drawn
    return _q(f"One 80 GB GPU, {sig(psi / 1e9)} B parameters, mixed-precision Adam (16 "
              f"bytes/parameter), {layers} layers, s={_n(s)}, h={_n(h)}, a={a}, no "
              "recomputation. Largest micro-batch whose activations fit in what is left?",
              b, "sequences",
              f"free = 80 GB − 16Ψ = {show(free, 'GB')}; per sequence l·sh(34 + 5as/h) = "
              f"{show(per_sample, 'GB')}; b = ⌊free / per sequence⌋.",
              "Model states are fixed; activations scale with b — recompute to go bigger.")


@drill("warm-up", "08")
def params_that_fit(rng):
    cap = rng.choice((24e9, 40e9, 80e9, 141e9))
    per_param = model_state_bytes(1, 1, 0)
    return _q(f"Training with mixed-precision Adam on one GPU of {show(cap, 'GB')}, nothing "
              "else in memory: at most how many parameters?", cap / per_param, "parameters",
              f"{show(cap, 'GB')} / 16 bytes per parameter.",
              "A 80 GB GPU trains at most ~5 B parameters without sharding.")


@drill("interview", "08")
def logits_memory(rng):
    b, s, v = rng.choice((1, 4, 8)), rng.choice((2048, 4096)), rng.choice((32000, 51200,
                                                                           128256))
    nbytes = planner.CROSS_ENTROPY_BYTES_PER_LOGIT * b * s * v
    return _q(f"The output layer and cross-entropy of b={b}, s={_n(s)}, vocabulary "
              f"{_n(v)}: the planner charges {planner.CROSS_ENTROPY_BYTES_PER_LOGIT} bytes per "
              "logit (bf16 logits, fp32 copies for softmax and its gradient). How much?",
              nbytes, "GB",
              f"{planner.CROSS_ENTROPY_BYTES_PER_LOGIT}·b·s·V.",
              "A 128 K vocabulary makes the loss one of the largest tensors: chunk it.")


# ----------------------------------------------- lesson 09: 3D parallelism


@drill("interview", "09", rel_tol=0.15)
def flops_per_step(rng):
    cfg, batch = _gpt(rng), rng.choice((256, 512, 1024, 1536))
    flops = planner.flops_per_iteration(cfg, batch, "none")
    n = planner.parameter_count(cfg)
    return _q(f"Training FLOPs of one step of a GPT with {_model_text(cfg)}, sequence "
              f"{_n(cfg.seq_len)}, {sig(n / 1e9)} B parameters, {_n(batch)} sequences per "
              "step (no recomputation)?", flops, "PFLOP",
              f"≈ 6·N·tokens = 6·{sig(n / 1e9)} B·{_n(batch * cfg.seq_len)} = "
              f"{show(6 * n * batch * cfg.seq_len, 'PFLOP')}; attention's 12·l·b·s²·h adds a "
              "little (planner.flops_per_iteration).",
              "6 FLOPs per parameter per token: 2 forward, 4 backward.")


@drill("interview", "09")
def training_days(rng):
    n, tokens = rng.choice(PARAMS[1:]), rng.choice((300e9, 1e12, 2e12, 15e12))
    gpus, mfu = rng.choice((512, 1024, 2048, 4096, 16384)), rng.choice((0.35, 0.4, 0.5))
    seconds = 6 * n * tokens / (gpus * H100.peak_flops["bfloat16"] * mfu)
    return _q(f"{sig(n / 1e9)} B parameters, {sig(tokens / 1e12)} T tokens, {_n(gpus)} H100s "
              f"(989 TFLOP/s bf16) at {sig(mfu * 100)}% MFU. How long does training take?",
              seconds, "days",
              f"6·N·T / (GPUs · peak · MFU) = {show(6 * n * tokens, 'EFLOP')} / "
              f"{show(gpus * H100.peak_flops['bfloat16'] * mfu, 'PFLOP/s')}.",
              "Training time = 6NT / (GPUs · peak · MFU): know it by heart.")


def _layout(rng):
    """A 3D layout of a GPT on DGX H100 nodes and its planner estimate."""
    cfg = rng.choice((planner.TransformerConfig(layers=32, hidden=4096, heads=32,
                                                seq_len=2048, vocab=51200),
                      planner.TransformerConfig(layers=40, hidden=5120, heads=40,
                                                seq_len=2048, vocab=51200),
                      planner.TransformerConfig(layers=80, hidden=8192, heads=64,
                                                seq_len=2048, vocab=51200)))
    tp, pp = 8, rng.choice((2, 4, 8))
    dp = rng.choice((4, 8, 16))
    batch = dp * rng.choice((16, 32, 64))
    cluster = sc_spec.preset("dgx-h100", nodes=tp * pp * dp // 8)
    return cfg, cluster, planner.estimate(cfg, cluster, tp=tp, pp=pp, dp=dp,
                                          global_batch=batch, micro_batch=1)


@drill("interview", "09")
def mfu_from_step_time(rng):
    cfg, cluster, est = _layout(rng)
    step = float(sig(est.step_time))
    mfu = est.model_flops / (step * est.gpus * est.peak_flops)
    return _q(f"A GPT of {sig(planner.parameter_count(cfg) / 1e9)} B parameters "
              f"({_model_text(cfg)}, s={_n(cfg.seq_len)}) trains {_n(est.global_batch)} "
              f"sequences per step on {_n(est.gpus)} H100s (989 TFLOP/s) with tp={est.tp}, "
              f"pp={est.pp}, dp={est.dp}; the planner predicts {sig(step)} s per step. MFU?",
              mfu, "%",
              f"model FLOPs per step {show(est.model_flops, 'PFLOP')} (≈ 6·N·tokens) / "
              f"({sig(step)} s · {_n(est.gpus)} · 989 TFLOP/s).",
              "MFU counts the model's FLOPs only: recomputation does not count.")


@drill("hard", "09")
def layout_bubble(rng):
    gpus, tp = rng.choice((512, 1024, 2048)), 8
    pp = rng.choice((4, 8, 16))
    dp = gpus // (tp * pp)
    batch, micro = rng.choice((512, 1024, 2048)), rng.choice((1, 2))
    m = batch // (dp * micro)
    return _q(f"{_n(gpus)} GPUs as tp={tp}, pp={pp}, dp={dp}; global batch {_n(batch)} "
              f"sequences, micro-batch {micro}, 1F1B. Bubble fraction of the step?",
              bubble_formula(pp, m), "%",
              f"m = B/(dp·b) = {_n(batch)}/({dp}·{micro}) = {m}; (p−1)/(m + p − 1).",
              "Scaling dp at a fixed batch shrinks m and grows the bubble.")


@drill("hard", "09")
def compute_lower_bound(rng):
    cfg = planner.TransformerConfig(layers=80, hidden=8192, heads=64, kv_heads=8,
                                    seq_len=rng.choice((2048, 4096)), vocab=32000,
                                    ffn_hidden=28672, swiglu=True, tied_embeddings=False)
    gpus, batch = rng.choice((512, 1024, 2048)), rng.choice((512, 1024, 2048))
    flops = planner.flops_per_iteration(cfg, batch, "none")
    t = flops / (gpus * H100.peak_flops["bfloat16"])
    n = planner.parameter_count(cfg)
    return _q(f"A 70 B LLaMA-style model ({sig(n / 1e9)} B parameters, s={_n(cfg.seq_len)}), "
              f"{_n(batch)} sequences per step on {_n(gpus)} H100s at 989 TFLOP/s. Lower bound "
              "on the step time (perfect MFU)?", t, "s",
              f"≈ 6·N·B·s / (GPUs·peak) = {show(6 * n * batch * cfg.seq_len, 'EFLOP')} / "
              f"{show(gpus * H100.peak_flops['bfloat16'], 'EFLOP/s')}; attention adds "
              f"~{sig(100 * (flops / (6 * n * batch * cfg.seq_len) - 1))}% "
              "(planner.flops_per_iteration).",
              "Start every step-time estimate from FLOPs / (GPUs · peak), then add the losses.")


@drill("hard", "09")
def dp_gradient_sync(rng):
    psi, tp, pp = rng.choice((13e9, 70e9, 175e9)), 8, rng.choice((4, 8, 16))
    dp = rng.choice((8, 16, 32, 64))
    bw, alpha = rng.choice((25e9, 50e9)), 14e-6
    shard = 2 * psi / (tp * pp)
    t = costmodel.flat_time("all_reduce", "flat_ring", dp, shard, _link(alpha, bw))
    return _q(f"{sig(psi / 1e9)} B parameters, tp={tp}, pp={pp}, dp={dp}: each GPU all-reduces "
              f"its bf16 gradient shard over its dp group, ring over {show(bw, 'GB/s')} NICs "
              "(α = 14 µs). How long?", t, "ms",
              f"shard = 2Ψ/(tp·pp) = {show(shard, 'MB')}; 2(dp−1)α + 2(dp−1)/dp·shard/B.",
              "TP and PP shrink each GPU's gradient: the DP all-reduce gets cheaper.")


# ----------------------------------------------- lesson 10: failures and checkpoints


@drill("warm-up", "10")
def young_checkpoint_interval(rng):
    delta, mtbf = rng.choice((30, 60, 120, 300)), rng.choice((2, 4, 8, 24)) * 3600
    return _q(f"A checkpoint takes {_n(delta)} s to write; the job's MTBF is "
              f"{_n(mtbf / 3600)} h. Young's optimal interval?", young_interval(delta, mtbf),
              "min", f"√(2·δ·M) = √(2·{_n(delta)}·{_n(mtbf)}) s.",
              "Checkpoint every √(2δM): faster writes allow more frequent checkpoints.")


@drill("interview", "10")
def daly_checkpoint_interval(rng):
    delta, mtbf = rng.choice((300, 600, 1200)), rng.choice((1, 2, 3)) * 3600
    return _q(f"δ = {_n(delta)} s per checkpoint, MTBF {_n(mtbf / 3600)} h: Daly's "
              "higher-order optimum interval?", daly_interval(delta, mtbf), "min",
              "√(2δM)·[1 + ⅓√(δ/2M) + (δ/2M)/9] − δ.",
              "When δ is not small next to M, Daly corrects Young.")


@drill("warm-up", "10")
def cluster_mtbf(rng):
    node_mtbf_years, nodes = rng.choice((1, 2, 5, 10)), rng.choice((128, 512, 1000, 2048))
    mtbf = node_mtbf_years * 365 * 86400 / nodes
    return _q(f"Each node fails on average once every {node_mtbf_years} year(s). MTBF of a "
              f"job on {_n(nodes)} nodes?", mtbf, "h",
              f"failures add up: M_job = M_node / N = {node_mtbf_years}·8760 h / {_n(nodes)}.",
              "A thousand nodes turn a yearly failure into a daily one.")


@drill("interview", "10")
def failures_per_day(rng):
    gpus = rng.choice((1024, 8000, 16384, 24576))
    # Llama 3 405B: 419 unexpected interruptions in 54 days on 16,384 GPUs (Dubey et al.)
    rate = 419 / (54 * 16384)
    return _q(f"Llama 3's pre-training saw 419 unexpected interruptions in 54 days on "
              f"16,384 GPUs. At that rate per GPU, how many per day on {_n(gpus)} GPUs?",
              rate * gpus, "failures",
              "419 / (54 · 16,384) per GPU-day × GPUs.",
              "Failures scale with GPUs: ~8 a day at 16 K GPUs, plan for them.")


@drill("interview", "10")
def goodput_at_young(rng):
    delta, mtbf = rng.choice((60, 120, 300)), rng.choice((2, 4, 8)) * 3600
    restart = rng.choice((120, 300, 600))
    tau = young_interval(delta, mtbf)
    g = expected_goodput(tau, delta, mtbf, restart)
    return _q(f"δ = {_n(delta)} s, MTBF {_n(mtbf / 3600)} h, restart {_n(restart)} s, "
              "checkpointing at Young's interval. Expected goodput (useful compute / wall)?",
              g, "%",
              f"τ = √(2δM) = {show(tau, 'min')}; Daly's eq. 13: τ / (M·e^(R/M)·(e^((τ+δ)/M) "
              "− 1)).",
              "Goodput loses ~√(2δ/M) to checkpoints and rework, plus restarts.")


@drill("hard", "10")
def checkpoint_from_storage(rng):
    psi, nodes = rng.choice((13e9, 70e9, 175e9)), rng.choice((16, 64, 128))
    node_mtbf_years = rng.choice((1, 3))
    storage = sc_spec.STORAGES["dgx-h100"]
    delta = storage.write_seconds(model_state_bytes(psi, 1, 0) / nodes)
    mtbf = node_mtbf_years * 365 * 86400 / nodes
    tau = young_interval(delta, mtbf)
    return _q(f"{sig(psi / 1e9)} B parameters trained on {nodes} DGX H100 nodes; each node "
              f"writes its share of the 16 bytes/parameter to local NVMe at "
              f"{show(storage.write_bandwidth, 'GB/s')}; a node fails once every "
              f"{node_mtbf_years} year(s). Young's checkpoint interval?", tau, "min",
              f"δ = 16Ψ/nodes / bandwidth = {show(delta, 's')}; M = "
              f"{show(mtbf, 'h')}; √(2δM).",
              "Sharded checkpoints write in parallel: δ shrinks with nodes, and so does M.")


@drill("interview", "10")
def job_survival(rng):
    nodes, hours = rng.choice((64, 256, 1000)), rng.choice((1, 6, 24))
    node_mtbf_years = rng.choice((1, 2, 5))
    p = math.exp(-nodes * hours / (node_mtbf_years * 8760))
    return _q(f"Nodes fail independently, once every {node_mtbf_years} year(s) each. "
              f"Probability that a {_n(nodes)}-node job runs {hours} h without a failure?",
              p, "%",
              f"exp(−N·t/M_node) = exp(−{_n(nodes)}·{hours}/{_n(node_mtbf_years * 8760)}).",
              "Survival decays exponentially with nodes × hours.")


# ----------------------------------------------- lesson 11: scheduling


def _serial_jobs(rng, k=4):
    durations = rng.sample((1, 2, 3, 4, 5, 6, 8, 10), k)
    if durations == sorted(durations):       # FIFO would already be shortest-first
        durations.reverse()
    return [sched.Job(f"j{i}", 8, d * 3600.0, submit=0.0) for i, d in enumerate(durations)]


def _one_node():
    return sc_spec.preset("dgx-h100", nodes=1)


@drill("warm-up", "11")
def fifo_mean_jct(rng):
    jobs = _serial_jobs(rng)
    result = sched.simulate(jobs, _one_node(), policy="fifo")
    return _q(f"One 8-GPU node; four 8-GPU jobs arrive at once, in this order, needing "
              f"{', '.join(_n(j.duration / 3600) for j in jobs)} h. FIFO: mean job "
              "completion time?", result.mean_jct, "h",
              "they run one after another: completion times are the running sums; average "
              "them (simcluster.scheduling.simulate).",
              "FIFO makes short jobs wait behind long ones.")


@drill("interview", "11")
def sjf_mean_jct(rng):
    jobs = _serial_jobs(rng)
    fifo = sched.simulate(jobs, _one_node(), policy="fifo").mean_jct
    sjf = sched.simulate(jobs, _one_node(), policy="sjf").mean_jct
    return _q(f"The same node, four 8-GPU jobs arriving at once needing "
              f"{', '.join(_n(j.duration / 3600) for j in jobs)} h. How much does shortest-"
              "job-first lower the mean JCT compared with FIFO in this order?",
              fifo - sjf, "h",
              f"FIFO {show(fifo, 'h')}; SJF runs them shortest first: {show(sjf, 'h')}.",
              "SJF minimises mean JCT — and can starve long jobs.")


@drill("interview", "11")
def utilization_with_fragments(rng):
    big, small = rng.choice((2, 4, 6)), rng.choice((1, 2, 3))
    jobs = [sched.Job("a", 6, big * 3600.0), sched.Job("b", 6, small * 3600.0)]
    result = sched.simulate(jobs, _one_node(), policy="fifo")
    return _q(f"One 8-GPU node, two 6-GPU jobs of {big} h and {small} h arriving together. "
              "GPU utilisation over the makespan?", result.utilization, "%",
              f"they cannot share the node (6 + 6 > 8): busy 6·({big} + {small}) GPU-h over "
              f"8·{big + small} GPU-h.",
              "Gang jobs that do not pack leave GPUs idle: fragmentation costs utilisation.")


@drill("hard", "11")
def backfill_wait(rng):
    long, short = rng.choice((4, 6, 8)), rng.choice((1, 2, 3))
    head = rng.choice((2, 3))
    jobs = [sched.Job("running", 4, long * 3600.0, submit=0.0),
            sched.Job("head", 8, head * 3600.0, submit=1.0),
            sched.Job("small", 4, short * 3600.0, submit=2.0)]
    without = sched.simulate(jobs, _one_node(), policy="fifo").by_name["small"].wait
    with_bf = sched.simulate(jobs, _one_node(), policy="fifo", backfill=True)
    saved = without - with_bf.by_name["small"].wait
    return _q(f"One 8-GPU node: a 4-GPU job runs for {long} h; then an 8-GPU job of {head} h "
              f"queues, then a 4-GPU job of {short} h. How much sooner does the small job "
              "start with EASY backfill than with plain FIFO?", saved, "h",
              "FIFO: the small job waits for the running job and the 8-GPU head. EASY: it "
              "fits in the 4 free GPUs and ends before the head's reserved start.",
              "Backfill fills holes without delaying the head's reservation.")


# ----------------------------------------------- lesson 12: serving


def _serving_model(rng):
    return rng.choice((("LLaMA-2-7B", planner.TransformerConfig(
        layers=32, hidden=4096, heads=32, seq_len=4096, vocab=32000, ffn_hidden=11008,
        swiglu=True, tied_embeddings=False)),
        ("LLaMA-2-13B", planner.TransformerConfig(
            layers=40, hidden=5120, heads=40, seq_len=4096, vocab=32000, ffn_hidden=13824,
            swiglu=True, tied_embeddings=False)),
        ("LLaMA-2-70B", planner.TransformerConfig(
            layers=80, hidden=8192, heads=64, kv_heads=8, seq_len=4096, vocab=32000,
            ffn_hidden=28672, swiglu=True, tied_embeddings=False))))


@drill("warm-up", "12")
def kv_per_token(rng):
    name, cfg = _serving_model(rng)
    dtype = rng.choice(("fp16", "fp32"))
    return _q(f"{name} ({_model_text(cfg)}, head dim {cfg.head_dim}) in {dtype}: KV-cache "
              "bytes per token?", serving.kv_bytes_per_token(cfg, dtype), "KB",
              "2 (K and V) · layers · kv_heads · head_dim · bytes.",
              "GQA divides the KV cache by heads / kv_heads.")


@drill("interview", "12")
def kv_cache_size(rng):
    name, cfg = _serving_model(rng)
    batch, context = rng.choice((8, 32, 64, 128)), rng.choice((1024, 2048, 4096))
    nbytes = serving.kv_bytes_per_token(cfg) * batch * context
    return _q(f"{name} ({_model_text(cfg)}, head dim {cfg.head_dim}), fp16: KV cache for "
              f"{batch} sequences of {_n(context)} tokens?", nbytes, "GB",
              f"{show(serving.kv_bytes_per_token(cfg), 'KB')} per token × {batch} × "
              f"{_n(context)}.",
              "At long contexts the KV cache, not the weights, limits the batch.")


@drill("interview", "12")
def max_concurrent_sequences(rng):
    name, cfg = _serving_model(rng)
    tp = 8 if cfg.layers == 80 else rng.choice((1, 2))
    context = rng.choice((2048, 4096))
    dep = serving.Deployment(sc_spec.preset("dgx-h100"), cfg, tp=tp)
    seqs = dep.kv_cache_tokens // context
    return _q(f"{name} in fp16 on tp={tp} H100s of 80 GiB; vLLM takes 90% of memory, minus "
              f"the weights and an activation margin, for KV cache: "
              f"{show(dep.kv_cache_bytes, 'GiB')} per GPU. How many sequences of "
              f"{_n(context)} tokens fit at once?", seqs, "sequences",
              f"per GPU {show(serving.kv_bytes_per_token(cfg, tp=tp), 'KB')} per token; "
              f"{show(dep.kv_cache_bytes, 'GiB')} / that = {_n(dep.kv_cache_tokens)} tokens "
              f"(whole blocks of 16); / {_n(context)}.",
              "KV memory / (bytes per token × context) bounds the batch.")


@drill("warm-up", "12")
def decode_latency_floor(rng):
    name, cfg = _serving_model(rng)
    gpu = rng.choice((H100, A100))
    tp = 4 if cfg.layers == 80 else 1
    t = serving.weight_bytes(cfg, tp=tp) / gpu.hbm_bandwidth
    return _q(f"{name} in fp16 on {tp} {gpu.name} ({show(gpu.hbm_bandwidth, 'TB/s')} HBM "
              f"each), batch 1: lower bound on the time per output token?", t, "ms",
              f"every decode step reads all weights: 2 bytes × "
              f"{sig(planner.parameter_count(cfg) / 1e9)} B / {tp} GPUs / bandwidth.",
              "Decode at batch 1 is memory-bound: weights / HBM bandwidth per token.")


@drill("interview", "12", rel_tol=0.2)
def decode_step_roofline(rng):
    name, cfg = _serving_model(rng)
    tp = 8 if cfg.layers == 80 else 1
    batch, context = rng.choice((16, 32, 64)), rng.choice((512, 1024, 2048))
    cluster = sc_spec.preset("dgx-h100")
    t = serving.decode_time(cfg, cluster, batch, context, tp=tp,
                            efficiency=planner.ROOFLINE)
    reads = serving.weight_bytes(cfg, tp=tp) + batch * context * \
        serving.kv_bytes_per_token(cfg, tp=tp)
    return _q(f"{name} fp16 on tp={tp} H100s (3.35 TB/s each): one decode step for {batch} "
              f"sequences with {_n(context)} tokens of context each, at the roofline?",
              t, "ms",
              f"per GPU it reads its weights ({show(serving.weight_bytes(cfg, tp=tp), 'GB')}) "
              f"and the KV cache ({show(reads - serving.weight_bytes(cfg, tp=tp), 'GB')}): "
              f"{show(reads / H100.hbm_bandwidth, 'ms')}; plus TP all-reduces "
              "(serving.decode_time, planner.ROOFLINE).",
              "Decode time ≈ (weights + KV read) / HBM bandwidth: batching amortises weights.")


@drill("warm-up", "12")
def littles_law(rng):
    rate, latency = rng.choice((5, 20, 50, 200)), rng.choice((0.5, 2, 8, 20))
    return _q(f"Requests arrive at {rate}/s and each spends {_n(latency)} s in the system. "
              "How many are in the system on average?", rate * latency, "requests",
              "Little's law: L = λ·W.",
              "Little's law sizes queues, batches and replicas from rate × latency.")


@drill("interview", "12")
def replicas_from_littles_law(rng):
    rate, latency, slots = rng.choice((10, 40, 100)), rng.choice((4, 10, 30)), \
        rng.choice((16, 32, 64))
    replicas = math.ceil(rate * latency / slots)
    return _q(f"{rate} requests/s, each occupying a batch slot for {latency} s; a replica "
              f"serves {slots} at once. Fewest replicas that keep up?", replicas, "replicas",
              f"L = λW = {_n(rate * latency)} requests in flight / {slots} per replica, "
              "rounded up.",
              "Capacity = concurrency / latency: add replicas or slots, or cut latency.")


@drill("hard", "12")
def decode_compute_bound_batch(rng):
    gpu, dtype = rng.choice((H100, A100)), rng.choice(("fp16", "fp32"))
    value_bytes = planner.DTYPES[dtype][1]
    peak = gpu.peak_flops[planner.DTYPES[dtype][0]]
    batch = peak * value_bytes / (2 * gpu.hbm_bandwidth)
    return _q(f"Decode on a {gpu.name} ({show(peak, 'TFLOP/s')} in {dtype}, "
              f"{show(gpu.hbm_bandwidth, 'TB/s')}), weights in {dtype}, KV cache ignored: "
              "from what batch size is a decode step compute-bound?", batch, "sequences",
              f"2·b FLOPs per weight of {value_bytes} bytes read: 2b/{value_bytes} = peak/BW "
              f"→ b = peak·{value_bytes}/(2·BW).",
              "Decode is memory-bound up to a batch of ~the ridge point / 2 per byte.")


@drill("interview", "12", rel_tol=0.2)
def prefill_time_roofline(rng):
    name, cfg = _serving_model(rng)
    tokens = rng.choice((512, 2048, 4096))
    tp = 8 if cfg.layers == 80 else 1
    t = serving.prefill_time(cfg, sc_spec.preset("dgx-h100"), tokens, tp=tp,
                             efficiency=planner.ROOFLINE)
    n = planner.parameter_count(cfg)
    return _q(f"{name} fp16 on tp={tp} H100s (989 TFLOP/s each): prefill of one "
              f"{_n(tokens)}-token prompt at the roofline?", t, "ms",
              f"≈ 2·N·tokens / (tp·peak) = {show(2 * n * tokens / (tp * 989e12), 'ms')}, "
              "plus attention and TP all-reduces (serving.prefill_time).",
              "Prefill is compute-bound: 2·N FLOPs per prompt token.")


# ------------------------------------------------------------------ drawing and grading


def names(level=None, lesson=None):
    """The registered drills' names, in registration order (lesson 00 first)."""
    if level is not None and level not in LEVELS:
        raise ValueError(f"level must be one of {', '.join(LEVELS)}, got {level!r}")
    return [d.name for d in DRILLS.values()
            if (level is None or d.level == level) and (lesson is None or d.lesson == lesson)]


def make(name, seed=0):
    """The drill ``name`` drawn with ``seed``: a :class:`Question`."""
    if name not in DRILLS:
        raise ValueError(f"no drill called {name!r}; see drills.names()")
    return DRILLS[name](seed)


def draw(level=None, n=5, seed=0, lesson=None):
    """``n`` different drills of ``level`` (None: any) drawn with ``seed``: the same list on
    every machine for the same arguments."""
    pool = names(level, lesson)
    if not pool:
        raise ValueError(f"no drills for level={level!r}, lesson={lesson!r}")
    if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= len(pool):
        raise ValueError(f"n must be an integer from 1 to {len(pool)}, got {n!r}")
    rng = random.Random(f"draw:{level}:{lesson}:{seed}")
    return [make(name, seed) for name in rng.sample(pool, n)]


@dataclass(frozen=True)
class Grade:
    """``status``: ``"correct"``, ``"wrong"`` or ``"invalid"`` (not a number in a unit of
    the right kind); ``message``: the one-line verdict; ``value``: the response in base
    units (None if invalid); ``explanation``: the worked answer and the takeaway, there
    once the response is a valid answer (right or wrong), empty before."""

    status: str
    message: str
    value: float = None
    explanation: str = ""

    @property
    def correct(self):
        """Whether the response is right within the tolerance."""
        return self.status == "correct"

    def __str__(self):
        return f"{self.message}\n\n{self.explanation}".strip()

    def _repr_markdown_(self):
        return str(self)


def _close(value, answer, rel_tol):
    return abs(value - answer) <= rel_tol * abs(answer) + 1e-300


def _other_unit(value, question):
    """The binary unit (GiB for GB, GB for GiB, ...) in which ``value`` is closer to the
    answer than it is in the question's own unit, or None. A tolerance cannot tell them
    apart (GiB and GB differ by 7.4 %, TiB and TB by 10 %): the unit is checked instead."""
    kind, _ = unit_kind(question.unit)
    unit = question.unit.strip()
    prefix = unit[:-len("B/s")] if kind == "bandwidth" else unit[:-1]
    if kind not in ("bytes", "bandwidth") or prefix.rstrip("i") not in "KMGTP" or not prefix:
        return None
    power = "KMGTP".index(prefix[0]) + 1
    ratio = 2 ** (10 * power) / 10 ** (3 * power)       # 1 GiB / 1 GB
    binary = prefix.endswith("i")
    mistaken = question.answer * ratio if binary else question.answer / ratio
    if abs(value - mistaken) < abs(value - question.answer):
        other = prefix[0] + ("" if binary else "i")
        return unit.replace(prefix, other, 1)
    return None


def grade(question, response):
    """Grade ``response`` (a number in the question's unit, or text such as "1.5 GB",
    "about 3e9", "12%") against ``question``'s computed answer, within its tolerance.
    Never raises for a bad response: it becomes an ``"invalid"`` :class:`Grade`. A valid
    answer, right or wrong, comes with the worked answer (``str(grade)``, or the grade
    as a cell's last expression); the one-line ``message`` never holds a wrong answer's
    solution (the lab's checks print it)."""
    try:
        value = parse(response, question.unit)
    except ParseError as error:
        return Grade("invalid", f"⚠️ {error}")
    if unit_kind(question.unit)[0] == "fraction" and "%" not in str(response) \
            and abs(value) <= 1 and _close(value / 100, question.answer, question.rel_tol):
        value /= 100        # a bare "0.5" for an answer of 0.5 %: read as a percentage
    explanation = f"**Worked answer.** {question.worked}\n\n**Takeaway.** {question.takeaway}"
    other = _other_unit(value, question)
    if other is not None:
        return Grade("wrong", f"❌ {show(value, question.unit)} is the answer counted in "
                     f"{other}, not in {question.unit.strip()} (1 GiB = 1.074 GB).", value,
                     explanation)
    if _close(value, question.answer, question.rel_tol):
        return Grade("correct", f"✅ {show(value, question.unit)} is right (the computed answer "
                     f"is {question.answer_text}; ±{sig(question.rel_tol * 100)}% counts).",
                     value, explanation)
    ratio = value / question.answer if question.answer else math.inf
    how = "too high" if value > question.answer else "too low"
    factor = f" ({sig(ratio, 2)}× the answer)" if ratio > 0 and (ratio >= 1.5 or ratio <= 0.67) \
        else ""
    return Grade("wrong", f"❌ {show(value, question.unit)} is {how}{factor}.", value,
                 explanation)


# ------------------------------------------------------------------ timed mode


class Session:
    """A timed drill session without widgets (the widget of :func:`timed` drives one).

    For each question in turn: :meth:`approach` (how you would solve it, in words: graded
    interviews ask for it first), then :meth:`answer` (a number; an invalid one may be
    retyped). The worked answer is only available (:meth:`worked`) once the question is
    answered. :meth:`tick` counts the clock down; an answer after the time is up is
    graded, shown, but scores nothing. :attr:`score` counts answers right in time.

    ``per="question"``: each question gets ``seconds`` (default by level, :data:`SECONDS`);
    ``per="set"``: one clock for the whole set (default: the questions' times summed).
    """

    def __init__(self, questions, seconds=None, per="question"):
        self.questions = list(questions)
        if not self.questions:
            raise ValueError("a session needs at least one question (drills.draw(...))")
        if per not in ("question", "set"):
            raise ValueError(f"per must be 'question' or 'set', got {per!r}")
        if seconds is not None and (number(seconds) is None or not seconds > 0):
            raise ValueError(f"seconds must be a positive number, got {seconds!r}")
        self.seconds, self.per = seconds, per
        self.index = 0
        self.approaches = [None] * len(self.questions)
        self.grades = [None] * len(self.questions)
        self.in_time = [False] * len(self.questions)
        if per == "set":
            self.remaining = seconds if seconds is not None else \
                sum(SECONDS[q.level] for q in self.questions)
        else:
            self.remaining = self._limit(self.questions[0])

    def _limit(self, question):
        return SECONDS[question.level] if self.seconds is None else self.seconds

    @property
    def question(self):
        """The current question, or None when the session is over."""
        return self.questions[self.index] if self.index < len(self.questions) else None

    @property
    def done(self):
        """Whether every question has been answered and left."""
        return self.index >= len(self.questions)

    @property
    def answered(self):
        """Whether the current question has a valid answer (correct or wrong)."""
        return not self.done and self.grades[self.index] is not None

    def tick(self, seconds=1):
        """Count the clock down by ``seconds`` (until the current question is answered)."""
        if not self.done and not self.answered:
            self.remaining = max(0, self.remaining - seconds)
        return self.remaining

    def approach(self, text):
        """Record the approach to the current question; it must say something."""
        if self.done:
            raise ValueError("the session is over")
        if not isinstance(text, str) or len(text.strip()) < 3:
            raise ValueError("write your approach first: which formula, which terms "
                             "dominate, what you would look up")
        self.approaches[self.index] = text.strip()

    def answer(self, response):
        """Grade ``response`` for the current question (after :meth:`approach`)."""
        if self.done:
            raise ValueError("the session is over")
        if self.approaches[self.index] is None:
            return Grade("invalid", "⚠️ write your approach first, then the number")
        if self.answered:
            return self.grades[self.index]
        result = grade(self.question, response)
        if result.status != "invalid":
            self.grades[self.index] = result
            self.in_time[self.index] = self.remaining > 0
        return result

    def worked(self):
        """The current question's worked answer and takeaway, once answered."""
        if not self.answered:
            raise ValueError("answer the question first: the worked answer comes after")
        q = self.question
        late = "" if self.in_time[self.index] else "\n\n⏰ answered after the time: no point."
        return (f"{self.grades[self.index].message}{late}\n\n**Your approach:** "
                f"{self.approaches[self.index]}\n\n**Worked answer.** {q.worked}\n\n"
                f"**Takeaway.** {q.takeaway}")

    def next(self):
        """Move on to the next question (the current one must be answered)."""
        if not self.answered:
            raise ValueError("answer the question first")
        self.index += 1
        if not self.done and self.per == "question":
            self.remaining = self._limit(self.question)

    @property
    def score(self):
        """Questions answered correctly within their time."""
        return sum(bool(g and g.correct and t) for g, t in zip(self.grades, self.in_time))

    def summary(self):
        """One line: the score, and how many were right at all."""
        right = sum(bool(g and g.correct) for g in self.grades)
        return (f"Score: {self.score} / {len(self.questions)} right in time "
                f"({right} right in all).")


def _md(markdown):
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/markdown": markdown, "text/plain": markdown}}


class Timed:
    """The countdown widget over a :class:`Session`; what :func:`timed` returns.

    Displayed, it is one output whose markdown and plain-text forms say only what the
    session is (level, number of questions, time) — never a question's answer: answers
    and worked answers reach the widget only after an answer is checked.
    """

    def __init__(self, session, title):
        self.session, self.title = session, title
        self._widget = None
        self._task = None

    def text(self):
        """What a stored output shows: the session, never a question's answer."""
        return (f"{self.title}: {len(self.session.questions)} questions, "
                "approach first, then the number. Run this cell to start the clock.")

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {}
        widget = self.widget()
        if widget is not None:
            bundle.update(widget._repr_mimebundle_())
        bundle["text/plain"] = self.text()
        bundle["text/markdown"] = f"**{self.text()}**"
        return bundle

    def widget(self):
        """The ipywidgets box (built once), or None without ipywidgets."""
        if self._widget is not None:
            return self._widget
        try:
            import ipywidgets as w
        except ImportError:
            return None
        self._prompt, self._feedback = w.Output(), w.Output()
        self._clock = w.Label()
        self._approach = w.Textarea(placeholder="your approach: formula, terms, estimate",
                                    layout=w.Layout(width="100%", height="4em"))
        self._number = w.Text(placeholder="your answer, e.g. 1.5 GB",
                              layout=w.Layout(width="16em"))
        self._go = w.Button(description="Approach done", button_style="info")
        self._check = w.Button(description="Check", button_style="primary")
        self._next = w.Button(description="Next")
        self._go.on_click(lambda _: self._submit_approach())
        self._check.on_click(lambda _: self._submit_answer())
        self._next.on_click(lambda _: self._advance())
        self._answer_row = w.HBox([self._number, self._check])
        self._widget = w.VBox([self._prompt, self._clock, self._approach, self._go,
                               self._answer_row, self._feedback, self._next])
        self._show_question()
        return self._widget

    def _say(self, markdown):
        self._feedback.outputs = (_md(markdown),) if markdown else ()

    def _show_question(self):
        s = self.session
        if s.done:
            self._prompt.outputs = (_md(f"### {s.summary()}"),)
            for box in (self._clock, self._approach, self._go, self._answer_row,
                        self._next):
                box.layout.display = "none"
            return
        q = s.question
        self._prompt.outputs = (_md(f"**{self.title} — question {s.index + 1} of "
                                    f"{len(s.questions)}** (lesson {q.lesson}, {q.level})"
                                    f"\n\n{q.text} *(answer in {q.unit or 'a number'})*"),)
        self._approach.value = self._number.value = ""
        self._approach.disabled = False
        self._go.layout.display = None
        self._answer_row.layout.display = "none"     # the number comes after the approach
        self._next.layout.display = "none"
        self._say("")
        self._update_clock()
        self._start_clock()

    def _update_clock(self):
        r = int(math.ceil(self.session.remaining))
        where = "for this question" if self.session.per == "question" else "for the set"
        self._clock.value = f"⏱ {r // 60}:{r % 60:02d} left {where}" if r > 0 else \
            "⏰ time's up — answer anyway to see the worked answer (no point)"

    def _start_clock(self):
        import asyncio
        if self._task is not None:
            self._task.cancel()
        try:
            loop = asyncio.get_event_loop()
        except RuntimeError:
            return
        if not loop.is_running():            # no kernel loop (a script, a test): no clock
            return

        async def countdown(index):
            while self.session.index == index and not self.session.answered \
                    and self.session.remaining > 0:
                await asyncio.sleep(1)
                self.session.tick(1)
                self._update_clock()

        self._task = loop.create_task(countdown(self.session.index))

    def _submit_approach(self):
        try:
            self.session.approach(self._approach.value)
        except ValueError as error:
            self._say(f"⚠️ {error}")
            return
        self._approach.disabled = True
        self._go.layout.display = "none"
        self._answer_row.layout.display = None
        self._say("")

    def _submit_answer(self):
        result = self.session.answer(self._number.value)
        if result.status == "invalid":
            self._say(result.message)
            return
        self._answer_row.layout.display = "none"
        self._say(self.session.worked())
        self._next.layout.display = None
        self._update_clock()

    def _advance(self):
        self.session.next()
        self._show_question()


def timed(level=None, n=5, seed=0, seconds=None, per="question", lesson=None):
    """A timed drill session of ``n`` questions of ``level`` (None: any) drawn with
    ``seed``: ``seconds`` per question (``per="question"``, default by level:
    :data:`SECONDS`) or for the whole set (``per="set"``). The last expression of a
    cell: it shows the countdown widget."""
    session = Session(draw(level, n, seed, lesson), seconds, per)
    title = f"Drills ({level or 'all levels'}, seed {seed})"
    return Timed(session, title)


# ------------------------------------------------------------------ the lab's checks

def _reference():
    """The lab's answers (``_reference_drills``), imported inside the checks only, so that
    importing the drills never loads them (as :func:`workbook.checking.answers` does)."""
    return importlib.import_module(f"{__package__}._reference_drills")


# The lab's drill set: one question from five lessons, fixed numbers.
DRILL_SET = (("ring_allreduce_time", 13), ("zero3_per_gpu", 13), ("gpipe_bubble", 13),
             ("young_checkpoint_interval", 13), ("kv_cache_size", 13))
NOT_ANSWERS = ("answer", "answer_text", "worked")   # what a learner's code may not read


def drill_set():
    """The lab's drill set: ``{name: Question}``."""
    return {name: make(name, seed) for name, seed in DRILL_SET}


def show_drill_set():
    """Print the lab's drill set: each question's name, text and unit (no answers)."""
    for name, q in drill_set().items():
        print(f"{name}  (lesson {q.lesson}; answer in {q.unit or 'a number'})")
        print(f"    {q.text}\n")


def _names_used(code):
    """Every attribute and global name ``code`` and the code nested in it (lambdas,
    comprehensions) use."""
    found = set(code.co_names)
    for const in code.co_consts:
        if hasattr(const, "co_names"):
            found |= _names_used(const)
    return found


def _refuse_answer_reading(fn, hint):
    code = getattr(fn, "__code__", None)
    read = _names_used(code) & set(NOT_ANSWERS) if code is not None else set()
    if read:
        raise Failure(f"your function reads a drill's computed answer ({', '.join(sorted(read))}); "
                      "work the numbers out yourself", hint)


def _unmarked(message):
    """A grade's message without its ❌/⚠️ mark (the check's line has its own)."""
    return message.split(" ", 1)[1] if message[:1] in ("❌", "⚠") else message


def _plain(text):
    """A learner's text as a plain ``str``: a subclass's own ``__str__`` or ``strip`` (an
    endless loop, say) never runs inside a check."""
    return str.__str__(text)


def _learner_dict(answers_fn, what, keys):
    """The dict ``answers_fn()`` returns (run on a simulated rank, under a time limit)."""
    if isinstance(answers_fn, dict):
        got = answers_fn
    elif callable(answers_fn):
        got = on_a_rank(answers_fn, (), what)   # an exception or endless loop: a Failure
    else:
        raise Failure(f"{what} must be a function returning a dict, got {answers_fn!r}",
                      "def my_answers(): return {'name': value, ...}")
    if got is None:
        raise Failure(f"{what} returned None", "return a dict {name: answer} at the end")
    if not isinstance(got, dict):
        raise Failure(f"{what} returned a {type(got).__name__}, not a dict",
                      "return a dict {name: answer}")
    missing = [k for k in keys if k not in got]
    if missing:
        raise Failure(f"{what}: no answer for {', '.join(missing)}",
                      f"give all of {', '.join(keys)}")
    return got


@check("drill set")
def check_drill_set(answers_fn):
    """Grade the learner's answers to :data:`DRILL_SET`: ``answers_fn()`` returns
    ``{name: answer}``, each a number in the question's unit or text with a unit
    ("1.2 ms"), graded as :func:`grade` does."""
    hint = "show_drill_set() prints the questions; a number is read in the unit asked."
    if callable(answers_fn):
        refuse_reference(answers_fn, _reference().drill_answers)
        _refuse_answer_reading(answers_fn, hint)
    questions = drill_set()
    got = _learner_dict(answers_fn, "your drill answers", list(questions))
    for name, q in questions.items():
        response = got[name]
        if number(response) is None and not isinstance(response, str):
            raise Failure(f"{name}: {response!r} is not a number or a text like '1.2 ms'",
                          hint)
        result = grade(q, number(response) if number(response) is not None
                       else _plain(response))
        if not result.correct:
            raise Failure(f"{name}: {_unmarked(result.message)}", q.takeaway)
    return f"all {len(questions)} drills right (lessons " \
           f"{', '.join(q.lesson for q in questions.values())})"


# -------------------------------------------- an estimate in the scaling book's style

ESTIMATE_MODEL = planner.TransformerConfig(
    layers=80, hidden=8192, heads=64, kv_heads=8, seq_len=4096, vocab=32000,
    ffn_hidden=28672, swiglu=True, tied_embeddings=False)
ESTIMATE_LAYOUT = dict(tp=8, pp=8, dp=16, global_batch=1024, micro_batch=1,
                       recompute="selective")
ESTIMATE_KEYS = ("flops", "compute_s", "bubble", "tp_comm_s", "dp_comm_s", "dominant")
TERMS = {"tp": "tp_communication", "pp": "pp_communication", "dp": "dp_communication",
         "bubble": "bubble"}
ESTIMATE_TOL = {"flops": 0.15, "compute_s": 0.15, "bubble": 0.1, "tp_comm_s": 0.2,
                "dp_comm_s": 0.2}
ESTIMATE_UNITS = {"flops": "FLOP", "compute_s": "s", "bubble": "%", "tp_comm_s": "s",
                  "dp_comm_s": "s"}


def estimate_cluster():
    """The 1,024 H100s of the estimate: 128 DGX H100 nodes."""
    return sc_spec.preset("dgx-h100", nodes=128)


def estimate_problem():
    """The text of the estimation problem (lesson 13's lab)."""
    cluster = estimate_cluster()
    fabric, nic = cluster.nodes[0].fabric, cluster.inter_node_link
    L = ESTIMATE_LAYOUT
    return (
        f"A 70 B LLaMA-style model ({sig(planner.parameter_count(ESTIMATE_MODEL) / 1e9)} B "
        f"parameters: {_model_text(ESTIMATE_MODEL)}, SwiGLU MLP of {_n(ESTIMATE_MODEL.ffn)}, "
        f"vocabulary {_n(ESTIMATE_MODEL.vocab)}, sequences of {_n(ESTIMATE_MODEL.seq_len)} "
        f"tokens) trains on 1,024 H100s (128 DGX nodes; 989 TFLOP/s bf16 each) with "
        f"tp={L['tp']} inside each node, pp={L['pp']}, dp={L['dp']}; {_n(L['global_batch'])} "
        f"sequences per step, micro-batch {L['micro_batch']}, 1F1B, selective recomputation.\n"
        f"NVLink: {show(fabric.effective_bandwidth_among(8), 'GB/s')} per GPU, "
        f"α = {show(fabric.latency, 'µs')}. InfiniBand: "
        f"{show(nic.effective_bandwidth, 'GB/s')} per GPU (one NIC each), "
        f"α = {show(nic.latency, 'µs')}.\nEstimate, per step:\n"
        "  flops      the model's training FLOPs (no recomputation)\n"
        "  compute_s  those FLOPs at peak on all GPUs (a lower bound on the step)\n"
        "  bubble     the pipeline bubble, as a fraction of the step\n"
        "  tp_comm_s  one GPU's TP all-reduces (4 per layer and micro-batch, of the bf16 "
        "b·s·h activation, ring α-β, not overlapped)\n"
        "  dp_comm_s  one GPU's gradient all-reduce (its bf16 shard 2N/(tp·pp), ring over "
        "dp on InfiniBand)\n"
        "  dominant   after compute, which costs most: 'tp', 'pp', 'dp' or 'bubble'?")


def _estimate_expected():
    """``(expected values, the planner's Estimate)``: formulas in code and the planner."""
    cfg, cluster, L = ESTIMATE_MODEL, estimate_cluster(), ESTIMATE_LAYOUT
    est = planner.estimate(cfg, cluster, **L)
    gpus = L["tp"] * L["pp"] * L["dp"]
    m = L["global_batch"] // (L["dp"] * L["micro_batch"])
    fabric, nic = cluster.nodes[0].fabric, cluster.inter_node_link
    nvlink = _link(fabric.latency, fabric.effective_bandwidth_among(L["tp"]))
    ib = _link(nic.latency, nic.effective_bandwidth)
    activation = 2 * L["micro_batch"] * cfg.seq_len * cfg.hidden
    flops = planner.flops_per_iteration(cfg, L["global_batch"], "none")
    expected = {
        "flops": flops,
        "compute_s": flops / (gpus * H100.peak_flops["bfloat16"]),
        "bubble": bubble_formula(L["pp"], m),
        "tp_comm_s": 4 * cfg.layers // L["pp"] * m * costmodel.flat_time(
            "all_reduce", "flat_ring", L["tp"], activation, nvlink),
        "dp_comm_s": costmodel.flat_time(
            "all_reduce", "flat_ring", L["dp"],
            2 * planner.parameter_count(cfg) / (L["tp"] * L["pp"]), ib),
        "dominant": max(TERMS, key=lambda k: est.breakdown[TERMS[k]]),
    }
    return expected, est


@check("step-time estimate")
def check_estimate(estimate_fn):
    """Grade the learner's estimate of :func:`estimate_problem`: ``estimate_fn()``
    returns ``{key: value}`` for :data:`ESTIMATE_KEYS` (numbers in s, FLOP, a fraction;
    or text with units), each within :data:`ESTIMATE_TOL` of the formula in code; the
    dominant term must be the planner's. The ✅ line compares with the planner."""
    hint = "estimate_problem() prints the question; start from 6·N·tokens."
    if callable(estimate_fn):
        refuse_reference(estimate_fn, _reference().estimate)
    got = _learner_dict(estimate_fn, "your estimate", list(ESTIMATE_KEYS))
    expected, est = _estimate_expected()
    for key in ESTIMATE_KEYS[:-1]:
        q = Question(key, "hard", "09", 0, key, expected[key], ESTIMATE_UNITS[key],
                     ESTIMATE_TOL[key], "", "")
        response = got[key]
        value = number(response)
        if value is None and not isinstance(response, str):
            raise Failure(f"{key}: {response!r} is not a number", hint)
        result = grade(q, value if value is not None else _plain(response))
        if not result.correct:
            raise Failure(f"{key}: {_unmarked(result.message)}", {
                "flops": "6 FLOPs per parameter per token (2 forward, 4 backward).",
                "compute_s": "FLOPs / (GPUs × 989 TFLOP/s).",
                "bubble": "m = batch / (dp · micro-batch); bubble (p − 1)/(m + p − 1).",
                "tp_comm_s": "layers per stage × micro-batches × 4 × ring all-reduce time "
                             "2(t−1)α + 2(t−1)/t · n/B on NVLink.",
                "dp_comm_s": "ring over dp: 2(dp−1)α + 2(dp−1)/dp · shard/B on InfiniBand.",
            }[key])
    if not isinstance(got["dominant"], str):   # str() of another object runs its code
        raise Failure(f"dominant: a {type(got['dominant']).__name__} is not a text",
                      "name one term: 'tp', 'pp', 'dp' or 'bubble'")
    dominant = _plain(got["dominant"]).strip().lower()
    if dominant not in TERMS:
        raise Failure(f"dominant: {got['dominant']!r} is not one of "
                      f"{', '.join(map(repr, TERMS))}", "name one term")
    if dominant != expected["dominant"]:
        raise Failure(f"dominant: {dominant!r} is not what costs most after compute",
                      "compare your tp, dp and bubble seconds (bubble × step)")
    b = est.breakdown
    return (f"within tolerance; the planner predicts {sig(est.step_time)} s per step "
            f"(MFU {sig(est.mfu * 100)}%): compute {sig(b['compute'])} s (kernels below "
            f"peak), TP {sig(b['tp_communication'])} s, bubble {sig(b['bubble'])} s")
