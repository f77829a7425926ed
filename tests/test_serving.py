"""simcluster.serving: its costs against DistServe's measured fits, its queueing engine
against M/D/1 and Little's law, the KV cache, continuous batching, the autoscaler, and a
decode step executed on the simulated cluster (the numbers: docs/reference-numbers.md,
"Serving")."""

import math
import random

import pytest

import simcluster as sc
from simcluster import planner, serving
from workbook.lesson12_serving import demos

OPT_13B = demos.opt_13b()


@pytest.fixture(scope="module")
def a100():
    return sc.Cluster.preset("dgx-a100")


# ------------------------------------------------------------------ costs
def test_kv_bytes_per_token():
    assert serving.kv_bytes_per_token(OPT_13B) == 2 * 40 * 40 * 128 * 2 == 819_200
    llama70 = planner.TransformerConfig(layers=80, hidden=8192, heads=64, kv_heads=8,
                                        seq_len=4096, vocab=32000, swiglu=True)
    assert serving.kv_bytes_per_token(llama70, dtype="bf16") == 2 * 80 * 8 * 128 * 2
    assert serving.kv_bytes_per_token(llama70, dtype="fp32", tp=8) == 2 * 80 * 1 * 128 * 4
    with pytest.raises(ValueError, match="kv_heads=8 is not divisible by tp=16"):
        serving.kv_bytes_per_token(llama70, tp=16)


def test_distserve_opt13b_prefill_fit_within_25_percent(a100):
    # DistServe's profile of OPT-13B on one A100-80GB (simdistserve/estimators/
    # profile_data/profiler-a100-80g.distserve.json): prefill ms = 18.10 + 0.1019 L
    # + 7.12e-6 L^2
    for tokens in (512, 1024):
        fit = (18.10 + 0.1019 * tokens + 7.12e-6 * tokens ** 2) / 1e3
        predicted = serving.prefill_time(OPT_13B, a100, tokens=tokens)
        assert abs(predicted / fit - 1) <= 0.25, (tokens, predicted, fit)


def test_distserve_opt13b_decode_fit_within_25_percent(a100):
    predicted = serving.decode_time(OPT_13B, a100, batch=1, context=512)
    assert abs(predicted / 0.020 - 1) <= 0.25, predicted


def test_decode_is_memory_bound_and_prefill_compute_bound(a100):
    weights = serving.weight_bytes(OPT_13B)
    hbm = a100.spec.device_of(0).hbm_bandwidth
    one = serving.decode_time(OPT_13B, a100, batch=1, context=512)
    # batch 1 reads every weight once: at least 2N bytes over HBM, and not much more
    assert weights / hbm < one < 1.5 * weights / hbm
    # 8 sequences cost little more than one (the same weights read once)...
    assert serving.decode_time(OPT_13B, a100, batch=8, context=512) < 1.2 * one
    # ... while a prefill's time grows with its tokens (FLOPs)
    assert serving.prefill_time(OPT_13B, a100, 2048) > 3.5 * serving.prefill_time(
        OPT_13B, a100, 512)


def test_kv_capacity_against_distserve(a100):
    # DistServe reports 66,144 tokens of KV cache for OPT-13B on one A100-80GB
    dep = serving.Deployment(a100, OPT_13B)
    assert abs(dep.kv_cache_tokens / 66_144 - 1) <= 0.10, dep.kv_cache_tokens
    assert dep.kv_cache_tokens % dep.block_size == 0
    # with tp = 2 each GPU holds half the weights and half of each token's KV
    assert serving.Deployment(a100, OPT_13B, tp=2).kv_cache_tokens > 2 * dep.kv_cache_tokens


