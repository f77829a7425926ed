"""The simulated hardware behaves like the reference numbers of ``docs/reference-numbers.md``.

Every expected time here is written out from the published formulas -- the roofline; NCCL's
own performance model (``src/graph/tuning.cc`` of NCCL 2.30.7) for NCCL's algorithms and
protocols; Thakur, Rabenseifner & Gropp (2005) for the textbook algorithms; alpha + n·beta
for a message -- with the numbers of the preset and of those sources typed in here, never
by calling the cost model's formulas, so a mistake in ``simcluster/costmodel.py`` shows up
as a difference. Bus bandwidths follow nccl-tests' performance notes (NVIDIA/nccl-tests).

Tensors live on the ``meta`` device wherever the data does not matter: a 1 GiB all-reduce
or a 4096³ matmul is charged in full, and nothing is allocated or computed.
"""

import math

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


def _collective_seconds(run, op="all_reduce"):
    """(seconds, algorithm) of the run's only collective."""
    (record,) = run.collectives
    assert record.op == op and len(record.ranks) == run.world_size
    return record.duration, record.algorithm


def _charge(cluster, op, p, nbytes, algorithms=None):
    """(seconds, algorithm, protocol) the cost model charges ``op`` on ranks 0..p-1."""
    return tuple(sc.costmodel.CostModel(cluster.spec, algorithms)
                 .collective_time(op, list(range(p)), nbytes))


def test_flat_ring_all_reduce_on_one_dgx_a100_node_matches_thakur(node):
    n, p = 256 * MiB, 8
    run = node.run(_all_reduce, world_size=p, args=(n,),
                   algorithms={"all_reduce": "flat_ring"})
    seconds, algorithm = _collective_seconds(run)
    assert algorithm == "flat_ring"
    want = _thakur_ring_all_reduce(p, n, *_alpha_beta_gamma(NVLINK))
    assert seconds == pytest.approx(want, rel=REL)
    assert run.elapsed == pytest.approx(want, rel=REL)  # nothing else happened
    for r in range(p):
        assert run.clock(r).comm == pytest.approx(want, rel=REL)


