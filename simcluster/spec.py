"""What a simulated cluster is made of: devices, nodes, links and the network.

A cluster is a list of nodes; each node holds some devices (GPUs) joined by an intra-node
fabric (NVLink/NVSwitch), and NICs onto the network between nodes (InfiniBand). Global
ranks fill the nodes in order: with 8 devices per node, ranks 0-7 live on node 0, ranks
8-15 on node 1.

Numbers are the data-sheet peaks listed in ``docs/reference-numbers.md``; ``efficiency`` is
the fraction of a link's peak that collectives really achieve (NVLink ~0.8, InfiniBand ~0.95).
A fabric is either a switch (NVSwitch: every GPU reaches every other one at its full
bandwidth) or a mesh of direct links (HGX A100 4-GPU: ``pair_bandwidth`` between each pair).
"""

import math
from dataclasses import dataclass, field, replace

import torch

GB = 1e9
GiB = 2**30
TFLOPS = 1e12

DTYPES = {"float64": torch.float64, "float32": torch.float32, "tf32": None,
          "bfloat16": torch.bfloat16, "float16": torch.float16, "int8": torch.int8}


@dataclass(frozen=True)
class DeviceSpec:
    """One accelerator: memory capacity, peak FLOP/s per dtype, HBM bandwidth.

    ``compute_capability`` (8.0 for A100, 9.0 for H100) picks the row of NCCL's tuning
    tables that the cost model uses, as NCCL does.

    A simulated device has ONE compute stream: its rank's ops run one after another, each
    at the roofline of these peaks, never two at once (communication runs beside them on
    the communication stream). Overlapping two micro-batches' compute on one GPU, as
    DualPipe-style schedules do, therefore gains nothing on the simulator.
    """

    name: str
    memory: int                      # bytes
    peak_flops: dict                 # dtype name -> FLOP/s (dense)
    hbm_bandwidth: float             # bytes/s
    compute_capability: float = 8.0

    def flops_for(self, dtype):
        """Peak FLOP/s for a torch dtype, or ``"tf32"`` for an fp32 matmul on tensor cores
        (integers count at the int8 rate; a dtype without its own peak counts as fp32)."""
        if dtype == "tf32":
            name = "tf32"
        elif dtype is not None and not dtype.is_floating_point and not dtype.is_complex:
            name = "int8"
        else:
            name = next((n for n, t in DTYPES.items() if t is not None and t == dtype),
                        "float32")
        return self.peak_flops.get(name) or self.peak_flops["float32"]


@dataclass(frozen=True)
class LinkSpec:
    """A link: per-direction peak bandwidth (bytes/s), latency per message (s).

    ``kind`` is ``"nvlink"``, ``"pci"`` or ``"net"``: which row of NCCL's per-hop latencies
    applies. For a fabric, ``bandwidth`` is what one GPU can send in total; a mesh of
    direct links also gives ``pair_bandwidth``, the most one pair of GPUs can exchange
    (None: a switch, any pair gets the full ``bandwidth``).
    """

    name: str
    bandwidth: float
    latency: float
    efficiency: float = 1.0
    kind: str = "nvlink"
    pair_bandwidth: float = None

    @property
    def effective_bandwidth(self):
        """What a collective really gets out of the link, in bytes/s."""
        return self.bandwidth * self.efficiency

    def effective_bandwidth_among(self, gpus):
        """Bytes/s one of ``gpus`` GPUs on this fabric can send to the others at once.

        On a switch that is the full bandwidth; on a mesh each GPU has ``gpus - 1`` direct
        links into the group, so two GPUs of an HGX A100 4-GPU board get 100 GB/s, all
        four 300 GB/s (four NVLinks to each of three peers).
        """
        bandwidth = self.bandwidth
        if self.pair_bandwidth is not None:
            bandwidth = min(bandwidth, max(gpus - 1, 1) * self.pair_bandwidth)
        return bandwidth * self.efficiency


