"""simcluster.scheduling: invariants on random job sets, each placement rule on hand-made
cases, backfill, preemption, fair share, and the edge cases (refused jobs, overload)."""

import dataclasses
import random

import pytest

import simcluster as sc
from simcluster import scheduling as sched

HETERO = sc.Cluster.preset("hetero-11")
SWITCHES = sched.leaf_switches(HETERO)
TOPO = sched.topology_of(HETERO)
SIZES = sched.node_sizes(HETERO)


def random_jobs(seed, n=60, preemptible=False):
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        gpus, k = rng.choice([(1, None), (2, None), (3, None), (4, None), (4, 4), (8, 8),
                              (8, 4), (12, None), (16, None)])
        jobs.append(sched.Job(f"j{i}", gpus, float(rng.randint(10, 5000)),
                              submit=float(rng.randint(0, 20000)), gpus_per_node=k,
                              priority=rng.randint(0, 2),
                              preemptible=preemptible and rng.random() < 0.6,
                              checkpoint_every=float(rng.choice([100, 600])),
                              restart_cost=30.0, queue=rng.choice("ab")))
    return jobs


CONFIGS = [dict(policy=p, placement=pl, backfill=b)
           for p in ("fifo", "sjf", "priority", "fair")
           for pl in ("first_fit", "best_fit", "spread", "topology")
           for b in (False, True, "conservative")]


def intervals(result):
    """Every attempt as (node, gpu, start, end, job)."""
    return [(node, gpu, a["start"], a["end"], j.name)
            for j in result.jobs for a in j.attempts for node, gpu in a["placement"]]


def assert_no_oversubscription(result):
    by_gpu = {}
    for node, gpu, start, end, name in intervals(result):
        assert 0 <= gpu < SIZES[node]
        by_gpu.setdefault((node, gpu), []).append((start, end, name))
    for spans in by_gpu.values():
        spans.sort()
        for (s0, e0, n0), (s1, e1, n1) in zip(spans, spans[1:]):
            assert s1 >= e0, f"{n0} and {n1} share a GPU"


def assert_gangs(result, jobs):
    for job, res in zip(jobs, result.jobs):
        assert res.finished
        for a in res.attempts:
            assert len(a["placement"]) == job.gpus == len(set(a["placement"]))
            if job.gpus_per_node is not None:
                per_node = {}
                for node, _ in a["placement"]:
                    per_node[node] = per_node.get(node, 0) + 1
                assert set(per_node.values()) == {job.gpus_per_node}


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: "-".join(map(str, c.values())))
def test_invariants_on_random_jobs(config):
    jobs = random_jobs(1)
    result = sched.simulate(jobs, HETERO, **config)
    assert_no_oversubscription(result)
    assert_gangs(result, jobs)
    for job, res in zip(jobs, result.jobs):
        assert res.jct == pytest.approx(res.wait + job.duration)
        assert res.start >= job.submit
        assert len(res.attempts) == 1
    busy = sum(a["end"] - a["start"] for j in result.jobs for a in j.attempts
               for _ in a["placement"])
    assert result.utilization == pytest.approx(busy / (sum(SIZES) * result.makespan))
    first = min(j.submit for j in jobs)
    assert result.utilization_over(first, first + result.makespan) == pytest.approx(
        result.utilization)


@pytest.mark.parametrize("placement", sorted(sched.PLACEMENTS))
def test_invariants_with_preemption(placement):
    jobs = random_jobs(2, preemptible=True)
    result = sched.simulate(jobs, HETERO, policy="priority", placement=placement,
                            preemption=True, backfill=True)
    assert result.preemptions > 0
    assert_no_oversubscription(result)
    assert_gangs(result, jobs)
    for job, res in zip(jobs, result.jobs):
        assert [a["outcome"] for a in res.attempts][-1] == "finished"
        if len(res.attempts) > 1:
            assert job.preemptible
        # it ran at least its duration, and the restarts cost something
        assert res.run_time >= job.duration - 1e-6


