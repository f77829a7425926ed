"""The check protocol every lab's checks share.

A check is a function decorated with :func:`check`: it takes the learner's function (or
class), raises :class:`Failure` at the first thing that is wrong, and returns what passed.
The decorator turns that into exactly one printed line and a bool (for the progress
report)::

    ✅ ring all-reduce: passed on world sizes 1, 2, 3, 4, 5, 8, sizes 1, 6, 13, 64
    ❌ ring all-reduce: world size 3, size 6: rank 1, index 4: expected 12, got 7 — Hint: ...

An exercise that still raises the lab's ``NotImplementedError`` is not wrong but not
started (:class:`NotStarted`): its check says so with ⬜, as ``make progress`` does, and
prints the exercise's hint (the ``NotImplementedError``'s message) in full, wrapped::

    ⬜ ring all-reduce: not started — replace the `raise NotImplementedError(...)` line ...
       Hint: send chunk (rank - step) to the right neighbour, p - 1 times

A learner's mistake never reaches the kernel as an exception: :func:`simulate` runs a
case on the cluster and turns an exception on a rank, a deadlock or mismatch (with the
simulator's own hint, which names what the ranks were doing), an infinite loop (stopped
once the ranks used ``TIMEOUT`` seconds of CPU time) into a :class:`Failure` naming the
case.

The rest is shared by the checks of every lesson: :class:`Case` (world size, tensor size
and dtype, ranks per node) and its inputs; :func:`run_in_place`, which runs a function that
works on a tensor in place on every rank; the correctness tests of such runs
(:func:`check_outputs`, :func:`check_p2p_only`, :func:`check_messages_sent`); and budgets
(:func:`budget` for bytes, messages and memory per rank; :func:`cross_node_budget`;
:func:`time_budget`), judged only once the results are correct. :func:`refuse_reference`
answers ❌ when a check is handed the workbook's own answer, or when the learner's code
calls it while the check runs; :func:`on_a_rank` calls a learner's plain function on one
simulated rank, so that one that never returns is stopped; :func:`touch` and :func:`plain`
do the same for the check's own use of what a learner's function returned (an object
whose ``__eq__``, ``__float__`` or ``items()`` loops or raises).
"""

import contextlib
import functools
import importlib
import inspect
import math
import numbers
import os
import sys
import sysconfig
import textwrap
import threading

import torch
import torch.distributed as dist

import simcluster as sc
from simcluster.context import current as current_rank

# CPU seconds a learner's run may use before it counts as an endless loop: every run, plain
# or with accounting, a plain function on one rank (on_a_rank) and the check's handling of
# what a function returned (touch). CPU time, the ranks' own work, not wall-clock time:
# on a busy machine (thirty learners on one server, load 10 on two cores) correct code
# waits for a core far longer than it computes, and a wall-clock limit would call it an
# endless loop. The first run in a process is slow (torch warms up, ~3 s): _warm_up()
# pays that off the learner's clock. Well under `make progress`'s 120 s per cell
# (workbook/progress.py), so on an idle machine a runaway function shows the check's own
# ❌ line, not progress's timeout (tests/test_checking.py).
TIMEOUT = 15.0
ACCOUNTING_TIMEOUT = TIMEOUT   # the same limit; kept apart so tests can shorten each
# The last resort, in wall-clock time, for a run that neither finishes nor uses CPU time
# (its threads blocked outside the simulator, where the stall watchdog would also stop it)
# or a machine so busy that the CPU limit takes this long to be reached: far above it.
WALL_CEILING = 20   # × the CPU limit
WORLD_SIZES = (1, 2, 3, 4, 5, 8)
SIZES = (1, 6, 13, 64)
# How far above a budget a learner's answer may go before it counts as another algorithm.
# bytes: a correct ring's busiest rank sends up to ~2 % more than 2(p-1)/p·n when n does
# not divide by p (its chunks are rounded: 13 elements, not 12.8, at p = 5, n = 64), while
# the nearest wrong answer, a ring with one step too many, sends (2p-1)/(2p-2) of it:
# 1.07× at p = 8. 1.05 lies between (tests/test_checking.py). messages: counts are exact.
# memory, time: a correct answer may keep a temporary more, or order its sends otherwise,
# than the reference; what these budgets catch (a whole copy where a shard belongs, a
# ring whose steps run one link at a time) costs twice as much or more.
TOLERANCE = {"bytes": 1.05, "messages": 1.0, "memory": 1.25, "time": 1.25}

PASS, FAIL, NOT_STARTED = "✅", "❌", "⬜"   # the marks `make progress` shows too
WIDTH = 88   # a hint longer than this is wrapped: a notebook's output cell is that wide


class Failure(Exception):
    """The first thing that is wrong; ``what`` and ``hint`` are what the learner reads."""

    def __init__(self, what, hint):
        super().__init__(what)
        self.what, self.hint = what, hint


