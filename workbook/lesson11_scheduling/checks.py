"""The checks of lab 11 (sharing a cluster), on the protocol of :mod:`workbook.checking`.

* :func:`check_best_fit`: a gang placer that packs: the fullest node that can hold the
  job, else as few nodes as possible with as little left on them; ties to the lower index.
* :func:`check_topology_placer`: one node, else one leaf switch (the one with the least
  room that fits), else the whole tree.
* :func:`check_easy_backfill`: exactly the jobs EASY backfill starts, in queue order.
* :func:`check_choose_victims`: victims that really let the gang start, all preemptible
  and of lower priority, losing no more GPU-seconds than the reference's choice.

Each check computes its expected answers first, on copies of the cases, then calls the
learner's function on all its cases on one simulated rank, each on its own copy, so that a
function that never returns is stopped and one that changes the check's data changes
nothing. What it returns is turned into plain values (ints, strings) on that rank too: an
odd object (a ``Running`` for a name, an ``__eq__`` or ``__index__`` that raises or loops)
is a ❌ line, never a traceback. A ❌ names the first case that is wrong and the mistake
that explains it. The reference answers (:mod:`._reference`) are imported inside the checks
only; the simulator's own rules (:mod:`simcluster.scheduling`) are refused like them.
"""

import copy
import math
import operator

from simcluster import scheduling as sched
from workbook.checking import (Failure, answers, check, listed, num, on_a_rank, raised,
                               refuse_reference, short)
from workbook.hints import Hints


_reference = answers(__name__)

hint = Hints({
    "best_fit": [
        "Sketch [4, 2, 3, 8] and a 2-GPU job, then a 10-GPU one: which node(s) would you "
        "pick so that the 8-GPU node stays whole? Then ask the same with gpus_per_node=4.",
        "Three situations, in this order: gpus_per_node given (only nodes with k free "
        "count, and they give exactly k); one node can hold it all; it must be split. To "
        "split over few nodes, fill the nodes with the most free GPUs completely, one "
        "after another, until the rest fits on one node; put that rest where the least "
        "is left over. In every choice, a tie goes to the lower index.",
    ],
    "topology": [
        "Three levels: a node, a leaf switch, the whole tree. Which is the lowest level "
        "that can hold this gang, and among the candidates at that level, which one "
        "packs best?",
        "A switch's room is what this gang could take beneath it, not just what is free "
        "there: with gpus_per_node=k a node with 8 free still gives only k, one with "
        "fewer than k gives nothing. Choose the switch with the least room that is "
        "enough (ties: the lower index), then let best fit see only its nodes.",
    ],
    "backfill": [
        "Two questions, in order: when could the head start at the earliest, and with "
        "which GPUs? Then, for each later job: does starting it now change that answer?",
        "The running jobs end in time order, whatever order the list is in, and all the "
        "jobs that end at one instant free their GPUs together. A later job "
        "that fits now is safe if it is over by the head's start (careful with when it "
        "starts), or if the head still fits at its start with this job's GPUs still "
        "taken; the jobs you start use up both what is free now and, if they run past "
        "the head's start, what the head will have. A job that cannot start does not "
        "stop you looking at the next.",
    ],
    "victims": [
        "Victims free GPUs all at once, and only a placement of the whole gang counts. "
        "Which jobs may you stop at all, and when is stopping nobody the answer? When "
        "is it None?",
        "The check's bar, a heuristic: grow a set of victims, cheapest first, until the "
        "gang fits (test the placement "
        "each time), then shrink it: try to spare the most expensive first, and once one "
        "is spared its GPUs are no longer freed for the next test.",
    ],
})


def _more(exercise, text):
    """A ❌ hint: what the check found, then where the next step of help is."""
    return f"{text} ({hint.pointer(exercise)})"


def _refuse(fn, *references):
    for reference in references:
        refuse_reference(fn, reference)


class _Odd(Exception):
    """What a learner's function returned cannot be read as the exercise's answer."""

    def __init__(self, what, hint_text):
        super().__init__(what)
        self.what, self.hint = what, hint_text


