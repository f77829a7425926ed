"""What lab 06 (tensor and sequence parallelism) gives the learner: the sizes, the small MLP
and transformer :class:`Block` its exercises parallelize, and their inputs (the checks use
the same ones).

Nothing here is an answer: the reference answers stay in :mod:`._reference`.
"""

import torch
import torch.nn as nn


HIDDEN, SEQUENCE, BATCH = 24, 24, 2      # every world size divides 24, 48 and 96


def make_mlp(hidden=HIDDEN, seed=0):
    """The transformer MLP: ``Linear(h, 4h)``, GeLU, ``Linear(4h, h)``."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(hidden, 4 * hidden), nn.GELU(),
                         nn.Linear(4 * hidden, hidden))


class Block(nn.Module):
    """The part of a transformer layer that sequence parallelism changes:
    ``x + mlp(norm(x))`` on activations of shape (sequence, batch, hidden)."""

    def __init__(self, hidden=HIDDEN, seed=0):
        super().__init__()
        self.mlp = make_mlp(hidden, seed)
        self.norm = nn.LayerNorm(hidden)
        with torch.no_grad():   # not the default ones and zeros: their gradients must show
            self.norm.weight.uniform_(0.5, 1.5)
            self.norm.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        """The residual block."""
        return x + self.mlp(self.norm(x))


def activations(features=HIDDEN, seed=1):
    """Activations of shape (sequence, batch, features), the same on every rank."""
    g = torch.Generator().manual_seed(seed)
    return torch.randn(SEQUENCE, BATCH, features, generator=g)
