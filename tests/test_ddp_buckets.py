"""DDP's gradient buckets are communication buffers from the moment DDP's C++ reducer makes
them: at construction, and again when it remakes them inside the first forward after a
step. They used to count as "other", then as "activations" (allocated inside a module's
forward with gradients on), so a DDP baseline's activations were inflated by a copy of
every gradient."""

import pytest
import torch
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc

F32 = 4
WEIGHTS = 2 * 64 * 64 * F32


def _ddp_memory(fake):
    snapshots = {}
    with sc.fake_tensors() if fake else torch.enable_grad():
        model = DDP(nn.Sequential(nn.Linear(64, 64, bias=False), nn.Linear(64, 64, bias=False)))
        snapshots["built"] = sc.memory_in_use()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        for step in range(2):
            y = model(torch.randn(8, 64))
            snapshots[f"forward {step}"] = sc.memory_in_use()
            y.sum().backward()
            del y
            optimizer.step()
    return snapshots


@pytest.mark.parametrize("fake", [False, True], ids=["real", "fake"])
def test_ddp_buckets_are_communication_buffers(fake):
    run = sc.Cluster.preset("dgx-a100").run(_ddp_memory, world_size=2, args=(fake,))
    for memory in run.results:
        assert memory["built"]["communication buffers"] == WEIGHTS
        assert memory["built"]["other"] == 0
        for step in (0, 1):   # the buckets DDP remakes in the second forward, too
            assert memory[f"forward {step}"]["communication buffers"] == WEIGHTS
            assert memory[f"forward {step}"]["activations"] == 2 * 8 * 64 * F32   # two outputs
