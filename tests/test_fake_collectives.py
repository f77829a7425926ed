"""Functional collectives (``torch.ops._c10d_functional``, what DTensor and tensor
parallelism issue) reach the simulated network on fake tensors as on real ones.

FakeTensorMode answers them from shapes alone: before, a DTensor model on fake tensors
issued no all-reduce at all, so a lesson could not time tensor parallelism at real size.
"""

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import simcluster as sc


def records(run):
    return [(c.op, c.ranks, c.nbytes, c.start, c.end) for c in run.collectives]


def _functional(fake):
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        x = torch.ones(256, 256)
        for _ in range(2):   # the second time, answered from the fake-op cache if wrong
            y = funcol.all_reduce(x, "sum", dist.group.WORLD) * 2
            z = funcol.all_gather_tensor(y, 0, dist.group.WORLD)
            w = funcol.reduce_scatter_tensor(z, "sum", 0, dist.group.WORLD)
            w = w + 0   # uses the result: waits for it
        return tuple(w.shape)


def test_functional_collectives_on_fake_tensors_match_real_ones():
    node = sc.Cluster.preset("dgx-a100")
    real, fake = (node.run(_functional, world_size=4, args=(f,)) for f in (False, True))
    assert [c.op for c in fake.collectives] == \
        ["all_reduce", "all_gather_into_tensor", "reduce_scatter_tensor"] * 2
    # the same collectives and sizes; AsyncCollectiveTensor's own ops on fake data cost a
    # few tenths of a microsecond less, so the times agree closely rather than exactly
    assert [r[:3] for r in records(fake)] == [r[:3] for r in records(real)]
    assert fake.elapsed == pytest.approx(real.elapsed, rel=0.02)
    assert fake.results == real.results == [(256, 256)] * 4


def _megatron_mlp(fake):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        torch.manual_seed(0)
        model = nn.Sequential(nn.Linear(256, 1024), nn.ReLU(), nn.Linear(1024, 256))
        parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
        for _ in range(2):
            model(torch.randn(32, 256, requires_grad=True)).sum().backward()


def test_tensor_parallel_mlp_on_fake_tensors_matches_real_tensors():
    """One all-reduce forward, one backward, per step: at the same simulated times, with
    the same memory, on fake tensors as on real ones."""
    node = sc.Cluster.preset("dgx-a100")
    real, fake = (node.run(_megatron_mlp, world_size=4, args=(f,)) for f in (False, True))
    assert [c.op for c in fake.collectives].count("all_reduce") == 4
    assert records(fake) == records(real)
    assert fake.elapsed == real.elapsed
    for rank in range(4):
        assert fake.peak_memory(rank) == real.peak_memory(rank)
