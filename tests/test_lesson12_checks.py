"""Lab 12's checks (KV cache and batch, dynamic batcher, continuous-batching step, fleet
sizing, KPA rule): each passes the reference answer written as a learner would, refuses
the reference itself, and reports every plausible wrong answer — the holes issue 42
listed among them, and ones that raise, never return, or return objects whose methods
loop or raise — as one ❌ line naming the case and the real cause."""

import math
import re

import pytest

from _check_helpers import fails, learner_namespace, line, not_started, write_learner
from simcluster import planner, serving
from workbook import checking
from workbook.lesson12_serving import checks
from workbook.lesson12_serving import _reference as R
from workbook.lesson12_serving.checks import KPA_CASES

MINE = learner_namespace(R, R.max_batch, R.dynamic_batches, R.schedule, R.size_fleet,
                         R.kpa_desired)



# right answers under other names, for wrong answers built on them
OK = dict(MINE, ok_batches=MINE["dynamic_batches"], ok_schedule=MINE["schedule"],
          ok_fleet=MINE["size_fleet"])


def wrong(source):
    """A learner's function written from ``source`` (it sees what the reference sees)."""
    namespace = write_learner(source, OK)
    return namespace[re.findall(r"^def (\w+)\(", source, re.M)[-1]]   # the last one


# ------------------------------------------------------------ exercise 1
MAX_BATCH = """
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    kv = {kv} * cfg.layers * {heads} * cfg.head_dim * {kv_bytes}
    free = {util} * {memory} - planner.parameter_count(cfg) * {weight_bytes}
    return {round}(free / (kv * context)){floor}
"""
RIGHT = dict(kv=2, heads="cfg.kv", kv_bytes="dtype_bytes", util="utilization",
             memory="memory", weight_bytes="dtype_bytes", round="max(0, math.floor",
             floor=")")


def max_batch_with(**slip):
    return wrong(MAX_BATCH.format(**{**RIGHT, **slip}))


def test_max_batch_reference_passes(capsys):
    result, text = line(capsys, checks.check_max_batch, MINE["max_batch"])
    assert result and "fractions above one half" in text
    result, _ = line(capsys, checks.check_max_batch, max_batch_with())   # the template
    assert result


def test_max_batch_refuses_the_reference_and_the_library(capsys):
    fails(capsys, checks.check_max_batch, R.max_batch, "the workbook's own reference")
    fails(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    return serving.Deployment(None, cfg).kv_cache_tokens // context
"""), "uses serving.kv_bytes_per_token / serving.Deployment")


@pytest.mark.parametrize("slip, case, cause", [
    (dict(kv=1), "OPT-13B, fp16, 80 GiB, 512 tokens", "a key AND a value"),
    (dict(heads="cfg.heads"), "LLaMA-2-70B, bf16, 8 x 80 GiB", "kv_heads (cfg.kv)"),
    # a dtype slip was told "the factor 2 is missing"
    (dict(kv_bytes=2), "OPT-13B, fp32, 80 GiB, 1,024 tokens", "the cache is kept in the "
                                                             "model's dtype"),
    (dict(weight_bytes=2), "OPT-13B, fp32, 80 GiB, 1,024 tokens", "the weights take "
                                                                 "dtype_bytes"),
    (dict(kv_bytes=2, weight_bytes=2), "OPT-13B, fp32, 80 GiB, 1,024 tokens",
     "every value, weights and cache alike"),
    # an ignored memory argument was told about grouped-query attention
    (dict(memory="80 * 2**30"), "OPT-13B, fp16, 40 GiB", "the memory argument"),
    (dict(util=0.9), "2,048 tokens, 95 %", "the utilization argument"),
    (dict(memory="(memory - planner.parameter_count(cfg) * dtype_bytes)", weight_bytes="0"),
     "OPT-13B, fp16, 80 GiB, 512 tokens", "utilization of ALL the memory"),
    # every case used to leave less than half a sequence: round passed
    (dict(round="max(0, round", floor=")"), "OPT-13B, fp16, 80 GiB, 2,048 tokens",
     "never to the nearest"),
    (dict(round="max(0, math.ceil", floor=")"), "OPT-13B, fp16, 80 GiB, 512 tokens",
     "round down, not up"),
    (dict(round="math.floor", floor=""), "one 80 GiB GPU", "0 sequences, never fewer"),
])
def test_max_batch_names_each_slip(capsys, slip, case, cause):
    fails(capsys, checks.check_max_batch, max_batch_with(**slip), case, cause)


def test_max_batch_two_slips_at_once_get_the_general_hint(capsys):
    fails(capsys, checks.check_max_batch, max_batch_with(kv=1, round="max(0, round"),
          "returned", "count the cache's bytes per token")


def test_max_batch_wrong_types_and_a_raise(capsys):
    fails(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    return memory / context
"""), "not an int")
    # a float from // is a float: the hint no longer suggests //
    text = fails(capsys, checks.check_max_batch, max_batch_with(round="max(0, ", floor=" // 1)"),
                 "not an int", "// on floats gives a float")
    assert "or //." not in text
    fails(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    return cfg.kv_heads * 2
"""), "OPT-13B, fp16, 80 GiB, 512 tokens, max_batch(lab.OPT_13B, 80 * 2**30, 512, 2, 0.9) "
          "raised TypeError")


def test_max_batch_not_started(capsys):
    not_started(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    raise NotImplementedError("hint")
"""), "max_batch", "hint")


