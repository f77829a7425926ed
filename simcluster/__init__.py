"""simcluster — a simulated GPU cluster that runs real ``torch.distributed`` code.

    import simcluster as sc
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    run = cluster.run(train, world_size=8)
    run.results[0]

Ranks are threads of this Python process, scheduled one at a time in a fixed order, so
every run is deterministic, and a deadlock is reported instead of hanging.
"""

from .cluster import Cluster, Run
from .errors import (CollectiveMismatchError, DeadlockError, RankError, SimulationError,
                     SimulationTimeout)
from .spec import PRESETS, ClusterSpec, NodeSpec

__all__ = [
    "Cluster", "Run", "ClusterSpec", "NodeSpec", "PRESETS",
    "SimulationError", "RankError", "DeadlockError", "CollectiveMismatchError",
    "SimulationTimeout",
]
