"""The checks of lab 07 (ZeRO stages 1–3 and FSDP2), on the protocol of
:mod:`workbook.checking`, and the helpers the lab gives the learner.

The shard layout (:func:`shard_size`, :func:`my_shard`) is FSDP2's, flattened: a
parameter is flattened, padded with zeros to a multiple of the world size N, and rank r
holds chunk r. :class:`ShardedLinear` holds the shards of an ``nn.Linear`` and computes
with the learner's ZeRO-3 function.

* :func:`check_zero1` trains a small real MLP with the learner's ``ZeRO1Adam`` on world
  sizes 1–4 (its 197 parameters divide by none of 2, 3, 4), gradients averaged by the
  check as DDP would, and compares every parameter with ``torch.optim.Adam`` in one
  process; then it measures the memory the optimizer keeps on the simulator: at most
  (× 1.25) 1/N of what ``torch.optim.Adam`` keeps.
* :func:`check_zero2` does the same with ``ZeRO2Adam``, which gets each rank's own
  gradients; it also measures the gradients held at the end of backward (1/N of the
  model's) and the bytes each rank sends per step, against 2·(N−1)/N·4Ψ.
* :func:`check_zero3` runs a three-layer MLP of :class:`ShardedLinear` layers with the
  learner's autograd function and compares outputs and gradient shards with the whole
  model in one process; then the peak memory of forward and backward against the
  reference's (one layer gathered at a time).
* :func:`check_zero_memory` compares the learner's memory formula with the ZeRO paper's
  table and the reference.
* :func:`check_fit_settings` runs the learner's choice of torch settings (DDP,
  ``ZeroRedundancyOptimizer``, ``fully_shard`` with ``reshard_after_forward`` and
  ``CPUOffloadPolicy``) for models that do not fit with DDP, on fake tensors, and
  compares the simulated step time with the fastest settings that fit.

The reference answers (:mod:`._reference`) are imported inside the checks only.
"""

import functools
import math
import re

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import simcluster as sc
from workbook.checking import (Failure, answers, budget, check, close_within,
                               first_difference, listed, mse, num, number, on_a_rank,
                               refuse_reference, seconds, short, simulate, within_best)
from workbook.hints import Hints
from workbook.lesson07_zero_fsdp.lab import (FIT_BLOCKS, FIT_WORLD, ShardedLinear, fit_psi,
                                             fit_time, shard_size)

WORLD_SIZES = (1, 2, 3, 4)
MEMORY_WORLD_SIZES = (2, 4)
STEPS = 3
LR = 1e-2
BATCH = 4


_reference = answers(__name__)   # the answers, imported only while a check runs


hint = Hints({
    "zero1": [
        "Every rank has the whole averaged gradient but should keep Adam's state for its "
        "own chunk only (my_shard shows which). After the update, how do the other ranks "
        "get the values of your chunk?",
        "State: two zero tensors of shard_size(q.numel(), N) elements per parameter. Update: "
        "Adam's formulas on your chunk with your chunk of the gradient, then an all-gather "
        "of every rank's updated chunk, cut back to q.numel() elements and copied into q.",
    ],
    "zero2": [
        "Each rank now gets its own batch's gradient. Which collective hands each rank only "
        "its chunk of the combination over ranks, and is that combination the mean? When "
        "is a gradient ready to be reduced (torch can tell you)?",
        "A post-accumulate-grad hook on each parameter reduces that gradient as soon as it "
        "is complete, keeps this rank's chunk (one slot per parameter) and drops q.grad, so "
        "whole gradients never pile up. step() updates from the chunks and clears them.",
        "In the hook: flatten q.grad, pad it to N·shard_size elements, reduce-scatter into "
        "a chunk-sized buffer, then turn the sum into the mean.",
    ],
    "zero3": [
        "Only shards live between uses. What must forward gather to compute, and what "
        "should it save for backward so that no whole weight stays alive until then?",
        "forward: gather the whole weight and bias from the shards (cut back to their "
        "sizes), compute, save the input and the shards only. backward: gather the weight "
        "again, compute the input's gradient and the weight's and bias's, then give each "
        "rank the mean of its chunk of those two.",
    ],
    "table": [
        "Model states are 2Ψ of parameters, 2Ψ of gradients and KΨ of optimizer state. "
        "Which of the three does stage 1 divide by N_d, which stage 2, which stage 3?",
        "Stage k divides the first k kinds in the order (optimizer state, gradients, "
        "parameters); the answer is in GB (10^9 bytes).",
    ],
    "fit": [
        "For each candidate (DDP, ZeroRedundancyOptimizer, fully_shard with or without "
        "resharding and offload): what is its peak per GPU, and with offload what must the "
        "host hold? Then: which candidate is fastest? Measure with fit_time and fit_memory.",
        "Candidates in the order of their measured step time; take the first whose "
        "peak from the table's bytes per parameter fits gpu_memory (the reference keeps "
        "5 % to spare; any margin from 0 to 8 % gives the same answers) and, with offload, "
        "whose 16Ψ/N of shards fits host_memory; None if none does.",
    ],
})


# ------------------------------------------------------------- the shard layout


# ------------------------------------------------------------- models and data


def small_model(seed=0):
    """6 → 16 → 5 with Tanh: 197 parameters, a prime number."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 5))


def wide_model(seed=0):
    """64 → 257 → 63 with Tanh: 32,959 parameters, for memory and bytes."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(64, 257), nn.Tanh(), nn.Linear(257, 63))


def batch(model, rank, step):
    """``(x, y)`` of rank ``rank`` at step ``step``: different on every rank and step."""
    first, last = model[0], model[-1]
    g = torch.Generator().manual_seed(1_000 * step + rank)
    return (torch.randn(BATCH, first.in_features, generator=g),
            torch.randn(BATCH, last.out_features, generator=g))


def _params(model):
    return sum(q.numel() for q in model.parameters())


def _in_use():
    return sum(sc.memory_in_use().values())


# Adam divides by a square root: near-zero moments amplify rounding of the gradient sum
_close = close_within(atol=1e-6)


# ------------------------------------------------------------- exercises 1 and 2: Adam