def _run(fn, name, cases, reference, plain, cause=None):
    """``[(case, expected, answer)]``: the reference's answers, computed first on copies
    of the cases, then ``fn(*case)`` on its own copy of each case, on one simulated rank,
    its answer made plain there (``plain``). An exception, a changed input or an answer
    ``plain`` cannot read becomes a :class:`Failure` naming the case; ``cause(case)`` may
    name the likely mistake behind an exception."""
    expected = [reference(*copy.deepcopy(case)) for case in cases]
    inputs = [copy.deepcopy(case) for case in cases]

    def body():
        out = []
        for case, args in zip(cases, inputs):
            try:
                answer = fn(*args)
            except Exception as error:  # noqa: BLE001 — the learner's mistake, reported
                return out, (case, error)
            if args != case:
                return out, (case, "modified")
            try:
                out.append(plain(answer))
            except _Odd as odd:
                return out, (case, odd)
            except Exception as error:  # noqa: BLE001 — an odd object, reported
                return out, (case, _Odd(f"an object that could not be read "
                                        f"({type(error).__name__})", RETURNED_HINT))
        return out, None

    out, trouble = on_a_rank(body, (), f"{name}(...)")
    if trouble is not None:
        case, error = trouble
        where = f"{name}({_args(case)})"
        if isinstance(error, _Odd):
            raise Failure(f"{where} returned {error.what}", error.hint)
        if isinstance(error, str):      # "modified"
            raise Failure(f"{where} changed its arguments",
                          "work on a copy (free = list(free)): the scheduler still needs "
                          "the cluster as it is.")
        # an unwritten exercise is ⬜ not started (as make progress says), with its hint
        likely = cause(case) if cause is not None else None
        raise raised(where, error, (f"{likely}; " if likely else "") +
                     "call it yourself, in a cell, with these arguments to see the traceback.")
    return list(zip(cases, expected, out))


def _code(value):
    """``value`` as Python a learner can paste into a cell (jobs and running jobs
    short: only the fields the exercise reads)."""
    if isinstance(value, list):
        return "[" + ", ".join(_code(v) for v in value) + "]"
    if isinstance(value, sched.Job):
        k = "" if value.gpus_per_node is None else f", gpus_per_node={value.gpus_per_node}"
        return f"sched.Job({value.name!r}, {value.gpus}, {value.duration!r}{k})"
    if isinstance(value, sched.Running):
        return (f"sched.Running({value.name!r}, {value.taken!r}, {value.priority}, "
                f"{value.preemptible}, {value.lost!r})")
    return repr(value)


def _args(case):
    """The arguments of ``case``, whole, as they could be typed into a call."""
    return ", ".join(_code(a) for a in case)


PLACEMENT_HINT = ("return {node: GPUs taken} (a dict of whole numbers), or None if the job "
                  "does not fit.")
RETURNED_HINT = ("the check reads what your function returns: return plain values (ints, "
                 "strings, lists, dicts), not objects whose methods raise or loop.")
JOB_NAMES_HINT = "return a list of job names (strings): job.name, not the Job objects."
VICTIM_NAMES_HINT = ("return a list of job names (strings): r.name, not the Running objects; "
                     "or None.")


def _placement(answer):
    """``answer`` as a plain {int: int} dict, or None; else :class:`_Odd`."""
    if answer is None:
        return None
    if not isinstance(answer, dict):
        raise _Odd(f"a {type(answer).__name__}", PLACEMENT_HINT)
    out = {}
    for key, value in dict.items(answer):
        if isinstance(key, bool) or isinstance(value, bool):
            raise _Odd("a dict holding True/False", PLACEMENT_HINT)
        try:
            out[operator.index(key)] = operator.index(value)
        except TypeError:
            raise _Odd("a dict whose keys or values are not whole numbers",
                       PLACEMENT_HINT) from None
    return out


def _names(answer, none_ok=False, hint_text=JOB_NAMES_HINT):
    """``answer`` as a plain list of str (or None if ``none_ok``); else :class:`_Odd`."""
    if answer is None and none_ok:
        return None
    if isinstance(answer, list):
        items = list(list.__iter__(answer))
    elif isinstance(answer, tuple):
        items = list(tuple.__iter__(answer))
    else:
        raise _Odd(f"a {type(answer).__name__}", hint_text)
    odd = sorted({type(x).__name__ for x in items if not isinstance(x, str)})
    if odd:
        raise _Odd(f"a list holding {listed(odd)} objects", hint_text)
    return [str.__str__(x) for x in items]


def _names_or_none(answer):
    """What :func:`_names` does, for an answer that may be None."""
    return _names(answer, none_ok=True, hint_text=VICTIM_NAMES_HINT)


