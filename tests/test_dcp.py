"""Checkpoints on the simulated cluster: each node's storage (``StorageSpec``), the
simulated time of ``torch.save``/``torch.load`` and of ``torch.distributed.checkpoint``
(``dcp.save``/``dcp.load``) inside ranks, real files, re-sharding to another world size."""

import errno
import io
import os

import pytest
import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import filesystem as dcp_filesystem
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_state_dict,
                                                     set_state_dict)
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

import simcluster as sc
from simcluster import spec as sc_spec
from simcluster.storage import NodeStorage

GB = 1e9


# ------------------------------------------------------------------------ the spec
def test_presets_carry_their_nodes_nvme_arrays():
    a100 = sc.Cluster("dgx-a100").spec.nodes[0].storage
    assert a100.capacity == int(15.36e12)                       # 4 x 3.84 TB
    assert (a100.read_bandwidth, a100.write_bandwidth) == (25.6 * GB, 15.2 * GB)
    h100 = sc.Cluster("dgx-h100").spec.nodes[0].storage
    assert h100.capacity == int(30.72e12)                       # 8 x 3.84 TB
    assert (h100.read_bandwidth, h100.write_bandwidth) == (51.2 * GB, 30.4 * GB)
    hetero = sc.Cluster("hetero-11").spec
    assert {n.storage for n in hetero.nodes} == {a100}          # the GPU platform article's 15 TB nodes
    assert hetero.storage_of(47) is hetero.nodes[10].storage
    assert a100.write_seconds(15.2e9) == pytest.approx(1.0)
    assert a100.read_seconds(25.6e9) == pytest.approx(1.0)


def test_custom_clusters_take_a_storage_by_name_or_numbers():
    spec = sc_spec.from_dict({"nodes": [
        {"devices": 2, "storage": "dgx-h100"},
        {"devices": 2, "storage": {"capacity_tb": 2, "read_gbps": 7, "write_gbps": 3.5}},
        {"devices": 2}]})
    assert spec.nodes[0].storage == sc_spec.DGX_H100_STORAGE
    custom = spec.nodes[1].storage
    assert (custom.capacity, custom.read_bandwidth, custom.write_bandwidth) == (
        2e12, 7 * GB, 3.5 * GB)
    assert spec.nodes[2].storage == sc_spec.DGX_A100_STORAGE
    with pytest.raises(ValueError, match="nodes\\[0\\]: unknown storage 'ssd'"):
        sc_spec.from_dict({"nodes": [{"devices": 1, "storage": "ssd"}]})
    with pytest.raises(ValueError, match="nodes\\[0\\]: write_gbps must be a positive"):
        sc_spec.from_dict({"nodes": [{"devices": 1, "storage": {
            "capacity_tb": 1, "read_gbps": 1, "write_gbps": 0}}]})
    with pytest.raises(ValueError, match="unknown field\\(s\\) iops"):
        sc_spec.from_dict({"nodes": [{"devices": 1, "storage": {
            "capacity_tb": 1, "read_gbps": 1, "write_gbps": 1, "iops": 5}}]})


def test_the_array_serves_one_transfer_at_a_time_and_fills_idle_gaps():
    storage = NodeStorage(sc_spec.StorageSpec("1 B/s", 100, 1.0, 1.0), "node0")
    assert storage.transfer(0.0, 1, True, 0) == (0.0, 1.0)
    assert storage.transfer(5.0, 1, True, 1) == (5.0, 6.0)
    assert storage.transfer(0.0, 2, False, 2) == (1.0, 3.0)   # waits for [0, 1]
    assert storage.transfer(0.5, 3, False, 3) == (3.0, 7.0)   # [3, 5] and [6, 7]
    assert storage.transfer(0.0, 1, True, 0) == (7.0, 8.0)    # all busy until 7
    assert (storage.bytes_written, storage.bytes_read) == (3, 5)


# -------------------------------------------------------------- torch.save / load
def _io_spans(run):
    """``[(rank, label, start, end)]`` of every storage event of the run."""
    return [(r, e.label, e.start, e.end) for r in range(run.world_size)
            for e in run.clock(r).events if e.lane == "io"]


