"""Tensor and sequence parallelism with torch's DTensor, measured: what lesson 06 imports.

The lab asks you to write the f/g operators, column- and row-parallel linear layers, the
Megatron MLP and the sequence-parallel LayerNorm region yourself, so none of them is here.
What is here is what the lesson measures with torch's own ``parallelize_module``:

* the model: :class:`Block`, one GPT-style transformer layer in the shape Korthikanti et
  al. (2022) count (LayerNorm → self-attention with an explicit softmax → dropout →
  residual; LayerNorm → MLP with GeLU → dropout → residual), with separate ``wq``, ``wk``,
  ``wv``, ``wo`` projections so that attention heads can be split across ranks;
* :func:`tp_plan`, the layer's tensor-parallel plan for ``parallelize_module``, with or
  without sequence parallelism (the plan torchtitan uses for its LLaMA layers);
* :func:`layer_step`, the function every rank runs: one forward and backward of the
  parallelized layer, recording what it communicates and the activation memory it keeps;
  :func:`measure_layer` runs it on a cluster and returns a :class:`LayerReport`;
* :class:`TinyLM` and :func:`vocab_parallel_step`: a vocabulary-parallel embedding and
  LM head, and the cross-entropy on sharded logits with ``loss_parallel()``;
* :func:`allreduce_time`, one all-reduce on tensor-parallel groups placed inside a node or
  across nodes;
* the published formulas (docs/reference-numbers.md, "Tensor-parallel communication" and
  "Activation memory"): :func:`tp_comm_elements` (Narayanan et al. 2021) and
  :func:`activation_bytes` (Korthikanti et al. 2022).
"""

import contextlib
import math
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard
from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput,
                                               RowwiseParallel, SequenceParallel,
                                               loss_parallel, parallelize_module)

import simcluster as sc
from workbook.formulas import tp_comm_elements  # noqa: F401 (shared with lesson 13's drills)
from workbook.models import MLP, Attention, Block, activation_bytes, tp_plan  # noqa: F401

# ------------------------------------------------------------------------- the model


# ---------------------------------------------------------------- measuring a layer


def layer_step(hidden=64, heads=8, seq=32, batch=2, sequence_parallel=False, dropout=0.0,
               dtype=torch.float32, fake=False, parallel=True, prepare_inputs=True, seed=0,
               backward=True):
    """What every rank runs: one forward and backward of :class:`Block` (the forward
    only if not ``backward``: enough to measure activation memory).

    The layer is parallelized over all ranks with :func:`tp_plan` (``sequence_parallel``,
    ``prepare_inputs``), unless ``parallel`` is False: then every rank runs the whole
    layer, the single-process reference. The input ``x`` (``batch × seq × hidden``, from
    ``seed + 1``) needs its gradient, as it does inside a deep model; with sequence
    parallelism each rank gets its ``seq / t`` positions. Barriers mark where the forward
    and the backward start and where the backward ends, so that their collectives can be
    told apart in ``run.collectives``. With ``fake`` the tensors have shapes but no data
    (:func:`simcluster.fake_tensors`).

    Returns a dict with ``activations``: the bytes the forward allocated and still holds
    for the backward (the output, which the next layer would count as its input, stands
    in for the input, which this layer keeps). Real runs with a backward add ``out``,
    ``x_grad`` (this rank's), ``grads`` (``{name: full gradient}``) and ``shards``
    (``{name: shape of this rank's part}``).
    """
    rank, t = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (t,))        # before fake mode: it reads real values
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        model = Block(hidden, heads, dropout, seed, dtype)
        if parallel:
            parallelize_module(model, mesh, tp_plan(sequence_parallel, prepare_inputs))
        g = torch.Generator().manual_seed(seed + 1)
        x = torch.randn(batch, seq, hidden, generator=g, dtype=dtype)
        if parallel and sequence_parallel:
            x = x.chunk(t, dim=1)[rank]
        x.requires_grad_()
        dist.barrier()                           # the forward starts here
        before = sum(sc.memory_in_use().values())
        out = model(x)
        held = sum(sc.memory_in_use().values()) - before
        dist.barrier()                           # the backward starts here
        if backward:
            out.sum().backward()
        dist.barrier()                           # the backward has ended
    if fake or not backward:
        return {"activations": held}
    # the replicated LayerNorms' gradients are plain tensors, the sharded ones DTensors
    full = {name: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad).detach().clone()
            for name, p in model.named_parameters()}
    shards = {name: tuple((p.to_local() if isinstance(p, DTensor) else p).shape)
              for name, p in model.named_parameters()}
    return {"out": out.detach().clone(), "x_grad": x.grad.clone(), "grads": full,
            "shards": shards, "activations": held}


@dataclass
class LayerReport:
    """One layer's forward and backward on rank 0 of a tensor-parallel group.

    Attributes:
        t: the tensor-parallel size (the number of ranks).
        forward, backward: the :class:`~simcluster.CollectiveRecord` lists of each pass.
        bytes_sent: bytes rank 0 sent over the links in forward + backward, as the
            algorithm the cost model chose moves them (a ring all-reduce of ``n`` bytes
            sends ``2(t−1)/t·n`` from every rank).
        compute: simulated seconds rank 0 computed in forward + backward.
        activations: bytes the forward kept for the backward on rank 0.
        results: what :func:`layer_step` returned on every rank.
    """

    t: int
    forward: list
    backward: list
    bytes_sent: float
    compute: float
    activations: int
    results: list


