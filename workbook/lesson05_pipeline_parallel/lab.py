"""What lab 05 (pipeline parallelism) gives the learner: :func:`measure_schedule`, which runs
a schedule on the timing model the checks use (fake tensors: ``p`` stages of two
8192 × 8192 layers) and counts the micro-batches of activations each stage held.

Nothing here is an answer: the reference answers stay in :mod:`._reference`.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import simcluster as sc
from workbook.checking import mse


BIG_WIDTH, BIG_ROWS, LAYERS_PER_STAGE = 8192, 1024, 2          # the timing model


def _cluster():
    """One DGX node: up to 8 ranks."""
    return sc.Cluster.preset("dgx-a100", nodes=1)


class _Linear(nn.Module):
    """``nn.Linear`` without initialisation: under fake tensors there are no values to
    initialise, and initialising would charge compute before the schedule starts."""

    def __init__(self, width):
        super().__init__()
        self.weight = nn.Parameter(torch.empty(width, width))
        self.bias = nn.Parameter(torch.empty(width))

    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _big_stage():
    """One stage of the timing model: ``LAYERS_PER_STAGE`` × (8192 × 8192 linear + ReLU)."""
    layers = []
    for _ in range(LAYERS_PER_STAGE):
        layers += [_Linear(BIG_WIDTH), nn.ReLU()]
    return nn.Sequential(*layers)


def _activations():
    return sc.memory_in_use()["activations"]


def _timing_body(fn, p, m):
    """Every rank: its stage of the timing model under fake tensors, the schedule, and
    the activation bytes in use after each forward of the stage (when a micro-batch's
    forward is complete), and how many forwards it ran. The first stage's inputs
    want gradients too, so that every stage computes the same backward (as the
    formula assumes)."""

    def body():
        rank = dist.get_rank()
        with sc.fake_tensors():
            stage = _big_stage()
            shape = (BIG_ROWS, BIG_WIDTH)
            inputs = [torch.empty(shape, requires_grad=True) if rank == 0 else None
                      for _ in range(m)]
            targets = [torch.empty(shape) if rank == p - 1 else None for _ in range(m)]
            held = []
            stage.register_forward_hook(lambda *_: held.append(_activations()))
            start = _activations()
            fn(stage, inputs, targets, mse, shape)
        return max(held, default=start) - start, len(held)

    return body


_UNIT = []


def _activations_of_one_micro_batch():
    """Bytes of activations one stage keeps for one micro-batch, counted as the schedules'
    runs count them: when the stage's forward returns (measured once)."""
    if not _UNIT:
        def body():
            with sc.fake_tensors():
                stage = _big_stage()
                after = []
                stage.register_forward_hook(lambda *_: after.append(_activations()))
                before = _activations()
                stage(torch.empty(BIG_ROWS, BIG_WIDTH, requires_grad=True))
            return after[0] - before

        _UNIT.append(_cluster().run(body, world_size=1).results[0])
    return _UNIT[0]


def measure_schedule(schedule, p, m):
    """Run ``schedule`` on the checks' timing model (fake tensors, ``p`` stages of two
    8192 × 8192 layers, ``m`` micro-batches of 1,024 rows); returns the
    :class:`~simcluster.Run` and the micro-batches of activations each stage held at its
    peak."""
    run = _cluster().run(_timing_body(schedule, p, m), world_size=p)
    return run, _micro_batches_held(run)


def _micro_batches_held(run):
    """Per rank: its peak activations over one micro-batch's."""
    unit = _activations_of_one_micro_batch()
    return [peak / unit for peak, _ in run.results]