def test_torch_save_and_load_in_ranks_share_the_nodes_bandwidth(tmp_path):
    n = 2_000_000     # 8 MB of float32 per rank

    def fn():
        rank = dist.get_rank()
        path = tmp_path / f"rank{rank}.pt"
        torch.save(torch.full((n,), float(rank)), path)
        dist.barrier()
        with open(path, "rb") as f:                 # a file object is charged too
            back = torch.load(f)
        torch.save(back, io.BytesIO())              # memory, not storage: free
        return back[0].item(), os.path.getsize(path)

    run = sc.Cluster("dgx-a100").run(fn, world_size=4)
    sizes = [size for _, size in run.results]
    assert [value for value, _ in run.results] == [0.0, 1.0, 2.0, 3.0]
    assert run.storage_io == [{"write": s, "read": s} for s in sizes]
    spans = _io_spans(run)
    writes = [s for s in spans if s[1].startswith("write")]
    reads = [s for s in spans if s[1].startswith("read")]
    assert len(writes) == len(reads) == 4
    storage = run.cluster.spec.nodes[0].storage
    # all four ask at once; the node's array takes them one after another, each at its
    # full bandwidth, while the others wait for it
    spans_in_order = sorted((start, end) for _, _, start, end in writes)
    assert all(a[1] == pytest.approx(b[0]) for a, b in zip(spans_in_order, spans_in_order[1:]))
    assert all(end - start == pytest.approx(size / storage.write_bandwidth)
               for (_, _, start, end), size in zip(sorted(writes), sizes))
    asked = min(start for _, _, start, _ in writes)
    waits = [e for r in range(4) for e in run.clock(r).events if e.label == "wait for storage"]
    assert len(waits) == 6 and sum(e.start == asked for e in waits) == 3   # 3 writes, 3 reads
    assert max(end for *_, end in writes) - asked == pytest.approx(
        sum(sizes) / storage.write_bandwidth, rel=1e-9)
    assert max(end for *_, end in reads) - min(start for _, _, start, _ in reads) == \
        pytest.approx(sum(sizes) / storage.read_bandwidth, rel=1e-9)
    assert writes[0][1] == "write 8.0 MB"
    assert sum(run.clock(r).io for r in range(4)) == pytest.approx(
        sum(end - start for *_, start, end in spans))


def test_each_node_has_its_own_storage(tmp_path):
    def fn():
        torch.save(torch.zeros(1_000_000), tmp_path / f"{dist.get_rank()}.pt")

    one = sc.Cluster.preset("dgx-a100", nodes=2).run(fn, world_size=8)
    two = sc.Cluster.preset("dgx-a100", nodes=2).run(fn, world_size=16)
    assert len(two.cluster.spec.nodes) == 2
    # 16 ranks on two nodes write in the time 8 ranks take on one
    assert two.elapsed == pytest.approx(one.elapsed, rel=1e-4)
    nbytes = os.path.getsize(tmp_path / "0.pt")
    assert one.elapsed == pytest.approx(8 * nbytes / (15.2 * GB), rel=1e-3)
    node0 = [r for r in range(16) if two.cluster.spec.node_of(r) == 0]
    assert max(two.clock(r).end for r in node0) == pytest.approx(two.elapsed, rel=1e-4)


def test_a_full_disk_raises_enospc_naming_rank_and_node(tmp_path):
    cluster = sc.Cluster.from_dict({"nodes": [{"devices": 2, "storage": {
        "capacity_tb": 1e-6, "read_gbps": 1, "write_gbps": 1}}]})     # 1 MB

    def fn():
        rank = dist.get_rank()
        torch.save(torch.zeros(100_000), tmp_path / f"{rank}.pt")          # 400 kB each
        torch.save(torch.zeros(100_000), tmp_path / f"{rank}.pt")          # replaces it
        dist.barrier()
        if rank == 1:
            torch.save(torch.zeros(100_000), tmp_path / "more.pt")

    with pytest.raises(sc.RankError) as info:
        cluster.run(fn, world_size=2)
    with pytest.raises(RuntimeError, match="inside cluster.run"):
        sc.now()
    error = info.value.original
    assert isinstance(error, OSError) and error.errno == errno.ENOSPC
    assert "rank 1" in str(error) and "node0" in str(error)