def test_deterministic():
    jobs = sched.synthetic_trace(500, HETERO, seed=3)
    a = sched.simulate(jobs, HETERO, placement="topology", backfill=True)
    b = sched.simulate(sched.synthetic_trace(500, HETERO, seed=3), HETERO,
                       placement="topology", backfill=True)
    assert [(j.start, j.end, j.placement) for j in a.jobs] == \
        [(j.start, j.end, j.placement) for j in b.jobs]
    assert a.summary() == b.summary()
    assert sched.synthetic_trace(50, HETERO, seed=4)[7] != sched.synthetic_trace(
        50, HETERO, seed=5)[7]


def test_littles_law_on_a_long_poisson_trace():
    """L = λW in steady state: over the middle of a long Poisson trace at about 70 % load,
    the time-averaged number of jobs in the system equals the arrival rate times the mean
    time in the system of the jobs that arrived then. (Exponential run times: Philly's
    heavy tail would need a far longer trace to converge.)"""
    rng = random.Random(11)
    jobs, t = [], 0.0
    for i in range(8000):
        t += rng.expovariate(1 / 90.0)      # 2.83 GPUs x 1000 s / 90 s = 66 % of 48
        gpus = rng.choice([1, 1, 1, 2, 4, 8])
        jobs.append(sched.Job(f"p{i}", gpus, rng.expovariate(1 / 1000.0) + 1.0, submit=t))
    result = sched.simulate(jobs, HETERO, placement="best_fit", backfill=True)
    t0, t1 = jobs[1000].submit, jobs[7000].submit
    arrived = [j for j in result.jobs if t0 <= j.submit < t1]
    rate = len(arrived) / (t1 - t0)
    mean_jct = sum(j.jct for j in arrived) / len(arrived)
    area = sum(max(0.0, min(j.end, t1) - max(j.submit, t0)) for j in result.jobs)
    in_system = area / (t1 - t0)
    assert in_system == pytest.approx(rate * mean_jct, rel=0.03)
    assert 0.5 < result.offered_load < 1 and not result.overloaded


def test_synthetic_trace_follows_philly():
    jobs = sched.synthetic_trace(4000, HETERO, seed=0)
    durations = sorted(j.duration for j in jobs)
    assert sched.quantile(durations, 0.5) == pytest.approx(1186, rel=0.1)
    assert sched.quantile(durations, 0.9) == pytest.approx(12858, rel=0.15)
    assert all(j.duration == int(j.duration) and j.submit == int(j.submit) for j in jobs)
    single = sum(j.gpus == 1 for j in jobs) / len(jobs)
    assert 0.55 < single < 0.7


# ----------------------------------------------------------- placement rules by hand


def test_first_fit_takes_the_lowest_nodes():
    assert sched.first_fit([2, 4, 4], 4) == {0: 2, 1: 2}
    assert sched.first_fit([2, 4, 4], 4, 4) == {1: 4}
    assert sched.first_fit([2, 3], 6) is None


def test_best_fit_takes_the_fullest_node_that_fits():
    assert sched.best_fit([4, 2, 3, 8], 2) == {1: 2}
    assert sched.best_fit([4, 2, 3, 8], 3) == {2: 3}
    # no node holds 10: a whole 8, then the fullest node that holds the remaining 2
    assert sched.best_fit([4, 2, 3, 8], 10) == {3: 8, 1: 2}
    assert sched.best_fit([4, 2, 3, 8], 18) is None
    assert sched.best_fit([4, 2, 4, 3], 8, 4) == {0: 4, 2: 4}
    assert sched.best_fit([8, 4, 4], 4, 4) == {1: 4}


def test_spread_balances_the_load():
    topo = sched.Topology([4, 4, 4], [[0, 1, 2]])
    assert sched.spread([3, 4, 2], 3, None, topo) == {1: 3}
    assert sched.spread([1, 4, 2], 2, None, topo) == {1: 2}
    assert sched.spread([4, 3, 4], 4, 2, topo) == {0: 2, 2: 2}
    assert sched.spread([2, 3, 1], 5, None, topo) == {0: 2, 1: 3}   # GPU by GPU
    assert sched.spread([1, 1, 1], 4, None, topo) is None
    # the largest free share, not the most free GPUs: 3 of 4 beats 4 of 8
    assert sched.spread([3, 4], 2, None, sched.Topology([4, 8], [[0, 1]])) == {0: 2}


