"""Lab 11's checks (sharing a cluster): every check passes the reference answer written as a
learner would, refuses the simulator's own rules, and reports each mistake — including
ones that raise or loop forever — as one ❌ line."""

import pytest

from _check_helpers import fails, line, not_started, write_learner
from workbook import checking
from workbook.lesson11_scheduling import checks
from workbook.lesson11_scheduling import _reference as R

SOURCE = {
    "best_fit": '''
def best_fit(free, gpus, gpus_per_node=None):
    nodes = range(len(free))
    if gpus_per_node is not None:
        fit = sorted((n for n in nodes if free[n] >= gpus_per_node), key=lambda n: (free[n], n))
        need = gpus // gpus_per_node
        return {n: gpus_per_node for n in fit[:need]} if len(fit) >= need else None
    if sum(free) < gpus:
        return None
    taken, left = {}, gpus
    while True:
        fits = [n for n in nodes if n not in taken and free[n] >= left]
        if fits:
            taken[min(fits, key=lambda n: (free[n], n))] = left
            return taken
        biggest = max((n for n in nodes if n not in taken), key=lambda n: (free[n], -n))
        taken[biggest] = free[biggest]
        left -= free[biggest]
''',
    "topology_placer": '''
def topology_placer(free, gpus, gpus_per_node, switches):
    k = gpus_per_node
    if k is None or k == gpus:
        one = [n for n in range(len(free)) if free[n] >= gpus]
        if one:
            return {min(one, key=lambda n: (free[n], n)): gpus}
    room = [sum(free[n] if k is None else (k if free[n] >= k else 0) for n in members)
            for members in switches]
    fits = [i for i in range(len(switches)) if room[i] >= gpus]
    if fits:
        members = switches[min(fits, key=lambda i: (room[i], i))]
        return best_fit([f if n in members else 0 for n, f in enumerate(free)], gpus, k)
    return best_fit(free, gpus, k)
''',
    "easy_backfill": '''
def easy_backfill(now, free, running, queue):
    head = queue[0]
    then, shadow = list(free), float("inf")
    for end, taken in sorted(running, key=lambda r: r[0]):
        if end > shadow:
            break
        for node, n in taken.items():
            then[node] += n
        if first_fit(then, head.gpus, head.gpus_per_node) is not None:
            shadow = end
    free, started = list(free), []
    for job in queue[1:]:
        taken = first_fit(free, job.gpus, job.gpus_per_node)
        if taken is None:
            continue
        if now + job.duration > shadow:
            trial = list(then)
            for node, n in taken.items():
                trial[node] -= n
            if first_fit(trial, head.gpus, head.gpus_per_node) is None:
                continue
            then = trial
        for node, n in taken.items():
            free[node] -= n
        started.append(job.name)
    return started
''',
    "choose_victims": '''
def choose_victims(free, running, gpus, gpus_per_node, priority):
    candidates = sorted((r for r in running if r.preemptible and r.priority < priority),
                        key=lambda r: (r.lost, r.name))
    freed, chosen = list(free), []
    for victim in candidates:
        if first_fit(freed, gpus, gpus_per_node) is not None:
            break
        chosen.append(victim)
        for node, n in victim.taken.items():
            freed[node] += n
    if first_fit(freed, gpus, gpus_per_node) is None:
        return None
    for victim in sorted(chosen, key=lambda r: -r.lost):
        trial = list(freed)
        for node, n in victim.taken.items():
            trial[node] -= n
        if first_fit(trial, gpus, gpus_per_node) is not None:
            chosen.remove(victim)
            freed = trial
    return [r.name for r in chosen]
''',
}

from simcluster.scheduling import first_fit  # noqa: E402 — what the lab's cells may use

MINE = write_learner("".join(SOURCE.values()), {"first_fit": first_fit})


def learner(source, name):
    """A wrong answer written from ``source``, with the reference's other answers around."""
    return write_learner(source, MINE)[name]


def mutant(name, *edits):
    """The reference answer ``name`` with each ``(old, new)`` edit made once: one slip."""
    source = SOURCE[name]
    for old, new in edits:
        assert source.count(old) == 1, old
        source = source.replace(old, new)
    return learner(source, name)



