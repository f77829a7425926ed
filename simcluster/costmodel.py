"""How long things take on the simulated hardware.

**Compute** follows a roofline: an op takes ``max(FLOPs / peak FLOP/s for its dtype,
bytes moved / HBM bandwidth)``, and :data:`OVERLAP_SLOWDOWN` times longer while the
device's communication stream is busy (NCCL's kernels share the GPU with it).

**NCCL's algorithms** -- ``ring`` and ``tree``, what the default picks from -- are charged
with NCCL's own performance model, ``src/graph/tuning.cc`` of NCCL 2.30.7
(``ncclTopoTuneModel`` and ``ncclTopoGetAlgoTime``). NCCL estimates every algorithm with
every protocol and runs the fastest; so does the default here. For one (algorithm,
protocol), with ``p`` ranks and ``n`` bytes (the full buffer, as nccl-tests counts it):

    time = latency + n / (bus bandwidth x ratio)

* Protocols: ``Simple`` moves data at full bandwidth but pays the highest latency per step;
  ``LL`` (low latency) sends 4 bytes of data with a 4-byte flag, so a step costs well under
  a microsecond on NVLink but gets half the bandwidth; ``LL128`` sends 120 data bytes per
  128-byte line: 92 % of the bandwidth at an intermediate latency. ``algorithms=`` forces one
  as ``NCCL_PROTO`` does: ``{"all_reduce": "ring/LL"}``.
* Bus bandwidth: on one node, what a GPU can push into the NVLink fabric. Across nodes NCCL
  runs one channel per NIC, each a ring (or tree) that leaves the node through its own NIC,
  so the bus bandwidth is ``min(NVLink, NICs x NIC bandwidth)``, about 8 x 24 GB/s on DGX
  A100 nodes.
* ``ring``: ``2(p-1)`` steps for all-reduce (``p-1`` for reduce-scatter and all-gather),
  ratio ``p / steps``. Latency: a base, plus one hop latency per step -- the network's for
  the steps that cross nodes (``2(nodes-1)`` of them for all-reduce), NVLink's for the rest.
* ``tree`` (all-reduce only): a chain through the ranks of each node and a double binary
  tree across nodes. Latency ``base + 2((ranks per node - 1) x intra hop + log2(nodes) x
  network hop)``: on one node the chain has no logarithmic advantage. Ratio 1/2.
* Broadcast and reduce run the ring as a pipelined chain from or to the root: ``n / B``,
  nccl-tests' bus-bandwidth factor 1.
* ``barrier`` is what ``ProcessGroupNCCL::barrier`` does: an all-reduce of one float.

Not modelled: NCCL's CollNet/SHARP, NVLS and PAT algorithms (they need NVLink SHARP,
SHARP switches, or one GPU per node), and NCCL's graph search: per-channel bandwidths come
from the spec's links instead. LL128 is assumed enabled (NCCL enables it on Ampere when the
GPU reaches its NIC through PCIe switches only, as on DGX systems).

**Textbook algorithms**, charged only when forced, follow latency-bandwidth (alpha-beta-
gamma) models (Thakur, Rabenseifner & Gropp 2005), with

    alpha  latency of one message on the link (s)
    beta   seconds per byte on the slowest link the algorithm uses (1 / bandwidth)
    gamma  seconds per byte to reduce, at the device's HBM speed (1 / HBM bandwidth)

e.g. ``flat_ring`` all-reduce costs ``2(p-1)·alpha + 2(p-1)/p·n·beta + (p-1)/p·n·gamma``.
Their messages inside a node use one pair of GPUs' links (on a mesh without NVSwitch,
such as HGX A100 4-GPU, 100 GB/s), where NCCL's channels use all of a GPU's links.
``flat_ring`` is one ring through one NIC; ``binomial_tree`` sends whole buffers along a
binomial tree; ``halving_doubling`` is Rabenseifner's (NCCL has none) -- across nodes it is
charged round by round, each round on the link its pairs use, since all ranks exchange at
once, each through its own NIC (nearest partner first: only the small last rounds cross
nodes); ``hierarchical``
reduce-scatters inside each node, all-reduces 1/g of the data across nodes with one ring per
local rank, then all-gathers inside each node -- a teaching algorithm, not one of NCCL's.
All-to-all, gather and scatter (send/recv in NCCL) are ``direct``: every pair at once.
"""

import math
from dataclasses import dataclass
from typing import NamedTuple

from .faults import PACKET_BYTES, retransmission_factor, retransmission_rounds

NCCL_VERSION = "2.30.7"  # the tuning.cc every NCCL constant below is read from
PROTOCOLS = ("LL", "LL128", "Simple")
NCCL_ALGORITHMS = ("ring", "tree")