def _unsharded(make_model, p, steps):
    """Parameters after ``steps`` steps of ``torch.optim.Adam`` in one process on the mean
    of the ranks' losses (so on the mean of their gradients)."""
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    for step in range(steps):
        losses = [mse(model(x), y) for x, y in (batch(model, r, step) for r in range(p))]
        (sum(losses) / p).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [q.detach() for q in model.parameters()]


@functools.cache
def _without_bias_correction(make_model, p, steps):
    """As :func:`_unsharded`, for Adam written without one or both bias corrections
    (m / (1 − β1^t), v / (1 − β2^t)): the parameters a learner's Adam gives then."""
    out = []
    for first, second in ((False, True), (True, False), (False, False)):
        model = make_model()
        params = list(model.parameters())
        m = [torch.zeros_like(q) for q in params]
        v = [torch.zeros_like(q) for q in params]
        for t in range(1, steps + 1):
            losses = [mse(model(x), y) for x, y in (batch(model, r, t - 1) for r in range(p))]
            grads = torch.autograd.grad(sum(losses) / p, params)
            with torch.no_grad():
                for q, g, mq, vq in zip(params, grads, m, v):
                    mq.mul_(0.9).add_(g, alpha=0.1)
                    vq.mul_(0.999).addcmul_(g, g, value=0.001)
                    mh = mq / (1 - 0.9 ** t) if first else mq
                    vh = vq / (1 - 0.999 ** t) if second else vq
                    q -= LR * mh / (vh.sqrt() + 1e-8)
        out.append([q.detach() for q in params])
    return out


def _train_body(cls, make_model, steps, average, measure):
    """On every rank: train with ``cls(model.parameters(), lr=LR)``; ``average``: the
    check all-reduces the gradients first (ZeRO-1 is handed averaged gradients)."""

    def body(where):
        rank, p = dist.get_rank(), dist.get_world_size()
        model = make_model()
        data = [batch(model, rank, step) for step in range(steps)]
        base = _in_use() if measure else 0
        # registered before the learner's hooks, so it names the gradient they work on
        reducing = _watch_gradients(model)
        optimizer = cls(model.parameters(), lr=LR)
        kept = held = 0
        in_step = False   # whole gradients alive after backward, gone after step()
        for x, y in data:
            before = _in_use() if measure else 0
            try:
                mse(model(x), y).backward()
            except (RuntimeError, ValueError) as error:
                if reducing and _shape_error(error):
                    raise _hook_shape_failure(where, reducing[-1], p, error) from None
                raise
            except AttributeError as error:
                if "'NoneType'" not in str(error):
                    raise
                raise Failure(f"{where}: during backward, {type(error).__name__}: {error}",
                              "a hook read q.grad while it was still None: a hook registered "
                              "with q.register_hook(...) runs before backward accumulates the "
                              "gradient into q.grad. Use "
                              "q.register_post_accumulate_grad_hook(...), called with q once "
                              "q.grad is set.") from None
            if measure:
                held = _in_use() - before
            if average:
                for q in model.parameters():
                    dist.all_reduce(q.grad)
                    q.grad /= p
            alive = all(q.grad is not None for q in model.parameters())
            optimizer.step()
            in_step = alive and all(q.grad is None for q in model.parameters())
            for q in model.parameters():
                q.grad = None
            if measure:
                kept = _in_use() - base
        return {"params": [q.detach().clone() for q in model.parameters()],
                "kept": kept, "held": held, "whole": _whole_tensors_kept(optimizer, model),
                "in_step": in_step}

    return body


def _where(p, model):
    return f"world size {p}, {_params(model):,} parameters"


def _run_training(cls, make_model, p, steps, average, measure=False, seen=None):
    """``cls`` trained on ``p`` ranks; its ``update_chunk`` watched (:func:`_probed`), the
    gradient chunks it gets appended to ``seen``."""
    where = _where(p, make_model())
    names = [name for name, _ in make_model().named_parameters()]
    return simulate(sc.Cluster.preset("dgx-a100"),
                    _train_body(_probed(cls, names, where, seen), make_model, steps,
                                average, measure), p,
                    lambda rank: where, accounting=measure, args=(where,)), where


# ------------------------------------------------------------- shapes, named


def _shape_error(error):
    """Whether ``error`` (torch's or the simulator's) is about sizes or shapes."""
    return bool(re.search(r"size|shape|must hold|cannot be multiplied|invalid gradient",
                          str(error)))


def _size(tensor):
    """``16 × 6 = 96 elements``, or ``5 elements``."""
    dims = " × ".join(map(str, tensor.shape))
    return f"{dims} = {tensor.numel()} elements" if tensor.dim() > 1 else f"{tensor.numel()} elements"


def _chunk_shapes(numel, shape, p):
    """What the shapes are for a tensor of ``numel`` elements (``shape``) on ``p`` ranks."""
    n = shard_size(numel, p)
    return (f"a chunk is ({n},) = ⌈{numel} / {p}⌉ elements, flat (Adam's m and v for it "
            f"too); the gathered buffer holds {p} chunk{'s' if p > 1 else ''}, ({p * n},) "
            "with the padding, "
            f"cut back to its first {numel} elements and viewed as {shape}")


