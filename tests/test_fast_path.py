"""The accounting fast path charges exactly what the reference per-op path charges.

Each case runs a lesson's measured workload twice, with the fast path
(:class:`simcluster.accounting.FastRankAccounting`, the default) and without it
(``SIMCLUSTER_FAST_PATH=0``: :class:`~simcluster.accounting.RankAccounting`), and
compares everything a run records, exactly (floats with ``==``): every clock's totals
and events (the timeline and the Perfetto trace are drawn from them), every memory
account's history, peaks and peaks by category (device and host), per-module time,
traffic, host transfers, storage I/O and the collectives.
"""

import gc
import json

import pytest
import torch

import simcluster as sc
from simcluster import accounting
from workbook.lesson02_gradient_aggregation import demos as l02
from workbook.lesson03_data_parallel import demos as l03
from workbook.lesson04_model_parallel import demos as l04
from workbook.lesson05_pipeline_parallel import demos as l05
from workbook.lesson06_tensor_parallel import demos as l06
from workbook.lesson07_zero_fsdp import demos as l07
from workbook.lesson08_memory_and_precision import demos as l08
from workbook.lesson09_3d_parallelism import demos as l09


def _snapshot(run, tmp_path):
    """Everything ``run`` recorded, as plain comparable values."""
    rec = run.recorder
    trace = tmp_path / "trace.json"
    run.save_trace(str(trace))
    return {
        "clocks": [(c.now, c.compute, c.comm, c.idle, c.io, c.flops, list(c.events))
                   for c in rec.clocks],
        "memory": [(m.peak, m.total, dict(m.in_use), dict(m.peak_by_category),
                    dict(m.category_peaks), list(m.history))
                   for m in rec.memories + rec.host_memories],
        "module_time": [dict(t) for t in rec.module_time],
        "traffic": dict(rec.traffic),
        "host_transfers": [dict(t) for t in rec.host_transfers],
        "storage_bytes": [dict(t) for t in rec.storage_bytes],
        "collectives": list(rec.collectives),
        "trace": json.loads(trace.read_text()),
    }


def _runs(workload, monkeypatch, tmp_path, fast):
    """The snapshots of every accounted ``cluster.run`` that ``workload()`` makes."""
    monkeypatch.setenv(accounting.FAST_PATH_ENV, "1" if fast else "0")
    modes, runs = [], []
    make = accounting.rank_accounting

    def spying(rank, recorder):
        mode = make(rank, recorder)
        modes.append(type(mode))
        return mode

    original = sc.Cluster.run

    def recording(self, *args, **kwargs):
        run = original(self, *args, **kwargs)
        runs.append(run)
        return run

    with monkeypatch.context() as m:
        m.setattr(accounting, "rank_accounting", spying)
        m.setattr(sc.Cluster, "run", recording)
        torch.manual_seed(0)
        # Both paths start with no cyclic garbage: a storage held by a reference cycle is
        # freed when Python's collector runs, which depends on what earlier tests left
        # (lesson 07's ZeRO-3 with offload made such a cycle; see docs/architecture.md).
        gc.collect()
        workload()
    expected = accounting.FastRankAccounting if fast else accounting.RankAccounting
    assert modes and set(modes) == {expected}   # the switch picked the path asked for
    return [_snapshot(run, tmp_path) for run in runs if run.recorder is not None]


A100 = sc.Cluster.preset("dgx-a100")

WORKLOADS = {
    "02 ring all-reduce": lambda: l02.measure_allreduce(A100, "ring", 4, 4096),
    "03 DDP, accumulation": lambda: l03.measure(A100, 2, batch=8, micro_batches=2),
    "03 DDP on fake tensors": lambda: l03.measure(A100, 2, batch=8, fake=True),
    "04 naive split": lambda: l04.run_naive_split(A100, p=2, batch=8),
    "05 1F1B": lambda: l05.measure(A100, "1F1B", 2, 4, fake=False, width=32, rows=8),
    "05 GPipe, fake": lambda: l05.measure(A100, "GPipe", 2, 4),
    "06 tensor-parallel block": lambda: l06.measure_layer(A100, 2, hidden=32, heads=4,
                                                          seq=8),
    "07 ZeRO-3, mixed, offload": lambda: l07.measure_stage(A100, 3, 2, layers=2, width=32,
                                                           mixed=True, offload=True),
    "07 ZeRO-1 fake": lambda: l07.measure_stage(A100, 1, 2, layers=2, width=32, fake=True),
    "08 bf16, checkpointing": lambda: l08.measure(A100, layers=2, hidden=64, heads=4,
                                                  seq=32, batch=2, precision="bf16",
                                                  checkpoint="all", fake=False),
    "09 3D (pp 2, tp 2)": lambda: l09.measure(A100, 2, 1, 2, batch=4, micro_batches=2),
}