# ------------------------------------------------------------ exercise 2
def test_dynamic_batches_reference_passes(capsys):
    result, _ = line(capsys, checks.check_dynamic_batches, MINE["dynamic_batches"])
    assert result


def test_dynamic_batches_without_waiting(capsys):
    fails(capsys, checks.check_dynamic_batches, wrong("""
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    return ok_batches(arrivals, max_batch, 0.0, service)
"""), "Poisson 200/s", "waits up to max_queue_delay")


def test_dynamic_batches_over_the_batch_size(capsys):
    fails(capsys, checks.check_dynamic_batches, wrong("""
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    return ok_batches(arrivals, max_batch + 1, max_queue_delay, service)
"""), "at most max_batch")


BATCHER = """
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    out, free, rest = [], 0.0, list(arrivals)
    while rest:
        full = rest[{full}] if len(rest) > {full} else math.inf
        start = {start}
        size = min(max_batch, sum(1 for a in rest if a <= start))
        out.append((start, size))
        free, rest = start + service(size), rest[size:]
    return out
"""
BATCHER_RIGHT = dict(full="max_batch - 1", start="max(free, min(rest[0] + max_queue_delay, full))")


@pytest.mark.parametrize("slip, case, cause", [
    # issue 42: `full = i + max_batch` (the request after the max_batch-th) passed
    (dict(full="max_batch"), "batches fill first", "not the one after"),
    (dict(start="min(max(free, rest[0]) + max_queue_delay, max(free, full))"),
     "Poisson 200/s", "counts from the oldest waiting request's arrival"),
    (dict(start="min(rest[0] + max_queue_delay, full)"), "Poisson 200/s",
     "never starts before the server is free"),
])
def test_dynamic_batches_names_each_slip(capsys, slip, case, cause):
    result, _ = line(capsys, checks.check_dynamic_batches,
                     wrong(BATCHER.format(**BATCHER_RIGHT)))         # the template passes
    assert result
    fails(capsys, checks.check_dynamic_batches, wrong(BATCHER.format(**{**BATCHER_RIGHT,
                                                                        **slip})), case, cause)


def test_dynamic_batches_emptying_the_callers_arrivals(capsys):
    fails(capsys, checks.check_dynamic_batches, wrong("""
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    batches = ok_batches(list(arrivals), max_batch, max_queue_delay, service)
    arrivals.clear()
    return batches
"""), "the caller's `arrivals` list was changed")


def test_dynamic_batches_one_at_a_time_and_a_lost_request(capsys):
    fails(capsys, checks.check_dynamic_batches, wrong("""
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    out, free = [], 0.0
    for a in arrivals:
        start = max(free, a)
        out.append((start, 1))
        free = start + service(1)
    return out
"""), "batch 0 is")
    fails(capsys, checks.check_dynamic_batches, wrong("""
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    return ok_batches(arrivals, max_batch, max_queue_delay, service)[:-1]
"""), "the batches hold")


