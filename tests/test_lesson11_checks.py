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
    room = [sum(free[n] if k is None else free[n] // k * k for n in members)
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
        for node, n in taken.items():
            then[node] += n
        if first_fit(then, head.gpus, head.gpus_per_node) is not None:
            shadow = end
            break
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


@pytest.fixture
def short_timeout(monkeypatch):
    monkeypatch.setattr(checking, "TIMEOUT", 1.0)


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


def test_best_fit_wrong_answers(capsys, short_timeout):
    first = learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                    "    return first_fit(free, gpus, gpus_per_node)\n", "best_fit")
    fails(capsys, checks.check_best_fit, first, "best_fit([4, 2, 3, 8], 2, None) picks "
          "node(s) with 4 free; the fullest that fit have 2")
    worst = learner('''
def best_fit(free, gpus, gpus_per_node=None):
    fits = [n for n in range(len(free)) if free[n] >= gpus]
    if gpus_per_node is None and fits:
        return {max(fits, key=lambda n: free[n]): gpus}
    return first_fit(free, gpus, gpus_per_node)
''', "best_fit")
    fails(capsys, checks.check_best_fit, worst, "picks node(s) with 8 free")
    no_remainder_fit = write_learner('''
def best_fit(free, gpus, gpus_per_node=None):
    fits = [n for n in range(len(free)) if free[n] >= gpus]
    if gpus_per_node is None and fits:
        return {min(fits, key=lambda n: free[n]): gpus}
    if gpus_per_node is None:
        return first_fit(free, gpus, None)
    return mine(free, gpus, gpus_per_node)
''', {"mine": MINE["best_fit"], "first_fit": first_fit})["best_fit"]
    fails(capsys, checks.check_best_fit, no_remainder_fit, "best_fit([4, 2, 3, 0], 7, None) "
          "uses 3 node(s) and leaves 2 GPUs free on them; best fit: 2 node(s), 0 left")
    ignore = write_learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                           "    return mine(free, gpus, None)\n", {"mine": MINE["best_fit"]})
    fails(capsys, checks.check_best_fit, ignore["best_fit"],
          "best_fit([3, 3, 3], 4, 4) returned {0: 3, 1: 1}, but the job does not fit")
    greedy = learner('''
def best_fit(free, gpus, gpus_per_node=None):
    taken, left = {}, gpus
    for n in sorted(range(len(free)), key=lambda n: free[n]):
        if left and free[n]:
            taken[n] = min(free[n], left)
            left -= taken[n]
    return taken
''', "best_fit")
    fails(capsys, checks.check_best_fit, greedy, "splits the job over")
    raises = learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                     "    return {free.index(max(free)) + 99: gpus} if gpus > 8 else "
                     "{0: gpus // 0}\n", "best_fit")
    fails(capsys, checks.check_best_fit, raises, "raised ZeroDivisionError")
    loops = learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                    "    while True:\n        pass\n", "best_fit")
    fails(capsys, checks.check_best_fit, loops, "still running")
    mutates = learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                      "    free.sort()\n    return None\n", "best_fit")
    fails(capsys, checks.check_best_fit, mutates, "changed its arguments")
    never_none = write_learner("def best_fit(free, gpus, gpus_per_node=None):\n"
                               "    return mine(free, gpus, gpus_per_node) or {0: gpus}\n",
                               {"mine": MINE["best_fit"]})["best_fit"]
    fails(capsys, checks.check_best_fit, never_none,
          "best_fit([2, 2], 5, None) returned {0: 5}, but the job does not fit")


# ------------------------------------------------------------- 2. topology-aware


def test_topology_wrong_answers(capsys, short_timeout):
    plain = learner("def topology_placer(free, gpus, gpus_per_node, switches):\n"
                    "    return best_fit(free, gpus, gpus_per_node)\n", "topology_placer")
    fails(capsys, checks.check_topology_placer, plain, "spans switches")
    emptiest_switch = learner('''
def topology_placer(free, gpus, gpus_per_node, switches):
    k = gpus_per_node
    if k is None or k == gpus:
        one = [n for n in range(len(free)) if free[n] >= gpus]
        if one:
            return {min(one, key=lambda n: (free[n], n)): gpus}
    room = [sum(free[n] if k is None else free[n] // k * k for n in m) for m in switches]
    fits = [i for i in range(len(switches)) if room[i] >= gpus]
    if fits:
        members = switches[max(fits, key=lambda i: room[i])]
        return best_fit([f if n in members else 0 for n, f in enumerate(free)], gpus, k)
    return best_fit(free, gpus, k)
''', "topology_placer")
    fails(capsys, checks.check_topology_placer, emptiest_switch, "the fullest switch")
    first_node = learner('''
def topology_placer(free, gpus, gpus_per_node, switches):
    for n in range(len(free)):
        if free[n] >= gpus and gpus_per_node in (None, gpus):
            return {n: gpus}
    return best_fit(free, gpus, gpus_per_node)
''', "topology_placer")
    fails(capsys, checks.check_topology_placer, first_node, "alone holds it")
    raises = learner("def topology_placer(free, gpus, gpus_per_node, switches):\n"
                     "    return switches[gpus]\n", "topology_placer")
    fails(capsys, checks.check_topology_placer, raises, "raised IndexError")
    loops = learner("def topology_placer(free, gpus, gpus_per_node, switches):\n"
                    "    n = 0\n    while free:\n        n += 1\n", "topology_placer")
    fails(capsys, checks.check_topology_placer, loops, "still running")


