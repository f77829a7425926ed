"""The checks of lab 12 (serving), on the protocol of :mod:`workbook.checking`.

* :func:`check_max_batch`: sequences whose KV cache fits beside the weights, on OPT-13B,
  LLaMA-2-70B (grouped-query attention) on one GPU and on two and eight GPUs' memory, in
  fp16 and fp32, with fractions of a sequence below and above one half.
* :func:`check_dynamic_batches`: a dynamic batcher (max batch, max queue delay) in front
  of one server, on Poisson traces, batches that fill before the delay, a burst,
  ``max_batch=1`` and no delay.
* :func:`check_schedule`: one iteration of continuous batching — admit, or decode with
  preemption — on hand-made cases (the watermark and its boundary, ``max_num_seqs``, a
  prompt that does not fit ahead of one that would, several preemptions) and 300 random
  ones; the caller's lists must come back unchanged.
* :func:`check_size_fleet`: replicas × TP with the fewest GPUs that meets a p99 TTFT and
  TPOT SLO, simulated with :mod:`simcluster.serving`: cases that need more than one
  replica, where tensor parallelism needs fewer GPUs than replicas, where round robin
  would pick another layout, and an impossible SLO (None).
* :func:`check_kpa_desired`: Knative's KPA decision (stable and panic windows, panic at
  2× the ready replicas, no scale-down in panic, leaving it a stable window after the
  last crossing, a crossing 60 s or more after the last one).

Every learner call runs on a simulated rank with a time limit (:func:`on_a_rank`), and so
does everything the check does with what it returns (comparing, converting, showing it):
a function, or a returned object whose ``__len__``, ``__float__`` or ``__eq__`` never
returns or raises, becomes a ❌ line. Expected answers are computed before the learner's
code runs, on copies of what the learner receives. The reference answers
(:mod:`._reference`) are imported inside the checks only.
"""

import copy
import functools
import inspect
import math
import random

from simcluster import planner, serving
from workbook.checking import (HINTS, Failure, answers, check, num, on_a_rank, raised,
                               refuse_reference, short)
from workbook.hints import Hints
from workbook.lesson12_serving import lab


_reference = answers(__name__)


hint = Hints({
    "max_batch": [
        "Two amounts of memory decide it: what one token of context costs in the cache, "
        "and what is left once the weights are in. Which fields of cfg count the keys and "
        "values one layer keeps per token, and which argument says how many bytes a "
        "value takes?",
        "Per token the cache keeps a key and a value for every layer and every KV head "
        "(cfg.kv, fewer than cfg.heads with grouped-query attention), each head_dim "
        "values of dtype_bytes bytes. The engine owns utilization of memory; the weights "
        "(planner.parameter_count(cfg) values) come out of that share. A sequence needs "
        "context tokens of cache: only whole sequences count, and never fewer than none.",
    ],
    "dynamic_batches": [
        "Walk through the trace one batch at a time, keeping the time the server becomes "
        "free and the first request not yet served. What are the two events that can "
        "close a batch, and which comes first?",
        "The batch of the oldest waiting request can start at the earliest of two times: "
        "when the max_batch-th waiting request (counting the oldest as the first) "
        "arrives, and the oldest's arrival plus max_queue_delay — but never before the "
        "server is free. It then takes every request that has arrived by that start, up "
        "to max_batch, and the server is busy for service(size).",
    ],
    "schedule": [
        "Two phases, in order: does any waiting prompt get in (and what stops admission, "
        "and at which prompt)? Only if none does, what does decoding one more token of "
        "every running sequence need from the free blocks?",
        "Admission goes through `waiting` in order and stops at the first prompt that "
        "cannot come in: too many sequences, or the blocks it takes would leave fewer "
        "than the watermark free. Decoding: a sequence needs a new block exactly when "
        "its last block is full. While the need exceeds the free blocks, the newest "
        "running sequence gives its blocks back, and no longer needs one. Work on a copy "
        "of the caller's lists.",
    ],
    "size_fleet": [
        "What you pay for is replicas × tp GPUs. For a given tp, which number of "
        "replicas is the one to keep? And which layouts of the node are there at all?",
        "For each tensor-parallel degree the node allows, find the fewest replicas whose "
        "simulation (the load balancer the exercise names) meets both p99 limits; "
        "compare the layouts by GPUs, not by the order you found them in. A layout that "
        "does not fit (serving.Deployment raises ValueError) is not a candidate, and "
        "None is the answer when no layout meets both limits.",
    ],
    "kpa_desired": [
        "Three questions in order: is the panic window over the threshold now? Then: is "
        "the autoscaler panicking (and since when)? Then: which window decides, and may "
        "it scale down?",
        "The threshold compares the panic window's average per ready replica with twice "
        "the target, and a crossing always (re)starts the panic at now — even a stable "
        "window after the last one. Without a crossing, panic ends once a whole stable "
        "window has passed since panicking_since. In panic the panic window decides and "
        "the fleet never shrinks below what is ready; otherwise the stable window "
        "decides. Replicas are whole and at least one.",
    ],
})


