"""``Cluster`` — the entry point: run an SPMD function on N simulated ranks.

    cluster = Cluster.preset("dgx-a100", nodes=2)     # 2 nodes x 8 simulated GPUs
    run = cluster.run(train, world_size=8, args=(...))
    run.results[r]                                     # what train() returned on rank r

Inside ``train`` the default process group is already initialised on the ``sim``
backend, so ordinary ``torch.distributed`` code runs unchanged.
"""

import sys
import threading

import torch.distributed as dist

from . import _torch_internals, backend, spec, validation
from . import accounting as _accounting
from .costmodel import CostModel
from .errors import SimulationError
from .report import Run
from .scheduler import RankScheduler


class Cluster:
    """A simulated cluster: ``Cluster("dgx-a100")``, or see :meth:`preset`."""

    def __init__(self, cluster_spec):
        # A preset's name is accepted too: Cluster("dgx-a100") is what people type first.
        if isinstance(cluster_spec, str):
            cluster_spec = spec.preset(cluster_spec)
        self.spec = cluster_spec

    @classmethod
    def preset(cls, name, nodes=None):
        """A cluster from a named preset: ``"dgx-a100"``, ``"dgx-h100"``, ``"hetero-11"``."""
        return cls(spec.preset(name, nodes))

    @property
    def world_size(self):
        """How many devices (and so ranks) the cluster has."""
        return self.spec.world_size

    def __repr__(self):
        return (f"<Cluster {self.spec.name}: {len(self.spec.nodes)} nodes, "
                f"{self.world_size} devices>")

    @classmethod
    def from_dict(cls, description):
        """A custom cluster from a dict; see :func:`simcluster.spec.from_dict`."""
        return cls(spec.from_dict(description))

    @classmethod
    def from_yaml(cls, path):
        """A custom cluster from a YAML file with the fields of :meth:`from_dict`."""
        return cls(spec.from_yaml(path))

    def describe(self):
        """Print the cluster's nodes, devices and links."""
        print(self.spec.describe())

    def draw(self, ax=None):
        """Plot the cluster's topology with matplotlib."""
        from .plots import draw_cluster

        return draw_cluster(self.spec, ax=ax)

    def run(self, fn, world_size=None, args=(), kwargs=None, timeout=None,
            accounting=True, algorithms=None, speed_factor=None, link_factor=None):
        """Run ``fn(*args, **kwargs)`` on ranks ``0 .. world_size-1`` and return a :class:`Run`.

        Args:
            fn: the function every rank runs (SPMD); it finds its rank with
                ``dist.get_rank()``.
            world_size: how many ranks; defaults to every device of the cluster.
            args, kwargs: passed to ``fn`` on every rank (the same objects: copy what a
                rank must not share).
            timeout: wall-clock seconds after which a rank that is still running
                (an infinite loop) is stopped with :class:`~simcluster.SimulationTimeout`.
                Without one, a run is stopped only when it makes no progress for
                :data:`simcluster.scheduler.STALL_LIMIT_S` (a rank blocked on a lock that
                another rank holds); a rank that computes is never stopped.
            accounting: charge simulated time and memory (turn off for raw speed).
            algorithms: force collective algorithms, e.g. ``{"all_reduce": "ring"}``
                (see :data:`simcluster.costmodel.ALGORITHMS`); default: the fastest of
                NCCL's algorithms (:data:`simcluster.costmodel.DEFAULT_ALGORITHMS`).
            speed_factor: ``{rank: factor}``, a rank's compute takes ``factor`` times as
                long (a straggler).
            link_factor: ``{node_index or "network": factor}`` multiplies a link's
                bandwidth (0.5: a degraded link).

        Raises:
            RankError: ``fn`` raised on some rank.
            DeadlockError, CollectiveMismatchError: the ranks' communication does not fit.
            SimulationTimeout: the run timed out or stopped making progress.
            SimulationError: another run is active (one run at a time per process, and
                not from inside a rank).
        """
        world_size = validation.run_arguments(self, fn, world_size, args, kwargs, timeout,
                                              speed_factor, link_factor)
        if not _one_run_at_a_time.acquire(blocking=False):
            raise SimulationError(_second_run_refused())
        try:
            return self._run(fn, world_size, args, kwargs, timeout, accounting, algorithms,
                             speed_factor, link_factor)
        finally:
            _one_run_at_a_time.release()

    def _run(self, fn, world_size, args, kwargs, timeout, accounting, algorithms,
             speed_factor, link_factor):
        """:meth:`run`, once its arguments are checked and no other run is active."""
        kwargs = dict(kwargs or {})
        results = [None] * world_size
        cost = CostModel(self.spec, algorithms)
        cost.speed_factor.update(speed_factor or {})
        cost.link_factor.update(link_factor or {})
        recorder = _accounting.Recorder(self.spec, world_size, cost) if accounting else None
        scheduler = RankScheduler(world_size, lambda: world.explain_deadlock(), timeout)
        world = backend.SimWorld(scheduler, world_size, recorder)

        def rank_main(rank):
            _torch_internals.enter_rank_thread()
            backend.bind_thread(world)
            mode = _accounting.RankAccounting(rank, recorder) if recorder else None
            _accounting.bind_thread(mode)
            try:
                if mode is not None:
                    mode.__enter__()
                try:
                    _torch_internals.init_default_group(rank, world_size, world.store)
                    results[rank] = fn(*args, **kwargs)
                finally:
                    if mode is not None:
                        mode.__exit__(None, None, None)
                        recorder.memories[rank].close()
            finally:
                _accounting.bind_thread(None)
                _torch_internals.leave_rank_thread()
                backend.bind_thread(None)

        # init_process_group prefixes sys.excepthook with "[rankN]" in every rank: keep
        # the notebook's own hook.
        excepthook = sys.excepthook
        _torch_internals.install(_accounting.on_storage_resize, _accounting.on_parameter,
                                 _learner_init_process_group, _accounting.on_sharded_gradients,
                                 _accounting.allocating_as)
        _accounting.install_hooks()
        try:
            scheduler.run(rank_main)
        finally:
            _accounting.remove_hooks()
            _torch_internals.uninstall()
            sys.excepthook = excepthook
        return Run(self, world_size, results, world)


