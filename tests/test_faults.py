"""Failures on demand (simcluster.faults): what a crash does to a run, what the survivors
see (the watchdog), restarts like torchrun's, elastic shrinking, and that all of it is
deterministic and leaves the kernel usable. (The wall time a fault costs is measured by
benchmarks/bench_faults.py, never asserted here.)"""

import datetime
import os
import pickle
import threading

import pytest
import torch
import torch.distributed as dist
from torch import nn

import simcluster as sc
from simcluster import faults
from simcluster.spec import ClusterSpec, NodeSpec

@pytest.fixture(scope="module")
def cluster():
    return sc.Cluster.preset("dgx-a100", nodes=1)  # 8 devices


@pytest.fixture(scope="module")
def two_nodes():
    """Two small nodes of 2 GPUs: ranks 0-1 on node 0, ranks 2-3 on node 1."""
    return sc.Cluster(ClusterSpec("two-by-two", nodes=(NodeSpec("a", 2), NodeSpec("b", 2))))


STEPS = 10


def steps(timeout_s=None):
    """A rank function: STEPS rounds of a matmul and an all-reduce; returns
    (rank, world size, restart count, a checksum) and the time each step ended."""
    if timeout_s is not None:
        dist.init_process_group("sim", timeout=datetime.timedelta(seconds=timeout_s))
    torch.manual_seed(dist.get_rank())
    x = torch.randn(128, 128)
    for _ in range(STEPS):
        y = x @ x
        dist.all_reduce(y)
        x = y / y.norm()
    return (dist.get_rank(), dist.get_world_size(),
            os.environ["TORCHELASTIC_RESTART_COUNT"], float(x.sum()))


def step_end(cluster, world_size, step):
    """When rank 0 of a fault-free run has finished all-reduce number ``step``."""
    run = cluster.run(steps, world_size=world_size)
    return [c for c in run.collectives if c.op == "all_reduce"][step].end, run


def restarted_at(cluster, fn, world_size, fault, **kwargs):
    """When the second attempt starts after ``fault`` (the first failure) in a run of
    ``fn``: a second fault just after it hits the second attempt."""
    run = cluster.run(fn, world_size=world_size, faults=[fault], max_restarts=1, **kwargs)
    return run.restarts[0].restarted


def crashed(cluster, fn, world_size, **kwargs):
    """Run ``fn``, which must crash; return the RankCrashedError."""
    with pytest.raises(sc.RankCrashedError) as info:
        cluster.run(fn, world_size=world_size, **kwargs)
    return info.value


# ====================================================================== a crash
def test_crash_raises_with_the_rank_node_time_and_partial_run(cluster):
    at, _ = step_end(cluster, 4, 4)
    at *= 1.0001   # during step 5's compute
    error = crashed(cluster, steps, 4, faults=[faults.Crash(rank=3, at=at)])
    assert isinstance(error, sc.SimulationError)
    assert (error.rank, error.node, error.time) == (3, 0, at)
    assert error.cause == f"Crash(rank=3, at={at!r})"
    run = error.run
    # The crashed rank stopped exactly at `at`, in the middle of its compute.
    assert run.clock(3).end == pytest.approx(at, abs=0, rel=0)
    assert run.results == [None] * 4
    # The survivors joined all-reduce #5 and waited for rank 3 until their watchdog
    # (10 minutes by default), charged to their clocks as an idle wait.
    for rank in range(3):
        last = run.clock(rank).events[-1]
        assert last.lane == "idle" and last.label.startswith("watchdog: all_reduce #")
        assert "rank 3 crashed" in last.label
        assert last.end - last.start == pytest.approx(600.0, rel=1e-6)
    assert 600 < run.elapsed < 601
    assert sorted(r for r, _, crash in run.deaths if crash) == [3]
    assert "rank 3 (node 0) crashed" in str(error) and "max_restarts" in str(error)


def test_the_error_pickles_without_its_run(cluster):
    error = crashed(cluster, steps, 2, faults=[faults.Crash(rank=1, at=1e-5)])
    copy = pickle.loads(pickle.dumps(error))
    assert (copy.rank, copy.node, copy.time, copy.cause) == \
        (error.rank, error.node, error.time, error.cause)
    assert str(copy) == str(error) and copy.run is None
    assert copy.restarts == error.restarts


