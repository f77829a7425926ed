"""cluster.run(schedule_seed=k): each seed is one interleaving (which ready rank runs next,
which sender a receive from any source matches), the same on every run; without a seed the
order is round-robin exactly as before (a recorded order); seeds find a planted lost update
and replay it; bad seeds are refused with a clear error."""

import json

import numpy as np
import pytest
import torch
import torch.distributed as dist

import simcluster as sc
from simcluster.trace import trace_events

CLUSTER = sc.Cluster.preset("dgx-a100")


def interleaving_program(log):
    """Workers 1-3 compute and send two messages each to rank 0, which receives from any
    source; every rank logs each step it takes, then all ranks all-reduce."""
    rank = dist.get_rank()
    x = torch.ones(64, 64) * (rank + 1)
    if rank == 0:
        got = []
        for _ in range(6):
            t = torch.zeros(1)
            got.append(dist.recv(t))
            log.append((0, int(t.item())))
    else:
        for step in range(2):
            x = x @ x / 64
            log.append((rank, step))
            dist.send(torch.tensor([float(10 * rank + step)]), 0)
        got = None
    total = torch.tensor([float(rank)])
    dist.all_reduce(total)
    log.append((rank, "all_reduce"))
    return got, float(total)


def run(seed, **options):
    log = []
    result = CLUSTER.run(interleaving_program, world_size=4, args=(log,), schedule_seed=seed,
                         **options)
    return result, log


# Recorded with the simulator before schedule_seed existed (commit 99f8564): round-robin
# from rank 0, and a receive from any source takes the lowest sender first.
ROUND_ROBIN_LOG = [(1, 0), (1, 1), (2, 0), (3, 0), (0, 10), (0, 11), (0, 20), (0, 30),
                   (2, 1), (3, 1), (0, 21), (0, 31), (3, "all_reduce"), (0, "all_reduce"),
                   (1, "all_reduce"), (2, "all_reduce")]


def test_without_a_seed_the_order_is_round_robin_as_recorded():
    result, log = run(None)
    assert log == ROUND_ROBIN_LOG
    assert result.results[0] == ([1, 1, 2, 3, 2, 3], 6.0)
    # leaving the argument out is the same as None
    default = CLUSTER.run(interleaving_program, world_size=4, args=([],))
    assert default.results == result.results and default.elapsed == result.elapsed


def test_the_same_seed_is_the_same_run():
    first, first_log = run(7)
    again, again_log = run(7)
    assert first_log == again_log
    assert first.results == again.results
    assert first.elapsed == again.elapsed
    assert [c.now for c in first.recorder.clocks] == [c.now for c in again.recorder.clocks]
    trace = json.dumps(trace_events(first.recorder, CLUSTER.spec), sort_keys=True)
    assert trace == json.dumps(trace_events(again.recorder, CLUSTER.spec), sort_keys=True)


def test_different_seeds_reach_different_interleavings():
    logs, arrivals = set(), set()
    for seed in range(8):
        result, log = run(seed, accounting=False)
        logs.add(tuple(log))
        arrivals.add(tuple(result.results[0][0]))
        # every interleaving is still a correct run: per-sender order, the same sum
        order = [v for r, v in log if r == 0 and v != "all_reduce"]
        for sender in (1, 2, 3):
            assert [v for v in order if v // 10 == sender] == [10 * sender, 10 * sender + 1]
        assert all(total == 6.0 for _, total in result.results)
    assert len(logs) >= 4 and len(arrivals) >= 3, (logs, arrivals)


def test_a_rank_that_polls_still_lets_the_others_run():
    def polls():
        rank = dist.get_rank()
        t = torch.zeros(1)
        if rank == 0:
            work = dist.irecv(t, src=1)
            spins = 0
            while not work.is_completed():
                spins += 1
            return float(t)
        dist.send(torch.tensor([5.0]), 0)
        return None

    for seed in (None, 0, 1, 2):
        assert CLUSTER.run(polls, world_size=2, accounting=False,
                           schedule_seed=seed).results[0] == 5.0


def counter_server(seeds_log):
    """A planted lost update: two workers each read the counter (PULL), add 1 and write it
    back (PUSH); the server keeps whatever value is written last."""
    rank = dist.get_rank()
    value = torch.zeros(1)
    if rank == 0:
        for _ in range(4):                          # two pulls and two pushes
            request = torch.zeros(1)
            src = dist.recv(request)
            if request.item() == 0:                 # PULL
                dist.send(value, src)
            else:                                   # PUSH: the new value follows
                dist.recv(value, src)
        return float(value)
    dist.send(torch.zeros(1), 0)
    dist.recv(value, 0)
    dist.send(torch.ones(1), 0)
    dist.send(value + 1, 0)
    return None


def counter(seed):
    return CLUSTER.run(counter_server, world_size=3, args=([],), accounting=False,
                       schedule_seed=seed).results[0]


def test_some_seed_exposes_a_planted_lost_update_and_replays_it():
    finals = {seed: counter(seed) for seed in range(16)}
    lost = [seed for seed, final in finals.items() if final == 1.0]
    right = [seed for seed, final in finals.items() if final == 2.0]
    assert lost and right, finals     # it depends on the interleaving
    assert set(finals.values()) == {1.0, 2.0}
    for seed in lost[:2] + right[:2]:
        assert counter(seed) == finals[seed]   # a seed replays its interleaving


@pytest.mark.parametrize("seed, error, words", [
    (-1, ValueError, "schedule_seed must be an int >= 0"),
    (1.5, TypeError, "got 1.5 (float)"),
    ("3", TypeError, "got '3' (str)"),
    (True, TypeError, "got True (bool)"),
    ([1], TypeError, "schedule_seed must be an int >= 0"),
])
def test_bad_seeds_are_refused(seed, error, words):
    with pytest.raises(error, match=words.replace("(", r"\(").replace(")", r"\)")):
        CLUSTER.run(lambda: None, world_size=1, schedule_seed=seed)


def test_a_numpy_integer_is_a_seed():
    first = run(np.int64(3), accounting=False)[1]
    assert first == run(3, accounting=False)[1]
