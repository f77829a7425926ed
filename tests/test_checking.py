"""workbook.checking: the protocol every lab's checks share — the one-line verdict, runs
whose failures become that line, budgets, and refusing the workbook's own answers."""

import sys
import threading

import pytest
import torch
import torch.distributed as dist

import simcluster as sc

from workbook import checking
from workbook.checking import Case, Failure


class FakeRun:
    def __init__(self, per_rank):
        self.bytes_sent = self.messages_sent = per_rank


def test_a_check_prints_one_line_and_returns_a_bool(capsys):
    @checking.check("thing")
    def check_thing(ok):
        if not ok:
            raise Failure("case 1: wrong", "do it right.")
        return "passed on case 1"

    assert check_thing(True) is True
    assert check_thing(False) is False
    assert capsys.readouterr().out == ("✅ thing: passed on case 1\n"
                                       "❌ thing: case 1: wrong — Hint: do it right.\n")


def test_an_unwritten_exercise_is_not_started_and_its_whole_hint_is_wrapped(capsys):
    hint = ("x = inputs[i] on rank 0, else recv into torch.empty(shape) from rank - 1 and "
            "x.requires_grad_(); y = stage(x); on the last rank y = loss_fn(y, targets[i]) / m, "
            "else dist.send(y.detach(), rank + 1); held.append((x, y))")

    @checking.check("GPipe")
    def check_gpipe():
        raise checking.raised("p = 1, m = 3: rank 0", NotImplementedError(hint))

    assert check_gpipe() is False
    first, *rest = capsys.readouterr().out.splitlines()
    assert first == ("⬜ GPipe: not started — replace the `raise NotImplementedError(...)` "
                     "line with your code.")
    assert "❌" not in first and "…" not in first
    assert len(rest) > 1 and all(len(line) <= checking.WIDTH for line in rest)
    assert " ".join(line.strip() for line in rest) == f"Hint: {hint}"   # whole, not cut


@pytest.mark.parametrize("kind, message", [
    ("bytes", "world size 4, size 8: a ring sends 2(p-1)/p·n = 48 bytes per rank: rank 2 "
              "sent 96, 2.00× that"),
    ("messages", "world size 4, size 8: a ring sends 2(p-1)/p·n = 48 messages per rank: rank "
                 "2 sent 96, 2.00× that"),
    ("memory", "world size 4, size 8: a ring needs 2(p-1)/p·n = 48 bytes of memory per rank: "
               "rank 2 needed 96, 2.00× that"),
])
def test_a_budget_names_the_formula_the_busiest_rank_and_the_ratio(kind, message):
    per_rank = [10, 20, 96, 30]
    with pytest.raises(Failure) as info:
        checking.budget(Case(4, 8), kind, per_rank, 48, "2(p-1)/p·n", "hint", "a ring")
    assert info.value.what == message and info.value.hint == "hint"
    checking.budget(Case(4, 8), kind, per_rank, 96 / checking.TOLERANCE[kind], "f", "h", "a")


def test_the_bytes_tolerance_admits_rounded_chunks_and_rejects_a_step_too_many():
    """A correct ring all-reduce of n = 64 on p = 5 ranks sends chunks of 13 elements, not
    12.8: its busiest rank sends 2(p-1)·13 = 104, 1.016× the 2(p-1)/p·n budget. A ring with
    one step too many in a phase sends (2p-1)/p·n: 1.07× the budget at p = 8."""
    checking.budget(Case(5, 64), "bytes", [104] * 5, 2 * 4 / 5 * 64, "2(p-1)/p·n", "h", "a ring")
    p, n = 8, 64
    with pytest.raises(Failure, match=r"1\.07× that"):
        checking.budget(Case(p, n), "bytes", [(2 * p - 1) * n / p] * p, 2 * (p - 1) / p * n,
                        "2(p-1)/p·n", "h", "a ring")


def reference(tensor):
    tensor += 1


class ReferenceServer:
    def pull(self, worker):
        return worker


def _refused(candidate, ref=reference):
    try:
        checking.refuse_reference(candidate, ref)
    except Failure as failure:
        assert failure.what == "this function is the workbook's own reference answer, not yours"
        return True
    return False