# The ranks of a run share process-wide state with the process (torch.distributed's hooks,
# the random generators they take turns with), so one run is active at a time.
_one_run_at_a_time = threading.Lock()


def _second_run_refused():
    """Why ``cluster.run`` cannot start now: the message of the error it raises."""
    if backend.current_world() is not None:
        return ("cluster.run was called inside a rank of a running simulation; a run "
                "cannot start another one. The rank's function already runs on every "
                "rank: call the inner function directly, or run it after this run returns.")
    return ("another cluster.run is still running in this process (started from another "
            "thread); simcluster runs one simulation at a time, because the ranks of a run "
            "take turns with the process's random state and torch.distributed hooks. "
            "Wait for it to return, then run again.")


def _learner_init_process_group(backend_name, kwargs):
    """Accept a rank function's own ``dist.init_process_group(...)`` inside a run."""
    world = backend.current_world()
    if world is None:
        if backend_name == "sim":
            raise RuntimeError(
                'the "sim" backend only works inside a simulated run: call your function '
                "with cluster.run(fn, world_size=...) instead of calling it directly.")
        return False
    rank = world.scheduler.rank
    for key, actual in (("world_size", world.world_size), ("rank", rank)):
        wanted = kwargs.get(key, -1)
        if wanted not in (-1, None, actual):
            raise ValueError(f"rank {rank}: init_process_group({key}={wanted}) does not match "
                             f"the simulated run ({key} is {actual})")
    if not dist.is_initialized():
        _torch_internals.init_default_group(rank, world.world_size, world.store)
    return True