# ---------------------------------------------- NCCL's model, NCCL 2.30.7 tuning.cc
# DGX A100: Ampere GPUs (compCapIndex 1), AMD CPUs, 8 HDR NICs per node.
US = 1e-6
NVLINK_BUS = 300e9 * 0.8            # what one A100 pushes into NVSwitch
NICS_BUS = 8 * 25e9 * 0.95          # eight HDR NICs, as NCCL runs one channel per NIC
BASE = {"ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4},        # baseLatencies
        "tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4}}
HOP = {"nvlink": {"ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4},   # hwLatencies
                  "tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0}},
       "net": {"ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0},
               "tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0}}}
AMD_NET_OVERHEAD = 2.0              # getNetOverhead, x3 for Simple
LL_MAX = {1: 87.7e9, 2: 22.5e9, 3: 19.0e9}   # llMaxBws: Ampere one node; AMD 2, >2 nodes
TREE_PER_CHANNEL = {2: 23.6e9, 3: 17.8e9}    # perChMaxTreeBws, Ampere
LL128_PER_CHANNEL = 20.0e9                   # perChMaxRingLL128Bws / perChMaxTreeLL128Bws


def _nccl_ring_all_reduce(nodes, n, protocol):
    """NCCL's ring all-reduce estimate on ``nodes`` DGX A100 nodes (8 ranks each)."""
    p = 8 * nodes
    steps, crossing = 2 * (p - 1), 2 * (nodes - 1)
    intra = HOP["nvlink"]["ring"][protocol]
    if nodes > 1:
        intra = max(intra, AMD_NET_OVERHEAD * (3 if protocol == "Simple" else 1))
    latency = BASE["ring"][protocol] + (steps - crossing) * intra \
        + crossing * HOP["net"]["ring"][protocol]
    if protocol == "Simple" and nodes > 1 and n / (8 * p) >= 64:
        latency *= 1.4                                    # "plateau effect of ring"
    bus = NVLINK_BUS if nodes == 1 else min(NVLINK_BUS, NICS_BUS)
    if protocol == "LL":
        bus = min(LL_MAX[min(nodes, 3)], bus * 0.5)
    if protocol == "LL128":
        bus = min(bus * 0.92, 8 * LL128_PER_CHANNEL if nodes > 1 else math.inf)
    return latency * US + n / (bus * p / steps)


def _nccl_tree_all_reduce(nodes, n, protocol):
    """NCCL's tree all-reduce estimate on DGX A100 nodes: a chain of 8 ranks in each node,
    a double binary tree of log2(nodes) levels across them; for n < 64 bytes (no size
    correction)."""
    assert n < 64
    latency = BASE["tree"][protocol] + 2 * (7 * HOP["nvlink"]["tree"][protocol]
                                            + math.log2(nodes) * HOP["net"]["tree"][protocol])
    bus = NVLINK_BUS * 0.92 if nodes == 1 else min(min(NVLINK_BUS, NICS_BUS) * 0.92,
                                                   8 * TREE_PER_CHANNEL[min(nodes, 3)])
    bus = {"LL": min(bus / 3.8, LL_MAX[min(nodes, 3)]),
           "LL128": bus * 7 / 9 if nodes == 1 else min(bus * 120 / 128, 8 * LL128_PER_CHANNEL),
           "Simple": bus}[protocol]
    return latency * US + n / (bus * 0.5)


def test_all_reduce_bus_bandwidth_on_8_a100_is_near_nccl(node):
    """nccl-tests on 8 x A100 (NVSwitch) report an all-reduce bus bandwidth near 235 GB/s."""
    n, p = GiB, 8
    run = node.run(_all_reduce, world_size=p, args=(n,))
    seconds, algorithm = _collective_seconds(run)
    assert algorithm == "ring"
    assert _charge(node, "all_reduce", p, n)[2] == "Simple"
    assert seconds == pytest.approx(_nccl_ring_all_reduce(1, n, "Simple"), rel=REL)
    bus_bandwidth = 2 * (p - 1) / p * n / seconds
    assert bus_bandwidth == pytest.approx(235e9, rel=0.15), f"{bus_bandwidth / 1e9:.1f} GB/s"
    # and no algorithm is allowed to beat the wire: bus bandwidth <= NVLink's effective rate
    assert bus_bandwidth <= NVLINK.bandwidth * NVLINK.efficiency


@pytest.mark.parametrize("nodes", [2, 4, 8])
def test_multi_nic_ring_reaches_the_sum_of_a_nodes_nics(nodes):
    """NCCL runs one channel per NIC, each ring leaving the node through its own NIC: at
    1 GiB the bus bandwidth approaches 8 x 25 GB/s x 0.95 (NCCL maintainers, NVIDIA/nccl#412
    and nccl-tests#119: ~24 GB/s per HDR NIC, busbw ~ NICs x that)."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    assert all(n.nics == 8 for n in cluster.spec.nodes)
    p, n = 8 * nodes, GiB
    seconds, algorithm = _collective_seconds(cluster.run(_all_reduce, world_size=p, args=(n,)))
    assert algorithm == "ring"
    assert seconds == pytest.approx(_nccl_ring_all_reduce(nodes, n, "Simple"), rel=REL)
    bus_bandwidth = 2 * (p - 1) / p * n / seconds
    assert bus_bandwidth == pytest.approx(8 * 25e9 * 0.95, rel=0.15), \
        f"{bus_bandwidth / 1e9:.1f} GB/s"


@pytest.mark.parametrize("ranks, nics", [([0, 8], 1), ([0, 1, 8, 9], 2), (list(range(16)), 8)])
def test_a_node_gives_a_group_only_the_nics_of_its_ranks_in_it(ranks, nics):
    """NCCL gives each local rank at most one channel's NIC: a data-parallel group with
    one rank per node (as in 3D parallelism) leaves each node through one NIC, not eight,
    so a 1 GiB ring all-reduce reaches one NIC's bus bandwidth (25 GB/s x 0.95)."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    p, n = len(ranks), GiB
    seconds, algorithm, _ = sc.costmodel.CostModel(cluster.spec, {"all_reduce": "ring/Simple"}) \
        .collective_time("all_reduce", ranks, n)
    assert algorithm == "ring"
    bus_bandwidth = 2 * (p - 1) / p * n / seconds
    assert bus_bandwidth == pytest.approx(nics * 25e9 * 0.95, rel=0.03), \
        f"{bus_bandwidth / 1e9:.1f} GB/s"


def test_a_flat_ring_through_one_nic_is_a_teaching_algorithm():
    """Forced, one ring crossing the network on every step through one NIC: Thakur with
    InfiniBand numbers, several times slower than NCCL's rings, and never the default."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    p, n = 16, GiB
    flat, algorithm = _collective_seconds(cluster.run(
        _all_reduce, world_size=p, args=(n,), algorithms={"all_reduce": "flat_ring"}))
    assert algorithm == "flat_ring"
    assert flat == pytest.approx(_thakur_ring_all_reduce(p, n, *_alpha_beta_gamma(IB)), rel=REL)
    assert flat > 6 * _nccl_ring_all_reduce(2, n, "Simple")
    assert "flat_ring" not in sc.costmodel.DEFAULT_ALGORITHMS["all_reduce"]


@pytest.mark.parametrize("nodes", [1, 2, 4, 8])
def test_nccl_tree_is_a_chain_in_each_node_and_a_tree_across_nodes(nodes):
    """latency = base + 2((ranks per node - 1) x NVLink hop + log2(nodes) x network hop)."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    for protocol in ("LL", "LL128", "Simple"):
        charge = _charge(cluster, "all_reduce", 8 * nodes, 8,
                         {"all_reduce": f"tree/{protocol}"})
        assert charge == (pytest.approx(_nccl_tree_all_reduce(nodes, 8, protocol), rel=REL),
                          "tree", protocol)


def test_nccl_tree_on_one_node_has_no_logarithmic_advantage(node):
    """Each rank added to a node's chain adds two NVLink hops (reduce up, broadcast down)."""
    times = [_charge(node, "all_reduce", p, 8, {"all_reduce": "tree/LL"})[0]
             for p in range(2, 9)]
    bandwidth_term = 8 / (NVLINK_BUS * 0.92 / 3.8 * 0.5)
    assert times[0] == pytest.approx((6.8 + 2 * 0.6) * US + bandwidth_term, rel=REL)
    for shorter, longer in zip(times, times[1:]):
        assert longer - shorter == pytest.approx(2 * 0.6 * US, rel=1e-6)


@pytest.mark.parametrize("nodes, want, algorithm", [(1, 15.0e-6, "ring"), (4, 35.2e-6, "tree")])
def test_8_byte_all_reduce_takes_nccls_ll_latency(nodes, want, algorithm):
    """8 ranks: ring/LL, 6.6 + 14 x 0.6 us; 32 ranks: tree/LL, 6.8 + 2(7 x 0.6 + 2 x 5.0) us.
    (The simulator charged 20 us and 96 us before it modelled NCCL's protocols.)"""
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    run = cluster.run(_all_reduce, world_size=8 * nodes, args=(8,))
    seconds, chosen = _collective_seconds(run)
    assert (chosen, _charge(cluster, "all_reduce", 8 * nodes, 8)[2]) == (algorithm, "LL")
    assert seconds == pytest.approx(want, rel=1e-3)
    nccl = {"ring": _nccl_ring_all_reduce, "tree": _nccl_tree_all_reduce}[algorithm]
    assert seconds == pytest.approx(nccl(nodes, 8, "LL"), rel=REL)


def test_network_latency_is_charged_only_on_steps_that_cross_nodes():
    """A 16-rank ring crosses the network on 2 of its 30 all-reduce steps; the others pay
    NVLink's hop latency (raised to the AMD host's 2 us per network post)."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    seconds, algorithm, protocol = _charge(cluster, "all_reduce", 16, 8,
                                           {"all_reduce": "ring/LL"})
    assert (algorithm, protocol) == ("ring", "LL")
    assert seconds == pytest.approx((6.6 + 28 * 2.0 + 2 * 2.7) * US + 8 / (22.5e9 * 16 / 30),
                                    rel=REL)
    assert seconds < (6.6 + 30 * 2.7) * US


@pytest.mark.parametrize("op", ["all_gather", "reduce_scatter"])
def test_a_ring_all_gather_or_reduce_scatter_crosses_the_network_once_per_node_boundary(op):
    """Half an all-reduce: a 16-rank ring all-gather (or reduce-scatter) has 15 steps, and
    1 of them crosses between the 2 nodes (NCCL's nInterSteps is 2(nNodes-1) for
    all-reduce only); the other 14 pay NVLink's hop (the AMD host's 2 us network post)."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    seconds, algorithm, protocol = _charge(cluster, op, 16, 8, {op: "ring/LL"})
    assert (algorithm, protocol) == ("ring", "LL")
    assert seconds == pytest.approx((6.6 + 14 * 2.0 + 1 * 2.7) * US + 8 / (22.5e9 * 16 / 15),
                                    rel=REL)


def test_intel_hosts_post_network_sends_faster_than_amd_ones():
    """DGX H100 (Intel Xeon hosts): getNetOverhead is 1 us, not AMD's 2 us, and LL's cap on
    2 nodes is 39 GB/s (llMaxBws, Intel row)."""
    cluster = sc.Cluster.preset("dgx-h100", nodes=2)
    seconds = _charge(cluster, "all_reduce", 16, 8, {"all_reduce": "ring/LL"})[0]
    assert seconds == pytest.approx((6.6 + 28 * 1.0 + 2 * 2.7) * US + 8 / (39.0e9 * 16 / 30),
                                    rel=REL)


@pytest.mark.parametrize("n, protocol", [(8, "LL"), (8 * MiB, "LL128"), (GiB, "Simple")])
def test_the_default_runs_the_fastest_protocol_for_the_size(node, n, protocol):
    estimates = {("ring", pr): _nccl_ring_all_reduce(1, n, pr)
                 for pr in ("LL", "LL128", "Simple")}
    fastest = min(estimates, key=estimates.get)
    assert fastest == ("ring", protocol)
    assert _charge(node, "all_reduce", 8, n) == (pytest.approx(estimates[fastest], rel=REL),
                                                 *fastest)


def test_ll_gets_half_the_bandwidth_up_to_its_cap(node):
    """Forced LL at 1 GiB on one node: min(llMaxBw 87.7 GB/s, 240 GB/s / 2)."""
    seconds = _charge(node, "all_reduce", 8, GiB, {"all_reduce": "ring/LL"})[0]
    assert 2 * 7 / 8 * GiB / seconds == pytest.approx(87.7e9, rel=0.01)


def test_algorithms_forces_a_protocol_as_nccl_proto_does(node):
    run = node.run(_all_reduce, world_size=8, args=(GiB,), algorithms={"all_reduce": "ring/ll"})
    seconds, algorithm = _collective_seconds(run)
    assert algorithm == "ring"
    assert seconds == pytest.approx(_nccl_ring_all_reduce(1, GiB, "LL"), rel=REL)
    assert _charge(node, "all_reduce", 8, 8, {"all_reduce": "ring/ll128"})[1:] == ("ring", "LL128")
    assert _charge(node, "all_reduce", 8, 8, {"all_reduce": "flat_ring"})[1:] == ("flat_ring", None)
    with pytest.raises(ValueError, match="unknown protocol 'LL256'.*LL, LL128, Simple"):
        node.run(_all_reduce, world_size=8, args=(8,), algorithms={"all_reduce": "ring/LL256"})
    with pytest.raises(ValueError, match="'halving_doubling' is a textbook algorithm"):
        sc.costmodel.CostModel(node.spec, {"all_reduce": "halving_doubling/LL"})
    with pytest.raises(ValueError, match="broadcast has no algorithm 'tree'"):
        sc.costmodel.CostModel(node.spec, {"broadcast": "tree"})


def _rooted(op, nbytes):
    t = torch.empty(nbytes // 4, device="meta")
    getattr(dist, op)(t, 0)


@pytest.mark.parametrize("nodes", [1, 2])
@pytest.mark.parametrize("op", ["broadcast", "reduce"])
def test_broadcast_and_reduce_are_pipelined_rings(op, nodes):
    """A chain from (or to) the root: n / B, nccl-tests' bus-bandwidth factor 1. NCCL charges
    each of the p steps the tree's Simple hop latency: NVLink's in one node, the network's
    across nodes."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    p, n = 8 * nodes, GiB
    run = cluster.run(_rooted, world_size=p, args=(op, n))
    seconds, algorithm = _collective_seconds(run, op)
    assert algorithm == "ring"
    hop, bus = (4.0, NVLINK_BUS) if nodes == 1 else (14.0, NICS_BUS)
    assert seconds == pytest.approx((8.4 + p * hop) * US + n / bus, rel=REL)
    assert n / seconds == pytest.approx(bus, rel=0.05)     # bus bandwidth = algbw
    binomial = cluster.run(_rooted, world_size=p, args=(op, n),
                           algorithms={op: "binomial_tree"})
    assert _collective_seconds(binomial, op)[0] > 2.5 * seconds  # log2(p) whole copies


# ------------------------------------------------------------ textbook algorithms
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


@pytest.mark.parametrize("nodes", [2, 4])
def test_hierarchical_is_a_forced_teaching_algorithm(nodes):
    """Not one of NCCL's algorithms: it runs only when forced, and NCCL's multi-NIC ring
    beats it at 1 GiB."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    p, n = 8 * nodes, GiB
    run = cluster.run(_all_reduce, world_size=p, args=(n,),
                      algorithms={"all_reduce": "hierarchical"})
    assert _collective_seconds(run) == (
        pytest.approx(_hierarchical_all_reduce(nodes, 8, n), rel=REL), "hierarchical")
    assert _hierarchical_all_reduce(nodes, 8, n) > _nccl_ring_all_reduce(nodes, n, "Simple")
    assert "hierarchical" not in sc.costmodel.DEFAULT_ALGORITHMS["all_reduce"]
    assert "teaching algorithm" in sc.costmodel.__doc__


def test_ring_wins_over_tree_for_large_messages_in_one_node(node):
    large = {a: _charge(node, "all_reduce", 8, 256 * MiB, {"all_reduce": a})[0]
             for a in ("ring", "tree")}
    assert large["ring"] < large["tree"]


def test_tree_beats_ring_for_small_messages_at_64_ranks():
    cluster = sc.Cluster.preset("dgx-a100", nodes=8)
    ring, tree = (_charge(cluster, "all_reduce", 64, 8, {"all_reduce": f"{a}/LL"})[0]
                  for a in ("ring", "tree"))
    assert tree == pytest.approx(_nccl_tree_all_reduce(8, 8, "LL"), rel=REL)
    assert tree < ring / 5


# ======================================== the default is NCCL's; the textbook ones are forced
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
def test_the_default_picks_only_nccls_algorithms(nodes):
    """NCCL's tuner picks among its own algorithms (here ring and tree), whatever the size
    or group: never halving-doubling, hierarchical, a flat ring or a binomial tree."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    world = 8 * nodes
    sizes = [2**k * 1024 for k in range(0, 21, 2)]  # 1 KiB .. 1 GiB, all divisible by world
    run = cluster.run(_sweep, world_size=world, args=(sizes,))
    used = {(c.op, c.algorithm) for c in run.collectives}
    assert len(run.collectives) == 3 * len(sizes)
    assert {a for _, a in used} <= {"ring", "tree"}, used
    # and every group the cost model may see, straight from it: 2 .. all ranks, every size
    cost = sc.costmodel.CostModel(cluster.spec)
    for p in range(2, world + 1):
        for op in ("all_reduce", "reduce_scatter", "all_gather"):
            for nbytes in sizes:
                charge = cost.collective_time(op, list(range(p)), nbytes)
                assert charge.algorithm in ("ring", "tree"), (p, op, nbytes)
                assert charge.protocol in ("LL", "LL128", "Simple"), (p, op, nbytes)


def test_the_default_on_one_node_is_ring_ll_for_small_and_ring_simple_for_large(node):
    small, large = (_collective_seconds(node.run(_all_reduce, world_size=8, args=(n,)))
                    for n in (64 * 1024, 256 * MiB))
    assert small == (pytest.approx(_nccl_ring_all_reduce(1, 65536, "LL"), rel=REL), "ring")
    assert large == (pytest.approx(_nccl_ring_all_reduce(1, 256 * MiB, "Simple"), rel=REL),
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

def _halving_doubling_across_nodes(p, n, family, per_node=8):
    """Rabenseifner's rounds on dgx-a100 nodes of ``per_node`` GPUs, partners 1, 2, 4, ...
    apart: a round whose partners are ``per_node`` or more apart crosses nodes, every rank
    through its own NIC at once (α, β of InfiniBand), the others stay on NVLink. The
    extra ranks of p > p' (on the last node) hand their buffers over InfiniBand."""
    pp = 1 << (p.bit_length() - 1)
    _, _, g = _alpha_beta_gamma(NVLINK)
    rounds, step, size = [], 1, n / 2
    while step < pp:
        rounds.append((_alpha_beta_gamma(NVLINK if step < per_node else IB), size))
        step, size = step * 2, size / 2
    seconds = 0.0
    if family != "all_gather":
        seconds += sum(a + s * (b + g) for (a, b, _), s in rounds)
    if family != "reduce_scatter":
        seconds += sum(a + s * b for (a, b, _), s in rounds)
    if p > pp:
        a, b, _ = _alpha_beta_gamma(IB)
        before = n / p if family == "all_gather" else n
        after = n / p if family == "reduce_scatter" else n
        seconds += 2 * a + (before + after) * b + (0 if family == "all_gather" else n * g)
    return seconds


@pytest.mark.parametrize("op", ["all_reduce", "reduce_scatter", "all_gather"])
@pytest.mark.parametrize("nodes", [2, 3])
def test_halving_doubling_across_nodes_crosses_on_every_nic_at_once(op, nodes):
    """Every rank exchanges with its partner at once, so a round that crosses nodes uses all
    of a node's NICs, like NCCL's ring: not one NIC for every byte (85 ms at 1 GiB on two
    nodes before). On 2 nodes, with nearest partners first, only the n/16 round crosses."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)
    p, n = 8 * nodes, 3 * GiB // 4   # divisible by 16 and 24 ranks
    run = cluster.run(_collective, world_size=p, args=(op, n), algorithms={op: "halving_doubling"})
    (c,) = run.collectives
    assert c.duration == pytest.approx(_halving_doubling_across_nodes(p, n, op), rel=REL)
    if nodes == 2 and op == "all_reduce":
        a_nv, b_nv, g = _alpha_beta_gamma(NVLINK)
        a_ib, b_ib, _ = _alpha_beta_gamma(IB)
        # 2·lg p·α + 2(p-1)/p·nβ + (p-1)/p·nγ, with each round's α and β on its link
        by_hand = (2 * (3 * a_nv + a_ib) + 2 * (7 / 8 * n * b_nv + n / 16 * b_ib)
                   + 15 / 16 * n * g)
        assert c.duration == pytest.approx(by_hand, rel=REL)
        one_nic = 2 * 4 * a_ib + 2 * 15 / 16 * n * b_ib + 15 / 16 * n * g
        assert c.duration < one_nic / 5



def test_nccl_rings_across_nodes_leave_each_node_through_every_nic():
    """The communication matrix of a 2-node ring all-reduce: 8 channels, each crossing
    between the nodes from a different GPU, 1/8 of the data each; 2 x 15/16 n in all cross
    each way, as for one ring."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    n = 64 * MiB
    traffic = cluster.run(_all_reduce, world_size=16, args=(n,)).recorder.traffic
    out_of_node_0 = {src for (src, dst) in traffic if src < 8 <= dst}
    assert out_of_node_0 == set(range(8))
    assert sum(b for (s, d), b in traffic.items() if s < 8 <= d) == pytest.approx(2 * 15 / 16 * n)


# ================================================== links, messages, faults
def test_degraded_network_doubles_the_inter_node_bandwidth_term():
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    p, n = 16, 256 * MiB
    for algorithm, bandwidth_term in (("flat_ring", 2 * (p - 1) / p * n * _alpha_beta_gamma(IB)[1]),
                                      ("ring/Simple", n / (NICS_BUS * p / (2 * (p - 1))))):
        kw = dict(world_size=p, args=(n,), algorithms={"all_reduce": algorithm})
        healthy = _collective_seconds(cluster.run(_all_reduce, **kw))[0]
        degraded = _collective_seconds(cluster.run(_all_reduce, link_factor={"network": 0.5},
                                                   **kw))[0]
        assert degraded - healthy == pytest.approx(bandwidth_term, rel=1e-6), algorithm


def test_degraded_nvlink_of_a_node_doubles_its_bandwidth_term(node):
    p, n = 8, 256 * MiB
    kw = dict(world_size=p, args=(n,), algorithms={"all_reduce": "flat_ring"})
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


def _send_durations(run, peers):
    durations = {}
    for peer in peers:
        events = [(s, e) for lane, s, e, label in run.clock(peer).events
                  if lane == "comm" and label == f"recv 0->{peer}"]
        assert len(events) == 1, run.clock(peer).events
        durations[peer] = events[0][1] - events[0][0]
    return durations


def test_p2p_is_alpha_plus_n_beta_on_nvlink_and_on_infiniband():
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    n = 64 * MiB
    run = cluster.run(_send_to, world_size=16, args=((1, 8), n))
    durations = _send_durations(run, (1, 8))
    for peer, link in ((1, NVLINK), (8, IB)):
        alpha, beta, _ = _alpha_beta_gamma(link)
        assert durations[peer] == pytest.approx(alpha + n * beta, rel=REL), link.name
    # the sends of rank 0 run one after the other: its comm stream is busy for both
    assert run.clock(0).comm == pytest.approx(durations[1] + durations[8], rel=REL)
    assert run.elapsed == pytest.approx(durations[1] + durations[8], rel=REL)


# ====================================================== HGX A100 4-GPU nodes
def test_hetero_11_four_gpu_nodes_are_an_nvlink_mesh():
    """HGX A100 4-GPU: no NVSwitch, four NVLinks (100 GB/s per direction) between each pair
    of GPUs (NVIDIA A100 architecture whitepaper). One pair exchanges at 100 GB/s; NCCL's
    rings over all four GPUs use all three peers' links: 300 GB/s."""
    cluster = sc.Cluster.preset("hetero-11")
    fabric = cluster.spec.nodes[0].fabric
    assert (fabric.bandwidth, fabric.pair_bandwidth) == (300e9, 100e9)
    n = 64 * MiB
    run = cluster.run(_send_to, world_size=2, args=((1,), n))
    assert _send_durations(run, (1,))[1] == pytest.approx(3.4e-6 + n / (100e9 * 0.8), rel=REL)
    cost = sc.costmodel.CostModel(cluster.spec)
    # ranks 28 and 29 sit on node 7, a DGX A100 with NVSwitch: the full 300 GB/s per pair
    assert cost.p2p_time(28, 29, n) == pytest.approx(3.4e-6 + n / (300e9 * 0.8), rel=REL)
    for p, bus in ((2, 100e9 * 0.8), (4, 300e9 * 0.8)):
        seconds, algorithm, protocol = _charge(cluster, "all_reduce", p, GiB)
        assert (algorithm, protocol) == ("ring", "Simple")
        steps = 2 * (p - 1)
        assert seconds == pytest.approx((8.4 + steps * 3.4) * US + GiB / (bus * p / steps),
                                        rel=REL)


def test_hetero_11_rings_across_nodes_use_the_four_nics_of_the_small_nodes():
    cluster = sc.Cluster.preset("hetero-11")
    p, n = 48, GiB
    seconds = _charge(cluster, "all_reduce", p, n, {"all_reduce": "ring/Simple"})[0]
    assert 2 * (p - 1) / p * n / seconds == pytest.approx(4 * 25e9 * 0.95, rel=0.1)


# ============================================================= overlap
SLOWDOWN = 1.189  # Lee et al. 2025 (arXiv:2507.03114): overlapped compute 18.9 % slower


def _all_reduce_and_matmul(nbytes, matmul_dtype, async_op):
    t = torch.empty(nbytes // 4, dtype=torch.float32, device="meta")
    work = dist.all_reduce(t, async_op=async_op)
    _matmul(4096, 4096, 4096, matmul_dtype)  # does not touch t
    if async_op:
        work.wait()


@pytest.mark.parametrize("matmul_dtype", [torch.bfloat16, torch.float32],
                         ids=["comm-longer", "compute-longer"])
def test_async_all_reduce_overlaps_compute_but_slows_it(node, matmul_dtype):
    """Overlapped compute runs 1.189 times slower while the all-reduce runs (NCCL's kernels
    take SMs and HBM bandwidth): hidden communication still costs something."""
    assert sc.costmodel.OVERLAP_SLOWDOWN == SLOWDOWN
    n, p = 256 * MiB, 8
    comm = _thakur_ring_all_reduce(p, n, *_alpha_beta_gamma(NVLINK))
    compute = 2 * 4096**3 / A100.flops_for(matmul_dtype)
    kw = dict(world_size=p, algorithms={"all_reduce": "flat_ring"})
    overlapped = node.run(_all_reduce_and_matmul, args=(n, matmul_dtype, True), **kw)
    serial = node.run(_all_reduce_and_matmul, args=(n, matmul_dtype, False), **kw)
    if compute * SLOWDOWN < comm:     # all of the compute runs slowed, inside the all-reduce
        want, slowed = comm, compute * SLOWDOWN
    else:                             # comm's worth of time runs slowed, the rest at full speed
        want = slowed = comm + (compute - comm / SLOWDOWN)
    assert overlapped.elapsed == pytest.approx(want, rel=REL)
    assert serial.elapsed == pytest.approx(compute + comm, rel=REL)
    assert overlapped.elapsed < serial.elapsed
    for r in range(p):
        assert overlapped.clock(r).compute == pytest.approx(slowed, rel=REL), f"rank {r}"
        assert serial.clock(r).compute == pytest.approx(compute, rel=REL)
    rows = overlapped.summary().rows
    assert all(row["overlap_s"] == pytest.approx(min(slowed, comm), rel=1e-6) for row in rows)
    assert all(row["overlap_s"] == 0 for row in serial.summary().rows)


def _late_rank_then_overlap(nbytes):
    if dist.get_rank() == 1:  # rank 1 arrives last: the others compute before the
        _matmul(1024, 1024, 1024, torch.float32)  # all-reduce's start and end are known
    _all_reduce_and_matmul(nbytes, torch.float32, True)


def test_the_slowdown_is_the_same_whether_a_rank_arrives_first_or_last(node):
    n, p = 256 * MiB, 4
    run = node.run(_late_rank_then_overlap, world_size=p, args=(n,),
                   algorithms={"all_reduce": "flat_ring"})
    comm = _thakur_ring_all_reduce(p, n, *_alpha_beta_gamma(NVLINK))
    late = 2 * 1024**3 / 19.5e12
    compute = 2 * 4096**3 / 19.5e12
    slowed = comm + (compute - comm / SLOWDOWN)
    # rank 1 computes only after the all-reduce has started: it is slowed as it runs
    assert run.clock(1).compute == pytest.approx(late + slowed, rel=REL)
    assert run.clock(1).end == pytest.approx(late + slowed, rel=REL)
    # the others ran at full speed until the all-reduce started at `late`, and ran their
    # matmul before its start and end were known: charged the same slowdown afterwards
    for r in (0, 2, 3):
        assert run.clock(r).compute == pytest.approx(slowed, rel=REL), f"rank {r}"
        assert run.clock(r).end == pytest.approx(slowed, rel=REL)


def test_rank_clock_stretches_compute_inside_communication():
    """The clock's rule, by hand, with a slowdown of 2: compute inside a busy
    communication span does half the work per second; compute charged before the span was
    known is charged the work it missed afterwards."""
    from simcluster.clock import RankClock

    ahead = RankClock(overlap_slowdown=2.0)
    ahead.run_comm(1.0, 3.0, "all_reduce")
    assert ahead.run_compute(0.5, "a") == 0.5            # 0 .. 0.5, nothing running
    assert ahead.run_compute(1.0, "b") == 1.5            # 0.5 free, then 0.5 work in 1 s
    assert ahead.run_compute(1.0, "c") == 1.5            # 0.5 work until 3, 0.5 after
    assert (ahead.now, ahead.compute) == (3.5, 3.5)
    behind = RankClock(overlap_slowdown=2.0)
    behind.run_compute(3.0, "d")                         # 0 .. 3, at full speed
    behind.run_comm(1.0, 2.0, "all_reduce")              # learnt later: 1 s overlapped
    assert (behind.now, behind.compute) == (3.5, 3.5)    # half of that second is owed
    assert behind.events[-1] == ("compute", 3.0, 3.5, "(slowed by communication)")
    behind.run_comm(1.5, 2.5, "again")                   # only 2 .. 2.5 is new
    assert behind.now == 3.75


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
