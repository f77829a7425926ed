"""The rank scheduler: N ranks as threads, exactly one running at a time.

Why threads that take turns, instead of threads that run freely?

* **Determinism.** A rank runs until it must wait (for a collective, a ``recv``, a
  ``wait()``); then the baton passes to the next rank, round-robin, that can make progress.
  The interleaving is therefore a pure function of the program, and so are the results.
* **Per-rank process state.** Each rank keeps its own random-number state (torch,
  ``random``, numpy), default dtype and DTensor op handlers, as if it were its own process: they are saved
  when a rank hands over the baton and restored when it gets it back.
* **Other interleavings, on demand.** ``schedule_seed=k`` (``cluster.run``) replaces
  round-robin by a choice drawn from ``random.Random(k)``: which ready rank runs next, and
  which sender a receive from any source matches first (:meth:`RankScheduler.arrival_order`).
  Each seed is one interleaving, the same on every run: a race found under seed k is
  replayed by running with k again (docs/schedule_seed.md). Without a seed nothing is drawn.
* **Never hang.** The scheduler always knows which ranks are waiting and for what. When
  no rank can make progress it raises :class:`~simcluster.DeadlockError` at once, instead
  of hanging the kernel the way a real cluster would. A rank blocked where the scheduler
  cannot see it (a ``threading.Lock`` that another rank holds, a socket) is found by a
  watchdog: see :data:`STALL_LIMIT_S`.
* **The first failure wins.** Once a rank has failed, what happens while the others are
  being stopped (a timeout, a rank that will not stop) is added to that error as a note,
  never put in its place.
"""

import ast
import ctypes
import functools
import inspect
import linecache
import os
import random
import re
import sys
import textwrap
import threading
import time

import numpy as np
import torch

from ._torch_internals import (cpu_stream, default_cpu_stream, dtensor_handlers,
                               numpy_rng_words, set_cpu_stream, set_dtensor_handlers)
from .context import RankContext, bound, current
from .errors import RankError, SimulationError, SimulationTimeout

# Unseeded ranks start from fixed seeds (torch's historical default, and 0), so that even
# a program that never calls manual_seed gives the same results every run.
TORCH_DEFAULT_SEED = 67280421310721
PY_DEFAULT_SEED = 0

# A run whose ranks make no progress at all for this long is stopped, also without a
# timeout. Progress is measured, not total run time: the rank holding the baton either
# reaches a scheduling point or uses CPU time. A rank that computes for minutes inside one
# op keeps using CPU, so it is never stopped; only a rank blocked outside the simulator
# (a lock another rank holds, time.sleep, a socket) lets the limit run out.
STALL_LIMIT_S = 30.0

# How often the notebook's thread checks on a run (the timeout, the stall watchdog).
_CHECK_INTERVAL_S = 0.05

# Once a run is failing, how long the other ranks get to unwind on their own before they
# are interrupted (a rank that catches BaseException in a loop never unwinds).
_ABORT_GRACE_S = 3.0

# A rank that polls ``work.is_completed()`` while no other rank can run is waiting for
# something that will never happen, unless its loop itself unblocks another rank. After
# this many such polls in a row, the poll becomes a wait, so a deadlock is reported.
IDLE_POLL_LIMIT = 1000


class Abort(BaseException):
    """Unwinds a rank's thread when the run is being stopped. Never seen by the learner.

    It derives from BaseException so that a learner's ``except Exception`` does not
    swallow it.
    """


