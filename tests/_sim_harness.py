"""torch's own multithreaded test harness, run on the simulated cluster.

``torch.testing._internal``'s ``MultiThreadedTestCase`` (and the classes built on it:
``DTensorOpTestBase``, the multithreaded variant of ``DTensorTestBase``, and
``FSDPTestMultiThread``) runs each test method once per rank, each in a thread of its
own, on torch's in-process ``"threaded"`` backend. :class:`OnTheSim` keeps everything of
the harness but that: the test method runs on the ranks of ``cluster.run`` (the ``"sim"``
backend, its accounting, its per-rank process groups), each rank on a fresh instance of
the test class with ``self.rank`` set, between ``perThreadSetUp`` and ``perThreadTearDown``.
A failing rank fails the test with the simulator's ``RankError`` (its traceback).

Two things the harness changes for the whole process are undone, since the rest of the
suite runs in the same process: importing torch's test utilities freezes
``torch.backends``' flags (``disable_global_flags``: setting ``cudnn.enabled`` raises),
and each test's setUp sets ``TORCH_SHOW_CPP_STACKTRACES=1``, which lengthens every error
message torch raises from C++.
"""

import functools
import os

import torch
import torch.distributed as dist
from torch.testing._internal import common_utils  # noqa: F401  (freezes the flags)

import simcluster as sc

CLUSTER = sc.Cluster.preset("dgx-a100")

torch.backends.flags_frozen.__globals__["__allow_nonbracketed_mutation_flag"] = True


class OnTheSim:
    """Put first among a ``MultiThreadedTestCase`` subclass's bases."""

    def setUp(self):
        saved = os.environ.get("TORCH_SHOW_CPP_STACKTRACES")
        super().setUp()
        if saved is None:
            os.environ.pop("TORCH_SHOW_CPP_STACKTRACES", None)
        else:
            os.environ["TORCH_SHOW_CPP_STACKTRACES"] = saved

    def _spawn_threads(self):
        """The harness's setUp starts its rank threads here: the simulator starts its own
        when the test method is called (see :meth:`join_or_run`)."""

    def join_or_run(self, fn):
        """The harness wraps each test method with this: on the main thread (rank -1) it
        runs the method on every simulated rank, on a rank it runs it."""

        @functools.wraps(fn)
        def wrapper():
            if self.rank != self.MAIN_THREAD_RANK:
                return fn()
            name, cls = self._testMethodName, type(self)

            def rank_main():
                test = cls(name)
                test.rank = dist.get_rank()
                test.perThreadSetUp()
                try:
                    getattr(test, name)()
                finally:
                    test.perThreadTearDown()

            CLUSTER.run(rank_main, world_size=self.world_size)

        return wrapper
