"""Reference answers of lab 06 (tensor and sequence parallelism); the checks import them
while they run.

Not imported by the lab or the lesson: the lab asks the learner to write these.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F


class CopyToTP(torch.autograd.Function):
    """Megatron's f: the identity in forward; in backward, the sum over the ranks of the
    input's gradient (each rank's column shard contributed one part of it)."""

    @staticmethod
    def forward(ctx, x):
        return x

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()   # grad may be shared with the caller: sum into a copy
        dist.all_reduce(grad)
        return grad


class ReduceFromTP(torch.autograd.Function):
    """Megatron's g: the sum over the ranks in forward (each rank holds a partial sum);
    the identity in backward."""

    @staticmethod
    def forward(ctx, x):
        x = x.clone()         # the caller keeps its partial sum
        dist.all_reduce(x)
        return x

    @staticmethod
    def backward(ctx, grad):
        return grad


class ColumnParallelLinear(nn.Module):
    """Rank r's rows of a linear layer's weight: ``f(x) @ W_r.T + b_r``, this rank's
    slice of the output features."""

    def __init__(self, weight, bias):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)

    def forward(self, x):
        return F.linear(CopyToTP.apply(x), self.weight, self.bias)


class RowParallelLinear(nn.Module):
    """Rank r's columns of a linear layer's weight: ``g(x_r @ W_r.T) + b``, the whole
    output from this rank's slice of the input features; the bias once, after the sum."""

    def __init__(self, weight, bias):
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias)

    def forward(self, x):
        return ReduceFromTP.apply(F.linear(x, self.weight)) + self.bias


def _shard(n, rank, world_size):
    size = n // world_size
    return slice(rank * size, (rank + 1) * size)


def column_parallel_linear(full_linear, rank, world_size):
    """Rank ``rank``'s column-parallel shard of ``full_linear``: its rows of the weight and
    of the bias, copied (the rank keeps 1/t of the layer, not a view of all of it)."""
    rows = _shard(full_linear.out_features, rank, world_size)
    return ColumnParallelLinear(full_linear.weight.detach()[rows].clone(),
                                full_linear.bias.detach()[rows].clone())


def row_parallel_linear(full_linear, rank, world_size):
    """Rank ``rank``'s row-parallel shard of ``full_linear``: its columns of the weight,
    and the whole bias (added once, after the all-reduce)."""
    cols = _shard(full_linear.in_features, rank, world_size)
    return RowParallelLinear(full_linear.weight.detach()[:, cols].clone(),
                             full_linear.bias.detach().clone())


class MegatronMLP(nn.Module):
    """The Megatron MLP: column-parallel, GeLU, row-parallel. One all-reduce in forward
    (g, after ``fc2``), one in backward (f, before ``fc1``)."""

    def __init__(self, full_mlp, rank, world_size):
        super().__init__()
        self.fc1 = column_parallel_linear(full_mlp[0], rank, world_size)
        self.fc2 = row_parallel_linear(full_mlp[2], rank, world_size)

    def forward(self, x):
        return self.fc2(F.gelu(self.fc1(x)))


class GatherFromSequence(torch.autograd.Function):
    """Sequence parallelism's g: all-gather the sequence shards along dim 0 in forward;
    reduce-scatter the gradient back to this rank's shard in backward."""

    @staticmethod
    def forward(ctx, x):
        t = dist.get_world_size()
        out = x.new_empty((t * x.shape[0], *x.shape[1:]))
        dist.all_gather_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        t = dist.get_world_size()
        out = grad.new_empty((grad.shape[0] // t, *grad.shape[1:]))
        dist.reduce_scatter_single(out, grad.contiguous())
        return out


class ScatterToSequence(torch.autograd.Function):
    """Sequence parallelism's ḡ: reduce-scatter along dim 0 in forward (the sum of the
    partial outputs, this rank's shard of the sequence); all-gather in backward."""

    @staticmethod
    def forward(ctx, x):
        t = dist.get_world_size()
        out = x.new_empty((x.shape[0] // t, *x.shape[1:]))
        dist.reduce_scatter_single(out, x.contiguous())
        return out

    @staticmethod
    def backward(ctx, grad):
        t = dist.get_world_size()
        out = grad.new_empty((t * grad.shape[0], *grad.shape[1:]))
        dist.all_gather_single(out, grad.contiguous())
        return out


class SequenceParallelBlock(nn.Module):
    """``x + MLP(LayerNorm(x))`` on this rank's shard of the sequence (dim 0): LayerNorm
    and the residual on s/t positions, the MLP tensor-parallel on the whole sequence."""

    def __init__(self, full_block, rank, world_size):
        super().__init__()
        self.norm = nn.LayerNorm(full_block.norm.normalized_shape)
        self.norm.load_state_dict(full_block.norm.state_dict())
        self.fc1 = column_parallel_linear(full_block.mlp[0], rank, world_size)
        self.fc2 = row_parallel_linear(full_block.mlp[2], rank, world_size)

    def forward(self, x):
        h = GatherFromSequence.apply(self.norm(x))
        h = F.gelu(F.linear(h, self.fc1.weight, self.fc1.bias))
        h = ScatterToSequence.apply(F.linear(h, self.fc2.weight))
        return x + h + self.fc2.bias