class _ProcessState:
    """What a real process would keep to itself but our threads share: RNGs, dtype, the
    fp32 matmul precision (TF32 or not), the selected CPU stream, and DTensor's table of
    custom op handlers (``loss_parallel()`` edits it on entry and exit).

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
        torch.set_float32_matmul_precision("highest")   # PyTorch's default: no TF32
        set_cpu_stream(default_cpu_stream())
        self.state = _ProcessState.capture()
        self.numpy_words = numpy_rng_words()
        _ProcessState.apply(saved)

    @staticmethod
    def capture():
        return (torch.get_rng_state(), random.getstate(), np.random.get_state(),
                torch.get_default_dtype(), cpu_stream(), dtensor_handlers(),
                torch.get_float32_matmul_precision())

    @staticmethod
    def apply(state):
        torch_rng, py_rng, np_rng, dtype, stream, handlers, matmul = state
        torch.set_float32_matmul_precision(matmul)
        torch.set_rng_state(torch_rng)
        random.setstate(py_rng)
        np.random.set_state(np_rng)
        torch.set_default_dtype(dtype)
        set_cpu_stream(stream)
        set_dtensor_handlers(handlers)

    def save(self):
        """Remember the rank's state as it hands over the baton."""
        np_rng = self.state[2]
        words = numpy_rng_words()
        if words != self.numpy_words or np_rng[3]:   # [3]: a cached Gaussian
            np_rng, self.numpy_words = np.random.get_state(), words
        self.state = (torch.get_rng_state(), random.getstate(), np_rng,
                      torch.get_default_dtype(), cpu_stream(), dtensor_handlers(),
                      torch.get_float32_matmul_precision())
        self.live[0] = (np_rng, words)

    def restore(self):
        """Make the rank's state the live one as it takes the baton back."""
        torch_rng, py_rng, np_rng, dtype, stream, handlers, matmul = self.state
        torch.set_float32_matmul_precision(matmul)
        torch.set_rng_state(torch_rng)
        random.setstate(py_rng)
        set_cpu_stream(stream)
        set_dtensor_handlers(handlers)
        live = self.live[0]
        if live is None or live[1] != self.numpy_words or live[0][3] or np_rng[3]:
            np.random.set_state(np_rng)
        self.live[0] = (np_rng, self.numpy_words)
        torch.set_default_dtype(dtype)


READY, BLOCKED, DONE = "ready", "blocked", "done"