@pytest.mark.parametrize("tp,batch,context", [(2, 1, 512), (4, 32, 1024)])
def test_decode_time_agrees_with_the_executing_simulator(a100, tp, batch, context):
    # a fake-tensor decode step of OPT-13B's layers with DTensor tensor parallelism,
    # run by cluster.run; decode_time at the device's peaks, as the simulator charges
    cfg = demos.opt_13b(layers=4)
    measured = demos.measure_decode(a100, cfg, batch, context, tp)
    predicted = serving.decode_time(cfg, a100, batch, context, tp=tp,
                                    efficiency=planner.ROOFLINE)
    assert abs(measured / predicted - 1) <= 0.15, (measured, predicted)


def test_cnn_forward_is_a_roofline(a100):
    one = serving.batch_time(serving.RESNET50, a100, 1)
    big = serving.batch_time(serving.RESNET50, a100, 32)
    assert big < 32 * one                         # the weights are read once per batch
    with pytest.raises(ValueError, match="continuous batching needs a transformer"):
        serving.Deployment(a100, serving.RESNET50, batching="continuous")


# ------------------------------------------------------------------ queueing
@pytest.mark.parametrize("rho", [0.3, 0.5, 0.7])
def test_md1_and_distserve_ttft_within_5_percent(a100, rho):
    # one request at a time, one output token: service is the prefill, deterministic
    d = serving.prefill_time(OPT_13B, a100, 512)
    rate = rho / d
    requests = serving.poisson(rate=rate, n=20_000, output_tokens=1, seed=3)
    res = serving.simulate(requests, serving.Deployment(a100, OPT_13B, batching="none"))
    wait = rho / (2 / d * (1 - rho))                       # M/D/1: rho / (2 mu (1 - rho))
    assert abs((res.mean("ttft") - d) / wait - 1) <= 0.05
    distserve = d + rate * d ** 2 / (2 * (1 - rate * d))   # DistServe section 3.1
    assert abs(res.mean("ttft") / distserve - 1) <= 0.05


def test_littles_law(a100):
    requests = serving.poisson(rate=6.0, n=3000, output_tokens=[16, 64, 256], seed=1)
    res = serving.simulate(requests, serving.Deployment(a100, OPT_13B, replicas=2))
    start, end = requests[0].arrival, max(res.finish)
    grid = [start + (end - start) * i / 20_000 for i in range(20_000)]
    in_system = sum(res.in_system(grid)) / len(grid)          # L, sampled
    assert in_system == pytest.approx(res.throughput * res.mean("latency"), rel=0.03)


def test_batching_none_dynamic_continuous(a100):
    requests = serving.poisson(rate=3.0, n=400, output_tokens=[16, 64, 128], seed=2)
    results = {b: serving.simulate(requests, serving.Deployment(a100, OPT_13B, batching=b))
               for b in serving.BATCHING}
    # one at a time cannot keep up at 3 requests/s (each takes ~0.1 + 64 x 17 ms)
    assert results["none"].mean("ttft") > 10 * results["continuous"].mean("ttft")
    # a static batch holds finished sequences' slots: continuous batching finishes faster
    assert results["continuous"].mean("latency") < results["dynamic"].mean("latency")
    for res in results.values():
        assert all(t > 0 for t in res.ttft) and all(lat >= t for lat, t in
                                                   zip(res.latency, res.ttft))


def test_dynamic_batching_waits_at_most_the_queue_delay(a100):
    requests = [serving.Request(0.0, 128, 1), serving.Request(0.001, 128, 1),
                serving.Request(5.0, 128, 1)]
    dep = serving.Deployment(a100, OPT_13B, batching="dynamic", max_batch=4,
                             max_queue_delay=0.010)
    res = serving.simulate(requests, dep)
    batches = [b for b in res.timeline() if b.kind == "prefill"]
    assert [(b.start, b.size) for b in batches] == [(0.010, 2), (5.010, 1)]


def test_max_num_seqs_and_kv_cache_are_respected(a100):
    requests = serving.poisson(rate=50.0, n=600, prompt_tokens=[256, 1024],
                               output_tokens=[64, 512], seed=4)
    dep = serving.Deployment(a100, OPT_13B, max_num_seqs=64)
    res = serving.simulate(requests, dep)
    assert max(b.size for b in res.timeline() if b.kind == "decode") <= 64
    assert max(u for _, _, u in res.kv_cache_usage) <= 1.0
    assert all(math.isfinite(x) for x in res.latency)