ALGORITHMS = {
    "all_reduce": ("ring", "tree", "flat_ring", "binomial_tree", "halving_doubling",
                   "hierarchical"),
    "reduce_scatter": ("ring", "flat_ring", "halving_doubling"),
    "all_gather": ("ring", "flat_ring", "halving_doubling"),
    "broadcast": ("ring", "binomial_tree"),
    "reduce": ("ring", "binomial_tree"),
    "all_to_all": ("direct",),
    "gather": ("direct",),
    "scatter": ("direct",),
    "barrier": ("ring", "tree"),
}

# what the default chooses from: NCCL's own algorithms (send/recv for the "direct" ones)
DEFAULT_ALGORITHMS = {family: tuple(a for a in algorithms if a in NCCL_ALGORITHMS + ("direct",))
                      for family, algorithms in ALGORITHMS.items()}

# torch op names -> the cost family above
OP_FAMILY = {
    "all_reduce": "all_reduce", "reduce": "reduce", "broadcast": "broadcast",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "gather": "gather", "scatter": "scatter", "barrier": "barrier",
}

# ProcessGroupNCCL::barrier all-reduces a one-element float tensor.
BARRIER_BYTES = 4

# Compute overlapped with communication on the same GPU runs slower: NCCL's kernels occupy
# SMs (one thread block per channel) and HBM bandwidth. Lee et al., "Characterizing
# Compute-Communication Overlap in GPU-Accelerated Distributed Deep Learning: Performance
# and Power Implications" (arXiv:2507.03114, 2025) measured compute overlapped with
# collectives on A100, H100, MI250 and MI210 to be 18.9 % slower on average (40 % at most).
OVERLAP_SLOWDOWN = 1.189

# ----------------------------------------------- NCCL 2.30.7, src/graph/tuning.cc
_US, _GBS = 1e-6, 1e9
# baseLatencies (us): what every collective pays once, per algorithm and protocol
BASE_LATENCY_US = {"tree": {"LL": 6.8, "LL128": 14.0, "Simple": 8.4},
                   "ring": {"LL": 6.6, "LL128": 14.0, "Simple": 8.4}}
# hwLatencies (us): per step (hop) over NVLink, PCIe or the network
HOP_LATENCY_US = {
    "nvlink": {"tree": {"LL": 0.6, "LL128": 1.25, "Simple": 4.0},
               "ring": {"LL": 0.6, "LL128": 1.9, "Simple": 3.4}},
    "pci": {"tree": {"LL": 1.0, "LL128": 1.9, "Simple": 4.0},
            "ring": {"LL": 1.0, "LL128": 2.5, "Simple": 5.7}},
    "net": {"tree": {"LL": 5.0, "LL128": 8.5, "Simple": 14.0},
            "ring": {"LL": 2.7, "LL128": 4.0, "Simple": 14.0}},
}
# Rows of the bandwidth caps below: NCCL's compCapIndex
_GENERATIONS = ((10.0, 3), (9.0, 2), (8.0, 1), (0.0, 0))  # Blackwell, Hopper, Ampere, Volta
_HOPPER = 2
# llMaxBws (GB/s), the LL protocol's bandwidth cap: on one node by GPU generation ...
LL_MAX_BW_ONE_NODE = (39.0, 87.7, 141.0, 282.0)
# ... and across 2 / more than 2 nodes by the CPU vendor (NCCL puts mixed ones with AMD)
LL_MAX_BW_NODES = {"intel": (39.0, 20.4), "amd": (22.5, 19.0), "mixed": (22.5, 19.0)}
# per-channel caps (GB/s) by generation, for 1 / 2 / more than 2 nodes
PER_CHANNEL_RING_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 36.7),
                          (40.0, 40.0, 40.0))
PER_CHANNEL_TREE = ((26.5, 18.5, 10.0), (24.0, 23.6, 17.8), (38.7, 41.4, 36.0),
                    (70.0, 42.8, 24.0))
PER_CHANNEL_TREE_LL128 = ((20.0, 20.0, 20.0), (20.0, 20.0, 20.0), (36.7, 36.7, 29.0),
                          (55.6, 31.67, 20.0))
