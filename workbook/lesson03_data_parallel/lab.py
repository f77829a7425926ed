"""What lab 03 (data parallelism) gives the learner: the small MLP its exercises train and
the batches they train on (the checks use the same ones), and ``mse``.

``from workbook.lesson03_data_parallel.lab import batch, make_mlp, mse``. Nothing here
is an answer: the reference answers stay in :mod:`._reference`.
"""

import torch
import torch.nn as nn

from workbook.checking import mse  # noqa: F401  (the lab imports it from here)


def make_mlp(seed=0):
    """The checks' model: 8 → 16 → 16 → 4, 484 float32 parameters (1,936 bytes)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 4))


def batch(size, step, seed=1):
    """``(x, y)`` of ``size`` samples for ``step``, the same on every rank."""
    g = torch.Generator().manual_seed(1_000 * seed + step)
    return torch.randn(size, 8, generator=g), torch.randn(size, 4, generator=g)