NAMES = {checks.check_best_fit: "best-fit gang placer",
         checks.check_topology_placer: "topology-aware placer",
         checks.check_easy_backfill: "EASY backfill",
         checks.check_choose_victims: "gang-aware preemption"}


@pytest.mark.parametrize("check, name", [
    (checks.check_best_fit, "best_fit"), (checks.check_topology_placer, "topology_placer"),
    (checks.check_easy_backfill, "easy_backfill"),
    (checks.check_choose_victims, "choose_victims")])
def test_reference_passes_and_is_refused(capsys, check, name):
    ok, text = line(capsys, check, MINE[name])
    assert ok and text.startswith(f"✅ {NAMES[check]}: "), text
    fails(capsys, check, getattr(R, name), "the workbook's own reference answer")


def test_the_simulators_rules_are_refused(capsys):
    from simcluster import scheduling as sched

    fails(capsys, checks.check_best_fit, sched.best_fit, "reference answer")
    wrapper = write_learner("def best_fit(free, gpus, k=None):\n"
                            "    return sched.best_fit(free, gpus, k)\n", {"sched": sched})
    fails(capsys, checks.check_best_fit, wrapper["best_fit"], "reference answer")


def test_unwritten_exercise_says_so(capsys):
    def best_fit(free, gpus, gpus_per_node=None):
        raise NotImplementedError("sort the nodes")

    not_started(capsys, checks.check_best_fit, best_fit, "best-fit gang placer",
                "sort the nodes")


# ------------------------------------------------------------------- 1. best fit

TIE_HIGHER = (("key=lambda n: (free[n], n))\n        need", "key=lambda n: (free[n], -n))\n"
               "        need"),
              ("taken[min(fits, key=lambda n: (free[n], n))]",
               "taken[min(fits, key=lambda n: (free[n], -n))]"),
              ("key=lambda n: (free[n], -n))\n        taken[biggest]",
               "key=lambda n: (free[n], n))\n        taken[biggest]"))
GREEDY_SPLIT = '''
def best_fit(free, gpus, gpus_per_node=None):
    if gpus_per_node is not None:
        return mine(free, gpus, gpus_per_node)
    fits = [n for n in range(len(free)) if free[n] >= gpus]
    if fits:
        return {min(fits, key=lambda n: (free[n], n)): gpus}
    if sum(free) < gpus:
        return None
    taken, left = {}, gpus
    for n in sorted(range(len(free)), key=lambda n: (-free[n], n)):
        if left and free[n]:
            taken[n] = min(free[n], left)
            left -= taken[n]
    return taken
'''


