"""Reference answers of lab 05 (pipeline parallelism); the checks import them while they
run.

Not imported by the lab or the lesson: the lab asks the learner to write these.

The schedules run on every rank as ``schedule(stage, inputs, targets, loss_fn, shape)``:
``stage`` is this rank's part of the model; ``inputs`` and ``targets`` are lists of the
``m`` micro-batches, holding tensors on the first (inputs) and the last (targets) rank and
``None`` elsewhere; ``loss_fn(output, target)`` is one micro-batch's mean loss; ``shape``
is the shape of the activation (and of its gradient) that crosses every stage boundary.
Afterwards every parameter's ``.grad`` holds the gradient of the mean loss over the whole
batch. GPipe (exercise 1) also returns, on the first stage, the gradients of that loss with
respect to the ``m`` input micro-batches (what a layer before the pipeline would need).
"""

from collections import deque

import torch
import torch.distributed as dist


def _forward(stage, i, inputs, targets, loss_fn, shape):
    """Micro-batch ``i`` through this stage: ``(input, output)``; on the last stage the
    output is the micro-batch's loss, scaled by 1/m so the gradients add up to the mean."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(inputs)
    if rank == 0:
        x = inputs[i].detach().requires_grad_()   # its gradient is returned too
    else:
        x = torch.empty(shape)
        dist.recv(x, rank - 1)
        x.requires_grad_()
    y = stage(x)
    if rank == p - 1:
        y = loss_fn(y, targets[i]) / m
    return x, y


def gpipe(stage, inputs, targets, loss_fn, shape):
    """GPipe: every micro-batch's forward, then every micro-batch's backward; returns the
    input micro-batches' gradients on the first stage, None elsewhere."""
    rank, p = dist.get_rank(), dist.get_world_size()
    held = []
    for i in range(len(inputs)):
        x, y = _forward(stage, i, inputs, targets, loss_fn, shape)
        if rank < p - 1:
            dist.send(y.detach(), rank + 1)
        held.append((x, y))
    for x, y in held:
        if rank == p - 1:
            y.backward()
        else:
            grad = torch.empty(shape)
            dist.recv(grad, rank + 1)
            y.backward(grad)
        if rank > 0:
            dist.send(x.grad, rank - 1)
    return [x.grad for x, _ in held] if rank == 0 else None


def _exchange(send, send_to, recv_from, shape):
    """Send ``send`` to ``send_to`` and receive a tensor of ``shape`` from ``recv_from``
    (either may be None), both posted at once: two neighbours that send to each other at
    the same time would otherwise wait for each other's receive forever."""
    ops, got = [], None
    if send is not None and send_to is not None:
        ops.append(dist.P2POp(dist.isend, send, send_to))
    if recv_from is not None:
        got = torch.empty(shape)
        ops.append(dist.P2POp(dist.irecv, got, recv_from))
    for work in dist.batch_isend_irecv(ops) if ops else []:
        work.wait()
    return got


def one_f_one_b(stage, inputs, targets, loss_fn, shape):
    """1F1B (PipeDream-Flush): ``p - rank - 1`` warm-up forwards, then one forward and one
    backward in turn, then the remaining backwards; stage ``rank`` holds at most
    ``p - rank`` micro-batches of activations."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(inputs)
    first, last = rank == 0, rank == p - 1
    prev, nxt = (None if first else rank - 1), (None if last else rank + 1)
    warmup = min(p - rank - 1, m)
    held = deque()

    def forward(i, x):
        if not first:
            x.requires_grad_()
        y = stage(x)
        if last:
            y = loss_fn(y, targets[i]) / m
        held.append((x, y))
        return y

    def backward(grad):
        x, y = held.popleft()
        y.backward(grad)
        return None if first else x.grad

    def next_input(i):
        return inputs[i] if first else _exchange(None, None, prev, shape)

    for i in range(warmup):
        y = forward(i, next_input(i))
        _exchange(y.detach(), nxt, None, shape)
    x = next_input(warmup) if warmup < m else None
    for i in range(warmup, m):
        y = forward(i, x)
        grad = None if last else _exchange(y.detach(), nxt, nxt, shape)
        dx = backward(grad)
        if i + 1 < m:     # send this gradient back while the next input comes in
            x = inputs[i + 1] if first else _exchange(dx, prev, prev, shape)
        else:
            _exchange(dx, prev, None, shape)
    for _ in range(warmup):
        dx = backward(_exchange(None, None, nxt, shape))
        _exchange(dx, prev, None, shape)


def interleaved_bubble(p, m, v):
    """The bubble of interleaved 1F1B, as a fraction of wall time: ``(p - 1)/(v·m + p - 1)``."""
    return (p - 1) / (v * m + p - 1)


def micro_batches_held(p, v):
    """Micro-batches of activations the first stage holds at its peak: ``p`` for 1F1B, and
    ``p + (p - 1)/v`` for the interleaved schedule with ``v ≥ 2`` chunks per stage."""
    return p if v == 1 else p + (p - 1) / v


def pick_m_v(p, batch, layers_per_stage, bubble_target, memory_cap, sample_bytes):
    """The fewest micro-batches ``m``, then the fewest chunks ``v``, whose bubble is at most
    ``bubble_target`` and whose activations fit in ``memory_cap`` bytes; None if none.

    ``m`` divides ``batch`` and is a multiple of ``p``; ``v`` divides ``layers_per_stage``;
    one sample's activations on one stage take ``sample_bytes``.
    """
    for m in range(p, batch + 1, p):
        if batch % m:
            continue
        for v in range(1, layers_per_stage + 1):
            if layers_per_stage % v:
                continue
            memory = micro_batches_held(p, v) * (batch // m) * sample_bytes
            if interleaved_bubble(p, m, v) <= bubble_target and memory <= memory_cap:
                return m, v
    return None
