"""Sharing a cluster: a discrete-event simulator of a GPU job scheduler.

    from simcluster import scheduling as sched
    cluster = sc.Cluster.preset("hetero-11")
    jobs = sched.synthetic_trace(2000, cluster, seed=0)
    result = sched.simulate(jobs, cluster, policy="fifo", placement="best_fit",
                            backfill=True)
    print(result.summary())

A :class:`Job` asks for ``gpus`` GPUs for ``duration`` seconds of simulated time. It is a
*gang*: it starts with all its GPUs at once or not at all, as a data- or model-parallel job
must (every rank joins the first collective). ``gpus_per_node=k`` asks for exactly ``k``
GPUs on each of ``gpus / k`` nodes (Slurm's ``--gpus-per-node``, one Kubernetes pod per
node); ``None`` takes them anywhere.

The simulator keeps, for each node of the :class:`~simcluster.spec.ClusterSpec`, which of
its GPUs are free. At every event (a submission, an end, a preemption) it runs one
scheduling pass: the queue in the policy's order (``fifo``, ``sjf``, ``priority``,
``fair``), each job placed by the placement rule (:func:`first_fit`, :func:`best_fit`,
:func:`spread`, :func:`topology`, or your own function with their signature). Without
backfill the first job that does not fit blocks the queue; with ``backfill="easy"`` (or
``True``: EASY backfill, Lifka 1995) a later job may start if it does not delay the head's
reservation; with ``backfill="conservative"`` (what Slurm's ``sched/backfill`` does) every
queued job it looks at gets a reservation, and a later job may start only if it delays
none of them. Backfill plans with each job's ``time_limit`` (the user's estimate) if it
has one. With ``preemption=True`` a job that does not fit may stop
lower-priority preemptible jobs, chosen gang-aware (:func:`choose_victims`): only if the
job can then start, losing the fewest GPU-seconds. A stopped job goes back to the queue and
later restarts from its last checkpoint; each run is one of its ``attempts`` (as in
Microsoft's Philly trace). ``failures=[(time, node, seconds_down), ...]`` takes nodes out:
the jobs running on a failed node stop (outcome ``"failed"``) and go back to the queue
like a preempted job, and the node returns ``seconds_down`` later (:func:`node_failures`
draws such a list).

Everything is deterministic: no wall clock, no randomness but :func:`synthetic_trace`'s
seeded generator, ties broken by submission order. Reference numbers (Philly's run-time
quantiles, Alibaba PAI's request sizes) are in ``docs/reference-numbers.md``; the design is
in ``docs/scheduling.md``.
"""

import bisect
import heapq
import math
import random
from collections import namedtuple
from dataclasses import dataclass, field

POLICIES = ("fifo", "sjf", "priority", "fair")
BACKFILLS = ("easy", "conservative")
KINDS = ("train", "inference", "data")
BACKFILL_DEPTH = 100   # queued jobs a backfill pass looks at (Slurm's bf_max_job_test)
_EPS = 1e-9


# ------------------------------------------------------------------------------ jobs


@dataclass
class Job:
    """One job: a gang of ``gpus`` GPUs for ``duration`` seconds, submitted at ``submit``.

    ``duration`` is a number, or a function of the placement (a list of ``(node, gpu)``)
    returning seconds: a job spread over more nodes or switches may run slower.
    ``gpus_per_node``: ``None`` (any split) or ``k`` (exactly ``k`` on each of ``gpus / k``
    nodes; ``k == gpus`` keeps the job in one NVLink domain). ``priority``: higher goes
    first under ``policy="priority"`` and may preempt lower ``preemptible`` jobs.
    ``checkpoint_every``: seconds of progress between checkpoints (``None``: none, a
    preempted job starts over); ``restart_cost``: seconds a restart spends loading its
    checkpoint. ``queue`` names the tenant's queue for ``policy="fair"``.
    ``time_limit``: the seconds the user asks for (Slurm's ``--time``), which backfill
    plans with; ``None`` plans with the true run time, a perfect prediction. The job
    still runs for its ``duration``: over-estimates (``dataclasses.replace(job,
    time_limit=2 * job.duration)``) only change the plans.
    """

    name: str
    gpus: int
    duration: object
    submit: float = 0.0
    gpus_per_node: int = None
    priority: int = 0
    preemptible: bool = False
    kind: str = "train"
    queue: str = "default"
    checkpoint_every: float = None
    restart_cost: float = 0.0
    time_limit: float = None

    def __post_init__(self):
        self.validate()

    def validate(self):
        """Raise ``ValueError`` naming the first field that is not valid; :func:`simulate`
        calls it again, since a job's fields may have changed since it was made."""
        what = f"job {self.name!r}"
        if not _is_int(self.gpus) or self.gpus < 1:
            raise ValueError(f"{what}: gpus must be a positive integer, got {self.gpus!r}")
        if not callable(self.duration) and not _positive_number(self.duration):
            raise ValueError(f"{what}: duration must be a positive number of seconds or a "
                             f"function of the placement, got {self.duration!r}")
        if not _positive_number(self.submit, zero=True):
            raise ValueError(f"{what}: submit must be a time >= 0, got {self.submit!r}")
        k = self.gpus_per_node
        if k is not None and (not _is_int(k) or k < 1 or self.gpus % k):
            raise ValueError(f"{what}: gpus_per_node must be None or a positive divisor of "
                             f"gpus={self.gpus}, got {k!r}")
        if not _is_int(self.priority):
            raise ValueError(f"{what}: priority must be an integer, got {self.priority!r}")
        if self.kind not in KINDS:
            raise ValueError(f"{what}: kind must be one of {', '.join(KINDS)}, "
                             f"got {self.kind!r}")
        if self.checkpoint_every is not None and not _positive_number(self.checkpoint_every):
            raise ValueError(f"{what}: checkpoint_every must be None or a positive number "
                             f"of seconds, got {self.checkpoint_every!r}")
        if not _positive_number(self.restart_cost, zero=True):
            raise ValueError(f"{what}: restart_cost must be >= 0 seconds, "
                             f"got {self.restart_cost!r}")
        if self.time_limit is not None and not _positive_number(self.time_limit):
            raise ValueError(f"{what}: time_limit must be None or a positive number of "
                             f"seconds, got {self.time_limit!r}")


def _is_int(x):
    return isinstance(x, int) and not isinstance(x, bool)


def _positive_number(x, zero=False):
    ok = isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)
    return ok and (x >= 0 if zero else x > 0)


# ------------------------------------------------------------------------ topology


def node_sizes(cluster):
    """GPUs per node of ``cluster`` (a :class:`~simcluster.Cluster` or its spec)."""
    spec = getattr(cluster, "spec", cluster)
    return [node.devices for node in spec.nodes]


