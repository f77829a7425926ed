"""Issue 24, items 1-6: a crash kills (no more of the rank's code runs), a torn write is
torn as simcluster.storage's model says, a link's slowdown stays with its node after an
elastic shrink, fake tensors saved and read back at their size, deaths in the order they
happened, and ``dcp.async_save`` refused with a way out. Each test failed before its fix."""

import dataclasses
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


# ================================================ item 1: a crashed rank runs no more code
def test_a_crashed_rank_runs_none_of_its_handlers(cluster, tmp_path):
    """After SIGKILL (or a lost node, or torchrun's SIGTERM) no Python code of the process
    runs: no ``except``, no ``finally``, no ``with`` exit. The good checkpoint keeps its
    bytes and no "clean exit" status is written."""
    good = tmp_path / "good.pt"

    class Exit:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            (tmp_path / f"exit-{dist.get_rank()}").write_text("with-exit ran")

    def probe():
        rank = dist.get_rank()
        if rank == 0:
            torch.save(torch.ones(1000), good)
        dist.barrier()
        try:
            with Exit():
                for _ in range(1000):
                    dist.all_reduce(torch.ones(1 << 16))
        except BaseException:
            torch.save(torch.zeros(0), good)          # would overwrite the good checkpoint
            raise
        finally:
            (tmp_path / f"status-{rank}").write_text("clean exit")
        return True

    clean = cluster.run(probe, world_size=2)
    assert (tmp_path / "status-1").read_text() == "clean exit"   # (the probe can tell)
    for path in tmp_path.glob("[es]*-*"):
        path.unlink()
    at = clean.elapsed / 2
    error = crashed(cluster, probe, 2, faults=[faults.Crash(rank=1, at=at)])
    assert error.rank == 1
    # Neither the crashed rank nor the survivor its watchdog stopped ran a handler.
    assert sorted(p.name for p in tmp_path.iterdir()) == ["good.pt"]
    assert torch.load(good).shape == (1000,)
    # torchrun's stop before a restart is a SIGTERM: no handler runs either.
    good.unlink()
    run = cluster.run(probe, world_size=2, faults=[faults.Crash(rank=0, at=at)],
                      max_restarts=1)
    assert run.results == [True, True]
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "exit-0", "exit-1", "good.pt", "status-0", "status-1"]   # the second attempt's


def test_crash_restart_runs_leak_no_threads_or_memory(cluster):
    """The crashed ranks' threads end and their stacks are freed, run after run."""
    import tracemalloc

    def holds():
        big = torch.ones(1 << 18)
        for _ in range(50):
            dist.all_reduce(big)
        return True

    def once():
        cluster.run(holds, world_size=2, faults=[faults.Crash(rank=1, at=1e-4)],
                    max_restarts=1)

    once()
    gc.collect()
    threads = threading.active_count()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    for _ in range(10):
        once()
    gc.collect()
    grown = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert threading.active_count() == threads
    assert grown < 2_000_000, grown


# ============================================= item 2: a torn write is torn as modelled
def fake_saves(path):
    """Every rank saves 1 GiB of fake tensors (a 1 kB file of records) to ``path``/rank."""
    def save():
        with sc.fake_tensors():
            torch.save({"w": torch.empty(1 << 28)}, path / f"ckpt{dist.get_rank()}.pt")
        dist.barrier()
        return True
    return save


def test_a_crash_during_a_write_frees_the_array_and_charges_what_was_written(cluster,
                                                                           tmp_path):
    save = fake_saves(tmp_path)
    clean = cluster.run(save, world_size=2)
    [first] = [e for e in clean.clock(0).events if e.lane == "io"]
    [second] = [e for e in clean.clock(1).events if e.lane == "io"]
    assert second.start == first.end   # one array: rank 1's write waits for rank 0's
    written = clean.storage_io[0]["write"]
    at = first.start + 0.1 * first.duration
    error = crashed(cluster, save, 2, faults=[faults.Crash(rank=0, at=at)])
    [cut] = [e for e in error.run.clock(1).events if e.lane == "io"]
    assert cut.start == pytest.approx(at, rel=1e-12)   # not first.end
    assert error.run.storage_io[0]["write"] == pytest.approx(0.1 * written, rel=1e-6)


def test_a_torn_file_is_never_longer_than_what_reached_the_disk(cluster, tmp_path):
    save = fake_saves(tmp_path)
    clean = cluster.run(save, world_size=2)
    size = (tmp_path / "ckpt0.pt").stat().st_size
    assert size < 10_000   # records of the fakes, not their bytes
    [first] = [e for e in clean.clock(0).events if e.lane == "io"]
    crashed(cluster, save, 2, faults=[faults.Crash(rank=0, at=first.start + 0.1 * first.duration)])
    assert (tmp_path / "ckpt0.pt").stat().st_size <= size   # not 10 % of 1 GiB


# ============================================== item 4: fake tensors saved and read back
def test_a_saved_fake_view_is_read_back_at_the_size_written(cluster, tmp_path):
    """torch.save writes a view's whole storage (real torch does), and torch.load reads
    it all back: the same bytes both ways, and the view keeps its shape and offset."""
    def view_round_trip():
        with sc.fake_tensors():
            base = torch.empty(1000, 1000)
            view = base[10:20, 5:]
            torch.save({"view": view, "again": base[:3]}, tmp_path / "v.pt")
            loaded = torch.load(tmp_path / "v.pt")
        return (tuple(loaded["view"].shape), loaded["view"].stride(),
                loaded["view"].storage_offset(),
                loaded["view"].untyped_storage().nbytes(),
                loaded["view"].untyped_storage() is not None)

    run = cluster.run(view_round_trip, world_size=1)
    shape, stride, offset, storage_bytes, _ = run.results[0]
    assert (shape, stride, offset) == ((10, 995), (1000, 1), 10 * 1000 + 5)
    assert storage_bytes == 4_000_000
    io = run.storage_io[0]
    assert io["read"] == io["write"] and 4_000_000 < io["write"] < 4_010_000   # shared once


@dataclasses.dataclass
class Holder:
    weight: object


@pytest.mark.parametrize("make", [lambda: torch.nn.Linear(4, 4),
                                  lambda: Holder(torch.empty(4))])
def test_saving_a_module_of_fakes_says_to_save_its_state_dict(cluster, tmp_path, make):
    def save_module():
        with sc.fake_tensors():
            torch.save(make(), tmp_path / "m.pt")

    with pytest.raises(sc.RankError) as info:
        cluster.run(save_module, world_size=1)
    assert "state_dict()" in str(info.value) and "Can't pickle local" not in str(info.value)


def test_namedtuples_and_dataclasses_of_fakes_round_trip(cluster, tmp_path):
    import collections
    import dataclasses

    Pair = collections.namedtuple("Pair", "a b")
    globals()["Pair"] = Pair   # (picklable by name)

    def round_trip():
        with sc.fake_tensors():
            torch.save({"p": Pair(torch.empty(3), torch.empty(2, 2))}, tmp_path / "p.pt")
            loaded = torch.load(tmp_path / "p.pt", weights_only=False)
        return type(loaded["p"]).__name__, tuple(loaded["p"].b.shape)

    assert cluster.run(round_trip, world_size=1).results[0] == ("Pair", (2, 2))