# "Various model refinements": the share of the bus bandwidth each protocol gets
RING_LL_FACTOR = 0.5
LL128_FACTOR = 0.92          # 120 data bytes per 128-byte line
TREE_FACTOR = 0.92
TREE_LL_FACTOR = 1 / 3.8
TREE_LL128_FACTOR = {True: 7 / 9, False: 120 / 128}  # key: on one node
# getNetOverhead (us): posting a network send, charged per ring step across nodes (x3 for
# Simple): 2.0 on AMD, 1.0 on Intel and anything else
NET_OVERHEAD_US = {"amd": 2.0, "intel": 1.0, "mixed": 1.0}
# ncclTopoGetAlgoTime: a multi-node Simple ring all-reduce pays 1.4x its latency (1.9x
# before Ampere), "plateau effect of ring"
RING_PLATEAU = {True: 1.4, False: 1.9}  # key: compute capability >= 8.0
# treeCorrectionFactor: trees fall short of the model at medium sizes; per protocol, for
# sizes 64 B x 2**i
TREE_CORRECTION = {
    "LL": (1.0, 1.0, 1.0, 1.0, .9, .8, .7, .7, .7, .7, .6, .5, .4, .4, .5, .6, .7, .8, .9,
           1.0, 1.0, 1.0, 1.0, 1.0),
    "LL128": (1.0, 1.0, 1.0, 1.0, 1.0, .9, .8, .8, .8, .7, .6, .6, .6, .6, .6, .6, .8, .9, .9,
              .9, .9, 1.0, 1.0, 1.0),
    "Simple": (.9, .9, .9, .9, .9, .9, .9, .8, .7, .6, .6, .5, .5, .5, .5, .6, .7, .8, .7, .7,
               .8, .9, .9, .9),
}
# src/graph/search.cc, ncclTopoDupChannels: channels of 25 GB/s or more are doubled (each at
# half the bandwidth), except on Hopper and later below 50 GB/s with more than 4 channels
DUP_CHANNELS_GBS, DUP_CHANNELS_HOPPER_GBS = 25.0, 50.0


class Charge(NamedTuple):
    """What a collective costs: ``seconds``, and the ``algorithm`` and ``protocol`` charged
    (``protocol`` is NCCL's -- LL, LL128 or Simple -- or None for a textbook algorithm)."""

    seconds: float
    algorithm: str
    protocol: str


def _lg(p):
    return math.ceil(math.log2(p)) if p > 1 else 0


def _generation(compute_capability):
    """NCCL's row for a GPU: 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell."""
    return next(row for floor, row in _GENERATIONS if compute_capability >= floor)


def parse_algorithm(family, text):
    """``(algorithm, protocol or None)`` from ``"ring"`` or ``"ring/LL"`` (case-insensitive
    protocol, as ``NCCL_PROTO``); raises ``ValueError`` naming what is wrong."""
    if family not in ALGORITHMS:
        raise ValueError(f"unknown collective {family!r} in algorithms=; choose from "
                         f"{', '.join(ALGORITHMS)}")
    if not isinstance(text, str):
        raise ValueError(f"algorithms[{family!r}] must be a string like 'ring' or "
                         f"'ring/LL', got {text!r}")
    algorithm, _, protocol = text.partition("/")
    if algorithm not in ALGORITHMS[family]:
        raise ValueError(f"{family} has no algorithm {algorithm!r}; choose from "
                         f"{', '.join(ALGORITHMS[family])}")
    if not protocol:
        return algorithm, None
    if algorithm not in NCCL_ALGORITHMS:
        raise ValueError(f"{algorithm!r} is a textbook algorithm without NCCL protocols; "
                         f"force a protocol only with {' or '.join(NCCL_ALGORITHMS)}, "
                         f"e.g. 'ring/LL'")
    canonical = {name.lower(): name for name in PROTOCOLS}.get(protocol.lower())
    if canonical is None:
        raise ValueError(f"unknown protocol {protocol!r} in {text!r}; choose from "
                         f"{', '.join(PROTOCOLS)}")
    return algorithm, canonical


class LinkCost:
    """alpha, beta, gamma of one link class."""

    def __init__(self, latency, bandwidth, hbm_bandwidth):
        self.alpha = latency
        self.beta = 1.0 / bandwidth
        self.gamma = 1.0 / hbm_bandwidth


def flat_time(family, algorithm, p, n, c):
    """Seconds for textbook ``algorithm`` of ``family`` on ``p`` ranks, ``n`` bytes, link
    cost ``c`` (Thakur, Rabenseifner & Gropp 2005)."""
    a, b, g = c.alpha, c.beta, c.gamma
    if p <= 1:
        return 0.0
    f = (p - 1) / p
    lg = _lg(p)
    # Halving-doubling runs on the largest power of two q <= p (Thakur, Rabenseifner & Gropp
    # 2005). If p > q, the p - q extra ranks first hand their buffer to a partner (all of it
    # for a reduction, their 1/p shard for all-gather) and get their result back at the end
    # (all of it, or their 1/p shard for reduce-scatter): one more step each way.
    q = 1 << (p.bit_length() - 1)
    lq, fq, extra = q.bit_length() - 1, (q - 1) / q, int(p > q)
    table = {
        ("all_reduce", "flat_ring"): lambda: 2 * (p - 1) * a + 2 * f * n * b + f * n * g,
        ("all_reduce", "binomial_tree"): lambda: 2 * lg * (a + n * b) + lg * n * g,
        ("all_reduce", "halving_doubling"): lambda: (extra * (2 * a + 2 * n * b + n * g)
                                                     + 2 * lq * a + 2 * fq * n * b + fq * n * g),
        ("reduce_scatter", "flat_ring"): lambda: (p - 1) * a + f * n * (b + g),
        ("reduce_scatter", "halving_doubling"): lambda: (
            extra * (2 * a + n * b + n * g + n / p * b) + lq * a + fq * n * (b + g)),
        ("all_gather", "flat_ring"): lambda: (p - 1) * a + f * n * b,
        ("all_gather", "halving_doubling"): lambda: (extra * (2 * a + n / p * b + n * b)
                                                     + lq * a + fq * n * b),
        ("broadcast", "binomial_tree"): lambda: lg * (a + n * b),
        ("reduce", "binomial_tree"): lambda: lg * (a + n * (b + g)),
        ("all_to_all", "direct"): lambda: (p - 1) * a + f * n * b,
        ("gather", "direct"): lambda: (p - 1) * a + f * n * b,
        ("scatter", "direct"): lambda: (p - 1) * a + f * n * b,
    }
    return table[(family, algorithm)]()