def test_refuse_reference_catches_the_reference_and_wrappers_of_it():
    import types
    module = types.ModuleType("answers")
    module.reference = reference
    assert _refused(reference)
    assert _refused(lambda t: reference(t))
    assert _refused(lambda t: module.reference(t))
    assert _refused(lambda t, f=reference: f(t))

    def own(tensor):            # a learner's own code, even with the same name and body
        tensor += 1

    assert not _refused(own)
    assert not _refused(lambda t: own(t))


def test_refuse_reference_catches_a_subclass_or_a_copy_of_the_reference_class():
    class Sub(ReferenceServer):
        pass

    class Copied:
        pull = ReferenceServer.pull

    class Own:
        def pull(self, worker):
            return worker

    for cls, refused in ((ReferenceServer, True), (Sub, True), (Copied, True), (Own, False)):
        try:
            checking.refuse_reference(cls, ReferenceServer, "class")
            assert not refused, cls
        except Failure as failure:
            assert refused and "this class is" in failure.what, cls


def test_a_failure_raised_inside_the_ranks_passes_through_unchanged():
    def body():
        raise Failure("rank-side: wrong", "hint from inside")

    with pytest.raises(Failure) as info:
        checking.simulate(Case(2, 1).cluster(), body, 2, lambda rank: "case")
    assert (info.value.what, info.value.hint) == ("rank-side: wrong", "hint from inside")


def test_a_rank_error_names_the_case_and_the_rank():
    def body():
        if dist.get_rank() == 1:
            raise ValueError("bad value\nsecond line")

    with pytest.raises(Failure) as info:
        checking.simulate(Case(2, 1).cluster(), body, 2, lambda rank: f"case of rank {rank}")
    assert info.value.what == "case of rank 1: rank 1 raised ValueError: bad value"
    assert info.value.hint == checking.HINTS["exception"]


def test_cases_put_the_largest_size_in_float64_and_describe_themselves():
    made = checking.cases((2,), (1, 64), ranks_per_node=1)
    assert [str(c) for c in made] == ["world size 2 (1 rank per node), size 1",
                                      "world size 2 (1 rank per node), size 64 (float64)"]
    assert made[1].element_size == 8 and made[1].dtype == torch.float64
    assert len(made[0].cluster().spec.nodes) == 2


# ---------------------------------- learner functions called directly (issue 24, items 8-9)


def _plain_failure(fn, *args, hint=None):
    with pytest.raises(Failure) as info:
        checking.on_a_rank(fn, args, "f(1)", hint)
    return info.value


def test_a_plain_function_that_never_returns_is_stopped_after_the_timeout(monkeypatch):
    monkeypatch.setattr(checking, "TIMEOUT", 0.5)

    def forever(x):
        while True:
            x += 1

    failure = _plain_failure(forever, 1)
    assert failure.what == ("f(1): your function was still running after 0.5 s of work: "
                            "it used 0.5 s of CPU time (an endless loop?)")
    assert failure.hint == checking.HINTS["timeout"]


@pytest.mark.parametrize("code", [None, 0, 3, "bye"])
def test_sys_exit_in_a_plain_function_is_a_failure_not_the_end_of_the_cell(code):
    import sys

    failure = _plain_failure(lambda: sys.exit(code))
    assert failure.what.startswith("f(1) called sys.exit(") and "SystemExit" not in failure.hint
    assert failure.hint == checking.HINTS["exit"]


def test_an_exception_in_a_plain_function_says_to_call_it_not_to_run_it_on_a_cluster():
    failure = _plain_failure(lambda: 1 / 0)
    assert failure.what == "f(1) raised ZeroDivisionError: division by zero"
    assert "cluster.run" not in failure.hint and failure.hint == checking.HINTS["called"]
    assert _plain_failure(lambda: 1 / 0, hint="mine").hint == "mine"
    unwritten = _plain_failure(lambda: (_ for _ in ()).throw(NotImplementedError("todo")))
    assert isinstance(unwritten, checking.NotStarted)     # ⬜, as make progress says
    assert unwritten.what == "f(1): not started" and unwritten.hint == "todo"


def test_a_plain_function_returns_its_value_and_the_lesson_checks_use_no_other_caller():
    assert checking.on_a_rank(lambda a, b: a + b, (2, 3), "f") == 5
    assert not hasattr(checking, "call")     # one way to call a learner's function