def _probed(cls, names, where, seen=None):
    """``cls`` with its ``update_chunk`` watched: the gradient chunk it gets must have the
    layout's shape (``(⌈numel / N⌉,)``), and a shape error inside it is reported with the
    shapes that were expected, not torch's bare message. ``seen`` (a list) gets
    ``(rank, step, parameter, chunk)`` for every call."""
    if not isinstance(cls, type) or not callable(getattr(cls, "update_chunk", None)):
        return cls     # not a class (an instance, say): the run reports what it is

    class Probe(cls):
        def update_chunk(self, i, q, grad):
            p, rank = dist.get_world_size(), dist.get_rank()
            n = shard_size(q.numel(), p)
            name = names[i] if isinstance(i, int) and 0 <= i < len(names) else f"parameter {i}"
            at = f"{where}: rank {rank}, {name} ({_size(q)})"
            got = None if grad is None else tuple(torch.as_tensor(grad).shape)
            if got != (n,):
                whole = got is not None and math.prod(got) == q.numel() and p > 1
                raise Failure(f"{at}: update_chunk got a gradient chunk of shape {got}, "
                              f"expected ({n},) = ⌈numel / world size⌉ = ⌈{q.numel()} / {p}⌉",
                              "that is the whole gradient: each rank's update uses its own "
                              "chunk of it only." if whole else
                              "no chunk reached update_chunk: what hands it one?"
                              if got is None else
                              f"the chunk is flat, in the layout above: {_chunk_shapes(q.numel(), tuple(q.shape), p)}.")
            if seen is not None:
                seen.append((rank, self.t, i, torch.as_tensor(grad).detach().clone()))
            try:
                return super().update_chunk(i, q, grad)
            except (RuntimeError, ValueError) as error:
                if not _shape_error(error):
                    raise
                raise _state_shape_failure(self, i, q, n, at, error) from None

    Probe.__name__ = Probe.__qualname__ = cls.__name__
    return Probe


def _state_shape_failure(optimizer, i, q, n, at, error):
    """The :class:`Failure` for a shape error in ``update_chunk`` (whose gradient chunk had
    the right shape): a per-parameter list of the optimizer whose entry ``i`` is not a
    chunk, if there is one, else the shapes the update needs."""
    for attr, value in vars(optimizer).items():
        if not isinstance(value, (list, tuple)) or len(value) <= i:
            continue
        entry = value[i]
        if (isinstance(entry, torch.Tensor) and entry is not q
                and all(isinstance(v, torch.Tensor) or v is None for v in value)
                and tuple(entry.shape) != (n,)):
            return Failure(f"{at}: self.{attr}[{i}] has shape {tuple(entry.shape)}, "
                           f"expected ({n},) = ⌈{q.numel()} / {dist.get_world_size()}⌉ "
                           f"(update_chunk raised {type(error).__name__}: {short(error, 90)})",
                           "Adam's state covers this rank's chunk only: as many elements "
                           "as the chunk, flat.")
    p = dist.get_world_size()
    return Failure(f"{at}: update_chunk raised {type(error).__name__}: {short(error, 120)}",
                   f"the shapes in the update: {_chunk_shapes(q.numel(), tuple(q.shape), p)}.")


def _watch_gradients(model):
    """A list that gets ``(name, parameter)`` each time a parameter's gradient is
    accumulated: its last entry is the gradient the learner's hook is working on."""
    reducing = []
    for name, q in model.named_parameters():
        q.register_post_accumulate_grad_hook(
            lambda q, name=name: reducing.append((name, q)))
    return reducing


def _hook_shape_failure(where, current, p, error):
    name, q = current
    n = shard_size(q.numel(), p)
    return Failure(f"{where}: rank {dist.get_rank()}, while reducing the gradient of {name} "
                   f"({_size(q)}): {type(error).__name__}: "
                   f"{short(error, 120)}",
                   f"on {p} ranks the reduce-scatter takes that gradient flat, padded with "
                   f"zeros to {p}·{n} = {p * n} elements, and gives each rank ({n},) = "
                   f"⌈{q.numel()} / {p}⌉ elements.")


def _compare_parameters(run, where, expected, names, steps):
    for rank, result in enumerate(run.results):
        for name, e, g in zip(names, expected, result["params"]):
            at = f"{where}: rank {rank}, {name} after {steps} steps"
            if g.shape != e.shape:
                raise Failure(f"{at} has shape {tuple(g.shape)}, expected {tuple(e.shape)}",
                              "the parameter keeps its shape: write the gathered values "
                              "into it, cut back to its elements and viewed as it.")
            diff = first_difference(e, g, _close)
            if diff is not None:
                i, ev, gv = diff
                unchanged = torch.equal(g, _initial_params()[name])
                k = names.index(name)
                uncorrected = any(first_difference(w[k], g, _close) is None
                                  for w in _without_bias_correction(small_model, len(
                                      run.results), steps))
                hint = ("that parameter did not change: every rank's updated chunk must be "
                        "gathered and written into the parameter itself."
                        if unchanged else
                        "these are the values of Adam without its bias correction: divide m "
                        "by 1 − β1^t and v by 1 − β2^t (t counts the steps from 1) before "
                        "the update." if uncorrected else
                        "compare with torch.optim.Adam on world size 1 first; then check "
                        "that every rank updates its own chunk (my_shard) and that the "
                        "gathered tensor is cut back to q.numel() elements.")
                raise Failure(f"{at}, element {i}: torch.optim.Adam gives {num(ev)}, "
                              f"yours {num(gv)}", hint)


def _initial_params():
    return {name: q.detach() for name, q in small_model().named_parameters()}


@functools.cache
def _adam_kept(make_model):
    """Bytes ``torch.optim.Adam`` keeps between steps, measured on one rank."""
    run, _ = _run_training(torch.optim.Adam, make_model, 1, 2, True, measure=True)
    return run.results[0]["kept"]


def _check_values(cls, average):
    names = [name for name, _ in small_model().named_parameters()]
    for p in WORLD_SIZES:
        run, where = _run_training(cls, small_model, p, STEPS, average)
        _compare_parameters(run, where, _unsharded(small_model, p, STEPS), names, STEPS)


def _whole_tensors_kept(optimizer, model):
    """Whole parameter-sized tensors (not the parameters) the optimizer keeps in its
    attributes (directly, or in a list, tuple or dict), per parameter: 2 for Adam's whole
    state, 1 for whole gradients or gathered buffers."""
    params = list(model.parameters())
    sizes = {q.numel() for q in params}
    found = {}
    for value in vars(optimizer).values():
        items = (value.values() if isinstance(value, dict) else
                 value if isinstance(value, (list, tuple)) else [value])
        for t in items:
            if (isinstance(t, torch.Tensor) and t.numel() in sizes
                    and not any(t is q for q in params)):
                found[id(t)] = t
    return len(found) / len(params)