@pytest.mark.parametrize("name", sorted(WORKLOADS))
def test_fast_path_charges_exactly_what_the_reference_charges(name, monkeypatch,
                                                               tmp_path):
    workload = WORKLOADS[name]
    reference = _runs(workload, monkeypatch, tmp_path, fast=False)
    fast = _runs(workload, monkeypatch, tmp_path, fast=True)
    assert reference, "the workload made no accounted run"
    assert len(fast) == len(reference)
    for ref, got in zip(reference, fast):
        for key in ref:
            assert got[key] == ref[key], f"{name}: {key} differs with the fast path"


def test_the_fast_path_sets_the_mode_aside_for_the_simulators_own_work(monkeypatch):
    """A collective's result is computed without a single op through the mode (the
    reference sees each of its copies), and the mode is back afterwards."""
    seen = {}

    def count(cls):
        original = cls.__torch_dispatch__

        def counting(self, func, types, args=(), kwargs=None):
            if self._paused:
                seen[cls] = seen.get(cls, 0) + 1
            return original(self, func, types, args, kwargs)
        monkeypatch.setattr(cls, "__torch_dispatch__", counting)

    count(accounting.RankAccounting)
    count(accounting.FastRankAccounting)

    def rank():
        import torch.distributed as dist
        t = torch.ones(8)
        dist.all_reduce(t)
        return float(t.sum() * 2)   # ops after the collective still run (and count)

    for fast in ("0", "1"):
        monkeypatch.setenv(accounting.FAST_PATH_ENV, fast)
        run = A100.run(rank, world_size=4)
        assert run.results == [64.0] * 4
    assert seen.get(accounting.RankAccounting, 0) > 0
    assert seen.get(accounting.FastRankAccounting, 0) == 0


# ------------------------------------------- DDP's shape check and all_gather in bulk
def _ddp_rank(mismatch=None):
    """A DDP construction and one step; ``mismatch`` gives one rank a different model
    (more parameters, another shape, or other strides) for DDP's check to catch."""
    import torch.distributed as dist
    import torch.nn as nn
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    rank = dist.get_rank()
    model = nn.Linear(16, 4)
    if rank == 3 and mismatch == "count":
        model = nn.Sequential(nn.Linear(16, 4), nn.Linear(4, 4))
    elif rank == 2 and mismatch == "shape":
        model = nn.Linear(16, 5)
    elif rank == 1 and mismatch == "strides":
        model.weight = nn.Parameter(torch.randn(16, 4).t())
    ddp = DDP(model)
    ddp(torch.ones(5, 16)).sum().backward()
    return float(model.weight.grad.sum())