@pytest.mark.parametrize("value, expected", [
    (3, 3.0), (0.25, 0.25), (__import__("fractions").Fraction(1, 4), 0.25),
    (__import__("numpy").float32(0.5), 0.5), (__import__("numpy").int64(7), 7.0),
    (torch.tensor(1.5), 1.5),
    (True, None), (None, None), ("0.5", None), (torch.ones(2), None), ([1], None),
])
def test_number_accepts_every_real_and_nothing_else(value, expected):
    assert checking.number(value) == expected


def test_number_of_a_learner_s_real_that_raises_or_loops_is_a_cross(monkeypatch):
    monkeypatch.setattr(checking, "TIMEOUT", 0.5)
    with pytest.raises(Failure) as info:
        checking.number(_Raising(), "f(1)")
    assert info.value.what == "f(1): using it as a number raised ValueError: no float for you"

    class Endless(float):
        __float__ = _Hostile._forever

    with pytest.raises(Failure, match="used 0.5 s of CPU time"):
        checking.number(Endless(), "f(1)")


def test_every_learner_run_has_one_limit_well_under_progress_cell_timeout():
    # A runaway function must show the check's own ❌, not `make progress`'s cell timeout
    # (120 s): plain and accounting runs alike, with room for the rest of the check.
    import inspect as _inspect

    from workbook import progress

    cell_timeout = _inspect.signature(progress.run_lab).parameters["timeout"].default
    assert checking.ACCOUNTING_TIMEOUT == checking.TIMEOUT
    assert checking.TIMEOUT * 4 <= cell_timeout


def test_an_endless_loop_in_a_run_with_accounting_is_stopped_after_the_same_limit(monkeypatch):
    monkeypatch.setattr(checking, "ACCOUNTING_TIMEOUT", 1.0)

    def forever():
        x = 0
        while True:
            x += 1

    with pytest.raises(Failure) as info:
        checking.simulate(Case(2, 1).cluster(), forever, 2, lambda rank: "case", accounting=True)
    assert "still running after 1 s of work: the ranks used 1 s of CPU time" in info.value.what


@pytest.mark.parametrize("code", [None, 2])
def test_sys_exit_from_learner_code_a_check_calls_itself_is_a_cross(capsys, code):
    import sys

    @checking.check("thing")
    def check_thing(fn):
        fn()
        return "passed"

    assert check_thing(lambda: sys.exit(code)) is False
    out = capsys.readouterr().out
    assert out.startswith(f"❌ thing: your code called sys.exit({code!r})")
    assert checking.HINTS["exit"] in out


def test_sys_exit_on_a_rank_is_a_cross_naming_the_case():
    import sys

    with pytest.raises(Failure) as info:
        checking.simulate(Case(2, 1).cluster(), lambda: sys.exit(1), 2, lambda rank: "case 1")
    assert "called sys.exit(1)" in info.value.what


def test_ctrl_c_is_not_swallowed_by_a_check():
    @checking.check("thing")
    def check_thing():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        check_thing()


# ------------------------------------- loop guards count CPU time (issue 43, item 1)


def test_a_run_that_waits_longer_than_the_limit_but_computes_little_passes(monkeypatch):
    # What a busy machine does to a correct answer: the run takes longer on the wall
    # clock than the limit, while its ranks use little CPU. A wall-clock guard failed it.
    import time

    monkeypatch.setattr(checking, "TIMEOUT", 0.5)

    def waits(x):
        for _ in range(8):
            time.sleep(0.1)     # off the CPU, as a rank waiting for a core is
        return x

    assert checking.on_a_rank(waits, (3,), "f(3)") == 3
    run = checking.simulate(Case(2, 1).cluster(), lambda: waits(1), 2, lambda rank: "case")
    assert run.results == [1, 1]


def test_the_cpu_limit_sums_the_ranks_and_the_wall_clock_is_only_a_far_ceiling(monkeypatch):
    monkeypatch.setattr(checking, "TIMEOUT", 0.5)
    assert checking._limits(0.5) == {"cpu_timeout": 0.5, "timeout": 0.5 * checking.WALL_CEILING}
    assert checking.WALL_CEILING >= 20

    def spins_in_turn():
        while True:            # every rank computes a little, then lets the others go
            sum(range(1000))
            dist.barrier()

    with pytest.raises(Failure) as info:
        checking.simulate(Case(4, 1).cluster(), spins_in_turn, 4, lambda rank: "case")
    assert "after 0.5 s of work: the ranks used 0.5 s of CPU time (an endless loop?)" in (
        info.value.what)