def test_continuous_batching_preempts_when_the_cache_is_full(a100):
    # long outputs on a small cache: sequences admitted together outgrow it
    requests = serving.poisson(rate=50.0, n=300, prompt_tokens=512, output_tokens=1500,
                               seed=5)
    dep = serving.Deployment(a100, OPT_13B, gpu_memory_utilization=0.5)
    res = serving.simulate(requests, dep)
    assert res.preemptions > 0
    assert max(u for _, _, u in res.kv_cache_usage) > 0.9
    # every request still gets all its tokens, each no faster than a decode step allows
    fastest = serving.decode_time(OPT_13B, a100, 1, 512)
    assert all(t >= fastest for t in res.tpot)


def test_block_count_in_closed_form(a100):
    dep = serving.Deployment(a100, OPT_13B)
    replica = serving._Replica(0, dep, serving._Sim(1))
    rng = random.Random(0)
    seqs = []
    for i in range(40):
        s = serving._Seq(i, serving.Request(0.0, 1, 2))
        s.base = rng.randrange(1, 3000)
        replica._add(s)
        seqs.append(s)
    for step in range(0, 70):
        brute = sum(-(-(s.base + step) // dep.block_size) for s in seqs)
        assert replica._used(step) == brute


def test_least_outstanding_beats_round_robin_with_uneven_requests(a100):
    # one request at a time per replica: round robin queues short requests behind long
    # ones, least-outstanding sends them to an idle replica
    requests = serving.poisson(rate=2.5, n=1000, output_tokens=[8, 8, 8, 200], seed=6)
    lat = {lb: serving.simulate(requests, serving.Deployment(
        a100, OPT_13B, replicas=4, batching="none", load_balancer=lb)).mean("latency")
        for lb in serving.LOAD_BALANCERS}
    assert lat["least_outstanding"] < 0.8 * lat["round_robin"], lat


# ------------------------------------------------------------------ autoscaling
def test_kpa_rules():
    kpa = serving.Autoscaler(target=10, utilization=1.0)
    # stable mode: ceil(average / target)
    assert kpa.desired(25, 25, 2, None, 0.0) == (3, None)
    # panic: the 6 s window asks for 2x the ready replicas -> follow it at once
    assert kpa.desired(12, 40, 2, None, 10.0) == (4, 10.0)
    # in panic it never scales down, even when the panic window calms
    assert kpa.desired(5, 5, 4, 10.0, 30.0) == (4, 10.0)
    # a stable window (60 s) after the last panic it follows the stable window again
    assert kpa.desired(5, 5, 4, 10.0, 70.0) == (2, None)   # at most halved per decision
    assert kpa.desired(5, 5, 2, None, 72.0) == (1, None)
    with pytest.raises(ValueError, match="target"):
        serving.Autoscaler(target=0)


def test_autoscaler_scales_up_after_a_burst_and_down_after(a100):
    trace = serving.piecewise_poisson([(120, 1.0), (60, 30.0), (240, 1.0)],
                                      output_tokens=128, seed=7)
    auto = serving.Autoscaler(target=8, startup=10.0)
    dep = serving.Deployment(a100, OPT_13B, autoscaler=auto,
                             load_balancer="least_outstanding")
    res = serving.simulate(trace, dep)
    times = [t for t, _ in res.replicas]
    counts = [n for _, n in res.replicas]
    assert max(counts) >= 3 and counts[-1] < max(counts)
    first_up = next(t for t, n in res.replicas if n > 1)
    # no replica serves before the burst (120 s) plus a cold start
    assert first_up >= 120 + dep.cold_start()
    assert max(counts) <= dep.max_replicas and times == sorted(times)


# ------------------------------------------------------------------ the rest
def test_deterministic(a100):
    def once():
        requests = serving.poisson(rate=7.0, n=500, output_tokens=[4, 64, 300], seed=11)
        dep = serving.Deployment(a100, OPT_13B, replicas=2, load_balancer="least_outstanding",
                                 autoscaler=serving.Autoscaler(target=5))
        res = serving.simulate(requests, dep)
        return res.ttft, res.latency, res.replicas, res.preemptions
    assert once() == once()


def test_bad_input_is_named(a100):
    with pytest.raises(ValueError, match="batching must be one of"):
        serving.Deployment(a100, OPT_13B, batching="smart")
    with pytest.raises(ValueError, match="more than the 8 GPUs of a node"):
        small = planner.TransformerConfig(layers=2, hidden=1024, heads=16, seq_len=128,
                                          vocab=1024)
        serving.Deployment(sc.Cluster.preset("dgx-a100", nodes=2), small, tp=16)
    with pytest.raises(ValueError, match="9 replicas x tp=1"):
        serving.Deployment(a100, OPT_13B, replicas=9)
    big = planner.TransformerConfig(layers=96, hidden=12288, heads=96, seq_len=2048,
                                    vocab=51200)
    with pytest.raises(ValueError, match="leave no room for a KV cache"):
        serving.Deployment(a100, big)
    with pytest.raises(ValueError, match="sorted by arrival"):
        serving.simulate([serving.Request(1.0), serving.Request(0.5)],
                         serving.Deployment(a100, OPT_13B))
    with pytest.raises(ValueError, match="more than a replica's"):
        serving.simulate([serving.Request(0.0, 4000, 70_000)],
                         serving.Deployment(a100, OPT_13B, max_num_batched_tokens=100_000))
    with pytest.raises(ValueError, match="rate must be a positive number"):
        serving.poisson(rate=0, n=3)


# ------------------------------------------------------------------ under attack
def test_admission_keeps_vllms_free_block_watermark(a100):
    # 399 blocks, a 1 % watermark of 3: the second prompt would leave 1 block free, so
    # it waits until the first request is done; without the watermark both would start
    dep = serving.Deployment(a100, OPT_13B, gpu_memory_utilization=0.37)
    blocks = dep.kv_cache_tokens // dep.block_size
    assert (blocks, int(serving.WATERMARK * blocks)) == (399, 3)
    requests = [serving.Request(0.0, 200 * 16, 2), serving.Request(0.0, 198 * 16, 2)]
    res = serving.simulate(requests, dep)
    assert res.ttft[1] > res.latency[0] > res.ttft[0]
    assert [b.size for b in res.timeline() if b.kind == "prefill"] == [1, 1]


def test_littles_law_column_uses_the_measured_throughput(a100):
    # past saturation (one request at a time at 2 req/s) the offered rate is not the
    # throughput: only throughput x mean latency is the time-average in the system
    sweep = demos.load_sweep(a100, OPT_13B, [0.5, 2.0], "none", n=150)
    for rate, row in sweep.items():
        assert row["in_system"] == pytest.approx(row["little"], rel=0.03), rate
    saturated = sweep[2.0]
    mean_latency = saturated["little"] / saturated["throughput"]
    assert saturated["throughput"] < 0.5 * 2.0
    assert 2.0 * mean_latency > 1.5 * saturated["in_system"]   # the offered rate: wrong


def test_a_prefilled_sequence_too_long_to_recompute_is_refused_up_front(a100):
    # preempted, it would have to be prefilled again in one iteration of at most
    # max_num_batched_tokens tokens: vLLM V0 ignores such a prompt; we refuse it
    dep = serving.Deployment(a100, OPT_13B, max_num_batched_tokens=2048,
                             gpu_memory_utilization=0.4)
    requests = [serving.Request(0.01 * i, 1800, 600, prefilled=True) for i in range(40)]
    with pytest.raises(ValueError, match="prefilled or not"):
        serving.simulate(requests, dep)


def test_scaling_up_while_drained_replicas_still_decode(a100):
    # the fleet shrinks while the replicas it drains still decode 4,000-token answers,
    # then a second burst wants all 8 GPUs back: the new ones wait for free GPUs
    trace = serving.piecewise_poisson([(10, 20.0), (100, 0.3), (20, 30.0), (60, 0.3)],
                                      prompt_tokens=64, output_tokens=[4] * 5 + [4000],
                                      seed=0)
    auto = serving.Autoscaler(target=2, utilization=1.0, stable_window=20, panic_window=4)
    dep = serving.Deployment(a100, OPT_13B, autoscaler=auto, max_num_batched_tokens=4096,
                             load_balancer="least_outstanding")
    res = serving.simulate(trace, dep)
    assert all(math.isfinite(x) for x in res.latency)
    assert max(n for _, n in res.replicas) == dep.max_replicas == 8


def test_idle_time_costs_no_cpu_and_changes_nothing(a100):
    import time
    auto = serving.Autoscaler(target=5, startup=10.0)
    dep = serving.Deployment(a100, OPT_13B, autoscaler=auto, load_balancer="least_outstanding")
    began = time.process_time()
    res = serving.simulate([serving.Request(0.0), serving.Request(1e6)], dep)
    assert time.process_time() - began < 1.0          # 6.4 CPU s when every second was sampled
    assert res.ttft[0] == pytest.approx(res.ttft[1])
    # a burst, a long quiet stretch, the same burst again: moved by a whole number of
    # ticks, the second burst is served exactly as before
    burst = serving.piecewise_poisson([(20, 25.0)], output_tokens=[16, 64], seed=3)

    def twice(gap):
        late = [serving.Request(r.arrival + gap, r.prompt_tokens, r.output_tokens)
                for r in burst]
        res = serving.simulate(burst + late, dep)
        return res.ttft[len(burst):], [(t - gap, n) for t, n in res.replicas if t >= gap]
    near, far = twice(1000.0), twice(100_000.0)
    assert near[0] == pytest.approx(far[0], abs=1e-6) and len(near[1]) == len(far[1])
    assert all(a == pytest.approx(b, abs=1e-6) for a, b in zip(near[1], far[1]))


def test_prefilled_requests_are_not_prefilled_again_by_static_batching(a100):
    # a prefilled request's KV cache came from a prefill instance: no prefill charged
    for batching in serving.BATCHING:
        res = serving.simulate([serving.Request(0.0, 512, 4, prefilled=True)],
                               serving.Deployment(a100, OPT_13B, batching=batching))
        assert res.ttft[0] == 0.0, batching
        assert res.latency[0] < serving.prefill_time(OPT_13B, a100, 512), batching
        assert not [b for b in res.timeline() if b.kind == "prefill"], batching


def test_hostile_configurations_are_refused(a100):
    with pytest.raises(ValueError, match="Model.flops must be positive"):
        serving.Model("nothing", 0, 0, 0)
    for startup in (math.nan, math.inf, -1.0, True):
        with pytest.raises(ValueError, match="Autoscaler.startup"):
            serving.Autoscaler(startup=startup)
    with pytest.raises(ValueError, match="phase 0 seconds"):
        serving.piecewise_poisson([(math.nan, 2.0)])
    with pytest.raises(ValueError, match="phase 0 seconds"):
        serving.piecewise_poisson([(math.nan, 2.0)], n=5)
    with pytest.raises(ValueError, match="give n"):
        serving.piecewise_poisson([(10, 1.0), (math.inf, 2.0)])
    with pytest.raises(ValueError, match="only the last phase"):
        serving.piecewise_poisson([(math.inf, 2.0), (10, 1.0)], n=5)
    # a last phase of inf with n is the same trace as seconds=None
    assert serving.piecewise_poisson([(10, 1.0), (math.inf, 2.0)], n=30) == \
        serving.piecewise_poisson([(10, 1.0), (None, 2.0)], n=30)