def _all_gather_rank():
    """all_gather into a list (the outputs rows of one buffer), into separate tensors and
    into tensors autograd tracks."""
    import torch.distributed as dist
    n, rank = dist.get_world_size(), dist.get_rank()
    rows = torch.zeros(n, 3)
    dist.all_gather(list(rows), torch.full((3,), float(rank)))
    separate = [torch.zeros(2, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(separate, torch.arange(2) + 10 * rank)
    tracked = [torch.zeros(2, requires_grad=True) for _ in range(n)]   # autograd's leaves
    dist.all_gather(tracked, torch.full((2,), float(rank)))
    assert all(t.grad_fn is None and t.requires_grad for t in tracked)
    return rows.tolist(), [t.tolist() for t in separate], [t.tolist() for t in tracked]


TWO_NODES = sc.Cluster.preset("dgx-a100", nodes=2)
BULK_WORKLOADS = {
    "DDP on 8 ranks": lambda: TWO_NODES.run(_ddp_rank, world_size=8),
    "all_gather on 8 ranks": lambda: TWO_NODES.run(_all_gather_rank, world_size=8),
}


@pytest.mark.parametrize("name", sorted(BULK_WORKLOADS))
def test_bulk_work_charges_exactly_what_the_reference_charges(name, monkeypatch,
                                                              tmp_path):
    """DDP's shape check (its per-rank ops charged in bulk) and all_gather (its copies in
    one call per rank) record the same as on the reference path, op by op."""
    from simcluster import _torch_internals
    bulk = []
    original = _torch_internals._verify_params_in_bulk
    monkeypatch.setattr(_torch_internals, "_verify_params_in_bulk",
                        lambda *a: bulk.append(1) or original(*a))
    workload = BULK_WORKLOADS[name]
    reference = _runs(workload, monkeypatch, tmp_path, fast=False)
    assert not bulk   # the reference runs torch's C++ check
    fast = _runs(workload, monkeypatch, tmp_path, fast=True)
    assert len(bulk) == (8 if name.startswith("DDP") else 0)
    for key in reference[0]:
        assert fast[0][key] == reference[0][key], f"{name}: {key} differs"


def test_bulk_all_gather_gives_every_rank_every_input():
    run = TWO_NODES.run(_all_gather_rank, world_size=8)
    rows = [[float(r)] * 3 for r in range(8)]
    assert run.results == [(rows, [[10 * r, 10 * r + 1] for r in range(8)],
                            [[float(r)] * 2 for r in range(8)])] * 8


@pytest.mark.parametrize("mismatch", ["count", "shape", "strides"])
def test_ddp_shape_check_in_bulk_fails_as_torchs_does(mismatch, monkeypatch):
    """A model that differs on one rank stops the run with torch's own message, on the
    fast path (in bulk) as on the reference path (torch's C++)."""
    messages = []
    for fast in ("0", "1"):
        monkeypatch.setenv(accounting.FAST_PATH_ENV, fast)
        with pytest.raises(sc.RankError) as failure:
            TWO_NODES.run(_ddp_rank, world_size=8, args=(mismatch,))
        messages.append(str(failure.value).split("\n")[0])
    assert messages[0] == messages[1]
    expected = {"count": "inconsistent", "shape": "match sizes", "strides": "match strides"}
    assert expected[mismatch] in messages[0]


def test_all_gather_under_a_learners_mode_shows_it_as_gloo_does():
    """A learner's dispatch mode inside a rank sees all_gather as it sees gloo's: one
    ``c10d.allgather_`` op, none of the copies that deliver the result (gloo makes them
    in C++, out of the dispatcher's sight)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Ops(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    def rank():
        import torch.distributed as dist
        outputs, inp = [torch.zeros(2) for _ in range(4)], torch.ones(2)
        with Ops() as mode:
            dist.all_gather(outputs, inp)
        return mode.ops, [o.tolist() for o in outputs]

    for result in A100.run(rank, world_size=4).results:
        assert result == (["c10d.allgather_.default"], [[1.0, 1.0]] * 4)


def test_ddp_shape_check_falls_back_to_torchs_cpp(monkeypatch):
    """Where the bulk check could differ, torch's C++ runs: when its n outputs would not
    all fit in the device (out of memory must come at the same allocation), under a
    learner's dispatch mode (which sees the C++'s ops one by one) and under a function
    mode (``torch.device``: it would see the Python's calls)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    from simcluster import _torch_internals

    class Seen(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def under_a_mode():
        with Seen():
            return _ddp_rank()

    bulk = []
    original = _torch_internals._verify_params_in_bulk
    monkeypatch.setattr(_torch_internals, "_verify_params_in_bulk",
                        lambda *a: bulk.append(1) or original(*a))
    A100.run(under_a_mode, world_size=4)
    assert not bulk

    def under_a_device_context():   # a function mode: it would see the Python's calls
        with torch.device("cpu"):
            return _ddp_rank()

    A100.run(under_a_device_context, world_size=4)
    assert not bulk
    monkeypatch.setattr(accounting.FastRankAccounting, "fits", lambda self, nbytes: False)
    A100.run(_ddp_rank, world_size=4)
    assert not bulk
    monkeypatch.undo()
    monkeypatch.setattr(_torch_internals, "_verify_params_in_bulk",
                        lambda *a: bulk.append(1) or original(*a))
    A100.run(_ddp_rank, world_size=4)
    assert len(bulk) == 4   # (and taken otherwise: the spy works)