def leaf_switches(cluster, nodes_per_switch=4):
    """The nodes under each leaf switch: consecutive groups of ``nodes_per_switch``.

    A :class:`~simcluster.spec.ClusterSpec` describes one network between nodes, not its
    switches, so the scheduler assumes the usual two-level fat tree: leaf switches of
    ``nodes_per_switch`` nodes under one spine. Pass ``switches=`` to :func:`simulate` for
    another tree (Slurm's ``topology.conf`` lists the same thing).
    """
    n = len(node_sizes(cluster))
    return [list(range(i, min(i + nodes_per_switch, n))) for i in range(0, n, nodes_per_switch)]


Topology = namedtuple("Topology", "sizes switches")
Topology.__doc__ = """What a placement rule may know of the cluster besides the free GPUs:
``sizes`` (GPUs per node) and ``switches`` (the nodes under each leaf switch)."""


def topology_of(cluster, switches=None):
    """The :class:`Topology` of ``cluster``: its node sizes, and ``switches`` or
    :func:`leaf_switches`."""
    sizes = node_sizes(cluster)
    if switches is None:
        return Topology(sizes, leaf_switches(cluster))
    switches, seen = [list(members) for members in switches], set()
    for i, members in enumerate(switches):
        for node in members:
            if not (_is_int(node) and 0 <= node < len(sizes)):
                raise ValueError(f"switches[{i}] names node {node!r}; the cluster's nodes "
                                 f"are 0 to {len(sizes) - 1}")
            if node in seen:
                raise ValueError(f"node {node} is under two leaf switches (switches[{i}] "
                                 "and an earlier one); a node has one leaf switch")
            seen.add(node)
    return Topology(sizes, switches)


def spans(placement, switches):
    """``(nodes, leaf switches)`` a placement (list of ``(node, gpu)``) touches: what a
    placement-dependent ``duration`` usually depends on."""
    nodes = {node for node, _ in placement}
    leaf = {i for i, members in enumerate(switches) for node in nodes if node in members}
    return len(nodes), len(leaf)


# ---------------------------------------------------------------- placement rules
#
# A rule takes the free GPUs of every node (a list of counts), the job's ``gpus`` and
# ``gpus_per_node``, and the cluster's :class:`Topology`; it returns ``{node: GPUs taken}`` or None when
# the job does not fit now. Rules never look at which GPUs of a node are free: GPUs of a
# node are alike (one NVLink domain).


def _chunks(free, gpus, k, order):
    """Take the gang from nodes in ``order``: ``k`` from each node that has ``k`` free
    (``k`` None: as many as each node has). Returns ``{node: count}`` or None."""
    taken, left = {}, gpus
    for node in order:
        if left == 0:
            break
        if k is None:
            n = min(free[node], left)
        else:
            n = k if free[node] >= k else 0
        if n:
            taken[node], left = n, left - n
    return taken if left == 0 else None


def first_fit(free, gpus, gpus_per_node=None, topo=None):
    """The lowest-numbered nodes that have room, in order (Slurm's default linear order)."""
    return _chunks(free, gpus, gpus_per_node, range(len(free)))


def best_fit(free, gpus, gpus_per_node=None, topo=None):
    """Best fit: the nodes that will have the fewest free GPUs left (bin packing; Kubernetes'
    ``MostAllocated``). One node if any can hold the whole job (the fullest such node);
    else whole free nodes, most free first, until the rest fits on one node, which is
    again the fullest that can hold it. With ``gpus_per_node=k``, the fullest nodes with
    ``k`` free."""
    nodes = range(len(free))
    if gpus_per_node is not None:
        return _chunks(free, gpus, gpus_per_node, sorted(nodes, key=lambda n: (free[n], n)))
    if sum(free) < gpus:
        return None
    taken, left, free = {}, gpus, list(free)
    while left:
        fits = [n for n in nodes if n not in taken and free[n] >= left]
        if fits:
            node = min(fits, key=lambda n: (free[n], n))
            taken[node] = left
            return taken
        node = max((n for n in nodes if n not in taken), key=lambda n: (free[n], -n))
        taken[node], left = free[node], left - free[node]
    return taken


def spread(free, gpus, gpus_per_node=None, topo=None):
    """Spread (Kubernetes' default ``LeastAllocated`` score: balance the load): the whole
    job on the node with the largest free share, if one can hold it; with
    ``gpus_per_node=k``, the ``gpus / k`` nodes with the largest free share that have
    ``k`` free; else GPU by GPU, each to the node with the largest free share."""
    sizes = topo.sizes if topo is not None else [max(free) or 1] * len(free)
    emptiest = lambda n: (-free[n] / sizes[n], -free[n], n)   # noqa: E731
    nodes = sorted(range(len(free)), key=emptiest)
    if gpus_per_node is not None:
        return _chunks(free, gpus, gpus_per_node, nodes)
    for node in nodes:
        if free[node] >= gpus:
            return {node: gpus}
    if sum(free) < gpus:
        return None
    left, free, taken = gpus, list(free), {}
    while left:
        node = min(range(len(free)), key=emptiest)
        free[node] -= 1
        taken[node] = taken.get(node, 0) + 1
        left -= 1
    return taken


def topology(free, gpus, gpus_per_node=None, topo=None):
    """Topology-aware (Slurm's ``topology/tree``): the lowest level of the tree that can
    hold the job — one node, then one leaf switch, then the whole cluster — choosing the
    fullest node or switch that fits (best fit), then best fit on the nodes beneath it.

    A switch's room is what the gang could take beneath it: every free GPU, or with
    ``gpus_per_node=k`` ``k`` from each node that has ``k`` free and nothing from the
    others (a node with 8 free gives a 4-per-node gang 4, one with 3 free gives it 0).
    Counted so, best fit beneath a switch whose room suffices always succeeds."""
    k = gpus_per_node
    if k is None or k == gpus:                       # one node, if one can hold it
        node = _fullest(free, [n for n in range(len(free)) if free[n] >= gpus])
        if node is not None:
            return {node: gpus}
    switches = topo.switches if topo is not None else []
    room = [sum(free[n] if k is None else (k if free[n] >= k else 0) for n in members)
            for members in switches]
    fits = [i for i, r in enumerate(room) if r >= gpus]
    if fits:                                         # one leaf switch: the fullest that fits
        leaf = min(fits, key=lambda i: (room[i], i))
        members = set(switches[leaf])
        return best_fit([f if n in members else 0 for n, f in enumerate(free)], gpus, k)
    return best_fit(free, gpus, k)


def _fullest(free, candidates):
    return min(candidates, key=lambda n: (free[n], n)) if candidates else None


PLACEMENTS = {"first_fit": first_fit, "best_fit": best_fit, "spread": spread,
              "topology": topology}


