"""Reference answers of lab 08 (memory and precision); the checks import them while they
run.

Not imported by the lab or the lesson: the lab asks the learner to write these. The
measurement of bytes per parameter on the simulator lives here too, since it answers
exercise 1 as well as the formula does.
"""

import itertools

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import simcluster as sc
from workbook.lesson08_memory_and_precision.lab import OPTIMIZERS, WEIGHTS, recipe_model

ELEMENT_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
STATES = {"sgd": 0, "momentum": 1, "adam": 2}   # tensors of state per parameter


# ------------------------------------------------------------- exercise 1


def bytes_per_parameter(weights, optimizer, master_weights=False):
    """Bytes per parameter after a step: the weights and their gradients in ``weights``'
    dtype, an fp32 master copy if ``master_weights``, and the optimizer's state tensors
    (none, momentum, or Adam's two moments) in fp32 with master weights, else in the
    weights' dtype."""
    w = ELEMENT_BYTES[weights]
    state = 4 if master_weights else w
    return 2 * w + (4 if master_weights else 0) + STATES[optimizer] * state


def measured_bytes_per_parameter():
    """On one simulated rank: ``{(weights, optimizer, master_weights): {category: bytes per
    parameter}}`` of parameters, gradients and optimizer state held right after a step."""
    kept = ("parameters", "gradients", "optimizer state")
    out = {}
    for recipe in itertools.product(WEIGHTS, OPTIMIZERS, (False, True)):
        before = sc.memory_in_use()   # the last recipe's tensors are freed: no cycles
        model, optimizer = recipe_model(*recipe)
        psi = sum(q.numel() for q in model.parameters())
        for _ in range(2):
            x = torch.randn(4, model[0].in_features, dtype=model[0].weight.dtype)
            model(x).float().square().mean().backward()
            optimizer.step()
            after = sc.memory_in_use()
            optimizer.zero_grad()
        out[recipe] = {k: (after[k] - before[k]) / psi for k in kept}
        del model, optimizer
    return out


# ------------------------------------------------------------- exercise 2


class LossScaler:
    """Dynamic loss scaling, as ``torch.amp.GradScaler`` does it: multiply the loss by the
    scale; before the step, skip it if any gradient is inf or NaN, else divide the
    gradients by the scale and step; then back off after a skipped step, or grow after
    ``growth_interval`` good steps in a row."""

    def __init__(self, init_scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                 growth_interval=2000):
        self._scale = init_scale
        self.growth_factor, self.backoff_factor = growth_factor, backoff_factor
        self.growth_interval = growth_interval
        self._good_steps = 0
        self._found_inf = False

    def scale(self, loss):
        """The loss times the scale (call ``backward()`` on this)."""
        return loss * self._scale

    def step(self, optimizer):
        """Unscale the gradients and step, or skip the step if one is not finite."""
        grads = [q.grad for group in optimizer.param_groups for q in group["params"]
                 if q.grad is not None]
        self._found_inf = not all(bool(torch.isfinite(g).all()) for g in grads)
        if self._found_inf:
            return None
        for g in grads:
            g.div_(self._scale)
        return optimizer.step()

    def update(self):
        """Back off after a skipped step; grow after ``growth_interval`` good ones."""
        if self._found_inf:
            self._scale *= self.backoff_factor
            self._good_steps = 0
        else:
            self._good_steps += 1
            if self._good_steps == self.growth_interval:
                self._scale *= self.growth_factor
                self._good_steps = 0

    def get_scale(self):
        """The current scale, a float."""
        return self._scale


# ------------------------------------------------------------- exercise 3


def peak_activations(profile, chosen):
    """Estimated peak of activation memory when the blocks in ``chosen`` are checkpointed:
    block i runs (in forward, and again in backward if checkpointed) on top of what the
    blocks before it keep; a checkpointed block keeps only its output."""
    below, peak = 0, 0
    for i, block in enumerate(profile):
        peak = max(peak, below + block["peak"])
        below += block["output"] if i in chosen else block["kept"]
    return max(peak, below)


def choose_checkpoints(profile, cap):
    """The blocks to checkpoint whose estimated peak fits ``cap`` with the least recompute
    time (every subset tried: 2⁸ of them), or None if none fits."""
    best = None
    for k in range(len(profile) + 1):
        for chosen in itertools.combinations(range(len(profile)), k):
            if peak_activations(profile, set(chosen)) <= cap:
                cost = sum(profile[i]["recompute"] for i in chosen)
                if best is None or cost < best[0]:
                    best = (cost, list(chosen))
    return None if best is None else best[1]


# ------------------------------------------------------------- exercise 4


def fit(model, x, y, steps, lr, memory):
    """``steps`` Adam steps on the whole batch in micro-batches, every block checkpointed:
    the fewest micro-batches whose estimated peak fits ``memory``. Returns each step's
    loss on the whole batch."""
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    psi = sum(q.numel() for q in model.parameters())
    width = max(m.out_features for m in model.modules() if isinstance(m, torch.nn.Linear))
    # per sample: every block's output kept, one block's hidden activations recomputed
    per_sample = 4 * (len(model) * x.shape[1] + 4 * width)
    k = 1
    while 20 * psi + 2 * per_sample * x.shape[0] // k > memory and k < x.shape[0]:
        k *= 2
    losses = []
    for _ in range(steps):
        total = 0.0
        for xs, ys in zip(x.chunk(k), y.chunk(k)):
            out = xs
            for block in model:
                out = checkpoint(block, out, use_reentrant=False)
            loss = F.mse_loss(out, ys) / k
            loss.backward()
            total += loss.item()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(total)
    return losses
