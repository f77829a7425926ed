"""simcluster — a simulated GPU cluster that runs real ``torch.distributed`` code.

    import simcluster as sc
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    run = cluster.run(train, world_size=8)
    run.results[0]

Ranks are threads of this Python process, scheduled one at a time in a fixed order, so
every run is deterministic, and a deadlock is reported instead of hanging.
"""

from . import _torch_internals, faults
from .clock import ClockEvent, CollectiveRecord
from .cluster import Cluster
from .errors import (CollectiveMismatchError, DeadlockError, OutOfMemoryError,
                     RankCrashedError, RankError, SimulationError, SimulationTimeout)
from .report import Run, Summary
from .spec import (PRESETS, ClusterSpec, DeviceSpec, LinkSpec, NetworkSpec, NodeSpec,
                   StorageSpec)

_torch_internals.warn_if_untested()


def collectives_called():
    """Inside a rank: the collectives this rank has called so far, oldest first.

    Names as in ``"all_reduce"``, ``"broadcast"``, ... — however they were called
    (``dist.*``, DDP, DTensor, a sub-group). Exercise checks use it to tell point-to-point
    solutions from ones that call a collective.
    """
    from .context import current

    me = current()
    if me is None or me.world is None:
        raise RuntimeError("collectives_called() only works inside cluster.run")
    return me.world.collectives_called(me.rank)


def memory_in_use():
    """Inside a rank: ``{category: bytes}`` this rank's simulated device holds right now."""
    from .accounting import current

    acc = current()
    if acc is None:
        raise RuntimeError("memory_in_use() only works inside cluster.run with accounting on")
    return dict(acc.memory.in_use)


def host_memory_in_use():
    """Inside a rank: ``{category: bytes}`` this rank holds in its share of its node's host
    memory right now (pinned memory: what CPU offload keeps off the device)."""
    from .accounting import current

    acc = current()
    if acc is None:
        raise RuntimeError("host_memory_in_use() only works inside cluster.run with "
                           "accounting on")
    return dict(acc.host.in_use)


def now():
    """Inside a rank: this rank's simulated time in seconds, when its compute stream is
    next free (as ``time.perf_counter()`` after ``torch.cuda.synchronize()`` on a GPU).

    The difference of two readings is what the code between them cost the rank, e.g. a
    ``dcp.save``: computing, waiting for communication, reading and writing storage.
    """
    from .accounting import current

    acc = current()
    if acc is None:
        raise RuntimeError("now() only works inside cluster.run with accounting on")
    return acc.clock.now


def reset_peak_memory():
    """Inside a rank: start measuring the peak afresh, like
    ``torch.cuda.reset_peak_memory_stats()`` (e.g. after building and sharding a model)."""
    from .accounting import current

    acc = current()
    if acc is None:
        raise RuntimeError("reset_peak_memory() only works inside cluster.run with "
                           "accounting on")
    acc.memory.reset_peak()


def fake_tensors():
    """Inside a rank: tensors made in this ``with`` block have shapes but no data.

    Memory and time are still accounted from their sizes, so a model far larger than this
    machine can be measured — DDP, FSDP2 and optimizers run on them unchanged. DDP issues
    the same collectives, at the same simulated times, as on real tensors: its shape check
    at construction, the broadcast of the model, the rebuild of its buckets after the
    first step (the few small integer tensors these read back stay real). The same holds
    for DDP with ``find_unused_parameters=True``, for the ``torch.distributed.pipelining``
    schedules (their first ``step()`` votes along the pipeline and sends the stages' shapes
    as objects) and for ``dist.*_object*`` collectives: an op on real integer tensors alone
    runs on their data, and everything else stays fake. DTensor (tensor parallelism) and
    other functional collectives reach the simulated network as on real tensors, with the
    same bytes and times. Make a ``DeviceMesh`` before entering (building one reads real
    values).
    """
    from ._torch_internals import fake_tensor_mode

    return fake_tensor_mode()


__all__ = [
    "Cluster", "Run", "Summary", "ClusterSpec", "NodeSpec", "DeviceSpec", "LinkSpec",
    "NetworkSpec", "StorageSpec", "PRESETS",
    "SimulationError", "RankError", "DeadlockError", "CollectiveMismatchError",
    "SimulationTimeout", "OutOfMemoryError", "RankCrashedError", "faults", "fake_tensors",
    "collectives_called", "memory_in_use", "host_memory_in_use", "now", "reset_peak_memory",
    "CollectiveRecord", "ClockEvent",
]