class RankScheduler:
    """Runs ``target(rank)`` for every rank, one rank at a time, deterministically.

    Ranks call :meth:`wait_until` whenever they must wait, and :meth:`poll` when they
    check on something without waiting for it; everything else is internal.
    ``on_deadlock()`` is called (on a rank's thread) when no rank can make progress and
    must return the :class:`SimulationError` to raise from :meth:`run`.
    ``schedule_seed``: None for round-robin, or a seed of ``random.Random`` (an int, or
    a str for a restarted attempt) that picks one interleaving.
    ``timeout``: wall-clock seconds the run may take; ``cpu_timeout``: CPU seconds its
    rank threads may use together (work, which a busy machine does not stretch).
    """

    def __init__(self, world_size, on_deadlock, timeout=None, schedule_seed=None,
                 cpu_timeout=None):
        self.world_size = world_size
        self.timeout = timeout
        self.cpu_timeout = cpu_timeout
        # The only source of scheduling choices under a seed: one rank runs at a time, so
        # the draws happen in the same order on every run with the same seed.
        self._choices = None if schedule_seed is None else random.Random(schedule_seed)
        self._on_deadlock = on_deadlock
        self._go = [threading.Event() for _ in range(world_size)]
        self._finished = threading.Event()
        self._state = [READY] * world_size
        self._ready_when = [None] * world_size
        self._waiting_for = [None] * world_size
        self._process = [None] * world_size
        self._threads = []
        self.current = None
        self.failure = None
        self.aborting = False
        self._abandoned = False  # a rank stuck in C code was left behind
        self._own_timeout = None  # the SimulationTimeout this scheduler reported, if any
        self._told_to_unwind = set()  # ranks of an abandoned run that got their Abort
        self._idle_polls = 0
        self._switches = 0  # scheduling points so far: the watchdog's measure of progress
        self._cpu_clocks = [None] * world_size  # each rank thread's CPU-time clock
        self._cpu_used = [0.0] * world_size  # each rank's CPU seconds, last read
        self._in_learner_code = [False] * world_size  # may a stop be raised in it now?
        self._stop_lock = threading.Lock()

    # ----------------------------------------------------------------- for the ranks
    @property
    def rank(self):
        """The global rank of the calling thread (None outside a rank)."""
        me = current()
        return None if me is None else me.rank

    def waiting_for(self, rank):
        """What ``rank`` is waiting for now, or None if it is running or done."""
        return self._waiting_for[rank] if self._state[rank] == BLOCKED else None

    def is_done(self, rank):
        return self._state[rank] == DONE

    def arrival_order(self, ranks):
        """The order in which a receive from any source looks at ``ranks``' pending sends:
        as given (the lowest rank first), or shuffled under a schedule seed."""
        if self._choices is None:
            return ranks
        ranks = list(ranks)
        self._choices.shuffle(ranks)
        return ranks

    def wait_until(self, ready, what):
        """Let other ranks run until ``ready()`` is true. ``what`` describes the wait."""
        self._check_not_stopped()
        if ready():
            return
        rank = self.rank
        self._state[rank] = BLOCKED
        self._ready_when[rank] = ready
        self._waiting_for[rank] = what
        self._switch(rank)

    def poll(self, ready, what):
        """Return ``ready()``, letting the other ranks run first if it is false.

        A rank that polls (``while not work.is_completed(): ...``) would otherwise keep
        the baton forever and the ranks it waits for would never run. Polls while no other
        rank can run are counted; after :data:`IDLE_POLL_LIMIT` of them in a row the poll
        waits, so that an operation that can never complete is reported as a deadlock.
        """
        rank = self.rank
        if rank is None:   # a thread that is not a rank (DDP's C++ side) only looks
            return ready()
        self._check_not_stopped()
        if ready():
            return True
        if self._next_runnable(rank) != rank:
            self._idle_polls = 0
            self._switch(rank)   # stays READY: it runs again after the others had a turn
        else:
            self._idle_polls += 1
            if self._idle_polls > IDLE_POLL_LIMIT:
                self._idle_polls = 0
                self.wait_until(ready, what)
        return ready()

    def _check_not_stopped(self):
        """Raise Abort in a rank that calls the scheduler while its run is being stopped.

        A rank of a run that is over (abandoned) and comes back anyway has caught the
        Abort that was meant to unwind it (``except BaseException`` in a loop): park it
        for good, so that it can no longer print or draw random numbers into later runs.
        """
        if self._abandoned and self.rank is not None:
            if self.rank in self._told_to_unwind:
                threading.current_thread().name = f"abandoned-sim-rank-{self.rank}"
                threading.Event().wait()
            self._told_to_unwind.add(self.rank)
            raise Abort()
        if self.aborting:
            raise Abort()

    def _switch(self, rank):
        """Hand the baton on and wait until ``rank`` gets it back."""
        self._hand_over(rank)
        self._go[rank].wait()
        self._go[rank].clear()
        if self._abandoned:   # the run ended without us: unwind, touching nothing shared
            self._told_to_unwind.add(rank)
            raise Abort()
        self._take_over(rank)
        if self.aborting:
            raise Abort()

    def fail(self, error):
        """Stop the run with ``error`` (raised from :meth:`run`); unwinds the calling rank."""
        self._record(error)
        self.aborting = True
        raise Abort()

    def _record(self, error, refines=False):
        """Make ``error`` the run's failure, or a note on the failure that came first.

        ``refines``: ``error`` is a better diagnosis of a timeout this scheduler reported
        itself (a rank that did not stop turned out to be blocked outside the simulator),
        so it takes that timeout's place.
        """
        first = self.failure
        if first is None or (refines and first is self._own_timeout):
            self.failure = error
        elif error is not first:
            first.add_note(f"Later, while the run was being stopped: {error}")

    # ------------------------------------------------------------------ for the run
    def run(self, target, context=None):
        """Run ``target(rank)`` on every rank; raise the run's failure, if any.

        ``context(rank)`` makes the rank's :class:`~simcluster.context.RankContext`, on
        the rank's thread once it first holds the baton (default: one that knows only its
        rank); it is bound while ``target`` runs (:func:`simcluster.context.bound`).
        """
        self._context = context or RankContext
        _unsilence_if_done()
        live_numpy = [None]
        self._process = [_ProcessState(live_numpy) for _ in range(self.world_size)]
        notebook_state = _ProcessState.capture()
        self._cpu_at_start = time.process_time()
        self._threads = [
            threading.Thread(target=self._rank_main, args=(rank, target),
                             name=f"sim-rank-{rank}", daemon=True)
            for rank in range(self.world_size)
        ]
        for thread in self._threads:
            thread.start()
        first = 0 if self._choices is None else self._choices.randrange(self.world_size)
        try:
            self.current = first
            self._go[first].set()
            self._wait_for_ranks()
        finally:
            _ProcessState.apply(notebook_state)
        if self.failure is not None:
            raise self.failure

    def _wait_for_ranks(self):
        try:
            self._watch()
        except KeyboardInterrupt:
            self._record(SimulationError("interrupted by the user"))
            if not self._abandoned:   # (a Ctrl-C during a stop has abandoned the run)
                self._stop(self.current)
            raise
        if not self._abandoned:
            for thread in self._threads:
                thread.join()

    def _watch(self):
        """Wait for the ranks; stop them on a timeout, a stall, or a failure they ignore."""
        start = time.monotonic()
        progress, progress_at = self._progress(), start
        aborting_since = None
        while not self._finished.wait(_CHECK_INTERVAL_S):
            now = time.monotonic()
            if self.aborting:   # a failure, but some rank does not unwind
                aborting_since = aborting_since or now
                if now - aborting_since > _ABORT_GRACE_S:
                    self._stop(self.current)
                    return
            if self.timeout is not None and now - start >= self.timeout:
                self._time_out(f"after {self.timeout:g} s of wall-clock time")
                return
            if self.cpu_timeout is not None and self.cpu_used() >= self.cpu_timeout:
                self._time_out(f"when the ranks had used {self.cpu_timeout:g} s of CPU "
                               "time")
                return
            if self._progress() != progress:
                progress, progress_at = self._progress(), now
            elif now - progress_at >= STALL_LIMIT_S:
                stuck = self.current
                self._abandon(stuck, SimulationTimeout(
                    f"rank {stuck} made no progress for {STALL_LIMIT_S:g} s: it reached "
                    "no scheduling point and used no CPU time, so the run was stopped. "
                    f"{_stuck_where(stuck, self._threads)}"))
                return

    def _time_out(self, when):
        """Stop the rank holding the baton: the run went past one of its limits."""
        stuck = self.current
        self._own_timeout = SimulationTimeout(
            f"rank {stuck} was still running {when} (the run's timeout), so the run was "
            "stopped. Is there an infinite loop, or a loop that waits for something no "
            "other rank will do?")
        self._record(self._own_timeout)
        self._stop(stuck)

    def cpu_used(self):
        """CPU seconds the run's rank threads have used so far, together: only one runs
        at a time, so this is the run's own work, however busy the machine is (threads
        torch starts for its parallel ops are not counted)."""
        if not _THREAD_CLOCKS:   # (macOS) the whole process's, since the run began
            return time.process_time() - self._cpu_at_start
        for rank, clock in enumerate(self._cpu_clocks):
            used = None if clock is None else _cpu_time(clock)
            if used is not None:   # (None: not started, or ended: keep its last reading)
                self._cpu_used[rank] = used
        return sum(self._cpu_used)

    def _progress(self):
        """What changes while a run makes progress: scheduling points, and CPU time used
        by the rank holding the baton."""
        clock = self._cpu_clocks[self.current]
        return self._switches, _cpu_time(clock)

    def _stop(self, rank, patience=5.0):
        """Raise Abort inside ``rank``'s function until the run unwinds.

        Only the learner's code is interrupted (never the scheduler's own hand-over), and
        the stop is re-delivered every 10 ms, because Python drops an asynchronous
        exception that lands inside a finalizer. A rank blocked inside C code (an
        ordinary ``threading.Lock``, a socket) never sees it: after ``patience`` seconds
        its thread is abandoned, so that at least the notebook goes on. So is a rank that
        goes on after being stopped (it catches BaseException), and, at once, every rank
        when the user interrupts the stop too (a second Ctrl-C).
        """
        self.aborting = True
        deadline = time.monotonic() + patience
        cpu_before = _cpu_time(self._cpu_clocks[rank])
        try:
            while True:
                self._interrupt(rank)
                if self._finished.wait(0.01):
                    return
                if time.monotonic() > deadline:
                    break
        except KeyboardInterrupt:
            self._abandon(rank, SimulationError("interrupted by the user"))
            raise
        if _cpu_time(self._cpu_clocks[rank]) == cpu_before:
            why = (f"rank {rank} is blocked outside the simulator and cannot be stopped; "
                   f"its thread was abandoned. {_stuck_where(rank, self._threads)}")
        else:
            why = (f"rank {rank} went on running after it was told to stop (does it catch "
                   "BaseException in a loop?); its thread was abandoned.")
        self._abandon(rank, SimulationTimeout(why), refines=True)

    def _abandon(self, rank, error, refines=False):
        """End the run without ``rank``, which is stuck: report ``error``, let the other
        ranks unwind (so that they free their memory), and silence ``rank`` for good."""
        self._record(error, refines)
        self.aborting = True
        self._abandoned = True
        self._interrupt(rank)
        _stop_when_it_wakes(self._threads[rank])
        _silence(self._threads[rank])
        # The other ranks wait for a baton that will never come: let them unwind. Give
        # them a moment to finish, so that they run no code after the notebook has moved
        # on; so does the stuck rank, if one of them held the lock it waits for.
        others = [t for other, t in enumerate(self._threads) if other != rank]
        for other, go in enumerate(self._go):
            if other != rank:
                go.set()
        deadline = time.monotonic() + _ABORT_GRACE_S
        for thread in others:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._threads[rank].join(0.1)
        for thread in self._threads:
            if thread.is_alive():
                _silence(thread)

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
        self._cpu_clocks[rank] = _thread_cpu_clock()
        # torch applies torch.set_num_threads to MKL per thread, at the thread's first
        # parallel ATen op: until then a new thread's matrix multiplies run on MKL's
        # default, every core, and round as the machine's core count splits them. Apply
        # the process's setting now (docs/determinism.md).
        torch.get_num_threads()
        self._go[rank].wait()
        self._go[rank].clear()
        if self._abandoned:   # the run ended before this rank started
            return
        self._take_over(rank)
        try:
            with bound(self._context(rank)):
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
            _end_of_dead_rank()
            # its last reading: an ended thread's clock id may name another thread later
            clock, self._cpu_clocks[rank] = self._cpu_clocks[rank], None
            if clock is not None:
                self._cpu_used[rank] = _cpu_time(clock) or self._cpu_used[rank]
            self._state[rank] = DONE
            self._waiting_for[rank] = None
            self._hand_over(rank)

    def _take_over(self, rank):
        self._switches += 1
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
        """The first rank after ``after`` (round-robin) that can run, or None. Under a
        schedule seed: a random one of the others that can run, else ``after`` if it can
        (as in round-robin, a rank that polls lets every other rank go first)."""
        if self._choices is not None:
            able = [rank for rank in range(self.world_size) if rank != after
                    and self._can_run(rank)]
            if able:
                return self._choices.choice(able)
            return after if self._can_run(after) else None
        for step in range(1, self.world_size + 1):
            rank = (after + step) % self.world_size
            state = self._state[rank]
            if state == DONE:
                continue
            if state == READY or self.aborting or self._ready_when[rank]():
                return rank
        return None

    def _can_run(self, rank):
        state = self._state[rank]
        return state != DONE and (state == READY or self.aborting or self._ready_when[rank]())