def fits_somewhere(sizes, gpus, gpus_per_node):
    """Whether a job could ever run on nodes of ``sizes`` GPUs: on the empty cluster."""
    return first_fit(list(sizes), gpus, gpus_per_node) is not None


# ----------------------------------------------------------------------- backfill


def reservation(free, running, head, place=first_fit, topo=None):
    """``(time, free GPUs then)``: when ``head`` (``.gpus``, ``.gpus_per_node``) could
    start if the ``running`` jobs, ``[(end, {node: count}), ...]``, end when expected."""
    free, total = list(free), sum(free)
    for end, taken in sorted(running, key=lambda r: r[0]):
        for node, n in taken.items():
            free[node] += n
            total += n
        if total >= head.gpus and place(list(free), head.gpus, head.gpus_per_node,
                                        topo) is not None:
            return end, free
    return math.inf, free


def easy_backfill(now, free, running, queue, place=first_fit, topo=None, duration=None):
    """EASY backfill (Lifka 1995, the "Extensible Argonne Scheduling sYstem"): which of the
    jobs behind the blocked head ``queue[0]`` start now. Only the head is protected; Slurm's
    backfill protects every job it examines (:func:`conservative_backfill`).

    ``free``: free GPUs per node; ``running``: ``[(end, {node: count}), ...]``;
    ``queue``: jobs (``.gpus``, ``.gpus_per_node``, ``.duration``), head first.
    The head gets a reservation: the earliest time it fits as running jobs end. A later
    job, in queue order, starts now if it fits now and either ends by the reservation or
    leaves the head room at the reserved time. ``duration(job, taken)`` gives a job's
    expected seconds (default ``job.duration``). Returns ``[(job, taken), ...]``.
    """
    head = queue[0]
    shadow, free_then = reservation(free, running, head, place, topo)
    free, started = list(free), []
    total = sum(free)
    refused = set()          # requests that did not fit; fewer GPUs later: still refused
    for job in queue[1:]:
        if total == 0:
            break
        request = (job.gpus, job.gpus_per_node)
        if job.gpus > total or request in refused:
            continue
        taken = place(list(free), job.gpus, job.gpus_per_node, topo)
        if taken is None:
            refused.add(request)
            continue
        seconds = duration(job, taken) if duration is not None else job.duration
        if now + seconds > shadow + _EPS:
            trial = list(free_then)
            for node, n in taken.items():
                trial[node] -= n
            if place(list(trial), head.gpus, head.gpus_per_node, topo) is None:
                continue
            free_then = trial
        for node, n in taken.items():
            free[node] -= n
        total -= job.gpus
        started.append((job, taken))
    return started


def conservative_backfill(now, free, running, queue, place=first_fit, topo=None,
                          duration=None):
    """Conservative backfill (Mu'alem & Feitelson 2001), what Slurm's ``sched/backfill``
    does for the jobs it examines: which jobs of ``queue`` start now.

    Every job, in queue order, gets a reservation: the earliest time it fits for its whole
    expected run beside the running jobs (``[(expected end, {node: count}), ...]``) and the
    reservations of the jobs before it. A job whose reservation is ``now`` starts. So no
    job is delayed by a job behind it, not only the head as under :func:`easy_backfill`.
    Same arguments and answer as :func:`easy_backfill`; ``queue[0]`` need not be blocked.
    """
    times, frees = _profile(now, free, running)
    started = []
    for job in queue:
        found = _earliest(times, frees, job, place, topo, duration)
        if found is None:
            continue                 # never fits beside the running jobs: reserve nothing
        i, taken, seconds = found
        _reserve(times, frees, i, times[i] + seconds, taken)
        if i == 0:
            started.append((job, taken))
    return started


def _profile(now, free, running):
    """The free GPUs per node from ``now`` on, as running jobs end when expected:
    ``times`` (ascending, from ``now``) and ``frees[i]``, free GPUs from ``times[i]`` on."""
    times, frees = [now], [list(free)]
    for end, taken in sorted(running, key=lambda r: r[0]):
        if end > times[-1]:
            times.append(end)
            frees.append(list(frees[-1]))
        for node, n in taken.items():
            frees[-1][node] += n
    return times, frees


def _earliest(times, frees, job, place, topo, duration):
    """``(index into times, {node: count}, seconds)``: the earliest step of the profile
    from which ``job`` fits for its whole run, or None."""
    for i, free in enumerate(frees):
        if sum(free) < job.gpus or (i and all(a <= b for a, b in zip(free, frees[i - 1]))):
            continue                 # too few, or nothing freed since the step before
        taken = place(list(free), job.gpus, job.gpus_per_node, topo)
        if taken is None:
            continue
        seconds = duration(job, taken) if duration is not None else job.duration
        window = frees[i:bisect.bisect_left(times, times[i] + seconds - _EPS, i + 1)]
        if any(free[node] < n for free in window for node, n in taken.items()):
            low = [min(gpus) for gpus in zip(*window)]      # per node, over the run
            taken = place(low, job.gpus, job.gpus_per_node, topo)
            if taken is None:
                continue
            longer = duration(job, taken) if duration is not None else job.duration
            if longer > seconds:     # a longer run may meet a later reservation: go on
                continue
            seconds = longer
        return i, taken, seconds
    return None


def _reserve(times, frees, i, end, taken):
    """Take ``taken`` out of the profile from ``times[i]`` until ``end``."""
    j = max(i + 1, bisect.bisect_left(times, end - _EPS))
    if j == len(times) or times[j] > end + _EPS:      # a new step where the job ends
        times.insert(j, end)
        frees.insert(j, list(frees[j - 1]))
    for k in range(i, j):
        for node, n in taken.items():
            frees[k][node] -= n


# ------------------------------------------------------------------------ victims


@dataclass
class Running:
    """A running job as :func:`choose_victims` sees it: its GPUs per node, priority,
    whether it may be preempted, and the GPU-seconds a preemption now would lose."""

    name: str
    taken: dict
    priority: int
    preemptible: bool
    lost: float


def choose_victims(free, running, gpus, gpus_per_node=None, priority=0, topo=None,
                   placement=best_fit):
    """The running jobs to preempt so that a gang of ``gpus`` (at ``priority``) can start.

    Gang-aware: a victim frees all its GPUs at once, and jobs are stopped only if the gang
    then fits (``placement`` on the freed GPUs). Candidates are preemptible jobs of lower
    priority, cheapest first (lost GPU-seconds); once the gang fits, victims that turn out
    unnecessary are spared again, the most expensive first. Returns a list of names, or
    None when no choice lets the gang start (then nothing is stopped).
    """
    candidates = sorted((r for r in running if r.preemptible and r.priority < priority),
                        key=lambda r: (r.lost, r.name))
    freed, chosen = list(free), []
    for victim in candidates:
        if placement(freed, gpus, gpus_per_node, topo) is not None:
            break
        chosen.append(victim)
        for node, n in victim.taken.items():
            freed[node] += n
    if placement(freed, gpus, gpus_per_node, topo) is None:
        return None
    for victim in sorted(chosen, key=lambda r: (-r.lost, r.name)):
        trial = list(freed)
        for node, n in victim.taken.items():
            trial[node] -= n
        if placement(trial, gpus, gpus_per_node, topo) is not None:
            chosen.remove(victim)
            freed = trial
    return [r.name for r in chosen]


