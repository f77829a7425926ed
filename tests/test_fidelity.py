"""The simulated hardware behaves like the reference numbers of DESIGN.md §6.

Every expected time here is written out from the published formulas (roofline; Thakur,
Rabenseifner & Gropp 2005 for the collectives; alpha + n·beta for a message) using the
numbers of the preset — never by calling the cost model — so a mistake in
``simcluster/costmodel.py`` shows up as a difference.

Tensors live on the ``meta`` device wherever the data does not matter: a 1 GiB all-reduce
or a 4096³ matmul is charged in full, and nothing is allocated or computed.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc
from simcluster.spec import preset

MiB, GiB = 2**20, 2**30
REL = 1e-9  # the simulator's arithmetic and ours differ only by rounding

A100 = preset("dgx-a100").nodes[0].device
NVLINK = preset("dgx-a100").nodes[0].fabric
IB = preset("dgx-a100", nodes=2).inter_node_link


def _alpha_beta_gamma(link, hbm_bandwidth=A100.hbm_bandwidth, bandwidth_factor=1.0):
    """alpha (s per message), beta (s per byte on the wire), gamma (s per byte reduced)."""
    return (link.latency, 1.0 / (link.bandwidth * link.efficiency * bandwidth_factor),
            1.0 / hbm_bandwidth)


def _thakur_ring_all_reduce(p, n, alpha, beta, gamma):
    """Ring all-reduce: 2(p-1)α + 2(p-1)/p·nβ + (p-1)/p·nγ."""
    return 2 * (p - 1) * alpha + 2 * (p - 1) / p * n * beta + (p - 1) / p * n * gamma


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100")


# ================================================================== compute
def _matmul(m, k, n, dtype):
    a = torch.empty(m, k, dtype=dtype, device="meta")
    b = torch.empty(k, n, dtype=dtype, device="meta")
    out = a @ b
    return out.shape


@pytest.mark.parametrize("dtype, peak_name", [(torch.bfloat16, "bfloat16"),
                                              (torch.float16, "float16"),
                                              (torch.float32, "float32")])
def test_matmul_is_charged_2mnk_over_the_peak_for_its_dtype(node, dtype, peak_name):
    m = k = n = 4096
    run = node.run(_matmul, world_size=1, args=(m, k, n, dtype))
    assert run.results[0] == (m, n)
    clock = run.clock(0)
    flops = 2 * m * n * k
    peak = {"bfloat16": 312e12, "float16": 312e12, "float32": 19.5e12}[peak_name]  # §6
    assert A100.peak_flops[peak_name] == peak
    assert clock.flops == flops
    assert clock.compute == pytest.approx(flops / peak, rel=REL)
    # compute-bound: the bytes alone would take much less
    assert 3 * m * n * dtype.itemsize / A100.hbm_bandwidth < clock.compute / 5
    assert run.elapsed == pytest.approx(flops / peak, rel=REL)


def test_matmul_on_h100_uses_the_h100_peak():
    run = sc.Cluster.preset("dgx-h100").run(_matmul, world_size=1,
                                            args=(4096, 4096, 4096, torch.bfloat16))
    assert run.clock(0).compute == pytest.approx(2 * 4096**3 / 989e12, rel=REL)


def _add(numel):
    a = torch.empty(numel, dtype=torch.float32, device="meta")
    b = torch.empty(numel, dtype=torch.float32, device="meta")
    return (a + b).numel()


def test_large_elementwise_add_is_memory_bound(node):
    numel = GiB // 4  # two 1 GiB fp32 inputs
    run = node.run(_add, world_size=1, args=(numel,))
    seconds = run.clock(0).compute
    moved = 3 * GiB  # read a, read b, write a + b
    assert seconds == pytest.approx(moved / A100.hbm_bandwidth, rel=REL)
    # one FLOP per element at the fp32 peak would be ~100 times faster
    assert seconds > 50 * numel / A100.peak_flops["float32"]


# ============================================================= collectives
def _all_reduce(nbytes, dtype=torch.float32):
    t = torch.empty(nbytes // dtype.itemsize, dtype=dtype, device="meta")
    dist.all_reduce(t)


def _collective_seconds(run):
    """(seconds, algorithm) of the run's only collective."""
    (record,) = run.collectives
    assert record.op == "all_reduce" and len(record.ranks) == run.world_size
    return record.duration, record.algorithm


