"""The checks of lab 11 (sharing a cluster), on the protocol of :mod:`workbook.checking`.

* :func:`check_best_fit`: a gang placer that packs: the fullest node that can hold the
  job, else as few nodes as possible with as little left on them.
* :func:`check_topology_placer`: one node, else one leaf switch (the fullest that fits),
  else the whole tree.
* :func:`check_easy_backfill`: exactly the jobs EASY backfill starts, in queue order.
* :func:`check_choose_victims`: victims that really let the gang start, all preemptible
  and of lower priority, losing no more GPU-seconds than the reference's choice.

Each check calls the learner's function on all its cases on one simulated rank, so a
function that never returns is stopped, and works on copies of the inputs. The reference
answers (:mod:`._reference`) are imported inside the checks only; the simulator's own rules
(:mod:`simcluster.scheduling`) are refused like them.
"""

import copy

from simcluster import scheduling as sched
from workbook.checking import (Failure, answers, check, listed, num, on_a_rank, raised,
                               refuse_reference, short)


_reference = answers(__name__)


def _refuse(fn, *references):
    for reference in references:
        refuse_reference(fn, reference)


def _answers(fn, name, cases):
    """``fn(*case)`` for every case (deep copies), on one simulated rank. Returns
    ``[(case, answer)]``; an exception or a changed input becomes a :class:`Failure`."""

    def body():
        out = []
        for case in cases:
            args = copy.deepcopy(case)
            try:
                answer = fn(*args)
            except Exception as error:  # noqa: BLE001 — the learner's mistake, reported
                return out, (case, error)
            if args != case:
                return out, (case, "modified")
            out.append((case, answer))
        return out, None

    out, trouble = on_a_rank(body, (), f"{name}(...)")
    if trouble is not None:
        case, error = trouble
        where = f"{name}({_args(case)})"
        if error == "modified":
            raise Failure(f"{where} changed its arguments",
                          "work on a copy (free = list(free)): the scheduler still needs "
                          "the cluster as it is.")
        # an unwritten exercise is ⬜ not started (as make progress says), with its hint
        raise raised(where, error, "call it yourself, in a cell, with these arguments to "
                                   "see the traceback.")
    return out


def _args(case):
    return short(", ".join(repr(a) for a in case), 120)


def _valid(taken, free, gpus, k, where):
    """Fail unless ``taken`` is {node: count} giving exactly ``gpus`` from free GPUs."""
    if not isinstance(taken, dict):
        raise Failure(f"{where} returned {short(repr(taken), 60)}",
                      "return {node: GPUs taken} (a dict), or None if the job does not fit.")
    for node, n in taken.items():
        if not isinstance(node, int) or not 0 <= node < len(free) or not isinstance(n, int) \
                or n < 1:
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


def _fits_or_not(taken, expected, where):
    """Fail if one of ``taken`` and ``expected`` is None and the other is not."""
    if expected is None and taken is not None:
        raise Failure(f"{where} returned {short(repr(taken), 60)}, but the job does not fit",
                      "count what is free (and how many nodes have gpus_per_node free) and "
                      "return None when the gang cannot start now.")
    if expected is not None and taken is None:
        raise Failure(f"{where} returned None, but the job fits, e.g. {expected}",
                      "when no single node holds it, a gang may span nodes (unless "
                      "gpus_per_node says otherwise).")


def _left(taken, free):
    return sum(free[n] - c for n, c in taken.items())


# ------------------------------------------------------------------------ 1. best fit

# (free GPUs per node, gpus, gpus_per_node)
HETERO_BUSY = [1, 4, 0, 2, 4, 3, 0, 8, 1, 4, 2]
BEST_FIT_CASES = (
    ([4, 2, 3, 8], 2, None),
    ([4, 2, 3, 8], 3, None),
    ([4, 4, 1, 4, 8], 8, None),
    ([4, 2, 3, 0], 7, None),
    ([3, 3, 3], 4, None),
    ([1, 1, 1, 1], 4, None),
    ([4, 2, 4, 3], 8, 4),
    ([3, 4, 2, 8], 4, 4),
    ([2, 2], 5, None),
    ([3, 3, 3], 4, 4),
    ([0, 0, 0], 1, None),
    (HETERO_BUSY, 16, None),
    (HETERO_BUSY, 8, 8),
    (HETERO_BUSY, 2, None),
)


