"""The checks of lab 12 (serving), on the protocol of :mod:`workbook.checking`.

* :func:`check_max_batch`: sequences whose KV cache fits beside the weights, on OPT-13B,
  LLaMA-2-70B (grouped-query attention) on one GPU and on a node's worth of memory, in
  fp16 and fp32, against the formula 2 · layers · kv_heads · head_dim · bytes per token.
* :func:`check_dynamic_batches`: a dynamic batcher (max batch, max queue delay) in front
  of one server, on Poisson traces, a burst, ``max_batch=1`` and no delay.
* :func:`check_schedule`: one iteration of continuous batching — admit, or decode with
  preemption — on hand-made cases (watermark, ``max_num_seqs``, several preemptions)
  and 300 random ones.
* :func:`check_size_fleet`: replicas × TP with the fewest GPUs that meets a p99 TTFT and
  TPOT SLO, simulated with :mod:`simcluster.serving`; an impossible SLO gives None.
* :func:`check_kpa_desired`: Knative's KPA decision (stable and panic windows, panic at
  2× the ready replicas, no scale-down in panic, leaving it a stable window later).

Every learner call runs on a simulated rank with a time limit (:func:`on_a_rank`), so a
loop that never ends becomes a ❌ line. The reference answers (:mod:`._reference`) are
imported inside the checks only.
"""

import inspect
import math
import random

from simcluster import planner, serving
from workbook.checking import (HINTS, Failure, answers, check, num, on_a_rank, raised,
                               refuse_reference, short)
from workbook.lesson12_serving import lab


_reference = answers(__name__)


def _refuse_library(fn, names, hint):
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
                      "what the check compares with", hint)


def _calls(fn, cases):
    """``fn(*args)`` for every ``(name, args)`` of ``cases``, all on one simulated rank
    under one time limit; returns the results. An exception names its case."""
    def all_cases():
        out = []
        for name, args in cases:
            try:
                out.append(fn(*args))
            except Exception as error:  # noqa: BLE001 — the learner's mistake, reported
                return out, (name, error)
        return out, None

    results, error = on_a_rank(all_cases, (), "the cases")
    if error is not None:
        raise raised(error[0], error[1], HINTS["called"])
    return results


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


GiB = 2**30

# ------------------------------------------------------ exercise 1: KV cache and batch

MAX_BATCH_CASES = (
    ("OPT-13B, fp16, 80 GiB, 512 tokens", lab.OPT_13B, 80 * GiB, 512, 2, 0.9),
    ("OPT-13B, fp16, 80 GiB, 2,048 tokens, 95 %", lab.OPT_13B, 80 * GiB, 2048, 2, 0.95),
    ("OPT-13B, fp32, 80 GiB, 1,024 tokens", lab.OPT_13B, 80 * GiB, 1024, 4, 0.9),
    ("LLaMA-2-70B, bf16, 8 x 80 GiB, 4,096 tokens", lab.LLAMA2_70B, 640 * GiB, 4096, 2, 0.9),
    ("LLaMA-2-70B, bf16, one 80 GiB GPU", lab.LLAMA2_70B, 80 * GiB, 1024, 2, 0.9),
)
MAX_BATCH_HINT = ("per token the cache holds a key and a value per layer and KV head: "
                  "2 · layers · kv_heads · head_dim · bytes; the room is utilization · "
                  "memory minus the weights (planner.parameter_count(cfg) · bytes); round "
                  "down, and never below 0.")