def test_the_watchdog_timeout_comes_from_init_process_group(cluster):
    error = crashed(cluster, steps, 4, args=(30,), faults=[faults.Crash(rank=1, at=1e-5)])
    assert 30 < error.run.elapsed < 30.01
    assert "30 s" in str(error)


def test_a_rank_that_crashes_while_waiting_in_a_collective(cluster):
    """Rank 2 reaches the all-reduce long before the others and dies waiting in it."""
    def late_start():
        if dist.get_rank() != 2:
            torch.ones(2048, 2048) @ torch.ones(2048, 2048)
        t = torch.ones(4)
        dist.all_reduce(t)
        return t.sum().item()

    arrived = cluster.run(late_start, world_size=4)
    slow = arrived.clock(0).events[0].end      # the others' matmul ends here
    error = crashed(cluster, late_start, 4, faults=[faults.Crash(rank=2, at=slow / 2)])
    dead = error.run.clock(2)
    assert dead.end == pytest.approx(slow / 2, rel=1e-12)
    assert dead.events[-1].label.startswith("waiting in all_reduce #0")
    assert error.run.collectives == []   # the all-reduce never completed


def test_a_crash_ends_a_point_to_point_wait_by_the_watchdog(cluster):
    def ping():
        t = torch.zeros(8)
        if dist.get_rank() == 0:
            torch.ones(512, 512) @ torch.ones(512, 512)
            dist.send(t + 1, dst=1)
        else:
            dist.recv(t, src=0)
        return t.sum().item()

    error = crashed(cluster, ping, 2, faults=[faults.Crash(rank=0, at=1e-6)])
    last = error.run.clock(1).events[-1]
    assert last.label.startswith("watchdog: recv 0->1")
    assert error.run.elapsed == pytest.approx(600.0, rel=1e-6)


def test_a_receive_from_any_rank_left_waiting_is_still_the_crash(cluster):
    def any_source():
        t = torch.zeros(4)
        if dist.get_rank() == 0:
            torch.ones(512, 512) @ torch.ones(512, 512)
            dist.send(t + 1, dst=1)
        else:
            dist.recv(t)   # from whoever sends: no watchdog knows it waits for rank 0
        return t.sum().item()

    error = crashed(cluster, any_source, 2, faults=[faults.Crash(rank=0, at=1e-6)])
    assert error.rank == 0


def test_what_a_rank_posted_before_it_died_still_completes_in_time(cluster):
    """Rank 1 posts a receive, then computes until it crashes. Rank 0 runs later (in wall
    time) but sends long before the crash (in simulated time): the message arrives."""
    def post_then_die():
        t = torch.zeros(4)
        if dist.get_rank() == 0:
            dist.recv(t, src=1, tag=0)          # lets rank 1 run first
            dist.send(t + 1, dst=1, tag=1)
            return "sent"
        dist.isend(t + 1, dst=0, tag=0)
        work = dist.irecv(t, src=0, tag=1)
        for _ in range(50):
            torch.ones(256, 256) @ torch.ones(256, 256)
        work.wait()
        return "received"

    clean = cluster.run(post_then_die, world_size=2)
    late = clean.clock(1).end * 0.9             # during rank 1's compute
    error = crashed(cluster, post_then_die, 2, faults=[faults.Crash(rank=1, at=late)])
    assert error.run.results == ["sent", None]
    assert [(r, crash) for r, _, crash in error.run.deaths] == [(1, True)]
    early = clean.clock(0).events[-1].end / 10  # before rank 0 sends
    error = crashed(cluster, post_then_die, 2, faults=[faults.Crash(rank=1, at=early)])
    assert [(r, crash) for r, _, crash in error.run.deaths] == [(1, True), (0, False)]