def test_cluster_run_refuses_a_cpu_timeout_that_is_not_a_positive_number():
    cluster = Case(1, 1).cluster()
    for bad, error in (("1", TypeError), (0, ValueError), (float("inf"), ValueError)):
        with pytest.raises(error, match="cpu_timeout"):
            cluster.run(lambda: None, world_size=1, cpu_timeout=bad)


def test_a_run_stopped_by_its_cpu_timeout_says_so_and_how_much_it_used():
    def forever():
        x = 0
        while True:
            x += 1

    cluster = Case(1, 1).cluster()
    with pytest.raises(sc.SimulationTimeout, match="when the ranks had used 0.3 s of CPU"):
        cluster.run(forever, world_size=1, accounting=False, cpu_timeout=0.3, timeout=60)


# ------------------------------ what a learner's function returned, touched safely


class _Hostile:
    """A returned object whose every method a check might call loops for ever."""

    def _forever(self, *args):
        while True:
            pass

    __eq__ = __hash__ = __float__ = __len__ = __str__ = __repr__ = _forever
    __iter__ = items = _forever


class _Raising(float):
    """A 'number' whose conversions raise."""

    def __float__(self):
        raise ValueError("no float for you")

    def __eq__(self, other):
        raise RuntimeError("no comparing either")

    __hash__ = float.__hash__


@pytest.mark.parametrize("use", [
    lambda v: v == 1, lambda v: hash(v), lambda v: float(v), lambda v: len(v),
    lambda v: str(v), lambda v: list(v.items()),
    lambda v: checking.plain(type("Endless", (list,), {"__iter__": _Hostile._forever})(), "f"),
], ids=["eq", "hash", "float", "len", "str", "items", "plain"])
def test_touching_a_returned_object_that_loops_is_a_cross_within_the_cpu_limit(monkeypatch,
                                                                              use):
    import time

    monkeypatch.setattr(checking, "TIMEOUT", 0.5)
    start = time.monotonic()
    with pytest.raises(Failure) as info:
        checking.touch(lambda: use(_Hostile()), "f(1)")
    assert time.monotonic() - start < 0.5 * checking.WALL_CEILING
    assert info.value.what == ("f(1): using what your function returned was still running "
                               "after 0.5 s of work: it used 0.5 s of CPU time (an endless "
                               "loop?)")
    assert info.value.hint == checking.HINTS["timeout"]


def test_touching_a_returned_object_that_raises_or_exits_is_a_cross_naming_it():
    import sys

    with pytest.raises(Failure) as info:
        checking.plain([1, _Raising()], "f(1)", "the list your function returned")
    assert info.value.what == ("f(1): using the list your function returned raised "
                               "ValueError: no float for you")
    assert info.value.hint == checking.HINTS["returned"]
    with pytest.raises(Failure, match="raised RuntimeError: no comparing either"):
        checking.touch(lambda: _Raising() == 1, "f(1)")

    class Exits:
        def __len__(self):
            sys.exit(4)

    with pytest.raises(Failure, match=r"^f\(1\): using what your function returned called "
                                      r"sys\.exit\(4\)"):
        checking.touch(lambda: len(Exits()), "f(1)")


def test_plain_copies_into_built_in_types_and_names_anything_else():
    import fractions

    import numpy as np

    class Name(str):
        def __eq__(self, other):
            raise RuntimeError("never called once plain")

        __hash__ = str.__hash__

    value = {"a": [1, np.float32(0.5), fractions.Fraction(1, 4), (Name("j"), None)],
             "t": torch.ones(2), "s": {3}}
    copied = checking.plain(value, "f")
    assert copied == {"a": [1, 0.5, 0.25, ("j", None)], "t": copied["t"], "s": {3}}
    assert type(copied["a"][3][0]) is str and type(copied["t"]) is torch.Tensor
    assert torch.equal(copied["t"], torch.ones(2)) and copied["t"] is not value["t"]

    class Running:
        pass

    with pytest.raises(Failure) as info:
        checking.plain([Running()], "f(1)", "the list your function returned")
    assert info.value.what == ("f(1): the list your function returned is a Running, not a "
                               "number, a string, a tensor, or a list, tuple or dict of those")