@check("max_batch")
def check_max_batch(fn):
    """``fn(cfg, memory, context, dtype_bytes, utilization)`` returns the reference's
    integer on every case; common slips are named."""
    ref = _reference()
    refuse_reference(fn, ref.max_batch)
    _refuse_library(fn, ("kv_bytes_per_token", "Deployment"),
                    "write the KV-cache formula yourself.")
    results = _calls(fn, [(c[0], c[1:]) for c in MAX_BATCH_CASES])
    for (name, cfg, memory, context, nbytes, util), got in zip(MAX_BATCH_CASES, results):
        want = ref.max_batch(cfg, memory, context, nbytes, util)
        if not _is_int(got):
            raise Failure(f"{name}: returned {short(repr(got), 60)}, not an int",
                          "return a whole number of sequences: math.floor(...), or //.")
        if got == want:
            continue
        hint = MAX_BATCH_HINT
        if want == 0 and got < 0:
            hint = "when the weights do not fit there is no room at all: return 0."
        elif want and got == 2 * want or (want and abs(got / want - 2) < 0.01):
            hint = "a token keeps a key AND a value per layer: the factor 2 is missing."
        elif cfg.kv != cfg.heads and want and got < want / 4:
            hint = ("this model has grouped-query attention: the cache holds kv_heads "
                    "(cfg.kv), not heads, per layer.")
        raise Failure(f"{name}: returned {got}, expected {want}", hint)
    return f"all {len(MAX_BATCH_CASES)} cases right, grouped-query attention and a model " \
           "that does not fit included"


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
            ("Poisson 300/s, max_batch 1, no delay", _poisson_times(300, 40, 3), 1, 0.0),
            ("Poisson 400/s, max_batch 16, no delay", _poisson_times(400, 80, 4), 16, 0.0),
            ("a burst of 10 at t = 0, max_batch 4, delay 1 ms", [0.0] * 10, 4, 0.001))


BATCH_HINT = ("when the server is free, a batch starts once max_batch requests wait or "
              "the oldest has waited max_queue_delay (whichever is first, never before "
              "the server is free), and takes every request arrived by then, up to "
              "max_batch.")


@check("dynamic_batches")
def check_dynamic_batches(fn):
    """``fn(arrivals, max_batch, max_queue_delay, service)`` returns the reference's
    ``[(start, size)]`` on every case."""
    ref = _reference()
    refuse_reference(fn, ref.dynamic_batches)
    cases = _batch_cases()
    results = _calls(fn, [(name, (list(arrivals), size, delay, _service))
                          for name, arrivals, size, delay in cases])
    for (name, arrivals, size, delay), got in zip(cases, results):
        want = ref.dynamic_batches(arrivals, size, delay, _service)
        try:
            got = [(float(s), int(n)) for s, n in got]
        except (TypeError, ValueError):
            raise Failure(f"{name}: returned {short(repr(got), 60)}, not a list of "
                          "(start, size) pairs", "return [(start_time, batch_size), ...].") \
                from None
        if sum(n for _, n in got) != len(arrivals):
            raise Failure(f"{name}: the batches hold {sum(n for _, n in got)} requests, "
                          f"not the {len(arrivals)} that arrived", BATCH_HINT)
        for i, ((s, n), (ws, wn)) in enumerate(zip(got, want)):
            if n != wn or not math.isclose(s, ws, rel_tol=1e-9, abs_tol=1e-12):
                hint = BATCH_HINT
                if n > size:
                    hint = f"a batch holds at most max_batch = {size} requests."
                elif delay and i == 0 and s == arrivals[0]:
                    hint = ("the first batch left as soon as the first request arrived: "
                            "wait up to max_queue_delay for more.")
                raise Failure(f"{name}: batch {i} is (start {num(s)} s, {n} requests), "
                              f"expected (start {num(ws)} s, {wn})", hint)
        if len(got) != len(want):
            raise Failure(f"{name}: {len(got)} batches, expected {len(want)}", BATCH_HINT)
    return f"{len(cases)} traces batched as Triton's dynamic batcher does"


# ------------------------------------------------------ exercise 3: continuous batching

SCHEDULE_CASES = (
    ("room for one prompt", dict(running=[40], waiting=[100], free_blocks=10), ("prefill", 1)),
    ("room for one of two prompts", dict(running=[], waiting=[100, 100], free_blocks=10),
     ("prefill", 1)),
    ("the watermark keeps 2 blocks free", dict(running=[40], waiting=[100], free_blocks=8,
                                                watermark=2), ("decode", 0)),
    ("max_num_seqs reached", dict(running=[40, 41, 42], waiting=[10], free_blocks=50,
                                  max_num_seqs=3), ("decode", 0)),
    ("nothing to do", dict(running=[], waiting=[], free_blocks=5), ("idle", 0)),
    ("two sequences need a block, one is free",
     dict(running=[16, 5, 32], waiting=[], free_blocks=1), ("decode", 1)),
    ("four need a block, none is free", dict(running=[16, 16, 16, 16], waiting=[],
                                             free_blocks=0), ("decode", 2)),
    ("the victim needed no new block", dict(running=[32, 17], waiting=[], free_blocks=0),
     ("decode", 1)),
)
SCHEDULE_HINT = ("first admit waiting prompts in order while the sequences stay within "
                 "max_num_seqs and free_blocks - ceil(prompt / block_size) >= watermark; "
                 "if none was admitted, decode: a sequence whose length is a multiple of "
                 "block_size needs a new block; while more are needed than free, preempt "
                 "the LAST running sequence (its blocks come free, it needs none).")


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


