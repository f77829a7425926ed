"""Memory and precision, measured: what lesson 08 imports.

The lab asks you to predict bytes per parameter, write a loss scaler, choose which
blocks to checkpoint and make a model fit, so none of those answers is here. What is
here is what the lesson measures with torch's own APIs on the simulated cluster:

* the model: :class:`GPT`, a stack of :class:`workbook.models.Block` layers (the
  GPT-style layer Korthikanti et al. 2022 count) on a ``batch × seq × hidden`` input,
  with torch's activation checkpointing applied per block (``checkpoint``), to the core
  attention only (``selective``) or in ``segments`` (``checkpoint_sequential``);
* :func:`chain_step`, a chain of equal ``Linear`` + ReLU layers, where √L checkpoints
  are the best placement (a transformer block is not such a layer);
* :func:`train_steps`, what the rank runs: a few Adam steps of the model in fp32, TF32 or
  bf16 autocast, with gradient accumulation, on fake tensors (shapes only) by default;
  :func:`measure` runs it on a cluster and returns a :class:`StepReport`: simulated time
  of one optimizer step, memory by category at its peak, activations held after the
  forward;
* number formats: :func:`format_table` (range and precision of fp32, TF32, bf16, fp16)
  and :func:`fp16_training`, a small real-tensor model trained under fp16 autocast with
  and without ``torch.amp.GradScaler``, counting zero gradients and skipped steps;
* the published formulas (docs/reference-numbers.md, "Memory and precision" and
  "Activation memory"): :func:`korthikanti_bytes`, the activation bytes of one layer with
  no, selective or full recomputation.
"""

import contextlib
import math
from dataclasses import dataclass, field, replace

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.utils.checkpoint import checkpoint, checkpoint_sequential

import simcluster as sc
from simcluster.spec import preset
from workbook.formulas import korthikanti_bytes  # noqa: F401 (shared with lesson 13's drills)
from workbook.models import Block, activation_bytes

GiB = 2**30
CATEGORIES = ("parameters", "gradients", "optimizer state", "activations", "other")

#: How each precision recipe is spelled in torch (what :func:`train_steps` does).
PRECISIONS = {
    "fp32": "fp32 parameters and math (torch's default, float32 matmul precision 'highest')",
    "tf32": "fp32, matmuls in TF32: torch.set_float32_matmul_precision('high')",
    "bf16": "fp32 parameters, torch.autocast(dtype=torch.bfloat16) forward",
}

# ------------------------------------------------------------------------- the model


class GPT(nn.Module):
    """``layers`` GPT-style :class:`~workbook.models.Block` layers and a final
    LayerNorm on a ``batch × seq × hidden`` input (the token embedding and the LM head are
    left out: the layers are what activation memory and recomputation are about).

    Activation checkpointing, all with ``use_reentrant=False`` (torch's advice):

    * ``checkpoint``: indices of the blocks to run under
      :func:`torch.utils.checkpoint.checkpoint` (keep the block's input, recompute the
      rest in the backward), or ``"all"``;
    * ``selective``: checkpoint only each block's core attention (softmax(q·kᵀ)·v and its
      dropout, :meth:`~workbook.models.Attention.core`), Korthikanti et al.'s
      selective recomputation;
    * ``segments``: :func:`torch.utils.checkpoint.checkpoint_sequential` with that many
      segments (every segment but the last is checkpointed; keeps one input per segment).
    """

    def __init__(self, layers=12, hidden=1024, heads=16, dropout=0.1, dtype=None, seed=0,
                 checkpoint=(), selective=False, segments=None):
        super().__init__()
        self.blocks = nn.Sequential(*(Block(hidden, heads, dropout, seed + i, dtype)
                                      for i in range(layers)))
        self.norm = nn.LayerNorm(hidden, dtype=dtype)
        self.checkpointed = set(range(layers)) if checkpoint == "all" else set(checkpoint)
        self.segments = segments
        if selective:
            for block in self.blocks:
                # an instance attribute shadows the method: the block's forward calls this
                block.attn.core = _recomputed(block.attn.core)

    def forward(self, x):
        """Blocks (checkpointed as configured), then the final LayerNorm."""
        if self.segments:
            x = checkpoint_sequential(self.blocks, self.segments, x, use_reentrant=False)
        else:
            for i, block in enumerate(self.blocks):
                if i in self.checkpointed:
                    x = checkpoint(block, x, use_reentrant=False)
                else:
                    x = block(x)
        return self.norm(x)


