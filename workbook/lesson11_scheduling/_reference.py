"""Reference answers of lab 11 (sharing a cluster); the checks import them while they run.

Each is the rule :mod:`simcluster.scheduling` itself uses, in the lab's signature: the lab
asks the learner to write these, and the checks refuse both these and the simulator's.
"""

from simcluster import scheduling as sched


def best_fit(free, gpus, gpus_per_node=None):
    """The fullest node that can hold the gang, else whole nodes, most free first."""
    return sched.best_fit(free, gpus, gpus_per_node)


def topology_placer(free, gpus, gpus_per_node, switches):
    """One node, else the leaf switch with the least room that fits, else the tree; best
    fit beneath."""
    return sched.topology(free, gpus, gpus_per_node,
                          sched.Topology([max(free)] * len(free), switches))


def together(running):
    """``running`` with the jobs that end at the same time merged into one: at that
    instant all of them have given their GPUs back, so the head's reservation counts
    them all (the simulator's ``reservation`` stops at the first one that is enough)."""
    merged = {}
    for end, taken in running:
        into = merged.setdefault(end, {})
        for node, n in taken.items():
            into[node] = into.get(node, 0) + n
    return list(merged.items())


def easy_backfill(now, free, running, queue):
    """The names of the jobs behind ``queue[0]`` that EASY backfill starts now."""
    return [job.name for job, _ in sched.easy_backfill(now, free, together(running), queue)]


def choose_victims(free, running, gpus, gpus_per_node, priority):
    """Gang-aware: the cheapest lower-priority preemptible jobs that let the gang start."""
    return sched.choose_victims(free, running, gpus, gpus_per_node, priority,
                                placement=sched.first_fit)
