"""Reference answers of lab 07 (ZeRO and FSDP2); the checks import them while they run.

Not imported by the lab or the lesson: the lab asks the learner to write these. Every
parameter is sharded the way :mod:`.checks` describes (``my_shard``): flattened, padded
with zeros to a multiple of the world size, rank r holding chunk r.
"""

import functools
import math

import torch
import torch.distributed as dist
import torch.nn.functional as F

from workbook.lesson07_zero_fsdp.lab import my_shard, shard_size


def _gather(shard, numel):
    """The whole flattened tensor (``numel`` elements) from every rank's ``shard``."""
    full = torch.empty(shard.numel() * dist.get_world_size(), dtype=shard.dtype)
    dist.all_gather_single(full, shard)
    return full[:numel]


def _reduce_scatter_mean(full):
    """This rank's chunk of the mean over ranks of ``full`` (any shape)."""
    p = dist.get_world_size()
    flat = full.reshape(-1)
    flat = F.pad(flat, (0, shard_size(flat.numel(), p) * p - flat.numel()))
    out = torch.empty(flat.numel() // p, dtype=flat.dtype)
    dist.reduce_scatter_single(out, flat)
    return out.div_(p)


class ZeRO1Adam:
    """Adam (torch's defaults) whose state is sharded: each rank keeps ``exp_avg`` and
    ``exp_avg_sq`` of its chunk of every parameter, updates that chunk from the (already
    averaged) ``p.grad``, and all-gathers the parameter."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        self.params = list(params)
        self.lr, self.betas, self.eps = lr, betas, eps
        self.t = 0
        p = dist.get_world_size()
        self.exp_avg = [torch.zeros(shard_size(q.numel(), p), dtype=q.dtype)
                        for q in self.params]
        self.exp_avg_sq = [torch.zeros_like(m) for m in self.exp_avg]

    @torch.no_grad()
    def step(self):
        """One Adam step of this rank's chunks, then every parameter all-gathered."""
        self.t += 1
        for i, q in enumerate(self.params):
            self.update_chunk(i, q, my_shard(q.grad))

    def update_chunk(self, i, q, grad):
        b1, b2 = self.betas
        m, v = self.exp_avg[i], self.exp_avg_sq[i]
        m.lerp_(grad, 1 - b1)
        v.mul_(b2).addcmul_(grad, grad, value=1 - b2)
        denom = (v.sqrt() / math.sqrt(1 - b2 ** self.t)).add_(self.eps)
        chunk = my_shard(q)
        chunk.addcdiv_(m, denom, value=-self.lr / (1 - b1 ** self.t))
        q.data.copy_(_gather(chunk, q.numel()).view_as(q))


class ZeRO2Adam(ZeRO1Adam):
    """:class:`ZeRO1Adam` that also shards gradients: as soon as a parameter's gradient is
    accumulated, it is reduce-scattered (mean over ranks) and the whole one is dropped."""

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, lr, betas, eps)
        self.grads = [None] * len(self.params)
        for i, q in enumerate(self.params):
            q.register_post_accumulate_grad_hook(functools.partial(self._reduce, i))

    def _reduce(self, i, q):
        shard = _reduce_scatter_mean(q.grad)
        self.grads[i] = shard if self.grads[i] is None else self.grads[i] + shard
        q.grad = None

    @torch.no_grad()
    def step(self):
        """One Adam step from the gradient shards, which are then dropped."""
        self.t += 1
        for i, q in enumerate(self.params):
            self.update_chunk(i, q, self.grads[i])
            self.grads[i] = None


class ZeRO3Linear(torch.autograd.Function):
    """``y = x Wᵀ + b`` from the shards of W and b: all-gathered on use (forward, and again
    in backward), freed after; the gradients of the shards are reduce-scattered."""

    @staticmethod
    def forward(ctx, x, weight_shard, bias_shard, out_features, in_features):
        ctx.save_for_backward(x, weight_shard)
        ctx.shape = (out_features, in_features)
        weight = _gather(weight_shard, out_features * in_features).view(ctx.shape)
        return F.linear(x, weight, _gather(bias_shard, out_features))

    @staticmethod
    def backward(ctx, grad_y):
        x, weight_shard = ctx.saved_tensors
        weight = _gather(weight_shard, math.prod(ctx.shape))
        grad_x = grad_y @ weight.view(ctx.shape)
        del weight
        grad_y2, x2 = grad_y.reshape(-1, grad_y.shape[-1]), x.reshape(-1, x.shape[-1])
        return (grad_x, _reduce_scatter_mean(grad_y2.T @ x2),
                _reduce_scatter_mean(grad_y2.sum(0)), None, None)


# Bytes per parameter FSDP2 / DDP keep on a device at the peak of a step with Adam in
# float32 (measured on the simulator; ``tests/test_lesson07_checks.py`` holds the
# measurement to them): per parameter of the model (Ψ), per parameter sharded (Ψ/N) and
# per parameter of one block (the largest unit FSDP2 gathers).
_BYTES = {  # (stage, reshard_after_forward, offload): (per Ψ, per Ψ/N, per block's Ψ)
    (3, False, False): (4, 16, 4),     # whole parameters from forward to backward
    (1, False, False): (12, 8, 6),     # DDP's gradient buckets, Adam's state sharded
    (0, False, False): (20, 0, 6),
    (3, True, False): (0, 16, 14),     # two blocks gathered (prefetch) and one's gradient
    (3, False, True): (4, 0, 8),       # shards, gradients and Adam on the host
    (3, True, True): (0, 0, 16),
}


def fit_settings(psi, blocks, world_size, gpu_memory, host_memory):
    """The fastest settings whose memory fits: the candidates in the order of their
    measured step time, each taken if its estimated peak (with 5 % to spare) fits the
    device, and what offload keeps on the host (16Ψ/N) fits the host share."""
    for (stage, reshard, offload), (a, b, c) in _BYTES.items():
        peak = a * psi + b * psi / world_size + c * psi / blocks
        if peak * 1.05 > gpu_memory or (offload and 16 * psi / world_size > host_memory):
            continue
        return {"stage": stage, "reshard_after_forward": reshard, "offload": offload}
    return None


def zero_memory_gb(psi, n_d, stage, k=12):
    """GB of model states per GPU: (2 + 2 + K)Ψ bytes of fp16 parameters, fp16 gradients
    and K bytes of optimizer state per parameter, the first ``stage`` of (optimizer state,
    gradients, parameters) divided among ``n_d`` GPUs (Rajbhandari et al. 2020)."""
    parameters, gradients, states = 2 * psi, 2 * psi, k * psi
    if stage >= 1:
        states /= n_d
    if stage >= 2:
        gradients /= n_d
    if stage >= 3:
        parameters /= n_d
    return (parameters + gradients + states) / 1e9