def _recomputed(fn):
    """``fn`` under activation checkpointing: keep its inputs, recompute it in backward."""
    def run(*args):
        return checkpoint(fn, *args, use_reentrant=False)
    return run


def chain_step(layers=16, width=1024, tokens=8192, segments=None):
    """What the rank runs: one forward and backward, on fake tensors, of a chain of
    ``layers`` equal layers, ``Linear(width, width)`` + ReLU, the case Chen et al. (2016)
    analyse: each layer keeps one ``tokens × width`` tensor (its ReLU's output, which is
    also the next layer's input). ``segments``: run it under ``checkpoint_sequential``.
    Read the activation peak with ``run.category_peaks(0)["activations"]``."""
    with sc.fake_tensors():
        torch.manual_seed(0)
        chain = nn.Sequential(*(module for _ in range(layers)
                                for module in (nn.Linear(width, width), nn.ReLU())))
        x = torch.randn(tokens, width)
        if segments:
            out = checkpoint_sequential(chain, segments, x, use_reentrant=False)
        else:
            out = chain(x)
        out.square().mean().backward()


def parameter_count(layers, hidden):
    """Parameters of :class:`GPT`: per layer 12h² + 13h (four h×h projections, the MLP's
    h×4h and 4h×h, their biases, two LayerNorms), plus the final LayerNorm's 2h."""
    return layers * (12 * hidden**2 + 13 * hidden) + 2 * hidden


# ---------------------------------------------------------------- one step, measured


def train_steps(layers=12, hidden=1024, heads=16, seq=1024, batch=8, precision="fp32",
                micro_batches=1, steps=2, fake=True, dropout=0.1, seed=0, full_warmup=False,
                **checkpointing):
    """What the rank runs: ``steps`` Adam steps of :class:`GPT` (``checkpointing``: its
    ``checkpoint``, ``selective`` or ``segments``) in ``precision`` (a key of
    :data:`PRECISIONS`), each step on ``batch`` sequences split into ``micro_batches``
    (gradient accumulation: each micro-batch's loss is divided by their number).

    The loss is the mean square of the output (a stand-in for the LM head's
    cross-entropy). Warm-up steps (all but the last) only create Adam's state: with
    :func:`first_optimizer_step` (no forward: the last step sees the
    same parameters, Adam state and memory, and the simulation is quicker),
    or with ``full_warmup`` as a real step of one micro-batch (to see it in the memory
    plot). A barrier marks the start of the last step, where the peak is reset.
    Returns ``{"held": bytes by category the last micro-batch's forward added (what it
    keeps for the backward), "state": bytes by category after the last optimizer step,
    "loss": the last loss (None on fake tensors)}``.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {', '.join(PRECISIONS)}, not {precision!r}")
    if batch % micro_batches:
        raise ValueError(f"batch={batch} is not a multiple of micro_batches={micro_batches}")
    if precision == "tf32":
        torch.set_float32_matmul_precision("high")      # this rank's fp32 matmuls in TF32
    autocast = (torch.autocast("cpu", dtype=torch.bfloat16) if precision == "bf16"
                else contextlib.nullcontext())
    generator = torch.Generator().manual_seed(seed + 1)
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        model = GPT(layers, hidden, heads, dropout, seed=seed, **checkpointing)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
        for step in range(steps):
            last = step == steps - 1
            if last:
                dist.barrier()                     # the measured step starts here
                sc.reset_peak_memory()
            elif not full_warmup:
                # the warm-up steps only have to create Adam's state: no forward needed
                first_optimizer_step(model, optimizer)
                continue
            # a full warm-up step runs one micro-batch: it too only creates Adam's state
            for _ in range(micro_batches if last else 1):
                x = torch.randn(batch // micro_batches, seq, hidden,
                                generator=None if fake else generator)
                loss = None              # a previous loss is not what this forward keeps
                before = sc.memory_in_use()
                with autocast:
                    loss = model(x).float().square().mean() / micro_batches
                after = sc.memory_in_use()
                loss.backward()
            optimizer.step()
            state = sc.memory_in_use()
            optimizer.zero_grad()
    held = {k: after.get(k, 0) - before.get(k, 0) for k in after}
    return {"held": held, "state": state, "loss": None if fake else loss.item()}


def first_optimizer_step(model, optimizer):
    """Create ``optimizer``'s state as a first training step would, without running the
    model: the backward of the parameters' sum gives each parameter a gradient of its own
    shape and dtype, ``optimizer.step()`` allocates the state from them, and
    ``optimizer.zero_grad()`` frees the gradients again.

    A measured step that follows finds the same parameters and optimizer state (same
    tensors, bytes and categories) as after a real first step that ends with
    ``zero_grad()``, at a fraction of the simulation's cost; only the values differ, so
    use it on fake tensors or where the values don't matter. (Gradients it kept would not
    be: the simulator files a gradient under "gradients" through a hook that a module's
    first forward installs, so here they would count as "other".)
    """
    sum(p.sum() for p in model.parameters() if p.requires_grad).backward()
    optimizer.step()
    optimizer.zero_grad()


@dataclass
class StepReport:
    """The last optimizer step of :func:`train_steps` on rank 0.

    Attributes:
        seconds: simulated time of the step (from the barrier before it to the end).
        peak: bytes by category at the step's peak, and ``"total"``.
        held: bytes by category that one micro-batch's forward keeps for its backward.
        state: bytes by category after the optimizer step (what persists).
        psi: the model's parameters.
        kwargs: what :func:`train_steps` ran with.
        oom: the :class:`simcluster.OutOfMemoryError` if the step did not fit, else None.
        run: the :class:`~simcluster.Run` (None if the step did not fit).
    """

    seconds: float
    peak: dict
    held: dict
    state: dict
    psi: int
    kwargs: dict = field(default_factory=dict)
    oom: Exception = None
    run: object = None

    @property
    def peak_gib(self):
        """Peak memory in GiB."""
        return self.peak["total"] / GiB

    @property
    def activations(self):
        """Activation bytes one micro-batch's forward keeps (all layers)."""
        return self.held.get("activations", 0)