@check("best-fit gang placer")
def check_best_fit(fn):
    """``fn(free, gpus, gpus_per_node)``: {node: count} or None, packing the nodes."""
    ref = _reference()
    _refuse(fn, ref.best_fit, sched.best_fit)
    for (free, gpus, k), taken in _answers(fn, "best_fit", BEST_FIT_CASES):
        where = f"best_fit({free}, {gpus}, {k})"
        expected = ref.best_fit(free, gpus, k)
        _fits_or_not(taken, expected, where)
        if taken is None:
            continue
        _valid(taken, free, gpus, k, where)
        if len(expected) == 1 and len(taken) > 1:
            raise Failure(f"{where} splits the job over {len(taken)} nodes; node "
                          f"{next(iter(expected))} holds all of it",
                          "if one node can hold the gang, keep it there (one NVLink domain).")
        chosen = sorted(free[n] for n in taken)
        best = sorted(free[n] for n in expected)
        if (len(expected) == 1 or k is not None) and chosen != best:
            raise Failure(f"{where} picks node(s) with {listed(chosen)} free; the fullest "
                          f"that fit have {listed(best)}",
                          "best fit: of the nodes that can take it, the one with the FEWEST "
                          "free GPUs, so that whole nodes stay free for big gangs.")
        if len(taken) > len(expected) or _left(taken, free) > _left(expected, free):
            raise Failure(f"{where} uses {len(taken)} node(s) and leaves "
                          f"{_left(taken, free)} GPUs free on them; best fit: "
                          f"{len(expected)} node(s), {_left(expected, free)} left",
                          "when no node holds the job, take whole nodes, most free first, "
                          "then put the rest on the fullest node that holds it.")
    return (f"packs {len(BEST_FIT_CASES)} cases: one node when one fits, the fewest GPUs "
            "left, gpus_per_node honoured, None when the gang cannot start")


# ------------------------------------------------------------------- 2. topology-aware

S2 = [[0, 1], [2, 3]]
S11 = [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 10]]
TOPOLOGY_CASES = (
    ([4, 2, 4, 4], 2, None, S2),
    ([3, 2, 4, 4], 6, None, S2),
    ([4, 3, 4, 4], 5, None, S2),
    ([2, 2, 4, 4], 8, None, S2),
    ([3, 3, 3, 3], 10, None, S2),
    ([3, 3, 3, 3], 13, None, S2),
    ([4, 4, 2, 4], 8, 4, S2),
    ([4, 1, 4, 4], 8, 4, S2),
    (HETERO_BUSY, 6, None, S11),
    (HETERO_BUSY, 8, None, S11),
    (HETERO_BUSY, 12, None, S11),
    (HETERO_BUSY, 8, 4, S11),
)


