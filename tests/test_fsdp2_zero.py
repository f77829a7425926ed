"""FSDP2 as ZeRO-3, measured the way lesson 07 measures it: on fake tensors, with
``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``.

Model states per rank are the ZeRO paper's (2 + 2 + K)Ψ / N_d = 16Ψ / N_d bytes, split
the way FSDP2 keeps them: fp32 parameter shards (4Ψ/N_d), fp32 gradient shards (4Ψ/N_d),
Adam's two moments (8Ψ/N_d). Per step FSDP2 all-gathers bf16 parameters once
(``reshard_after_forward=False``) or twice (``True``: again for the backward pass) and
reduce-scatters fp32 gradients once: 2Ψ or 3Ψ elements, as in the paper.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

import simcluster as sc

D, BLOCKS, WORLD = 256, 2, 4
PSI = BLOCKS * 2 * D * 4 * D     # two bias-free Linear(D, 4D) / Linear(4D, D) per block


def _zero3(reshard):
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    with sc.fake_tensors():
        model = nn.Sequential(*[nn.Sequential(nn.Linear(D, 4 * D, bias=False), nn.ReLU(),
                                              nn.Linear(4 * D, D, bias=False))
                                for _ in range(BLOCKS)])
        for block in model:
            fully_shard(block, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        fully_shard(model, mesh=mesh, mp_policy=mp, reshard_after_forward=reshard)
        optimizer = torch.optim.Adam(model.parameters())
        calls = []
        for _ in range(2):
            calls.append(len(sc.collectives_called()))
            model(torch.randn(8, D)).sum().backward()
            optimizer.step()
            with_grads = sc.memory_in_use()
            optimizer.zero_grad()
        calls.append(len(sc.collectives_called()))
        return with_grads, calls


@pytest.fixture(scope="module", params=[True, False], ids=["reshard", "no-reshard"])
def zero3(request):
    run = sc.Cluster.preset("dgx-a100").run(_zero3, world_size=WORLD, args=(request.param,))
    return request.param, run


def test_model_states_are_sixteen_bytes_per_parameter_over_n(zero3):
    _, run = zero3
    for memory, _ in run.results:
        assert memory["parameters"] == 4 * PSI // WORLD
        assert memory["gradients"] == 4 * PSI // WORLD
        steps = 2 * BLOCKS * 4          # Adam's fp32 step counter, one per weight
        assert memory["optimizer state"] == 8 * PSI // WORLD + steps
        states = memory["parameters"] + memory["gradients"] + memory["optimizer state"]
        assert states - steps == 16 * PSI // WORLD


def test_elements_communicated_per_step_are_two_or_three_psi(zero3):
    reshard, run = zero3
    calls = run.results[0][1]
    last = run.collectives[calls[1]:calls[2]]     # the second step's collectives
    gathered = sum(c.nbytes for c in last if c.op == "all_gather_into_tensor")
    scattered = sum(c.nbytes for c in last if c.op == "reduce_scatter_tensor")
    assert gathered == (2 if reshard else 1) * PSI * 2      # bf16 parameters
    assert scattered == PSI * 4                             # fp32 gradients
    assert gathered // 2 + scattered // 4 == (3 if reshard else 2) * PSI