# ----------------------------------------------------------------- 3. backfill


def test_backfill_wrong_answers(capsys, short_timeout):
    nothing = learner("def easy_backfill(now, free, running, queue):\n    return []\n",
                      "easy_backfill")
    fails(capsys, checks.check_easy_backfill, nothing, "started nothing",
          "could start now without delaying the head")
    greedy = learner('''
def easy_backfill(now, free, running, queue):
    free, started = list(free), []
    for job in queue[1:]:
        taken = first_fit(free, job.gpus, job.gpus_per_node)
        if taken:
            for n, c in taken.items():
                free[n] -= c
            started.append(job.name)
    return started
''', "easy_backfill")
    fails(capsys, checks.check_easy_backfill, greedy, "would delay the head")
    conservative = learner('''
def easy_backfill(now, free, running, queue):
    head = queue[0]
    then, shadow = list(free), float("inf")
    for end, taken in sorted(running, key=lambda r: r[0]):
        for node, n in taken.items():
            then[node] += n
        if first_fit(then, head.gpus, head.gpus_per_node) is not None:
            shadow = end
            break
    free, started = list(free), []
    for job in queue[1:]:
        taken = first_fit(free, job.gpus, job.gpus_per_node)
        if taken is not None and now + job.duration <= shadow:
            for node, n in taken.items():
                free[node] -= n
            started.append(job.name)
    return started
''', "easy_backfill")
    fails(capsys, checks.check_easy_backfill, conservative, "started nothing, EASY backfill "
          "starts side", "the head still fits then")
    with_head = learner("def easy_backfill(now, free, running, queue):\n"
                        "    return [j.name for j in queue]\n", "easy_backfill")
    fails(capsys, checks.check_easy_backfill, with_head, "BEHIND it")
    raises = learner("def easy_backfill(now, free, running, queue):\n"
                     "    return [queue[0].walltime]\n", "easy_backfill")
    fails(capsys, checks.check_easy_backfill, raises, "raised AttributeError")
    loops = learner("def easy_backfill(now, free, running, queue):\n"
                    "    while queue:\n        now += 1\n", "easy_backfill")
    fails(capsys, checks.check_easy_backfill, loops, "still running")


# ------------------------------------------------------------------ 4. victims


def test_victims_wrong_answers(capsys, short_timeout):
    pod_by_pod = learner('''
def choose_victims(free, running, gpus, gpus_per_node, priority):
    out, total = [], sum(free)
    for r in sorted(running, key=lambda r: r.lost):
        if total >= gpus:
            break
        if r.preemptible and r.priority < priority:
            out.append(r.name)
            total += sum(r.taken.values())
    return out if total >= gpus else None
''', "choose_victims")
    fails(capsys, checks.check_choose_victims, pod_by_pod, "stopped 2 job(s) (a1, b1) and "
          "the gang still does not start", "pod by pod is not enough")
    no_prune = learner('''
def choose_victims(free, running, gpus, gpus_per_node, priority):
    freed, chosen = list(free), []
    for r in sorted((r for r in running if r.preemptible and r.priority < priority),
                    key=lambda r: r.lost):
        if first_fit(freed, gpus, gpus_per_node) is not None:
            break
        chosen.append(r.name)
        for node, n in r.taken.items():
            freed[node] += n
    return chosen if first_fit(freed, gpus, gpus_per_node) is not None else None
''', "choose_victims")
    fails(capsys, checks.check_choose_victims, no_prune, "loses 320 GPU-seconds",
          "spare every victim it does not need")
    any_priority = write_learner(
        "def choose_victims(free, running, gpus, gpus_per_node, priority):\n"
        "    return mine(free, running, gpus, gpus_per_node, 10**9)\n",
        {"mine": MINE["choose_victims"]})["choose_victims"]
    fails(capsys, checks.check_choose_victims, any_priority,
          "stopped vip, which is priority 9 (not lower than 5)")
    raises = learner("def choose_victims(free, running, gpus, gpus_per_node, priority):\n"
                     "    return [running[gpus].name]\n", "choose_victims")
    fails(capsys, checks.check_choose_victims, raises, "raised IndexError")
    loops = learner("def choose_victims(free, running, gpus, gpus_per_node, priority):\n"
                    "    while gpus:\n        priority += 1\n", "choose_victims")
    fails(capsys, checks.check_choose_victims, loops, "still running")