# ------------------------------------------------------------------------ results


@dataclass
class JobResult:
    """What happened to one job. ``wait``: seconds it spent not running between submission
    and its end; ``jct``: job completion time, ``end - submit``. ``attempts`` (Philly's
    format): one dict per run, ``start``, ``end``, ``placement``, ``outcome``
    (``"finished"``, ``"preempted"``, ``"failed"`` (its node failed), or ``"running"``: still
    running when ``until`` stopped the simulation, its ``end`` is ``until``)."""

    name: str
    gpus: int
    submit: float
    start: float = None
    end: float = None
    placement: list = field(default_factory=list)
    attempts: list = field(default_factory=list)

    @property
    def jct(self):
        return None if self.end is None else self.end - self.submit

    @property
    def run_time(self):
        """Seconds it held GPUs, all attempts together."""
        return sum(a["end"] - a["start"] for a in self.attempts)

    @property
    def wait(self):
        return None if self.end is None else self.jct - self.run_time

    @property
    def finished(self):
        return self.end is not None


def quantile(values, q):
    """The ``q`` quantile (0..1) of ``values``, nearest rank (no interpolation)."""
    ordered = sorted(values)
    if not ordered:
        return float("nan")
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


class Result:
    """What :func:`simulate` returns: per-job results and the cluster's metrics."""

    def __init__(self, jobs, sizes, switches, free_series, frag_series, busy_gpu_seconds,
                 offered_load, policy, placement, backfill, preemption, unfinished,
                 node_failures=None, until=None):
        self.jobs = jobs
        self.by_name = {j.name: j for j in jobs}
        self.sizes, self.switches = sizes, switches
        self.free_series = free_series            # [(time, free GPUs)] after each event
        self.fragmentation = frag_series          # [(time, free GPUs the head cannot use)]
        self.busy_gpu_seconds = busy_gpu_seconds
        self.offered_load = offered_load
        self.policy, self.placement, self.backfill = policy, placement, backfill
        self.preemption = preemption
        self.unfinished = unfinished              # names still queued or running at `until`
        done = [j for j in jobs if j.finished]
        first = min((j.submit for j in jobs), default=0.0)
        # stopped by `until` with jobs left: the books close at `until`, not at the last end
        last = until if unfinished else max((j.end for j in done), default=first)
        self.makespan = max(0.0, last - first)
        gpu_total = sum(sizes)
        self.utilization = (busy_gpu_seconds / (gpu_total * self.makespan)
                            if self.makespan > 0 else 0.0)
        jcts, waits = [j.jct for j in done], [j.wait for j in done]
        self.mean_jct = sum(jcts) / len(jcts) if jcts else float("nan")
        self.p99_jct, self.p999_jct = quantile(jcts, 0.99), quantile(jcts, 0.999)
        self.median_jct = quantile(jcts, 0.5)
        self.mean_wait = sum(waits) / len(waits) if waits else float("nan")
        self.p99_wait = quantile(waits, 0.99)
        outcomes = [a["outcome"] for j in jobs for a in j.attempts]
        self.failures = outcomes.count("failed")      # attempts a node failure stopped
        self.preemptions = outcomes.count("preempted")
        self.node_failures = node_failures        # failures passed to simulate(), or None

    @property
    def overloaded(self):
        """Whether the jobs ask for more GPU-seconds than the cluster has while they
        arrive: the queue then grows for as long as they keep coming."""
        return self.offered_load > 1.0

    def _time_average(self, series):
        if len(series) < 2 or self.makespan <= 0:
            return 0.0
        total = sum(v * (t1 - t0) for (t0, v), (t1, _) in zip(series, series[1:]))
        return total / (series[-1][0] - series[0][0]) if series[-1][0] > series[0][0] else 0.0

    @property
    def mean_fragmentation(self):
        """Time-averaged share of the cluster's GPUs that are free while the queue's head
        waits although enough GPUs are free in total (the wrong ones)."""
        return self._time_average(self.fragmentation) / sum(self.sizes)

    def utilization_over(self, start, end):
        """Allocated GPU-seconds between ``start`` and ``end`` over the GPUs × that time:
        the utilisation while jobs keep arriving, without the drain at the end."""
        if not end > start:
            raise ValueError(f"end must come after start, got {start!r} and {end!r}")
        busy = sum(len(a["placement"]) * max(0.0, min(a["end"], end) - max(a["start"], start))
                   for j in self.jobs for a in j.attempts)
        return busy / (sum(self.sizes) * (end - start))

    @property
    def mean_free(self):
        """Time-averaged share of the cluster's GPUs that are free."""
        return self._time_average(self.free_series) / sum(self.sizes)

    def summary(self):
        """The metrics users of Pollux, Synergy and Blox read, as a few lines of text."""
        done = sum(j.finished for j in self.jobs)
        lines = [f"{done} of {len(self.jobs)} jobs finished; policy={self.policy}, "
                 f"placement={self.placement}, backfill={self.backfill}, "
                 f"preemption={self.preemption}",
                 f"  JCT mean {_hours(self.mean_jct)}, p99 {_hours(self.p99_jct)}, "
                 f"p99.9 {_hours(self.p999_jct)}; wait mean {_hours(self.mean_wait)}",
                 f"  utilisation {self.utilization:.1%}, makespan "
                 f"{_hours(self.makespan)}, fragmented GPUs {self.mean_fragmentation:.1%}, "
                 f"preemptions {self.preemptions}"]
        if self.node_failures is not None:
            lines.append(f"  {self.node_failures} node failures stopped {self.failures} "
                         "job attempt(s)")
        if self.offered_load == math.inf:
            lines.append("  OVERLOADED: the jobs all arrive at the same time; the queue "
                         "only drains after them")
        elif self.overloaded:
            lines.append(f"  OVERLOADED: the jobs ask for {self.offered_load:.0%} of the "
                         "cluster while they arrive; the queue grows without bound")
        if self.unfinished:
            lines.append(f"  {len(self.unfinished)} job(s) not finished by the end of the "
                         "simulation")
        return "\n".join(lines)

    def __repr__(self):
        return f"<Result {self.summary()}>"

    def timeline(self, ax=None, until=None):
        """A Gantt chart: one row per GPU (grouped by node), one bar per attempt."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(10, 0.12 * sum(self.sizes) + 1))
        row_of, row, ticks = {}, 0, []
        for node, size in enumerate(self.sizes):
            ticks.append((row + (size - 1) / 2, f"node {node}"))
            for gpu in range(size):
                row_of[node, gpu] = row
                row += 1
            row += 1
        cmap = plt.get_cmap("tab20")
        for i, job in enumerate(self.jobs):
            for attempt in job.attempts:
                start, end = attempt["start"], attempt["end"]
                if until is not None and start >= until:
                    continue
                for node, gpu in attempt["placement"]:
                    ax.barh(row_of[node, gpu], end - start, left=start, height=0.9,
                            color=cmap(i % 20),
                            hatch="//" if attempt["outcome"] == "preempted" else None)
        ax.set_yticks([t for t, _ in ticks], [name for _, name in ticks])
        ax.invert_yaxis()
        ax.set_xlabel("simulated time (s)")
        if until is not None:
            ax.set_xlim(0, until)
        ax.set_title(f"{self.policy} / {self.placement}: one bar per job attempt "
                     "(hatched: preempted)")
        return ax

    def free_gpus_plot(self, ax=None):
        """Free GPUs over time, and those of them the waiting head cannot use."""
        import matplotlib.pyplot as plt

        if ax is None:
            _, ax = plt.subplots(figsize=(8, 3))
        t, v = zip(*self.free_series)
        ax.step(t, v, where="post", label="free GPUs")
        t, v = zip(*self.fragmentation)
        ax.step(t, v, where="post", label="free, but the queue's head cannot use them")
        ax.set_xlabel("simulated time (s)")
        ax.set_ylabel("GPUs")
        ax.legend(loc="upper right")
        return ax


def _hours(seconds):
    if seconds != seconds:
        return "n/a"
    return f"{seconds / 3600:.2f} h"


# ---------------------------------------------------------------------- simulator


class _State:
    """A queued or running job inside the simulator."""

    __slots__ = ("job", "index", "result", "done", "taken", "gpus_of", "start", "end",
                 "duration_here", "overhead", "estimate", "planned_end", "version", "gpus", "gpus_per_node")

    def __init__(self, job, index, estimate):
        self.job, self.index = job, index
        self.result = JobResult(job.name, job.gpus, float(job.submit))
        self.done = 0.0            # fraction of the work saved in checkpoints
        self.taken = None          # {node: count} while running
        self.gpus_of = None        # [(node, gpu)] while running
        self.start = self.end = self.duration_here = self.overhead = None
        self.planned_end = None    # the end backfill expects, by time_limit if there is one
        self.estimate = estimate   # seconds on the most compact placement, for SJF/backfill
        self.version = 0           # bumped when preempted: stale end events are skipped
        self.gpus, self.gpus_per_node = job.gpus, job.gpus_per_node


def _resolve_placement(placement):
    if callable(placement):
        return placement, getattr(placement, "__name__", "custom")
    if placement not in PLACEMENTS:
        raise ValueError(f"unknown placement {placement!r}; choose one of "
                         f"{', '.join(PLACEMENTS)} or pass a function")
    return PLACEMENTS[placement], placement


def _compact(sizes, gpus, k):
    """The most compact placement on the empty cluster, biggest nodes first: what SJF and
    backfill assume a job with a placement-dependent duration will take."""
    order = sorted(range(len(sizes)), key=lambda n: (-sizes[n], n))
    taken = _chunks(sizes, gpus, k, order)
    return [(node, g) for node, n in sorted(taken.items()) for g in range(n)]


def _seconds(job, placement):
    value = job.duration(placement) if callable(job.duration) else job.duration
    if not _positive_number(value):
        raise ValueError(f"job {job.name!r}: its duration function returned {value!r} for "
                         f"placement {placement[:4]}{'...' if len(placement) > 4 else ''}; "
                         "it must return a positive number of seconds")
    return float(value)


def simulate(jobs, cluster, policy="fifo", placement="first_fit", backfill=False,
             preemption=False, weights=None, switches=None, until=None, failures=None):
    """Run ``jobs`` on ``cluster`` and return a :class:`Result`.

    Args:
        jobs: :class:`Job` objects with unique names.
        cluster: a :class:`~simcluster.Cluster` or :class:`~simcluster.spec.ClusterSpec`;
            only its nodes' GPU counts (and ``switches``) matter here.
        policy: the queue's order: ``"fifo"`` (submission), ``"sjf"`` (shortest job
            first), ``"priority"`` (highest first, then submission), ``"fair"`` (the queue
            with the smallest share of running GPUs per ``weights`` goes next, as
            Volcano's and Kueue's fair sharing).
        placement: ``"first_fit"``, ``"best_fit"``, ``"spread"``, ``"topology"`` or a
            function ``(free, gpus, gpus_per_node, topo) -> {node: count} | None``
            (``topo``: the cluster's :class:`Topology`).
        backfill: ``False``; ``"easy"`` (or ``True``): when the queue's head does not fit,
            later jobs may start if they end before the head's reserved start or leave it
            room (:func:`easy_backfill`); ``"conservative"``: each of the first
            ``BACKFILL_DEPTH`` queued jobs gets a reservation in queue order, and a job
            starts early only if that delays none of them (:func:`conservative_backfill`,
            Slurm's ``sched/backfill``). Both plan with ``Job.time_limit`` when set.
        preemption: a job that does not fit may preempt running ``preemptible`` jobs of
            lower priority (:func:`choose_victims`).
        weights: ``{queue: weight}`` for ``policy="fair"`` (default 1 each).
        switches: the leaf switches, lists of node indices (default :func:`leaf_switches`).
        until: stop at this simulated time; jobs not done are listed in
            ``result.unfinished`` (a run never goes on forever).
        failures: ``[(time, node, seconds_down), ...]``: at ``time`` the node fails; the
            jobs on it stop (keeping what their checkpoints saved, as after a preemption)
            and queue again, and the node is back ``seconds_down`` later. A failure of a
            node that is already down is ignored.

    Raises ``ValueError`` for a job that can never fit the cluster, duplicate names or an
    unknown policy or placement, naming it.
    """
    if policy not in POLICIES:
        raise ValueError(f"unknown policy {policy!r}; choose one of {', '.join(POLICIES)}")
    if backfill is True:
        backfill = "easy"
    if backfill not in (False, None, *BACKFILLS):
        raise ValueError(f"unknown backfill {backfill!r}; choose False, True (easy) or one "
                         f"of {', '.join(BACKFILLS)}")
    backfill = backfill or False
    place, place_name = _resolve_placement(placement)
    topo = topology_of(cluster, switches)
    sizes, switches = topo.sizes, topo.switches
    if until is not None and not _positive_number(until):
        raise ValueError(f"until must be a positive number of seconds, got {until!r}")
    jobs = list(jobs)
    names = set()
    states = []
    for index, job in enumerate(jobs):
        if not isinstance(job, Job):
            raise ValueError(f"jobs[{index}] is {job!r}, not a scheduling.Job")
        job.validate()                  # its fields may have changed since it was made
        if job.name in names:
            raise ValueError(f"two jobs are called {job.name!r}; names must be unique")
        names.add(job.name)
        if not fits_somewhere(sizes, job.gpus, job.gpus_per_node):
            per = ("" if job.gpus_per_node is None
                   else f" with gpus_per_node={job.gpus_per_node}")
            raise ValueError(
                f"job {job.name!r} asks for {job.gpus} GPUs{per}, which never fits "
                f"{getattr(getattr(cluster, 'spec', cluster), 'name', 'the cluster')} "
                f"(nodes of {', '.join(map(str, sorted(set(sizes))))} GPUs, "
                f"{sum(sizes)} in all): refused at submission")
        estimate = _seconds(job, _compact(sizes, job.gpus, job.gpus_per_node))
        states.append(_State(job, index, estimate))
    weights = _check_weights(weights, policy, {s.job.queue for s in states})

    failures = _check_failures(failures, len(sizes))
    sim = _Simulation(states, topo, place, policy, backfill, preemption, weights, failures)
    sim.run(until)
    offered = _offered_load(states, sum(sizes))
    unfinished = [s.job.name for s in states if s.result.end is None]
    return Result([s.result for s in states], sizes, switches, sim.free_series,
                  sim.frag_series, sim.busy, offered, policy, place_name, backfill,
                  preemption, unfinished, None if failures is None else len(failures), until)


def _offered_load(states, gpus):
    """GPU-seconds asked for per GPU-second of the cluster while the jobs arrive: infinite
    when two or more jobs all arrive at the same time, 0 for fewer than two jobs."""
    arrivals = [s.job.submit for s in states]
    if len(arrivals) < 2:
        return 0.0
    span = max(arrivals) - min(arrivals)
    demand = sum(s.job.gpus * s.estimate for s in states)
    return demand / (gpus * span) if span > 0 else math.inf


def _check_weights(weights, policy, queues):
    """``{queue: weight}`` for every queue of the jobs (default 1); a weight for a queue
    no job uses, or weights under another policy than ``"fair"``, is refused."""
    weights = dict(weights or {})
    if weights and policy != "fair":
        raise ValueError(f"weights= applies to policy='fair' only, not {policy!r}")
    for queue, weight in weights.items():
        if queue not in queues:
            raise ValueError(f"weights names queue {queue!r}, which no job uses (queues: "
                             f"{', '.join(map(repr, sorted(queues, key=str)))})")
        if not _positive_number(weight):
            raise ValueError(f"weights[{queue!r}] must be a positive number, got {weight!r}")
    return {queue: weights.get(queue, 1.0) for queue in queues}


def _check_failures(failures, nodes):
    """``failures`` as a sorted list of ``(time, node, seconds_down)``, or None; a
    malformed entry is named."""
    if failures is None:
        return None
    out = []
    for i, entry in enumerate(failures):
        ok = isinstance(entry, (tuple, list)) and len(entry) == 3
        if ok:
            time, node, down = entry
            ok = (_positive_number(time, zero=True) and _is_int(node) and 0 <= node < nodes
                  and _positive_number(down))
        if not ok:
            raise ValueError(f"failures[{i}] is {entry!r}; expected (time >= 0, node index "
                             f"below {nodes}, seconds down > 0)")
        out.append((float(time), node, float(down)))
    return sorted(out)


class _Simulation:
    """The event loop of :func:`simulate` (one object per call)."""

    def __init__(self, states, topo, place, policy, backfill, preemption, weights,
                 failures=None):
        self.states, self.topo, sizes = states, topo, topo.sizes
        self.failures = failures or []             # sorted (time, node, seconds down)
        self.repairs = []                          # heap of (time, node) back up
        self.place, self.policy = place, policy
        self.backfill, self.preemption, self.weights = backfill, preemption, weights
        self.free = list(sizes)
        self.free_ids = [list(range(s)) for s in sizes]   # lowest GPU index first
        self.queue, self.keys, self.running = [], [], {}   # queue sorted by _key
        self.ends = []                                     # heap of (end, index, version)
        self.busy = 0.0
        self.now = 0.0
        self.free_series, self.frag_series = [], []
        self.alloc_by_queue = {}
        self.tenants = {}             # fair: {queue: (keys, states)}, each sorted by _key

    # -- the loop
    def run(self, until):
        arrivals = sorted(self.states, key=lambda s: (s.job.submit, s.index))
        a = f = 0
        # a queued job may wait for a node to come back, but failures alone go on forever
        while a < len(arrivals) or self.ends or (self.queue and self.repairs):
            t_arrival = arrivals[a].job.submit if a < len(arrivals) else math.inf
            t_end = self.ends[0][0] if self.ends else math.inf
            t_fail = self.failures[f][0] if f < len(self.failures) else math.inf
            t_repair = self.repairs[0][0] if self.repairs else math.inf
            self.now = min(t_arrival, t_end, t_fail, t_repair)
            if until is not None and self.now > until:
                break
            while self.ends and self.ends[0][0] <= self.now:
                _, index, version = heapq.heappop(self.ends)
                state = self.states[index]
                if version == state.version:
                    self._finish(state)
            while self.repairs and self.repairs[0][0] <= self.now:
                self._node_up(heapq.heappop(self.repairs)[1])
            while f < len(self.failures) and self.failures[f][0] <= self.now:
                self._node_down(*self.failures[f][1:])
                f += 1
            while a < len(arrivals) and arrivals[a].job.submit <= self.now:
                self._enqueue(arrivals[a])
                a += 1
            self._schedule()
            self._record()
        if until is not None:
            self.now = min(self.now, until)
            for state in self.running.values():         # close the open attempts' books
                self.busy += state.job.gpus * (self.now - state.start)
                state.result.attempts.append({"start": state.start, "end": self.now,
                                              "placement": state.gpus_of,
                                              "outcome": "running"})

    def _record(self):
        free = sum(self.free)
        frag = 0
        if self.head is not None and free >= self.head.job.gpus:
            frag = free
        if self.free_series and self.free_series[-1][0] == self.now:
            self.free_series[-1] = (self.now, free)
            self.frag_series[-1] = (self.now, frag)
        else:
            self.free_series.append((self.now, free))
            self.frag_series.append((self.now, frag))

    # -- the queue's order
    def _key(self, s):
        """A job's place in the queue; it never changes, so the queue stays sorted."""
        if self.policy == "sjf":
            return (s.estimate, s.job.submit, s.index)
        if self.policy == "priority":
            return (-s.job.priority, s.job.submit, s.index)
        return (s.job.submit, s.index)                # fifo, and fair within a tenant

    def _enqueue(self, state):
        key = self._key(state)
        at = bisect.bisect(self.keys, key)
        self.keys.insert(at, key)
        self.queue.insert(at, state)
        if self.policy == "fair":
            keys, states = self.tenants.setdefault(state.job.queue, ([], []))
            at = bisect.bisect(keys, key)
            keys.insert(at, key)
            states.insert(at, state)

    def _dequeue(self, state):
        key = self._key(state)
        at = bisect.bisect_left(self.keys, key)
        del self.keys[at], self.queue[at]
        if self.policy == "fair":
            keys, states = self.tenants[state.job.queue]
            at = bisect.bisect_left(keys, key)
            del keys[at], states[at]
            if not states:
                del self.tenants[state.job.queue]

    def _order(self, limit):
        """The first ``limit`` queued jobs in the policy's order."""
        if self.policy != "fair":
            return self.queue[:limit]
        # fair: merge the tenants' FIFO queues, always taking from the one whose running
        # GPUs (plus those already handed out in this order) per weight is the smallest
        share = {q: self.alloc_by_queue.get(q, 0) for q in self.tenants}
        heads = dict.fromkeys(self.tenants, 0)
        heap = [(share[q] / self.weights[q], q) for q in self.tenants]
        heapq.heapify(heap)
        order = []
        while heap and len(order) < limit:
            _, q = heapq.heappop(heap)
            states = self.tenants[q][1]
            state = states[heads[q]]
            heads[q] += 1
            share[q] += state.job.gpus
            order.append(state)
            if heads[q] < len(states):
                heapq.heappush(heap, (share[q] / self.weights[q], q))
        return order

    # -- one scheduling pass
    def _schedule(self):
        self.head = None
        while self.queue:
            order = self._order(BACKFILL_DEPTH + 1)
            head = order[0]
            taken = (self._fits(head, self.free) if head.job.gpus <= sum(self.free)
                     else None)
            if taken is not None:
                self._start(head, taken)
                continue
            if self.preemption and self._preempt_for(head):
                continue
            self.head = head                    # waits: what fragmentation is measured for
            if self.backfill:
                self._backfill(head, order[1:BACKFILL_DEPTH + 1])
            return

    def _fits(self, state, free):
        job = state.job
        taken = self.place(list(free), job.gpus, job.gpus_per_node, self.topo)
        return taken

    def _backfill(self, head, later):
        running = [(s.planned_end, s.taken) for s in self.running.values()]
        plan = conservative_backfill if self.backfill == "conservative" else easy_backfill
        for state, taken in plan(self.now, self.free, running, [head, *later], self.place,
                                 self.topo, self._expected):
            self._start(state, taken)

    def _expected(self, state, taken):
        """Seconds ``state`` would run on ``taken`` by its ``time_limit`` (else its true
        run time): what backfill plans with."""
        limit = state.job.time_limit
        seconds = (limit if limit is not None
                   else _seconds(state.job, _gpu_list(taken, self.free_ids)))
        overhead = state.job.restart_cost if state.result.attempts else 0.0
        return overhead + (1.0 - state.done) * seconds

    def _preempt_for(self, head):
        """Preempt lower-priority jobs if that lets ``head`` start; True if it did."""
        running = [Running(s.job.name, dict(s.taken), s.job.priority, s.job.preemptible,
                           self._lost(s)) for s in self.running.values()]
        victims = choose_victims(self.free, running, head.job.gpus, head.job.gpus_per_node,
                                 head.job.priority, self.topo, self.place)
        if not victims:
            return False
        by_name = {s.job.name: s for s in self.running.values()}
        for name in victims:
            self._stop(by_name[name])
        taken = self._fits(head, self.free)
        if taken is None:        # a custom placement that is not monotone: say so
            raise RuntimeError(f"placement {self.place.__name__} refused "
                               f"{head.job.name!r} after the victims were stopped")
        self._start(head, taken)
        return True

    def _lost(self, state):
        """GPU-seconds of work since the last checkpoint that a preemption now throws away."""
        return state.job.gpus * (self.now - state.start - self._saved_seconds(state)
                                 if self.now > state.start else 0.0)

    def _saved_seconds(self, state):
        """Seconds of this attempt (restart overhead included) kept by its checkpoints."""
        useful = max(0.0, self.now - state.start - state.overhead)
        every = state.job.checkpoint_every
        if every is None:
            return 0.0
        return state.overhead + math.floor(useful / every + _EPS) * every

    # -- starting and stopping
    def _start(self, state, taken):
        _check_taken(taken, self.free, state.job, self.place)   # a custom rule may err
        self._dequeue(state)
        gpus = []
        for node, n in sorted(taken.items()):
            ids = self.free_ids[node]
            gpus += [(node, g) for g in ids[:n]]
            del ids[:n]
            self.free[node] -= n
        state.taken, state.gpus_of = taken, gpus
        state.duration_here = _seconds(state.job, gpus)
        state.overhead = state.job.restart_cost if state.result.attempts else 0.0
        state.start = self.now
        state.end = self.now + state.overhead + (1.0 - state.done) * state.duration_here
        limit = state.job.time_limit
        state.planned_end = (state.end if limit is None
                             else self.now + state.overhead + (1.0 - state.done) * limit)
        if state.result.start is None:
            state.result.start = self.now
        state.result.placement = gpus
        self.running[state.index] = state
        self.alloc_by_queue[state.job.queue] = (self.alloc_by_queue.get(state.job.queue, 0)
                                                + state.job.gpus)
        heapq.heappush(self.ends, (state.end, state.index, state.version))

    def _release(self, state, outcome):
        for node, n in state.taken.items():
            self.free[node] += n
        for node, g in state.gpus_of:
            self.free_ids[node].append(g)
        for node in state.taken:
            self.free_ids[node].sort()
        self.busy += state.job.gpus * (self.now - state.start)
        state.result.attempts.append({"start": state.start, "end": self.now,
                                      "placement": state.gpus_of, "outcome": outcome})
        del self.running[state.index]
        self.alloc_by_queue[state.job.queue] -= state.job.gpus
        state.taken = state.gpus_of = None

    def _finish(self, state):
        self._release(state, "finished")
        state.result.end = self.now

    def _stop(self, state, outcome="preempted"):
        saved = self._saved_seconds(state) - state.overhead
        state.done = min(1.0, state.done + max(0.0, saved) / state.duration_here)
        state.version += 1
        self._release(state, outcome)
        self._enqueue(state)

    # -- node failures
    def _node_down(self, node, seconds):
        if any(n == node for _, n in self.repairs):
            return                                  # already down
        for state in [s for s in self.running.values() if node in s.taken]:
            self._stop(state, "failed")
        self.free[node], self.free_ids[node] = 0, []
        heapq.heappush(self.repairs, (self.now + seconds, node))

    def _node_up(self, node):
        size = self.topo.sizes[node]
        self.free[node], self.free_ids[node] = size, list(range(size))


def _gpu_list(taken, free_ids):
    return [(node, g) for node, n in sorted(taken.items()) for g in free_ids[node][:n]]


def _check_taken(taken, free, job, place):
    """A placement function's answer must be a gang that fits: say which rule broke it."""
    name = getattr(place, "__name__", "placement")
    if not isinstance(taken, dict):
        raise ValueError(f"placement {name} returned {taken!r} for job {job.name!r}; "
                         "expected {node: GPUs} or None")
    if sum(taken.values()) != job.gpus:
        raise ValueError(f"placement {name} gave job {job.name!r} {sum(taken.values())} "
                         f"GPUs, it asked for {job.gpus}")
    for node, n in taken.items():
        if not (_is_int(node) and 0 <= node < len(free)) or not _is_int(n) or n < 1:
            raise ValueError(f"placement {name} returned {taken!r} for job {job.name!r}: "
                             "keys must be node indices, values positive GPU counts")
        if n > free[node]:
            raise ValueError(f"placement {name} put {n} GPUs of job {job.name!r} on node "
                             f"{node}, which has {free[node]} free")
        if job.gpus_per_node is not None and n != job.gpus_per_node:
            raise ValueError(f"placement {name} put {n} GPUs of job {job.name!r} on node "
                             f"{node}; it asked for gpus_per_node={job.gpus_per_node}")


# ------------------------------------------------------------------- workloads


# Job sizes (GPUs, gpus_per_node, probability): mostly single-GPU jobs, as in Philly and
# Alibaba PAI (where 43.6 % of GPU pods ask for less than one GPU: here one GPU, and
# 0.6 % ask for 8), and a few gangs of 8 (one NVLink domain) and 16 (docs/reference-numbers.md).
SIZES = ((1, None, 0.62), (2, None, 0.12), (4, None, 0.14), (4, 4, 0.06),
         (8, 8, 0.04), (16, None, 0.02))
# Run times: log-normal through Philly's median (1,186 s) and 90th percentile (12,858 s).
PHILLY_MEDIAN_S, PHILLY_P90_S = 1186.0, 12858.0
_Z90 = 1.2815515655446004


def synthetic_trace(n, cluster, seed=0, rate=None, load=0.8, sizes=SIZES,
                    max_duration=7 * 24 * 3600.0):
    """``n`` jobs with Poisson arrivals and heavy-tailed (log-normal) run times.

    Durations follow Philly's median and 90th percentile (its 99th, 287,239 s, has an
    even heavier tail; ``max_duration`` caps a week). ``rate`` is jobs per second; without
    it the rate is chosen so that the jobs ask for ``load`` of the cluster's GPU-seconds.
    Run times are whole seconds; gaps between arrivals are whole seconds too when they
    average 100 s or more, else multiples of a power of two below a hundredth of the mean
    gap (a big cluster's jobs arrive many a second), so every CPU adds them up exactly.
    Deterministic for a given ``seed``.
    """
    if not _is_int(n) or n < 0:
        raise ValueError(f"n must be a non-negative integer, got {n!r}")
    sizes = list(sizes)
    node = node_sizes(cluster)
    for gpus, k, _ in sizes:
        if not fits_somewhere(node, gpus, k):
            raise ValueError(f"a job of {gpus} GPUs (gpus_per_node={k}) never fits "
                             "this cluster; pass sizes= without it")
    rng = random.Random(seed)
    mu = math.log(PHILLY_MEDIAN_S)
    sigma = (math.log(PHILLY_P90_S) - mu) / _Z90
    total = sum(p for *_, p in sizes)
    drawn = []
    for _ in range(n):
        u, acc = rng.random() * total, 0.0
        for gpus, k, p in sizes:
            acc += p
            if u < acc:
                break
        duration = min(max_duration, max(1.0, round(rng.lognormvariate(mu, sigma))))
        drawn.append((gpus, k, duration))
    if rate is None:
        if not _positive_number(load):
            raise ValueError(f"load must be a positive number, got {load!r}")
        mean_demand = sum(g * d for g, _, d in drawn) / max(1, n)
        rate = load * sum(node) / mean_demand if mean_demand else 1.0
    elif not _positive_number(rate):
        raise ValueError(f"rate must be a positive number of jobs per second, got {rate!r}")
    tick = min(1.0, 2.0 ** math.floor(math.log2(1 / (100 * rate))))
    jobs, t = [], 0.0
    for i, (gpus, k, duration) in enumerate(drawn):
        t += round(rng.expovariate(rate) / tick) * tick
        jobs.append(Job(f"job{i}", gpus, duration, submit=t, gpus_per_node=k))
    return jobs


def node_failures(nodes, per_node_per_day, seconds, repair, spares=0, swap=None, seed=0):
    """Random node failures for :func:`simulate`'s ``failures``: ``[(time, node, down)]``.

    Failures arrive as a Poisson process of ``nodes * per_node_per_day`` a day over
    ``seconds``, each on a node drawn uniformly. A failed node is out for ``repair``
    seconds; with ``spares`` hot spare nodes (outside the ``nodes`` the scheduler sees),
    a free spare takes its place after ``swap`` seconds instead, and the repaired node
    becomes a spare when it is back. Deterministic for a given ``seed``.
    """
    for name, value in (("per_node_per_day", per_node_per_day), ("seconds", seconds),
                        ("repair", repair)):
        if not _positive_number(value, zero=name == "per_node_per_day"):
            raise ValueError(f"{name} must be a positive number, got {value!r}")
    if not _is_int(nodes) or nodes < 1:
        raise ValueError(f"nodes must be a positive integer, got {nodes!r}")
    if not _is_int(spares) or spares < 0:
        raise ValueError(f"spares must be an integer >= 0, got {spares!r}")
    if spares and not _positive_number(swap):
        raise ValueError(f"swap must be a positive number of seconds with spares, got {swap!r}")
    rng = random.Random(seed)
    rate = nodes * per_node_per_day / 86400.0
    out, t, back = [], 0.0, []          # back: times repaired nodes rejoin the spares
    free_spares = spares
    while rate > 0:
        t += rng.expovariate(rate)
        if t >= seconds:
            break
        while back and back[0] <= t:
            heapq.heappop(back)
            free_spares += 1
        node = rng.randrange(nodes)
        if free_spares:
            free_spares -= 1
            heapq.heappush(back, t + repair)
            out.append((round(t), node, float(swap)))
        else:
            out.append((round(t), node, float(repair)))
    return out
