"""What lab 07 (ZeRO and FSDP2) gives the learner: the shard layout (:func:`shard_size`,
:func:`my_shard`), the sharded linear layer, and the fitting exercise's model size and
step time and memory (:func:`fit_psi`, :func:`fit_time`, :func:`fit_memory`). The reference answers use the same shard
layout.

Nothing here is an answer: the reference answers stay in :mod:`._reference`.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import simcluster as sc


def shard_size(numel, world_size):
    """Elements of one rank's chunk of a tensor of ``numel`` elements: ⌈numel / N⌉."""
    return -(-numel // world_size)


def my_shard(tensor):
    """A copy of the calling rank's chunk of ``tensor``: flattened, padded with zeros to
    N·``shard_size`` elements, chunk ``dist.get_rank()`` of N."""
    p, rank = dist.get_world_size(), dist.get_rank()
    n = shard_size(tensor.numel(), p)
    flat = tensor.detach().reshape(-1)
    return F.pad(flat, (0, n * p - flat.numel()))[rank * n:(rank + 1) * n].clone()


class ShardedLinear(nn.Module):
    """An ``nn.Linear`` of which this rank keeps only its chunks, ``weight_shard`` and
    ``bias_shard`` (parameters); ``function.apply(x, weight_shard, bias_shard,
    out_features, in_features)`` computes the layer (the learner's ZeRO-3 function)."""

    def __init__(self, linear, function):
        super().__init__()
        self.function = function
        self.out_features, self.in_features = linear.out_features, linear.in_features
        self.weight_shard = nn.Parameter(my_shard(linear.weight))
        self.bias_shard = nn.Parameter(my_shard(linear.bias))

    def forward(self, x):
        return self.function.apply(x, self.weight_shard, self.bias_shard,
                                   self.out_features, self.in_features)


FIT_WORLD, FIT_BLOCKS = 4, 4


def fit_psi(width, blocks=FIT_BLOCKS):
    """Parameters of the fit model: ``blocks`` × (d·4d + 4d·d)."""
    return blocks * 8 * width * width


def _fit_step(width, settings, blocks=FIT_BLOCKS):
    """Two Adam steps of the fit model under ``settings`` on fake tensors; the second is
    timed (from the barrier before it)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    stage = settings["stage"]
    mesh = init_device_mesh("cpu", (dist.get_world_size(),)) if stage == 3 else None
    def block():
        return nn.Sequential(nn.Linear(width, 4 * width, bias=False), nn.ReLU(),
                             nn.Linear(4 * width, width, bias=False))

    with sc.fake_tensors():
        if stage == 3:
            options = {"mesh": mesh,
                       "reshard_after_forward": settings["reshard_after_forward"]}
            if settings["offload"]:
                options["offload_policy"] = CPUOffloadPolicy()
            # Each block is sharded as soon as it is built, so the device never holds the
            # whole unsharded model (4Ψ): a model that needs sharding would not fit whole.
            # With offload, fully_shard moves the shards to pinned host memory at once
            # (torch/distributed/fsdp/_fully_shard/_fsdp_param.py, _init_sharded_param).
            model = nn.Sequential(*[fully_shard(block(), **options) for _ in range(blocks)])
            fully_shard(model, **options)
            optimizer = torch.optim.Adam(model.parameters())
        else:
            model = DDP(nn.Sequential(*[block() for _ in range(blocks)]))
            optimizer = (ZeroRedundancyOptimizer(model.parameters(),
                                                 optimizer_class=torch.optim.Adam)
                         if stage == 1 else torch.optim.Adam(model.parameters()))
        x = torch.randn(8, width)
        for _ in range(2):
            dist.barrier()
            model(x).sum().backward()
            optimizer.step()
            optimizer.zero_grad()


def _fit_run(width, settings):
    return sc.Cluster.preset("dgx-a100").run(_fit_step, world_size=FIT_WORLD,
                                             args=(width, settings), timeout=120)


def fit_time(width, settings):
    """Simulated seconds of one step under ``settings``; raises ``sc.OutOfMemoryError``."""
    run = _fit_run(width, settings)
    return run.elapsed - [c for c in run.collectives if c.op == "barrier"][-1].end


def fit_memory(width, settings):
    """``(GPU bytes, host bytes)`` that rank 0 held at its peak under ``settings`` (the
    host: its pinned share, what CPU offload keeps off the GPU); raises
    ``sc.OutOfMemoryError``. Divide by ``fit_psi(width)`` for bytes per parameter."""
    run = _fit_run(width, settings)
    return run.peak_memory(0)["total"], run.peak_host_memory(0)["total"]
