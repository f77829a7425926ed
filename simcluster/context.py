"""Who the calling thread is: the :class:`RankContext` of one simulated rank.

A rank is a thread. Everything that needs to know which rank is running — the scheduler,
the backend, accounting, torch's process-group registry (through
:class:`~simcluster._torch_internals.RunHooks`) — reads it here, from one thread-local
that the scheduler binds for the rank's whole turn at the run (:func:`bound`).
"""

import contextlib
import threading
from dataclasses import dataclass


@dataclass(frozen=True)
class RankContext:
    """One rank of one run attempt.

    Attributes:
        rank: the global rank.
        world: the :class:`~simcluster.backend.SimWorld` the ranks of the attempt share
            (None for a bare scheduler).
        accounting: the rank's :class:`~simcluster.accounting.RankAccounting` (None with
            accounting off).
        registry: the rank's own torch process-group registry
            (:func:`~simcluster._torch_internals.rank_registry`).
    """

    rank: int
    world: object = None
    accounting: object = None
    registry: object = None


_local = threading.local()


def current():
    """The calling thread's :class:`RankContext`, or None outside a rank."""
    return getattr(_local, "context", None)


@contextlib.contextmanager
def bound(context):
    """A ``with`` block in which ``context`` is the calling thread's :class:`RankContext`."""
    _local.context = context
    try:
        yield context
    finally:
        _local.context = None