# The causes the checks name, one per slip they recognise (what the learner got wrong,
# never the line to write).
SLIP_HINTS = {
    "factor_two": "a token keeps a key AND a value per layer and KV head: the cache "
                  "was counted half as large as it is.",
    "kv_heads": "the cache holds kv_heads (cfg.kv) heads per layer, not heads: with "
                "grouped-query attention they are fewer.",
    "dtype": "dtype_bytes sets the bytes of every value, weights and cache alike (the "
             "fp32 cases take 4).",
    "kv_dtype": "the cache is kept in the model's dtype: dtype_bytes bytes per value, "
                "as the weights (the fp32 cases take 4).",
    "weight_dtype": "the weights take dtype_bytes bytes per parameter (the fp32 cases "
                    "take 4).",
    "memory": "the memory argument sets the room: a node's worth of memory holds many "
              "more sequences than one GPU.",
    "utilization": "the utilization argument is the share of memory the engine takes "
                   "(one case gives 95 %).",
    "utilization_share": "the engine takes utilization of ALL the memory, and the "
                         "weights come out of that share (not utilization of what the "
                         "weights leave).",
    "round": "only whole sequences fit: round down, never to the nearest (some cases "
             "leave more than half a sequence of room).",
    "ceil": "only whole sequences fit: round down, not up.",
    "negative": "when the weights do not fit there is no room at all: 0 sequences, "
                "never fewer.",
    "full_late": "a batch is full once max_batch requests wait, the oldest counted as "
                 "the first: it starts at the arrival of the max_batch-th, not the one "
                 "after.",
    "no_wait": "the first request of a batch waits up to max_queue_delay for more to "
               "come.",
    "delay_from_free": "max_queue_delay counts from the oldest waiting request's "
                       "arrival, not from when the server is free.",
    "before_free": "a batch never starts before the server is free (the previous "
                   "batch's start plus its service time).",
    "takes": "a batch takes every request that has arrived by its start (arrival <= "
             "start), up to max_batch.",
    "batch_rule": "a batch starts at the earlier of its two closing times, never "
                  "before the server is free, and takes what has arrived by then.",
    "preempt_order": "preempt from the end of `running`: the most recently admitted "
                     "sequence goes first.",
    "preempt_need": "a sequence needs a new block exactly when its last block is full "
                    "(its length a multiple of block_size); here the free blocks cover "
                    "that need without preempting anyone.",
    "preempt_frees": "a preempted sequence gives back all its blocks and no longer needs "
                     "a new one: count both before you preempt the next.",
    "admit_in_order": "admission stops at the first prompt that does not fit: a later, "
                      "smaller one waits its turn (first come, first served).",
    "admit_seqs": "a prompt comes in only while the sequences, running and admitted, "
                  "stay within max_num_seqs.",
    "watermark_equal": "a prompt may come in when the blocks left after it are at "
                       "least the watermark (equal is enough).",
    "admit_watermark": "a prompt comes in only if the free blocks left once it has its "
                       "blocks are at least the watermark.",
    "idle": "'idle' is for an iteration with nothing admitted and nothing running.",
    "admit_first": "first try to admit; decode only when no prompt came in.",
    "threshold_first": "test the threshold first: a crossing (re)starts the panic at "
                       "now, even a stable window after the last one.",
    "per_ready": "the threshold is per ready replica: the panic window's average "
                 "divided by the ready replicas, against 2 · target.",
    "equal_crossing": "when panic / ready reaches 2 · target (equal included) the "
                      "panic starts.",
    "panicking_since": "panicking_since is the time of the LAST crossing, and None "
                       "once a whole stable window (60 s, now included) has passed "
                       "since it.",
    "no_scale_down": "while panicking the autoscaler never scales down below the ready "
                     "replicas.",
    "at_least_one": "never fewer than one replica.",
    "window": "the window that decides: the panic window while panicking, the stable "
              "one otherwise; whole replicas, rounded up.",
}


def _more(exercise, text):
    """A ❌ hint: the cause the check found, then where the next step of help is."""
    return f"{text} ({hint.pointer(exercise)})"


def _refuse_library(fn, names, why):
    """Fail if ``fn`` names one of ``serving``'s ``names`` (what the check compares with)."""
    code = getattr(inspect.unwrap(fn), "__code__", None) if callable(fn) else None
    if code is None:
        return
    found = inspect.getclosurevars(fn)
    named = [*found.globals.values(), *found.nonlocals.values()]
    refused = [getattr(serving, n) for n in names]
    uses = any(v is r for v in named for r in refused) or (
        any(v is serving for v in named) and set(found.unbound) & set(names))
    if uses:
        raise Failure(f"this function uses serving.{' / serving.'.join(names)}, which is "
                      "what the check compares with", why)


class _Shape(Exception):
    """What a learner returned is not of the shape the exercise asks for: ``what`` and a
    hint, found on the learner's rank."""

    def __init__(self, what, hint):
        super().__init__(what)
        self.what, self.hint = what, hint