# -------------------------------------- os._exit in learner code (issue 43, item 4)


def _exits():
    import os
    os._exit(3)


def test_os_exit_on_a_rank_in_a_plain_call_or_in_the_check_itself_is_a_cross(capsys):
    import os

    original = os._exit

    @checking.check("thing")
    def check_on_ranks(fn):
        checking.simulate(Case(2, 1).cluster(), fn, 2, lambda rank: "case 1")

    @checking.check("thing")
    def check_plain(fn):
        checking.on_a_rank(fn, (), "f()")

    @checking.check("thing")
    def check_direct(fn):
        fn()

    assert not check_on_ranks(_exits)
    assert capsys.readouterr().out.startswith(
        "❌ thing: case 1: rank 0 called os._exit(3) — Hint: " + checking.HINTS["exit"])
    assert not check_plain(_exits)
    assert capsys.readouterr().out.startswith("❌ thing: f() called os._exit(3)")
    assert not check_direct(_exits)
    assert capsys.readouterr().out.startswith("❌ thing: your code called os._exit(3)")
    assert os._exit is original     # put back after each check


# ------------------------ the reference reached around the names (issue 43, item 5)


_REFERENCE_SOURCE = '''
def ring(tensor):
    tensor += 1
'''


@pytest.fixture
def reference_module(monkeypatch):
    """A module of reference answers, importable by name, as workbook.*._reference is."""
    import types

    module = types.ModuleType("fake_reference_answers")
    exec(compile(_REFERENCE_SOURCE, __file__, "exec"), vars(module))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return module


EVASIONS = {
    "import inside": "def mine(t):\n    from fake_reference_answers import ring\n    ring(t)\n",
    "importlib": "def mine(t):\n    import importlib\n"
                 "    importlib.import_module('fake_reference_answers').ring(t)\n",
    "__import__": "def mine(t):\n    __import__('fake_reference_answers').ring(t)\n",
    "getattr": "import sys\ndef mine(t):\n"
               "    getattr(sys.modules['fake_reference_' + 'answers'], 'r' + 'ing')(t)\n",
    "own helper": "def helper(t):\n    import fake_reference_answers as a\n    a.ring(t)\n"
                  "def mine(t):\n    helper(t)\n",
}


def _check_ring(reference_module):
    @checking.check("ring")
    def check_ring(fn):
        checking.refuse_reference(fn, reference_module.ring)
        t = torch.zeros(1)
        reference_module.ring(t)          # the check's own expected answer: allowed
        checking.simulate(Case(2, 1).cluster(), lambda: fn(torch.zeros(1)), 2,
                          lambda rank: "case")
        return "passed"

    return check_ring


@pytest.mark.parametrize("evasion", EVASIONS)
def test_the_reference_reached_around_its_name_is_refused(capsys, reference_module, evasion):
    from _check_helpers import write_learner

    mine = write_learner(EVASIONS[evasion], {})["mine"]
    assert _check_ring(reference_module)(mine) is False
    assert capsys.readouterr().out.startswith(
        "❌ ring: your function called fake_reference_answers.ring, which the exercise asks "
        "you to write yourself — Hint: " + checking.HINTS["reference"])


def test_own_code_passes_and_the_watch_ends_with_the_check(capsys, reference_module):
    from _check_helpers import write_learner

    mine = write_learner("def mine(t):\n    t += 1\n", {})["mine"]
    before = sys.getprofile(), threading.getprofile()
    assert _check_ring(reference_module)(mine) is True
    assert (sys.getprofile(), threading.getprofile()) == before
    capsys.readouterr()


def test_a_process_forked_during_a_check_still_exits_with_os_exit():
    import os

    @checking.check("thing")
    def check_forks():
        pid = os.fork()
        if pid == 0:          # the child: multiprocessing's fork start ends it so
            os._exit(7)
        assert os.waitpid(pid, 0)[1] >> 8 == 7
        return "passed"

    assert check_forks() is True