def test_ring_all_reduce_on_one_dgx_a100_node_matches_thakur(node):
    n, p = 256 * MiB, 8
    run = node.run(_all_reduce, world_size=p, args=(n,), algorithms={"all_reduce": "ring"})
    seconds, algorithm = _collective_seconds(run)
    assert algorithm == "ring"
    want = _thakur_ring_all_reduce(p, n, *_alpha_beta_gamma(NVLINK))
    assert seconds == pytest.approx(want, rel=REL)
    assert run.elapsed == pytest.approx(want, rel=REL)  # nothing else happened
    for r in range(p):
        assert run.clock(r).comm == pytest.approx(want, rel=REL)


def test_all_reduce_bus_bandwidth_on_8_a100_is_near_nccl(node):
    """nccl-tests on 8 x A100 (NVSwitch) report an all-reduce bus bandwidth near 235 GB/s."""
    n, p = GiB, 8
    run = node.run(_all_reduce, world_size=p, args=(n,))
    seconds, algorithm = _collective_seconds(run)
    # the default is the fastest of NCCL's algorithms (ring, tree; hierarchical only across
    # nodes): at 1 GiB that is the ring. (Halving-doubling would be 2(p-1-lg p)α faster, but
    # NCCL has none, so the default no longer picks it.)
    assert algorithm == "ring"
    assert seconds == pytest.approx(_thakur_ring_all_reduce(p, n, *_alpha_beta_gamma(NVLINK)),
                                    rel=REL)
    bus_bandwidth = 2 * (p - 1) / p * n / seconds
    assert bus_bandwidth == pytest.approx(235e9, rel=0.15), f"{bus_bandwidth / 1e9:.1f} GB/s"
    # and no algorithm is allowed to beat the wire: bus bandwidth <= NVLink's effective rate
    assert bus_bandwidth <= NVLINK.bandwidth * NVLINK.efficiency


def _hierarchical_all_reduce(nodes, g, n):
    """Ring reduce-scatter in each node, ring all-reduce of n/g bytes across the nodes (each
    local rank on its own NIC), ring all-gather in each node."""
    a, b, c = _alpha_beta_gamma(NVLINK)
    ai, bi, ci = _alpha_beta_gamma(IB)
    f = (g - 1) / g
    reduce_scatter = (g - 1) * a + f * n * (b + c)
    all_gather = (g - 1) * a + f * n * b
    across = _thakur_ring_all_reduce(nodes, n / g, ai, bi, ci)
    return reduce_scatter + across + all_gather


def _times_by_algorithm(cluster, p, n, algorithms=("ring", "tree", "halving_doubling",
                                                   "hierarchical")):
    out = {}
    for algorithm in algorithms:
        run = cluster.run(_all_reduce, world_size=p, args=(n,),
                          algorithms={"all_reduce": algorithm})
        out[algorithm] = _collective_seconds(run)[0]
    default = cluster.run(_all_reduce, world_size=p, args=(n,))
    return out, _collective_seconds(default)


@pytest.mark.parametrize("nodes", [2, 4])
def test_hierarchical_beats_a_flat_ring_across_nodes_for_large_messages(nodes):
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    p, n = 8 * nodes, GiB
    times, (default_seconds, default_algorithm) = _times_by_algorithm(
        cluster, p, n, ("ring", "hierarchical"))
    # the flat ring crosses the network on every step: Thakur with InfiniBand numbers
    assert times["ring"] == pytest.approx(_thakur_ring_all_reduce(p, n, *_alpha_beta_gamma(IB)),
                                          rel=REL)
    assert times["hierarchical"] == pytest.approx(_hierarchical_all_reduce(nodes, 8, n),
                                                  rel=REL)
    assert times["hierarchical"] < times["ring"] / 3
    assert default_algorithm == "hierarchical"
    assert default_seconds == pytest.approx(times["hierarchical"], rel=REL)