def _shown(value, limit=60):
    """``repr(value)``, cut; called on the learner's rank (a ``__repr__`` may loop)."""
    try:
        return short(repr(value), limit)
    except Exception:  # noqa: BLE001 — a broken __repr__ is the learner's
        return f"a {type(value).__name__}"


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _is_real(x):
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _pair(got, what, hint):
    """``got`` as a 2-tuple, or :class:`_Shape`: a list is not a tuple."""
    if not isinstance(got, tuple) or len(got) != 2:
        kind = "a list" if isinstance(got, list) else _shown(got)
        raise _Shape(f"returned {kind}, not a tuple {what}", hint)
    return got


def _judged(fn, plain, names=()):
    """``fn`` followed by ``plain`` on what it returns, to run on a learner's rank: a wrong
    shape, or a list argument named in ``names`` (by position; None: not checked) that
    came back changed, is returned as its :class:`_Shape`."""
    def call(*args):
        before = [list(a) if isinstance(a, list) else a for a in args]
        try:
            got = plain(fn(*args), args)
            for what, was, now in zip(names, before, args):
                if what and was != now:
                    raise _Shape(f"the caller's `{what}` list was changed (to "
                                 f"{_shown(now, 40)})", "a function that decides must "
                                 "leave its arguments as they were: work on a copy.")
            return got
        except _Shape as shape:
            return shape
    return call


def _calls(fn, cases, plain, names=()):
    """:func:`_judged` ``fn`` on every ``(name, args)`` of ``cases``, all on one simulated
    rank under one time limit. Returns the plain results; an exception or a wrong shape
    names its case."""
    judged = _judged(fn, plain, names)

    def all_cases():
        out = []
        for name, args in cases:
            try:
                got = judged(*args)
            except Exception as error:  # noqa: BLE001 — the learner's mistake, reported
                return out, (name, error)
            if isinstance(got, _Shape):
                return out, (name, got)
            out.append(got)
        return out, None

    results, error = on_a_rank(all_cases, (), "the cases")
    if error is not None:
        name, error = error
        if isinstance(error, _Shape):
            raise Failure(f"{name}: {error.what}", error.hint)
        raise raised(name, error, HINTS["called"])
    return results


GiB = 2**30

# ------------------------------------------------------ exercise 1: KV cache and batch

MAX_BATCH_CASES = (
    ("OPT-13B, fp16, 80 GiB, 512 tokens", lab.OPT_13B, 80 * GiB, 512, 2, 0.9),
    ("OPT-13B, fp16, 80 GiB, 2,048 tokens, 95 %", lab.OPT_13B, 80 * GiB, 2048, 2, 0.95),
    ("OPT-13B, fp16, 80 GiB, 2,048 tokens", lab.OPT_13B, 80 * GiB, 2048, 2, 0.9),
    ("OPT-13B, fp16, 40 GiB, 4,096 tokens", lab.OPT_13B, 40 * GiB, 4096, 2, 0.9),
    ("OPT-13B, fp32, 80 GiB, 1,024 tokens", lab.OPT_13B, 80 * GiB, 1024, 4, 0.9),
    ("OPT-13B, fp32, 80 GiB, 2,048 tokens", lab.OPT_13B, 80 * GiB, 2048, 4, 0.9),
    ("LLaMA-2-70B, bf16, 8 x 80 GiB, 4,096 tokens", lab.LLAMA2_70B, 640 * GiB, 4096, 2, 0.9),
    ("LLaMA-2-70B, bf16, 2 x 80 GiB, 2,048 tokens, 95 %", lab.LLAMA2_70B, 160 * GiB, 2048,
     2, 0.95),
    ("LLaMA-2-70B, fp32, 8 x 80 GiB, 4,096 tokens", lab.LLAMA2_70B, 640 * GiB, 4096, 4, 0.9),
    ("LLaMA-2-70B, bf16, one 80 GiB GPU", lab.LLAMA2_70B, 80 * GiB, 1024, 2, 0.9),
)


def _max_batch_slips(ref):
    """``[(cause, slip)]``: ``slip(cfg, memory, context, nbytes, util)`` is what a common
    mistake returns, from the reference's room (in sequences, before rounding) on inputs
    changed the way the mistake changes them."""
    room = ref.kv_room

    def down(value):
        return max(0, math.floor(value))

    return [
        (SLIP_HINTS["round"], lambda *case: max(0, round(room(*case)))),
        (SLIP_HINTS["ceil"],
         lambda *case: max(0, math.ceil(room(*case)))),
        (SLIP_HINTS["negative"],
         lambda *case: math.floor(room(*case))),
        (SLIP_HINTS["factor_two"], lambda *case: down(2 * room(*case))),
        (SLIP_HINTS["kv_heads"],
         lambda cfg, *rest: down(room(cfg, *rest) * cfg.kv / cfg.heads)),
        (SLIP_HINTS["dtype"], lambda *case: down(room(*case[:3], 2, case[4]))),
        (SLIP_HINTS["kv_dtype"],
         lambda cfg, memory, context, nbytes, util: down(
             room(cfg, memory, context, nbytes, util) * nbytes / 2)),
        (SLIP_HINTS["weight_dtype"],
         lambda cfg, memory, context, nbytes, util: down(room(
             cfg, memory + planner.parameter_count(cfg) * (nbytes - 2) / util, context,
             nbytes, util))),
        (SLIP_HINTS["memory"],
         lambda cfg, memory, *rest: down(room(cfg, 80 * GiB, *rest))),
        (SLIP_HINTS["utilization"], lambda *case: down(room(*case[:4], 0.9))),
        (SLIP_HINTS["utilization_share"],
         lambda cfg, memory, context, nbytes, util: down(room(
             cfg, memory + planner.parameter_count(cfg) * nbytes * (1 / util - 1), context,
             nbytes, util))),
    ]


