"""The rank scheduler: N ranks as threads, exactly one running at a time.

Why threads that take turns, instead of threads that run freely?

* **Determinism.** A rank runs until it must wait (for a collective, a ``recv``, a
  ``wait()``); then the baton passes to the next rank, round-robin, that can make progress.
  The interleaving is therefore a pure function of the program, and so are the results.
* **Per-rank process state.** Each rank keeps its own random-number state (torch,
  ``random``, numpy) and default dtype, as if it were its own process: they are saved
  when a rank hands over the baton and restored when it gets it back.
* **Never hang.** The scheduler always knows which ranks are waiting and for what. When
  no rank can make progress it raises :class:`~simcluster.DeadlockError` at once, instead
  of hanging the kernel the way a real cluster would.
"""

import ctypes
import random
import threading
import time

import numpy as np
import torch

from ._torch_internals import cpu_stream, default_cpu_stream, numpy_rng_words, set_cpu_stream
from .errors import RankError, SimulationError, SimulationTimeout

# Unseeded ranks start from fixed seeds (torch's historical default, and 0), so that even
# a program that never calls manual_seed gives the same results every run.
TORCH_DEFAULT_SEED = 67280421310721
PY_DEFAULT_SEED = 0


class Abort(BaseException):
    """Unwinds a rank's thread when the run is being stopped. Never seen by the learner.

    It derives from BaseException so that a learner's ``except Exception`` does not
    swallow it.
    """


class _ProcessState:
    """What a real process would keep to itself but our threads share: RNGs, dtype, and
    the selected CPU stream.

    ``live`` is shared by the ranks of one run: ``live[0]`` is numpy's state as it is live
    right now, as (full state, words), or None if unknown. It lets restore() skip
    ``set_state``.
    """

    def __init__(self, live):
        self.live = live
        saved = _ProcessState.capture()
        torch.default_generator.manual_seed(TORCH_DEFAULT_SEED)
        random.seed(PY_DEFAULT_SEED)
        np.random.seed(PY_DEFAULT_SEED)
        torch.set_default_dtype(torch.float32)
        set_cpu_stream(default_cpu_stream())
        self.state = _ProcessState.capture()
        self.numpy_words = numpy_rng_words()
        _ProcessState.apply(saved)

    @staticmethod
    def capture():
        return (torch.get_rng_state(), random.getstate(), np.random.get_state(),
                torch.get_default_dtype(), cpu_stream())

    @staticmethod
    def apply(state):
        torch_rng, py_rng, np_rng, dtype, stream = state
        torch.set_rng_state(torch_rng)
        random.setstate(py_rng)
        np.random.set_state(np_rng)
        torch.set_default_dtype(dtype)
        set_cpu_stream(stream)

    def save(self):
        """Remember the rank's state as it hands over the baton."""
        np_rng = self.state[2]
        words = numpy_rng_words()
        if words != self.numpy_words or np_rng[3]:   # [3]: a cached Gaussian
            np_rng, self.numpy_words = np.random.get_state(), words
        self.state = (torch.get_rng_state(), random.getstate(), np_rng,
                      torch.get_default_dtype(), cpu_stream())
        self.live[0] = (np_rng, words)

    def restore(self):
        """Make the rank's state the live one as it takes the baton back."""
        torch_rng, py_rng, np_rng, dtype, stream = self.state
        torch.set_rng_state(torch_rng)
        random.setstate(py_rng)
        set_cpu_stream(stream)
        live = self.live[0]
        if live is None or live[1] != self.numpy_words or live[0][3] or np_rng[3]:
            np.random.set_state(np_rng)
        self.live[0] = (np_rng, self.numpy_words)
        torch.set_default_dtype(dtype)


READY, BLOCKED, DONE = "ready", "blocked", "done"