def _chunk_elements(make_model, p):
    """Elements of one rank's chunks of every parameter (padding included)."""
    return sum(shard_size(q.numel(), p) for q in make_model().parameters())


def _kept_cause(kept, whole, make_model, p):
    """What a rank keeps between steps beyond Adam's sharded state (8 bytes per chunk
    element), from the whole tensors it holds (``whole`` per parameter) and how much more
    it keeps: the hint for the memory budget."""
    chunk, psi = 4 * _chunk_elements(make_model, p), 4 * _params(make_model())
    extra = kept - 2 * chunk
    if whole >= 2 or (not whole and abs(kept - 2 * psi) <= 0.1 * psi):
        return ("that is Adam's state of whole parameters (8Ψ): keep m and v of your chunk "
                "only.")
    if abs(extra - chunk) <= 0.1 * chunk:
        return ("the extra is one chunk per parameter (4Ψ/N): the gradient chunks are still "
                "held after step() used them. Drop them once the update is done.")
    if whole >= 1 or extra >= 0.9 * psi:
        return ("the extra is whole parameter-sized tensors (4Ψ each): whole gradients, or a "
                "gathered buffer, kept after the step. Only chunks may stay.")
    return ("keep exp_avg and exp_avg_sq of your chunk only (shard_size elements per "
            "parameter), and drop every gathered buffer once it is copied into the "
            "parameter.")


def _check_state_memory(run, where, p, what, make_model=None):
    baseline = _adam_kept(wide_model)
    kept = [r["kept"] for r in run.results]
    budget(where, "memory", kept, baseline / p,
           f"1/{p} of torch.optim.Adam's {num(baseline)}",
           _kept_cause(max(kept), max(r.get("whole", 0) for r in run.results),
                       make_model or wide_model, p), f"between steps, {what}")


@check("ZeRO-1")
def check_zero1(cls):
    """``cls(params, lr)`` with ``step()``, handed averaged gradients: parameters equal
    ``torch.optim.Adam``'s after 3 steps on world sizes 1–4; between steps each rank keeps
    at most (× 1.25) 1/N of the memory Adam keeps."""
    refuse_reference(cls, _reference().ZeRO1Adam, "class")
    if isinstance(cls, type) and issubclass(cls, torch.optim.Adam):
        raise Failure("this class is torch.optim.Adam, which keeps the whole state on every "
                      "rank", "write ZeRO1Adam yourself, keeping m and v of your chunk only.")
    _check_values(cls, average=True)
    for p in MEMORY_WORLD_SIZES:
        run, where = _run_training(cls, wide_model, p, 2, True, measure=True)
        _check_state_memory(run, where, p, "Adam's state sharded")
    kept = max(r["kept"] for r in run.results)
    return (f"parameters equal torch.optim.Adam's on world sizes {listed(WORLD_SIZES)}; "
            f"on 4 ranks each keeps {num(kept)} bytes of optimizer state, "
            f"{kept / _adam_kept(wide_model):.3f} of Adam's")


def _check_bytes(run, where, p, psi, steps):
    sent = [0] * p
    for (src, _), nbytes in run.traffic.items():
        sent[src] += nbytes
    per_step = [s / steps for s in sent]
    target = 2 * (p - 1) / p * 4 * psi
    ops = [c.op for c in run.collectives]
    gathers = sum(op.startswith("all_gather") for op in ops) / steps
    if "all_reduce" in ops:
        why = ("an all-reduce sends 2·(N−1)/N of the buffer by itself: a reduce-scatter "
               "leaves each rank only its chunk for (N−1)/N.")
    elif gathers > len(list(wide_model().parameters())):
        why = (f"{num(gathers)} all-gathers per step for {len(list(wide_model().parameters()))}"
               " parameters: each parameter needs gathering once per step.")
    else:
        why = ("reduce-scatter each gradient and all-gather each parameter once per step: on "
               "a ring each rank sends (N−1)/N of the buffer for each.")
    budget(where, "bytes", per_step, target, f"2·(N−1)/N·4Ψ per step = 2·{p - 1}/{p}·4·"
           f"{psi:,}", why, "ZeRO-2")
    return max(per_step)


