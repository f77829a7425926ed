"""simcluster — a simulated GPU cluster that runs real ``torch.distributed`` code.

    import simcluster as sc
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    run = cluster.run(train, world_size=8)
    run.results[0]

Ranks are threads of this Python process, scheduled one at a time in a fixed order, so
every run is deterministic, and a deadlock is reported instead of hanging.
"""

from .cluster import Cluster
from .errors import (CollectiveMismatchError, DeadlockError, OutOfMemoryError, RankError,
                     SimulationError,
                     SimulationTimeout)
from .report import Run, Summary
from .spec import PRESETS, ClusterSpec, DeviceSpec, LinkSpec, NetworkSpec, NodeSpec

__all__ = [
    "Cluster", "Run", "Summary", "ClusterSpec", "NodeSpec", "DeviceSpec", "LinkSpec",
    "NetworkSpec", "PRESETS",
    "SimulationError", "RankError", "DeadlockError", "CollectiveMismatchError",
    "SimulationTimeout", "OutOfMemoryError",
]