def test_topology_prefers_one_node_then_one_switch():
    switches = sched.Topology([4] * 4, [[0, 1], [2, 3]])
    assert sched.topology([4, 2, 4, 4], 2, None, switches) == {1: 2}
    # 6 GPUs: switch 0 has 5 free, switch 1 has 8: the job stays under switch 1
    assert sched.topology([3, 2, 4, 4], 6, None, switches) == {2: 4, 3: 2}
    # both switches fit: the fuller one (best fit), then best fit beneath it
    assert sched.topology([4, 3, 4, 4], 5, None, switches) == {0: 4, 1: 1}
    # nothing fits one switch: the whole tree
    assert sched.topology([3, 3, 3, 3], 10, None, switches) == {0: 3, 1: 3, 2: 3, 3: 1}
    # first fit would cross the switches here
    assert sched.first_fit([2, 2, 4, 4], 8) == {0: 2, 1: 2, 2: 4}
    assert sched.topology([2, 2, 4, 4], 8, None, switches) == {2: 4, 3: 4}


def test_topology_counts_only_what_a_per_node_gang_can_take():
    # switch 1's node has 8 free, but a 4-per-node gang takes 4 there: its room is 4,
    # so the gang goes under switch 0 (issue 43: the old rule counted 8 and gave up)
    topo = sched.Topology([4, 4, 4, 4, 8], [[0, 1, 2], [3, 4]])
    assert sched.topology([4, 4, 4, 0, 8], 8, 4, topo) == {0: 4, 1: 4}
    # k per node: a node with 3 free offers nothing (not 3)
    assert sched.topology([4, 3, 3, 4, 4], 8, 4, sched.Topology([4] * 5, [[0, 1, 2], [3, 4]])) \
        == {3: 4, 4: 4}


def test_topology_places_whatever_fits_and_stays_under_a_switch_when_one_can_hold_it():
    # on random free GPUs: the rule never keeps a gang waiting that fits the cluster, and
    # it uses one leaf switch whenever some switch has k free on enough of its nodes
    rng = random.Random(3)
    topo = sched.Topology(SIZES, SWITCHES)
    for _ in range(2000):
        free = [rng.randint(0, s) for s in SIZES]
        gpus, k = rng.choice([(2, None), (6, None), (8, 4), (8, 2), (12, 4), (16, 4)])
        taken = sched.topology(list(free), gpus, k, topo)
        assert (taken is None) == (sched.best_fit(list(free), gpus, k) is None), (free, gpus, k)
        one_switch = any(sum(1 for n in members if free[n] >= k) >= gpus // k
                         for members in SWITCHES) if k else False
        if one_switch:
            assert sched.spans([(n, 0) for n in taken], SWITCHES)[1] == 1, (free, gpus, k)


def test_topology_does_not_keep_a_per_node_gang_waiting_beside_free_nodes():
    """Issue 43's scenario on hetero-11: nodes 1-3 (switch 0) have 4 GPUs free each, node 7
    (switch 1) has 8; an 8-GPU gang of 4 per node waited 99,990 s for the long jobs."""
    long, short = 100_000.0, 10.0
    jobs = [sched.Job(f"b{i}", 4, short if i in (1, 2, 3) else long, gpus_per_node=4)
            for i in range(10)]                       # one per 4-GPU node, in node order
    jobs.append(sched.Job("big", 8, 100.0, submit=20.0, gpus_per_node=4))
    result = sched.simulate(jobs, HETERO, placement="topology")
    assert [n for n, _ in result.jobs[1].placement][:1] == [1]   # blockers as planned
    big = result.by_name["big"]
    assert big.start == 20.0 and big.wait == 0.0
    assert {n for n, _ in big.placement} <= {1, 2, 3}      # one leaf switch