@dataclass(frozen=True)
class HostSpec:
    """A node's host: its CPUs' memory and compute, and each GPU's link to it (PCIe).

    Pinned host memory is where CPU offload keeps what it takes off the GPUs
    (``pin_memory()``, FSDP2's ``CPUOffloadPolicy``); the optimizer step of offloaded
    parameters runs on the CPUs. Every GPU of the node gets an equal share
    (:meth:`share`): ``memory / devices`` bytes, ``memory_bandwidth / devices`` and
    ``flops / devices`` for the host's compute; ``link`` is one GPU's own PCIe link,
    per direction.
    """

    name: str
    memory: int                      # bytes, the whole node
    memory_bandwidth: float          # bytes/s, the whole node (all sockets)
    flops: float                     # fp32 FLOP/s, the whole node (all cores, vector units)
    link: LinkSpec                   # one GPU's link to the host, per direction

    def share(self, devices):
        """``(memory bytes, memory bytes/s, FLOP/s)`` each of ``devices`` GPUs gets."""
        return self.memory // devices, self.memory_bandwidth / devices, self.flops / devices


@dataclass(frozen=True)
class StorageSpec:
    """A node's local storage (NVMe SSDs in RAID 0), where checkpoints are written.

    ``read_bandwidth`` and ``write_bandwidth`` are the array's sequential bandwidths in
    bytes/s, for the whole node: the ranks of a node that read or write at the same time
    share them (:mod:`simcluster.storage`). ``capacity`` is in bytes.
    """

    name: str
    capacity: int                    # bytes
    read_bandwidth: float            # bytes/s, the whole node
    write_bandwidth: float           # bytes/s, the whole node

    def write_seconds(self, nbytes):
        """Simulated seconds to write ``nbytes`` with the whole array to oneself."""
        return nbytes / self.write_bandwidth

    def read_seconds(self, nbytes):
        """Simulated seconds to read ``nbytes`` with the whole array to oneself."""
        return nbytes / self.read_bandwidth


@dataclass(frozen=True)
class NodeSpec:
    """One machine: ``devices`` devices of type ``device`` on ``fabric``, with ``nics``.

    ``cpu`` (``"amd"`` or ``"intel"``) matters to NCCL's tuner across nodes: it picks the
    low-latency protocol's bandwidth cap and the cost of posting a network send.
    ``host`` is the node's host memory, CPUs and PCIe links, ``storage`` its local NVMe
    storage (defaults: a DGX's, after ``device``).
    """

    name: str
    devices: int
    device: DeviceSpec = None
    fabric: LinkSpec = None
    nics: int = None  # None: one NIC per device
    cpu: str = "amd"
    host: HostSpec = None
    storage: StorageSpec = None


@dataclass(frozen=True)
class NetworkSpec:
    """The network between nodes: one NIC's link, and the fabric's oversubscription."""

    nic: LinkSpec
    oversubscription: float = 1.0


