"""DTensor and functional collectives on fake tensors: the same collectives, bytes and
simulated times as on real tensors.

FakeTensorMode answers torch's functional collectives (``torch.ops._c10d_functional``,
which DTensor's redistributions and ``torch.distributed._functional_collectives`` issue)
from their meta kernels: an empty result, no call to the process group. A tensor-parallel
run on fake tensors then recorded no all-reduce at all and finished too early, a silently
wrong number.
"""

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               SequenceParallel, parallelize_module)

import simcluster as sc

HIDDEN, SEQ, BATCH = 32, 8, 2


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm(HIDDEN)
        self.up, self.down = nn.Linear(HIDDEN, 4 * HIDDEN), nn.Linear(4 * HIDDEN, HIDDEN)

    def forward(self, x):
        return self.down(F.gelu(self.up(self.ln(x))))


def plan(sequence_parallel):
    if not sequence_parallel:
        return {"up": ColwiseParallel(), "down": RowwiseParallel()}
    return {"ln": SequenceParallel(), "up": ColwiseParallel(input_layouts=Shard(1)),
            "down": RowwiseParallel(output_layouts=Shard(1))}


def tp_step(fake, sequence_parallel):
    """Parallelize the MLP over a 1-D mesh of every rank, then one forward and backward."""
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))   # before fake mode
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        torch.manual_seed(0)
        model = parallelize_module(MLP(), mesh, plan(sequence_parallel))
        seq = SEQ // dist.get_world_size() if sequence_parallel else SEQ
        x = torch.randn(BATCH, seq, HIDDEN, requires_grad=True)
        dist.barrier()
        model(x).sum().backward()
        dist.barrier()


def records(run):
    return [(c.op, c.ranks, c.nbytes, c.start, c.end) for c in run.collectives]


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_tensor_parallel_on_fake_tensors_communicates_as_on_real_ones(sequence_parallel):
    cluster = sc.Cluster.preset("dgx-a100")
    real, fake = (cluster.run(tp_step, world_size=4, args=(f, sequence_parallel))
                  for f in (False, True))
    first = [c.op for c in real.collectives].index("barrier")
    between = [c.op for c in real.collectives[first:] if c.op != "barrier"]
    # on real tensors: the forward's and the backward's
    assert between == (["all_gather_into_tensor", "reduce_scatter_tensor"] * 2
                       if sequence_parallel else ["all_reduce"] * 2)
    assert records(fake) == records(real)
    assert fake.elapsed == real.elapsed
    assert fake.summary().rows == real.summary().rows   # compute, communication, memory


def functional_collectives(fake):
    """Every functional collective DTensor uses, waited on explicitly."""
    group = dist.group.WORLD
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        x = torch.ones(64)
        out = [funcol.all_reduce(x, "sum", group),
               funcol.all_gather_single(x, 0, group),
               funcol.reduce_scatter_single(x, "sum", 0, group),
               funcol.all_to_all_single(x, None, None, group),
               funcol.broadcast(x, 0, group)]
        shapes = [tuple(funcol.wait_tensor(t).shape) for t in out]
    return shapes, sc.collectives_called()


def test_functional_collectives_on_fake_tensors_reach_the_network():
    cluster = sc.Cluster.preset("dgx-a100")
    real, fake = (cluster.run(functional_collectives, world_size=4, args=(f,))
                  for f in (False, True))
    assert [c.op for c in fake.collectives] == ["all_reduce", "all_gather_into_tensor",
                                                "reduce_scatter_tensor", "all_to_all_single",
                                                "broadcast"]
    assert records(fake) == records(real)
    assert fake.results == real.results


def waits(times):
    """A functional all-reduce of 1 Mi floats, waited on ``times`` times."""
    y = funcol.all_reduce(torch.ones(2**20), "sum", dist.group.WORLD)
    for _ in range(times):
        y = funcol.wait_tensor(y)


def test_waiting_on_a_functional_collective_costs_no_compute():
    cluster = sc.Cluster.preset("dgx-a100")
    once, thrice = (cluster.run(waits, world_size=2, args=(n,)) for n in (1, 3))
    assert once.clock(0).compute == thrice.clock(0).compute