@pytest.mark.parametrize("nodes", [2, 4])
def test_tiny_all_reduce_across_nodes_avoids_the_flat_ring(nodes):
    """A 1 KiB all-reduce is all latency: a flat ring pays 2(p-1) network hops, tree and
    halving-doubling 2·lg p, hierarchical mostly cheap NVLink hops. The default choice is
    one of the latency-friendly ones, and the fastest of NCCL's: halving-doubling may be
    faster still (at 4 nodes it is), but NCCL has none, so the default leaves it out."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    p, n = 8 * nodes, 1024
    times, (default_seconds, default_algorithm) = _times_by_algorithm(cluster, p, n)
    assert max(times, key=times.get) == "ring"
    assert times["ring"] > 2.5 * min(times.values())
    assert times["ring"] > 2 * (p - 1) * IB.latency
    assert default_algorithm not in ("ring", "halving_doubling")
    nccl = {a: t for a, t in times.items() if a != "halving_doubling"}
    assert default_seconds == pytest.approx(min(nccl.values()), rel=REL)


def test_tree_beats_ring_for_small_messages_at_64_ranks():
    cluster = sc.Cluster.preset("dgx-a100", nodes=8)
    times, _ = _times_by_algorithm(cluster, 64, 4096, ("ring", "tree"))
    assert times["tree"] < times["ring"] / 5
    # tree: 2·lg p steps of (alpha + n·beta) over the network, plus lg p reductions
    a, b, c = _alpha_beta_gamma(IB)
    assert times["tree"] == pytest.approx(2 * 6 * (a + 4096 * b) + 6 * 4096 * c, rel=REL)


def test_ring_wins_over_tree_for_large_messages_in_one_node(node):
    times, _ = _times_by_algorithm(node, 8, 256 * MiB, ("ring", "tree"))
    assert times["ring"] < times["tree"]


# ======================================== the default is NCCL's; halving-doubling is forced
def _collective(op, nbytes):
    """One ``op`` of ``nbytes`` (the full buffer, as nccl-tests counts it) in float32."""
    p = dist.get_world_size()
    full = torch.empty(nbytes // 4, device="meta")
    shard = torch.empty(nbytes // 4 // p, device="meta")
    if op == "all_reduce":
        dist.all_reduce(full)
    elif op == "all_gather":
        dist.all_gather(list(full.chunk(p)), shard)
    else:
        dist.reduce_scatter(shard, list(full.chunk(p)))


def _sweep(sizes):
    for op in ("all_reduce", "reduce_scatter", "all_gather"):
        for nbytes in sizes:
            _collective(op, nbytes)


@pytest.mark.parametrize("nodes", [1, 2])
def test_the_default_never_picks_halving_doubling(nodes):
    """NCCL has no halving-doubling: its tuner picks among ring and tree (and schemes that
    use every NIC across nodes), so the default does too, whatever the size or group."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    world = 8 * nodes
    sizes = [2**k * 1024 for k in range(0, 21, 2)]  # 1 KiB .. 1 GiB, all divisible by world
    run = cluster.run(_sweep, world_size=world, args=(sizes,))
    used = {(c.op, c.algorithm) for c in run.collectives}
    assert len(run.collectives) == 3 * len(sizes)
    assert {a for _, a in used} <= {"ring", "tree", "hierarchical"}, used
    # and every group the cost model may see, straight from it: 2 .. all ranks, every size
    cost = sc.costmodel.CostModel(cluster.spec)
    for p in range(2, world + 1):
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            for nbytes in sizes:
                _, algorithm = cost.collective_time(op, list(range(p)), nbytes)
                assert algorithm != "halving_doubling", (p, op, nbytes)


def test_the_default_on_one_node_is_tree_for_small_and_ring_for_large_all_reduces(node):
    small, large = (_collective_seconds(node.run(_all_reduce, world_size=8, args=(n,)))
                    for n in (64 * 1024, 256 * MiB))
    a, b, c = _alpha_beta_gamma(NVLINK)
    assert small == (pytest.approx(2 * 3 * (a + 65536 * b) + 3 * 65536 * c, rel=REL), "tree")
    assert large == (pytest.approx(_thakur_ring_all_reduce(8, 256 * MiB, a, b, c), rel=REL),
                     "ring")


