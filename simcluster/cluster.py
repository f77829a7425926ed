"""``Cluster`` — the entry point: run an SPMD function on N simulated ranks.

    cluster = Cluster.preset("dgx-a100", nodes=2)     # 2 nodes x 8 simulated GPUs
    run = cluster.run(train, world_size=8, args=(...))
    run.results[r]                                     # what train() returned on rank r

Inside ``train`` the default process group is already initialised on the ``sim``
backend, so ordinary ``torch.distributed`` code runs unchanged.
"""

import dataclasses
import datetime
import os
import threading

import torch.distributed as dist

from . import _torch_internals, backend, context, spec, validation
from . import accounting as _accounting
from . import faults as _faults
from .context import RankContext
from .costmodel import CostModel
from .errors import DeadlockError, SimulationError
from .report import Run
from .scheduler import RankScheduler

# What torchrun tells its workers about restarts (TORCHELASTIC_RESTART_COUNT: the attempt).
_ELASTIC_ENV = ("TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS")


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
            accounting=True, algorithms=None, speed_factor=None, link_factor=None,
            faults=None, max_restarts=0, min_world_size=None,
            restart_delay=_faults.DEFAULT_RESTART_DELAY_S, schedule_seed=None,
            cpu_timeout=None):
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
            cpu_timeout: CPU seconds the ranks' threads may use together before the rank
                still running is stopped with :class:`~simcluster.SimulationTimeout`:
                the run's own work, which a busy machine does not stretch as it does
                wall-clock time (the workbook's checks use it, with a far larger
                ``timeout`` as a last resort).
            accounting: charge simulated time and memory (turn off for raw speed).
            algorithms: force collective algorithms, e.g. ``{"all_reduce": "ring"}``
                (see :data:`simcluster.costmodel.ALGORITHMS`); default: the fastest of
                NCCL's algorithms (:data:`simcluster.costmodel.DEFAULT_ALGORITHMS`).
            speed_factor: ``{rank: factor}``, a rank's compute takes ``factor`` times as
                long (a straggler).
            link_factor: ``{node_index or "network": factor}`` multiplies a link's
                bandwidth (0.5: a degraded link).
            faults: a list of :mod:`simcluster.faults` (``faults.Crash(rank=3, at=2.0)``,
                ``NodeCrash``, ``Straggler``, ``LinkDegraded``, ``PacketLoss``), each at a
                simulated time. Needs ``accounting``.
            max_restarts: like torchrun's ``--max-restarts``: after a crash, every rank is
                restarted (``fn`` called again, a fresh process group) this many times at
                most. The simulated clock runs on; ``os.environ["TORCHELASTIC_RESTART_COUNT"]``
                is the attempt (0 first); ``run.restarts`` lists the failures;
                ``run.results`` are the last attempt's. Only crashes restart: an exception
                raised by ``fn`` stops the run at once, as without restarts. Objects in
                ``args`` survive a restart (real processes would start afresh): build the
                model inside ``fn`` and resume from a checkpoint.
            min_world_size: like torchrun's ``--nnodes=MIN:MAX``: after a
                :class:`~simcluster.faults.NodeCrash`, restart on the surviving nodes
                with fewer ranks, if at least this many are left. Without it a crashed node
                is replaced (the same world size).
            restart_delay: simulated seconds from a crash to the restart: torchrun's agent
                notices the dead worker, stops the others (they stop then, before their
                watchdogs fire), meets the other agents again and starts new processes.
                The last attempt, with no restart left, ends by the watchdogs instead.
            schedule_seed: None (default): ranks take turns round-robin and a receive from
                any source takes the lowest sender first. An int >= 0: both orders are
                drawn from ``random.Random(schedule_seed)`` instead, so each seed is
                another interleaving, the same on every run; loop over seeds to look for
                a race, run the failing seed again to replay it (docs/schedule_seed.md).

        Raises:
            RankCrashedError: a rank crashed and the run could not restart (any more).
            RankError: ``fn`` raised on some rank.
            DeadlockError, CollectiveMismatchError: the ranks' communication does not fit.
            SimulationTimeout: the run timed out or stopped making progress.
            SimulationError: another run is active (one run at a time per process, and
                not from inside a rank).
        """
        world_size = validation.run_arguments(self, fn, world_size, args, kwargs, timeout,
                                              speed_factor, link_factor)
        validation.check_timeout(cpu_timeout, "cpu_timeout")
        faults = _faults.check(faults, world_size, len(self.spec.nodes))
        _faults.check_restarts(max_restarts, min_world_size, restart_delay, world_size)
        schedule_seed = validation.check_schedule_seed(schedule_seed)
        if faults and not accounting:
            raise ValueError("faults happen at simulated times, and accounting=False keeps "
                             "no simulated time: run with accounting on")
        if not _one_run_at_a_time.acquire(blocking=False):
            raise SimulationError(_second_run_refused())
        saved_env = {name: os.environ.get(name) for name in _ELASTIC_ENV}
        try:
            return self._run(fn, world_size, args, kwargs, timeout, accounting, algorithms,
                             speed_factor, link_factor, faults, max_restarts, min_world_size,
                             float(restart_delay), schedule_seed, cpu_timeout)
        finally:
            for name, value in saved_env.items():
                if value is None:
                    os.environ.pop(name, None)
                else:
                    os.environ[name] = value
            _one_run_at_a_time.release()

    def _run(self, fn, world_size, args, kwargs, timeout, accounting, algorithms,
             speed_factor, link_factor, faults, max_restarts, min_world_size,
             restart_delay, schedule_seed=None, cpu_timeout=None):
        """:meth:`run`, once its arguments are checked and no other run is active: one
        attempt, and after each crash (as long as restarts are left) another."""
        kwargs = dict(kwargs or {})
        os.environ["TORCHELASTIC_MAX_RESTARTS"] = str(max_restarts)
        alive_nodes = list(range(len(self.spec.nodes)))   # original indices, in order
        cluster, recorder, start, restarts = self, None, 0.0, []
        for attempt in range(max_restarts + 1):
            os.environ["TORCHELASTIC_RESTART_COUNT"] = str(attempt)
            if recorder is None:
                cost = CostModel(cluster.spec, algorithms)
                cost.speed_factor.update(speed_factor or {})
                cost.link_factor.update(_faults.on_alive_nodes(link_factor, alive_nodes))
                _faults.slow_down(faults, cost, world_size, alive_nodes)
                recorder = (_accounting.Recorder(cluster.spec, world_size, cost)
                            if accounting else None)
                if recorder is not None and start > 0:
                    for clock in recorder.clocks:
                        clock.resume_at(start)
            elif start > 0:
                recorder.restart(start)
            world, results, scheduled = cluster._attempt(
                fn, world_size, args, kwargs, timeout, recorder, faults, start, alive_nodes,
                restart_delay if attempt < max_restarts else None,
                _attempt_seed(schedule_seed, attempt), cpu_timeout)
            run = Run(cluster, world_size, results, world)
            run.restarts = list(restarts)
            if not world.faults.deaths:
                return run
            record, dead_nodes = _faults.failure(world.faults, run, scheduled, attempt, start,
                                                 alive_nodes)
            last = attempt == max_restarts
            shrink = min_world_size is not None and dead_nodes
            if shrink:
                left = [i for i, original in enumerate(alive_nodes)
                        if original not in dead_nodes]
                smaller = sum(1 for r in range(world_size)
                              if cluster.spec.node_of(r) in left)
                if smaller < min_world_size:
                    raise _faults.crashed(record, run, restarts, (
                        f"Only {smaller} rank(s) are left on the surviving nodes, fewer than "
                        f"min_world_size={min_world_size}, so the job cannot go on."))
            if last:
                raise _faults.crashed(record, run, restarts, (
                    f"That is failure {len(restarts) + 1}, one more than "
                    f"max_restarts={max_restarts} allows: allow more restarts, or make each "
                    "one lose less work (checkpoint more often)." if max_restarts else
                    "Without restarts the run ends "
                    "here: pass max_restarts=... to cluster.run to restart every rank, as "
                    "torchrun --max-restarts does, and resume from a checkpoint."))
            start = max(record.detected, record.time + restart_delay)
            restarts.append(dataclasses.replace(record, restarted=start))
            if shrink:
                kept = [cluster.spec.nodes[i] for i in left]
                alive_nodes = [alive_nodes[i] for i in left]
                lost = [i for i in range(len(self.spec.nodes)) if i not in alive_nodes]
                cluster = Cluster(dataclasses.replace(
                    cluster.spec, nodes=tuple(kept),
                    name=f"{self.spec.name} without node {_faults.node_list(lost)}"))
                world_size, recorder = smaller, None
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _attempt(self, fn, world_size, args, kwargs, timeout, recorder, faults, start,
                 alive_nodes, stop_after_crash, schedule_seed=None, cpu_timeout=None):
        """One attempt of a run on this cluster, from simulated time ``start``: returns
        the world, the results, and ``{rank: fault}`` for the crashes scheduled.
        ``stop_after_crash``: with a restart to come, the survivors stop this many seconds
        after a crash (None: they wait for their watchdogs). ``schedule_seed``: see
        :class:`~simcluster.scheduler.RankScheduler`."""
        results = [None] * world_size
        scheduler = RankScheduler(world_size, lambda: world.explain_deadlock(), timeout,
                                  schedule_seed, cpu_timeout)
        world = backend.SimWorld(scheduler, world_size, recorder, stop_after_crash)
        scheduled = _faults.crashes(faults, start, world_size, self.spec, alive_nodes)
        for rank, fault in scheduled.items():
            world.faults.schedule_crash(rank, fault.at, str(fault))

        def rank_context(rank):
            mode = _accounting.rank_accounting(rank, recorder) if recorder else None
            return RankContext(rank, world, mode, _torch_internals.rank_registry())

        def rank_main(rank):
            mode = context.current().accounting
            try:
                if mode is not None:
                    mode.__enter__()
                try:
                    _torch_internals.init_default_group(rank, world_size, world.store)
                    result = fn(*args, **kwargs)
                    if rank not in world.faults.deaths:   # (a dead rank that caught its death)
                        results[rank] = result
                except BaseException:
                    # A dead rank unwinds with ProcessDied, which torch may have wrapped
                    # on the way (a C++ caller): its death is known, whatever the type.
                    if rank not in world.faults.deaths:
                        raise
                finally:
                    if mode is not None:
                        mode.__exit__(None, None, None)
                        recorder.memories[rank].close()
            finally:
                _torch_internals.destroy_rank_groups()

        # Every process-wide change of the attempt is in force in this block only.
        with _torch_internals.patched(_RUN_HOOKS):
            try:
                scheduler.run(rank_main, rank_context)
            except DeadlockError:
                # After a crash, survivors may wait for each other where no watchdog sees
                # the dead rank (a receive from any source): the crash is what went wrong.
                if not world.faults.deaths:
                    raise
        return world, results, scheduled


def _attempt_seed(schedule_seed, attempt):
    """The schedule seed of one attempt: the run's own first, then another per restart
    (a restarted job does not replay the interleaving of the attempt that crashed)."""
    if schedule_seed is None or attempt == 0:
        return schedule_seed
    return f"{schedule_seed}/restart {attempt}"


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
    rank = context.current().rank
    timeout = kwargs.get("timeout")
    if timeout is not None:
        if not isinstance(timeout, datetime.timedelta) or timeout.total_seconds() <= 0:
            raise ValueError(f"rank {rank}: init_process_group(timeout={timeout!r}) must be "
                             "a positive datetime.timedelta")
        world.faults.timeouts[rank] = timeout.total_seconds()
    for key, actual in (("world_size", world.world_size), ("rank", rank)):
        wanted = kwargs.get(key, -1)
        if wanted not in (-1, None, actual):
            raise ValueError(f"rank {rank}: init_process_group({key}={wanted}) does not match "
                             f"the simulated run ({key} is {actual})")
    if not dist.is_initialized():
        _torch_internals.init_default_group(rank, world.world_size, world.store)
    return True



# What the run's patches report to (see simcluster._torch_internals.RunHooks).
_RUN_HOOKS = _torch_internals.RunHooks(
    registry=lambda: getattr(context.current(), "registry", None),
    on_storage_resize=_accounting.on_storage_resize,
    on_parameter=_accounting.on_parameter,
    on_init_process_group=_learner_init_process_group,
    on_sharded_gradients=_accounting.on_sharded_gradients,
    allocating_as=_accounting.allocating_as,
    on_io=_accounting.on_storage_io,
    on_checkpoint=_accounting.on_checkpoint_saved,
    not_charged=_accounting.NotCharged(),
    bulk=_accounting.bulk,
    on_forward_pre=_accounting.on_forward_pre,
    on_forward_post=_accounting.on_forward_post,
    on_optimizer_pre=_accounting.on_optimizer_pre,
    on_optimizer_post=_accounting.on_optimizer_post,
)
