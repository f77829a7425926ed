"""The models and the optimizer that several lessons train, shared so that no lesson
package imports another:

* :func:`mlp`: ``depth`` × (``Linear(width, width)`` + ReLU), the workhorse of lessons
  03, 04, 05 and 10;
* :class:`TinyMLP` and :func:`chunk_bounds`: lesson 02's small regression problem with a
  flat parameter vector, and how a flat vector is cut into near-equal chunks (lesson 02's
  ring all-reduce, lesson 10's parameter-server shards);
* :class:`Block` (:class:`Attention` + :class:`MLP`), its tensor-parallel plan
  :func:`tp_plan` and Korthikanti et al.'s :func:`activation_bytes`: lesson 06's GPT
  layer, which lessons 08 and 09 build their models from;
* :class:`MixedPrecisionAdam`: Adam with fp32 master weights (lessons 07 and 09);
* :func:`first_optimizer_step`: the warm-up step that creates an optimizer's state
  without a forward (lessons 03 and 08 measure the step after it).
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel)


def mlp(width=256, depth=16, seed=0):
    """``depth`` × (``Linear(width, width)`` + ReLU), initialised from ``seed``.

    Every layer has a ``width × width`` weight and a ``width`` bias: ``2 * depth``
    gradients of two sizes, the simplest model on which to count buckets.
    """
    torch.manual_seed(seed)
    layers = []
    for _ in range(depth):
        layers += [nn.Linear(width, width), nn.ReLU()]
    return nn.Sequential(*layers)


def chunk_bounds(n, parts):
    """``[(start, stop), ...]``: ``n`` elements cut into ``parts`` nearly equal chunks.

    The first ``n % parts`` chunks get one element more; with ``n < parts`` some are empty.
    """
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


class TinyMLP:
    """A two-layer MLP on a synthetic classification data set; parameters are one flat
    vector, so every aggregation method moves a single tensor.

    Everything is generated from ``seed``: the data, the initial parameters, and which
    samples each worker gets at each step.
    """

    def __init__(self, features=32, hidden=64, classes=8, samples=4096, seed=0):
        g = torch.Generator().manual_seed(seed)
        centers = 0.5 * torch.randn(classes, features, generator=g)
        self.y = torch.randint(0, classes, (samples,), generator=g)
        self.x = centers[self.y] + torch.randn(samples, features, generator=g)
        self.shapes = [(hidden, features), (hidden,), (classes, hidden), (classes,)]
        self.num_params = sum(math.prod(s) for s in self.shapes)
        self.samples, self.seed = samples, seed
        self._order = torch.randperm(samples, generator=g)

    def init_params(self):
        """The same initial parameters on every rank, every time."""
        g = torch.Generator().manual_seed(self.seed + 1)
        parts = []
        for shape in self.shapes:
            fan_in = shape[1] if len(shape) == 2 else shape[0]
            parts.append((torch.rand(shape, generator=g) * 2 - 1).view(-1) / math.sqrt(fan_in))
        return torch.cat(parts)

    def _forward(self, w, x):
        sizes = [math.prod(s) for s in self.shapes]
        w1, b1, w2, b2 = (t.view(s) for t, s in zip(torch.split(w, sizes), self.shapes))
        return torch.relu(x @ w1.T + b1) @ w2.T + b2

    def loss_and_grad(self, w, x, y):
        """``(loss, gradient)`` of the cross-entropy on the batch ``(x, y)`` at ``w``."""
        w = w.detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(self._forward(w, x), y)
        (grad,) = torch.autograd.grad(loss, w)
        return loss.item(), grad

    def grad(self, w, x, y):
        """Just the gradient (a ``grad_fn`` for local SGD)."""
        return self.loss_and_grad(w, x, y)[1]

    def loss(self, w):
        """Cross-entropy on the whole data set (run it outside the cluster)."""
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(self._forward(w, self.x), self.y).item()

    def batch(self, step, worker, workers, size):
        """Worker ``worker``'s mini-batch at ``step``: disjoint across workers and steps
        until the data set wraps around."""
        start = ((step * workers + worker) * size) % self.samples
        idx = self._order[torch.arange(start, start + size) % self.samples]
        return self.x[idx], self.y[idx]


class Attention(nn.Module):
    """Multi-head self-attention with an explicit softmax (no fused kernel), so that the
    ``a·s²`` score and probability tensors exist, as Korthikanti et al. count them.

    The number of heads is read from the projections' output width (``-1`` in the view):
    when ``wq``/``wk``/``wv`` are split by columns across ``t`` ranks, each rank runs
    ``heads / t`` whole heads and the code does not change.
    """

    def __init__(self, hidden, heads, dropout=0.0, dtype=None):
        super().__init__()
        self.head_dim, self.dropout = hidden // heads, dropout
        self.wq, self.wk, self.wv, self.wo = (nn.Linear(hidden, hidden, dtype=dtype)
                                              for _ in range(4))

    def forward(self, x):
        b, s = x.shape[0], x.shape[1]
        q, k, v = (w(x).view(b, s, -1, self.head_dim).transpose(1, 2)
                   for w in (self.wq, self.wk, self.wv))
        return self.wo(self.core(q, k, v).transpose(1, 2).reshape(b, s, -1))

    def core(self, q, k, v):
        """The "core attention" between the projections: ``dropout(softmax(q·kᵀ/√d))·v``,
        per head. Its ``a·s²`` tensors are what selective recomputation (Korthikanti et
        al. 2022) recomputes instead of keeping."""
        scores = q @ k.transpose(-2, -1) / math.sqrt(self.head_dim)
        probs = F.dropout(torch.softmax(scores, dim=-1), self.dropout, self.training)
        return probs @ v


class MLP(nn.Module):
    """``up`` (hidden → 4·hidden), GeLU, ``down`` (4·hidden → hidden)."""

    def __init__(self, hidden, dtype=None):
        super().__init__()
        self.up = nn.Linear(hidden, 4 * hidden, dtype=dtype)
        self.down = nn.Linear(4 * hidden, hidden, dtype=dtype)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    """One pre-LayerNorm transformer layer: ``x + drop(attn(ln1(x)))``, then
    ``x + drop(mlp(ln2(x)))``. Its parameters come from ``seed``."""

    def __init__(self, hidden=64, heads=8, dropout=0.0, seed=0, dtype=None):
        super().__init__()
        torch.manual_seed(seed)
        self.dropout = dropout
        self.ln1, self.ln2 = nn.LayerNorm(hidden, dtype=dtype), nn.LayerNorm(hidden, dtype=dtype)
        self.attn = Attention(hidden, heads, dropout, dtype)
        self.mlp = MLP(hidden, dtype)

    def forward(self, x):
        x = x + F.dropout(self.attn(self.ln1(x)), self.dropout, self.training)
        return x + F.dropout(self.mlp(self.ln2(x)), self.dropout, self.training)


def tp_plan(sequence_parallel=False, prepare_inputs=True):
    """The ``parallelize_module`` plan of :class:`Block` on a 1-D mesh.

    Tensor parallel (Megatron): ``wq``, ``wk``, ``wv`` and ``up`` by columns, ``wo`` and
    ``down`` by rows; the LayerNorms and dropouts run replicated on every rank.

    ``prepare_inputs`` makes the attention's and the MLP's input one replicated DTensor
    (``PrepareModuleInput``) that ``wq``, ``wk`` and ``wv`` all read: in the backward their
    three partial input gradients are added up first and all-reduced once. Without it
    each projection turns its own input into a DTensor and all-reduces its own gradient.

    With ``sequence_parallel`` the LayerNorms (and what runs between the blocks) work on
    ``seq / t`` positions each (``SequenceParallel``); the attention and MLP inputs are
    all-gathered along the sequence and the row-parallel outputs reduce-scattered back
    to it (``output_layouts=Shard(1)``). This is the plan torchtitan uses for its layers.
    """
    plan = {"attn.wq": ColwiseParallel(), "attn.wk": ColwiseParallel(),
            "attn.wv": ColwiseParallel(), "attn.wo": RowwiseParallel(),
            "mlp.up": ColwiseParallel(), "mlp.down": RowwiseParallel()}
    if sequence_parallel:
        gather = {"input_layouts": (Shard(1),), "desired_input_layouts": (Replicate(),)}
        plan.update({"ln1": SequenceParallel(), "ln2": SequenceParallel(),
                     "attn": PrepareModuleInput(**gather), "mlp": PrepareModuleInput(**gather),
                     "attn.wo": RowwiseParallel(output_layouts=Shard(1)),
                     "mlp.down": RowwiseParallel(output_layouts=Shard(1))})
    elif prepare_inputs:
        once = {"input_layouts": (Replicate(),), "desired_input_layouts": (Replicate(),)}
        plan.update({"attn": PrepareModuleInput(**once), "mlp": PrepareModuleInput(**once)})
    return plan


def activation_bytes(s, b, h, a, t=1, sequence_parallel=False):
    """Bytes of activations one transformer layer keeps for the backward, 16-bit
    activations (Korthikanti et al. 2022; docs/reference-numbers.md, "Activation memory"):
    sbh(10 + 24/t + 5as/(ht)) with tensor parallelism, sbh(34/t + 5as/(ht)) with
    sequence parallelism too (t = 1: sbh(34 + 5as/h))."""
    attention_scores = 5 * a * s / (h * t)
    if sequence_parallel:
        return s * b * h * (34 / t + attention_scores)
    return s * b * h * (10 + 24 / t + attention_scores)


class MixedPrecisionAdam(torch.optim.Optimizer):
    """Adam for a bf16 model with fp32 master weights (Micikevicius et al. 2018).

    Per parameter the state is ``master`` (an fp32 copy of the weight), ``exp_avg`` and
    ``exp_avg_sq`` (fp32): K = 12 bytes, all allocated inside ``step()``, so the
    simulator counts them as optimizer state. A step reads the bf16 gradient in fp32,
    updates the master weight and copies it back (rounded) into the bf16 parameter. Works
    on plain tensors and on FSDP2's sharded DTensors alike.
    """

    def __init__(self, params, lr=1e-3, betas=(0.9, 0.999), eps=1e-8):
        super().__init__(params, {"lr": lr, "betas": betas, "eps": eps})

    @torch.no_grad()
    def step(self, closure=None):
        """One Adam step on the fp32 master weights; the bf16 parameters follow."""
        for group in self.param_groups:
            beta1, beta2 = group["betas"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    # allocated, then filled: a cast of the parameter would be counted
                    # as a (low-precision) copy of the parameter, not as optimizer state
                    state["master"] = torch.empty_like(p, dtype=torch.float32)
                    state["master"].copy_(p.detach())
                    state["exp_avg"] = torch.zeros_like(state["master"])
                    state["exp_avg_sq"] = torch.zeros_like(state["master"])
                state["step"] += 1
                t, grad = state["step"], p.grad.float()
                state["exp_avg"].lerp_(grad, 1 - beta1)
                state["exp_avg_sq"].mul_(beta2).addcmul_(grad, grad, value=1 - beta2)
                denom = (state["exp_avg_sq"] / (1 - beta2 ** t)).sqrt_().add_(group["eps"])
                state["master"].addcdiv_(state["exp_avg"], denom,
                                         value=-group["lr"] / (1 - beta1 ** t))
                p.copy_(state["master"])


def first_optimizer_step(model, optimizer):
    """Create ``optimizer``'s state (and every parameter's ``.grad``) as a first training
    step would, without running the model: the backward of the parameters' sum gives each
    parameter a gradient of its own shape and dtype, accumulated into ``.grad`` by
    autograd as a real backward does, then ``optimizer.step()`` allocates the state.

    What a measured step that follows sees is the same as after a real first step
    (parameters, ``.grad`` tensors, optimizer state: same tensors, same bytes, same
    categories), at a fraction of the simulation's cost; only the values differ, so use
    it on fake tensors, or where the values don't matter.
    """
    sum(p.sum() for p in model.parameters() if p.requires_grad).backward()
    optimizer.step()