def test_a_crash_after_the_rank_returned_does_nothing(cluster):
    done = cluster.run(steps, world_size=4)
    run = cluster.run(steps, world_size=4, faults=[faults.Crash(rank=3, at=done.elapsed * 2)])
    assert run.results == done.results and run.elapsed == done.elapsed
    assert run.restarts == []


def test_a_crash_inside_ddp_backward_is_a_crash_not_a_rank_error(cluster):
    """DDP's reducer calls the backend from C++ during backward: the death must get
    through torch and still be reported as the crash."""
    def ddp():
        torch.manual_seed(0)
        model = nn.parallel.DistributedDataParallel(nn.Linear(64, 64))
        for _ in range(5):
            model(torch.randn(32, 64)).sum().backward()
        return True

    clean = cluster.run(ddp, world_size=2)
    reduces = [c for c in clean.collectives if c.op == "all_reduce"]
    at = (reduces[2].start + reduces[2].end) / 2   # during a gradient all-reduce
    error = crashed(cluster, ddp, 2, faults=[faults.Crash(rank=1, at=at)])
    assert error.rank == 1 and error.time == at


def test_a_rank_that_catches_everything_still_dies(cluster):
    def stubborn():
        for _ in range(3):
            try:
                steps()
            except BaseException:  # noqa: BLE001 — what the test is about
                pass
        return "survived"

    error = crashed(cluster, stubborn, 2, faults=[faults.Crash(rank=0, at=1e-5)])
    assert error.run.results[0] is None


def test_the_kernel_stays_usable(cluster):
    threads = threading.active_count()
    for at in (1e-5, 2e-5, 3e-5):
        crashed(cluster, steps, 4, faults=[faults.Crash(rank=1, at=at)])
    assert threading.active_count() == threads   # every rank thread has ended
    run = cluster.run(steps, world_size=4)
    assert [r[0] for r in run.results] == [0, 1, 2, 3]
    assert "TORCHELASTIC_RESTART_COUNT" not in os.environ


# ============================================================ bad arguments
@pytest.mark.parametrize("make, words", [
    (lambda: faults.Crash(rank=-1, at=1.0), "-1"),
    (lambda: faults.Crash(rank=0, at=float("nan")), "nan"),
    (lambda: faults.NodeCrash(node=0, at=-2), "-2"),
    (lambda: faults.Straggler(rank=0, factor=0.5), "0.5"),
    (lambda: faults.Straggler(rank=0, factor=2, start=3, end=1), "end (1.0)"),
    (lambda: faults.LinkDegraded(node=0, factor=2.0), "2.0"),
    (lambda: faults.LinkDegraded(node="nic", factor=0.5), "'nic'"),
    (lambda: faults.PacketLoss(node=0, rate=1.0), "1.0"),
])
def test_bad_fault_values_raise_naming_the_value(make, words):
    with pytest.raises(ValueError, match=None) as info:
        make()
    assert words in str(info.value)


def test_bad_run_arguments(cluster):
    with pytest.raises(ValueError, match="rank 4 is out of range"):
        cluster.run(steps, world_size=4, faults=[faults.Crash(rank=4, at=1)])
    with pytest.raises(ValueError, match="node 1 is out of range"):
        cluster.run(steps, world_size=4, faults=[faults.NodeCrash(node=1, at=1)])
    with pytest.raises(ValueError, match="max_restarts"):
        cluster.run(steps, world_size=4, max_restarts=-1)
    with pytest.raises(ValueError, match="min_world_size"):
        cluster.run(steps, world_size=4, min_world_size=5)
    with pytest.raises(ValueError, match="accounting"):
        cluster.run(steps, world_size=4, accounting=False, faults=[faults.Crash(0, 1.0)])
    with pytest.raises(TypeError, match="not a fault"):
        cluster.run(steps, world_size=4, faults=["crash"])


