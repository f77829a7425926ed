"""Lab 12's checks (KV cache and batch, dynamic batcher, continuous-batching step, fleet
sizing, KPA rule): each passes the reference answer written as a learner would, refuses
the reference itself, and reports at least three wrong answers — one that raises or
never returns among them — as one ❌ line naming the case and the slip."""

import math

import pytest

from _check_helpers import fails, learner_namespace, line, not_started, write_learner
from simcluster import planner, serving
from workbook import checking
from workbook.lesson12_serving import checks
from workbook.lesson12_serving import _reference as R
from workbook.lesson12_serving.checks import KPA_CASES

MINE = learner_namespace(R, R.max_batch, R.dynamic_batches, R.schedule, R.size_fleet,
                         R.kpa_desired)


@pytest.fixture
def short_timeout(monkeypatch):
    monkeypatch.setattr(checking, "TIMEOUT", 2.0)


# right answers under other names, for wrong answers built on them
OK = dict(MINE, ok_batches=MINE["dynamic_batches"], ok_schedule=MINE["schedule"],
          ok_fleet=MINE["size_fleet"])


def wrong(source):
    """A learner's function written from ``source`` (it sees what the reference sees)."""
    namespace = write_learner(source, OK)
    return namespace[source.split("def ", 1)[1].split("(", 1)[0]]


# ------------------------------------------------------------ exercise 1
def test_max_batch_reference_passes(capsys):
    result, text = line(capsys, checks.check_max_batch, MINE["max_batch"])
    assert result and "grouped-query attention" in text


def test_max_batch_refuses_the_reference_and_the_library(capsys):
    fails(capsys, checks.check_max_batch, R.max_batch, "the workbook's own reference")
    fails(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    return serving.Deployment(None, cfg).kv_cache_tokens // context
"""), "uses serving.kv_bytes_per_token / serving.Deployment")


def test_max_batch_without_the_factor_two(capsys):
    fails(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    kv = cfg.layers * cfg.kv * cfg.head_dim * dtype_bytes
    free = utilization * memory - planner.parameter_count(cfg) * dtype_bytes
    return max(0, math.floor(free / (kv * context)))
"""), "OPT-13B, fp16, 80 GiB, 512 tokens", "the factor 2 is missing")


def test_max_batch_with_heads_instead_of_kv_heads(capsys):
    fails(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    kv = 2 * cfg.layers * cfg.heads * cfg.head_dim * dtype_bytes
    free = utilization * memory - planner.parameter_count(cfg) * dtype_bytes
    return max(0, math.floor(free / (kv * context)))
"""), "LLaMA-2-70B, bf16, 8 x 80 GiB", "kv_heads")


def test_max_batch_negative_when_nothing_fits(capsys):
    fails(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    kv = 2 * cfg.layers * cfg.kv * cfg.head_dim * dtype_bytes
    free = utilization * memory - planner.parameter_count(cfg) * dtype_bytes
    return math.floor(free / (kv * context))
"""), "one 80 GiB GPU", "return 0")


def test_max_batch_a_float_and_a_raise(capsys):
    fails(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    return memory / context
"""), "not an int")
    fails(capsys, checks.check_max_batch, wrong("""
def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    return cfg.kv_heads * 2
"""), "raised TypeError")


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
"""), "Poisson 200/s", "wait up to max_queue_delay")


def test_dynamic_batches_over_the_batch_size(capsys):
    fails(capsys, checks.check_dynamic_batches, wrong("""
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    return ok_batches(arrivals, max_batch + 1, max_queue_delay, service)
"""), "at most max_batch")


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


def test_dynamic_batches_that_never_returns(capsys, short_timeout):
    fails(capsys, checks.check_dynamic_batches, wrong("""
def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    i = 0
    while i < len(arrivals):
        pass
"""), "still running after 2 s", "a loop whose condition never changes")


# ------------------------------------------------------------ exercise 3
def test_schedule_reference_passes(capsys):
    result, text = line(capsys, checks.check_schedule, MINE["schedule"])
    assert result and "308 iterations" in text


def test_schedule_ignoring_the_watermark(capsys):
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return ok_schedule(running, waiting, free_blocks, block_size, max_num_seqs, 0)
"""), "the watermark keeps 2 blocks free", "watermark")


def test_schedule_preempting_the_first(capsys):
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return ok_schedule(running[::-1], waiting, free_blocks, block_size, max_num_seqs,
                      watermark)
"""), "preempt from the end of `running`")


def test_schedule_wrong_shape_and_a_raise(capsys):
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return "decode"
"""), "not (kind, count)")
    fails(capsys, checks.check_schedule, wrong("""
def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    return ("decode", running[0] // 0)
"""), "raised")


# ------------------------------------------------------------ exercise 4
def test_size_fleet_reference_passes(capsys):
    result, _ = line(capsys, checks.check_size_fleet, MINE["size_fleet"])
    assert result


def test_size_fleet_with_the_median(capsys):
    fails(capsys, checks.check_size_fleet, wrong("""
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    for tp in (1, 2, 4, 8):
        for replicas in range(1, 8 // tp + 1):
            res = serving.simulate(requests, serving.Deployment(
                cluster, cfg, replicas=replicas, tp=tp, load_balancer="least_outstanding"))
            if res.percentile("ttft", 50) <= ttft_slo and res.percentile("tpot", 50) <= tpot_slo:
                return replicas, tp
    return None
"""), "the SLO is not met", "99th percentile")


def test_size_fleet_always_the_whole_node(capsys):
    fails(capsys, checks.check_size_fleet, wrong("""
def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
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


# ------------------------------------------------------------ exercise 5
def test_kpa_reference_passes_and_agrees_with_serving(capsys):
    result, _ = line(capsys, checks.check_kpa_desired, MINE["kpa_desired"])
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


def test_kpa_scaling_down_in_panic(capsys):
    fails(capsys, checks.check_kpa_desired, wrong("""
def kpa_desired(stable, panic, ready, panicking_since, now, target):
    if panic / ready >= 2 * target:
        panicking_since = now
    elif panicking_since is not None and now >= panicking_since + 60.0:
        panicking_since = None
    source = panic if panicking_since is not None else stable
    return max(1, math.ceil(source / target)), panicking_since
"""), "in panic the load fell", "never scales down")


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