def _mean_gradients(make_model, p, steps):
    """Per step, the gradients of one process on the mean of the ranks' losses: the mean
    of the ranks' gradients, which ZeRO-2's reduce-scatter must give each rank a chunk of."""
    model = make_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=LR)
    grads = []
    for step in range(steps):
        losses = [mse(model(x), y) for x, y in (batch(model, r, step) for r in range(p))]
        (sum(losses) / p).backward()
        grads.append([q.grad.detach().clone() for q in model.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return grads


def _check_gradient_chunks(cls, p):
    """The chunks ``cls`` hands ``update_chunk`` are this rank's chunks of the mean gradient.

    Adam hardly notices a gradient N times too large (it divides by the gradient's own
    scale), so the parameters alone cannot tell the sum from the mean: look at the chunks.
    A chunk that is this step's plus the last step's names chunks never cleared."""
    if not callable(getattr(cls, "update_chunk", None)):
        return
    seen = []   # (rank, step, parameter, chunk), from every rank's thread
    _, where = _run_training(cls, small_model, p, STEPS, False, seen=seen)
    expected = _mean_gradients(small_model, p, STEPS)
    names = [name for name, _ in small_model().named_parameters()]
    earlier = {}
    for rank, t, i, got in sorted(seen, key=lambda e: e[:3]):
        if not (isinstance(t, int) and 1 <= t <= STEPS and 0 <= i < len(names)):
            continue   # a count of its own: the parameters' check judges the steps
        want = _chunk(expected[t - 1][i], rank, p)
        at = f"{where}: rank {rank}, step {t}, the gradient chunk of {names[i]}"
        before = earlier.get((rank, i))
        earlier[rank, i] = got
        diff = first_difference(want, got, _close)
        if diff is None:
            continue
        k, ev, gv = diff
        ratio = gv / ev if ev else math.nan
        if before is not None and first_difference(want + before, got, _close) is None:
            hint = ("it is this step's chunk plus the one of the step before: the chunks "
                    "are kept after step() and added to. Clear them once used.")
        elif abs(ratio - p) < 1e-3 * p:
            hint = (f"this chunk is {num(ratio)}× the mean: what does a reduce-scatter "
                    "add up, and what did each rank's backward compute?")
        else:
            hint = ("compare your chunk with the same chunk of the mean over the ranks' "
                    "gradients.")
        raise Failure(f"{at}, element {k}: the mean over ranks is {num(ev)}, yours "
                      f"{num(gv)}", hint)


@check("ZeRO-2")
def check_zero2(cls):
    """``cls(params, lr)`` with ``step()``, handed each rank's own gradients: parameters
    equal ``torch.optim.Adam``'s on the mean gradient; on 2 and 4 ranks, at most (× 1.25)
    1/N of Adam's state kept and of the gradients held after backward, and at most
    (× 1.05) 2·(N−1)/N·4Ψ bytes sent per rank and step."""
    refuse_reference(cls, _reference().ZeRO2Adam, "class")
    refuse_reference(cls, _reference().ZeRO1Adam, "class")
    _check_gradient_chunks(cls, max(WORLD_SIZES))   # first: it names why values differ
    _check_values(cls, average=False)
    psi = _params(wide_model())
    for p in MEMORY_WORLD_SIZES:
        run, where = _run_training(cls, wide_model, p, 2, False, measure=True)
        held = [r["held"] for r in run.results]
        if max(held) < 0.9 * 4 * psi:
            why = ("more than the chunks is alive after backward: reduce each gradient as "
                   "soon as it is accumulated (torch can call you back per parameter) and "
                   "keep only your chunk.")
        elif all(r["in_step"] for r in run.results):
            why = ("the whole gradients (4Ψ) wait for step(), which reduce-scatters them and "
                   "drops q.grad only then: reduce-scatter each gradient in a hook as soon as "
                   "backward has accumulated it (Tensor.register_post_accumulate_grad_hook), "
                   "so whole gradients never pile up and the communication overlaps backward.")
        else:
            why = ("whole gradients (4Ψ) are still alive after backward: once a gradient's "
                   "chunk is taken, the whole one (q.grad) must go.")
        budget(where, "memory", held, 4 * psi / p, f"4Ψ/N = 4·{psi:,}/{p}", why,
               "after backward, ZeRO-2's gradient shards")
        _check_state_memory(run, where, p, "Adam's state sharded")
        sent = _check_bytes(run, where, p, psi, 2)
    return (f"parameters equal torch.optim.Adam's on world sizes {listed(WORLD_SIZES)}; "
            f"on 4 ranks 1/4 of the gradients and of Adam's state, {num(sent)} bytes sent "
            f"per rank and step = {sent / (4 * psi):.3f}·4Ψ (formula 2·3/4 = 1.5)")


# ------------------------------------------------------------- exercise 3: ZeRO-3

ZERO3_WIDTHS = (7, 33, 31, 5)          # three layers; no weight divides by 2, 3 or 4
MEMORY_WIDTHS = (64,) + (127,) * 6     # six equal layers: one gathered at a time


def _layers(widths, seed=0):
    torch.manual_seed(seed)
    return [nn.Linear(a, b) for a, b in zip(widths, widths[1:])]


def _sharded(fn, widths):
    layers = []
    for linear in _layers(widths):
        layers += [ShardedLinear(linear, fn), nn.Tanh()]
    return nn.Sequential(*layers[:-1])


def _gathered_kept(out, widths):
    """How a gathered weight (out × in elements) outlives forward, read from the autograd
    graph of ``out`` before backward: "saved" (``ctx.save_for_backward``), "ctx" (kept
    as an attribute of ctx), or None (no node holds one)."""
    sizes = {a * b for a, b in zip(widths, widths[1:])}
    stack, seen = [out.grad_fn], set()
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        if isinstance(node, torch.autograd.function.BackwardCFunction):
            if any(t is not None and t.numel() in sizes for t in node.saved_tensors):
                return "saved"
            if any(isinstance(v, torch.Tensor) and v.numel() in sizes
                   for v in vars(node).values()):
                return "ctx"
        stack += [n for n, _ in node.next_functions]
    return None


def _layer_shapes(layer, batch_size, p):
    """The shapes in the forward and backward of ``layer`` (a :class:`ShardedLinear`) on
    ``p`` ranks, for a hint."""
    out, inp = layer.out_features, layer.in_features
    nw, nb = shard_size(out * inp, p), shard_size(out, p)
    return (f"x is ({batch_size}, {inp}); W is ({out}, {inp}), the first {out * inp} of the "
            f"{p}·{nw} gathered elements; b is ({out},); y and grad_y are ({batch_size}, "
            f"{out}). backward returns grad_x ({batch_size}, {inp}) and the chunks of grad_W "
            f"and grad_b, ({nw},) and ({nb},).")


# what backward returns, in the order of forward's inputs
_INPUTS = ("x", "weight_shard", "bias_shard", "out_features", "in_features")


def _zero3_shape_failure(at, layer, batch_size, p, error):
    """A shape error in a layer's forward or backward, with the shapes it expected."""
    bad = re.search(r"invalid gradient at index (\d+) - got \[([\d, ]*)\] but expected "
                    r"shape compatible with \[([\d, ]*)\]", str(error))
    if bad:
        k = int(bad.group(1))
        got, want = (tuple(int(d) for d in g.split(",") if d.strip())
                     for g in bad.group(2, 3))
        name = _INPUTS[k] if k < len(_INPUTS) else f"input {k}"
        return Failure(f"{at}: backward returned a gradient for {name} of shape {got}, "
                       f"expected {want}",
                       "the gradient of x has x's shape; the gradients of the shards are "
                       "this rank's chunks of the mean gradients, flat: "
                       + _layer_shapes(layer, batch_size, p) if k else
                       "the gradient of x has x's shape: " + _layer_shapes(layer, batch_size, p))
    return Failure(f"{at}: {type(error).__name__}: {short(error, 120)}",
                   "the shapes here: " + _layer_shapes(layer, batch_size, p))


def _zero3_body(fn, widths, measure, where):
    def body():
        rank, p = dist.get_rank(), dist.get_world_size()
        model = _sharded(fn, widths)
        x, y = batch(model, rank, 0)
        layers = [m for m in model if isinstance(m, ShardedLinear)]
        current = {}    # the layer running now, and in which pass

        def before(module, args):
            current.update(layer=module, phase="forward")

        def after(module, args, out):
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (len(x),
                                                                         module.out_features):
                got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                raise Failure(f"{where}: rank {rank}, layer {layers.index(module)} "
                              f"({module.in_features} → {module.out_features}): forward "
                              f"returned {got}, expected ({len(x)}, {module.out_features})",
                              _layer_shapes(module, len(x), p))
            if out.requires_grad:
                out.register_hook(lambda grad: current.update(layer=module, phase="backward"))

        for layer in layers:
            layer.register_forward_pre_hook(before)
            layer.register_forward_hook(after)
        start = _in_use() if measure else 0
        if measure:
            sc.reset_peak_memory()
        try:
            out = model(x)
            kept = _gathered_kept(out, widths) if measure else None
            mse(out, y).backward()
        except (RuntimeError, ValueError) as error:
            if not (_shape_error(error) and current):
                raise
            layer = current["layer"]
            at = (f"{where}: rank {rank}, layer {layers.index(layer)} ({layer.in_features} → "
                  f"{layer.out_features}), {current['phase']}")
            raise _zero3_shape_failure(at, layer, len(x), p, error) from None
        return {"out": out.detach(), "start": start, "kept": kept,
                "grads": [None if q.grad is None else q.grad.clone()
                          for q in model.parameters()]}

    return body


def _run_zero3(fn, widths, p, measure=False):
    where = f"world size {p}, layers {' → '.join(map(str, widths))}"
    run = simulate(sc.Cluster.preset("dgx-a100"), _zero3_body(fn, widths, measure, where), p,
                   lambda rank: where, accounting=measure)
    return run, where


def _whole(widths, p):
    """Outputs of every rank's batch and the shards' expected gradients (mean loss)."""
    layers = _layers(widths)
    model = nn.Sequential(*[m for linear in layers for m in (linear, nn.Tanh())][:-1])
    outs, losses = [], []
    for r in range(p):
        x, y = batch(model, r, 0)
        outs.append(model(x))
        losses.append(mse(outs[-1], y))
    (sum(losses) / p).backward()
    grads = [g for linear in layers for g in (linear.weight.grad, linear.bias.grad)]
    return [o.detach() for o in outs], grads


def _chunk(tensor, rank, p):
    n = shard_size(tensor.numel(), p)
    flat = F.pad(tensor.reshape(-1), (0, n * p - tensor.numel()))
    return flat[rank * n:(rank + 1) * n]


def _compare_zero3(run, where, widths, p):
    outs, grads = _whole(widths, p)
    names = [f"{kind} of layer {i}" for i in range(len(widths) - 1)
             for kind in ("weight_shard", "bias_shard")]
    for rank, result in enumerate(run.results):
        diff = (first_difference(outs[rank], result["out"], _close)
                if result["out"].shape == outs[rank].shape else (0, math.nan, math.nan))
        if diff is not None:
            raise Failure(f"{where}: rank {rank}: the output differs from the whole "
                          f"model's (element {diff[0]}: expected {num(diff[1])}, got "
                          f"{num(diff[2])})", "forward computes x Wᵀ + b from W and b "
                          "gathered whole (every rank's shard, in rank order) and cut back "
                          "to out·in and out elements: which of these differs?")
        wrong = []
        for name, full, got in zip(names, grads, result["grads"]):
            at = f"{where}: rank {rank}, gradient of {name}"
            if got is None:
                raise Failure(f"{at} is None", "backward must return the gradient of "
                              "weight_shard and bias_shard (positions 2 and 3).")
            diff = first_difference(_chunk(full, rank, p), got, _close)
            if diff is not None:
                wrong.append((name, at, diff))
        if not wrong:
            continue
        name, at, (i, e, g) = wrong[0]
        last = len(widths) - 2
        if math.isclose(g, e * p, rel_tol=1e-4) and p > 1:
            hint = "reduce-scatter sums over ranks: divide by N for the mean over the ranks' batches."
        elif all(not n.endswith(f"layer {last}") for n, *_ in wrong):
            hint = (f"layer {last}'s gradients are right, earlier layers' are not: what "
                    "reaches them is the gradient your backward returns for x.")
        else:
            hint = ("backward: grad_W = grad_yᵀ x, grad_b = grad_y summed over the batch, "
                    "each rank keeps its chunk of their mean over ranks.")
        raise Failure(f"{at}, element {i}: expected {num(e)}, got {num(g)}", hint)


def _zero3_memory_hint(kept):
    """The hint for a ZeRO-3 over its memory budget: what the graph showed is kept."""
    if "saved" in kept:
        cause = ("forward saves a gathered weight for backward (save_for_backward): every "
                 "layer's whole weight then stays alive until its backward runs. Backward "
                 "can gather it again from what you save instead.")
    elif "ctx" in kept:
        cause = ("forward keeps a gathered weight as an attribute of ctx: like a saved "
                 "tensor, it stays alive until backward, for every layer. Backward can "
                 "gather it again.")
    else:
        cause = ("no gathered weight is saved for backward, yet more than one layer's worth "
                 "is alive at once: look for a gathered weight or gradient that outlives the "
                 "layer that needs it (kept in a list, on the module, or a global), or a "
                 "full gradient kept after its reduce-scatter.")
    return f"{cause} {hint.pointer('zero3')}"


@check("ZeRO-3")
def check_zero3(fn):
    """``fn``, an autograd function ``fn.apply(x, weight_shard, bias_shard, out, in)``:
    outputs and shard gradients of a three-layer MLP equal the whole model's on world
    sizes 1–4; on 4 ranks, the peak memory of forward and backward above the shards is at
    most (× 1.25) the reference's, which gathers one layer at a time."""
    ref = _reference()
    refuse_reference(fn, ref.ZeRO3Linear, "class")
    for p in WORLD_SIZES:
        run, where = _run_zero3(fn, ZERO3_WIDTHS, p)
        _compare_zero3(run, where, ZERO3_WIDTHS, p)
    mine, where = _run_zero3(fn, MEMORY_WIDTHS, 4, measure=True)
    theirs, _ = _run_zero3(ref.ZeRO3Linear, MEMORY_WIDTHS, 4, measure=True)

    def above(run):
        return [run.peak_memory(r)["total"] - run.results[r]["start"] for r in range(4)]

    target = max(above(theirs))
    layer = 4 * (MEMORY_WIDTHS[1] * MEMORY_WIDTHS[2] + MEMORY_WIDTHS[2])
    budget(where, "memory", above(mine), target, "one gathered layer and its gradient",
           _zero3_memory_hint({r["kept"] for r in mine.results}),
           "in forward and backward, above the shards, the reference")
    peak = max(above(mine))
    return (f"outputs and gradient shards equal the whole model's on world sizes "
            f"{listed(WORLD_SIZES)}; peak {num(peak)} bytes above the shards on 4 ranks, "
            f"{peak / layer:.1f}× one layer's parameters")


# ------------------------------------------------------------- exercise 4: the table

# The ZeRO paper's Figure 1 / Table 1 cell: Ψ = 7.5B, N_d = 64, K = 12 (GB per GPU,
# rounded to 0.1 by the paper; see docs/reference-numbers.md).
PAPER = {0: 120.0, 1: 31.4, 2: 16.6, 3: 1.9}
FORMULA_CASES = ((7.5e9, 1), (1.5e9, 8), (7.5e9, 64), (175e9, 1024), (1e9, 3))


def _said(value):
    return num(value) if number(value) is not None else short(repr(value), 60)


def _table_hint(got, psi, n, stage, k):
    """Why a cell of the ZeRO table is off: K taken as 12, rounding, or values that do not
    follow the formula outside the paper's cell (a table written out by hand)."""
    got, ref = number(got), _reference()
    if got is not None and k != 12 and math.isclose(got, ref.zero_memory_gb(psi, n, stage),
                                                    rel_tol=1e-6):
        return "use k (not 12) for the optimizer state."
    if got is not None and abs(got - ref.zero_memory_gb(psi, n, stage, k)) <= 0.051:
        return "don't round: return the GB the formula gives."
    return ("your values do not follow the formula for this model and GPU count: compute "
            "2Ψ + 2Ψ + KΨ bytes from the arguments (psi, n_d, k), dividing by n_d what the "
            "stage shards, rather than from the paper's table.")


@check("ZeRO memory table")
def check_zero_memory(fn):
    """``fn(psi, n_d, stage, k=12)``: GB of model states per GPU; the paper's cell for
    Ψ = 7.5B on 64 GPUs (to its rounding), and the formula on other models, GPU counts
    and K = 12 or 16."""
    ref = _reference()
    refuse_reference(fn, ref.zero_memory_gb)
    for stage, paper in PAPER.items():
        where = f"Ψ = 7.5B, N_d = 64, stage {stage}"
        got = on_a_rank(fn, (7.5e9, 64, stage), where)
        if number(got) is None or not abs(number(got) - paper) <= 0.05:
            raise Failure(f"{where}: you said {_said(got)}, the paper's table says {paper} GB",
                          "per parameter: 2 bytes of fp16 parameters, 2 of fp16 "
                          "gradients, K = 12 of optimizer state (fp32 parameters, momentum, "
                          "variance); stage 1 divides the optimizer state by N_d, stage 2 "
                          "the gradients too, stage 3 the parameters too. 1 GB = 1e9 "
                          "bytes.")
    for psi, n in FORMULA_CASES:
        for k in (12, 16):
            for stage in range(4):
                where = f"Ψ = {num(psi)}, N_d = {n}, K = {k}, stage {stage}"
                got = on_a_rank(fn, (psi, n, stage, k), where)
                expected = ref.zero_memory_gb(psi, n, stage, k)
                if number(got) is None or not math.isclose(number(got), expected,
                                                                         rel_tol=1e-6):
                    raise Failure(f"{where}: you said {_said(got)} GB, expected "
                                  f"{num(expected)}", _table_hint(got, psi, n, stage, k))
    return ("120 / 31.4 / 16.6 / 1.9 GB for 7.5B on 64 GPUs, and the formula on "
            f"{len(FORMULA_CASES) * 8} other cells")


# ------------------------------------------------------------- exercise 5: fit settings

# The learner's step may be 2 % slower than the fastest that fits: tighter than the 4.3 %
# by which ZeroRedundancyOptimizer trails fully_shard without resharding at Ψ = 5B (the
# closest pair; the next is 10.7 %), so guessing 'less sharding is faster' fails.
FIT_TOLERANCE = 1.02
# Widths d of blocks Linear(d, 4d) · ReLU · Linear(4d, d), no bias: on 4 GPUs, the fastest
# settings that fit keep whole parameters, shard them, offload them, offload and reshard.
FIT_CASES = (12_500, 18_114, 20_156, 24_367)
# (width, GPU memory, host memory per GPU, as fractions of a DGX A100's and of what offload
# keeps on the host, 16Ψ/N): where the host decides (offload would fit the GPU, but the
# host cannot hold the shards: nothing fits) and where a smaller GPU does. Judged against
# the reference's estimate, not simulated (the simulated cluster has the DGX's memory).
# Every estimate that fits in these cases and in FIT_CASES leaves at least 8 % free (the
# host's too, with the measured 17.5Ψ/N), so no margin, or any up to 8 %, gives the answer.
FIT_LIMITS = ((20_156, 1.0, 0.9), (24_367, 1.0, 0.9), (12_500, 0.5, 2.0), (18_114, 0.4, 2.0))
SETTINGS_HINT = ("return a dict with keys 'stage' (0: DDP, 1: DDP with "
                 "ZeroRedundancyOptimizer, 3: fully_shard), 'reshard_after_forward' and "
                 "'offload' (bools; fully_shard's options, so False with stages 0 and 1).")


def _valid_settings(settings, where):
    keys = {"stage", "reshard_after_forward", "offload"}
    if not isinstance(settings, dict) or set(settings) != keys:
        raise Failure(f"{where}: returned {settings!r}", SETTINGS_HINT)
    stage = settings["stage"]
    if stage == 2:
        raise Failure(f"{where}: stage 2", "torch has no ZeRO-2 of its own: fully_shard "
                      "with reshard_after_forward=False keeps whole parameters from forward "
                      "to backward, as ZeRO-2 does (FSDP1 called it SHARD_GRAD_OP). Say "
                      "stage 3 with that option.")
    if stage not in (0, 1, 3):
        raise Failure(f"{where}: stage {stage!r}", SETTINGS_HINT)
    if stage != 3 and (settings["offload"] or settings["reshard_after_forward"]):
        raise Failure(f"{where}: stage {stage} with fully_shard's options", SETTINGS_HINT)
    return {k: (v if k == "stage" else bool(v)) for k, v in settings.items()}


def _describe(settings):
    if settings["stage"] < 3:
        return "DDP" + (" + ZeroRedundancyOptimizer" if settings["stage"] else "")
    return (f"fully_shard(reshard_after_forward={settings['reshard_after_forward']}"
            + (", CPUOffloadPolicy()" if settings["offload"] else "") + ")")


def _nothing_fits(where, got, psi, gpu_memory, host_memory):
    """The ❌ for settings returned where nothing fits, naming the memory that binds for
    them: the host (offload's 16Ψ/N of shards) or the GPU (the table's peak)."""
    a, b, c = _reference()._BYTES[(got["stage"], got["reshard_after_forward"], got["offload"])]
    peak = a * psi + b * psi / FIT_WORLD + c * psi / FIT_BLOCKS
    shards = 16 * psi / FIT_WORLD
    if got["offload"] and shards > host_memory:
        return Failure(f"{where}: returned {_describe(got)}, but nothing fits (the host is "
                       f"too small: offload keeps 16Ψ/N = {shards / 1e9:.1f} GB of shards there)",
                       "what does offload keep on the host, and is there room for it? Return "
                       "None when nothing fits.")
    return Failure(f"{where}: returned {_describe(got)}, but nothing fits (the GPU is too "
                   f"small: the table gives that setting a peak of {peak / 1e9:.1f} GB on the GPU)",
                   "estimate each setting's peak on the GPU with the table's bytes per "
                   "parameter (offload too keeps blocks there: measure it with fit_memory). "
                   "Return None when nothing fits.")


@functools.cache
def _best(width):
    spec = sc.Cluster.preset("dgx-a100").spec
    best = _reference().fit_settings(fit_psi(width), FIT_BLOCKS, FIT_WORLD,
                                     spec.device_of(0).memory, spec.host_share(0)[0])
    return best, fit_time(width, best)


@check("fit settings")
def check_fit_settings(fn):
    """``fn(psi, blocks, world_size, gpu_memory, host_memory)`` returns settings; for four
    models that run out of memory under DDP on 4 GPUs of a DGX A100, the learner's
    settings fit and their simulated step is within 2 % of the fastest settings that fit."""
    refuse_reference(fn, _reference().fit_settings)
    spec = sc.Cluster.preset("dgx-a100").spec
    gpu, host = spec.device_of(0).memory, spec.host_share(0)[0]
    worst = 0.0
    for width in FIT_CASES:
        psi = fit_psi(width)
        where = f"Ψ = {psi / 1e9:.2f}B in {FIT_BLOCKS} blocks on {FIT_WORLD} GPUs"
        settings = _valid_settings(
            on_a_rank(fn, (psi, FIT_BLOCKS, FIT_WORLD, gpu, host), where), where)
        best, best_time = _best(width)
        try:
            mine = best_time if settings == best else fit_time(width, settings)
        except sc.OutOfMemoryError as error:
            tried = re.search(r"Tried to allocate [\d.,]+ \w+", str(error))
            raise Failure(f"{where}: {_describe(settings)} ran out of memory"
                          + (f" ({tried.group(0)})" if tried else ""),
                          "estimate the peak with the table of bytes per parameter above "
                          "the exercise (DDP: 20Ψ and a block's buckets; offload moves the "
                          "16Ψ/N of shards to the host but keeps gathered blocks on the GPU), "
                          "or measure it with fit_memory.") from None
        worst = max(worst, within_best(
            where, mine, best_time, FIT_TOLERANCE,
            f"{_describe(settings)} fits, and its step takes",
            f"the {seconds(best_time)} of {_describe(best)}",
            "which settings send more bytes per step, copy over PCIe or run Adam on the "
            "CPUs, and which shrink the optimizer step? Measure the candidates with "
            "fit_time."))
    for width, gpu_part, host_part in FIT_LIMITS:
        psi = fit_psi(width)
        gpu_memory, host_memory = gpu * gpu_part, 16 * psi / FIT_WORLD * host_part
        where = (f"Ψ = {psi / 1e9:.2f}B in {FIT_BLOCKS} blocks on {FIT_WORLD} GPUs of "
                 f"{gpu_memory / 1e9:.1f} GB, {host_memory / 1e9:.1f} GB of host memory each")
        got = on_a_rank(fn, (psi, FIT_BLOCKS, FIT_WORLD, gpu_memory, host_memory), where)
        got = None if got is None else _valid_settings(got, where)
        want = _reference().fit_settings(psi, FIT_BLOCKS, FIT_WORLD, gpu_memory, host_memory)
        if got == want:
            continue
        if want is None:
            raise _nothing_fits(where, got, psi, gpu_memory, host_memory)
        if got is None:
            raise Failure(f"{where}: returned None, but {_describe(want)} fits",
                          "estimate each candidate's peak against gpu_memory.")
        raise Failure(f"{where}: returned {_describe(got)}; {_describe(want)} fits and is "
                      "faster", "estimate the peaks against this gpu_memory, not a DGX's.")
    return (f"the {len(FIT_CASES)} models fit, each step within {worst - 1:.1%} of the "
            f"fastest settings that fit; right on {len(FIT_LIMITS)} cases where the host "
            "or the GPU memory decides")