def measure_layer(cluster, t, **kwargs):
    """Run :func:`layer_step` (``kwargs``) on ``t`` ranks of ``cluster``; return its
    :class:`LayerReport` and the :class:`~simcluster.Run`."""
    run = cluster.run(layer_step, world_size=t, kwargs=kwargs)
    barriers = [c for c in run.collectives if c.op == "barrier"]
    fwd_start, bwd_start, bwd_end = (c.end for c in barriers[-3:])
    passes = [c for c in run.collectives
              if c.op != "barrier" and fwd_start <= c.start < bwd_end]
    cost = run.recorder.cost
    sent = sum(nbytes for c in passes
               for src, _, nbytes in cost.traffic(c.op, c.algorithm, list(c.ranks), c.nbytes)
               if src == 0)
    compute = sum(min(e.end, bwd_end) - max(e.start, fwd_start) for e in run.clock(0).events
                  if e.lane == "compute" and e.end > fwd_start and e.start < bwd_end)
    report = LayerReport(t=t, forward=[c for c in passes if c.start < bwd_start],
                         backward=[c for c in passes if c.start >= bwd_start],
                         bytes_sent=sent, compute=compute,
                         activations=run.results[0]["activations"], results=run.results)
    return report, run


def _allreduce_in_group(ranks, nbytes):
    """Rank function: the ranks in ``ranks`` all-reduce ``nbytes`` of bf16 (no data)."""
    group = dist.new_group(ranks)                # every rank takes part in creating it
    if dist.get_rank() in ranks:
        dist.all_reduce(torch.empty(nbytes // 2, dtype=torch.bfloat16, device="meta"),
                        group=group)


def allreduce_time(cluster, ranks, nbytes):
    """Simulated seconds of one all-reduce of ``nbytes`` among the GPUs ``ranks`` of
    ``cluster``, a tensor-parallel group placed inside a node or across nodes."""
    run = cluster.run(_allreduce_in_group, world_size=max(ranks) + 1, args=(list(ranks), nbytes))
    return next(c for c in run.collectives if c.op == "all_reduce").duration


# ------------------------------------------------------------------- the formulas


def activation_bytes_simulated(s, b, h, a, t=1, sequence_parallel=False):
    """What :class:`Block` (bf16, dropout on) keeps on the simulator: Korthikanti et
    al.'s :func:`activation_bytes` plus what differs in torch's CPU kernels and DTensor.

    * Dropout on CPU keeps its mask in the activation's dtype (2 bytes per element, CUDA's
      fused kernel keeps 1 byte): one more byte for the two ``s·b·h`` masks (split over
      the ranks only with sequence parallelism) and for the ``a·s²·b`` attention mask.
    * LayerNorm keeps its per-position mean and 1/std (2 × 2 bytes × b·s per LayerNorm),
      which the paper leaves out.
    * With sequence parallelism, DTensor's linear layers keep the all-gathered input of
      the attention and of the MLP (2·s·b·h bytes each, on every rank), where Megatron-LM
      keeps only its own 1/t of it and all-gathers it again in the backward.
    """
    sp_split = t if sequence_parallel else 1
    masks = 2 * s * b * h / sp_split + a * s * s * b / t
    norm_statistics = 2 * 2 * 2 * b * s / sp_split
    gathered = 2 * 2 * s * b * h * (1 - 1 / t) if sequence_parallel else 0
    return activation_bytes(s, b, h, a, t, sequence_parallel) + masks + norm_statistics + gathered


# ------------------------------------------------- the vocabulary: embedding and loss


class TinyLM(nn.Module):
    """The two ends of a language model, no layers between: token embedding, a final
    LayerNorm and the output projection to ``vocab`` logits (the LM head)."""

    def __init__(self, vocab=1000, hidden=32, dtype=None, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, hidden, dtype=dtype)
        self.norm = nn.LayerNorm(hidden, dtype=dtype)
        self.head = nn.Linear(hidden, vocab, bias=False, dtype=dtype)

    def forward(self, tokens):
        return self.head(self.norm(self.emb(tokens)))


def vocab_parallel_step(vocab=1000, hidden=32, seq=16, batch=2, parallel=True, fake=False,
                        dtype=torch.float32):
    """What every rank runs: the cross-entropy loss of :class:`TinyLM` on random tokens
    (predicting each token itself; only the sizes matter), forward and backward.

    With ``parallel`` the embedding is split by vocabulary rows (``RowwiseParallel``:
    each rank looks up the tokens it owns, zeros elsewhere, and an all-reduce adds them
    up) and the LM head by vocabulary columns (``ColwiseParallel``, logits left sharded),
    and the loss runs under ``loss_parallel()``, on the sharded logits. Barriers mark the
    forward and the backward. Returns ``(loss or None if fake, bytes the forward holds)``.
    """
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        model = TinyLM(vocab, hidden, dtype)
        if parallel:
            parallelize_module(model, mesh, {
                "emb": RowwiseParallel(input_layouts=Replicate()),
                "head": ColwiseParallel(use_local_output=False)})
        tokens = torch.randint(0, vocab, (batch, seq), generator=torch.Generator().manual_seed(1))
        dist.barrier()                               # the forward starts here
        before = sum(sc.memory_in_use().values())
        with loss_parallel() if parallel else contextlib.nullcontext():
            # the loss in float32 whatever the model's dtype, as torchtitan computes it
            loss = F.cross_entropy(model(tokens).flatten(0, 1).float(), tokens.flatten())
            held = sum(sc.memory_in_use().values()) - before
            dist.barrier()                           # the backward starts here
            loss.backward()
        dist.barrier()
    if fake:
        return None, held
    return (loss.full_tensor() if parallel else loss).item(), held