def _valid(taken, free, gpus, k, where):
    """Fail unless ``taken`` gives exactly ``gpus`` from free GPUs of existing nodes."""
    for node, n in taken.items():
        if not 0 <= node < len(free) or n < 1:
            raise Failure(f"{where} returned {taken}: keys must be node indices, values "
                          "positive GPU counts", "leave nodes you don't use out of the dict.")
        if n > free[node]:
            raise Failure(f"{where} takes {n} GPUs on node {node}, which has {free[node]} "
                          "free: a GPU given twice", "take at most free[node] on a node.")
        if k is not None and n != k:
            raise Failure(f"{where} takes {n} GPUs on node {node}, but the job asked for "
                          f"gpus_per_node={k}", "with gpus_per_node=k, take exactly k on each "
                          "of gpus // k different nodes.")
    if sum(taken.values()) != gpus:
        raise Failure(f"{where} gives the job {sum(taken.values())} GPUs, it asked for {gpus}",
                      "a gang gets all its GPUs or none: return None if it does not fit.")


def _fits_or_not(taken, expected, where, k, exercise):
    """Fail if one of ``taken`` and ``expected`` is None and the other is not."""
    if expected is None and taken is not None:
        raise Failure(f"{where} returned {taken}, but the job does not fit",
                      "count what is free (and how many nodes have gpus_per_node free) and "
                      "return None when the gang cannot start now.")
    if expected is not None and taken is None:
        cause = ("a node gives a gang with gpus_per_node=k exactly k GPUs if it has k free, "
                 "else none; count the room of nodes and switches that way" if k is not None
                 else "when no single node holds it, a gang may span nodes")
        raise Failure(f"{where} returned None, but the job fits, e.g. {expected}",
                      _more(exercise, cause))


def _shape(taken, free):
    """A placement up to nodes with the same number of free GPUs (what a tie changes)."""
    return sorted((free[n], c) for n, c in taken.items())


def _left(taken, free):
    return sum(free[n] - c for n, c in taken.items())


# ------------------------------------------------------------------------ 1. best fit

# (free GPUs per node, gpus, gpus_per_node)
HETERO_BUSY = [1, 4, 0, 2, 4, 3, 0, 8, 1, 4, 2]
BEST_FIT_CASES = (
    ([4, 2, 3, 8], 2, None),
    ([4, 2, 3, 8], 3, None),
    ([4, 2, 2, 8], 2, None),          # a tie: the lower index
    ([4, 4, 1, 4, 8], 8, None),       # one node holds it exactly
    ([4, 2, 3, 0], 7, None),
    ([8, 6, 3, 2], 10, None),         # the rest goes on the fullest node that holds it
    ([3, 3, 1], 5, None),             # whole nodes tie: the lower index first
    ([3, 3, 3], 4, None),
    ([1, 1, 1, 1], 4, None),          # every free GPU
    ([2, 2], 5, None),                # one GPU short
    ([0, 0, 0], 1, None),
    ([4, 2, 4, 3], 8, 4),
    ([3, 4, 2, 8], 4, 4),
    ([8, 4, 6, 4], 8, 4),             # k per node: the fullest, not the lowest-numbered
    ([4, 4, 4, 4], 8, 4),             # k per node, all tie: the lower indices
    ([3, 3, 3], 4, 4),                # no node has k free
    ([8, 3, 2, 2], 8, 4),             # one node with 2k free still gives k
    ([8, 8], 8, 4),                   # nodes with 2k free give k each, never all they have
    ([6, 5, 8, 3], 8, 4),             # k per node from nodes with more than k free
    (HETERO_BUSY, 16, None),
    (HETERO_BUSY, 8, 8),
    (HETERO_BUSY, 2, None),
)


def _best_fit_cause(free, gpus, k, taken, expected):
    """The mistake that explains a valid placement other than best fit's."""
    if _shape(taken, free) == _shape(expected, free):
        return ("nodes with the same number of free GPUs tie: take the lower-numbered one "
                "first")
    if len(expected) == 1 and len(taken) > 1:
        return "if one node can hold the gang, keep it there (one NVLink domain)"
    if k is not None:
        if taken == sched.first_fit(free, gpus, k):
            return ("these are the lowest-numbered nodes with k free, not the fullest: a "
                    "node with many free GPUs is what a big gang needs later")
        return "with gpus_per_node=k, the fullest nodes (fewest free) that have k free"
    if len(expected) == 1:
        return ("of the nodes that can hold it, the one with the FEWEST free GPUs, so "
                "that whole nodes stay free for big gangs")
    if len(taken) > len(expected):
        return "to use few nodes, fill the nodes with the most free GPUs completely first"
    if _left(taken, free) > _left(expected, free):
        return ("the remainder goes on the fullest node that can hold all of it, so that "
                "as little as possible is left over there")
    return "whole nodes most free first, then the remainder on the fullest node that holds it"