# ================================================================= restarts
def test_restart_reruns_every_rank_and_the_clock_runs_on(cluster):
    clean = cluster.run(steps, world_size=4)
    at = clean.elapsed / 2
    run = cluster.run(steps, world_size=4, faults=[faults.Crash(rank=2, at=at)],
                      max_restarts=1, restart_delay=45.0)
    # Results of the last attempt: the same numbers as the fault-free run, attempt 1.
    assert [r[:2] for r in run.results] == [r[:2] for r in clean.results]
    assert [r[2] for r in run.results] == ["1"] * 4
    assert [r[3] for r in run.results] == [r[3] for r in clean.results]
    [record] = run.restarts
    assert (record.rank, record.node, record.time, record.attempt, record.world_size) == \
        (2, 0, at, 0, 4)
    assert record.cause == f"Crash(rank=2, at={at!r})"
    assert record.lost_work == pytest.approx(at)   # no checkpoint: all of it
    # torchrun stops the survivors when it restarts them: no watchdog wait.
    assert record.detected == pytest.approx(at + 45.0, rel=1e-9)
    assert record.restarted == pytest.approx(at + 45.0, rel=1e-9)
    stops = [e.label for r in (0, 1, 3) for e in run.clock(r).events if e.lane == "idle"]
    assert any(label.startswith("stopped by torchrun") for label in stops)
    assert not any(label.startswith("watchdog") for label in stops)
    assert record.downtime == pytest.approx(record.restarted - at)
    # The second attempt took as long as a fault-free run, after the restart.
    assert run.elapsed == pytest.approx(record.restarted + clean.elapsed, rel=1e-9)
    # One timeline: the idle restart wait, then the second attempt's work.
    labels = [e.label for e in run.clock(2).events if e.lane == "idle"]   # the dead rank
    assert "down: restarting after a failure" in labels


def test_restart_count_is_right_on_every_rank(cluster):
    def read_env():
        seen = [os.environ["TORCHELASTIC_RESTART_COUNT"]]
        for _ in range(3):
            dist.barrier()   # other ranks run in between: the value is still right
            seen.append(os.environ["TORCHELASTIC_RESTART_COUNT"])
        return seen, os.environ["TORCHELASTIC_MAX_RESTARTS"]

    first = faults.Crash(rank=1, at=1e-6)
    second = restarted_at(cluster, read_env, 4, first) + 1e-9
    run = cluster.run(read_env, world_size=4, max_restarts=3,
                      faults=[first, faults.Crash(rank=3, at=second)])
    assert [r.attempt for r in run.restarts] == [0, 1]
    assert run.results == [(["2"] * 4, "3")] * 4


def test_more_failures_than_max_restarts_raise(cluster):
    first = faults.Crash(rank=0, at=1e-5)
    second = restarted_at(cluster, steps, 4, first) + 1e-5
    crashes = [first, faults.Crash(rank=1, at=second), faults.Crash(rank=2, at=2 * second)]
    error = crashed(cluster, steps, 4, faults=crashes, max_restarts=1)
    assert [(r.rank, r.attempt) for r in error.restarts] == [(0, 0), (1, 1)]
    assert error.restarts[0].restarted is not None and error.restarts[1].restarted is None
    assert error.rank == 1 and error.time == second
    assert "one more than max_restarts=1 allows" in str(error)


def test_an_exception_in_the_function_is_not_restarted(cluster):
    def buggy():
        raise KeyError("oops")

    with pytest.raises(sc.RankError, match="oops"):
        cluster.run(buggy, world_size=2, max_restarts=3)


def test_faults_in_the_downtime_do_nothing(cluster):
    """A crash timed while the job is down (between the failure and the restart)."""
    run = cluster.run(steps, world_size=4, max_restarts=1, restart_delay=60,
                      faults=[faults.Crash(rank=0, at=1e-5), faults.Crash(rank=1, at=20)])
    assert len(run.restarts) == 1