@dataclass(frozen=True)
class ClusterSpec:
    """A named list of nodes and the network that joins them."""

    name: str
    nodes: tuple = field(default_factory=tuple)
    network: NetworkSpec = None

    def __post_init__(self):
        # Nodes given as NodeSpec("name", devices) get DGX-A100-like hardware.
        nodes = tuple(replace(n, device=n.device or A100_80GB, fabric=n.fabric or NVLINK3,
                              nics=n.devices if n.nics is None else n.nics,
                              host=n.host or _host_for(n.device or A100_80GB),
                              storage=n.storage or _storage_for(n.device or A100_80GB))
                      for n in self.nodes)
        object.__setattr__(self, "nodes", nodes)
        if self.network is None:
            object.__setattr__(self, "network", NetworkSpec(HDR_IB))

    @property
    def world_size(self):
        """The number of devices in the whole cluster."""
        return sum(node.devices for node in self.nodes)

    def placement(self, rank):
        """``(node_index, local_rank)`` of global ``rank``."""
        if rank < 0:
            raise ValueError(f"rank {rank} is negative")
        local = rank
        for index, node in enumerate(self.nodes):
            if local < node.devices:
                return index, local
            local -= node.devices
        raise ValueError(f"rank {rank} is out of range for {self.name} "
                         f"({self.world_size} devices)")

    def node_of(self, rank):
        """The index of the node that holds global ``rank``."""
        return self.placement(rank)[0]

    def device_of(self, rank):
        """The :class:`DeviceSpec` of global ``rank``."""
        return self.nodes[self.node_of(rank)].device

    def host_of(self, rank):
        """The :class:`HostSpec` of the node that holds global ``rank``."""
        return self.nodes[self.node_of(rank)].host

    def storage_of(self, rank):
        """The :class:`StorageSpec` of the node that holds global ``rank``."""
        return self.nodes[self.node_of(rank)].storage

    def host_share(self, rank):
        """``(host memory bytes, host memory bytes/s, host FLOP/s)`` of ``rank``'s GPU: its
        equal share of its node's host."""
        node = self.nodes[self.node_of(rank)]
        return node.host.share(node.devices)

    def link_between(self, rank_a, rank_b):
        """The link a message from ``rank_a`` to ``rank_b`` crosses."""
        node_a, node_b = self.node_of(rank_a), self.node_of(rank_b)
        if node_a == node_b:
            return self.nodes[node_a].fabric
        return self.inter_node_link

    @property
    def inter_node_link(self):
        """One NIC's share of the network, after oversubscription."""
        nic = self.network.nic
        return replace(nic, bandwidth=nic.bandwidth / self.network.oversubscription)

    def describe(self):
        """A few lines of text: nodes, devices, links."""
        lines = [f"{self.name}: {len(self.nodes)} node(s), {self.world_size} devices"]
        groups = []
        for i, node in enumerate(self.nodes):
            key = (node.devices, node.device.name, node.fabric.name, node.nics)
            if groups and groups[-1][0] == key:
                groups[-1][1].append(i)
            else:
                groups.append((key, [i]))
        for (devices, device_name, fabric, nics), indices in groups:
            which = (f"node {indices[0]}" if len(indices) == 1
                     else f"nodes {indices[0]}-{indices[-1]}")
            node = self.nodes[indices[0]]
            pair = node.fabric.pair_bandwidth
            per_pair = f" ({pair / GB:.0f} GB/s per pair)" if pair is not None else ""
            lines.append(
                f"  {which}: {devices} x {device_name} "
                f"({node.device.memory / GiB:.0f} GiB, "
                f"{node.device.peak_flops.get('bfloat16', 0) / TFLOPS:.0f} TFLOP/s bf16, "
                f"{node.device.hbm_bandwidth / GB:,.0f} GB/s HBM), "
                f"{fabric} {node.fabric.bandwidth / GB:.0f} GB/s per direction{per_pair}, "
                f"{nics} NIC(s)")
        nic = self.network.nic
        lines.append(f"  network: {nic.name} {nic.bandwidth / GB:.0f} GB/s per NIC, "
                     f"latency {nic.latency * 1e6:.1f} µs, "
                     f"oversubscription {self.network.oversubscription:g}:1")
        return "\n".join(lines)


# ------------------------------------------------------------------- hardware
# Data-sheet peaks (NVIDIA A100 and H100 data sheets; see docs/reference-numbers.md).
A100_80GB = DeviceSpec(
    "A100-80GB", 80 * GiB,
    {"float64": 19.5 * TFLOPS, "float32": 19.5 * TFLOPS, "tf32": 156 * TFLOPS,
     "bfloat16": 312 * TFLOPS, "float16": 312 * TFLOPS, "int8": 624 * TFLOPS},
    2039 * GB, compute_capability=8.0)
H100_80GB = DeviceSpec(
    "H100-80GB", 80 * GiB,
    {"float64": 67 * TFLOPS, "float32": 67 * TFLOPS, "tf32": 494.5 * TFLOPS,
     "bfloat16": 989 * TFLOPS, "float16": 989 * TFLOPS, "int8": 1979 * TFLOPS},
    3350 * GB, compute_capability=9.0)