def _leaf_room(free, k, members):
    return sum(free[n] if k is None else free[n] // k * k for n in members)


@check("topology-aware placer")
def check_topology_placer(fn):
    """``fn(free, gpus, gpus_per_node, switches)``: the lowest level of the tree that fits."""
    ref = _reference()
    _refuse(fn, ref.topology_placer, sched.topology)
    for (free, gpus, k, switches), taken in _answers(fn, "topology_placer", TOPOLOGY_CASES):
        where = f"topology_placer({free}, {gpus}, {k}, {switches})"
        expected = ref.topology_placer(free, gpus, k, switches)
        _fits_or_not(taken, expected, where)
        if taken is None:
            continue
        _valid(taken, free, gpus, k, where)
        leaf = {n: i for i, members in enumerate(switches) for n in members}
        if len(expected) == 1:
            if len(taken) > 1 or free[next(iter(taken))] != free[next(iter(expected))]:
                raise Failure(f"{where} returned {taken}; node {next(iter(expected))} "
                              "alone holds it and is the fullest that does",
                              "first try one node (the fullest that fits), then one switch, "
                              "then the whole cluster.")
            continue
        want = {leaf[n] for n in expected}
        got = {leaf[n] for n in taken}
        if len(want) == 1:
            room = _leaf_room(free, k, switches[next(iter(want))])
            if len(got) > 1:
                raise Failure(f"{where} spans switches {listed(sorted(got))}; switch "
                              f"{next(iter(want))} alone holds the job",
                              "sum the free GPUs under each leaf switch (with gpus_per_node, "
                              "only whole multiples of it per node) and stay under one.")
            if _leaf_room(free, k, switches[next(iter(got))]) != room:
                raise Failure(f"{where} uses switch {next(iter(got))}; the fullest switch "
                              f"that fits is {next(iter(want))} ({room} GPUs of room)",
                              "like Slurm's topology/tree: best fit among switches too, so "
                              "that emptier switches stay free for bigger jobs.")
        if len(taken) > len(expected):
            raise Failure(f"{where} uses {len(taken)} nodes; best fit beneath the switch "
                          f"uses {len(expected)}", "beneath the switch, place by best fit.")
    return (f"lowest level that fits in {len(TOPOLOGY_CASES)} cases: one node, then the "
            "fullest leaf switch, then the tree, best fit beneath")


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
    (50.0, [1, 1, 3, 0], [(100.0, {0: 3}), (200.0, {1: 3}), (400.0, {3: 4}),
                          (500.0, {2: 1})],
     [_job("head", 8, 60, 4), _job("x", 3, 1000), _job("y", 1, 120), _job("z", 2, 40),
      _job("w", 1, 10000)]),
    (0.0, [2, 2, 0, 0], [(600.0, {2: 4}), (700.0, {3: 4}), (800.0, {0: 2, 1: 2})],
     [_job("head", 12, 100), _job("p", 2, 50), _job("q", 2, 5000), _job("r", 1, 5000)]),
)


@check("EASY backfill")
def check_easy_backfill(fn):
    """``fn(now, free, running, queue)``: the names EASY backfill starts, in queue order."""
    ref = _reference()
    _refuse(fn, ref.easy_backfill, sched.easy_backfill)
    for (now, free, running, queue), names in _answers(fn, "easy_backfill",
                                                       BACKFILL_CASES):
        where = f"case with queue {listed([j.name for j in queue])} and free {free}"
        expected = ref.easy_backfill(now, free, running, queue)
        if not isinstance(names, (list, tuple)) or not all(isinstance(n, str) for n in names):
            raise Failure(f"{where}: returned {short(repr(names), 60)}",
                          "return a list of job names (job.name), in queue order.")
        if list(names) == expected:
            continue
        extra = [n for n in names if n not in expected]
        missing = [n for n in expected if n not in names]
        if "head" in names:
            hint = "queue[0] is the head that does not fit now: backfill starts jobs BEHIND it."
        elif extra:
            hint = (f"starting {listed(extra)} would delay the head past its reservation: a "
                    "later job may start only if it ends by the reservation or leaves the "
                    "head enough GPUs at that time.")
        elif missing:
            hint = (f"{listed(missing)} could start now without delaying the head (it ends "
                    "before the reservation, or the head still fits then, next to it).")
        else:
            hint = "go through the queue in order; each job you start takes GPUs from the next."
        raise Failure(f"{where}: started {listed(list(names)) or 'nothing'}, EASY backfill "
                      f"starts {listed(expected) or 'nothing'}", hint)
    return (f"the same jobs as EASY backfill in {len(BACKFILL_CASES)} cases: the head's "
            "reservation never delayed, idle GPUs used")


# ------------------------------------------------------------------ 4. gang-aware victims