class RankScheduler:
    """Runs ``target(rank)`` for every rank, one rank at a time, deterministically.

    Ranks call :meth:`wait_until` whenever they must wait; everything else is internal.
    ``on_deadlock()`` is called (on a rank's thread) when no rank can make progress and
    must return the :class:`SimulationError` to raise from :meth:`run`.
    """

    def __init__(self, world_size, on_deadlock, timeout=None):
        self.world_size = world_size
        self.timeout = timeout
        self._on_deadlock = on_deadlock
        self._go = [threading.Event() for _ in range(world_size)]
        self._finished = threading.Event()
        self._state = [READY] * world_size
        self._ready_when = [None] * world_size
        self._waiting_for = [None] * world_size
        self._process = [None] * world_size
        self._threads = []
        self._local = threading.local()
        self.current = None
        self.failure = None
        self.aborting = False
        self._abandoned = False  # a rank stuck in C code was left behind
        self._in_learner_code = [False] * world_size  # may a stop be raised in it now?
        self._stop_lock = threading.Lock()

    # ----------------------------------------------------------------- for the ranks
    @property
    def rank(self):
        """The global rank of the calling thread (None outside a rank)."""
        return getattr(self._local, "rank", None)

    def waiting_for(self, rank):
        """What ``rank`` is waiting for now, or None if it is running or done."""
        return self._waiting_for[rank] if self._state[rank] == BLOCKED else None

    def is_done(self, rank):
        return self._state[rank] == DONE

    def wait_until(self, ready, what):
        """Let other ranks run until ``ready()`` is true. ``what`` describes the wait."""
        if self.aborting:
            raise Abort()
        if ready():
            return
        rank = self.rank
        self._state[rank] = BLOCKED
        self._ready_when[rank] = ready
        self._waiting_for[rank] = what
        self._hand_over(rank)
        self._go[rank].wait()
        self._go[rank].clear()
        if self._abandoned:   # the run ended without us: unwind, touching nothing shared
            raise Abort()
        self._take_over(rank)
        if self.aborting:
            raise Abort()

    def fail(self, error):
        """Stop the run with ``error`` (raised from :meth:`run`); unwinds the calling rank."""
        if self.failure is None:
            self.failure = error
        self.aborting = True
        raise Abort()

    # ------------------------------------------------------------------ for the run
    def run(self, target):
        """Run ``target(rank)`` on every rank; raise the run's failure, if any."""
        live_numpy = [None]
        self._process = [_ProcessState(live_numpy) for _ in range(self.world_size)]
        notebook_state = _ProcessState.capture()
        self._threads = [
            threading.Thread(target=self._rank_main, args=(rank, target),
                             name=f"sim-rank-{rank}", daemon=True)
            for rank in range(self.world_size)
        ]
        for thread in self._threads:
            thread.start()
        try:
            self.current = 0
            self._go[0].set()
            self._wait_for_ranks()
        finally:
            _ProcessState.apply(notebook_state)
        if self.failure is not None:
            raise self.failure

    def _wait_for_ranks(self):
        try:
            if not self._finished.wait(self.timeout):
                stuck = self.current
                self.failure = SimulationTimeout(
                    f"rank {stuck} was still running after {self.timeout} s of wall-clock "
                    f"time, so the run was stopped. Is there an infinite loop, or a "
                    f"loop that waits for something no other rank will do?")
                self._stop(stuck)
        except KeyboardInterrupt:
            self.failure = self.failure or SimulationError("interrupted by the user")
            self._stop(self.current)
            raise
        if not self._abandoned:
            for thread in self._threads:
                thread.join()

    def _stop(self, rank, patience=5.0):
        """Raise Abort inside ``rank``'s function until the run unwinds.

        Only the learner's code is interrupted (never the scheduler's own hand-over), and
        the stop is re-delivered every 10 ms, because Python drops an asynchronous
        exception that lands inside a finalizer. A rank blocked inside C code (an
        ordinary ``threading.Lock``, a socket) never sees it: after ``patience`` seconds
        its thread is abandoned, so that at least the notebook goes on.
        """
        self.aborting = True
        deadline = time.monotonic() + patience
        while True:
            self._interrupt(rank)
            if self._finished.wait(0.01):
                return
            if time.monotonic() > deadline:
                self._abandoned = True
                _withdraw_stop(self._threads[rank])
                # Let the other ranks' threads unwind (they wait for a baton that will
                # never come), so that they do not keep their models alive.
                for other, go in enumerate(self._go):
                    if other != rank:
                        go.set()
                self.failure = SimulationTimeout(
                    f"rank {rank} is blocked outside the simulator (a threading.Lock, a "
                    "queue, a socket?) and cannot be stopped; its thread was abandoned. "
                    "Wait with torch.distributed operations instead.")
                return

    def _interrupt(self, rank):
        """Raise Abort in ``rank``'s thread if it is still inside the learner's function."""
        with self._stop_lock:
            if self._in_learner_code[rank]:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(
                    ctypes.c_ulong(self._threads[rank].ident), ctypes.py_object(Abort))

    def _leave_learner_code(self, rank):
        """From here on ``rank`` runs only simulator code: no stop may land in it."""
        while True:
            try:
                with self._stop_lock:
                    self._in_learner_code[rank] = False
                # A stop sent just before the flag went down is raised at the next check
                # of the interpreter (a loop or a call): let it surface here. (Clearing it
                # with PyThreadState_SetAsyncExc(id, NULL) would leave CPython checking
                # for one on every instruction of every thread from then on.)
                for _ in range(3):
                    time.sleep(0)
                return
            except Abort:  # the flag is down: no more will come
                continue

    # -------------------------------------------------------------------- internals
    def _rank_main(self, rank, target):
        self._local.rank = rank
        self._go[rank].wait()
        self._go[rank].clear()
        if self._abandoned:   # the run ended before this rank started
            return
        self._take_over(rank)
        try:
            try:
                self._in_learner_code[rank] = True
                if not self.aborting:
                    target(rank)
            finally:
                self._leave_learner_code(rank)
        except Abort:
            pass
        except BaseException as exc:  # noqa: BLE001 — any failure is reported, not raised here
            if not self.aborting:
                # The simulator's own errors (out of memory) are raised as they are, also
                # when a library re-raised them inside its own (DTensor does).
                cause = _simulation_error_in(exc)
                self.failure = cause if cause is not None else RankError(rank, exc)
                self.aborting = True
        finally:
            self._state[rank] = DONE
            self._waiting_for[rank] = None
            self._hand_over(rank)

    def _take_over(self, rank):
        self.current = rank
        self._state[rank] = READY
        self._ready_when[rank] = None
        self._process[rank].restore()

    def _hand_over(self, rank):
        """Pass the baton from ``rank`` to the next rank that can run."""
        if self._abandoned:   # the run is over: the notebook has moved on
            return
        if self._state[rank] != DONE:
            self._process[rank].save()
        else:   # a finished rank's last draws were not saved: numpy's live state is unknown
            self._process[rank].live[0] = None
        nxt = self._next_runnable(rank)
        if nxt is None and not self.aborting and any(s != DONE for s in self._state):
            # Nobody can move: a deadlock. Ask the backend to explain it, then unwind.
            try:
                error = self._on_deadlock()
            except BaseException as exc:  # a bug in the explanation must not hang the kernel
                error = SimulationError(f"deadlock (and explaining it failed: {exc!r})")
            self.failure = self.failure or error
            self.aborting = True
            nxt = self._next_runnable(rank)
        if nxt is None:
            self._finished.set()
        else:
            self.current = nxt
            self._go[nxt].set()

    def _next_runnable(self, after):
        """The first rank after ``after`` (round-robin) that can run, or None."""
        for step in range(1, self.world_size + 1):
            rank = (after + step) % self.world_size
            state = self._state[rank]
            if state == DONE:
                continue
            if state == READY or self.aborting or self._ready_when[rank]():
                return rank
        return None


def _simulation_error_in(exc):
    """The first SimulationError in ``exc``'s chain of causes (``raise ... from``), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, SimulationError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__
    return None


class _Consumed(BaseException):
    """Raised in a throwaway thread to reset CPython's pending-stop flag."""


def _withdraw_stop(thread):
    """Take back a stop that ``thread`` (stuck in C code) will never raise.

    CPython 3.11 checks, on every instruction of every thread, for a pending asynchronous
    exception until some thread raises one. A stop that the stuck thread never raises
    would slow the whole kernel down for good, so withdraw it and let a throwaway thread
    raise one in its place, which resets the flag.
    """
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc
    set_async_exc(ctypes.c_ulong(thread.ident), None)

    def wait_for_it():
        try:
            while True:
                time.sleep(0.001)
        except _Consumed:
            pass

    helper = threading.Thread(target=wait_for_it, daemon=True)
    helper.start()
    set_async_exc(ctypes.c_ulong(helper.ident), ctypes.py_object(_Consumed))
    helper.join(5)
