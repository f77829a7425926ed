"""The training job of lab 10's first exercise: a small model with dropout, AdamW, a
learning-rate schedule and a shuffled data set split over the ranks — every piece of state
a bit-identical restart must bring back.

Call on every rank (inside ``cluster.run``)::

    model, ddp, optimizer, scheduler = job.build()
    x, y = job.batch(step)          # this rank's mini-batch of global step `step`
    job.train_step(ddp, optimizer, scheduler, x, y)
    job.params(model)               # every parameter, one flat tensor

The data position is the step: :func:`batch` reshuffles the data set every epoch with a
:class:`~torch.utils.data.DistributedSampler` (``set_epoch``), so step ``s`` always
reads the same samples on the same rank, as Megatron-LM's ``consumed_samples`` does.
"""

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DistributedSampler, TensorDataset

WORLD_SIZE, BATCH = 4, 8
_g = torch.Generator().manual_seed(10)
DATA = TensorDataset(torch.randn(128, 16, generator=_g), torch.randn(128, 4, generator=_g))


def build():
    """``(model, ddp, optimizer, scheduler)``, the same initial model on every rank; then
    each rank's global RNG is seeded by its rank (its own dropout masks)."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Dropout(0.2), nn.Linear(32, 4))
    torch.manual_seed(100 + dist.get_rank())
    ddp = DDP(model)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=4, gamma=0.5)
    return model, ddp, optimizer, scheduler


def batch(step):
    """This rank's mini-batch ``(x, y)`` of global step ``step`` (an epoch is
    ``len(DATA) / (BATCH × world size)`` steps, each epoch shuffled anew)."""
    sampler = DistributedSampler(DATA, shuffle=True, seed=0)
    per_epoch = len(sampler) // BATCH
    epoch, i = divmod(step, per_epoch)
    sampler.set_epoch(epoch)
    return DATA[list(sampler)[i * BATCH:(i + 1) * BATCH]]


def train_step(ddp, optimizer, scheduler, x, y):
    """One step: forward (with dropout), backward (DDP all-reduces the gradients),
    optimizer step, scheduler step."""
    optimizer.zero_grad()
    nn.functional.mse_loss(ddp(x), y).backward()
    optimizer.step()
    scheduler.step()


def params(model):
    """Every parameter of ``model``, flattened into one new tensor."""
    return torch.cat([p.detach().flatten() for p in model.parameters()])