def test_without_accounting_nothing_is_charged_and_hooks_are_removed(tmp_path):
    originals = (torch.save, torch.load, dcp_filesystem._FileSystemWriter.write_data,
                 dcp_filesystem.FileSystemReader.read_data,
                 dcp_filesystem.FileSystem.create_stream)

    def fn():
        torch.save(torch.zeros(10), tmp_path / f"{dist.get_rank()}.pt")
        return torch.save is not originals[0]

    run = sc.Cluster("dgx-a100").run(fn, world_size=2, accounting=False)
    assert run.results == [True, True]          # patched during the run
    assert (torch.save, torch.load, dcp_filesystem._FileSystemWriter.write_data,
            dcp_filesystem.FileSystemReader.read_data,
            dcp_filesystem.FileSystem.create_stream) == originals


# ------------------------------------------------------------------------- DCP
def _model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 64))


def _sharded(model):
    """``model`` with FSDP2 over every rank, and its Adam optimizer."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.Adam(model.parameters(), lr=1e-2)


def _full_state(model, optimizer):
    """The whole model and optimizer state on every rank, as plain tensors."""
    msd, osd = get_state_dict(model, optimizer,
                              options=StateDictOptions(full_state_dict=True))
    flat = {f"model.{k}": v for k, v in msd.items()}
    for pid, state in osd["state"].items():
        for k, v in state.items():
            flat[f"optim.{pid}.{k}"] = v
    return {k: v.detach().clone() for k, v in flat.items()}


def _train_and_save(directory, steps=2):
    def fn():
        model, optimizer = _sharded(_model())
        torch.manual_seed(1 + dist.get_rank())
        for _ in range(steps):
            model(torch.randn(8, 64)).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
        msd, osd = get_state_dict(model, optimizer)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=directory)
        return _full_state(model, optimizer)
    return fn


def _load(directory):
    def fn():
        model, optimizer = _sharded(_model())     # fresh: different from the saved state
        msd, osd = get_state_dict(model, optimizer)
        state = {"model": msd, "optim": osd}
        dcp.load(state, checkpoint_id=directory)
        set_state_dict(model, optimizer, model_state_dict=state["model"],
                       optim_state_dict=state["optim"])
        return _full_state(model, optimizer)
    return fn


def _equal(a, b):
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def saved(tmp_path_factory):
    """A 4-rank FSDP2 model and Adam state saved with DCP, and the run that saved it."""
    directory = str(tmp_path_factory.mktemp("dcp"))
    run = sc.Cluster("dgx-a100").run(_train_and_save(directory), world_size=4)
    return directory, run


def test_dcp_writes_real_files_and_charges_every_byte(saved):
    directory, run = saved
    files = sorted(os.listdir(directory))
    assert files == [".metadata"] + [f"__{r}_0.distcp" for r in range(4)]
    sizes = {f: os.path.getsize(os.path.join(directory, f)) for f in files}
    assert all(size > 0 for size in sizes.values())
    written = [io["write"] for io in run.storage_io]
    # each rank its own file; the coordinator (rank 0) the metadata too
    assert written[1:] == [sizes[f"__{r}_0.distcp"] for r in (1, 2, 3)]
    assert written[0] == sizes["__0_0.distcp"] + sizes[".metadata"]
    assert run.recorder.storage[0].bytes_written == sum(sizes.values())


def test_dcp_save_takes_bytes_over_the_nodes_write_bandwidth(tmp_path):
    """A larger state (about 128 MB over 4 ranks): dcp.save's simulated time is the
    node's bytes over its write bandwidth, within 3 %, on both DGX presets."""
    def fn(directory):
        rank = dist.get_rank()
        mesh = init_device_mesh("cpu", (4,))
        from torch.distributed.tensor import Shard, distribute_tensor
        state = {f"w{i}": distribute_tensor(torch.zeros(4_000_000), mesh, [Shard(0)])
                 for i in range(8)}
        dist.barrier()
        start = sc.now()
        dcp.save(state, checkpoint_id=directory)
        dist.barrier()
        return sc.now() - start if rank == 0 else None

    for preset in ("dgx-a100", "dgx-h100"):
        directory = str(tmp_path / preset)
        run = sc.Cluster(preset).run(fn, world_size=4, args=(directory,))
        nbytes = sum(os.path.getsize(os.path.join(directory, f))
                     for f in os.listdir(directory))
        assert nbytes > 128e6
        expected = nbytes / run.cluster.spec.nodes[0].storage.write_bandwidth
        assert run.results[0] == pytest.approx(expected, rel=0.03), preset