def _diagnose(results, cases, slips, default):
    """The cause of the first slip that returns exactly the learner's ``results`` on every
    case (its outputs computed here, on the check's own copies); else ``default``."""
    for cause, slip in slips:
        try:
            if all(slip(*case) == got for case, got in zip(cases, results)):
                return cause
        except (ArithmeticError, ValueError, TypeError):   # a slip undefined on a case
            continue
    return default


def _whole(got, args):
    if type(got) is not int:
        raise _Shape(f"returned {_shown(got)}, not an int",
                     "return a whole number of sequences, an int (int(...) or "
                     "math.floor(...): // on floats gives a float).")
    return got


def _max_batch_call(case):
    """The call of ``case``, to paste into a cell of the lab."""
    cfg, memory, context, dtype_bytes, utilization = case
    model = next(name for name in ("OPT_13B", "LLAMA2_70B") if getattr(lab, name) is cfg)
    return (f"max_batch(lab.{model}, {memory // GiB} * 2**30, {context}, {dtype_bytes}, "
            f"{utilization})")


@check("max_batch")
def check_max_batch(fn):
    """``fn(cfg, memory, context, dtype_bytes, utilization)`` returns the reference's
    integer on every case; a common slip that explains every answer is named."""
    ref = _reference()
    refuse_reference(fn, ref.max_batch)
    _refuse_library(fn, ("kv_bytes_per_token", "Deployment"),
                    "write the KV-cache formula yourself.")
    cases = [c[1:] for c in MAX_BATCH_CASES]
    wants = [ref.max_batch(*case) for case in cases]
    results = _calls(fn, [(f"{c[0]}, {_max_batch_call(c[1:])}", c[1:])
                          for c in MAX_BATCH_CASES], _whole)
    for (name, *_), got, want in zip(MAX_BATCH_CASES, results, wants):
        if got != want:
            cause = _diagnose(results, cases, _max_batch_slips(ref),
                              "count the cache's bytes per token and the room the weights "
                              "leave in the engine's share of memory, then the whole "
                              "sequences that fit.")
            raise Failure(f"{name}: returned {got}, expected {want}",
                          _more("max_batch", cause))
    return f"all {len(MAX_BATCH_CASES)} cases right: fp16 and fp32, grouped-query " \
           "attention, fractions above one half, and a model that does not fit"


# ------------------------------------------------------ exercise 2: a dynamic batcher


def _service(size):
    return 0.010 + 0.002 * size


def _poisson_times(rate, n, seed):
    rng, t, out = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        out.append(t)
    return out


def _batch_cases():
    return (("Poisson 200/s, max_batch 4, delay 5 ms", _poisson_times(200, 60, 1), 4, 0.005),
            ("Poisson 50/s, max_batch 8, delay 20 ms", _poisson_times(50, 60, 2), 8, 0.020),
            ("Poisson 400/s, max_batch 4, delay 50 ms (batches fill first)",
             _poisson_times(400, 60, 5), 4, 0.050),
            ("Poisson 300/s, max_batch 1, no delay", _poisson_times(300, 40, 3), 1, 0.0),
            ("Poisson 400/s, max_batch 16, no delay", _poisson_times(400, 80, 4), 16, 0.0),
            ("a burst of 10 at t = 0, max_batch 4, delay 1 ms", [0.0] * 10, 4, 0.001))


def _batches(got, args):
    """What the learner returned as ``[(start, size)]`` of floats and ints."""
    if not isinstance(got, list):
        raise _Shape(f"returned {_shown(got)}, not a list", "return a list of (start, size) "
                     "tuples, one per batch, in order.")
    out = []
    for pair in got:
        start, size = _pair(pair, "(start, size)", "each batch is a tuple (start time, "
                            "number of requests).")
        if not _is_real(start) or not _is_int(size):
            raise _Shape(f"returned the batch {_shown(pair)}: a start time and a whole "
                         "number of requests", "a batch's size is an int, its start a "
                                               "number of seconds.")
        out.append((float(start), int(size)))
    return out