def test_an_8_gpu_nvlink_job_only_fits_node_7():
    job = sched.Job("big", 8, 100.0, gpus_per_node=8)
    for placement in sched.PLACEMENTS:
        result = sched.simulate([job], HETERO, placement=placement)
        assert {n for n, _ in result.jobs[0].placement} == {7}


def test_three_jobs_spread_over_three_nodes():
    jobs = [sched.Job(f"t{i}", 2, 100.0) for i in range(3)]
    nodes = lambda r: sorted({n for j in r.jobs for n, _ in j.placement})   # noqa: E731
    assert len(nodes(sched.simulate(jobs, HETERO, placement="spread"))) == 3
    assert len(nodes(sched.simulate(jobs, HETERO, placement="best_fit"))) == 2


def test_placement_dependent_duration():
    def slower_across_nodes(placement):
        nodes, _ = sched.spans(placement, SWITCHES)
        return 100.0 * (1 if nodes == 1 else 1.5)

    jobs = [sched.Job("half", 2, 1000.0), sched.Job("x", 4, slower_across_nodes)]
    assert sched.simulate(jobs, HETERO, placement="best_fit").by_name["x"].jct == 100.0
    # first fit puts x on node 0's two free GPUs and two of node 1's
    assert sched.simulate(jobs, HETERO, placement="first_fit").by_name["x"].jct == 150.0


# ------------------------------------------------------------ backfill, preemption


def test_fifo_blocks_and_easy_backfill_does_not_delay_the_head():
    cluster = sc.ClusterSpec("two", (sc.NodeSpec("a", 4), sc.NodeSpec("b", 4)))
    jobs = [sched.Job("long", 6, 1000.0, submit=0.0),
            sched.Job("head", 8, 100.0, submit=1.0),
            sched.Job("short", 2, 500.0, submit=2.0),     # ends before the reservation
            sched.Job("too_long", 2, 5000.0, submit=3.0)]  # would delay the head
    fifo = sched.simulate(jobs, cluster)
    easy = sched.simulate(jobs, cluster, backfill=True)
    assert fifo.by_name["short"].start == 1100.0
    assert easy.by_name["short"].start == 2.0
    assert easy.by_name["head"].start == fifo.by_name["head"].start == 1000.0
    assert easy.by_name["too_long"].start >= 1100.0


def test_backfill_may_use_gpus_the_head_does_not_need():
    cluster = sc.ClusterSpec("three", (sc.NodeSpec("a", 4), sc.NodeSpec("b", 4),
                                       sc.NodeSpec("c", 4)))
    jobs = [sched.Job("long", 6, 1000.0), sched.Job("head", 8, 100.0, submit=1.0),
            sched.Job("side", 2, 5000.0, submit=2.0)]
    easy = sched.simulate(jobs, cluster, backfill=True, placement="best_fit")
    assert easy.by_name["side"].start == 2.0
    assert easy.by_name["head"].start == 1000.0


THREE = sc.ClusterSpec("three", (sc.NodeSpec("a", 4), sc.NodeSpec("b", 4),
                                  sc.NodeSpec("c", 4)))


def test_easy_may_delay_the_second_job_and_conservative_does_not():
    jobs = [sched.Job("long", 8, 1000.0),                 # nodes 0 and 1 until 1000
            sched.Job("head", 8, 100.0, submit=1.0),      # reserved at 1000
            sched.Job("second", 12, 100.0, submit=2.0),   # the whole cluster, after head
            sched.Job("side", 4, 5000.0, submit=3.0)]     # node 2 now: head still fits
    easy = sched.simulate(jobs, THREE, backfill="easy")
    assert easy.backfill == "easy" == sched.simulate(jobs, THREE, backfill=True).backfill
    assert [easy.by_name[n].start for n in ("head", "side", "second")] == [1000, 3, 5003]
    cons = sched.simulate(jobs, THREE, backfill="conservative")
    assert [cons.by_name[n].start for n in ("head", "second", "side")] == [1000, 1100, 1200]