@pytest.mark.parametrize("change, shown", [
    ("[list(b) for b in batches]", "a list, not a tuple (start, size)"),
    ("tuple(batches)", "not a list"),
    # issue 43: int(n) was taken, so sizes of 2.9 passed
    ("[(s, n + 0.0) for s, n in batches]", "a whole number of requests"),
    ("[(s, n - 0.1 + 0.1 * (n > 0)) for s, n in batches]", "a whole number of requests"),
])
def test_dynamic_batches_wrong_shapes(capsys, change, shown):
    fails(capsys, checks.check_dynamic_batches, wrong(f"""
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    batches = ok_batches(arrivals, max_batch, max_queue_delay, service)
    return {change}
"""), shown)


def test_dynamic_batches_that_never_returns(capsys, short_timeout):
    fails(capsys, checks.check_dynamic_batches, wrong("""
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    i = 0
    while i < len(arrivals):
        pass
"""), "still running after 2 s", "a loop whose condition never changes")


# returned objects whose methods never return or raise (issue 43): judged on the rank
HOSTILE = """
class Endless(list):
    def __len__(self):
        while True:
            pass
    def __iter__(self):
        while True:
            yield (0.0, 1)


class Raising(float):
    def __float__(self):
        raise RuntimeError("no float")
    def __eq__(self, other):
        raise RuntimeError("no eq")
    __hash__ = float.__hash__
"""


def test_dynamic_batches_returning_an_endless_list(capsys, short_timeout):
    fails(capsys, checks.check_dynamic_batches, wrong(HOSTILE + """
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    return Endless()
"""), "still running after 2 s")


def test_dynamic_batches_returning_a_start_whose_float_raises(capsys):
    fails(capsys, checks.check_dynamic_batches, wrong(HOSTILE + """
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    return [(Raising(s), n) for s, n in ok_batches(arrivals, max_batch, max_queue_delay,
                                                   service)]
"""), "raised RuntimeError: no float")


# ------------------------------------------------------------ exercise 3
def test_schedule_reference_passes(capsys):
    result, text = line(capsys, checks.check_schedule, MINE["schedule"])
    assert result and "310 iterations" in text


def test_schedule_ignoring_the_watermark(capsys):
    # the trial: the call was cut ('wate…'), and the hint gave two rules
    text = fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return ok_schedule(running, waiting, free_blocks, block_size, max_num_seqs, 0)
"""), "the watermark keeps 2 blocks free, schedule(running=[40], waiting=[100], "
          "free_blocks=8, watermark=2): returned ('prefill', 1)",
          "blocks left once it has its blocks are at least the watermark")
    assert "max_num_seqs" not in text


def test_schedule_ignoring_max_num_seqs(capsys):
    text = fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return ok_schedule(running, waiting, free_blocks, block_size, 10**6, watermark)
"""), "max_num_seqs reached", "stay within max_num_seqs")
    assert "watermark" not in text


def test_schedule_a_victim_that_still_needs_its_block(capsys):
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    kind, n = ok_schedule(running, waiting, free_blocks, block_size, max_num_seqs, watermark)
    if kind != "decode":
        return kind, n
    running, preempted = list(running), 0
    needed = sum(1 for length in running if length % block_size == 0)
    while needed > free_blocks:
        free_blocks += -(-running.pop() // block_size)
        preempted += 1
    return "decode", preempted
"""), "four need a block, none is free", "returned ('decode', 4)",
          "no longer needs a new one")


def test_schedule_keeping_more_than_the_watermark(capsys):
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return ok_schedule(running, waiting, free_blocks, block_size, max_num_seqs,
                       watermark + 1 if watermark else 0)
"""), "exactly the watermark is left", "equal is enough")


def test_schedule_skipping_a_prompt_that_does_not_fit(capsys):
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    fits = [p for p in waiting if -(-p // block_size) <= free_blocks - watermark]
    return ok_schedule(running, fits, free_blocks, block_size, max_num_seqs, watermark)
"""), "the first prompt does not fit, the second would",
          "stops at the first prompt that does not fit")


def test_schedule_preempting_the_first(capsys):
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return ok_schedule(running[::-1], waiting, free_blocks, block_size, max_num_seqs,
                      watermark)
"""), "preempt from the end of `running`")