@dataclass(frozen=True)
class NcclGroup:
    """What NCCL's model needs to know about the ranks of one collective."""

    ranks: int
    nodes: int
    per_node: int          # the most ranks on one node: the length of a tree's chain
    bus_bandwidth: float   # bytes/s a rank can push: NVLink, or the NICs across nodes
    channels: float        # NCCL channels across nodes (inf on one node: no cap binds)
    generation: int        # NCCL's compCapIndex
    compute_capability: float
    cpu: str               # "amd", "intel" or "mixed"
    intra_kind: str        # "nvlink" or "pci": which hop latencies apply inside a node


def nccl_time(family, algorithm, protocol, group, n):
    """Seconds NCCL's tuner estimates for ``family`` with ``algorithm``/``protocol`` on
    ``group`` (a :class:`NcclGroup`) and ``n`` bytes (tuning.cc of NCCL 2.30.7)."""
    g, p = group, group.ranks
    one_node = g.nodes == 1
    column = min(g.nodes, 3) - 1                     # NCCL's index2: 1, 2, >2 nodes
    ll_max = (LL_MAX_BW_ONE_NODE[g.generation] if one_node
              else LL_MAX_BW_NODES[g.cpu][column - 1]) * _GBS
    bus = g.bus_bandwidth
    base = BASE_LATENCY_US[algorithm][protocol]
    intra = HOP_LATENCY_US[g.intra_kind][algorithm][protocol]
    # with one rank per node nothing hides the network latency: NCCL charges the tree's
    inter = HOP_LATENCY_US["net"]["tree" if g.per_node == 1 else algorithm][protocol]
    if algorithm == "ring":
        if protocol == "LL":
            bus = min(ll_max, bus * RING_LL_FACTOR)
        elif protocol == "LL128":
            bus = min(bus * LL128_FACTOR,
                      g.channels * PER_CHANNEL_RING_LL128[g.generation][column] * _GBS)
        steps = {"all_reduce": 2 * (p - 1), "reduce_scatter": p - 1,
                 "all_gather": p - 1}.get(family, p)
        bandwidth = bus * p / steps
        if family in ("broadcast", "reduce"):
            # all p steps pay a hop over the slowest link (Simple: the tree's hop latency,
            # "waiting for proper chunk modeling" says tuning.cc)
            kind = g.intra_kind if one_node else "net"
            hop = HOP_LATENCY_US[kind]["tree" if protocol == "Simple" else "ring"][protocol]
            latency = base + steps * hop
        else:
            if not one_node:  # posting network sends also paces the steps inside the node
                overhead = NET_OVERHEAD_US[g.cpu] * (3 if protocol == "Simple" else 1)
                intra = max(intra, overhead)
            crossing = 0 if one_node else (g.nodes - 1) * (2 if family == "all_reduce" else 1)
            latency = base + (steps - crossing) * intra + crossing * inter
            if (protocol == "Simple" and not one_node and family == "all_reduce"
                    and n / (g.channels * p) >= 64):
                latency *= RING_PLATEAU[g.compute_capability >= 8.0]
    else:  # tree: all-reduce only
        bus = min(bus * TREE_FACTOR, g.channels * PER_CHANNEL_TREE[g.generation][column] * _GBS)
        if protocol == "LL":
            bus = min(bus * TREE_LL_FACTOR, ll_max)
        elif protocol == "LL128":
            bus = min(bus * TREE_LL128_FACTOR[one_node],
                      g.channels * PER_CHANNEL_TREE_LL128[g.generation][column] * _GBS)
        bandwidth = bus * 0.5
        if n >= 64:
            size_class = int(n // 64).bit_length() - 1
            if size_class < 23:
                bandwidth *= TREE_CORRECTION[protocol][size_class]
        latency = base + 2 * ((g.per_node - 1) * intra
                              + (g.nodes.bit_length() - 1) * inter)
    return latency * _US + n / bandwidth


class CostModel:
    """Charges compute and communication for one cluster.

    ``speed_factor[rank]`` (default 1) divides a rank's compute speed: 2 means a straggler
    twice as slow. ``link_factor[key]`` (default 1) multiplies bandwidth: ``key`` is a node
    index for its NVLink fabric, or ``"network"`` for the links between nodes.
    ``algorithms`` forces an algorithm (and for NCCL's, optionally a protocol) per collective
    family, e.g. ``{"all_reduce": "ring"}`` or ``{"all_reduce": "tree/LL128"}``.
    ``overlap_slowdown`` is how many times longer compute takes while communication runs on
    the same device (:data:`OVERLAP_SLOWDOWN`).

    Faults (:mod:`simcluster.faults`) add factors that hold for a window of simulated time:
    ``speed_windows[rank]`` and ``link_windows[key]`` are lists of ``(start, end, factor)``
    (``end`` None: to the end), applied at the time an op or a transfer starts.
    ``packet_loss[node]`` is ``(rate, rto)``: see :meth:`collective_time`.
    """

    def __init__(self, spec, algorithms=None):
        self.spec = spec
        self.speed_factor = {}
        self.link_factor = {}
        self.speed_windows = {}
        self.link_windows = {}
        self.packet_loss = {}
        self._at = 0.0       # when the transfer being charged starts (simulated seconds)
        self._lost = 0.0     # the share of packets it loses (PacketLoss), while charged
        self.overlap_slowdown = OVERLAP_SLOWDOWN
        self._peak = {}  # (rank, dtype) -> (FLOP/s, HBM bytes/s, slowdown), filled lazily
        self.algorithms = {family: parse_algorithm(family, text)
                           for family, text in dict(algorithms or {}).items()}

    # ------------------------------------------------------------------ compute
    def roofline(self, rank, flops, dtype, nbytes, now=0.0):
        """Seconds for an op of ``flops`` FLOPs moving ``nbytes`` bytes on ``rank``,
        starting at simulated time ``now`` (which matters to a straggler's window)."""
        key = (rank, dtype)
        peak = self._peak.get(key)
        if peak is None:
            device = self.spec.device_of(rank)
            peak = self._peak[key] = (device.flops_for(dtype), device.hbm_bandwidth,
                                      self.speed_factor.get(rank, 1.0))
        flops_per_s, bytes_per_s, slowdown = peak
        seconds = max(flops / flops_per_s if flops else 0.0, nbytes / bytes_per_s) * slowdown
        if self.speed_windows and rank in self.speed_windows:
            seconds *= _factor_at(self.speed_windows[rank], now)
        return seconds

    def host_roofline(self, rank, flops, nbytes, now=0.0):
        """Seconds for an op that ``rank``'s share of its host's CPUs runs (the optimizer
        step of offloaded parameters): the roofline with the share's FLOP/s and memory
        bandwidth."""
        _, bytes_per_s, flops_per_s = self.spec.host_share(rank)
        seconds = max(flops / flops_per_s if flops else 0.0, nbytes / bytes_per_s) \
            * self.speed_factor.get(rank, 1.0)
        if self.speed_windows and rank in self.speed_windows:
            seconds *= _factor_at(self.speed_windows[rank], now)
        return seconds

    def host_transfer_time(self, rank, nbytes):
        """Seconds to copy ``nbytes`` between ``rank``'s GPU and its host, one direction:
        ``latency + nbytes / achieved bandwidth`` of the GPU's PCIe link."""
        link = self.spec.host_of(rank).link
        return link.latency + nbytes / link.effective_bandwidth

    # ------------------------------------------------------------ communication
    def _per_node(self, ranks):
        """``{node index: [ranks on it]}``, in the order of ``ranks``."""
        per_node = {}
        for r in ranks:
            per_node.setdefault(self.spec.node_of(r), []).append(r)
        return per_node

    def _fabric_bandwidth(self, node, gpus):
        """Bytes/s each of ``gpus`` GPUs of ``node`` gets into the others, after faults."""
        return (self.spec.nodes[node].fabric.effective_bandwidth_among(gpus)
                * self.link_factor.get(node, 1.0) * self._window(node))

    def _nic_bandwidth(self):
        """Bytes/s one NIC's link carries, after faults; lost packets take their share."""
        return (self.spec.inter_node_link.effective_bandwidth
                * self.link_factor.get("network", 1.0) * self._window("network")
                / retransmission_factor(self._lost))

    def _window(self, key):
        """The factor of link ``key``'s degraded windows at the time being charged."""
        windows = self.link_windows.get(key)
        return _factor_at(windows, self._at) if windows else 1.0

    def _loss(self, ranks):
        """``(rate, rto)`` of the lossiest node among ``ranks`` when they span nodes (their
        traffic crosses the NICs), else None."""
        if not self.packet_loss:
            return None
        nodes = {self.spec.node_of(r) for r in ranks}
        lossy = [self.packet_loss[n] for n in nodes if n in self.packet_loss]
        return max(lossy) if lossy and len(nodes) > 1 else None

    def _retransmissions(self, loss, nbytes):
        """Seconds of retransmission timeouts while ``nbytes`` cross a lossy NIC: the
        transfer ends when its unluckiest packet has arrived (see faults)."""
        rate, rto = loss
        packets = math.ceil(nbytes / PACKET_BYTES)
        return retransmission_rounds(rate, packets) * rto

    def _nics_used(self, per_node):
        """NICs per node a collective's channels use: NCCL gives each local rank at most one
        channel's NIC, so a node is limited by its NICs and by its ranks in the group."""
        return min(min(self.spec.nodes[i].nics, len(members)) for i, members in per_node.items())

    def nccl_group(self, ranks):
        """The :class:`NcclGroup` of global ``ranks``."""
        spec = self.spec
        per_node = self._per_node(ranks)
        fabrics = [self._fabric_bandwidth(i, len(m)) for i, m in per_node.items() if len(m) > 1]
        bus = min(fabrics, default=math.inf)
        channels = math.inf
        capability = min(spec.nodes[i].device.compute_capability for i in per_node)
        generation = _generation(capability)
        if len(per_node) > 1:
            nics = self._nics_used(per_node)
            per_channel = self._nic_bandwidth() / _GBS
            channels = nics
            if per_channel >= DUP_CHANNELS_GBS and not (
                    generation >= _HOPPER and per_channel < DUP_CHANNELS_HOPPER_GBS
                    and nics > 4):
                channels *= 2
            bus = min(bus, nics * self._nic_bandwidth())
        kinds = {spec.nodes[i].fabric.kind for i, m in per_node.items() if len(m) > 1}
        cpus = {spec.nodes[i].cpu for i in per_node}
        return NcclGroup(
            ranks=len(ranks), nodes=len(per_node),
            per_node=max(len(m) for m in per_node.values()), bus_bandwidth=bus,
            channels=channels, generation=generation, compute_capability=capability,
            cpu=cpus.pop() if len(cpus) == 1 else "mixed",
            intra_kind="pci" if kinds - {"nvlink"} else "nvlink")

    def _link_cost(self, ranks, inter, among=2, share=1.0):
        """alpha-beta-gamma of the slowest link ``ranks`` use: between nodes one NIC (times
        ``share``), else the fabric with ``among`` GPUs sending at once (2: one pair)."""
        spec = self.spec
        nodes = sorted({spec.node_of(r) for r in ranks})
        hbm = min(spec.nodes[i].device.hbm_bandwidth for i in nodes)
        if inter:
            return LinkCost(spec.inter_node_link.latency, self._nic_bandwidth() * share, hbm)
        slowest = min(nodes, key=lambda i: self._fabric_bandwidth(i, among))
        return LinkCost(spec.nodes[slowest].fabric.latency,
                        self._fabric_bandwidth(slowest, among), hbm)

    def _hierarchical(self, ranks, n):
        per_node = self._per_node(ranks)
        g = max(len(m) for m in per_node.values())
        rings = min(len(m) for m in per_node.values())  # one ring across nodes per local rank
        nics = min(self.spec.nodes[i].nics for i in per_node)  # rings share scarcer NICs
        intra = self._link_cost(ranks, inter=False)
        inter = self._link_cost(ranks, inter=True, share=min(1.0, nics / rings))
        return (flat_time("reduce_scatter", "flat_ring", g, n, intra)
                + flat_time("all_reduce", "flat_ring", len(per_node), n / rings, inter)
                + flat_time("all_gather", "flat_ring", g, n, intra))

    def _round_cost(self, pairs):
        """alpha-beta-gamma of one round in which every ``(src, dst)`` pair sends at once:
        the fabric (one pair's links) when all pairs stay inside nodes, else a NIC, shared
        when more ranks of a node cross at once than it has NICs."""
        ranks = [r for pair in pairs for r in pair]
        crossing = {}
        for src, dst in pairs:
            if self.spec.node_of(src) != self.spec.node_of(dst):
                node = self.spec.node_of(src)
                crossing[node] = crossing.get(node, 0) + 1
        if not crossing:
            return self._link_cost(ranks, inter=False)
        share = min(min(1.0, self.spec.nodes[i].nics / k) for i, k in crossing.items())
        return self._link_cost(ranks, inter=True, share=share)

    def _halving_doubling(self, family, ranks, n):
        """Rabenseifner's algorithm across nodes, round by round in MPICH's order (partners
        1, 2, 4, ... apart): the same terms as :func:`flat_time`, but each round pays the
        link its pairs use, as the ranks of a node cross on their own NICs at once."""
        p = len(ranks)
        q = 1 << (p.bit_length() - 1)   # the p - q extra ranks pair with ranks[:p - q]
        rounds, step, size = [], 1, n / 2
        while step < q:
            rounds.append((self._round_cost([(ranks[i], ranks[i ^ step]) for i in range(q)]),
                           size))
            step, size = step * 2, size / 2
        seconds = 0.0
        if family != "all_gather":   # recursive halving: send half, add what comes back
            seconds += sum(c.alpha + s * (c.beta + c.gamma) for c, s in rounds)
        if family != "reduce_scatter":   # recursive doubling: the halves come back
            seconds += sum(c.alpha + s * c.beta for c, s in rounds)
        if p > q:   # hand the extra ranks' buffers in first, and their results back last
            c = self._round_cost(list(zip(ranks[q:], ranks)))
            before = n / p if family == "all_gather" else n
            after = n / p if family == "reduce_scatter" else n
            reduced = 0.0 if family == "all_gather" else n
            seconds += 2 * c.alpha + (before + after) * c.beta + reduced * c.gamma
        return seconds

    def _textbook_time(self, family, algorithm, ranks, n):
        spans_nodes = len({self.spec.node_of(r) for r in ranks}) > 1
        if algorithm == "hierarchical":
            if spans_nodes:
                return self._hierarchical(ranks, n)
            algorithm = "flat_ring"  # inside one node it is just a ring
        if algorithm == "halving_doubling" and spans_nodes:
            return self._halving_doubling(family, ranks, n)
        among = len(ranks) if algorithm == "direct" else 2  # direct: every pair at once
        return flat_time(family, algorithm, len(ranks), n,
                         self._link_cost(ranks, spans_nodes, among))

    def collective_time(self, op, ranks, nbytes, at=0.0):
        """The :class:`Charge` -- seconds, algorithm, protocol -- of collective ``op`` on
        global ``ranks`` with an ``nbytes`` buffer, starting at simulated time ``at``: the
        forced algorithm, else the fastest of NCCL's (with the fastest protocol, as NCCL's
        tuner picks).

        With packet loss on a node of the group (which spans nodes), the network carries
        ``1/(1 - rate)`` times the bytes, and the collective waits for retransmission
        timeouts until the last of the packets that cross the lossy node's NICs arrived.
        """
        loss = self._loss(ranks)
        self._at, self._lost = at, loss[0] if loss else 0.0
        try:
            charge = self._collective_time(op, ranks, nbytes)
        finally:
            self._at, self._lost = 0.0, 0.0
        if loss and charge.seconds:
            lossy = {n for n in self.packet_loss}
            crossing = sum(b for src, dst, b in self.traffic(op, charge.algorithm, ranks, nbytes)
                           if self.spec.node_of(src) != self.spec.node_of(dst)
                           and {self.spec.node_of(src), self.spec.node_of(dst)} & lossy)
            charge = charge._replace(
                seconds=charge.seconds + self._retransmissions(loss, crossing))
        return charge

    def _collective_time(self, op, ranks, nbytes):
        """:meth:`collective_time` without packet loss's timeouts."""
        family = OP_FAMILY[op]
        forced = self.algorithms.get(family)
        if family == "barrier":
            family, nbytes = "all_reduce", BARRIER_BYTES
        options = [forced] if forced else [(a, None) for a in DEFAULT_ALGORITHMS[family]]
        if len(ranks) <= 1:  # nothing to send; NCCL would name ring/Simple
            algorithm, protocol = options[0]
            if algorithm in NCCL_ALGORITHMS:
                protocol = protocol or "Simple"
            return Charge(0.0, algorithm, protocol)
        choices = [(algorithm, protocol) for algorithm, given in options
                   for protocol in ((given,) if given or algorithm not in NCCL_ALGORITHMS
                                    else PROTOCOLS)]
        group = None
        best = None
        for algorithm, protocol in choices:
            if algorithm in NCCL_ALGORITHMS:
                group = group or self.nccl_group(ranks)
                seconds = nccl_time(family, algorithm, protocol, group, nbytes)
            else:
                seconds = self._textbook_time(family, algorithm, ranks, nbytes)
            if best is None or seconds < best.seconds:
                best = Charge(seconds, algorithm, protocol)
        return best

    def traffic(self, op, algorithm, ranks, nbytes):
        """``[(src, dst, bytes), ...]`` the algorithm sends, for the communication matrix."""
        family = OP_FAMILY[op]
        if family == "barrier" or len(ranks) < 2:
            return []
        per_node = self._per_node(ranks)
        if algorithm == "hierarchical":
            return _hierarchical_traffic(list(per_node.values()), nbytes)
        if algorithm == "tree":
            return _tree_traffic(list(per_node.values()), nbytes)
        if algorithm == "ring" and len(per_node) > 1 and family not in ("broadcast", "reduce"):
            return _ring_traffic(family, list(per_node.values()), nbytes,
                                 self._nics_used(per_node))
        flat = "flat_ring" if algorithm == "ring" else algorithm
        return pattern(family, flat, list(ranks), nbytes)

    def p2p_time(self, src, dst, nbytes, at=0.0):
        """Seconds for one message of ``nbytes`` from ``src`` to ``dst`` starting at
        simulated time ``at``: alpha + n·beta (with packet loss, see
        :meth:`collective_time`)."""
        same_node = self.spec.node_of(src) == self.spec.node_of(dst)
        loss = self._loss([src, dst])
        self._at, self._lost = at, loss[0] if loss else 0.0
        try:
            c = self._link_cost([src, dst], inter=not same_node)
        finally:
            self._at, self._lost = 0.0, 0.0
        seconds = c.alpha + nbytes * c.beta
        return seconds + (self._retransmissions(loss, nbytes) if loss else 0.0)


def _factor_at(windows, t):
    """The product of the factors of the ``(start, end, factor)`` windows that hold at ``t``."""
    factor = 1.0
    for start, end, f in windows:
        if start <= t and (end is None or t < end):
            factor *= f
    return factor


def _ring_traffic(family, per_node, n, channels):
    """NCCL's rings across nodes: ``channels`` rings, each carrying 1/channels of the data
    and entering every node at a different local rank (so leaving through a different NIC)."""
    out = []
    for c in range(channels):
        order = [r for members in per_node
                 for r in members[c % len(members):] + members[:c % len(members)]]
        out += pattern(family, "flat_ring", order, n / channels)
    return out


def _tree_traffic(per_node, n):
    """NCCL's tree all-reduce: reduce up a chain in each node and across nodes up two binary
    trees (each with half the data; NCCL shifts or mirrors the first to build the second,
    here it is mirrored), then broadcast back down the same edges."""
    edges = []  # (child, parent, bytes)
    for members in per_node:
        edges += [(child, parent, n) for parent, child in zip(members, members[1:])]
    heads = [members[0] for members in per_node]
    for tree in (heads, heads[::-1]):
        edges += [(tree[i], tree[(i - 1) // 2], n / 2) for i in range(1, len(tree))]
    return edges + [(parent, child, b) for child, parent, b in edges]


def _hierarchical_traffic(per_node, n):
    out = []
    for members in per_node:
        out += pattern("reduce_scatter", "flat_ring", members, n)
        out += pattern("all_gather", "flat_ring", members, n)
    g = min(len(m) for m in per_node)
    for i in range(g):
        out += pattern("all_reduce", "flat_ring", [m[i] for m in per_node], n / g)
    return out


def pattern(family, algorithm, ranks, n):
    """Who sends how many bytes to whom in a flat textbook algorithm over ``ranks``."""
    p = len(ranks)
    if p < 2:
        return []
    ring_share = {"all_reduce": 2 * (p - 1) / p, "reduce_scatter": (p - 1) / p,
                  "all_gather": (p - 1) / p, "broadcast": 1.0, "reduce": 1.0}
    if algorithm == "flat_ring":  # broadcast and reduce: a chain from the root
        hops = range(p) if family not in ("broadcast", "reduce") else range(p - 1)
        return [(ranks[i], ranks[(i + 1) % p], ring_share[family] * n) for i in hops]
    if algorithm == "binomial_tree":
        edges = []
        step = 1
        while step < p:  # binomial tree rooted at ranks[0]
            edges += [(ranks[i], ranks[i + step]) for i in range(0, p - step, 2 * step)]
            step *= 2
        down = [(a, b, n) for a, b in edges]
        up = [(b, a, n) for a, b in edges]
        return {"broadcast": down, "reduce": up, "all_reduce": up + down}[family]
    if algorithm == "halving_doubling":
        q = 1 << (p.bit_length() - 1)  # on ranks[:q]; rank q + i pairs with rank i
        out, size, step = [], n / 2, 1
        while step < q:
            out += [(ranks[i], ranks[i ^ step], size) for i in range(q)]
            size, step = size / 2, step * 2
        out *= 2 if family == "all_reduce" else 1
        pairs = list(zip(ranks[q:], ranks))
        before = [(x, y, n if family != "all_gather" else n / p) for x, y in pairs]
        after = [(y, x, n if family != "reduce_scatter" else n / p) for x, y in pairs]
        return before + out + after
    if family == "all_to_all":  # direct
        return [(a, b, n / p) for a in ranks for b in ranks if a != b]
    if family == "gather":
        return [(r, ranks[0], n / p) for r in ranks[1:]]
    return [(ranks[0], r, n / p) for r in ranks[1:]]  # scatter