# Link latencies are the per-hop latencies NCCL 2.30.7's tuner charges a ring step of its
# Simple protocol (src/graph/tuning.cc, hwLatencies): 3.4 us over NVLink, 14.0 us over the
# network. They are the alpha of the textbook algorithms and of point-to-point messages;
# NCCL's own algorithms use NCCL's full per-protocol table (simcluster.costmodel).
# NVLink3: 12 links x 25 GB/s per direction per A100 = 300 GB/s, through NVSwitch on
# DGX/HGX A100 8-GPU; NVLink4: 18 links x 25 GB/s = 450 GB/s per H100. Efficiency 0.8:
# NCCL counts 20 GB/s per 25 GB/s link (src/graph/topo.h, SM80_NVLINK_BW). InfiniBand
# 0.95: NCCL's maintainers quote ~24 GB/s per 200 Gb/s HDR NIC (NVIDIA/nccl#412).
NVLINK3 = LinkSpec("NVLink3/NVSwitch", 300 * GB, 3.4e-6, efficiency=0.8)
NVLINK4 = LinkSpec("NVLink4/NVSwitch", 450 * GB, 3.4e-6, efficiency=0.8)
# HGX A100 4-GPU: no NVSwitch; each A100 has four NVLinks to each of its three peers
# (NVIDIA A100 Tensor Core GPU Architecture whitepaper, 2020): 100 GB/s per direction
# per pair, 300 GB/s per GPU only when it talks to all three at once.
NVLINK3_MESH4 = LinkSpec("NVLink3 mesh (HGX A100 4-GPU)", 300 * GB, 3.4e-6, efficiency=0.8,
                         pair_bandwidth=100 * GB)
HDR_IB = LinkSpec("HDR InfiniBand 200 Gb/s", 25 * GB, 14.0e-6, efficiency=0.95, kind="net")
NDR_IB = LinkSpec("NDR InfiniBand 400 Gb/s", 50 * GB, 14.0e-6, efficiency=0.95, kind="net")

# Hosts (docs/reference-numbers.md#host-memory-and-pcie). DGX A100: 2 AMD EPYC 7742
# (64 cores, 2.25 GHz, AVX2: 32 fp32 FLOP/cycle; 8 channels of DDR4-3200 each), 1 TB;
# GPUs on PCIe Gen4 x16 (32 GB/s per direction, ~25 GB/s achieved). DGX H100: 2 Intel
# Xeon Platinum 8480C (56 cores, 2.0 GHz, AVX-512: 64 fp32 FLOP/cycle; 8 channels of
# DDR5-4800 each), 2 TB; PCIe Gen5 x16 (64 GB/s per direction, ~50 GB/s achieved).
# Latency: the few microseconds a cudaMemcpyAsync takes to start (an assumption).
PCIE_GEN4 = LinkSpec("PCIe Gen4 x16", 32 * GB, 5e-6, efficiency=25 / 32, kind="pci")
PCIE_GEN5 = LinkSpec("PCIe Gen5 x16", 64 * GB, 5e-6, efficiency=50 / 64, kind="pci")
DGX_A100_HOST = HostSpec("2x AMD EPYC 7742, 1 TiB DDR4-3200", 1024 * GiB,
                         2 * 8 * 25.6 * GB, 2 * 64 * 2.25e9 * 32, PCIE_GEN4)
DGX_H100_HOST = HostSpec("2x Intel Xeon 8480C, 2 TiB DDR5-4800", 2048 * GiB,
                         2 * 8 * 38.4 * GB, 2 * 56 * 2.0e9 * 64, PCIE_GEN5)


def _host_for(device):
    """The host a node of ``device`` GPUs gets by default: a DGX's."""
    return DGX_H100_HOST if device.compute_capability >= 9.0 else DGX_A100_HOST


# Local storage (docs/reference-numbers.md#storage): DGX A100 has 15 TB of data cache,
# four 3.84 TB U.2 NVMe drives (PCIe Gen4) in RAID 0; DGX H100 has 30 TB, eight of them.
# A PCIe Gen4 U.2 drive of that class (Samsung PM1733, assumed for both) is rated
# 6.4 GB/s sequential read and 3.8 GB/s sequential write; RAID 0 adds them up. The
# 11-node cluster's HGX A100 nodes have the same 15 TB array as a DGX A100.
NVME_GEN4_U2_READ, NVME_GEN4_U2_WRITE = 6.4 * GB, 3.8 * GB
DGX_A100_STORAGE = StorageSpec("4x 3.84 TB NVMe (RAID 0)", int(4 * 3.84e12),
                               4 * NVME_GEN4_U2_READ, 4 * NVME_GEN4_U2_WRITE)
