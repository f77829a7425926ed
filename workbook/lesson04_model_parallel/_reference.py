"""Reference answers of lab 04 (model parallelism); the checks import them while they run.

Not imported by the lab or the lesson: the lab asks the learner to write these.
"""

import itertools

import torch
import torch.distributed as dist


def forward_backward(stage, in_shape, x, y, loss_fn):
    """Rank r holds stage r of a model cut into ``world_size`` stages. Forward: rank 0
    starts from ``x``, every other rank receives its input (shape ``in_shape``) from rank
    r − 1 and sends its output to rank r + 1. The last rank computes ``loss_fn(out, y)``
    and runs backward; the others receive the gradient of their output from rank r + 1,
    backward from it, and send the gradient of their input to rank r − 1. Returns the
    loss on the last rank, None elsewhere; the stage's parameters hold their gradients."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        x = torch.empty(in_shape, dtype=next(stage.parameters()).dtype)
        dist.recv(x, rank - 1)
        x.requires_grad_()
    out = stage(x)
    loss = None
    if rank == p - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, rank + 1)
        out.backward(grad)
    if rank > 0:
        dist.send(x.grad, rank - 1)
    return loss


def balance(layer_times, p):
    """The ``p - 1`` boundaries (indices of the first layer of stages 1 … p−1) that make
    the slowest stage as fast as possible; among equally good cuts, the first found."""
    n = len(layer_times)
    prefix = [0.0, *itertools.accumulate(layer_times)]
    best, best_max = None, float("inf")
    for cut in itertools.combinations(range(1, n), p - 1):
        edges = (0, *cut, n)
        slowest = max(prefix[b] - prefix[a] for a, b in zip(edges, edges[1:]))
        if slowest < best_max:
            best, best_max = list(cut), slowest
    return best


def boundary_bytes(stages, in_shape):
    """Bytes that cross each of the ``len(stages) - 1`` boundaries in one forward and
    backward step: the activation leaving stage i (forward) and its gradient coming back
    (backward), of the same shape and dtype. ``in_shape`` is the model's input shape."""
    x = torch.zeros(in_shape, dtype=next(stages[0].parameters()).dtype)
    sizes = []
    with torch.no_grad():
        for stage in stages[:-1]:
            x = stage(x)
            sizes.append(2 * x.numel() * x.element_size())
    return sizes