# ------------------------------------------------------- how a dead rank stops
# A rank whose simulated process dies (a crash fault, its watchdog, torchrun's stop) must
# run no more of its code: after SIGKILL, a lost node or a SIGTERM without a handler, no
# ``except``, ``finally`` or ``with`` exit of the process runs, and its files keep what
# they held. Python cannot unwind a thread without running its handlers, and a thread
# that is never resumed keeps its stack (the learner's tensors) until the kernel ends. So
# the dying rank unwinds under a trace function (CPython's C-level PyEval_SetTrace) that
# fails every line event of the frames that were on its stack when it died, except the
# simulator's own: each handler of those frames fails at its first line, before it runs,
# and the exception goes on up. The simulator's frames (the rank's bookkeeping: its
# memory, its process groups, the hand-over) run as usual, the thread ends, and its stack
# is freed. A line event of a traced frame fires before the line runs, and a C trace
# function that returns -1 is not switched off (a Python one, sys.settrace's, would be).
_SIM_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_TRACE_LINE = 2   # PyTrace_LINE
_TRACEFUNC = ctypes.PYFUNCTYPE(ctypes.c_int, ctypes.py_object, ctypes.c_void_p,
                               ctypes.c_int, ctypes.c_void_p)
_dead_frames = threading.local()   # .ids: addresses of the frames a dead rank must not run