class NotStarted(Failure):
    """The learner's code still raises the lab's ``NotImplementedError``: ``hint`` is its
    message, the exercise's own hint."""


def check(name):
    """Decorator for a check called ``name``: the function raises :class:`Failure` or
    returns the text of a pass; the check prints one ✅/❌ line and returns True/False."""

    def decorate(body):
        @functools.wraps(body)
        def run_check(*args, **kwargs):
            try:
                with _exit_refused(), _references_watched() as refused:
                    passed = body(*args, **kwargs)     # (its own ❌ comes first)
                    refused.raise_if_called()
            except NotStarted as failure:
                print(not_started_text(name, failure.hint))
                return False
            except Failure as failure:
                print(f"{FAIL} {name}: {failure.what} — Hint: {failure.hint}")
                return False
            except SystemExit as error:   # learner code the check called: not the cell's end
                failure = raised("your code", error)
                print(f"{FAIL} {name}: {failure.what} — Hint: {failure.hint}")
                return False
            print(f"{PASS} {name}: {passed}")
            return True

        return run_check

    return decorate


def not_started_text(name, hint):
    """The ⬜ verdict on an exercise that still raises the lab's ``NotImplementedError``:
    one line, then the exercise's hint in full, wrapped to fit the output cell."""
    lines = [f"{NOT_STARTED} {name}: not started — {HINTS['not_started']}"]
    if hint:
        lines += textwrap.wrap(f"Hint: {hint}", WIDTH, initial_indent="   ",
                               subsequent_indent="   ", break_on_hyphens=False)
    return "\n".join(lines)


HINTS = {
    "not_started": "replace the `raise NotImplementedError(...)` line with your code.",
    "exception": "read the message above; run your function with cluster.run(...) yourself "
                 "to see the whole traceback.",
    "called": "read the message above; call your function yourself, in a cell, with the "
              "arguments named there to see the whole traceback.",
    "exit": "a check calls your function and reads what it returns: sys.exit() (or exit()) "
            "would end the whole cell, os._exit() the kernel; return a value, or raise an "
            "exception.",
    "timeout": "look for a loop whose condition never changes (a step counter that is "
               "never incremented?).",
    "returned": "a check compares, converts and prints what your function returns: "
                "return plain values (numbers, strings, lists, dicts, tensors), or make "
                "sure your object's methods (__eq__, __float__, __len__, ...) return.",
    "collective": "build it from point-to-point operations only: dist.send, dist.recv, "
                  "dist.isend, dist.irecv, dist.batch_isend_irecv.",
    "no_messages": "ranks are threads here, but on a real cluster they share no memory: "
                   "move the data with send/recv.",
    "unchanged": "every rank must end with the result in `tensor`, written in place "
                 "(tensor += ..., tensor.copy_(...), tensor[a:b] = ..., or received into "
                 "it): check that this rank gets the result, and don't write `tensor = "
                 "...`, which only rebinds a local name.",
    "silent": "this rank took no step at all: check your loop bounds (a ring takes p - 1 "
              "steps per phase) and the conditions that decide who sends.",
    "values": "print what each rank holds after each step, on world size 2 or 3.",
    "shape": "keep `tensor`'s shape: work on tensor.view(-1) or slices of it.",
    "dtype": "keep `tensor`'s dtype: create buffers with torch.empty_like(...) or "
             "dtype=tensor.dtype.",
    "reference": "the exercise is to write it yourself, in the cell above.",
}


def refuse_reference(candidate, reference, what="function"):
    """Fail if ``candidate`` is ``reference`` (the workbook's own answer, or the library's
    own rule) or calls it: the same function or its code, a function whose code names it
    (``lambda t: _reference.ring_allreduce(t)``), or a subclass of the reference class.

    Inside a check, the learner's code is also watched while the check runs it: a call of
    the reference from the learner's code, however it was reached (an import inside the
    function, ``importlib.import_module``, ``__import__``, ``getattr`` on a module), makes
    the check ❌ when it ends, naming what was called (see :class:`_Watch`), unless the
    check failed on its own first."""
    if inspect.isclass(candidate) and inspect.isclass(reference):
        same = issubclass(candidate, reference) or any(
            _uses(getattr(candidate, name, None), getattr(reference, name))
            for name, value in vars(reference).items() if inspect.isfunction(value))
    else:
        same = _uses(candidate, reference)
    if same:
        raise Failure(f"this {what} is the workbook's own reference answer, not yours",
                      HINTS["reference"])
    if _WATCHES:
        _WATCHES[-1].watch(candidate, reference, what)