def test_lost_work_counts_from_the_latest_checkpoint(cluster, tmp_path):
    def checkpointing():
        out = steps()
        if dist.get_rank() == 0:
            torch.save(torch.ones(1 << 20), tmp_path / "checkpoint.pt")
        dist.barrier()
        torch.ones(1024, 1024) @ torch.ones(1024, 1024)
        return out

    clean = cluster.run(checkpointing, world_size=2)
    [write] = [e for e in clean.clock(0).events if e.lane == "io"]
    matmul = clean.clock(0).events[-1]
    at = (matmul.start + matmul.end) / 2
    run = cluster.run(checkpointing, world_size=2, faults=[faults.Crash(rank=1, at=at)],
                      max_restarts=1)
    assert run.restarts[0].lost_work == pytest.approx(at - write.end, rel=1e-9)
    # A crash during the write itself: the checkpoint does not count.
    during = (write.start + write.end) / 2
    run = cluster.run(checkpointing, world_size=2, faults=[faults.Crash(rank=0, at=during)],
                      max_restarts=1)
    assert run.restarts[0].lost_work == during
    assert run.restarts[0].rank == 0


# =============================================================== node crashes
def test_node_crash_kills_every_rank_on_the_node(two_nodes):
    error = crashed(two_nodes, steps, 4, faults=[faults.NodeCrash(node=1, at=1e-5)])
    assert (error.rank, error.node) == (2, 1)
    crashed_ranks = sorted(r for r, _, crash in error.run.deaths if crash)
    assert crashed_ranks == [2, 3]
    assert error.cause == "NodeCrash(node=1, at=1e-05)"


def test_node_crash_with_min_world_size_shrinks_the_world(two_nodes):
    run = two_nodes.run(steps, world_size=4, faults=[faults.NodeCrash(node=0, at=1e-5)],
                        max_restarts=1, min_world_size=2)
    assert [r[:3] for r in run.results] == [(0, 2, "1"), (1, 2, "1")]
    assert run.world_size == 2 and run.cluster.world_size == 2
    assert run.cluster.spec.nodes[0].name == "b"   # the surviving node
    [record] = run.restarts
    assert (record.node, record.world_size) == (0, 4)


def test_node_crash_without_min_world_size_restarts_at_full_size(two_nodes):
    run = two_nodes.run(steps, world_size=4, faults=[faults.NodeCrash(node=0, at=1e-5)],
                        max_restarts=1)
    assert [r[1] for r in run.results] == [4] * 4


def test_too_few_ranks_left_to_shrink(two_nodes):
    error = crashed(two_nodes, steps, 4, faults=[faults.NodeCrash(node=0, at=1e-5)],
                       max_restarts=1, min_world_size=3)
    assert "min_world_size=3" in str(error) and error.restarts[-1].restarted is None


def test_a_second_node_crash_after_shrinking(two_nodes):
    """Node indices in faults are the cluster's, also after the world shrank."""
    first = faults.NodeCrash(node=0, at=1e-5)
    second = restarted_at(two_nodes, steps, 4, first, min_world_size=2) + 1e-5
    error = crashed(two_nodes, steps, 4, max_restarts=2, min_world_size=2,
                       faults=[first, faults.NodeCrash(node=1, at=second)])
    assert [(r.node, r.world_size) for r in error.restarts] == [(0, 4), (1, 2)]
    assert "Only 0 rank(s)" in str(error)


# ================================================================ determinism
def test_the_same_faulty_run_twice_is_identical(two_nodes):
    first = faults.Crash(rank=1, at=2e-5)
    second = restarted_at(two_nodes, steps, 4, first) + 1e-5
    slow = [faults.Straggler(rank=0, factor=2.0, start=1e-5), faults.PacketLoss(node=0, rate=0.1),
            faults.LinkDegraded(node="network", factor=0.5, end=second)]
    kwargs = dict(world_size=4, max_restarts=2, min_world_size=2,
                  faults=[first, faults.NodeCrash(node=1, at=second)] + slow)
    first = two_nodes.run(steps, **kwargs)
    second = two_nodes.run(steps, **kwargs)
    assert first.results == second.results
    assert first.elapsed == second.elapsed
    assert first.restarts == second.restarts
    assert len(first.restarts) == 2