def test_dcp_save_on_4_load_on_4_is_bit_identical(saved):
    directory, save_run = saved
    run = sc.Cluster("dgx-a100").run(_load(directory), world_size=4)
    for rank in range(4):
        assert _equal(run.results[rank], save_run.results[rank])
    # every rank reads the metadata and its own shard: about what it wrote
    read = [io["read"] for io in run.storage_io]
    assert all(r > 0 for r in read)
    assert sum(r for r in read) >= sum(io["write"] for io in save_run.storage_io)


def test_dcp_load_on_2_reshards_bit_identically(saved):
    directory, save_run = saved
    run = sc.Cluster("dgx-a100").run(_load(directory), world_size=2)
    assert _equal(run.results[0], save_run.results[0])
    assert _equal(run.results[1], save_run.results[0])
    # each of the 2 ranks reads about half of the state, from several of the four files
    # (a saved chunk that both new shards need is read whole by both, then narrowed)
    data = sum(os.path.getsize(os.path.join(directory, f"__{r}_0.distcp")) for r in range(4))
    reads = [[e for e in run.clock(r).events if e.lane == "io"] for r in range(2)]
    assert all(len(events) >= 3 for events in reads)     # metadata + two shards' files
    assert sum(io["read"] for io in run.storage_io) >= data
    assert all(0.4 * data < io["read"] < 0.75 * data for io in run.storage_io)