@pytest.mark.parametrize("wrong, parts", [
    # issue 42's holes: ties to the higher index
    (lambda: mutant("best_fit", *TIE_HIGHER),
     ["best_fit([4, 2, 2, 8], 2, None) returned {2: 2}; best fit takes {1: 2}",
      "tie: take the lower-numbered one"]),
    # with gpus_per_node, the lowest-numbered nodes instead of the fullest
    (lambda: mutant("best_fit", ("sorted((n for n in nodes if free[n] >= gpus_per_node), "
                                 "key=lambda n: (free[n], n))",
                                 "[n for n in nodes if free[n] >= gpus_per_node]")),
     ["best_fit([8, 4, 6, 4], 8, 4) returned {0: 4, 1: 4}", "lowest-numbered nodes"]),
    # a greedy split: never "the fullest node that holds the rest"
    (lambda: write_learner(GREEDY_SPLIT, {"mine": MINE["best_fit"]})["best_fit"],
     ["best_fit([8, 6, 3, 2], 10, None) returned {0: 8, 1: 2}", "the remainder goes on "
      "the fullest node"]),
    (lambda: learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                     "    return first_fit(free, gpus, gpus_per_node)\n", "best_fit"),
     ["best_fit([4, 2, 3, 8], 2, None) returned {0: 2}; best fit takes {1: 2}",
      "FEWEST free"]),
    (lambda: write_learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                           "    return mine(free, gpus, None)\n",
                           {"mine": MINE["best_fit"]})["best_fit"],
     ["best_fit([8, 4, 6, 4], 8, 4) takes 8 GPUs on node 0", "gpus_per_node=4"]),
    # gpus_per_node counted as free // k chunks: two chunks from one node
    (lambda: mutant("best_fit", ("if free[n] >= gpus_per_node), key", "if free[n] >= 0), "
                                                                       "key")),
     ["best_fit([4, 2, 4, 3], 8, 4) takes 4 GPUs on node 1, which has 2 free"]),
    (lambda: write_learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                           "    return mine(free, gpus, gpus_per_node) or {0: gpus}\n",
                           {"mine": MINE["best_fit"]})["best_fit"],
     ["best_fit([2, 2], 5, None) returned {0: 5}, but the job does not fit"]),
    (lambda: mutant("best_fit", ("if sum(free) < gpus:", "if sum(free) <= gpus:")),
     ["best_fit([1, 1, 1, 1], 4, None) returned None, but the job fits"]),
    # the trial's hole: with gpus_per_node, each chosen node gives ALL its free GPUs
    (lambda: mutant("best_fit", ("{n: gpus_per_node for n in fit[:need]}",
                                 "{n: free[n] for n in fit[:need]}")),
     ["best_fit([8, 8], 8, 4) takes 8 GPUs on node 0, but the job asked for "
      "gpus_per_node=4"]),
])
def test_best_fit_wrong_answers(capsys, short_timeout, wrong, parts):
    fails(capsys, checks.check_best_fit, wrong(), *parts)


class Odd:
    """A learner's object whose comparisons and conversions raise."""

    def __eq__(self, other):
        raise RuntimeError("no comparing me")

    __hash__ = object.__hash__

    def __float__(self):
        raise RuntimeError("no converting me")


class Endless:
    """A learner's object that is a number only after an endless loop."""

    def __index__(self):
        while True:
            pass


@pytest.mark.parametrize("returned, parts", [
    (lambda free, gpus: Odd(), ["returned a Odd", "return {node: GPUs taken}"]),
    (lambda free, gpus: {0: Odd()}, ["returned a dict whose keys or values are not whole"]),
    (lambda free, gpus: {0: 2.0}, ["returned a dict whose keys or values are not whole"]),
    (lambda free, gpus: {Odd(): 2}, ["returned a dict whose keys or values are not whole"]),
    (lambda free, gpus: {0: True}, ["returned a dict holding True/False"]),
    (lambda free, gpus: [(0, gpus)], ["returned a list"]),
])
def test_best_fit_odd_return_values_are_one_line(capsys, short_timeout, returned, parts):
    answer = write_learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                           "    return returned(free, gpus)\n",
                           {"returned": returned})["best_fit"]
    fails(capsys, checks.check_best_fit, answer, "best_fit([4, 2, 3, 8], 2, None) returned",
          *parts)


def test_an_answer_that_loops_when_read_is_stopped(capsys, short_timeout):
    answer = write_learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                           "    return {Endless(): gpus}\n", {"Endless": Endless})["best_fit"]
    fails(capsys, checks.check_best_fit, answer, "still running")


def test_best_fit_other_mistakes(capsys, short_timeout):
    worst = learner('''
def best_fit(free, gpus, gpus_per_node=None):
    fits = [n for n in range(len(free)) if free[n] >= gpus]
    if gpus_per_node is None and fits:
        return {max(fits, key=lambda n: free[n]): gpus}
    return first_fit(free, gpus, gpus_per_node)
''', "best_fit")
    fails(capsys, checks.check_best_fit, worst, "returned {3: 2}")
    greedy = learner('''
def best_fit(free, gpus, gpus_per_node=None):
    taken, left = {}, gpus
    for n in sorted(range(len(free)), key=lambda n: free[n]):
        if left and free[n]:
            taken[n] = min(free[n], left)
            left -= taken[n]
    return taken
''', "best_fit")
    fails(capsys, checks.check_best_fit, greedy, "returned {1: 2, 2: 1}",
          "keep it there (one NVLink domain)")
    raises = learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                     "    return {0: gpus // 0}\n", "best_fit")
    fails(capsys, checks.check_best_fit, raises, "raised ZeroDivisionError")
    loops = learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                    "    while True:\n        pass\n", "best_fit")
    fails(capsys, checks.check_best_fit, loops, "still running")
    mutates = learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                      "    free.sort()\n    return None\n", "best_fit")
    fails(capsys, checks.check_best_fit, mutates, "changed its arguments")