# ===================================================== slow ranks and links
def test_a_straggler_computes_factor_times_longer(cluster):
    clean = cluster.run(steps, world_size=4)
    run = cluster.run(steps, world_size=4, faults=[faults.Straggler(rank=1, factor=3.0)])
    compute = [row["compute_s"] for row in run.summary().rows]
    assert compute[1] == pytest.approx(3 * clean.summary().rows[1]["compute_s"], rel=1e-9)
    assert compute[0] == pytest.approx(clean.summary().rows[0]["compute_s"], rel=1e-12)
    # The others wait for it: their idle time grows by what it lost before the last
    # all-reduce (most of it: only the step's last few ops come after).
    idle = [row["idle_s"] for row in run.summary().rows]
    waited = idle[0] - clean.summary().rows[0]["idle_s"]
    assert 0.9 * (compute[1] - compute[0]) < waited < compute[1] - compute[0]
    assert run.results == clean.results


def test_a_straggler_window_slows_only_the_ops_inside_it(cluster):
    clean = cluster.run(steps, world_size=4)
    half = clean.elapsed / 2
    late = cluster.run(steps, world_size=4, faults=[faults.Straggler(1, 3.0, start=half)])
    early = cluster.run(steps, world_size=4, faults=[faults.Straggler(1, 3.0, end=half)])
    everywhere = cluster.run(steps, world_size=4, faults=[faults.Straggler(1, 3.0)])
    for partial in (late, early):
        assert clean.elapsed < partial.elapsed < everywhere.elapsed
    ends = [c.end for c in late.collectives]
    clean_ends = [c.end for c in clean.collectives]
    before = [i for i, t in enumerate(clean_ends) if t < half]
    assert before and [ends[i] for i in before] == [clean_ends[i] for i in before]


def test_the_speed_factor_keyword_still_works(cluster):
    kwarg = cluster.run(steps, world_size=4, speed_factor={1: 3.0})
    fault = cluster.run(steps, world_size=4, faults=[faults.Straggler(rank=1, factor=3.0)])
    assert kwarg.elapsed == pytest.approx(fault.elapsed, rel=1e-12)


@pytest.mark.parametrize("node", [0, "network"])
def test_a_degraded_link_slows_the_collectives_that_use_it(two_nodes, node):
    def intra_and_inter():
        t = torch.ones(1 << 16)
        dist.all_reduce(t)                              # both nodes: the network
        pair = dist.new_group([0, 1])
        if dist.get_rank() < 2:
            dist.all_reduce(t, group=pair)               # node 0's NVLink only
        return t[0].item()

    clean = two_nodes.run(intra_and_inter, world_size=4)
    run = two_nodes.run(intra_and_inter, world_size=4,
                        faults=[faults.LinkDegraded(node=node, factor=0.25)])
    assert run.results == clean.results
    by_ranks = {c.ranks: c.duration for c in run.collectives}
    clean_by_ranks = {c.ranks: c.duration for c in clean.collectives}
    slowed = (0, 1) if node == 0 else (0, 1, 2, 3)
    other = (0, 1, 2, 3) if node == 0 else (0, 1)
    assert by_ranks[slowed] > 1.5 * clean_by_ranks[slowed]
    assert by_ranks[other] == clean_by_ranks[other]
    # A window that ends before the run starts changes nothing.
    ended = two_nodes.run(intra_and_inter, world_size=4,
                          faults=[faults.LinkDegraded(node, 0.25, start=0.0, end=1e-12)])
    assert ended.elapsed == clean.elapsed


def test_retransmission_rounds_match_a_simulation_of_lost_packets():
    import random

    assert faults.retransmission_rounds(0.2, 1) == pytest.approx(0.2 / 0.8)
    assert faults.retransmission_rounds(0.0, 100) == 0
    rng = random.Random(0)
    for rate, packets in ((0.2, 8), (0.05, 300)):
        trials = []
        for _ in range(4000):
            worst = 0
            for _ in range(packets):
                tries = 1
                while rng.random() < rate:
                    tries += 1
                worst = max(worst, tries)
            trials.append(worst - 1)
        assert faults.retransmission_rounds(rate, packets) == pytest.approx(
            sum(trials) / len(trials), rel=0.05)