@check("dynamic_batches")
def check_dynamic_batches(fn):
    """``fn(arrivals, max_batch, max_queue_delay, service)`` returns the reference's
    ``[(start, size)]`` on every case."""
    ref = _reference()
    refuse_reference(fn, ref.dynamic_batches)
    cases = _batch_cases()
    wants = [ref.dynamic_batches(list(arrivals), size, delay, _service)
             for _, arrivals, size, delay in cases]
    results = _calls(fn, [(name, (list(arrivals), size, delay, _service))
                          for name, arrivals, size, delay in cases], _batches,
                     names=("arrivals",))
    for (name, arrivals, size, delay), got, want in zip(cases, results, wants):
        if sum(n for _, n in got) != len(arrivals):
            raise Failure(f"{name}: the batches hold {sum(n for _, n in got)} requests, "
                          f"not the {len(arrivals)} that arrived",
                          _more("dynamic_batches", "every request is served once."))
        served, free = 0, 0.0      # before the batch being compared
        for i, ((s, n), (ws, wn)) in enumerate(zip(got, want)):
            if n != wn or not math.isclose(s, ws, rel_tol=1e-9, abs_tol=1e-12):
                cause = _batch_cause(arrivals, size, delay, served, free, s, n, ws, wn)
                raise Failure(f"{name}: batch {i} is (start {num(s)} s, {n} requests), "
                              f"expected (start {num(ws)} s, {wn})",
                              _more("dynamic_batches", cause))
            served, free = served + wn, ws + _service(wn)
        if len(got) != len(want):
            raise Failure(f"{name}: {len(got)} batches, expected {len(want)}",
                          _more("dynamic_batches", "every request is served once."))
    return f"{len(cases)} traces batched as Triton's dynamic batcher does"


def _batch_cause(arrivals, size, delay, i, free, s, n, ws, wn):
    """The cause of the first wrong batch, whose oldest request is ``arrivals[i]`` and
    whose server is free at ``free``: ``(s, n)`` returned, ``(ws, wn)`` expected. Each
    slip's start is computed from that state; the first that gives ``s`` is named."""
    def at(k):      # the arrival of the k-th waiting request, counting the oldest as 1st
        return arrivals[i + k - 1] if i + k - 1 < len(arrivals) else math.inf

    if n > size:
        return f"a batch holds at most max_batch = {size} requests."
    slips = (
        (max(free, min(at(1) + delay, at(size + 1))),
         SLIP_HINTS["full_late"]),
        (max(free, at(1)), SLIP_HINTS["no_wait"]),
        (min(max(free, at(1)) + delay, max(free, at(size))),
         SLIP_HINTS["delay_from_free"]),
        (min(at(1) + delay, at(size)), SLIP_HINTS["before_free"]),
    )
    same = functools.partial(math.isclose, rel_tol=1e-9, abs_tol=1e-12)
    for start, cause in slips:
        if same(start, s) and not same(start, ws):
            return cause
    if same(s, ws):
        return SLIP_HINTS["takes"]
    return SLIP_HINTS["batch_rule"]


# ------------------------------------------------------ exercise 3: continuous batching

SCHEDULE_CASES = (
    ("room for one prompt", dict(running=[40], waiting=[100], free_blocks=10), ("prefill", 1)),
    ("room for one of two prompts", dict(running=[], waiting=[100, 100], free_blocks=10),
     ("prefill", 1)),
    ("the watermark keeps 2 blocks free", dict(running=[40], waiting=[100], free_blocks=8,
                                                watermark=2), ("decode", 0)),
    ("exactly the watermark is left", dict(running=[40], waiting=[100], free_blocks=9,
                                           watermark=2), ("prefill", 1)),
    ("max_num_seqs reached", dict(running=[40, 41, 42], waiting=[10], free_blocks=50,
                                  max_num_seqs=3), ("decode", 0)),
    ("the first prompt does not fit, the second would",
     dict(running=[3], waiting=[300, 10], free_blocks=5), ("decode", 0)),
    ("nothing to do", dict(running=[], waiting=[], free_blocks=5), ("idle", 0)),
    ("two sequences need a block, one is free",
     dict(running=[16, 5, 32], waiting=[], free_blocks=1), ("decode", 1)),
    ("four need a block, none is free", dict(running=[16, 16, 16, 16], waiting=[],
                                             free_blocks=0), ("decode", 2)),
    ("the victim needed no new block", dict(running=[32, 17], waiting=[], free_blocks=0),
     ("decode", 1)),
)


def _random_schedule_cases(n=300, seed=12):
    rng = random.Random(seed)
    out = []
    for i in range(n):
        bs = rng.choice((4, 16))
        kwargs = dict(running=[rng.randrange(1, 6 * bs) for _ in range(rng.randrange(0, 9))],
                      waiting=[rng.randrange(1, 10 * bs) for _ in range(rng.randrange(0, 4))],
                      free_blocks=rng.randrange(0, 12), block_size=bs,
                      max_num_seqs=rng.randrange(1, 10), watermark=rng.randrange(0, 3))
        out.append((f"random case {i}", kwargs, None))
    return out


def _schedule_args(kwargs):
    return (list(kwargs["running"]), list(kwargs["waiting"]), kwargs["free_blocks"],
            kwargs.get("block_size", 16), kwargs.get("max_num_seqs", 256),
            kwargs.get("watermark", 0))