def test_schedule_mutating_the_callers_running_list(capsys):
    # issue 42: popping victims off the caller's own list passed
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    kind, n = ok_schedule(running, waiting, free_blocks, block_size, max_num_seqs, watermark)
    for _ in range(n if kind == "decode" else 0):
        running.pop()
    return kind, n
"""), "two sequences need a block, one is free", "the caller's `running` list was changed",
          "work on a copy")


@pytest.mark.parametrize("returned, shown", [
    ('["decode", 0]', "returned a list, not a tuple (kind, count)"),   # issue 42
    ('"decode"', "not a tuple (kind, count)"),
    ('("decode", 0.0)', "not (kind, count)"),
])
def test_schedule_wrong_shapes(capsys, returned, shown):
    fails(capsys, checks.check_schedule, wrong(f"""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return {returned}
"""), shown)


def test_schedule_a_raise_and_an_eq_that_raises(capsys):
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return ("decode", running[0] // 0)
"""), "raised")
    fails(capsys, checks.check_schedule, wrong(HOSTILE + """
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    kind_count = ok_schedule(running, waiting, free_blocks, block_size, max_num_seqs, watermark)
    if running:
        running[0] = Raising(running[0])
    return kind_count
"""), "raised RuntimeError: no eq")


# ------------------------------------------------------------ exercise 4
FLEET = """
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    best = None
    for tp in {tps}:
        if cfg.heads % tp:
            continue
        for replicas in range(1, {most} + 1):
            if {stop} and best and replicas * tp >= best[0] * best[1]:
                break
            res = serving.simulate(requests, serving.Deployment(
                cluster, cfg, replicas=replicas, tp=tp, load_balancer={balancer}))
            if {test}:
                {keep}
                break
    return best
"""
FLEET_RIGHT = dict(
    tps="(1, 2, 4, 8)", most="8 // tp", stop="True", balancer='"least_outstanding"',
    test='res.percentile("ttft", 99) <= ttft_slo and res.percentile("tpot", 99) <= tpot_slo',
    keep="best = (replicas, tp)")


def fleet_with(**slip):
    return wrong(FLEET.format(**{**FLEET_RIGHT, **slip}))


def test_size_fleet_reference_passes(capsys):
    result, _ = line(capsys, checks.check_size_fleet, MINE["size_fleet"])
    assert result
    result, _ = line(capsys, checks.check_size_fleet, fleet_with())      # the template
    assert result


@pytest.mark.parametrize("slip, case, found, cause", [
    # issue 42: each of these passed
    (dict(most="1"), "12 req/s, TTFT 0.16 s, TPOT 35 ms", "uses 4 GPUs; 3 are enough",
     "more than one replica"),
    (dict(keep="best = (tp, replicas)"), "12 req/s, TTFT 0.16 s, TPOT 35 ms",
     "1 replica(s) at tp=3 is not a deployment", "a layout is (replicas, tp)"),
    (dict(keep="return replicas, tp"), "20 req/s, TTFT 0.3 s, TPOT 30 ms",
     "uses 6 GPUs; 4 are enough", "the first one found"),
    (dict(balancer='"round_robin"'), "8 req/s, TTFT 0.12 s, TPOT 40 ms", "SLO is not met",
     "round robin"),
    # a missing TPOT test was told "use the 99th percentile"
    (dict(test='res.percentile("ttft", 99) <= ttft_slo'), "20 req/s, TTFT 0.3 s, TPOT 40 ms",
     "SLO is not met", "p99 TPOT limit is never tested"),
    (dict(test='res.percentile("ttft", 50) <= ttft_slo and '
               'res.percentile("tpot", 50) <= tpot_slo'), "20 req/s, TTFT 0.3 s, TPOT 40 ms",
     "SLO is not met", "not the median"),
    (dict(test='res.mean("ttft") <= ttft_slo and res.mean("tpot") <= tpot_slo'),
     "20 req/s", "SLO is not met", "not the median or the mean"),
])
def test_size_fleet_names_each_slip(capsys, slip, case, found, cause):
    fails(capsys, checks.check_size_fleet, fleet_with(**slip), case, found, cause)