def _uses(candidate, reference):
    """Whether ``candidate`` is ``reference``, has its code, or names it directly (as a
    global, a closure variable, a default argument or an attribute of a module)."""
    candidate = inspect.unwrap(candidate) if callable(candidate) else candidate
    if candidate is reference:
        return True
    code = getattr(candidate, "__code__", None)
    if code is None:
        return False
    if code is getattr(reference, "__code__", None):     # a class has none
        return True
    found = inspect.getclosurevars(candidate)
    named = [*found.nonlocals.values(), *found.globals.values(),
             *(candidate.__defaults__ or ()), *(candidate.__kwdefaults__ or {}).values()]
    modules = [v for v in named if inspect.ismodule(v)]
    return any(v is reference for v in named) or any(
        getattr(m, name, None) is reference for m in modules for name in code.co_names)


def _codes(obj):
    """The code objects that run when ``obj`` is called: a function's, a class's methods
    (its bases' too, those written in the same module: not torch's ``Function`` or
    ``Module``), a callable object's ``__call__``."""
    obj = inspect.unwrap(obj) if callable(obj) else obj
    if isinstance(obj, functools.partial):
        return _codes(obj.func)
    if not inspect.isclass(obj):
        code = getattr(obj, "__code__", None)
        if code is not None:
            return {code}
        call = getattr(type(obj), "__call__", None)
        return _codes(call) if inspect.isfunction(call) else set()
    found = set()
    for klass in inspect.getmro(obj):
        if klass.__module__ != obj.__module__:
            continue
        for value in vars(klass).values():
            if isinstance(value, (staticmethod, classmethod)):
                value = value.__func__
            parts = (value.fget, value.fset) if isinstance(value, property) else (value,)
            found |= {p.__code__ for p in parts if inspect.isfunction(p)}
    return found