DGX_H100_STORAGE = StorageSpec("8x 3.84 TB NVMe (RAID 0)", int(8 * 3.84e12),
                               8 * NVME_GEN4_U2_READ, 8 * NVME_GEN4_U2_WRITE)


def _storage_for(device):
    """The local storage a node of ``device`` GPUs gets by default: a DGX's."""
    return DGX_H100_STORAGE if device.compute_capability >= 9.0 else DGX_A100_STORAGE


DEVICES = {d.name: d for d in (A100_80GB, H100_80GB)}
LINKS = {"nvlink3": NVLINK3, "nvlink4": NVLINK4, "nvlink3-mesh4": NVLINK3_MESH4,
         "hdr-ib": HDR_IB, "ndr-ib": NDR_IB}
LINK_KINDS = ("nvlink", "pci", "net")
CPUS = ("amd", "intel")


def _dgx(name, nodes, device, fabric, nic, cpu):
    # DGX A100: 8 ConnectX-6 HDR NICs, 2 AMD EPYC 7742; DGX H100: 8 ConnectX-7 NDR NICs,
    # 2 Intel Xeon Platinum 8480C (NVIDIA DGX A100 / DGX H100 user guides).
    return ClusterSpec(name, tuple(NodeSpec(f"node{i}", 8, device, fabric, nics=8, cpu=cpu)
                                   for i in range(nodes)), NetworkSpec(nic))


def _hetero_11(nodes):
    if nodes not in (None, 11):
        raise ValueError("the hetero-11 preset always has 11 nodes; leave out nodes=")
    # ten HGX A100 4-GPU boards (NVLink mesh, a NIC per GPU) and one DGX A100 (node 7)
    return ClusterSpec("hetero-11", tuple(
        NodeSpec(f"node{i}", 8, A100_80GB, NVLINK3, nics=8) if i == 7
        else NodeSpec(f"node{i}", 4, A100_80GB, NVLINK3_MESH4, nics=4)
        for i in range(11)), NetworkSpec(HDR_IB))


PRESETS = {
    "dgx-a100": lambda nodes: _dgx("dgx-a100", nodes or 1, A100_80GB, NVLINK3, HDR_IB, "amd"),
    "dgx-h100": lambda nodes: _dgx("dgx-h100", nodes or 1, H100_80GB, NVLINK4, NDR_IB,
                                   "intel"),
    "hetero-11": _hetero_11,
}


def preset(name, nodes=None):
    """The cluster spec called ``name`` (see ``PRESETS``), with ``nodes`` nodes if given."""
    if not isinstance(name, str) or name not in PRESETS:
        raise ValueError(f"unknown cluster preset {name!r}; choose one of "
                         f"{', '.join(sorted(PRESETS))}")
    if nodes is not None and (not isinstance(nodes, int) or isinstance(nodes, bool)
                              or nodes < 1):
        raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
    _check_size((nodes or 1) * 8, f"nodes={nodes}")
    return PRESETS[name](nodes)


# --------------------------------------------------------- custom clusters
# Larger than any cluster built so far (~100k GPUs), small enough to build at once: a
# typo such as count: 1000000 fails at once instead of filling the memory.
MAX_DEVICES = 2**17


def _check_size(devices, what):
    """Refuse a cluster of more than :data:`MAX_DEVICES` devices, naming the field."""
    if devices > MAX_DEVICES:
        raise ValueError(f"{what}: the cluster would have {devices:,} devices, more than "
                         f"the {MAX_DEVICES:,} a simulated cluster may have")


def _positive(value, what, allow_zero=False):
    ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if not ok or value < 0 or (value == 0 and not allow_zero):
        raise ValueError(f"{what} must be a {'non-negative' if allow_zero else 'positive'} "
                         f"number, got {value!r}")
    return value


def _check_fields(d, allowed, where):
    unknown = set(d) - allowed
    if unknown:
        raise ValueError(f"{where}: unknown field(s) {', '.join(sorted(unknown))}; "
                         f"allowed: {', '.join(sorted(allowed))}")