def test_patching_the_reference_from_the_learners_code_does_not_pass(capsys):
    # the expected answers exist before the learner's function first runs
    cheat = learner('''
def best_fit(free, gpus, gpus_per_node=None):
    import workbook.lesson11_scheduling._reference as ref
    ref.best_fit = lambda free, gpus, k=None: first_fit(free, gpus, k)
    return first_fit(free, gpus, gpus_per_node)
''', "best_fit")
    original = R.best_fit
    try:
        fails(capsys, checks.check_best_fit, cheat, "best fit takes {1: 2}")
    finally:
        R.best_fit = original


# ------------------------------------------------------------- 2. topology-aware


@pytest.mark.parametrize("wrong, parts", [
    # a switch's room as the plain sum of its free GPUs
    (lambda: mutant("topology_placer", ("free[n] if k is None else (k if free[n] >= k else 0)",
                                        "free[n]")),
     ["topology_placer([8, 0, 4, 4], 8, 4, [[0, 1], [2, 3]]) returned None, but the job "
      "fits", "k GPUs if it has k free"]),
    # the old rule: free // k * k
    (lambda: mutant("topology_placer", ("(k if free[n] >= k else 0)", "free[n] // k * k")),
     ["topology_placer([8, 0, 4, 4], 8, 4, [[0, 1], [2, 3]]) returned None"]),
    # the first switch that fits, not the one with the least room
    (lambda: mutant("topology_placer", ("switches[min(fits, key=lambda i: (room[i], i))]",
                                        "switches[fits[0]]")),
     ["topology_placer([4, 4, 3, 3], 6, None, [[0, 1], [2, 3]]) returned {0: 4, 1: 2}",
      "the one with the LEAST room"]),
    (lambda: mutant("topology_placer", ("switches[min(fits, key=lambda i: (room[i], i))]",
                                        "switches[max(fits, key=lambda i: (room[i], i))]")),
     ["topology_placer([4, 3, 4, 4], 5, None, [[0, 1], [2, 3]]) returned {2: 4, 3: 1}",
      "LEAST room"]),
    (lambda: mutant("topology_placer", ("(room[i], i)", "(room[i], -i)")),
     ["topology_placer([2, 2, 2, 2], 4, None, [[0, 1], [2, 3]]) returned {2: 2, 3: 2}",
      "switches with the same room tie"]),
    (lambda: learner("def topology_placer(free, gpus, gpus_per_node, switches):\n"
                     "    return best_fit(free, gpus, gpus_per_node)\n", "topology_placer"),
     ["topology_placer([3, 2, 4, 4], 6, None, [[0, 1], [2, 3]]) returned {2: 4, 1: 2}",
      "stay under one switch"]),
    (lambda: mutant("topology_placer", ("key=lambda n: (free[n], n)",
                                        "key=lambda n: (-free[n], n)")),
     ["topology_placer([4, 2, 4, 4], 2, None, [[0, 1], [2, 3]]) returned {0: 2}",
      "FEWEST free"]),
    # the trial's hole: the room miscounted, hidden by a fall-back to the whole tree
    (lambda: mutant("topology_placer",
                    ("free[n] if k is None else (k if free[n] >= k else 0)", "free[n]"),
                    ("        return best_fit([f if n in members else 0 for n, f in "
                     "enumerate(free)], gpus, k)\n",
                     "        placed = best_fit([f if n in members else 0 for n, f in "
                     "enumerate(free)], gpus, k)\n        if placed is not None:\n"
                     "            return placed\n")),
     ["topology_placer([5, 3, 4, 5], 8, 4, [[0, 1], [2, 3]]) returned {2: 4, 0: 4}",
      "count a switch's room as what this gang could take there"]),
    # ... and without the fall-back, a crash in the learner's code: one line, the cause
    (lambda: mutant("topology_placer",
                    ("free[n] if k is None else (k if free[n] >= k else 0)", "free[n]"),
                    ("        return best_fit([f if n in members else 0 for n, f in "
                     "enumerate(free)], gpus, k)\n",
                     "        placed = best_fit([f if n in members else 0 for n, f in "
                     "enumerate(free)], gpus, k)\n"
                     "        return {n: c for n, c in placed.items()}\n")),
     ["topology_placer([8, 0, 4, 4], 8, 4, [[0, 1], [2, 3]]) raised AttributeError",
      "switch 0 has 8 free GPUs but room for 4 of this gang"]),
    # gpus_per_node == gpus: the one-node level skipped (was told about ties)
    (lambda: mutant("topology_placer", ("if k is None or k == gpus:", "if k is None:")),
     ["topology_placer([4, 4, 2, 4], 4, 4, [[0, 1], [2, 3]]) returned {3: 4}",
      "the one-node level comes first"]),
    (lambda: learner("def topology_placer(free, gpus, gpus_per_node, switches):\n"
                     "    return switches[gpus]\n", "topology_placer"),
     ["raised IndexError"]),
    (lambda: learner("def topology_placer(free, gpus, gpus_per_node, switches):\n"
                     "    n = 0\n    while free:\n        n += 1\n", "topology_placer"),
     ["still running"]),
])
def test_topology_wrong_answers(capsys, short_timeout, wrong, parts):
    fails(capsys, checks.check_topology_placer, wrong(), *parts)