# Where the workbook, the simulator, the standard library and installed packages live: a
# reference called from there was called by them (a check, the scheduler), not by the
# learner's own lines.
_LIBRARY = tuple({os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
                  + name + os.sep for name in ("workbook", "simcluster")}
                 | {sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")})
_WATCHES = []   # one _Watch per check that is running (a check may call another)


class _Watch:
    """What :func:`refuse_reference` asked to watch while one check runs: the code of the
    references, the learner's code, and whether the one called the other.

    A profile function (``sys.setprofile`` on the check's thread, ``threading.setprofile``
    for the rank threads of the runs it starts) sees every Python function that starts.
    A reference's code starting from a line of the learner's own (not the workbook's, the
    simulator's or a library's) while the learner's function is on the stack is a call
    of the reference however its name was found, so nothing in the learner's source can
    hide it. The check's own calls of the reference (its expected answers) have no
    learner's frame under them."""

    def __init__(self):
        self.references = {}     # code -> ("function" / "class", the reference's name)
        self.learner = set()
        self.called = None       # what the learner's code called, once it has
        self.saved = None        # the profile functions in force before

    def watch(self, candidate, reference, what):
        """Watch ``candidate``'s code for calls of ``reference``'s from now on."""
        self.learner |= _codes(candidate)
        name = f"{reference.__module__}.{getattr(reference, '__qualname__', reference)}"
        self.references.update(dict.fromkeys(_codes(reference), (what, name)))
        if self.saved is None:
            self.saved = sys.getprofile(), threading.getprofile()
            references = self.references

            def profile(frame, event, arg):
                # called for every function of the check that starts or ends: cheap first
                if event == "call" and frame.f_code in references:
                    self.note(frame)

            sys.setprofile(profile)
            threading.setprofile(profile)

    def note(self, frame):
        """A reference's code starts in ``frame``: note it if the learner's code called it."""
        if self.called:
            return
        caller = frame.f_back
        if caller is None or caller.f_code.co_filename.startswith(_LIBRARY):
            return
        while caller is not None:
            if caller.f_code in self.learner:
                self.called = self.references[frame.f_code]
                return
            caller = caller.f_back

    def stop(self):
        """Put back the profile functions that were in force before."""
        if self.saved is not None:
            sys.setprofile(self.saved[0])
            threading.setprofile(self.saved[1])

    def raise_if_called(self):
        """The ❌ naming the reference the learner's code called, if it did."""
        if self.called:
            what, name = self.called
            raise Failure(f"your {what} called {name}, which the exercise asks you to "
                          "write yourself", HINTS["reference"])


@contextlib.contextmanager
def _references_watched():
    """A ``with`` block for one check's body: :func:`refuse_reference` inside it watches
    the learner's code until the block ends; yields the :class:`_Watch`."""
    watch = _Watch()
    _WATCHES.append(watch)
    try:
        yield watch
    finally:
        _WATCHES.remove(watch)
        watch.stop()


class ExitCalled(SystemExit):
    """Raised in place of ``os._exit(status)`` called by learner code during a check:
    ``os._exit`` ends the process at once, the notebook's kernel with it."""


@contextlib.contextmanager
def _exit_refused():
    """A ``with`` block in which ``os._exit`` raises :class:`ExitCalled` on the check's
    thread and on the ranks of a simulated run (any other thread still exits, and so does
    a child process forked meanwhile: multiprocessing's end with ``os._exit``)."""
    original, checking_thread, pid = os._exit, threading.get_ident(), os.getpid()

    def _exit(status):
        mine = threading.get_ident() == checking_thread or current_rank() is not None
        if mine and os.getpid() == pid:
            raise ExitCalled(status)
        original(status)

    os._exit = _exit
    try:
        yield
    finally:
        os._exit = original


# ----------------------------------------------------------------- formatting


def num(x):
    """A number as the learner reads it: 12 for 12.0, 0.1235 for 0.123456..."""
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    text = f"{x:.4g}"
    return f"{x:.1f}" if "e+" in text else text


def listed(values):
    """``1, 2, 3``."""
    return ", ".join(str(v) for v in values)


def short(text, limit=140):
    """The first line of ``text``, cut to ``limit`` characters."""
    text = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def seconds(s):
    """Simulated seconds in µs or ms."""
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.3f} ms"


def dtype_name(dtype):
    """``float32`` for ``torch.float32``."""
    return str(dtype).replace("torch.", "")


# ------------------------------------------------------------------ running


def collectives_so_far():
    """``(count, names)`` of the collectives the calling rank has called in this run.

    Read from the simulator's own per-rank record, so no way of calling a collective
    (``dist.all_reduce``, an alias, functional collectives, a subgroup) escapes it.
    """
    names = sc.collectives_called()
    return len(names), names


def _wait_text(text):
    """``"waiting in send to rank 1 (tag 0, (5,)): ..."`` -> ``"send to rank 1"``."""
    text = str(text)
    if text == "returned from its function":
        return "returned"
    if text.startswith("waiting in "):
        text = text[len("waiting in "):]
    return text.split(" (")[0].split(":")[0]


def _deadlock_text(error):
    items = [f"rank {r}: {_wait_text(w)}" for r, w in sorted(error.pending.items())]
    if len(items) > 4:
        items = items[:4] + [f"… ({len(error.pending)} ranks)"]
    return "deadlock (" + "; ".join(items) + ")"


def raised(who, error, hint=None):
    """The :class:`Failure` for ``who`` raising ``error``; a :class:`NotStarted` for the
    lab's ``NotImplementedError``, whose message is the exercise's hint."""
    if isinstance(error, NotImplementedError):
        return NotStarted(f"{who}: not started", str(error).strip())
    if isinstance(error, ExitCalled):
        return Failure(f"{who} called os._exit({error.code!r})", HINTS["exit"])
    if isinstance(error, SystemExit):
        return Failure(f"{who} called sys.exit({error.code!r})", HINTS["exit"])
    return Failure(f"{who} raised {type(error).__name__}: {short(error)}",
                   hint or HINTS["exception"])


def simulate(cluster, body, world_size, where, hints=None, accounting=False, args=(),
             **options):
    """``cluster.run(body, args=args, **options)`` (``options``: ``faults``,
    ``max_restarts``, ...); a learner's failure becomes a :class:`Failure` naming
    ``where(rank)`` (the case a rank was in; rank None: the first failing one).

    A deadlock or mismatch carries the simulator's own hint, which knows what the ranks
    were doing; ``hints`` may override the others (keys of :data:`HINTS`). The ranks may
    use ``TIMEOUT`` seconds of CPU time together (``ACCOUNTING_TIMEOUT`` with accounting).
    """
    hints = {**HINTS, **(hints or {})}
    limit = ACCOUNTING_TIMEOUT if accounting else TIMEOUT
    _warm_up()
    try:
        return cluster.run(body, world_size=world_size, args=args, accounting=accounting,
                           **_limits(limit), **options)
    except sc.RankError as error:
        if isinstance(error.original, Failure):   # a check that runs inside the ranks
            raise error.original from None
        raise raised(f"{where(error.rank)}: rank {error.rank}", error.original,
                     hints["exception"]) from None
    except sc.DeadlockError as error:
        raise Failure(f"{where(None)}: {_deadlock_text(error)}", error.hint) from None
    except sc.CollectiveMismatchError as error:
        text = short(str(error).replace("collective mismatch in ", "mismatch in "), 200)
        raise Failure(f"{where(None)}: {text.rstrip('.')}", error.hint) from None
    except sc.SimulationTimeout as error:
        rank = short(error).split(" ")[:2]
        rank = " ".join(rank) if rank[0] == "rank" else "a rank"
        raise Failure(f"{where(None)}: {rank} was still running "
                      f"{_timeout_text(error, limit, 'the ranks')}", hints["timeout"]) from None
    except sc.SimulationError as error:
        raise Failure(f"{where(None)}: {short(error)}", hints["exception"]) from None


def _limits(limit):
    """``cluster.run``'s limits for a learner's run: ``limit`` seconds of CPU time, and
    :data:`WALL_CEILING` times that of wall-clock time as the last resort."""
    return {"cpu_timeout": limit, "timeout": limit * WALL_CEILING}


def _timeout_text(error, limit, who):
    """When a learner's run was stopped (``error``, a SimulationTimeout) and why, after
    "was still running": ``"after 15 s of work: the ranks used 15 s of CPU time (an
    endless loop?)"`` (``who``: "the ranks")."""
    text = str(error)
    if "CPU time" in text:
        return (f"after {limit:g} s of work: {who} used {limit:g} s of CPU time (an endless "
                "loop?)")
    if "wall-clock" in text:
        return (f"after {limit * WALL_CEILING:g} s of wall-clock time, without using "
                f"{limit:g} s of CPU time (blocked? or a machine far too busy)")
    return "when it was stopped: " + short(text, 200)   # it made no progress (a stall)


_WARM = []


def _warm_up():
    """Once per process, a tiny run with accounting before the first timed learner run:
    torch's first-call costs (~3 s) then never count against the learner's ``TIMEOUT``."""
    if not _WARM:
        def body():
            t = torch.ones(2)
            dist.all_reduce(t)
            return t

        sc.Cluster.preset("dgx-a100").run(body, world_size=2, accounting=True)
        _WARM.append(True)


# ---------------------------------------------------------------- cases and inputs


class Case:
    """One run: ``world_size`` ranks, a tensor of ``size`` elements of ``dtype``, on one
    DGX node, or on nodes of ``ranks_per_node`` devices."""

    def __init__(self, world_size, size, dtype=torch.float32, ranks_per_node=None):
        self.world_size, self.size, self.dtype = world_size, size, dtype
        self.ranks_per_node = ranks_per_node

    def __str__(self):
        text = f"world size {self.world_size}"
        if self.ranks_per_node is not None:
            plural = "s" if self.ranks_per_node > 1 else ""
            text += f" ({self.ranks_per_node} rank{plural} per node)"
        text += f", size {self.size}"
        if self.dtype != torch.float32:
            text += f" ({dtype_name(self.dtype)})"
        return text

    @property
    def element_size(self):
        """Bytes per element."""
        return torch.empty((), dtype=self.dtype).element_size()

    def cluster(self):
        """Nodes of ``ranks_per_node`` devices when the case says so, else one DGX node."""
        if self.ranks_per_node is None:
            return sc.Cluster.preset("dgx-a100", nodes=1)
        k, m = self.ranks_per_node, self.world_size // self.ranks_per_node
        return sc.Cluster(sc.ClusterSpec(f"{m}x{k}", tuple(sc.NodeSpec(f"node{i}", k)
                                                           for i in range(m))))


def cases(world_sizes=WORLD_SIZES, sizes=SIZES, ranks_per_node=None):
    """Every world size with every size; the largest size in float64, so that buffers
    must follow the input's dtype."""
    return [Case(p, n, torch.float64 if n == max(sizes) else torch.float32, ranks_per_node)
            for p in world_sizes for n in sizes]


def passed_text(cases_run):
    """``passed on world sizes 1, 2, sizes 1, 6``."""
    world_sizes = sorted({c.world_size for c in cases_run})
    sizes = sorted({c.size for c in cases_run})
    return f"passed on world sizes {listed(world_sizes)}, sizes {listed(sizes)}"


def integer_input(case, rank):
    """Non-zero integers in [-9, 9]: every order of summation gives the exact same sum."""
    g = torch.Generator().manual_seed(100_003 * case.world_size + 1_009 * case.size + 31 * rank)
    magnitude = torch.randint(1, 10, (case.size,), generator=g)
    sign = torch.randint(0, 2, (case.size,), generator=g) * 2 - 1
    return (magnitude * sign).to(case.dtype)


def normal_input(case, rank, scale=1.0):
    """Standard normal values times ``scale``, different on every rank."""
    g = torch.Generator().manual_seed(7_919 * case.world_size + 613 * case.size + 17 * rank)
    return (torch.randn(case.size, generator=g) * scale).to(case.dtype)


def mse(output, target):
    """Mean squared error: the loss the labs' checks train with."""
    return ((output - target) ** 2).mean()


def first_difference(expected, got, close=None):
    """``(index, expected, got)`` of the first element that differs, or None."""
    e, g = expected.reshape(-1), got.reshape(-1)
    bad = e != g if close is None else ~close(e, g)
    bad |= torch.isnan(g) & ~torch.isnan(e)
    nz = torch.nonzero(bad)
    if len(nz) == 0:
        return None
    i = int(nz[0])
    return i, e[i].item(), g[i].item()


# ------------------------------------------------------- functions on a tensor in place


def run_in_place(fn, case, make_input=integer_input, extra_args=(), accounting=False,
                 hints=None):
    """Run ``fn(tensor, *extra_args)`` on every rank of ``case``; per rank: ``input``,
    ``output`` (the tensor afterwards), ``returned``, ``collectives`` and their names."""

    def body():
        rank = dist.get_rank()
        tensor = make_input(case, rank)
        before = tensor.clone()
        returned = fn(tensor, *extra_args)
        count, names = collectives_so_far()
        return {"input": before, "output": tensor, "returned": returned,
                "collectives": count, "collective_names": names}

    return simulate(case.cluster(), body, case.world_size, lambda rank: str(case), hints,
                    accounting=accounting)


def check_p2p_only(case, run, hints=None):
    """Fail if a rank called a collective where only point-to-point is allowed."""
    for rank, result in enumerate(run.results):
        if result["collectives"]:
            names = result["collective_names"]
            raise Failure(f"{case}: rank {rank} called {names[-1]}, a collective",
                          (hints or {}).get("collective", HINTS["collective"]))


def check_messages_sent(case, run, hints=None):
    """Right values without a single message: the ranks shared Python objects."""
    if case.world_size > 1 and sum(run.messages_sent) == 0:
        raise Failure(f"{case}: no rank sent a point-to-point message",
                      (hints or {}).get("no_messages", HINTS["no_messages"]))


def check_outputs(case, run, expected_for, hints=None, close=None):
    """Fail at the first rank whose tensor has the wrong shape, dtype or values
    (``expected_for(rank)``); a tensor left as it was says so."""
    hints = {**HINTS, **(hints or {})}
    for rank, result in enumerate(run.results):
        out, expected = result["output"], expected_for(rank)
        if tuple(out.shape) != tuple(expected.shape):
            raise Failure(f"{case}: rank {rank}: the tensor has shape {tuple(out.shape)}, "
                          f"expected {tuple(expected.shape)}", hints["shape"])
        if out.dtype != expected.dtype:
            raise Failure(f"{case}: rank {rank}: the tensor has dtype {dtype_name(out.dtype)}"
                          f", expected {dtype_name(expected.dtype)}", hints["dtype"])
    for rank, result in enumerate(run.results):
        out, expected = result["output"], expected_for(rank)
        diff = first_difference(expected, out, close)
        if diff is None:
            continue
        if case.world_size > 1 and torch.equal(out, result["input"]):
            if run.messages_sent[rank] == 0:
                raise Failure(f"{case}: rank {rank} sent no message and left the tensor "
                              "unchanged", hints["silent"])
            returned = isinstance(result["returned"], torch.Tensor)
            extra = " and returned a tensor" if returned else ""
            raise Failure(f"{case}: rank {rank} left the tensor unchanged{extra}",
                          hints["unchanged"])
        index, e, g = diff
        raise Failure(f"{case}: rank {rank}, index {index}: expected {num(e)}, got {num(g)}",
                      hints["values"])


def sum_of_inputs(run):
    """``expected_for`` of an all-reduce (SUM): every rank expects the sum of the inputs."""
    total = run.results[0]["input"].clone()
    for result in run.results[1:]:
        total += result["input"]
    return lambda rank: total


# -------------------------------------------------------------------------- budgets


UNITS = {"bytes": "bytes", "messages": "messages", "memory": "bytes of memory"}


def budget(case, kind, per_rank, target, formula, hint, what):
    """Fail if the busiest rank's ``per_rank`` value of ``kind`` ("bytes", "messages" or
    "memory") is above ``target`` × its tolerance; ``formula`` shows how ``target``
    follows from the case, ``what`` names the algorithm."""
    worst = max(range(len(per_rank)), key=lambda r: per_rank[r])
    got = per_rank[worst]
    if got > target * TOLERANCE[kind]:
        unit = UNITS[kind]
        raise Failure(f"{case}: {what} {'sends' if kind != 'memory' else 'needs'} "
                      f"{formula} = {num(target)} {unit} per rank: rank {worst} "
                      f"{'sent' if kind != 'memory' else 'needed'} {num(got)}, "
                      f"{got / target:.2f}× that", hint)


def cross_node_bytes(case, run):
    """Bytes the run sent between different nodes (needs a run with accounting)."""
    node = case.cluster().spec.placement
    return sum(b for (src, dst), b in run.traffic.items() if node(src)[0] != node(dst)[0])


def cross_node_budget(case, run, target, formula, hint, what):
    """Fail if more than ``target`` bytes (× the bytes tolerance) crossed between nodes."""
    crossing = cross_node_bytes(case, run)
    if crossing > target * TOLERANCE["bytes"]:
        raise Failure(f"{case}: across the nodes {what} sends {formula} = {num(target)} "
                      f"bytes: yours sent {num(crossing)} bytes between nodes, "
                      f"{crossing / target:.2f}× that", hint)


def time_budget(case, run, reference_run, hint, reference_name="reference"):
    """Fail if ``run`` took longer in simulated time than ``reference_run`` × tolerance."""
    elapsed, ref_time = run.elapsed, reference_run.elapsed
    if elapsed > ref_time * TOLERANCE["time"]:
        raise Failure(f"{case}: took {seconds(elapsed)} of simulated time, "
                      f"{elapsed / ref_time:.2f}× the {reference_name}'s {seconds(ref_time)}",
                      hint)


def within_best(where, mine, best, tolerance, what, best_what, hint, show=seconds):
    """The judgment of a choice that works but may be slower than the best one (a cut, a
    set of ZeRO settings, blocks to checkpoint, a 3D layout): fail if ``mine`` seconds are
    more than ``tolerance`` × ``best``, as ``"{where}: {what} {mine}, 1.12× {best_what}"``
    (``mine`` written by ``show``); else return ``mine / best``, for the ✅ line's worst
    ratio."""
    if mine > best * tolerance:
        raise Failure(f"{where}: {what} {show(mine)}, {mine / best:.2f}× {best_what}", hint)
    return mine / best


def answers(checks_module):
    """``_reference = answers(__name__)`` in a lesson's checks module: a function that
    imports the lesson's reference answers (the ``_reference`` module beside it) when a
    check calls it. Checks call it inside their functions only, so importing a lesson's
    checks never loads its answers."""
    package = checks_module.rpartition(".")[0]
    return lambda: importlib.import_module(f"{package}._reference")


def close_within(rtol=1e-5, atol=1e-7):
    """``close(expected, got)`` for :func:`first_difference`: element-wise ``isclose``. The
    default allows float32 rounding of a sum taken in another order; a lesson whose sums
    are longer (a split matmul, Adam's square roots) passes its own tolerance."""
    return lambda e, g: torch.isclose(e, g, rtol=rtol, atol=atol)


# how near a wrong result must be to a multiple of the right one to be called that multiple
SCALE = {"rtol": 1e-4, "atol": 1e-6}
OWN_TEXT = "the gradient is still this rank's own (not averaged)"


def compare_scaled(at, expected, got, parts, hints, own=None, close=None,
                   theirs="the reference", holder="the reference",
                   summed="the sum, not the mean"):
    """Fail at the first element of ``got`` that differs from ``expected`` (bitwise, or by
    ``close``), and say how a mean over ``parts`` (ranks, micro-batches) went wrong:

    * ``got`` is still ``own``, this rank's own gradient: never combined (``hints["own"]``);
    * ``parts`` × ``expected``: the sum, not the mean (``hints["times"]``);
    * 1/``parts`` of it: divided once too often (``hints["over"]``);
    * anything else: ``hints["values"]``.

    ``theirs`` names the expected value (``"DDP's"``), ``holder`` who has it (``"DDP"``)."""
    diff = first_difference(expected, got, close)
    if diff is None:
        return
    i, e, g = diff
    if parts > 1 and own is not None and torch.equal(got, own):
        key, what = "own", OWN_TEXT
    elif parts > 1 and torch.allclose(got, expected * parts, **SCALE):
        key, what = "times", f"{parts}× {theirs} ({summed})"
    elif parts > 1 and torch.allclose(got * parts, expected, **SCALE):
        key, what = "over", f"1/{parts} of {theirs}"
    else:
        key, what = "values", f"differs from {theirs}"
    raise Failure(f"{at}: {what}: element {i} is {num(g)}, {holder} has {num(e)}", hints[key])


# ----------------------------------------------------------- a lock that cannot hang


class LockedTwice(Exception):
    """The learner took a :class:`RecordingLock` while already holding it."""


class RecordingLock:
    """Stands in for a learner's ``threading.Lock``: counts acquisitions, knows if it is
    held, and refuses a second acquisition by the thread that holds it (a real Lock
    would hang)."""

    def __init__(self):
        self._lock = threading.RLock()
        self.acquired = 0
        self.depth = 0
        self._owner = None

    def acquire(self, *args, **kwargs):
        """Take the lock; raises :class:`LockedTwice` if this thread holds it already."""
        if self.depth and self._owner == threading.get_ident():
            raise LockedTwice()
        ok = self._lock.acquire(*args, **kwargs)
        if ok:
            self.acquired += 1
            self.depth += 1
            self._owner = threading.get_ident()
        return ok

    def release(self):
        """Release the lock."""
        self.depth -= 1
        if not self.depth:
            self._owner = None
        self._lock.release()

    def locked(self):
        """Whether some thread holds the lock."""
        return self.depth > 0

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


# ------------------------------------- learner functions called directly, not on ranks
#
# A check that calls a learner's plain function (a formula, a search, a constructor) runs
# it on a one-rank simulated run: the scheduler that stops an infinite loop on the ranks
# of a cluster stops this one too, within the same CPU-time limit, and no thread is left
# running. sys.exit() is caught there as well: in the notebook it would end the cell
# unjudged. So is the check's own use of what such a function returned (touch, plain):
# comparing, hashing, converting or printing a learner's object runs its methods.


def on_a_rank(fn, args, where, hint=None):
    """``fn(*args)`` for a learner's function that runs outside the cluster: on one
    simulated rank (no accounting), so that one that never returns is stopped once it
    used ``TIMEOUT`` seconds of CPU time. An exception, ``sys.exit()`` or the timeout
    becomes a :class:`Failure` naming ``where``; ``hint`` replaces :data:`HINTS`
    ``"called"``."""
    return _on_one_rank(fn, args, where, where, "your function", hint or HINTS["called"])


def touch(operation, where, what="what your function returned"):
    """``operation()``, the check's own use of a learner's object (``lambda:
    float(returned)``, ``lambda: sorted(returned.items())``), run as :func:`on_a_rank`
    runs a learner's function: an object whose ``__eq__``, ``__hash__``, ``__float__``,
    ``__len__``, ``__str__`` or ``items()`` loops, raises or exits gives a :class:`Failure`
    ``"{where}: using {what} ..."`` within the CPU-time limit, never a hang or a
    traceback from the workbook. Touch each learner object through it once, keeping
    what it returns in built-in types (see :func:`plain`)."""
    return _on_one_rank(operation, (), where, f"{where}: using {what}", f"using {what}",
                        HINTS["returned"])


def plain(value, where, what="what your function returned"):
    """A copy of ``value`` in built-in types only, made by :func:`touch`: ``None``,
    ``bool``, ``int``, ``float`` (from any real number), ``str``, tensors (detached
    copies), and ``list``, ``tuple``, ``dict``, ``set`` of those. A check that reads a
    learner's returned value through it runs none of the learner's methods afterwards.
    Any other object is a :class:`Failure` naming its type."""
    return touch(lambda: _plain_copy(value, where, what), where, what)


_BUILT_IN = (bool, int, float, str, type(None))


def _plain_copy(value, where, what):
    """:func:`plain`'s copy, run on a rank: each learner's method it calls is guarded."""
    if type(value) in _BUILT_IN:
        return value
    if isinstance(value, torch.Tensor):
        return value.detach().clone().as_subclass(torch.Tensor)
    if isinstance(value, str):
        return str.__str__(value)     # an exact str, whatever the subclass does
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real):
        return float(value)
    if isinstance(value, list):
        return [_plain_copy(v, where, what) for v in value]
    if isinstance(value, tuple):
        return tuple(_plain_copy(v, where, what) for v in value)
    if isinstance(value, (set, frozenset)):
        return {_plain_copy(v, where, what) for v in value}
    if isinstance(value, dict):
        return {_plain_copy(k, where, what): _plain_copy(v, where, what)
                for k, v in value.items()}
    raise Failure(f"{where}: {what} is a {type(value).__name__}, not a number, a string, "
                  "a tensor, or a list, tuple or dict of those", HINTS["returned"])