def test_conservative_backfill_still_starts_what_delays_nobody():
    jobs = [sched.Job("long", 8, 1000.0), sched.Job("head", 12, 100.0, submit=1.0),
            sched.Job("short", 4, 500.0, submit=2.0),     # ends before anyone needs it
            sched.Job("too_long", 4, 5000.0, submit=3.0)]
    cons = sched.simulate(jobs, THREE, backfill="conservative")
    assert cons.by_name["short"].start == 2.0 and cons.by_name["head"].start == 1000.0
    assert cons.by_name["too_long"].start == 1100.0
    with pytest.raises(ValueError, match="unknown backfill 'lazy'"):
        sched.simulate(jobs, THREE, backfill="lazy")


@pytest.mark.parametrize("placement", ["first_fit", "best_fit"])
def test_conservative_backfill_never_delays_a_job_past_its_first_reservation(
        placement, monkeypatch):
    """Exact run times, FIFO: each job starts no later than the first reservation that
    conservative backfill gave it (later jobs never push it back)."""
    first, earliest = {}, sched._earliest

    def spy(times, frees, job, *args):
        found = earliest(times, frees, job, *args)
        if found is not None:
            first.setdefault(job.job.name, times[found[0]])
        return found

    monkeypatch.setattr(sched, "_earliest", spy)
    for seed in range(8):
        first.clear()
        jobs = [dataclasses.replace(j, submit=j.submit / 3) for j in random_jobs(seed)]
        result = sched.simulate(jobs, HETERO, placement=placement, backfill="conservative")
        assert len(first) > 20
        late = [(j.name, j.start, first[j.name]) for j in result.jobs
                if j.name in first and j.start > first[j.name] + 1e-6]
        assert not late, late


def test_backfill_plans_with_the_users_time_limits():
    cluster = sc.ClusterSpec("two", (sc.NodeSpec("a", 4), sc.NodeSpec("b", 4)))
    jobs = [sched.Job("long", 6, 1000.0), sched.Job("head", 8, 100.0, submit=1.0),
            sched.Job("mid", 2, 1500.0, submit=2.0)]
    for backfill in ("easy", "conservative"):
        exact = sched.simulate(jobs, cluster, backfill=backfill)
        assert exact.by_name["mid"].start == 1100.0        # would delay the head
        # "long" asks for 3,000 s: the head's reservation is planned at 3,000, "mid"
        # backfills, and the head really starts when "mid" ends (the classic effect)
        over = [dataclasses.replace(jobs[0], time_limit=3000.0), *jobs[1:]]
        late = sched.simulate(over, cluster, backfill=backfill)
        assert late.by_name["mid"].start == 2.0 and late.by_name["head"].start == 1502.0
        assert late.by_name["long"].end == 1000.0           # it runs its real duration
        # a candidate that over-estimates itself no longer fits before the reservation
        cautious = [*jobs[:2], sched.Job("short", 2, 500.0, submit=2.0, time_limit=2000.0)]
        assert sched.simulate(cautious, cluster, backfill=backfill).by_name[
            "short"].start == 1100.0


def test_gang_aware_preemption_frees_a_whole_node():
    cluster = sc.ClusterSpec("two", (sc.NodeSpec("a", 4), sc.NodeSpec("b", 4)))
    jobs = [sched.Job("a1", 2, 10000.0, preemptible=True, checkpoint_every=100.0),
            sched.Job("b1", 2, 10000.0, preemptible=True, checkpoint_every=100.0),
            sched.Job("a2", 2, 10000.0, preemptible=True, submit=1.0),
            sched.Job("b2", 2, 10000.0, preemptible=True, submit=1.0),
            sched.Job("urgent", 4, 100.0, submit=250.0, gpus_per_node=4, priority=5)]
    r = sched.simulate(jobs, cluster, policy="priority", preemption=True,
                       placement="first_fit")
    assert r.by_name["urgent"].start == 250.0
    stopped = [j.name for j in r.jobs if len(j.attempts) > 1]
    assert len(stopped) == 2          # one node's two jobs, not one job on each node
    nodes = {n for name in stopped for n, _ in r.by_name[name].attempts[0]["placement"]}
    assert len(nodes) == 1
    # they lose the 50 s since their checkpoint at 200 s (a1 ran from 0) or 250 s... and
    # resume from it: total run time = duration + the lost work
    for name in stopped:
        first = r.by_name[name].attempts[0]
        saved = (first["end"] - first["start"]) // 100 * 100
        assert r.by_name[name].run_time == pytest.approx(10000.0 + (first["end"]
                                                        - first["start"] - saved))


