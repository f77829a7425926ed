"""What lab 04 (model parallelism) gives the learner: the small MLP its exercises split, the
batches, each stage's input shape, and ``mse`` (the checks use the same ones).

``from workbook.lesson04_model_parallel.lab import batch, in_shapes, make_model, mse``.
Nothing here is an answer: the reference answers stay in :mod:`._reference`.
"""

import torch
import torch.nn as nn

from workbook.checking import mse  # noqa: F401  (the lab imports it from here)


BATCH = 5


FEATURES = 6


def make_model(seed=0, dtype=torch.float32):
    """The checks' model: 6 → 16 → 12 → 8 → 10 → 3, eight layers (activations between)."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 12), nn.ReLU(),
                         nn.Linear(12, 8), nn.Tanh(), nn.Linear(8, 10),
                         nn.Linear(10, 3)).to(dtype)


def batch(size=BATCH, seed=1, dtype=torch.float32):
    """``(x, y)``: ``size`` inputs of the model and targets."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(size, FEATURES, generator=g).to(dtype),
            torch.randn(size, 3, generator=g).to(dtype))


def in_shapes(stages, x):
    """The input shape of every stage when the model runs on ``x``."""
    shapes = []
    with torch.no_grad():
        for stage in stages:
            shapes.append(tuple(x.shape))
            x = stage(x)
    return shapes