def test_a_slip_in_best_fit_names_exercise_1_not_the_topology_placer(capsys):
    wrong_best_fit = mutant("best_fit", *TIE_HIGHER)
    topology = write_learner(SOURCE["topology_placer"],
                             {"best_fit": wrong_best_fit})["topology_placer"]
    fails(capsys, checks.check_topology_placer, topology,
          "topology_placer calls your best_fit, whose own check does not pass yet",
          "fix best_fit first")


# ----------------------------------------------------------------- 3. backfill


@pytest.mark.parametrize("wrong, parts", [
    # `<` instead of `<=` against the shadow time
    (lambda: mutant("easy_backfill", ("if now + job.duration > shadow:",
                                      "if now + job.duration >= shadow:")),
     ["started nothing, EASY backfill starts exact", "ending AT the reservation"]),
    # jobs that end at the same instant released one by one
    (lambda: mutant("easy_backfill", ("            shadow = end\n",
                                      "            shadow = end\n            break\n")),
     ["started nothing, EASY backfill starts long", "at the same instant"]),
    # running jobs released in the given order, not by end time
    (lambda: mutant("easy_backfill", ("sorted(running, key=lambda r: r[0])", "running")),
     ["started mid, EASY backfill starts quick", "in the order they END"]),
    # job.duration <= shadow, without now
    (lambda: mutant("easy_backfill", ("if now + job.duration > shadow:",
                                      "if job.duration > shadow:")),
     ["started late, EASY backfill starts early", "now + its duration"]),
    # break instead of continue on a job that does not fit now
    (lambda: mutant("easy_backfill", ("        if taken is None:\n            continue",
                                      "        if taken is None:\n            break")),
     ["started nothing, EASY backfill starts tiny", "you stopped looking"]),
    # break instead of continue on a job that would delay the head
    (lambda: mutant("easy_backfill", ("                continue", "                break")),
     ["started nothing, EASY backfill starts early", "you stopped looking"]),
    # a shadow time of `now` when nothing frees enough
    (lambda: mutant("easy_backfill", ("    free, started = list(free), []\n",
                                      "    shadow = now if shadow == float(\"inf\") else shadow\n"
                                      "    free, started = list(free), []\n")),
     ["started nothing, EASY backfill starts long, one", "no reservation"]),
    # never the second test: only jobs that end by the shadow time
    (lambda: mutant("easy_backfill", (
        "            trial = list(then)\n            for node, n in taken.items():\n"
        "                trial[node] -= n\n            if first_fit(trial, head.gpus, "
        "head.gpus_per_node) is None:\n                continue\n            then = trial\n",
        "            continue\n")),
     ["started nothing, EASY backfill starts side", "the head still fits then"]),
    # the second test against what is free at the shadow time, never reduced
    (lambda: mutant("easy_backfill", ("            then = trial\n", "")),
     ["started side, side2, EASY backfill starts side", "would delay the head"]),
    (lambda: learner("def easy_backfill(now, free, running, queue):\n    return []\n",
                     "easy_backfill"),
     ["started nothing, EASY backfill starts short", "could start now"]),
    (lambda: learner('''
def easy_backfill(now, free, running, queue):
    free, started = list(free), []
    for job in queue[1:]:
        taken = first_fit(free, job.gpus, job.gpus_per_node)
        if taken:
            for n, c in taken.items():
                free[n] -= c
            started.append(job.name)
    return started
''', "easy_backfill"), ["would delay the head"]),
    (lambda: learner("def easy_backfill(now, free, running, queue):\n"
                     "    return [j.name for j in queue]\n", "easy_backfill"),
     ["BEHIND it"]),
    # the jobs, not their names: one line, never a traceback
    (lambda: learner("def easy_backfill(now, free, running, queue):\n"
                     "    return queue[1:2]\n", "easy_backfill"),
     ["returned a list holding Job objects", "job.name"]),
    (lambda: learner("def easy_backfill(now, free, running, queue):\n"
                     "    return {j.name for j in queue[1:2]}\n", "easy_backfill"),
     ["returned a set"]),
    (lambda: learner("def easy_backfill(now, free, running, queue):\n"
                     "    return [queue[0].walltime]\n", "easy_backfill"),
     ["raised AttributeError"]),
    (lambda: learner("def easy_backfill(now, free, running, queue):\n"
                     "    while queue:\n        now += 1\n", "easy_backfill"),
     ["still running"]),
])
def test_backfill_wrong_answers(capsys, short_timeout, wrong, parts):
    fails(capsys, checks.check_easy_backfill, wrong(), *parts)