def _judge_best_fit(fn, name="best_fit"):
    """Raise a :class:`Failure` at the first case where ``fn`` is not best fit."""
    ref = _reference()
    for (free, gpus, k), expected, taken in _run(fn, name, BEST_FIT_CASES, ref.best_fit,
                                                 _placement):
        where = f"{name}({free}, {gpus}, {k})"
        _fits_or_not(taken, expected, where, k, "best_fit")
        if taken is None or taken == expected:
            continue
        _valid(taken, free, gpus, k, where)
        raise Failure(f"{where} returned {taken}; best fit takes {expected}",
                      _more("best_fit", _best_fit_cause(free, gpus, k, taken,
                                                        expected)))


@check("best-fit gang placer")
def check_best_fit(fn):
    """``fn(free, gpus, gpus_per_node)``: {node: count} or None, packing the nodes."""
    ref = _reference()
    _refuse(fn, ref.best_fit, sched.best_fit)
    _judge_best_fit(fn)
    return (f"packs {len(BEST_FIT_CASES)} cases: one node when one fits, the fewest GPUs "
            "left, gpus_per_node honoured, ties to the lower index, None when the gang "
            "cannot start")


# ------------------------------------------------------------------- 2. topology-aware

S2 = [[0, 1], [2, 3]]
S3 = [[0, 1], [2, 3], [4, 5]]
S11 = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
TOPOLOGY_CASES = (
    ([4, 2, 4, 4], 2, None, S2),
    ([4, 4, 2, 4], 4, 4, S2),          # k == gpus: one node, the fullest
    ([4, 4, 4, 4, 2, 5], 4, 4, S3),    # k == gpus: one node, not the switch with least room
    ([3, 2, 4, 4], 6, None, S2),
    ([4, 3, 4, 4], 5, None, S2),
    ([4, 4, 3, 3], 6, None, S2),       # both switches fit: the one with less room
    ([2, 2, 2, 2], 4, None, S2),       # switches tie: the lower index
    ([2, 2, 4, 4], 8, None, S2),
    ([3, 3, 3, 3], 10, None, S2),      # only the whole tree holds it
    ([3, 3, 3, 3], 13, None, S2),
    ([4, 4, 2, 4], 8, 4, S2),
    ([4, 1, 4, 4], 8, 4, S2),
    ([8, 0, 4, 4], 8, 4, S2),          # a node with 8 free gives a 4-per-node gang 4
    ([6, 3, 5, 0], 8, 4, S2),          # free, not room, is 9 under switch 0
    ([5, 3, 4, 5], 8, 4, S2),          # switch 0 has 8 free but room 4: switch 1
    (HETERO_BUSY, 6, None, S11),
    (HETERO_BUSY, 8, None, S11),
    (HETERO_BUSY, 12, None, S11),
    (HETERO_BUSY, 8, 4, S11),
)


def _room(free, k, members):
    """What a gang of ``k`` per node (None: any split) could take beneath a switch."""
    return sum(free[n] if k is None else (k if free[n] >= k else 0) for n in members)


def _free_under(free, k, members):
    """A switch's room miscounted as all its free GPUs, whatever ``k``."""
    return sum(free[n] for n in members)


def _switch_choice(free, gpus, k, switches, room):
    """The switch the rule picks when rooms are counted by ``room``, or None."""
    fits = [i for i, members in enumerate(switches) if room(free, k, members) >= gpus]
    return min(fits, key=lambda i: (room(free, k, switches[i]), i), default=None)


def _beneath(free, gpus, k, members):
    """Best fit on the nodes ``members`` alone."""
    return sched.best_fit([f if n in members else 0 for n, f in enumerate(free)], gpus, k)


