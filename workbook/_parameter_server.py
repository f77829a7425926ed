"""Lesson 02's parameter server: the answer to lab 02's ``check_parameter_server``,
which lesson 10's demos run again with failures. It lives here, outside both lesson
packages, so that neither imports the other; like a ``_reference`` module, import it only
inside a function (lesson 02's ``_reference`` re-exports it, and the check refuses it).
"""

import threading

import torch


class ParameterServer:
    """The parameters, and the rules for reading and updating them.

    ``mode``:

    * ``"sync"`` — :meth:`push` only stores a gradient; :meth:`sync` applies the mean of
      one gradient from every worker at once. A worker that pushed must wait (``pull``
      returns None) until that has happened.
    * ``"async"`` — every :meth:`push` is applied at once; nobody waits. A gradient may
      have been computed on parameters several updates old: its *staleness*.
    * ``"bounded"`` — like async, but a worker more than ``bound`` pushes ahead of the
      slowest worker must wait (stale-synchronous parallel, Ho et al. 2013).

    Ranks are threads, so two workers may call in at once: every method holds
    ``self.lock`` while it reads or writes the state.

    State: ``params`` (flat tensor), ``version`` (updates applied), ``clock[w]`` (pushes
    by worker ``w``), ``pulled[w]`` (the version worker ``w`` last pulled), ``pending``
    (sync mode: ``{worker: gradient}`` of this round), ``staleness`` (async and bounded:
    the staleness of every gradient applied, in order).
    """

    MODES = ("sync", "async", "bounded")

    def __init__(self, params, lr, num_workers, mode="sync", bound=3):
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        self.params = params.detach().clone()
        self.lr, self.num_workers, self.mode, self.bound = lr, num_workers, mode, bound
        self.lock = threading.Lock()
        self.version = 0
        self.clock = [0] * num_workers
        self.pulled = [0] * num_workers
        self.pending = {}
        self.staleness = []

    def pull(self, worker):
        """A copy of the parameters for ``worker``, or None if it must wait."""
        with self.lock:
            if self.mode == "sync" and worker in self.pending:
                return None
            if self.mode == "bounded" and self.clock[worker] - min(self.clock) > self.bound:
                return None
            self.pulled[worker] = self.version
            return self.params.clone()

    def push(self, worker, gradients):
        """Take ``worker``'s gradient, computed on the parameters it last pulled."""
        with self.lock:
            self.clock[worker] += 1
            if self.mode == "sync":
                self.pending[worker] = gradients.detach().clone()
                return
            self.staleness.append(self.version - self.pulled[worker])
            self.params -= self.lr * gradients
            self.version += 1

    def sync(self, all_workers):
        """Sync mode: once every worker in ``all_workers`` has pushed, apply the mean of
        their gradients (in worker order) and start a new round. Returns True if it did."""
        with self.lock:
            if any(w not in self.pending for w in all_workers):
                return False
            mean = torch.stack([self.pending[w] for w in sorted(all_workers)]).mean(dim=0)
            self.params -= self.lr * mean
            self.version += 1
            self.pending.clear()
            return True
