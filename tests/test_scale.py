"""A moderate number of simulated ranks runs correctly and in a few seconds."""

import re
import time

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc

WORLD = 128


def _warm_up():
    t = torch.ones(1)
    dist.all_reduce(t)


@pytest.fixture(scope="module")
def cluster():
    cluster = sc.Cluster.preset("dgx-a100", nodes=WORLD // 8)
    cluster.run(_warm_up, world_size=2)  # one-time imports of the first run in a process
    return cluster


def _collectives():
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.tensor([float(r), 1.0, float(r % 3)])
    dist.all_reduce(t)
    b = torch.full((4,), float(r))
    dist.broadcast(b, src=n - 1)
    m = torch.tensor([r], dtype=torch.int64)
    dist.all_reduce(m, op=dist.ReduceOp.MAX)
    shard = torch.empty(2)
    dist.reduce_scatter(shard, [torch.full((2,), float(j)) for j in range(n)])
    return t, b, m.item(), shard


def test_many_ranks_all_reduce_and_broadcast(cluster):
    start = time.process_time()  # CPU time of every thread: robust on a loaded machine
    run = cluster.run(_collectives, world_size=WORLD)
    elapsed = time.process_time() - start
    assert len(run.results) == WORLD
    expected_sum = torch.tensor([WORLD * (WORLD - 1) / 2, float(WORLD),
                                 float(sum(r % 3 for r in range(WORLD)))])
    for r, (t, b, m, shard) in enumerate(run.results):
        assert torch.equal(t, expected_sum), f"rank {r}: {t}"
        assert torch.equal(b, torch.full((4,), float(WORLD - 1))), f"rank {r}: {b}"
        assert m == WORLD - 1
        assert torch.equal(shard, torch.full((2,), float(r * WORLD)))
    assert elapsed < 10, f"{WORLD} ranks took {elapsed:.1f} s of CPU time"


def _gather_ranks():
    r, n = dist.get_rank(), dist.get_world_size()
    out = torch.empty(n, dtype=torch.int64)
    dist.all_gather_into_tensor(out, torch.tensor([r]))
    return out


@pytest.mark.filterwarnings("ignore:.*all_gather_into_tensor.*:FutureWarning")
def test_many_ranks_all_gather(cluster):
    run = cluster.run(_gather_ranks, world_size=WORLD)
    expected = torch.arange(WORLD)
    assert all(torch.equal(out, expected) for out in run.results)


def _ddp_step():
    from torch.nn.parallel import DistributedDataParallel as DDP
    r = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    ddp = DDP(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.5)
    torch.manual_seed(1)
    x = torch.randn(dist.get_world_size(), 4)[r:r + 1]
    ddp(x).sum().backward()
    opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_ddp_step_on_many_ranks(cluster):
    world = 32
    results = cluster.run(_ddp_step, world_size=world).results
    torch.manual_seed(0)
    model = nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    torch.manual_seed(1)
    x = torch.randn(world, 4)
    (model(x).sum() / world).backward()  # DDP averages the ranks' gradients
    opt.step()
    for r in range(world):
        for got, want in zip(results[r], model.parameters()):
            assert torch.allclose(got, want, atol=1e-6), f"rank {r}"
    for r in range(1, world):
        assert all(torch.equal(a, b) for a, b in zip(results[0], results[r]))


def _rank_77_skips():
    t = torch.ones(1)
    if dist.get_rank() != 77:
        dist.all_reduce(t)


def test_deadlock_among_many_ranks_is_reported_quickly(cluster):
    start = time.process_time()
    with pytest.raises(sc.DeadlockError) as info:
        cluster.run(_rank_77_skips, world_size=WORLD)
    assert time.process_time() - start < 5
    err = info.value
    assert len(err.pending) == WORLD
    assert err.pending[77] == "returned from its function"
    assert re.search(r"ranks? 77 ha(s|ve) not called it", err.pending[0])
    assert re.search(r"rank(\(s\))? 77 returned", str(err))