def test_size_fleet_ignoring_that_tp_must_divide_the_heads(capsys):
    # the trial: OPT-13B's 40 heads divide every tp, so no case tested it
    no_test = FLEET.format(**FLEET_RIGHT).replace("        if cfg.heads % tp:\n"
                                                  "            continue\n", "")
    assert no_test != FLEET.format(**FLEET_RIGHT)
    fails(capsys, checks.check_size_fleet, wrong(no_test),
          "GPT-2 large (20 heads), 20 req/s, TPOT 1 ms (impossible) raised ValueError",
          "tp not dividing cfg.heads")


def test_size_fleet_always_the_whole_node(capsys):
    fails(capsys, checks.check_size_fleet, wrong("""
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    return (8, 1) if tpot_slo > 0.01 else None
"""), "uses 8 GPUs")


def test_size_fleet_cannot_shrink_the_load_it_is_judged_on(capsys):
    # issue 43: the check simulated on the very list it handed over, so deleting all but
    # one request passed with one replica
    fails(capsys, checks.check_size_fleet, wrong("""
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    del requests[1:]
    return ok_fleet(cluster, cfg, requests, ttft_slo, tpot_slo)
"""), "the caller's `requests` list was changed")
    # the load made ten times lighter in place: judged on the check's own copy all the same
    fails(capsys, checks.check_size_fleet, wrong("""
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    for r in requests:
        r.arrival *= 10
    return ok_fleet(cluster, cfg, requests, ttft_slo, tpot_slo)
"""), "SLO is not met")


def test_size_fleet_cannot_change_the_expected_answer(capsys, monkeypatch):
    # the reference's answers are computed before the learner's code runs
    monkeypatch.setattr(R, "size_fleet", R.size_fleet)      # put back after the test
    fails(capsys, checks.check_size_fleet, wrong("""
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    import workbook.lesson12_serving._reference as ref
    ref.size_fleet = lambda *args: (8, 1)
    return (8, 1) if tpot_slo > 0.01 else None
"""), "uses 8 GPUs")


def test_size_fleet_never_none_and_a_raise(capsys):
    fails(capsys, checks.check_size_fleet, wrong("""
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    return ok_fleet(cluster, cfg, requests, ttft_slo, tpot_slo) or (8, 1)
"""), "no layout of the node meets this SLO")
    fails(capsys, checks.check_size_fleet, wrong("""
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    return serving.Deployment(cluster, cfg, tp=3)
"""), "raised ValueError")


@pytest.mark.parametrize("returned, shown", [
    ("list(ok_fleet(cluster, cfg, requests, ttft_slo, tpot_slo) or [1, 1])",
     "a list, not a tuple (replicas, tp)"),
    ("(2.0, 1)", "not (replicas, tp)"),
])
def test_size_fleet_wrong_shapes(capsys, returned, shown):
    fails(capsys, checks.check_size_fleet, wrong(f"""
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    return {returned}
"""), shown)


def test_size_fleet_returning_an_object_whose_len_loops(capsys, short_timeout):
    fails(capsys, checks.check_size_fleet, wrong(HOSTILE + """
class Layout(tuple):
    def __len__(self):
        while True:
            pass


def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    return Layout((1, 1))
"""), "still running after 2 s")


# ------------------------------------------------------------ exercise 5
KPA = """
def kpa_desired(stable, panic, ready, panicking_since, now, target):
    {first}
    {second}
    if panicking_since is not None:
        want = {panic_want}
    else:
        want = math.ceil(stable / target)
    return {floor}, panicking_since
"""
KPA_RIGHT = dict(
    first="if panic / ready >= 2 * target:\n        panicking_since = now",
    second="elif panicking_since is not None and now >= panicking_since + 60.0:\n"
           "        panicking_since = None",
    panic_want="max(math.ceil(panic / target), ready)", floor="max(1, want)")


def kpa_with(**slip):
    return wrong(KPA.format(**{**KPA_RIGHT, **slip}))