def _halving_doubling(p, n, link, family="all_reduce"):
    """Thakur, Rabenseifner & Gropp (2005) on p ranks: halving-doubling runs on the largest
    power of two p' <= p; the r = p - p' extra ranks first hand a partner their buffer (all
    of it to be reduced, or their n/p shard for all-gather) and get their result back (all
    of it, or their n/p shard for reduce-scatter): one step each way."""
    a, b, c = _alpha_beta_gamma(link)
    pp = {6: 4, 8: 8}[p]
    lg, f = {4: 2, 8: 3}[pp], (pp - 1) / pp
    extra = p > pp
    if family == "all_reduce":
        return extra * (2 * a + 2 * n * b + n * c) + 2 * lg * a + 2 * f * n * b + f * n * c
    if family == "reduce_scatter":
        return extra * (2 * a + n * b + n * c + n / p * b) + lg * a + f * n * (b + c)
    return extra * (2 * a + n / p * b + n * b) + lg * a + f * n * b  # all_gather


@pytest.mark.parametrize("p", [6, 8])
@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
def test_forced_halving_doubling_matches_thakur_also_off_powers_of_two(node, op, p):
    n = 48 * MiB  # divisible by 6 and 8 ranks
    run = node.run(_collective, world_size=p, args=(op, n), algorithms={op: "halving_doubling"})
    (c,) = run.collectives
    assert c.algorithm == "halving_doubling" and c.nbytes == n and len(c.ranks) == p
    assert c.duration == pytest.approx(_halving_doubling(p, n, NVLINK, op), rel=REL)


def test_halving_doubling_on_8_ranks_is_rabenseifner():
    """The power-of-two formula, written out: 2·lg p·α + 2(p-1)/p·nβ + (p-1)/p·nγ."""
    n, p = GiB, 8
    a, b, c = _alpha_beta_gamma(NVLINK)
    rabenseifner = 2 * 3 * a + 2 * 7 / 8 * n * b + 7 / 8 * n * c
    assert _halving_doubling(p, n, NVLINK) == rabenseifner
    run = sc.Cluster.preset("dgx-a100").run(_all_reduce, world_size=p, args=(n,),
                                            algorithms={"all_reduce": "halving_doubling"})
    assert _collective_seconds(run) == (pytest.approx(rabenseifner, rel=REL), "halving_doubling")


def test_halving_doubling_on_6_ranks_by_hand(node):
    """p = 6: p' = 4, r = 2. Ranks 4 and 5 send n to a partner and get n back; ranks 0-3 run
    two steps each way. The traffic matrix shows exactly that."""
    n, p = 48 * MiB, 6
    a, b, c = _alpha_beta_gamma(NVLINK)
    by_hand = (2 * a + 2 * n * b + n * c) + 2 * 2 * a + 2 * 3 / 4 * n * b + 3 / 4 * n * c
    run = node.run(_all_reduce, world_size=p, args=(n,),
                   algorithms={"all_reduce": "halving_doubling"})
    assert _collective_seconds(run) == (pytest.approx(by_hand, rel=REL), "halving_doubling")
    # slower than the ring on 6 ranks, and slower than itself on 8: the extra step is whole-n
    ring = _thakur_ring_all_reduce(p, n, a, b, c)
    assert by_hand > ring
    assert by_hand > _halving_doubling(8, n, NVLINK)
    sent = {}
    for (src, dst), nbytes in run.recorder.traffic.items():
        sent[src] = sent.get(src, 0) + nbytes
    assert {(4, 0), (0, 4), (5, 1), (1, 5)} <= set(run.recorder.traffic)
    assert run.recorder.traffic[(4, 0)] == run.recorder.traffic[(0, 4)] == n
    assert sent == {0: pytest.approx(2.5 * n), 1: pytest.approx(2.5 * n),
                    2: pytest.approx(1.5 * n), 3: pytest.approx(1.5 * n), 4: n, 5: n}