def _miscounted(free, gpus, k, switches, taken):
    """Whether ``taken`` is what a placer that counts free GPUs as room places: best fit
    on the switch it picks, or on the whole tree when that switch cannot hold the gang."""
    wrong = _switch_choice(free, gpus, k, switches, _free_under)
    if k is None or wrong is None or wrong == _switch_choice(free, gpus, k, switches, _room):
        return False
    return taken in (_beneath(free, gpus, k, switches[wrong]), sched.best_fit(free, gpus, k))


ROOM_CAUSE = ("count a switch's room as what this gang could take there: k from each node "
              "with k free, nothing from the others")


def _topology_error_cause(case):
    """The likely mistake behind an exception on ``case``: a switch picked by its free
    GPUs, on which best fit then finds no placement."""
    free, gpus, k, switches = case
    wrong = _switch_choice(free, gpus, k, switches, _free_under)
    if k is not None and wrong is not None and _room(free, k, switches[wrong]) < gpus:
        return f"switch {wrong} has {_free_under(free, k, switches[wrong])} free GPUs but " \
               f"room for {_room(free, k, switches[wrong])} of this gang: {ROOM_CAUSE}"
    return None


def _topology_cause(free, gpus, k, switches, taken, expected):
    """The mistake that explains a valid placement other than the topology rule's."""
    leaf = {n: i for i, members in enumerate(switches) for n in members}
    want, got = {leaf[n] for n in expected}, {leaf[n] for n in taken}
    if len(expected) == 1:
        if len(taken) > 1:
            return "first try one node: if one can hold the gang, it stays there"
        best = _switch_choice(free, gpus, k, switches, _room)
        if k == gpus and best is not None and taken == _beneath(free, gpus, k,
                                                                 switches[best]):
            return ("with gpus_per_node equal to gpus the gang sits on one node: the "
                    "one-node level comes first for it too, before any switch")
        return _best_fit_cause(free, gpus, k, taken, expected)
    if _miscounted(free, gpus, k, switches, taken):
        return ROOM_CAUSE
    if len(want) > 1 or want == got:
        return ("beneath the switch (or the tree) chosen, place by best fit on its nodes "
                "only: " + _best_fit_cause(free, gpus, k, taken, expected))
    if len(got) > 1:
        return (f"switch {next(iter(want))} alone holds the job: stay under one switch "
                "when one can hold it (the spine is shared)")
    mine, best = next(iter(got)), next(iter(want))
    rooms = [_room(free, k, members) for members in switches]
    if rooms[mine] == rooms[best]:
        return "switches with the same room tie: take the lower-numbered one"
    return (f"switch {mine} has room {rooms[mine]}, switch {best} {rooms[best]}: of the "
            "switches that fit, take the one with the LEAST room (best fit), so that "
            "emptier switches stay free for bigger jobs")


def _calls_best_fit(fn):
    """The learner's ``best_fit`` that ``fn``'s own code calls by that name, if any."""
    code = getattr(fn, "__code__", None)
    helper = getattr(fn, "__globals__", {}).get("best_fit")
    return helper if code is not None and "best_fit" in code.co_names \
        and callable(helper) else None


@check("topology-aware placer")
def check_topology_placer(fn):
    """``fn(free, gpus, gpus_per_node, switches)``: the lowest level of the tree that fits."""
    ref = _reference()
    _refuse(fn, ref.topology_placer, sched.topology)
    for (free, gpus, k, switches), expected, taken in _run(
            fn, "topology_placer", TOPOLOGY_CASES, ref.topology_placer, _placement,
            _topology_error_cause):
        where = f"topology_placer({free}, {gpus}, {k}, {switches})"
        if taken == expected:
            continue
        helper = _calls_best_fit(fn)
        if helper is not None:     # exercise 1's slip: name that cell, not this one
            try:
                _judge_best_fit(helper)
            except Failure:
                raise Failure(f"{where} returned {taken}, and topology_placer calls your "
                              "best_fit, whose own check does not pass yet",
                              "fix best_fit first (exercise 1's ❌ names the case), then "
                              "run this check again.") from None
        _fits_or_not(taken, expected, where, k, "topology")
        _valid(taken, free, gpus, k, where)
        raise Failure(f"{where} returned {taken}; the topology rule takes {expected}",
                      _more("topology", _topology_cause(free, gpus, k, switches, taken,
                                                        expected)))
    return (f"lowest level that fits in {len(TOPOLOGY_CASES)} cases: one node, then the "
            "leaf switch with the least room that fits, then the tree, best fit beneath")


