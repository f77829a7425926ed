"""What lab 08 (memory and precision) gives the learner: the optimizer with fp32 master
weights (:class:`MasterWeights`) and the recipes of its first exercise, the block stack to
checkpoint and its profile, the small device to fit a model on and the run that trains on
it (the checks measure the same ones).

Nothing here is an answer: the reference answers stay in :mod:`._reference`.
"""

import functools
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import simcluster as sc
from simcluster.accounting import current
from workbook.checking import num


MiB = 2**20


WEIGHTS = ("float32", "bfloat16", "float16")


OPTIMIZERS = ("sgd", "momentum", "adam")


class MasterWeights(torch.optim.Optimizer):
    """Mixed-precision training's optimizer: keeps an fp32 copy (the master weight) of
    every low-precision parameter and runs ``optimizer_class`` on the copies, in fp32. A
    step reads each gradient in fp32, steps the master weights and copies them back,
    rounded, into the parameters. Its state (masters, and the inner optimizer's moments)
    is created inside the first ``step()``, so the simulator counts it as optimizer state.
    """

    def __init__(self, params, optimizer_class, **options):
        super().__init__(params, {})
        self.optimizer_class, self.options = optimizer_class, options
        self.inner = None

    @torch.no_grad()
    def step(self, closure=None):
        """One step of the inner optimizer on the fp32 masters; the parameters follow."""
        params = [q for group in self.param_groups for q in group["params"]]
        if self.inner is None:
            self.masters = []
            for q in params:            # allocated, then filled: not a cast of a parameter
                self.masters.append(torch.empty_like(q, dtype=torch.float32))
                self.masters[-1].copy_(q)
            self.inner = self.optimizer_class(self.masters, **self.options)
        for q, master in zip(params, self.masters):
            master.grad = q.grad.float()
        self.inner.step()
        for q, master in zip(params, self.masters):
            q.copy_(master)
            master.grad = None


def recipe_model(weights, optimizer, master_weights):
    """``(model, optimizer)`` of one recipe: a 64 → 128 → 64 MLP in ``weights``' dtype and
    ``torch.optim.SGD`` (``"sgd"``, ``"momentum"``) or ``torch.optim.Adam``, wrapped in
    :class:`MasterWeights` if ``master_weights``."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.Tanh(), nn.Linear(128, 64))
    model.to(getattr(torch, weights))
    cls, options = {"sgd": (torch.optim.SGD, {"lr": 0.1}),
                    "momentum": (torch.optim.SGD, {"lr": 0.1, "momentum": 0.9}),
                    "adam": (torch.optim.Adam, {"lr": 1e-3})}[optimizer]
    if master_weights:
        return model, MasterWeights(model.parameters(), cls, **options)
    return model, cls(model.parameters(), **options)


SCALER_STEPS = 14


HUGE_STEP, NAN_STEP = 7, 10     # an input ×10⁴ (fp16 overflows), a NaN in the input


def _kind(value):
    """``"float"`` for a Python float (or a numpy float64, a float too), else what it is:
    ``"0-d tensor"``, ``"int"``, ..."""
    if isinstance(value, float):
        return "float"
    if isinstance(value, torch.Tensor):
        return f"{value.dim()}-d tensor"
    return type(value).__name__


def scaled_training(make_scaler, case, steps=SCALER_STEPS):
    """Train a small MLP for ``steps`` steps under ``torch.autocast`` (float16) with SGD
    (momentum 0.9) and ``make_scaler(**case)``; per step: the scale before it (and the
    type ``get_scale()`` returned it as), whether the parameters changed, the parameters
    after it. Call it inside a rank."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 32), nn.Tanh(), nn.Linear(32, 4))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
    scaler = make_scaler(**case)
    g = torch.Generator().manual_seed(1)
    log = []
    for step in range(steps):
        x, y = torch.randn(16, 8, generator=g), torch.randn(16, 4, generator=g)
        if step == HUGE_STEP:
            x = x * 1e4
        if step == NAN_STEP:
            x[0, 0] = math.nan
        with torch.autocast("cpu", dtype=torch.float16):
            loss = F.mse_loss(model(x), y)
        before = [q.detach().clone() for q in model.parameters()]
        raw = scaler.get_scale()
        scale = float(raw)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()
        after = [q.detach().clone() for q in model.parameters()]
        log.append({"scale": scale, "type": _kind(raw),
                    "stepped": any(not torch.equal(b, a) for b, a in zip(before, after)),
                    "params": after})
    raw = scaler.get_scale()
    log.append({"scale": float(raw), "type": _kind(raw)})
    return log