def _on_one_rank(fn, args, where, name, who, hint):
    """``fn(*args)`` on one simulated rank, under the CPU-time limit. A failure starts
    with ``name`` (``"f(1)"``) when the code raised, ``where`` when it was stopped, and
    ``who`` says whose code used the time (``"your function"``)."""

    def body():
        try:
            return True, fn(*args)
        except Failure as failure:      # the check's own verdict, from inside (plain)
            return False, failure
        except (Exception, SystemExit, KeyboardInterrupt) as error:  # noqa: BLE001
            return False, error     # the learner's mistake, reported below

    if current_rank() is not None:   # on a rank already: its run's limits guard this too
        returned, value = body()
    else:
        _warm_up()
        try:
            returned, value = sc.Cluster.preset("dgx-a100").run(
                body, world_size=1, accounting=False, **_limits(TIMEOUT)).results[0]
        except sc.SimulationTimeout as error:
            raise Failure(f"{where}: {who} was still running "
                          f"{_timeout_text(error, TIMEOUT, 'it')}", HINTS["timeout"]) from None
        except sc.RankError as error:       # a BaseException no learner should raise
            raise raised(name, error.original, hint) from None
        except sc.SimulationError as error:  # a collective in a plain function, say
            raise Failure(f"{where}: {short(error)}", hint) from None
    if isinstance(value, Failure):
        raise value
    if not returned:
        raise raised(name, value, hint)
    return value


def number(value, where="your function's answer"):
    """``value`` as a float if it is a real number (an int, a float, a numpy number, a
    ``Fraction``, a one-element tensor), else None; a bool is not a number here. A type
    other than int and float is converted by :func:`touch` (a learner's ``__float__``
    may loop or raise: a :class:`Failure` naming ``where``)."""
    if isinstance(value, torch.Tensor) and value.numel() == 1 and not value.dtype.is_complex:
        value = value.item()
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    if type(value) in (int, float):
        return float(value)
    return touch(lambda: float(value), where, "it as a number")