def _device_from(d, where):
    if isinstance(d, str):
        if d not in DEVICES:
            raise ValueError(f"{where}: unknown device {d!r}; known: {', '.join(DEVICES)} "
                             "(or give a dict with memory_gb, peak_tflops, hbm_gbps)")
        return DEVICES[d]
    if not isinstance(d, dict):
        raise ValueError(f"{where}: device must be a name or a dict, got {d!r}")
    _check_fields(d, {"name", "memory_gb", "peak_tflops", "hbm_gbps", "compute_capability"},
                  where)
    flops = d.get("peak_tflops")
    if not isinstance(flops, dict) or not flops:
        raise ValueError(f"{where}: peak_tflops must be a dict like "
                         "{'float32': 19.5, 'bfloat16': 312}")
    for dtype, value in flops.items():
        if dtype not in DTYPES:
            raise ValueError(f"{where}: unknown dtype {dtype!r} in peak_tflops; known: "
                             f"{', '.join(DTYPES)}")
        _positive(value, f"{where}: peak_tflops[{dtype!r}]")
    if "float32" not in flops:
        raise ValueError(f"{where}: peak_tflops needs a float32 entry (other dtypes fall "
                         "back to it)")
    memory = int(_positive(d.get("memory_gb"), f"{where}: memory_gb") * GiB)
    if memory < 1:  # tiny devices are fine (to show an out-of-memory), 0 bytes is not
        raise ValueError(f"{where}: memory_gb={d['memory_gb']!r} is less than one byte")
    return DeviceSpec(str(d.get("name", "custom")), memory,
                      {k: v * TFLOPS for k, v in flops.items()},
                      _positive(d.get("hbm_gbps"), f"{where}: hbm_gbps") * GB,
                      _positive(d.get("compute_capability", 8.0), f"{where}: compute_capability"))


def _choice(value, choices, what):
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(choices)}, got {value!r}")
    return value


def _link_from(d, where, kind="nvlink"):
    if isinstance(d, str):
        if d not in LINKS:
            raise ValueError(f"{where}: unknown link {d!r}; known: {', '.join(LINKS)}")
        return LINKS[d]
    if not isinstance(d, dict):
        raise ValueError(f"{where}: link must be a name or a dict, got {d!r}")
    _check_fields(d, {"name", "bandwidth_gbps", "latency_us", "efficiency", "kind",
                      "pair_bandwidth_gbps"}, where)
    efficiency = d.get("efficiency", 1.0)
    if not (isinstance(efficiency, (int, float)) and not isinstance(efficiency, bool)
            and 0 < efficiency <= 1):
        raise ValueError(f"{where}: efficiency must be in (0, 1], got {efficiency!r}")
    pair = d.get("pair_bandwidth_gbps")
    return LinkSpec(str(d.get("name", "custom")),
                    _positive(d.get("bandwidth_gbps"), f"{where}: bandwidth_gbps") * GB,
                    _positive(d.get("latency_us", 0), f"{where}: latency_us", True) * 1e-6,
                    efficiency, _choice(d.get("kind", kind), LINK_KINDS, f"{where}: kind"),
                    None if pair is None
                    else _positive(pair, f"{where}: pair_bandwidth_gbps") * GB)


STORAGES = {"dgx-a100": DGX_A100_STORAGE, "dgx-h100": DGX_H100_STORAGE}


def _storage_from(d, where):
    if isinstance(d, str):
        if d not in STORAGES:
            raise ValueError(f"{where}: unknown storage {d!r}; known: {', '.join(STORAGES)} "
                             "(or give a dict with capacity_tb, read_gbps, write_gbps)")
        return STORAGES[d]
    if not isinstance(d, dict):
        raise ValueError(f"{where}: storage must be a name or a dict, got {d!r}")
    _check_fields(d, {"name", "capacity_tb", "read_gbps", "write_gbps"}, where)
    return StorageSpec(str(d.get("name", "custom")),
                       int(_positive(d.get("capacity_tb"), f"{where}: capacity_tb") * 1e12),
                       _positive(d.get("read_gbps"), f"{where}: read_gbps") * GB,
                       _positive(d.get("write_gbps"), f"{where}: write_gbps") * GB)