def test_kpa_reference_passes_and_agrees_with_serving(capsys):
    result, _ = line(capsys, checks.check_kpa_desired, MINE["kpa_desired"])
    assert result
    result, _ = line(capsys, checks.check_kpa_desired, kpa_with())      # the template
    assert result
    for _, (stable, panic, ready, since, now, target) in KPA_CASES:
        kpa = serving.Autoscaler(target=target, utilization=1.0, max_scale_down_rate=1e9)
        want, since_after = kpa.desired(stable, panic, ready, since, now)
        assert R.kpa_desired(stable, panic, ready, since, now, target) == (
            max(1, want), since_after)


def test_kpa_refuses_the_library(capsys):
    fails(capsys, checks.check_kpa_desired, wrong("""
def kpa_desired(stable, panic, ready, panicking_since, now, target):
    return serving.Autoscaler(target=target).desired(stable, panic, ready, panicking_since, now)
"""), "uses serving.Autoscaler")


@pytest.mark.parametrize("slip, case, cause", [
    (dict(panic_want="math.ceil(panic / target)"), "in panic the load fell",
     "never scales down"),
    # issue 42: the 60 s exit tested before the threshold passed
    (dict(first="if panicking_since is not None and now >= panicking_since + 60.0:\n"
                "        panicking_since = None",
          second="elif panic / ready >= 2 * target:\n        panicking_since = now"),
     "over the threshold a stable window after the last crossing", "test the threshold first"),
    # a missing `/ ready` was told about panicking_since
    (dict(first="if panic >= 2 * target:\n        panicking_since = now"),
     "stable, 25 in flight, target 10", "per ready replica"),
    (dict(first="if panic / ready > 2 * target:\n        panicking_since = now"),
     "panic window asks for 2x the ready replicas", "equal included"),
    (dict(second="elif panicking_since is not None and now > panicking_since + 60.0:\n"
                 "        panicking_since = None"),
     "a stable window after the last panic", "now included"),
    (dict(floor="want"), "no load at all", "never fewer than one replica"),
])
def test_kpa_names_each_slip(capsys, slip, case, cause):
    fails(capsys, checks.check_kpa_desired, kpa_with(**slip), case, cause)


@pytest.mark.parametrize("returned, shown", [
    ("[1, None]", "a list, not a tuple (replicas, panicking_since)"),
    ("(1.0, None)", "not (replicas, panicking_since)"),
    ('(1, "never")', "not (replicas, panicking_since)"),
])
def test_kpa_wrong_shapes(capsys, returned, shown):
    fails(capsys, checks.check_kpa_desired, wrong(f"""
def kpa_desired(stable, panic, ready, panicking_since, now, target):
    return {returned}
"""), shown)


def test_kpa_panic_that_never_ends_and_one_that_loops(capsys, short_timeout):
    fails(capsys, checks.check_kpa_desired, wrong("""
def kpa_desired(stable, panic, ready, panicking_since, now, target):
    if panic / ready >= 2 * target:
        panicking_since = now
    if panicking_since is not None:
        return max(math.ceil(panic / target), ready, 1), panicking_since
    return max(1, math.ceil(stable / target)), None
"""), "a stable window after the last panic")
    fails(capsys, checks.check_kpa_desired, wrong("""
def kpa_desired(stable, panic, ready, panicking_since, now, target):
    while stable > 0:
        ready += 0
    return 1, None
"""), "still running after 2 s")


def test_kpa_returning_a_time_whose_eq_raises(capsys):
    fails(capsys, checks.check_kpa_desired, wrong(HOSTILE + """
def kpa_desired(stable, panic, ready, panicking_since, now, target):
    return 1, Raising(now)
"""), "stable, 25 in flight, target 10, kpa_desired(25, 25, 2, None, 0.0, 10) raised "
          "RuntimeError")


def test_the_lab_gives_nudges_and_progressive_hints():
    # each NotImplementedError of labs/12 is a nudge naming its checks.hint(...), whose
    # steps never hold the key line of code
    from test_hints import (
        test_every_unwritten_exercise_is_a_nudge_pointing_to_its_progressive_hints as nudges)
    nudges("labs/12_serving.ipynb", "workbook.lesson12_serving")
    for steps in checks.hint.steps.values():
        for code in ("math.floor(", "percentile(", "while ", "+= 1", ".pop()", " = now"):
            assert all(code not in step for step in steps), code