# ---------------------------------------------------------------------- 3. EASY backfill


def _job(name, gpus, duration, k=None):
    return sched.Job(name, gpus, float(duration), gpus_per_node=k)


# (now, free, running [(end, {node: count})], queue: head first)
BACKFILL_CASES = (
    (2.0, [0, 2], [(1000.0, {0: 4, 1: 2})],
     [_job("head", 8, 100), _job("short", 2, 500), _job("too_long", 2, 5000)]),
    (2.0, [0, 2, 4], [(1000.0, {0: 4, 1: 2})],
     [_job("head", 8, 100), _job("side", 2, 5000), _job("side2", 4, 5000)]),
    (0.0, [0, 2, 2], [(300.0, {0: 4}), (900.0, {1: 2, 2: 2})],
     [_job("head", 4, 10, 4), _job("a", 2, 400), _job("b", 1, 200), _job("c", 1, 250),
      _job("d", 2, 100)]),
    # ends exactly at the shadow time: starts
    (0.0, [2, 0], [(100.0, {1: 4})], [_job("head", 6, 50), _job("exact", 2, 100)]),
    # started late: ends after the shadow time although its duration alone does not
    (500.0, [0, 2], [(1000.0, {0: 4, 1: 2})],
     [_job("head", 8, 100), _job("late", 2, 700), _job("early", 2, 400)]),
    # the running list is not in end order
    (0.0, [0, 0, 2], [(900.0, {0: 4}), (300.0, {1: 4})],
     [_job("head", 6, 100), _job("mid", 2, 500), _job("quick", 1, 200)]),
    # a job that cannot start now does not stop the search
    (0.0, [0, 3], [(1000.0, {0: 4, 1: 1})],
     [_job("head", 8, 100), _job("wide", 4, 10), _job("narrow", 2, 5000),
      _job("tiny", 1, 50)]),
    # nothing running ever frees enough for the head: no reservation to protect
    (0.0, [2, 1], [(400.0, {0: 2}), (700.0, {1: 3})],
     [_job("head", 16, 100), _job("long", 2, 9000), _job("one", 1, 9000)]),
    (50.0, [1, 1, 3, 0], [(100.0, {0: 3}), (200.0, {1: 3}), (400.0, {3: 4}),
                          (500.0, {2: 1})],
     [_job("head", 8, 60, 4), _job("x", 3, 1000), _job("y", 1, 120), _job("z", 2, 40),
      _job("w", 1, 10000)]),
    (0.0, [2, 2, 0, 0], [(600.0, {2: 4}), (700.0, {3: 4}), (800.0, {0: 2, 1: 2})],
     [_job("head", 12, 100), _job("p", 2, 50), _job("q", 2, 5000), _job("r", 1, 5000)]),
    (0.0, [1, 0], [(100.0, {1: 4})], [_job("head", 4, 100)]),      # only the head
    # two jobs end at the same instant: the head has both their GPUs at its shadow time
    (0.0, [2, 0, 0], [(100.0, {1: 4}), (100.0, {2: 4})],
     [_job("head", 6, 100), _job("long", 2, 5000)]),
)


def _in_given_order(running, head, free):
    """``running`` with end times that make a release in end order release the jobs in
    the list's order: what a reservation that forgets to sort them computes."""
    then, last = list(free), max((end for end, _ in running), default=0.0) + 1.0
    for i, (end, taken) in enumerate(running):
        for node, n in taken.items():
            then[node] += n
        if sched.first_fit(list(then), head.gpus, head.gpus_per_node) is not None:
            return [(end, t) for _, t in running[:i + 1]] + \
                [(last, t) for _, t in running[i + 1:]]
    return running