@pytest.mark.slow
def test_a_rank_that_imports_dcp_inside_the_run_is_charged_too(tmp_path):
    """Notebooks may import torch.distributed.checkpoint inside the rank function: the
    run patches it when it is imported (run in a fresh interpreter, where it is not)."""
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import sys, torch, torch.distributed as dist
        import simcluster as sc
        assert "torch.distributed.checkpoint" not in sys.modules
        def fn():
            import torch.distributed.checkpoint as dcp
            dcp.save({{"w": torch.zeros(1000)}}, checkpoint_id={str(tmp_path)!r})
        run = sc.Cluster("dgx-a100").run(fn, world_size=2)
        # a replicated tensor: DCP has one rank (0) write it
        print(run.storage_io[0]["write"] > 4000, run.clock(0).io > 0)
    """)
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True", "True"]


def test_checkpoint_runs_are_deterministic(tmp_path):
    runs = [sc.Cluster("dgx-a100").run(_train_and_save(str(tmp_path / str(i))),
                                       world_size=4) for i in range(2)]
    assert runs[0].elapsed == runs[1].elapsed
    assert _io_spans(runs[0]) == _io_spans(runs[1])
    assert all(_equal(a, b) for a, b in zip(runs[0].results, runs[1].results))


def test_timeline_and_trace_show_storage_io(saved, tmp_path):
    import json

    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, run = saved
    ax = run.timeline()
    assert "io" in {c.get_gid() for c in ax.collections}
    assert "storage I/O" in [t.get_text() for t in ax.get_legend().get_texts()]
    plt.close(ax.figure)
    trace = json.loads(open(run.save_trace(tmp_path / "t.json")).read())
    io_events = [e for e in trace["traceEvents"] if e.get("cat") == "io"]
    assert len(io_events) == 5 and all(e["name"].startswith("write ") for e in io_events)


# ------------------------------------------------------ crashes and restarts
def _resumable(directory, steps=6, every=2):
    """Train ``steps`` steps with FSDP2 (a global batch of 8, split among the ranks),
    saving with DCP every ``every`` steps into
    ``directory/step_N``; start from the latest complete checkpoint (one whose
    ``.metadata`` the coordinator committed). Returns the final state, the step it
    started from, the attempt, and what it found of a torn checkpoint."""
    def fn():
        model, optimizer = _sharded(_model())
        complete = sorted(int(name.split("_")[1]) for name in os.listdir(directory)
                          if os.path.exists(os.path.join(directory, name, ".metadata")))
        found = {name: sorted(os.listdir(os.path.join(directory, name)))
                 for name in os.listdir(directory)}
        sizes = {name: os.path.getsize(os.path.join(directory, name, "__1_0.distcp"))
                 for name in found if "__1_0.distcp" in found[name]}
        start = complete[-1] if complete else 0
        if start:
            msd, osd = get_state_dict(model, optimizer)
            state = {"model": msd, "optim": osd}
            dcp.load(state, checkpoint_id=os.path.join(directory, f"step_{start}"))
            set_state_dict(model, optimizer, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        rank, world = dist.get_rank(), dist.get_world_size()
        for step in range(start, steps):
            # a global batch of 8 per step, split among however many ranks there are
            torch.manual_seed(1000 * step)
            batch = torch.randn(8, 64).chunk(world)[rank]
            model(batch).square().mean().backward()
            optimizer.step()
            optimizer.zero_grad()
            if (step + 1) % every == 0:
                msd, osd = get_state_dict(model, optimizer)
                dcp.save({"model": msd, "optim": osd},
                         checkpoint_id=os.path.join(directory, f"step_{step + 1}"))
        return (_full_state(model, optimizer), start,
                os.environ["TORCHELASTIC_RESTART_COUNT"], found, sizes)
    return fn


def test_dcp_save_crash_restart_load_is_bit_identical(tmp_path):
    """Rank 1 crashes while it writes its shard of the step-4 checkpoint: that file is
    torn and the checkpoint never committed, so the restart resumes from step 2, and ends
    bit-identical to the run that never failed."""
    cluster = sc.Cluster("dgx-a100")
    (tmp_path / "clean").mkdir()
    (tmp_path / "faulty").mkdir()
    clean = cluster.run(_resumable(str(tmp_path / "clean")), world_size=4)
    writes = [e for e in clean.clock(1).events if e.lane == "io"]
    assert len(writes) == 3                       # steps 2, 4 and 6
    at = (writes[1].start + writes[1].end) / 2
    run = cluster.run(_resumable(str(tmp_path / "faulty")), world_size=4,
                      faults=[sc.faults.Crash(rank=1, at=at)], max_restarts=1)
    for rank in range(4):
        assert _equal(run.results[rank][0], clean.results[rank][0])
    assert [r[1:3] for r in run.results] == [(2, "1")] * 4
    found, sizes = run.results[0][3], run.results[0][4]
    assert ".metadata" in found["step_2"] and ".metadata" not in found["step_4"]
    full = os.path.getsize(tmp_path / "clean" / "step_4" / "__1_0.distcp")
    assert 0 < sizes["step_4"] < full              # torn: cut where the crash came
    assert sizes["step_2"] == full                 # the same state's bytes, complete
    [record] = run.restarts
    assert record.rank == 1 and record.time == at
    # the work lost runs from the step-2 checkpoint's commit to the crash
    commit = [e for e in clean.clock(1).events if e.lane == "io"][0].end
    assert at - record.lost_work >= commit
    assert record.lost_work < at - writes[0].start


def test_a_crash_during_torch_save_tears_the_file(tmp_path):
    path = tmp_path / "state.pt"

    def fn():
        if dist.get_rank() != 0:
            return None
        attempt = os.environ["TORCHELASTIC_RESTART_COUNT"]
        if attempt == "1":
            torn = os.path.getsize(path)
            try:
                torch.load(path)
                loads = True
            except RuntimeError:            # not a valid zip file any more
                loads = False
            return torn, loads
        torch.save(torch.zeros(4_000_000), path)     # 16 MB: about 1 ms
        return None

    cluster = sc.Cluster("dgx-a100")
    clean = cluster.run(fn, world_size=2)
    full = os.path.getsize(path)
    [write] = [e for e in clean.clock(0).events if e.lane == "io"]
    at = write.start + 0.25 * write.duration
    run = cluster.run(fn, world_size=2, faults=[sc.faults.Crash(rank=0, at=at)],
                      max_restarts=1)
    torn, loads = run.results[0]
    assert torn == pytest.approx(0.25 * full, rel=0.01) and not loads
    # the crashed write shows as storage I/O cut at the crash
    events = [e for e in run.clock(0).events if e.lane == "io"]
    assert events[0].end == at


def test_elastic_restart_on_fewer_ranks_resumes_from_a_resharded_checkpoint():
    """A node of two is lost after the step-2 checkpoint: the job restarts on the two
    surviving ranks, loads the 4-rank checkpoint re-sharded, and ends where the 4-rank
    run ended (the same global batch; sums in another order, so equal to rounding)."""
    import tempfile

    two_nodes = sc.Cluster.from_dict({"nodes": [{"devices": 2, "count": 2}]})
    with tempfile.TemporaryDirectory() as clean_dir, \
            tempfile.TemporaryDirectory() as faulty_dir:
        clean = two_nodes.run(_resumable(clean_dir), world_size=4)
        writes = [e for e in clean.clock(2).events if e.lane == "io"]
        at = (writes[0].end + writes[1].start) / 2     # training steps 3 and 4
        run = two_nodes.run(_resumable(faulty_dir), world_size=4, max_restarts=1,
                            faults=[sc.faults.NodeCrash(node=1, at=at)], min_world_size=2)
        assert run.world_size == 2
        assert [r[1:3] for r in run.results] == [(2, "1")] * 2
        final, expected = run.results[0][0], clean.results[0][0]
        assert final.keys() == expected.keys()
        for key in expected:
            torch.testing.assert_close(final[key], expected[key], rtol=1e-5, atol=1e-6)
        # two ranks of one node read the whole 4-rank checkpoint
        assert sum(io["read"] for io in run.storage_io) >= sum(
            os.path.getsize(os.path.join(faulty_dir, "step_2", f"__{r}_0.distcp"))
            for r in range(4))


def test_fake_tensors_are_saved_as_records_and_charged_their_full_size(tmp_path):
    """Inside sc.fake_tensors() a state dict has shapes but no data: torch.save writes a
    small file that records them, charged as the real bytes; torch.load (also inside
    fake_tensors) gives fake tensors of the same shapes, charged the same."""
    path = tmp_path / "big.pt"

    def fn():
        if dist.get_rank() != 0:
            return None
        with sc.fake_tensors():
            model = nn.Linear(8192, 8192)                  # 268 MB of fp32 weights
            state = {"model": model.state_dict(), "step": 7, "shapes": [(1, 2)]}
            torch.save(state, path)
            back = torch.load(path)
        try:
            torch.load(path)
            outside = "loaded"
        except RuntimeError as error:
            outside = str(error)
        return ({k: (tuple(v.shape), v.dtype) for k, v in back["model"].items()},
                back["step"], back["shapes"], outside)

    run = sc.Cluster("dgx-a100").run(fn, world_size=2)
    shapes, step, small, outside = run.results[0]
    assert shapes == {"weight": ((8192, 8192), torch.float32),
                      "bias": ((8192,), torch.float32)}
    assert (step, small) == (7, [(1, 2)])
    assert "load it inside `with sc.fake_tensors():`" in outside
    assert os.path.getsize(path) < 10_000                  # the records, not the data
    tensors = 4 * (8192 * 8192 + 8192)
    written = run.storage_io[0]["write"]
    assert tensors < written < tensors + 10_000
    assert run.storage_io[0]["read"] == written            # once, inside fake_tensors
    [save, load] = [e for e in run.clock(0).events if e.lane == "io"]
    assert save.duration == pytest.approx(written / (15.2 * GB))
    assert load.duration == pytest.approx(written / (25.6 * GB))


def test_lost_work_counts_from_rank_0s_torch_save(tmp_path):
    """A replicated model checkpointed by rank 0 alone (the usual DDP loop): a crash
    loses the work since that save, not since the start."""
    def fn():
        if dist.get_rank() == 0:
            torch.save(torch.zeros(1000), tmp_path / "latest.pt")
        dist.barrier()
        torch.ones(512, 512) @ torch.ones(512, 512)

    cluster = sc.Cluster("dgx-a100")
    clean = cluster.run(fn, world_size=2)
    [save] = [e for e in clean.clock(0).events if e.lane == "io"]
    matmul = clean.clock(1).events[-1]
    at = (matmul.start + matmul.end) / 2
    run = cluster.run(fn, world_size=2, faults=[sc.faults.Crash(rank=1, at=at)],
                      max_restarts=1)
    assert run.restarts[0].lost_work == pytest.approx(at - save.end)