def measure(cluster, **kwargs):
    """Run :func:`train_steps` (``kwargs``) on rank 0 of ``cluster``; return its
    :class:`StepReport`. A step that runs out of memory is returned too, with ``oom``
    set and the memory in use when it failed as ``peak``."""
    psi = parameter_count(kwargs.get("layers", 12), kwargs.get("hidden", 1024))
    try:
        run = cluster.run(train_steps, world_size=1, kwargs=kwargs)
    except sc.OutOfMemoryError as oom:
        peak = dict(oom.in_use, total=sum(oom.in_use.values()))
        return StepReport(math.nan, peak, {}, {}, psi, kwargs, oom)
    start = [c for c in run.collectives if c.op == "barrier"][-1].end
    result = run.results[0]
    return StepReport(run.elapsed - start, run.peak_memory(0), result["held"],
                      result["state"], psi, kwargs, run=run)


def a100(memory_gib=80):
    """One simulated A100 (the ``dgx-a100`` preset's device: its FLOP/s and HBM
    bandwidth) with ``memory_gib`` GiB of memory: a larger one measures what a step
    *would* need on an 80 GiB A100 where it runs out of memory."""
    spec = preset("dgx-a100")
    device = replace(spec.nodes[0].device, name=f"A100-{memory_gib}GiB",
                     memory=int(memory_gib * GiB))
    node = replace(spec.nodes[0], devices=1, nics=1, device=device)
    return sc.Cluster(replace(spec, name=f"one A100 ({memory_gib} GiB)", nodes=(node,)))


# ----------------------------------------------------------------- number formats

#: Bits of exponent and of mantissa (stored fraction) of each format.
FORMATS = {"fp32": (8, 23), "tf32": (8, 10), "bf16": (8, 7), "fp16": (5, 10),
           "fp8 e4m3": (4, 3), "fp8 e5m2": (5, 2)}
_DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16,
           "fp8 e4m3": torch.float8_e4m3fn, "fp8 e5m2": torch.float8_e5m2}


def format_table():
    """One row per format of :data:`FORMATS`: ``(name, exponent bits, mantissa bits, max,
    smallest normal, smallest subnormal, eps)``, from ``torch.finfo`` (TF32 is not a
    storage dtype: a matmul mode with fp32's exponent and fp16's mantissa, computed)."""
    rows = []
    for name, (exponent, mantissa) in FORMATS.items():
        if name in _DTYPES:
            info = torch.finfo(_DTYPES[name])
            biggest, normal, eps = info.max, info.smallest_normal, info.eps
        else:
            fp32 = torch.finfo(torch.float32)
            biggest, normal, eps = fp32.max, fp32.smallest_normal, 2.0**-mantissa
        rows.append((name, exponent, mantissa, biggest, normal, normal * eps, eps))
    return rows


def _lm_head(vocab, hidden, tokens, logit_std, seed):
    """A two-layer stand-in for a language model's last layers, ``Linear``, ``Tanh``, then
    the LM head ``Linear(hidden, vocab)``, and ``tokens`` inputs and target tokens.

    The head's weights are scaled so that the logits' standard deviation is
    ``logit_std``: a trained model is confident, most tokens' probabilities far below
    1/vocab (a freshly initialised head has logits near 0, every probability ≈ 1/vocab).
    """
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(hidden, hidden), nn.Tanh(), nn.Linear(hidden, vocab))
    g = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(tokens, hidden, generator=g)
    y = torch.randint(0, vocab, (tokens,), generator=g)
    with torch.no_grad():
        model[2].weight.mul_(logit_std / model(x).std())
    return model, x, y


def logit_gradients(vocab=4096, hidden=16, tokens=1024, scale=None, half=True, logit_std=4.0,
                    seed=0):
    """What the rank runs: one forward and backward of a small LM head on real tensors,
    the logits in fp16 under ``torch.autocast`` (``half``) or fp32, the cross-entropy (a
    mean over ``tokens``) in fp32, the loss multiplied by ``scale`` before the backward
    (what ``GradScaler.scale`` does). Returns ``{"logits": the gradient that reached the
    logits, "head": the LM head's weight gradient}``, both in fp32 and divided by
    ``scale`` again (what ``GradScaler.unscale_`` does), and ``"targets"``, the target
    tokens."""
    model, x, y = _lm_head(vocab, hidden, tokens, logit_std, seed)
    seen = {}
    with torch.autocast("cpu", dtype=torch.float16, enabled=half):
        logits = model(x)

    def keep(grad):             # a hook that returns None leaves the gradient as it is
        seen["logits"] = grad.detach().float()
    logits.register_hook(keep)
    loss = nn.functional.cross_entropy(logits.float(), y)
    (loss * (scale or 1.0)).backward()
    unscale = 1.0 / (scale or 1.0)
    return {"logits": seen["logits"] * unscale, "head": model[2].weight.grad * unscale,
            "targets": y}


def scaled_training(steps=24, init_scale=2.0**32, growth_interval=4, vocab=1024, hidden=16,
                    tokens=256, logit_std=4.0, seed=0):
    """What the rank runs: ``steps`` SGD steps of the small LM head of
    :func:`logit_gradients` (on one batch) under fp16 autocast with ``torch.amp.GradScaler``.

    Returns one ``(scale used, skipped, loss)`` per step; a step is skipped when the
    scaled gradients overflowed fp16 (inf or nan): ``scaler.step`` does not update the
    parameters and ``scaler.update`` halves the scale. ``growth_interval`` good steps in
    a row double it.
    """
    model, x, y = _lm_head(vocab, hidden, tokens, logit_std, seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.2)
    scaler = torch.amp.GradScaler("cpu", init_scale=init_scale, growth_interval=growth_interval)
    log = []
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.float16):
            logits = model(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
        optimizer.zero_grad()
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        log.append((scale, scaler.get_scale() < scale, loss.item()))
    return log


# ------------------------------------------------------------------- the formulas