def _fail_dead_lines(obj, frame, what, arg):
    """The trace function of a dying rank: -1 (the line does not run; the interpreter
    raises SystemError there) for every line of a frame that was on its stack at death."""
    if what == _TRACE_LINE and frame in _dead_frames.ids:
        return -1
    return 0


_fail_dead_lines_c = _TRACEFUNC(_fail_dead_lines)
try:
    _set_trace = ctypes.pythonapi.PyEval_SetTrace
    _set_trace.argtypes, _set_trace.restype = [ctypes.c_void_p, ctypes.py_object], None
except AttributeError:   # not CPython: a dead rank unwinds as an exception, handlers run
    _set_trace = None


def run_no_more_code():
    """The calling rank's process has died: from here on none of its own code runs, only
    the simulator's. Call it just before raising the exception that unwinds the rank."""
    if _set_trace is None or getattr(_dead_frames, "ids", None):
        return
    frames, frame = [], sys._getframe(1)
    while frame is not None and frame.f_code is not RankScheduler._rank_main.__code__:
        if not frame.f_code.co_filename.startswith(_SIM_DIR):
            frames.append(frame)
        frame = frame.f_back
    # (held, so that no later frame can take the address of one that has ended)
    _dead_frames.frames = frames
    _dead_frames.ids = {id(frame) for frame in frames}
    _set_trace(ctypes.cast(_fail_dead_lines_c, ctypes.c_void_p), None)