def test_packet_loss_delays_messages_that_cross_the_lossy_node(two_nodes):
    def messages():
        t = torch.zeros(1024)                            # 4 KiB: one packet
        rank = dist.get_rank()
        if rank == 0:
            dist.send(t, dst=2)                          # across the network
            dist.send(t, dst=1)                          # inside node 0
        elif rank in (1, 2):
            dist.recv(t, src=0)
        return t.sum().item()

    def durations(run):
        return {e.label: e.duration for e in run.clock(0).events if e.lane == "comm"}

    clean = durations(two_nodes.run(messages, world_size=4))
    lossy = durations(two_nodes.run(
        messages, world_size=4, faults=[faults.PacketLoss(node=1, rate=0.2, rto=1.0)]))
    # One packet is lost with probability 0.2: 0.25 retransmission timeouts on average,
    # and the bytes are sent 1.25 times.
    assert lossy["send 0->2"] - clean["send 0->2"] == pytest.approx(0.25, rel=1e-3)
    assert lossy["send 0->1"] == pytest.approx(clean["send 0->1"], rel=1e-9)
    none = durations(two_nodes.run(messages, world_size=4,
                                   faults=[faults.PacketLoss(node=1, rate=0.0)]))
    assert none == clean


def test_packet_loss_slows_a_collective_across_nodes(two_nodes):
    clean = two_nodes.run(steps, world_size=4)
    lossy = two_nodes.run(steps, world_size=4, faults=[faults.PacketLoss(node=0, rate=0.01)])
    assert lossy.results == clean.results
    assert all(a.duration > b.duration + 0.1 * faults.DEFAULT_RTO_S
               for a, b in zip(lossy.collectives, clean.collectives))


@pytest.mark.slow
def test_bench_faults_quick():
    """The benchmark runs every kind of fault (its timings are not asserted)."""
    import sys
    from pathlib import Path

    root = str(Path(__file__).resolve().parents[1])
    if root not in sys.path:
        sys.path.insert(0, root)
    from benchmarks import bench_faults

    results = bench_faults.main(quick=True, verbose=False)
    assert results["Crash, no restart"]["simulated"] > 600   # the watchdog's wait
    # with a restart, torchrun stops the survivors at the restart delay instead
    assert 30 < results["Crash, 1 restart"]["simulated"] < 31
    assert results["PacketLoss 20%"]["simulated"] > results["fault-free"]["simulated"]


