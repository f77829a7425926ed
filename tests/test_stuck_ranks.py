"""A rank stuck where the simulator cannot reach it must not take the notebook with it."""

import contextlib
import cProfile
import faulthandler
import sys
import threading
import time

import pytest
import torch.distributed

import simcluster as sc


_HELD = threading.Lock()   # held by the test: a rank that takes it blocks in C


def _deadlock_on_a_python_lock():
    if torch.distributed.get_rank() == 0:
        with _HELD:  # blocks in C: no Python exception can be delivered here
            pass
    torch.distributed.barrier()


@contextlib.contextmanager
def _hang_guard(seconds=120):
    """Turn a hung run into a crash with every thread's traceback, not a stuck test run."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def _rank_threads():
    return [t for t in threading.enumerate() if t.name.startswith("sim-rank-")]


def _profiled_rank():
    profiler = cProfile.Profile(time.thread_time)
    profiler.enable()
    try:
        return sum(i for i in range(10_000))
    finally:
        profiler.disable()


def test_rank_blocked_on_a_python_lock_is_abandoned_not_hung():
    cluster = sc.Cluster.preset("dgx-a100")
    _HELD.acquire()
    try:
        with pytest.raises(sc.SimulationTimeout,
                           match=r"rank 0 is blocked outside the simulator"):
            with _hang_guard():
                cluster.run(_deadlock_on_a_python_lock, world_size=4, timeout=0.5)
        # The other ranks, waiting for a baton that never comes, were let go.
        for thread in _rank_threads():
            if thread.name != "sim-rank-0":
                thread.join(timeout=5)
        assert [t.name for t in _rank_threads()] == ["sim-rank-0"]
    finally:
        _HELD.release()   # the stuck rank goes on, finds its run over, and ends
    for thread in _rank_threads():
        thread.join(timeout=5)
    assert _rank_threads() == []
    assert cluster.run(lambda: 7, world_size=2).results == [7, 7]  # still usable
    # A stop left pending on the stuck thread kept CPython's eval breaker set, and a
    # profiled rank (as benchmarks/profile_sim.py runs) then never finished.
    assert cluster.run(_profiled_rank, world_size=2, timeout=10).results == [49995000] * 2


def test_runs_leave_the_notebooks_excepthook_alone():
    hook = sys.excepthook
    cluster = sc.Cluster.preset("dgx-a100")
    cluster.run(lambda: None, world_size=2)
    cluster.run(lambda: None, world_size=2)
    assert sys.excepthook is hook