def _end_of_dead_rank():
    """The dead rank's frames are gone: stop tracing its thread."""
    if getattr(_dead_frames, "ids", None):
        _set_trace(None, None)
        _dead_frames.ids = _dead_frames.frames = None


def _simulation_error_in(exc):
    """The first SimulationError in ``exc``'s chain of causes (``raise ... from``), or None."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, SimulationError):
            return exc
        seen.add(id(exc))
        exc = exc.__cause__
    return None


_THREAD_CLOCKS = hasattr(time, "pthread_getcpuclockid")


def _thread_cpu_clock():
    """The calling thread's CPU-time clock id, or None where there is none (macOS)."""
    try:
        return time.pthread_getcpuclockid(threading.get_ident())
    except (AttributeError, OSError):
        return None


def _cpu_time(clock):
    """CPU seconds used by the thread of ``clock`` (by the whole process without one)."""
    if clock is None:
        return time.process_time()
    try:
        return time.clock_gettime(clock)
    except OSError:   # the thread has ended
        return None


_LOCK_TYPES = (type(threading.Lock()), type(threading.RLock()))
_STDLIB_WAITS = ("threading.py", "queue.py")


def _stuck_where(rank, threads):
    """Where ``rank``'s thread is blocked and, if it can be told, on what: for a message."""
    frame = sys._current_frames().get(threads[rank].ident)
    # Report the learner's line, not the inside of threading.Condition or queue.Queue.
    while frame is not None and frame.f_back is not None and \
            frame.f_code.co_filename.endswith(_STDLIB_WAITS):
        frame = frame.f_back
    if frame is None:
        return ""
    line = linecache.getline(frame.f_code.co_filename, frame.f_lineno).strip()
    where = (f"It is at {frame.f_code.co_filename}:{frame.f_lineno} in "
             f"{frame.f_code.co_name}: `{line}`.")
    lock = _locked_lock_on(line, frame)
    if lock is None:
        return (f"{where} That is code outside the simulator (a lock, a queue, a socket, "
                "time.sleep?), and while a rank waits there no other rank can run: wait "
                "with torch.distributed operations instead.")
    name, obj = lock
    holder = _holder_of(name, obj, rank, threads)
    holder = f"rank {holder} holds" if holder is not None else "is held (by another rank?)"
    return (f"{where} It is blocked on the lock `{name}`, which {holder}. Every rank is a "
            "thread of one Python process, so a lock created at module level is shared "
            "by all ranks (under torchrun each process has its own): create the lock "
            "inside the rank's function, or do not hold it across torch.distributed calls.")