def from_dict(d):
    """Build a :class:`ClusterSpec` from a dict (the shape of ``examples/cluster.yaml``).

    ``{"name": ..., "nodes": [{"devices": 4, "device": "A100-80GB", "fabric": "nvlink3",
    "nics": 4, "cpu": "amd", "storage": "dgx-a100", "count": 2}, ...],
    "network": {"nic": "hdr-ib",
    "oversubscription": 1}}``
    Every problem raises ``ValueError`` naming the field.
    """
    if not isinstance(d, dict):
        raise ValueError(f"a cluster description must be a dict, got {type(d).__name__}")
    unknown = set(d) - {"name", "nodes", "network"}
    if unknown:
        raise ValueError(f"unknown cluster field(s): {', '.join(sorted(unknown))}")
    groups = d.get("nodes")
    if not isinstance(groups, list) or not groups:
        raise ValueError("nodes must be a non-empty list")
    nodes = []
    for i, g in enumerate(groups):
        where = f"nodes[{i}]"
        if not isinstance(g, dict):
            raise ValueError(f"{where} must be a dict")
        _check_fields(g, {"devices", "count", "nics", "device", "fabric", "cpu", "storage"},
                      where)
        devices = g.get("devices")
        if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
            raise ValueError(f"{where}: devices must be a positive integer, got {devices!r}")
        count = g.get("count", 1)
        if not isinstance(count, int) or isinstance(count, bool) or count < 1:
            raise ValueError(f"{where}: count must be a positive integer, got {count!r}")
        _check_size(sum(n.devices for n in nodes) + count * devices, f"{where}: count")
        nics = g.get("nics", devices)
        if not isinstance(nics, int) or isinstance(nics, bool) or nics < 0:
            raise ValueError(f"{where}: nics must be a non-negative integer, got {nics!r}")
        device = _device_from(g.get("device", "A100-80GB"), where)
        fabric = _link_from(g.get("fabric", "nvlink3"), where)
        cpu = _choice(g.get("cpu", "amd"), CPUS, f"{where}: cpu")
        storage = None if "storage" not in g else _storage_from(g["storage"], where)
        for _ in range(count):
            nodes.append(NodeSpec(f"node{len(nodes)}", devices, device, fabric, nics, cpu,
                                  storage=storage))
    net = d.get("network", {})
    if not isinstance(net, dict):
        raise ValueError("network must be a dict")
    _check_fields(net, {"nic", "oversubscription"}, "network")
    oversubscription = _positive(net.get("oversubscription", 1), "network: oversubscription")
    if oversubscription < 1:
        raise ValueError(f"network: oversubscription must be at least 1 (1 means none), "
                         f"got {oversubscription!r}")
    network = NetworkSpec(_link_from(net.get("nic", "hdr-ib"), "network", kind="net"),
                          oversubscription)
    if len(nodes) > 1 and any(n.nics == 0 for n in nodes):
        raise ValueError("a node with nics: 0 cannot talk to the other nodes")
    return ClusterSpec(str(d.get("name", "custom")), tuple(nodes), network)


def from_yaml(path):
    """Build a :class:`ClusterSpec` from a YAML file with the fields of :func:`from_dict`.

    A key given twice in one mapping is an error (plain YAML keeps the last silently).
    """
    with open(path) as f:
        return from_dict(_load_yaml(f))


def _load_yaml(stream):
    """``yaml.safe_load``, refusing duplicate keys with the line of the second one."""
    import yaml

    class UniqueKeyLoader(yaml.SafeLoader):
        def construct_mapping(self, node, deep=False):
            seen = set()
            for key_node, _ in node.value:
                key = self.construct_object(key_node, deep=deep)
                if key in seen:
                    raise ValueError(f"{getattr(stream, 'name', 'YAML')}, line "
                                     f"{key_node.start_mark.line + 1}: the key {key!r} is "
                                     "given twice; keep one")
                seen.add(key)
            return super().construct_mapping(node, deep)

    return yaml.load(stream, Loader=UniqueKeyLoader)