def test_choose_victims_spares_what_is_not_needed():
    running = [sched.Running("cheap", {0: 1}, 0, True, 10.0),
               sched.Running("node1", {1: 4}, 0, True, 50.0),
               sched.Running("cheap2", {0: 1}, 0, True, 20.0),
               sched.Running("vip", {2: 4}, 9, True, 1.0)]
    # a 4-GPU one-node gang: freeing node 0's two small jobs leaves 2 + 2 = 4 there
    assert sched.choose_victims([2, 0, 0], running, 4, 4, priority=5) == ["cheap",
                                                                           "cheap2"]
    # nothing lower-priority frees 12: no one is stopped
    assert sched.choose_victims([2, 0, 0], running, 12, 4, priority=5) is None


def test_no_preemption_without_a_gain():
    cluster = sc.ClusterSpec("two", (sc.NodeSpec("a", 4), sc.NodeSpec("b", 4)))
    jobs = [sched.Job("keep", 4, 1000.0, priority=9),
            sched.Job("small", 2, 1000.0, preemptible=True),
            sched.Job("big", 8, 10.0, submit=5.0, priority=5)]
    r = sched.simulate(jobs, cluster, policy="priority", preemption=True)
    assert len(r.by_name["small"].attempts) == 1      # stopping it would not start "big"


def test_a_job_without_checkpoints_starts_over():
    cluster = sc.ClusterSpec("one", (sc.NodeSpec("a", 4),))
    jobs = [sched.Job("low", 4, 1000.0, preemptible=True),
            sched.Job("high", 4, 100.0, submit=300.0, priority=1)]
    r = sched.simulate(jobs, cluster, policy="priority", preemption=True)
    assert r.by_name["low"].end == 300.0 + 100.0 + 1000.0
    assert [a["outcome"] for a in r.by_name["low"].attempts] == ["preempted", "finished"]


def test_fair_share_follows_the_weights():
    cluster = sc.ClusterSpec("one", (sc.NodeSpec("a", 4),))
    jobs = ([sched.Job(f"a{i}", 1, 100.0, queue="a") for i in range(40)]
            + [sched.Job(f"b{i}", 1, 100.0, queue="b", submit=0.0) for i in range(40)])
    r = sched.simulate(jobs, cluster, policy="fair", weights={"a": 3, "b": 1})
    early = [j for j in r.jobs if j.start < 1000.0]
    a = sum(j.name.startswith("a") for j in early)
    assert a == 3 * (len(early) - a)
    fifo = sched.simulate(jobs, cluster)
    assert all(j.start < 1000.0 for j in fifo.jobs if j.name.startswith("a"))


# -------------------------------------------------------------------- edge cases


def test_a_job_that_never_fits_is_refused_at_submission():
    with pytest.raises(ValueError, match=r"'huge' asks for 64 GPUs.*never fits"):
        sched.simulate([sched.Job("huge", 64, 1.0)], HETERO)
    with pytest.raises(ValueError, match=r"gpus_per_node=8.*never fits"):
        sched.simulate([sched.Job("two8", 16, 1.0, gpus_per_node=8)], HETERO)
    sched.simulate([sched.Job("all", 48, 1.0)], HETERO)   # the whole cluster: fits


