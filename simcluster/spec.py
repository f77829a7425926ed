"""What a simulated cluster is made of: nodes, and the devices in them.

A cluster is a list of nodes; each node holds some devices (GPUs). Global ranks fill the
nodes in order: with 8 devices per node, ranks 0-7 live on node 0, ranks 8-15 on node 1.
"""

from dataclasses import dataclass, field


@dataclass(frozen=True)
class NodeSpec:
    """One machine: ``devices`` GPUs of the model called ``device``."""

    name: str
    devices: int
    device: str = "A100-80GB"


@dataclass(frozen=True)
class ClusterSpec:
    """A named list of nodes."""

    name: str
    nodes: tuple = field(default_factory=tuple)

    @property
    def world_size(self):
        """The number of devices in the whole cluster."""
        return sum(node.devices for node in self.nodes)

    def placement(self, rank):
        """``(node_index, local_rank)`` of global ``rank``."""
        for index, node in enumerate(self.nodes):
            if rank < node.devices:
                return index, rank
            rank -= node.devices
        raise ValueError(f"rank is out of range for {self.name} ({self.world_size} devices)")


def _uniform(name, nodes, devices, device):
    return ClusterSpec(name, tuple(NodeSpec(f"node{i}", devices, device) for i in range(nodes)))


def _hetero_11(nodes):
    if nodes not in (None, 11):
        raise ValueError("the hetero-11 preset always has 11 nodes; leave out nodes=")
    return ClusterSpec("hetero-11", tuple(
        NodeSpec(f"node{i}", 8 if i == 7 else 4, "A100-80GB") for i in range(11)))


PRESETS = {
    "dgx-a100": lambda nodes: _uniform("dgx-a100", nodes or 1, 8, "A100-80GB"),
    "dgx-h100": lambda nodes: _uniform("dgx-h100", nodes or 1, 8, "H100-80GB"),
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
    return PRESETS[name](nodes)