def _schedule_call(kwargs):
    """The call of the case ``kwargs``, whole, to paste into a cell."""
    return "schedule(" + ", ".join(f"{k}={v!r}" for k, v in kwargs.items()) + ")"


def _step(got, args):
    """What the learner returned as ``(kind, count)``."""
    kind, count = _pair(got, "(kind, count)", "return a tuple such as ('prefill', 2), "
                        "('decode', 1) or ('idle', 0).")
    if not isinstance(kind, str) or not _is_int(count):
        raise _Shape(f"returned {_shown(got)}, not (kind, count)", "the kind is a string "
                     "('prefill', 'decode' or 'idle'), the count an int.")
    return str(kind), int(count)


@check("schedule")
def check_schedule(fn):
    """``fn(running, waiting, free_blocks, block_size, max_num_seqs, watermark)`` returns
    the reference's ``(kind, count)`` on hand-made and random cases, and leaves the
    caller's ``running`` and ``waiting`` lists as they were."""
    ref = _reference()
    refuse_reference(fn, ref.schedule)
    cases = list(SCHEDULE_CASES) + _random_schedule_cases()
    wants = [ref.schedule(*_schedule_args(kwargs)) for _, kwargs, _ in cases]
    results = _calls(fn, [(f"{name}, {_schedule_call(kwargs)}", _schedule_args(kwargs))
                          for name, kwargs, _ in cases], _step, names=("running", "waiting"))
    for (name, kwargs, expected), (kind, count), want in zip(cases, results, wants):
        assert expected is None or want == expected, (name, want)   # the cases say it
        if (kind, count) != want:
            raise Failure(f"{name}, {_schedule_call(kwargs)}: returned {(kind, count)}, "
                          f"expected {want}",
                          _more("schedule", _schedule_cause(kwargs, kind, count, want)))
    return f"{len(cases)} iterations scheduled (admission, watermark, max_num_seqs, " \
           "preemption) as vLLM's scheduler does"


def _schedule_cause(kwargs, kind, count, want):
    """The one rule that explains a wrong ``(kind, count)`` on the case ``kwargs``: the
    reference on the case changed the way a slip changes it, or the kind of mistake."""
    ref, got = _reference(), (kind, count)

    def schedule(**changes):
        return ref.schedule(*_schedule_args({**kwargs, **changes}))

    if want[0] == "decode" and kind == "decode":
        if got == schedule(running=kwargs["running"][::-1]):
            return SLIP_HINTS["preempt_order"]
        return SLIP_HINTS["preempt_need" if want[1] == 0 else "preempt_frees"]
    if want[0] == "idle" or kind == "idle":
        return SLIP_HINTS["idle"]
    if got == schedule(max_num_seqs=len(kwargs["running"]) + len(kwargs["waiting"])):
        return SLIP_HINTS["admit_seqs"]
    watermark = kwargs.get("watermark", 0)
    if watermark and got == schedule(watermark=watermark + 1):
        return SLIP_HINTS["watermark_equal"]
    if watermark and got == schedule(watermark=0):
        return SLIP_HINTS["admit_watermark"]
    if kind == "prefill":
        return SLIP_HINTS["admit_in_order"]
    return SLIP_HINTS["admit_first"]


# ------------------------------------------------------ exercise 4: size a fleet

# (name, the model in lab, request rate, TTFT SLO, TPOT SLO)
FLEET_CASES = (
    ("4 req/s, TTFT 0.5 s, TPOT 50 ms", "OPT_13B", 4.0, 0.5, 0.050),
    ("20 req/s, TTFT 0.3 s, TPOT 40 ms", "OPT_13B", 20.0, 0.3, 0.040),
    ("4 req/s, TTFT 0.5 s, TPOT 15 ms", "OPT_13B", 4.0, 0.5, 0.015),
    ("12 req/s, TTFT 0.16 s, TPOT 35 ms", "OPT_13B", 12.0, 0.16, 0.035),
    ("20 req/s, TTFT 0.3 s, TPOT 30 ms", "OPT_13B", 20.0, 0.3, 0.030),
    ("8 req/s, TTFT 0.12 s, TPOT 40 ms", "OPT_13B", 8.0, 0.12, 0.040),
    ("4 req/s, TPOT 3 ms (impossible)", "OPT_13B", 4.0, 0.5, 0.003),
    # 20 heads: tp=8 is no layout of this model, and every search meets it here
    ("GPT-2 large (20 heads), 20 req/s, TPOT 1 ms (impossible)", "GPT2_LARGE", 20.0, 0.5,
     0.001),
)

FLEET_RAISED_HINT = ("call your function yourself, in a cell, with the case's arguments to "
                     "see the traceback. A layout that cannot be built — tp not dividing "
                     "cfg.heads, or more GPUs than the node has — makes serving.Deployment "
                     "raise ValueError: it is no candidate.")