def _backfill_cause(now, free, running, queue, names, expected):
    """The mistake that explains ``names`` where EASY backfill starts ``expected``:
    each candidate is EASY backfill itself on inputs changed the way a slip changes them."""
    together = _reference().together

    def easy(now=now, running=together(running), pad=0.0):
        return [job.name for job, _ in sched.easy_backfill(
            now, list(free), running, queue, duration=lambda job, taken: job.duration + pad)]

    shadow, _ = sched.reservation(free, running, queue[0])
    prefix = []
    for job in queue[1:]:
        if job.name not in expected:
            break
        prefix.append(job.name)
    if queue[0].name in names:
        return "queue[0] is the head that does not fit now: backfill starts jobs BEHIND it"
    if names == easy(pad=1.0):
        return ("a job that ends exactly at the shadow time does not delay the head: "
                "ending AT the reservation is allowed")
    if names == easy(now=0.0):
        return ("a job started now ends at now + its duration, not at its duration: "
                "compare that with the shadow time")
    if names == easy(running=_in_given_order(together(running), queue[0], free)):
        return ("the head's reservation comes from the running jobs in the order they END; "
                "the list is not sorted")
    if names == easy(running=running):
        return ("jobs that end at the same time give their GPUs back at the same instant: "
                "at its shadow time the head has the GPUs of all of them, not only of the "
                "first one that is enough")
    if math.isinf(shadow) and not names:
        return ("nothing running ever frees enough for the head: it has no reservation "
                "(an infinite shadow time), so every later job that fits may start")
    if names == prefix:
        return (f"after {listed(prefix) or 'the head'} you stopped looking; a job that "
                "cannot start now does not keep the jobs behind it from starting")
    extra = [n for n in names if n not in expected]
    missing = [n for n in expected if n not in names]
    if extra:
        return (f"starting {listed(extra)} would delay the head past its reservation: a "
                "later job may start only if it ends by the reservation or leaves the "
                "head enough GPUs at that time")
    if missing:
        return (f"{listed(missing)} could start now without delaying the head (it ends "
                "by the reservation, or the head still fits then, next to it)")
    return "go through the queue in order; each job you start takes GPUs from the next"


@check("EASY backfill")
def check_easy_backfill(fn):
    """``fn(now, free, running, queue)``: the names EASY backfill starts, in queue order."""
    ref = _reference()
    _refuse(fn, ref.easy_backfill, sched.easy_backfill)
    for (now, free, running, queue), expected, names in _run(
            fn, "easy_backfill", BACKFILL_CASES, ref.easy_backfill, _names):
        if names == expected:
            continue
        where = (f"at now={num(now)}, free {free}, running {running}, queue "
                 f"{listed([f'{j.name} ({j.gpus} GPUs, {num(j.duration)} s)' for j in queue])}")
        raise Failure(f"{where}: started {listed(names) or 'nothing'}, EASY "
                      f"backfill starts {listed(expected) or 'nothing'}",
                      _more("backfill", _backfill_cause(now, free, running, queue, names,
                                                        expected)))
    return (f"the same jobs as EASY backfill in {len(BACKFILL_CASES)} cases: the head's "
            "reservation never delayed, idle GPUs used")


# ------------------------------------------------------------------ 4. gang-aware victims

R = sched.Running
# (free, running, gpus, gpus_per_node, priority)
VICTIM_CASES = (
    ([4, 0], [R("a", {1: 4}, 0, True, 10.0)], 4, None, 1),          # it fits already
    # the gang fits already and nobody may be stopped anyway: stop nobody
    ([4, 0], [R("top", {1: 4}, 7, True, 5.0)], 4, None, 3),
    ([0, 0], [R("a1", {0: 2}, 0, True, 100.0), R("b1", {1: 2}, 0, True, 100.0),
              R("a2", {0: 2}, 0, True, 150.0), R("b2", {1: 2}, 0, True, 120.0)], 4, 4, 5),
    ([1, 0, 0], [R("cheap", {0: 1}, 0, True, 10.0), R("held", {1: 4}, 1, False, 1.0),
                 R("c2", {0: 2}, 0, True, 20.0), R("big", {2: 4}, 0, True, 500.0)], 4, 4, 3),
    # the cheapest job has the gang's own priority: it may not be stopped
    ([0, 0], [R("peer", {0: 4}, 5, True, 1.0), R("low", {1: 4}, 2, True, 100.0)], 4, None,
     5),
    # a victim spared gives its GPUs back: spare the dearest first, one at a time
    ([0, 0, 0], [R("p", {0: 2}, 0, True, 1.0), R("q", {1: 2}, 0, True, 2.0),
                 R("r", {2: 3}, 0, True, 3.0)], 5, None, 1),
    # candidates exist, but the gang cannot start even if all of them stop
    ([0, 0], [R("a", {0: 2}, 0, True, 5.0), R("pinned", {1: 4}, 0, False, 1.0),
              R("boss", {0: 2}, 9, True, 1.0)], 4, 4, 3),
    ([0, 0], [R("vip", {0: 4}, 9, True, 1.0), R("pinned", {1: 4}, 0, False, 1.0)], 4, None,
     5),
    ([2, 0, 1], [R("x", {1: 2, 2: 1}, 0, True, 300.0), R("y", {1: 2}, 1, True, 50.0),
                 R("z", {2: 2}, 0, True, 40.0)], 5, None, 2),
    ([0, 0, 0, 0, 0, 0, 0, 0], [R(f"s{i}", {i: 2}, 0, True, 10.0 * (i + 1)) for i in range(8)]
     + [R(f"t{i}", {i: 2}, 0, True, 15.0 * (8 - i)) for i in range(8)], 8, 4, 1),
)