# ------------------------------------------------------------------ 4. victims

POD_BY_POD = '''
def choose_victims(free, running, gpus, gpus_per_node, priority):
    out, total = [], sum(free)
    for r in sorted(running, key=lambda r: r.lost):
        if total >= gpus:
            break
        if r.preemptible and r.priority < priority:
            out.append(r.name)
            total += sum(r.taken.values())
    return out if total >= gpus else None
'''
NO_SPARING = (("    for victim in sorted(chosen, key=lambda r: -r.lost):\n",
               "    for victim in []:\n"),)


@pytest.mark.parametrize("wrong, parts", [
    # sparing victims cheapest first
    (lambda: mutant("choose_victims", ("key=lambda r: -r.lost", "key=lambda r: r.lost")),
     ["stopping q, r loses 5 GPU-seconds; p, r lose(s) 4", "try the dearest first"]),
    # preempting jobs of equal priority
    (lambda: mutant("choose_victims", ("r.priority < priority", "r.priority <= priority")),
     ["stopped peer, which has priority 5 (not lower than 5)", "same priority keeps"]),
    # [] for "can never fit"
    (lambda: mutant("choose_victims", ("        return None", "        return []")),
     ["returned [] (stop nobody, the gang starts now), but it cannot start",
      "return None"]),
    # stopping candidates although the gang can never fit
    (lambda: mutant("choose_victims", ("    if first_fit(freed, gpus, gpus_per_node) is None:"
                                       "\n        return None\n", "")),
     ["stopped a, but the gang cannot start even if every candidate stops"]),
    # sparing tested against the fully freed set
    (lambda: mutant("choose_victims", ("            freed = trial\n", "")),
     ["stopped r and the gang still does not start", "you spared too many"]),
    # no "fits already" test: nobody may be stopped, so "None", though the gang fits
    (lambda: mutant("choose_victims", ("    freed, chosen = list(free), []\n",
                                       "    freed, chosen = list(free), []\n"
                                       "    if not candidates:\n        return None\n")),
     ["returned None, but stopping nobody lets the gang start", "fits already"]),
    # no "fits already" test and no sparing: a victim the gang does not need
    (lambda: mutant("choose_victims", (
        "        if first_fit(freed, gpus, gpus_per_node) is not None:\n            break\n"
        "        chosen.append(victim)\n", "        chosen.append(victim)\n"), *NO_SPARING),
     ["stopping a loses 10 GPU-seconds; nobody lose(s) 0", "the gang fits already"]),
    (lambda: learner(POD_BY_POD, "choose_victims"),
     ["stopped a1, b1 and the gang still does not start", "pod by pod is not enough"]),
    (lambda: mutant("choose_victims", *NO_SPARING),
     ["loses 320 GPU-seconds", "spare every victim it does not need"]),
    (lambda: write_learner("def choose_victims(free, running, gpus, gpus_per_node, priority):\n"
                           "    return mine(free, running, gpus, gpus_per_node, 10**9)\n",
                           {"mine": MINE["choose_victims"]})["choose_victims"],
     ["stopped peer, which has priority 5"]),
    # the Running objects, not their names: one line, never a traceback
    (lambda: mutant("choose_victims", ("return [r.name for r in chosen]", "return chosen")),
     ["returned a list holding Running objects", "r.name"]),
    (lambda: learner("def choose_victims(free, running, gpus, gpus_per_node, priority):\n"
                     "    return [running[gpus].name]\n", "choose_victims"),
     ["raised IndexError"]),
    (lambda: learner("def choose_victims(free, running, gpus, gpus_per_node, priority):\n"
                     "    while gpus:\n        priority += 1\n", "choose_victims"),
     ["still running"]),
])
def test_victims_wrong_answers(capsys, short_timeout, wrong, parts):
    fails(capsys, checks.check_choose_victims, wrong(), *parts)