@check("schedule")
def check_schedule(fn):
    """``fn(running, waiting, free_blocks, block_size, max_num_seqs, watermark)`` returns
    the reference's ``(kind, count)`` on hand-made and random cases."""
    ref = _reference()
    refuse_reference(fn, ref.schedule)
    cases = list(SCHEDULE_CASES) + _random_schedule_cases()
    results = _calls(fn, [(name, _schedule_args(kwargs)) for name, kwargs, _ in cases])
    for (name, kwargs, expected), got in zip(cases, results):
        want = ref.schedule(*_schedule_args(kwargs))
        assert expected is None or want == expected, (name, want)   # the cases say it
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and isinstance(got[0], str)
                and _is_int(got[1])):
            raise Failure(f"{name}: returned {short(repr(got), 60)}, not (kind, count)",
                          "return a pair such as ('prefill', 2), ('decode', 1) or "
                          "('idle', 0).")
        if tuple(got) != want:
            hint = SCHEDULE_HINT
            if want[0] == "decode" and got[0] == "decode" and got[1] != want[1]:
                hint = ("count the blocks the next token needs (length % block_size == 0) "
                        "and preempt from the end of `running`, giving back each victim's "
                        "ceil(length / block_size) blocks and removing its own need.")
            elif "watermark" in name or (want[0] != "prefill" and got[0] == "prefill"):
                hint = ("admit a prompt only while free_blocks - ceil(prompt / block_size) "
                        ">= watermark and the sequences stay within max_num_seqs.")
            shown = {k: v for k, v in kwargs.items()}
            raise Failure(f"{name} {short(repr(shown), 120)}: returned {tuple(got)}, "
                          f"expected {want}", hint)
    return f"{len(cases)} iterations scheduled (admission, watermark, max_num_seqs, " \
           "preemption) as vLLM's scheduler does"


# ------------------------------------------------------ exercise 4: size a fleet

FLEET_CASES = (
    ("4 req/s, TTFT 0.5 s, TPOT 50 ms", 4.0, 0.5, 0.050),
    ("20 req/s, TTFT 0.3 s, TPOT 40 ms", 20.0, 0.3, 0.040),
    ("4 req/s, TTFT 0.5 s, TPOT 15 ms", 4.0, 0.5, 0.015),
    ("4 req/s, TPOT 3 ms (impossible)", 4.0, 0.5, 0.003),
)
FLEET_HINT = ("for each tp in 1, 2, 4, 8 (dividing the heads), try 1, 2, ... replicas of "
              "serving.Deployment(cluster, cfg, replicas=r, tp=tp, load_balancer="
              "'least_outstanding'), simulate, and keep the layout with the fewest GPUs "
              "(replicas * tp) whose p99 TTFT and p99 TPOT meet the SLO; None if none does.")