def _layouts(cluster, cfg, requests, load_balancer):
    """``{(replicas, tp): (p99 TTFT, p99 TPOT, p50 TTFT, p50 TPOT)}`` of every layout of
    ``cluster`` that fits, simulated on ``requests``."""
    out = {}
    for tp in (1, 2, 4, 8):
        for replicas in range(1, cluster.spec.world_size // tp + 1):
            try:
                dep = serving.Deployment(cluster, cfg, replicas=replicas, tp=tp,
                                         load_balancer=load_balancer)
            except ValueError:          # tp does not divide the heads, or no room
                continue
            res = serving.simulate(requests, dep)
            out[replicas, tp] = tuple(res.percentile(m, q) for q in (99, 50)
                                      for m in ("ttft", "tpot"))
    return out


def _fleet(got, args):
    if got is None:
        return None
    replicas, tp = _pair(got, "(replicas, tp)", "return a tuple (replicas, tp), or None.")
    if not (_is_int(replicas) and _is_int(tp) and replicas > 0 and tp > 0):
        raise _Shape(f"returned {_shown(got)}, not (replicas, tp)", "two positive ints: "
                     "the replicas, then the GPUs of each.")
    return int(replicas), int(tp)


# (cause, balancer, test of a layout's (p99 TTFT, p99 TPOT, p50 TTFT, p50 TPOT) against
# the SLO): a search that keeps the fewest GPUs passing the test makes this slip
FLEET_SLIPS = (
    ("the p99 TPOT limit is never tested: both SLOs must hold.", "least_outstanding",
     lambda v, ttft, tpot: v[0] <= ttft),
    ("the p99 TTFT limit is never tested: both SLOs must hold.", "least_outstanding",
     lambda v, ttft, tpot: v[1] <= tpot),
    ("this search simulates with round robin; the exercise's balancer is "
     "least_outstanding.", "round_robin", lambda v, ttft, tpot: v[0] <= ttft and v[1] <= tpot),
    ("the SLO is on the 99th percentile, not the median or the mean.", "least_outstanding",
     lambda v, ttft, tpot: v[2] <= ttft and v[3] <= tpot),
)


def _fleet_slip(answers, expected):
    """The cause of the first :data:`FLEET_SLIPS` whose search returns, on every case, a
    layout of the learner's GPUs that passes its test (None where nothing does)."""
    for cause, balancer, ok in FLEET_SLIPS:
        explains = True
        for got, (_, _, ttft, tpot, _, tables) in zip(answers, expected):
            layouts = tables[balancer]
            fewest = min((r * tp for (r, tp), v in layouts.items() if ok(v, ttft, tpot)),
                         default=None)
            if got is None:
                explains = fewest is None
            else:
                explains = got in layouts and ok(layouts[got], ttft, tpot) \
                    and got[0] * got[1] == fewest
            if not explains:
                break
        if explains:
            return cause
    return None


def _fleet_answers(fn, expected):
    """The learner's ``(replicas, tp)`` or None for each case, each call on its own rank
    with its own copies of the cluster, the model and the requests; stops at the first
    case that fails, returning its :class:`Failure` last."""
    answers = []
    for name, cfg, ttft, tpot, requests, _ in expected:
        try:
            got = on_a_rank(_judged(fn, _fleet, (None, None, "requests")),
                            (lab.node(), copy.deepcopy(cfg), copy.deepcopy(requests),
                             ttft, tpot), name, FLEET_RAISED_HINT)
        except Failure as failure:
            return answers + [failure]
        if isinstance(got, _Shape):
            return answers + [Failure(f"{name}: {got.what}", got.hint)]
        answers.append(got)
    return answers


@check("size_fleet")
def check_size_fleet(fn):
    """``fn(cluster, cfg, requests, ttft_slo, tpot_slo)`` returns ``(replicas, tp)`` that
    meets the SLO with the reference's (fewest) GPUs, or None when nothing can. Each case
    hands the learner its own copies; every layout's percentiles and the reference's
    answer are computed before the learner's code runs."""
    ref = _reference()
    refuse_reference(fn, ref.size_fleet)
    cluster = lab.node()
    expected = []
    for name, model, rate, ttft, tpot in FLEET_CASES:
        cfg, requests = getattr(lab, model), lab.traffic(rate)
        tables = {lb: _layouts(cluster, cfg, requests, lb) for lb in serving.LOAD_BALANCERS}
        expected.append((name, cfg, ttft, tpot, requests, tables))
    wants = [ref.size_fleet(cluster, cfg, copy.deepcopy(requests), ttft, tpot)
             for _, cfg, ttft, tpot, requests, _ in expected]
    answers = _fleet_answers(fn, expected)
    for got, want, (name, _, ttft, tpot, _, tables) in zip(answers, wants, expected):
        if isinstance(got, Failure):
            raise got
        table = tables["least_outstanding"]
        if got == want or (got in table and want and got[0] * got[1] == want[0] * want[1]
                           and table[got][0] <= ttft and table[got][1] <= tpot):
            continue
        slip = _fleet_slip(answers, expected)
        if got is None or want is None:
            found = f"returned {got}, but " + (f"{want} meets the SLO" if want else
                                                "no layout of the node meets this SLO")
            raise Failure(f"{name}: {found}", _more("size_fleet", slip or (
                "None is for an SLO that no layout meets." if want else
                "a layout is only an answer if its simulation meets both p99 limits.")))
        replicas, tp = got
        if got not in table:
            cause = "a layout is (replicas, tp): tp GPUs for each of the replicas." \
                if (tp, replicas) in table else "only layouts of this node count."
            raise Failure(f"{name}: {replicas} replica(s) at tp={tp} is not a deployment "
                          "of this node and model", _more("size_fleet", cause))
        p99_ttft, p99_tpot = table[got][:2]
        if p99_ttft > ttft or p99_tpot > tpot:
            raise Failure(f"{name}: {replicas} replica(s) at tp={tp} give p99 TTFT "
                          f"{p99_ttft * 1e3:.0f} ms and TPOT {p99_tpot * 1e3:.1f} ms: the "
                          "SLO is not met", _more("size_fleet", slip or (
                              "keep only layouts whose simulation meets both p99 limits.")))
        cause = "more than one replica may need fewer GPUs than one wide replica." \
            if replicas == 1 else "compare the layouts by GPUs: the first one found that " \
                                  "meets the SLO is not always the cheapest."
        raise Failure(f"{name}: ({replicas}, {tp}) uses {replicas * tp} GPUs; "
                      f"{want[0] * want[1]} are enough", _more("size_fleet", cause))
    impossible = sum(want is None for want in wants)
    return f"{len(FLEET_CASES)} SLOs met with the fewest GPUs ({impossible} impossible ones " \
           "refused)"


# ------------------------------------------------------ exercise 5: the autoscaling rule

KPA_CASES = (
    # (stable, panic, ready, panicking_since, now, target)
    ("stable, 25 in flight, target 10", (25, 25, 2, None, 0.0, 10)),
    ("stable, scale down to what the stable window asks", (5, 5, 4, None, 0.0, 10)),
    ("panic window asks for 2x the ready replicas", (12, 40, 2, None, 10.0, 10)),
    ("panic window asks for less than 2x", (12, 39, 2, None, 10.0, 10)),
    ("over 2 x target in all, not per ready replica", (30, 30, 4, None, 10.0, 10)),
    ("in panic the load fell: no scale-down", (5, 5, 4, 10.0, 30.0, 10)),
    ("a stable window after the last panic", (5, 5, 4, 10.0, 70.0, 10)),
    ("still panicking: the panic window asks for more", (20, 35, 4, 10.0, 40.0, 10)),
    ("no load at all", (0, 0, 3, None, 100.0, 100)),
    ("panic extended while over the threshold", (50, 300, 1, 10.0, 65.0, 100)),
    ("over the threshold a stable window after the last crossing",
     (50, 300, 1, 10.0, 75.0, 100)),
)


def _decision(got, args):
    replicas, since = _pair(got, "(replicas, panicking_since)", "return a tuple: the "
                            "replicas wanted and the time panic began, or None.")
    if not _is_int(replicas) or not (since is None or _is_real(since)):
        raise _Shape(f"returned {_shown(got)}, not (replicas, panicking_since)",
                     "the replicas are an int; panicking_since a time or None.")
    return int(replicas), None if since is None else float(since)


def _kpa_cause(args, got, want):
    """The cause of a wrong decision on the case ``args``."""
    stable, panic, ready, since, now, target = args
    over = panic / ready >= 2 * target
    if since is not None and now >= since + 60 and over and got[1] is None:
        return SLIP_HINTS["threshold_first"]
    if not over and panic >= 2 * target and got[1] == now:
        return SLIP_HINTS["per_ready"]
    if over and got[1] is None:
        return SLIP_HINTS["equal_crossing"]
    if got[1] != want[1]:
        return SLIP_HINTS["panicking_since"]
    if want[1] is not None and got[0] < ready <= want[0]:
        return SLIP_HINTS["no_scale_down"]
    if want[0] == 1 and got[0] < 1:
        return SLIP_HINTS["at_least_one"]
    return SLIP_HINTS["window"]


@check("kpa_desired")
def check_kpa_desired(fn):
    """``fn(stable, panic, ready, panicking_since, now, target)`` returns the reference's
    ``(replicas, panicking_since)`` on every case."""
    ref = _reference()
    refuse_reference(fn, ref.kpa_desired)
    _refuse_library(fn, ("Autoscaler",), "write the rule yourself.")
    wants = [ref.kpa_desired(*args) for _, args in KPA_CASES]
    results = _calls(fn, [(f"{name}, kpa_desired{args}", args) for name, args in KPA_CASES],
                     _decision)
    for (name, args), got, want in zip(KPA_CASES, results, wants):
        if got != want:
            raise Failure(f"{name} {args}: returned {got}, expected {want}",
                          _more("kpa_desired", _kpa_cause(args, got, want)))
    return f"{len(KPA_CASES)} decisions as Knative's KPA makes them"