def test_every_unwritten_exercise_is_a_nudge_pointing_to_its_progressive_hints():
    import re
    from pathlib import Path

    import nbformat

    notebook = nbformat.read(Path(__file__).resolve().parent.parent
                             / "labs/11_scheduling.ipynb", as_version=4)
    messages = [m for c in notebook.cells
                for m in re.findall(r'raise NotImplementedError\((.*?)\)(?:\n|$)', c.source, re.S)]
    assert len(messages) == 4
    for message in messages:
        named = re.findall(r'checks\.hint\(\\?"(\w+)\\?"\)', message)
        assert named and all(len(checks.hint.steps[n]) >= 2 for n in named), message


def test_the_check_cells_print_only_their_line():
    # a check returns True/False: a cell ending in the bare call would also show "True"
    from pathlib import Path

    import nbformat

    notebook = nbformat.read(Path(__file__).resolve().parent.parent
                             / "solutions/11_scheduling.ipynb", as_version=4)
    cells = [c for c in notebook.cells if "checks.check_" in c.source]
    assert len(cells) == 4
    for cell in cells:
        assert [o.output_type for o in cell.outputs] == ["stream"], cell.source
        assert cell.outputs[0].text.startswith("✅"), cell.outputs[0].text


def test_an_answer_is_judged_by_its_content_not_its_methods(capsys, short_timeout):
    # a dict or list subclass whose items(), __len__, __iter__ or __eq__ never return
    # holds the right answer: the check reads the plain content and does not hang
    class Loopy(dict):
        def items(self):
            while True:
                pass

        def __eq__(self, other):
            while True:
                pass

        __hash__ = None

    class LoopyList(list):
        def __len__(self):
            while True:
                pass

        def __iter__(self):
            while True:
                yield None

    best_fit = write_learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                             "    answer = mine(free, gpus, gpus_per_node)\n"
                             "    return None if answer is None else Loopy(answer)\n",
                             {"mine": MINE["best_fit"], "Loopy": Loopy})["best_fit"]
    assert line(capsys, checks.check_best_fit, best_fit)[0]
    backfill = write_learner("def easy_backfill(now, free, running, queue):\n"
                             "    return LoopyList(mine(now, free, running, queue))\n",
                             {"mine": MINE["easy_backfill"], "LoopyList": LoopyList}
                             )["easy_backfill"]
    assert line(capsys, checks.check_easy_backfill, backfill)[0]