R = sched.Running
# (free, running, gpus, gpus_per_node, priority)
VICTIM_CASES = (
    ([0, 0], [R("a1", {0: 2}, 0, True, 100.0), R("b1", {1: 2}, 0, True, 100.0),
              R("a2", {0: 2}, 0, True, 150.0), R("b2", {1: 2}, 0, True, 120.0)], 4, 4, 5),
    ([1, 0, 0], [R("cheap", {0: 1}, 0, True, 10.0), R("held", {1: 4}, 1, False, 1.0),
                 R("c2", {0: 2}, 0, True, 20.0), R("big", {2: 4}, 0, True, 500.0)], 4, 4, 3),
    ([0, 0], [R("vip", {0: 4}, 9, True, 1.0), R("pinned", {1: 4}, 0, False, 1.0)], 4, None,
     5),
    ([2, 0, 1], [R("x", {1: 2, 2: 1}, 0, True, 300.0), R("y", {1: 2}, 1, True, 50.0),
                 R("z", {2: 2}, 0, True, 40.0)], 5, None, 2),
    ([0, 0, 0, 0, 0, 0, 0, 0], [R(f"s{i}", {i: 2}, 0, True, 10.0 * (i + 1)) for i in range(8)]
     + [R(f"t{i}", {i: 2}, 0, True, 15.0 * (8 - i)) for i in range(8)], 8, 4, 1),
    ([4, 0], [R("a", {1: 4}, 0, True, 10.0)], 4, None, 1),
)


def _gpu_seconds(names, running):
    by = {r.name: r for r in running}
    return sum(by[n].lost for n in names)


@check("gang-aware preemption")
def check_choose_victims(fn):
    """``fn(free, running, gpus, gpus_per_node, priority)``: names to preempt, or None."""
    ref = _reference()
    _refuse(fn, ref.choose_victims, sched.choose_victims)
    for case, names in _answers(fn, "choose_victims", VICTIM_CASES):
        free, running, gpus, k, priority = case
        where = f"gang of {gpus} GPUs (gpus_per_node={k}) at priority {priority}, free {free}"
        expected = ref.choose_victims(free, running, gpus, k, priority)
        by = {r.name: r for r in running}
        if names is not None:
            if not isinstance(names, (list, tuple)) or any(n not in by for n in names) \
                    or len(set(names)) != len(names):
                raise Failure(f"{where}: returned {short(repr(names), 60)}",
                              "return a list of running job names (each once), or None.")
            for n in names:
                if not by[n].preemptible or by[n].priority >= priority:
                    why = "not preemptible" if not by[n].preemptible else \
                        f"priority {by[n].priority} (not lower than {priority})"
                    raise Failure(f"{where}: stopped {n}, which is {why}",
                                  "only preemptible jobs of lower priority may be stopped.")
        if expected is None:
            if names:
                raise Failure(f"{where}: stopped {listed(list(names))}, but no choice of "
                              "victims lets the gang start",
                              "preempt nobody unless the gang can then start: return None.")
            continue
        if names is None:
            raise Failure(f"{where}: returned None, but stopping "
                          f"{listed(expected) or 'nobody'} lets the gang start",
                          "free whole jobs (all their GPUs) until the gang fits.")
        freed = list(free)
        for n in names:
            for node, c in by[n].taken.items():
                freed[node] += c
        if sched.first_fit(freed, gpus, k) is None:
            raise Failure(f"{where}: stopped {len(names)} job(s) ({listed(list(names))}) "
                          f"and the gang still does not start (free then: {freed})",
                          "pod by pod is not enough: the freed GPUs must hold the whole "
                          "gang — with gpus_per_node, on the same nodes. Test the placement "
                          "after each victim, and stop only once it fits.")
        lost, best = _gpu_seconds(names, running), _gpu_seconds(expected, running)
        if lost > best + 1e-9:
            raise Failure(f"{where}: stopping {listed(list(names))} loses {num(lost)} "
                          f"GPU-seconds; {listed(expected) or 'nobody'} lose(s) {num(best)}",
                          "try the cheapest victims first, and once the gang fits, spare "
                          "every victim it does not need (most expensive first).")
    return (f"the gang starts in every one of {len(VICTIM_CASES)} cases, stopping only "
            "lower-priority preemptible jobs and losing no more GPU-seconds than needed")