# ================================================== links, messages, faults
def test_degraded_network_doubles_the_inter_node_ring_bandwidth_term():
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    p, n = 16, 256 * MiB
    kw = dict(world_size=p, args=(n,), algorithms={"all_reduce": "ring"})
    healthy = _collective_seconds(cluster.run(_all_reduce, **kw))[0]
    degraded = _collective_seconds(cluster.run(_all_reduce, link_factor={"network": 0.5},
                                               **kw))[0]
    _, beta, _ = _alpha_beta_gamma(IB)
    bandwidth_term = 2 * (p - 1) / p * n * beta
    assert degraded - healthy == pytest.approx(bandwidth_term, rel=1e-6)
    assert degraded == pytest.approx(
        _thakur_ring_all_reduce(p, n, *_alpha_beta_gamma(IB, bandwidth_factor=0.5)), rel=REL)


def test_degraded_nvlink_of_a_node_doubles_its_bandwidth_term(node):
    p, n = 8, 256 * MiB
    kw = dict(world_size=p, args=(n,), algorithms={"all_reduce": "ring"})
    healthy = _collective_seconds(node.run(_all_reduce, **kw))[0]
    degraded = _collective_seconds(node.run(_all_reduce, link_factor={0: 0.5}, **kw))[0]
    _, beta, _ = _alpha_beta_gamma(NVLINK)
    assert degraded - healthy == pytest.approx(2 * (p - 1) / p * n * beta, rel=1e-6)


def _send_to(peers, nbytes):
    r = dist.get_rank()
    t = torch.empty(nbytes, dtype=torch.uint8, device="meta")
    if r == 0:
        for peer in peers:
            dist.send(t, peer)
    elif r in peers:
        dist.recv(t, 0)


def test_p2p_is_alpha_plus_n_beta_on_nvlink_and_on_infiniband():
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    n = 64 * MiB
    run = cluster.run(_send_to, world_size=16, args=((1, 8), n))
    durations = {}
    for peer in (1, 8):
        events = [(s, e) for lane, s, e, label in run.clock(peer).events
                  if lane == "comm" and label == f"send 0->{peer}"]
        assert len(events) == 1, run.clock(peer).events
        durations[peer] = events[0][1] - events[0][0]
    for peer, link in ((1, NVLINK), (8, IB)):
        alpha, beta, _ = _alpha_beta_gamma(link)
        assert durations[peer] == pytest.approx(alpha + n * beta, rel=REL), link.name
    # the sends of rank 0 run one after the other: its comm stream is busy for both
    assert run.clock(0).comm == pytest.approx(durations[1] + durations[8], rel=REL)
    assert run.elapsed == pytest.approx(durations[1] + durations[8], rel=REL)


# ============================================================= overlap
def _all_reduce_and_matmul(nbytes, matmul_dtype, async_op):
    t = torch.empty(nbytes // 4, dtype=torch.float32, device="meta")
    work = dist.all_reduce(t, async_op=async_op)
    _matmul(4096, 4096, 4096, matmul_dtype)  # does not touch t
    if async_op:
        work.wait()


@pytest.mark.parametrize("matmul_dtype", [torch.bfloat16, torch.float32],
                         ids=["comm-longer", "compute-longer"])
def test_async_all_reduce_overlaps_compute_sync_adds_up(node, matmul_dtype):
    n, p = 256 * MiB, 8
    comm = _thakur_ring_all_reduce(p, n, *_alpha_beta_gamma(NVLINK))
    compute = 2 * 4096**3 / A100.flops_for(matmul_dtype)
    kw = dict(world_size=p, algorithms={"all_reduce": "ring"})
    overlapped = node.run(_all_reduce_and_matmul, args=(n, matmul_dtype, True), **kw)
    serial = node.run(_all_reduce_and_matmul, args=(n, matmul_dtype, False), **kw)
    assert overlapped.elapsed == pytest.approx(max(compute, comm), rel=REL)
    assert serial.elapsed == pytest.approx(compute + comm, rel=REL)
    rows = overlapped.summary().rows
    assert all(row["overlap_s"] == pytest.approx(min(compute, comm), rel=REL) for row in rows)
    assert all(row["overlap_s"] == 0 for row in serial.summary().rows)


def _matmul_then_all_reduce():
    _matmul(4096, 4096, 4096, torch.bfloat16)
    _all_reduce(4 * MiB)


def test_a_straggler_makes_every_other_rank_wait_in_the_next_collective(node):
    p = 4
    base = node.run(_matmul_then_all_reduce, world_size=p)
    slow = node.run(_matmul_then_all_reduce, world_size=p, speed_factor={1: 2.0})
    compute = 2 * 4096**3 / 312e12
    assert base.clock(1).compute == pytest.approx(compute, rel=REL)
    assert slow.clock(1).compute == pytest.approx(2 * compute, rel=REL)
    for r in range(p):
        grew = slow.clock(r).idle - base.clock(r).idle
        if r == 1:
            assert grew == pytest.approx(0, abs=1e-12)
        else:
            assert slow.clock(r).compute == pytest.approx(compute, rel=REL)
            assert grew == pytest.approx(compute, rel=1e-6), f"rank {r}"
    assert slow.elapsed - base.elapsed == pytest.approx(compute, rel=1e-6)
    # the collective started when the straggler arrived
    start = slow.collectives[-1].start
    assert start == pytest.approx(2 * compute, rel=REL)


# ================================================================ DDP
def _ddp_steps(width, layers, batch, bucket_cap_mb, steps):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(width, width) for _ in range(layers)])
    ddp = DDP(model, bucket_cap_mb=bucket_cap_mb)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    x = torch.randn(batch, width)
    for _ in range(steps):
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()