@check("size_fleet")
def check_size_fleet(fn):
    """``fn(cluster, cfg, requests, ttft_slo, tpot_slo)`` returns ``(replicas, tp)`` that
    meets the SLO with the reference's (fewest) GPUs, or None when nothing can."""
    ref = _reference()
    refuse_reference(fn, ref.size_fleet)
    cluster = lab.node()
    for name, rate, ttft, tpot in FLEET_CASES:
        requests = lab.traffic(rate)
        want = ref.size_fleet(cluster, lab.OPT_13B, requests, ttft, tpot)
        got = on_a_rank(fn, (cluster, lab.OPT_13B, requests, ttft, tpot), name)
        if want is None:
            if got is not None:
                raise Failure(f"{name}: returned {short(repr(got), 60)}, but no layout of "
                              "the node meets this SLO", "return None when nothing meets it.")
            continue
        if not (isinstance(got, (tuple, list)) and len(got) == 2
                and all(_is_int(x) and x > 0 for x in got)):
            raise Failure(f"{name}: returned {short(repr(got), 60)}, not (replicas, tp)",
                          FLEET_HINT)
        replicas, tp = got
        try:
            dep = serving.Deployment(cluster, lab.OPT_13B, replicas=replicas, tp=tp,
                                     load_balancer="least_outstanding")
        except ValueError as error:
            raise Failure(f"{name}: ({replicas}, {tp}) is not a deployment: {short(error)}",
                          FLEET_HINT) from None
        res = serving.simulate(requests, dep)
        p99 = res.percentile("ttft", 99), res.percentile("tpot", 99)
        if p99[0] > ttft or p99[1] > tpot:
            raise Failure(f"{name}: {replicas} replica(s) at tp={tp} give p99 TTFT "
                          f"{p99[0] * 1e3:.0f} ms and TPOT {p99[1] * 1e3:.1f} ms: the SLO "
                          "is not met", "use the 99th percentile (res.percentile(..., 99)), "
                          "not the mean or the median. " + FLEET_HINT)
        if replicas * tp > want[0] * want[1]:
            raise Failure(f"{name}: ({replicas}, {tp}) uses {replicas * tp} GPUs; "
                          f"{want[0] * want[1]} are enough", FLEET_HINT)
    return f"{len(FLEET_CASES)} SLOs met with the fewest GPUs (one impossible one refused)"


# ------------------------------------------------------ exercise 5: the autoscaling rule

KPA_CASES = (
    # (stable, panic, ready, panicking_since, now, target)
    ("stable, 25 in flight, target 10", (25, 25, 2, None, 0.0, 10)),
    ("stable, scale down to what the stable window asks", (5, 5, 4, None, 0.0, 10)),
    ("panic window asks for 2x the ready replicas", (12, 40, 2, None, 10.0, 10)),
    ("panic window asks for less than 2x", (12, 39, 2, None, 10.0, 10)),
    ("in panic the load fell: no scale-down", (5, 5, 4, 10.0, 30.0, 10)),
    ("a stable window after the last panic", (5, 5, 4, 10.0, 70.0, 10)),
    ("still panicking: the panic window asks for more", (20, 35, 4, 10.0, 40.0, 10)),
    ("no load at all", (0, 0, 3, None, 100.0, 100)),
    ("panic extended while over the threshold", (50, 300, 1, 10.0, 65.0, 100)),
)
KPA_HINT = ("want ceil(stable / target); if panic / ready >= 2 * target, (re)start the "
            "panic at now; while panicking (until now >= panicking_since + 60) want "
            "max(ceil(panic / target), ready); otherwise follow the stable window and stop "
            "panicking; never fewer than 1.")


@check("kpa_desired")
def check_kpa_desired(fn):
    """``fn(stable, panic, ready, panicking_since, now, target)`` returns the reference's
    ``(replicas, panicking_since)`` on every case."""
    ref = _reference()
    refuse_reference(fn, ref.kpa_desired)
    _refuse_library(fn, ("Autoscaler",), "write the rule yourself.")
    for (name, args), got in zip(KPA_CASES, _calls(fn, KPA_CASES)):
        want = ref.kpa_desired(*args)
        if not (isinstance(got, (tuple, list)) and len(got) == 2 and _is_int(got[0])):
            raise Failure(f"{name}: returned {short(repr(got), 60)}, not (replicas, "
                          "panicking_since)", "return a pair: an int and a time or None.")
        if tuple(got) != want:
            hint = KPA_HINT
            if got[0] == want[0] and got[1] != want[1]:
                hint = ("panicking_since is the time of the LAST crossing of the threshold "
                        "(now, when panic / ready >= 2 * target), and None once a stable "
                        "window (60 s) has passed since it.")
            elif args[3] is not None and got[0] < args[2] and want[0] >= args[2]:
                hint = "while panicking the autoscaler never scales down."
            raise Failure(f"{name} {args}: returned {tuple(got)}, expected {want}", hint)
    return f"{len(KPA_CASES)} decisions as Knative's KPA makes them"