# ======================================================= bit-identical recovery
def checkpointed_training(directory, steps=8, every=2):
    """DDP training that saves model, optimizer and step every ``every`` steps and, after
    a restart, resumes from the latest save; returns the final parameters."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=0.01)
    start = 0
    path = directory / "latest.pt"
    if int(os.environ["TORCHELASTIC_RESTART_COUNT"]) > 0 and path.exists():
        state = torch.load(path)
        model.module.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        start = state["step"]
    for step in range(start, steps):
        data = torch.randn(8, 16, generator=torch.Generator().manual_seed(
            1000 * step + dist.get_rank()))   # the data position is the step
        opt.zero_grad()
        model(data).square().mean().backward()
        opt.step()
        if (step + 1) % every == 0:
            if dist.get_rank() == 0:
                torch.save({"model": model.module.state_dict(),
                            "optimizer": opt.state_dict(), "step": step + 1}, path)
            dist.barrier()
    return [p.detach().clone() for p in model.parameters()]


def test_a_restarted_run_resumes_bit_identically(cluster, tmp_path):
    (tmp_path / "clean").mkdir()
    clean = cluster.run(checkpointed_training, world_size=2, args=(tmp_path / "clean",))
    reduces = [c for c in clean.collectives if c.op == "all_reduce"]
    for i, at in enumerate((reduces[3].end * 1.0001, reduces[-2].end * 1.0001)):
        directory = tmp_path / f"crash{i}"
        directory.mkdir()
        run = cluster.run(checkpointed_training, world_size=2, args=(directory,),
                          faults=[faults.Crash(rank=1, at=at)], max_restarts=1)
        assert len(run.restarts) == 1
        for got, want in zip(run.results[0], clean.results[0]):
            assert torch.equal(got, want)
        assert run.restarts[0].lost_work < at   # it resumed from a checkpoint


def test_the_timeline_marks_the_crash_and_the_watchdog_stops(cluster):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    error = crashed(cluster, steps, 4, args=(1e-3,), faults=[faults.Crash(rank=2, at=1e-4)])
    ax = error.run.timeline()
    marks = {line.get_gid(): line for line in ax.get_lines()}
    crash, stops = marks["crash"], marks["watchdog stop"]
    assert list(crash.get_ydata()) == pytest.approx([2 - 0.17])   # rank 2's compute lane
    assert len(stops.get_xdata()) == 3
    assert max(stops.get_xdata()) > crash.get_xdata()[0]
    assert ax.get_xlim()[1] > 1.02 * max(stops.get_xdata()), "the stop marks are not cut"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "crash" in labels and "watchdog stop" in labels
    plt.close("all")
    clean = cluster.run(steps, world_size=4)
    assert not [line for line in clean.timeline().get_lines() if line.get_gid()]
    plt.close("all")


def test_the_trace_marks_the_deaths(cluster, tmp_path):
    import json

    error = crashed(cluster, steps, 2, args=(1e-3,), faults=[faults.Crash(rank=1, at=1e-5)])
    path = error.run.save_trace(tmp_path / "crash.json")
    events = json.loads(path.read_text())["traceEvents"]
    marks = sorted((e["args"]["rank"], e["name"], e["ts"]) for e in events
                   if e.get("cat") == "fault")
    assert [m[:2] for m in marks] == [(0, "watchdog stop"), (1, "crash")]
    assert marks[1][2] == pytest.approx(10.0)   # microseconds


def elastic_training(directory, steps=6, save_after=2):
    """FSDP2 training with a global batch of 8 split over the ranks, whatever their number;
    it saves a DCP checkpoint after step ``save_after`` and resumes from it if there is
    one. Returns (the step it started from, the full parameters at the end)."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 16), nn.ReLU(), nn.Linear(16, 4))
    fully_shard(model, mesh=init_device_mesh("cpu", (dist.get_world_size(),)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    start = 0
    if (directory / "step").exists():
        start = int((directory / "step").read_text())
        model_state, optim_state = get_state_dict(model, opt)
        state = {"model": model_state, "optim": optim_state}
        dcp.load(state, checkpoint_id=str(directory / "checkpoint"))   # re-sharded
        set_state_dict(model, opt, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
    share = 8 // dist.get_world_size()
    rows = slice(dist.get_rank() * share, (dist.get_rank() + 1) * share)
    for step in range(start, steps):
        batch = torch.randn(8, 16, generator=torch.Generator().manual_seed(step))
        opt.zero_grad()
        model(batch[rows]).square().mean().backward()
        opt.step()
        if step == save_after:
            model_state, optim_state = get_state_dict(model, opt)
            dcp.save({"model": model_state, "optim": optim_state},
                     checkpoint_id=str(directory / "checkpoint"))
            if dist.get_rank() == 0:
                (directory / "step").write_text(str(step + 1))
            dist.barrier()
    return start, {k: v.full_tensor() for k, v in model.state_dict().items()}


def test_elastic_shrink_resumes_from_a_resharded_checkpoint(two_nodes, tmp_path):
    """A node is lost after the checkpoint: the job goes on with 2 ranks instead of 4,
    loads the 4-rank checkpoint re-sharded, and ends where the fault-free run ends (up
    to the order of the additions in the gradient reduction)."""
    (tmp_path / "clean").mkdir()
    (tmp_path / "faulty").mkdir()
    clean = two_nodes.run(elastic_training, world_size=4, args=(tmp_path / "clean",))
    run = two_nodes.run(elastic_training, world_size=4, args=(tmp_path / "faulty",),
                        faults=[faults.NodeCrash(node=1, at=clean.elapsed * 0.8)],
                        max_restarts=1, min_world_size=2)
    assert run.world_size == 2 and [r[0] for r in run.results] == [3, 3]
    for name, want in clean.results[0][1].items():
        torch.testing.assert_close(run.results[0][1][name], want, rtol=0, atol=1e-6)
    assert 0 < run.restarts[0].lost_work < run.restarts[0].time