def test_ddp_overlaps_gradient_all_reduce_with_backward(node):
    """Four 1024x1024 layers, one 4 MiB bucket each (from the second step on: torch's DDP
    puts everything into one bucket in the first iteration, before it knows the order in
    which gradients arrive). A layer's backward (~55 us at the fp32 peak) is comparable to
    its bucket's all-reduce (~48 us): each bucket's all-reduce runs during the backward
    of the layers below it, so every bucket but the last one overlaps compute."""
    width, layers = 1024, 4
    run = node.run(_ddp_steps, world_size=4, args=(width, layers, 256, 4, 2))
    bucket = 4 * (width * width + width)
    all_reduces = [c for c in run.collectives if c.op == "all_reduce"]
    # step 1: one bucket of everything; step 2: one bucket per layer
    assert [c.nbytes for c in all_reduces] == [layers * bucket] + [bucket] * layers
    last_step = all_reduces[1:]
    hidden = sum(c.duration for c in last_step[:-1])
    for row in run.summary().rows:
        assert row["overlap_s"] > 0
        assert row["overlap_s"] >= 0.99 * hidden
    # the buckets' all-reduces start during backward, one per layer, not all at the end
    starts = [c.start for c in last_step]
    assert all(b - a > 0 for a, b in zip(starts, starts[1:]))
    backward_end = max(e for lane, s, e, label in run.clock(0).events
                       if lane == "compute" and s < last_step[-1].end)
    assert starts[0] < backward_end


def test_remembered_flop_counts_equal_torchs_for_each_shape():
    """FLOPs are remembered per argument shapes; a new shape is counted anew."""
    from torch.utils.flop_counter import FlopCounterMode

    from simcluster.accounting import flop_formula

    aten = torch.ops.aten
    calls = [(aten.mm.default, (torch.empty(8, 16), torch.empty(16, 4))),
             (aten.mm.default, (torch.empty(2, 16), torch.empty(16, 32))),
             (aten.addmm.default, (torch.empty(4), torch.empty(8, 16), torch.empty(16, 4))),
             (aten.bmm.default, (torch.empty(3, 8, 16), torch.empty(3, 16, 4))),
             (aten.mm.default, (torch.empty(8, 64), torch.empty(64, 4))),   # same output shape
             (aten.mm.default, (torch.empty(8, 16), torch.empty(16, 4)))]   # again: remembered
    formulas = {op: flop_formula(op.overloadpacket) for op, _ in calls}   # one memory per op
    for op, args in calls:
        with FlopCounterMode(display=False) as counter:
            out = op(*args)
        assert formulas[op](args, {}, out) == counter.get_total_flops() > 0