HIDDEN, SEQUENCE, HEADS, LAYERS = 1024, 2048, 16, 4


class Attention(nn.Module):
    """Pre-norm self-attention with a residual, written out: its softmax keeps
    heads × sequence² values per sequence, much memory for little compute."""

    def __init__(self, hidden, heads):
        super().__init__()
        self.heads = heads
        self.norm, self.qkv = nn.LayerNorm(hidden), nn.Linear(hidden, 3 * hidden)
        self.proj = nn.Linear(hidden, hidden)

    def forward(self, x):
        b, s, h = x.shape
        q, k, v = self.qkv(self.norm(x)).view(b, s, 3, self.heads, h // self.heads).permute(
            2, 0, 3, 1, 4)
        weights = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(h // self.heads), dim=-1)
        return x + self.proj((weights @ v).transpose(1, 2).reshape(b, s, h))


class MLP(nn.Module):
    """Pre-norm MLP (h → 4h → h, GELU) with a residual: much compute per byte kept."""

    def __init__(self, hidden):
        super().__init__()
        self.norm, self.up = nn.LayerNorm(hidden), nn.Linear(hidden, 4 * hidden)
        self.down = nn.Linear(4 * hidden, hidden)

    def forward(self, x):
        return x + self.down(F.gelu(self.up(self.norm(x))))


def checkpoint_blocks():
    """The stack the exercise checkpoints: ``LAYERS`` GPT layers as 2·``LAYERS`` blocks,
    attention, MLP, attention, ... (hidden 1024, 16 heads). Make it inside
    ``sc.fake_tensors()``."""
    return nn.ModuleList([m for _ in range(LAYERS) for m in (Attention(HIDDEN, HEADS),
                                                             MLP(HIDDEN))])


def _activations():
    return current().memory.in_use["activations"]


def _forward_backward(chosen):
    """One forward and backward of the stack on a batch of one 2048-token sequence (fake
    tensors), the blocks in ``chosen`` under ``checkpoint(..., use_reentrant=False)``;
    returns the simulated seconds it took."""
    with sc.fake_tensors():
        blocks = checkpoint_blocks()
        x = torch.randn(1, SEQUENCE, HIDDEN, requires_grad=True)
        sc.reset_peak_memory()
        clock = current().clock
        start = clock.now
        for i, block in enumerate(blocks):
            x = checkpoint(block, x, use_reentrant=False) if i in chosen else block(x)
        x.square().mean().backward()
        return clock.now - start


@functools.cache
def _measure(chosen):
    run = sc.Cluster.preset("dgx-a100").run(_forward_backward, world_size=1,
                                            args=(set(chosen),))
    return run.category_peaks(0)["activations"], run.results[0]


def measure_checkpoints(chosen):
    """``(peak activation bytes, simulated seconds)`` of one forward and backward of the
    stack with the blocks in ``chosen`` (indices) checkpointed, on one simulated A100."""
    return _measure(frozenset(chosen))


def _profile_run():
    """On one rank: each block's forward measured in the stack, then each block alone,
    forward and backward, with and without checkpointing (the difference: its recompute)."""
    memory, clock = current().memory, current().clock
    rows = []
    with sc.fake_tensors():
        blocks = checkpoint_blocks()
        x = torch.randn(1, SEQUENCE, HIDDEN, requires_grad=True)
        for block in blocks:
            start, t0 = _activations(), clock.now
            sc.reset_peak_memory()
            y = block(x)
            rows.append({"name": type(block).__name__.lower(),
                         "kept": _activations() - start,
                         "peak": memory.category_peaks["activations"] - start,
                         "output": y.numel() * y.element_size(),
                         "forward": clock.now - t0})
            x = y
        for row, block in zip(rows, blocks):
            took = []
            for checkpointed in (False, True):
                x = torch.randn(1, SEQUENCE, HIDDEN, requires_grad=True)
                t0 = clock.now
                y = checkpoint(block, x, use_reentrant=False) if checkpointed else block(x)
                y.sum().backward()
                took.append(clock.now - t0)
            row["recompute"] = took[1] - took[0]
    return rows


@functools.cache
def _profile():
    return tuple(sc.Cluster.preset("dgx-a100").run(_profile_run, world_size=1).results[0])


def profile_blocks():
    """Per block of the stack, measured on one simulated A100: ``name`` ("attention" or
    "mlp"), ``kept`` (activation bytes it keeps for backward), ``peak`` (the most
    activation bytes it holds while it runs, above what was there before), ``output``
    (bytes of its output: all a checkpointed block keeps) and ``recompute`` (simulated
    seconds checkpointing it adds to a step); ``forward`` is its forward's seconds."""
    return [dict(row) for row in _profile()]


# Caps on activation memory (bytes) the check asks for: none fits without checkpointing.
CHECKPOINT_CAPS = (1584 * MiB, 1000 * MiB, 696 * MiB)


FIT_HIDDEN, FIT_BLOCKS, FIT_BATCH = 128, 4, 1024


FIT_STEPS, FIT_LR = 4, 3e-3


FIT_MEMORY = (16 * MiB, 12 * MiB)   # device memories the check fits the model on


def fit_model():
    """The model to fit: ``FIT_BLOCKS`` blocks Linear(128, 512) · GELU · Linear(512, 128),
    fp32, 0.53 M parameters (seeded: the same every time)."""
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(FIT_HIDDEN, 4 * FIT_HIDDEN), nn.GELU(),
                                         nn.Linear(4 * FIT_HIDDEN, FIT_HIDDEN))
                           for _ in range(FIT_BLOCKS)])