def _lost(names, by):
    return sum(by[n].lost for n in names)


def _judge_victims(where, free, running, gpus, k, priority, names, expected):
    """Raise a :class:`Failure` for the first thing wrong with ``names``."""
    by = {r.name: r for r in running}
    if names is not None:
        unknown = [n for n in names if n not in by]
        if unknown or len(set(names)) != len(names):
            raise Failure(f"{where}: returned {short(repr(names), 80)}",
                          "return a list of running job names, each once, or None.")
        for n in names:
            if not by[n].preemptible:
                raise Failure(f"{where}: stopped {n}, which is not preemptible",
                              "only preemptible jobs may be stopped.")
            if by[n].priority >= priority:
                raise Failure(f"{where}: stopped {n}, which has priority {by[n].priority} "
                              f"(not lower than {priority})",
                              "only jobs of LOWER priority may be stopped; a job of the "
                              "same priority keeps its GPUs.")
    if expected is None:
        if names == []:
            raise Failure(f"{where}: returned [] (stop nobody, the gang starts now), but "
                          "it cannot start even if every candidate stops",
                          _more("victims", "[] means the gang fits already; when no "
                                "choice of victims lets it start, return None"))
        if names:
            raise Failure(f"{where}: stopped {listed(names)}, but the gang cannot start "
                          "even if every candidate stops",
                          _more("victims", "stop nobody when the gang still would not "
                                "fit: their work would be lost for nothing; return None"))
        return
    if names is None:
        cause = ("the gang fits already: stop nobody, return []" if not expected else
                 "free whole jobs (all their GPUs) until the gang fits")
        raise Failure(f"{where}: returned None, but stopping "
                      f"{listed(expected) or 'nobody'} lets the gang start",
                      _more("victims", cause))
    freed = list(free)
    for n in names:
        for node, c in by[n].taken.items():
            freed[node] += c
    if sched.first_fit(freed, gpus, k) is None:
        cause = ("pod by pod is not enough: the freed GPUs must hold the whole gang, with "
                 "gpus_per_node on the same nodes; test the placement after each victim"
                 if sum(freed) >= gpus else
                 "you spared too many: a victim you spare keeps its GPUs, so test the next "
                 "spare on what is freed without it")
        raise Failure(f"{where}: stopped {listed(names) or 'nobody'} and the gang still does "
                      f"not start (free then: {freed})", _more("victims", cause))
    lost, best = _lost(names, by), _lost(expected, by)
    if lost > best + 1e-9:
        cause = ("the gang fits already: stop nobody" if not expected else
                 "once the gang fits, spare every victim it does not need" if
                 set(expected) < set(names) else
                 "add victims cheapest first, and when sparing, try the dearest first")
        raise Failure(f"{where}: stopping {listed(names)} loses {num(lost)} GPU-seconds; "
                      f"{listed(expected) or 'nobody'} lose(s) {num(best)}",
                      _more("victims", cause))


@check("gang-aware preemption")
def check_choose_victims(fn):
    """``fn(free, running, gpus, gpus_per_node, priority)``: names to preempt, or None."""
    ref = _reference()
    _refuse(fn, ref.choose_victims, sched.choose_victims)
    for case, expected, names in _run(fn, "choose_victims", VICTIM_CASES, ref.choose_victims,
                                      _names_or_none):
        free, running, gpus, k, priority = case
        where = f"gang of {gpus} GPUs (gpus_per_node={k}) at priority {priority}, free {free}"
        _judge_victims(where, free, running, gpus, k, priority, names, expected)
    return (f"the gang starts in every one of {len(VICTIM_CASES)} cases, stopping only "
            "lower-priority preemptible jobs and losing no more GPU-seconds than needed")