@pytest.mark.parametrize("kwargs, match", [
    (dict(gpus=0), "gpus must be a positive integer"),
    (dict(gpus=2.0), "gpus must be a positive integer"),
    (dict(duration=-1.0), "duration must be"),
    (dict(duration=float("nan")), "duration must be"),
    (dict(gpus=6, gpus_per_node=4), "gpus_per_node must be None or a positive divisor"),
    (dict(submit=-5.0), "submit must be"),
    (dict(kind="batch"), "kind must be one of"),
    (dict(checkpoint_every=0), "checkpoint_every"),
])
def test_bad_jobs_are_named(kwargs, match):
    args = dict(name="x", gpus=4, duration=10.0) | kwargs
    with pytest.raises(ValueError, match=match):
        sched.Job(**args)


def test_bad_arguments_are_named():
    job = sched.Job("x", 1, 1.0)
    with pytest.raises(ValueError, match="unknown policy 'lifo'"):
        sched.simulate([job], HETERO, policy="lifo")
    with pytest.raises(ValueError, match="unknown placement 'worst_fit'"):
        sched.simulate([job], HETERO, placement="worst_fit")
    with pytest.raises(ValueError, match="two jobs are called 'x'"):
        sched.simulate([job, sched.Job("x", 1, 1.0)], HETERO)
    with pytest.raises(ValueError, match="duration function returned -1"):
        sched.simulate([sched.Job("f", 1, lambda p: -1)], HETERO)
    with pytest.raises(ValueError, match=r"gave job 'x' 2 GPUs, it asked for 1"):
        sched.simulate([job], HETERO, placement=lambda free, g, k, topo: {0: 2})
    with pytest.raises(ValueError, match="put 4 GPUs of job .z. on node 0, which has 3 free"):
        sched.simulate([sched.Job("y", 1, 1.0), sched.Job("z", 4, 1.0)], HETERO,
                       placement=lambda free, g, k, topo: {0: g})


def test_overload_is_reported_and_until_stops_the_run():
    jobs = sched.synthetic_trace(300, HETERO, seed=1, load=3.0)
    result = sched.simulate(jobs, HETERO, placement="best_fit", backfill=True,
                            until=50000.0)
    assert result.overloaded and "OVERLOADED" in result.summary()
    assert result.unfinished and "not finished" in result.summary()
    assert all(j.end is None or j.end <= 50000.0 for j in result.jobs)
    assert 0 < result.utilization <= 1.0
    calm = sched.simulate(sched.synthetic_trace(300, HETERO, seed=1, load=0.5), HETERO,
                          backfill=True)
    assert not calm.overloaded and "OVERLOADED" not in calm.summary()


def test_fragmentation_counts_free_gpus_the_head_cannot_use():
    cluster = sc.ClusterSpec("two", (sc.NodeSpec("a", 4), sc.NodeSpec("b", 4)))
    jobs = [sched.Job("a", 2, 100.0), sched.Job("b", 2, 100.0),
            sched.Job("whole", 4, 10.0, gpus_per_node=4, submit=1.0)]
    spread = sched.simulate(jobs, cluster, placement="spread")
    packed = sched.simulate(jobs, cluster, placement="best_fit")
    assert (1.0, 4) in spread.fragmentation       # 4 free GPUs, 2 on each node
    assert packed.by_name["whole"].start == 1.0
    assert spread.mean_fragmentation > 0 == packed.mean_fragmentation


def test_plots_draw():
    import matplotlib
    matplotlib.use("Agg")
    result = sched.simulate(random_jobs(3, n=15), HETERO, placement="best_fit")
    assert result.timeline().get_title().startswith("fifo / best_fit")
    assert len(result.free_gpus_plot().get_lines()) == 2


def test_no_jobs_and_jobs_that_never_overlap():
    empty = sched.simulate([], HETERO)
    assert empty.jobs == [] and empty.makespan == 0 and "0 of 0 jobs" in empty.summary()
    apart = [sched.Job("a", 48, 10.0), sched.Job("b", 48, 10.0, submit=100.0)]
    r = sched.simulate(apart, HETERO, backfill=True, preemption=True)
    assert [j.wait for j in r.jobs] == [0.0, 0.0] and r.makespan == 110.0
    assert r.utilization == pytest.approx(20 / 110)