def fit_data():
    """``(x, y)``: ``FIT_BATCH`` inputs and the outputs of a fixed random linear map plus
    a tanh, which the model can learn."""
    g = torch.Generator().manual_seed(8)
    x = torch.randn(FIT_BATCH, FIT_HIDDEN, generator=g)
    w = torch.randn(FIT_HIDDEN, FIT_HIDDEN, generator=g) / math.sqrt(FIT_HIDDEN)
    return x, torch.tanh(x @ w)


def fit_cluster(memory):
    """One simulated GPU like an A100 (compute, bandwidth) with ``memory`` bytes."""
    return sc.Cluster.from_dict({"name": "small", "nodes": [{"devices": 1, "device": {
        "name": f"{num(memory / MiB)}-MiB GPU", "memory_gb": memory / 2**30,
        "peak_tflops": {"float32": 19.5, "tf32": 156, "bfloat16": 312, "float16": 312},
        "hbm_gbps": 2039}}]})


def train_plain(model, x, y, steps, lr, memory):
    """Plain training: ``steps`` Adam steps on the whole batch, each step's loss (the
    mean squared error of the whole batch) returned. Ignores ``memory``."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def _fit_body(fn, memory):
    model = fit_model()
    x, y = fit_data()
    losses = fn(model, x, y, FIT_STEPS, FIT_LR, memory)
    return losses, {name: q.detach().clone() for name, q in model.named_parameters()}


def run_fit(fn, memory):
    """Run ``fn(model, x, y, steps, lr, memory)`` on :func:`fit_cluster` (``memory``
    bytes) with :func:`fit_model` and :func:`fit_data`; returns the ``Run`` (its results:
    ``[(losses, parameters)]``). Raises ``sc.OutOfMemoryError`` if it does not fit."""
    return fit_cluster(memory).run(_fit_body, world_size=1, args=(fn, memory), timeout=120)


def show_fit(fn):
    """Print, for each of :data:`FIT_MEMORY`, the peak of ``fn`` under :func:`run_fit` and
    its losses (4 decimals); what is not a list of numbers, or does not fit, is said in a
    line, so the check cell after it still gets to say what is wrong."""
    for memory in FIT_MEMORY:
        try:
            run = run_fit(fn, memory)
        except sc.OutOfMemoryError as error:
            print(f"{memory / MiB:.0f}-MiB GPU: {oom_text(error)}")
            continue
        losses, _ = run.results[0]
        try:
            shown = [round(float(v), 4) for v in losses]
        except (TypeError, ValueError, RuntimeError):
            shown = f"{type(losses).__name__} that is not a list of numbers (see the check)"
        print(f"{memory / MiB:.0f}-MiB GPU: peak {run.peak_memory(0)['total'] / MiB:.1f} MiB, "
              f"losses {shown}")


def oom_text(error):
    """An ``sc.OutOfMemoryError`` in MiB, which a device of a few MiB needs."""
    used = ", ".join(f"{k} {v / MiB:.1f}" for k, v in error.in_use.items() if v)
    return (f"ran out of memory: tried to allocate {error.requested / MiB:.1f} MiB with "
            f"{sum(error.in_use.values()) / MiB:.1f} of {error.capacity / MiB:.0f} MiB in "
            f"use ({used} MiB)")