def _holder_of(name, lock, stuck, threads):
    """The rank that holds ``lock``, as far as can be told, or None.

    An RLock knows its owner. For a plain Lock, look for a rank (other than ``stuck``)
    whose code is inside a ``with <name>:`` block.
    """
    owner = re.search(r"owner=(\d+)", repr(lock))
    frames = sys._current_frames()
    for rank, thread in enumerate(threads):
        if owner:
            if thread.ident == int(owner[1]):
                return rank
            continue
        frame = frames.get(thread.ident) if rank != stuck else None
        while frame is not None:
            if frame.f_lineno in _lines_inside_with(frame.f_code, name):
                return rank
            frame = frame.f_back
    return None


@functools.lru_cache(maxsize=1024)
def _lines_inside_with(code, name):
    """The line numbers of ``code`` inside the body of a ``with <name>:`` statement."""
    try:
        lines, first = inspect.getsourcelines(code)
        first = max(first, 1)   # a module's code starts at line 0
        tree = ast.parse(textwrap.dedent("".join(lines)))
    except (OSError, TypeError, SyntaxError):
        return frozenset()
    return frozenset(
        line + first - 1
        for node in ast.walk(tree) if isinstance(node, ast.With)
        and any(ast.unparse(item.context_expr) == name for item in node.items)
        for line in range(node.body[0].lineno, node.end_lineno + 1))


def _locked_lock_on(line, frame):
    """``(name, lock)`` for a locked threading lock named on ``line`` of ``frame``, or None."""
    for name in re.findall(r"[A-Za-z_][\w.]*", line):
        first, *attributes = name.split(".")
        obj = frame.f_locals.get(first, frame.f_globals.get(first))
        for depth, attribute in enumerate([None] + attributes):
            if attribute is not None:   # without running the learner's properties
                obj = inspect.getattr_static(obj, attribute, None)
            if isinstance(obj, _LOCK_TYPES):
                if repr(obj).startswith("<locked"):
                    return ".".join([first] + attributes[:depth]), obj
                break
    return None


class _Silencing:
    """Stands in for ``sys.stdout``/``sys.stderr``: drops what abandoned rank threads write.

    An abandoned rank may wake up long after its run ended (the lock it waited for is
    released); until it reaches the simulator and unwinds, it runs the learner's code,
    which must not print into a later cell.
    """

    def __init__(self, stream):
        self.stream = stream

    def write(self, text):
        if threading.current_thread() in _silenced:
            return len(text)
        return self.stream.write(text)

    def writelines(self, lines):
        for line in lines:
            self.write(line)

    def __getattr__(self, name):
        return getattr(self.stream, name)


_silenced = set()   # the abandoned rank threads


def _silence(thread):
    """Drop everything ``thread`` writes to ``sys.stdout`` and ``sys.stderr`` from now on."""
    _silenced.add(thread)
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        if not isinstance(stream, _Silencing):
            setattr(sys, name, _Silencing(stream))


def _unsilence_if_done():
    """Put the notebook's own streams back once every abandoned thread has ended."""
    _silenced.difference_update([t for t in _silenced if not t.is_alive()])
    if not _silenced:
        for name in ("stdout", "stderr"):
            stream = getattr(sys, name)
            if isinstance(stream, _Silencing):
                setattr(sys, name, stream.stream)


class _Consumed(BaseException):
    """Raised in a throwaway thread to reset CPython's pending-stop flag."""


def _stop_when_it_wakes(thread):
    """Leave a stop pending on ``thread`` (stuck in C code): it raises it as it wakes up.

    A thread that returns from a blocking call checks for a pending asynchronous exception
    as it takes the GIL back, so an abandoned rank unwinds right there and runs at most
    the one call it was blocked in. But until some thread raises one, CPython 3.11 checks
    for a pending exception on every instruction of every thread, which would slow the
    whole kernel down for as long as the thread stays stuck: let a throwaway thread raise
    one, which resets that flag and leaves ``thread``'s own stop in place.
    """
    set_async_exc = ctypes.pythonapi.PyThreadState_SetAsyncExc

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
