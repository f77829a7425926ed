"""3D parallelism — data × pipeline × tensor — with torch's own APIs: what lesson 09 imports.

The three techniques of lessons 03-07, composed the way torchtitan composes them on one
``DeviceMesh`` of shape ``(pp, dp, tp)`` (tensor-parallel ranks adjacent, so a TP group
sits inside a node; pipeline stages outermost, so stages sit on different nodes):

1. **TP** inside each block: ``parallelize_module`` with lesson 06's plan
   (:func:`workbook.tensorparallel.tp_plan`) on the mesh's ``"tp"`` dimension;
2. optionally activation checkpointing of each block (full recomputation);
3. **DP** with FSDP2: ``fully_shard`` of each block and of the stage on the ``"dp"``
   dimension (the parameters become 2-D DTensors, sharded over dp and tp);
4. **PP**: the stage becomes a ``torch.distributed.pipelining.PipelineStage`` on the
   ``"pp"`` dimension's group, run by a schedule (1F1B by default).

What is here:

* :class:`GPT`, a small GPT (token and position embeddings, lesson 06's :class:`Block`
  layers, final LayerNorm, LM head) and :func:`stage_module`, the part one stage holds;
* :func:`make_mesh`, the ``(pp, dp, tp)`` mesh, with the TP groups inside or across nodes,
  and :func:`coordinates`, each rank's place in it;
* :func:`train_step`, what every rank runs; :func:`reference_step`, the same step in one
  process; :func:`measure` runs the 3D step on a cluster and returns a :class:`Report3D`;
* :func:`planner_config`, the :class:`simcluster.planner.TransformerConfig` of the same
  model, so that the planner's prediction can be set beside the measurement;
* :func:`explorer`, the planner's layouts as sliders, memory bars and a step-time
  breakdown (a widget in Jupyter; a fixed text and picture in a stored notebook).
"""

import contextlib
import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

import simcluster as sc
from workbook.tensorparallel import Block, tp_plan
from workbook.zero import MixedPrecisionAdam

MESH_DIMS = ("pp", "dp", "tp")
SCHEDULES = {"GPipe": "ScheduleGPipe", "1F1B": "Schedule1F1B"}

# ---------------------------------------------------------------------- the model


class GPT(nn.Module):
    """A small GPT: token and learned position embeddings, ``layers`` pre-LayerNorm
    :class:`~workbook.tensorparallel.Block` layers (biases, GeLU MLP of 4·hidden: the
    layer Narayanan et al. 2021 count, 12h² + 13h parameters), a final LayerNorm and an
    untied LM head. Layer ``i``'s parameters come from ``seed + 1 + i``, so every stage
    of a pipeline builds the same weights as the whole model does.

    Any of ``emb``, ``norm`` and ``head`` may be ``None`` (a pipeline stage without
    them): then the input is already the hidden state, or the output stays one.
    """

    def __init__(self, vocab=64, hidden=32, heads=4, layers=4, seq=16, dropout=0.0, seed=0,
                 dtype=None):
        super().__init__()
        torch.manual_seed(seed)
        self.emb = nn.Embedding(vocab, hidden, dtype=dtype)
        self.pos = nn.Embedding(seq, hidden, dtype=dtype)
        self.layers = nn.ModuleDict({str(i): Block(hidden, heads, dropout, seed + 1 + i, dtype)
                                     for i in range(layers)})
        torch.manual_seed(seed + 1 + layers)
        self.norm = nn.LayerNorm(hidden, dtype=dtype)
        self.head = nn.Linear(hidden, vocab, bias=False, dtype=dtype)

    def forward(self, x):
        if self.emb is not None:
            x = self.emb(x) + self.pos.weight[:x.shape[1]]
        for layer in self.layers.values():
            x = layer(x)
        if self.head is not None:
            x = self.head(self.norm(x))
        return x


def stage_module(model, stage, stages):
    """Cut ``model`` (a :class:`GPT`) down to pipeline stage ``stage`` of ``stages``: an
    equal share of the layers (``layers`` must divide by ``stages``), the embeddings on
    the first stage, the final norm and the head on the last. Returns ``model``."""
    n = len(model.layers)
    if n % stages:
        raise ValueError(f"{n} layers do not split into {stages} equal pipeline stages")
    keep = {str(i) for i in range(stage * n // stages, (stage + 1) * n // stages)}
    for name in [k for k in model.layers if k not in keep]:
        del model.layers[name]
    if stage > 0:
        model.emb = model.pos = None
    if stage < stages - 1:
        model.norm = model.head = None
    return model


def loss_fn(logits, targets):
    """Next-token cross-entropy, in float32 whatever the model's dtype."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())


# ---------------------------------------------------------------------- the mesh


def make_mesh(pp, dp, tp, tp_across_nodes=False):
    """The ``(pp, dp, tp)`` :class:`~torch.distributed.device_mesh.DeviceMesh` over ranks
    ``0 .. pp·dp·tp − 1`` (call it on every rank, before fake tensors).

    By default rank ``r`` sits at ``(r // (dp·tp), r // tp % dp, r % tp)``: the ranks of a
    TP group are adjacent, inside one node; the stages are farthest apart, on different
    nodes (what ``init_device_mesh("cpu", (pp, dp, tp))`` builds). With
    ``tp_across_nodes`` the same shape is filled with the TP dimension outermost: a TP
    group's ranks are ``pp·dp`` apart, on different nodes, and each stage's ranks share
    a node — the placement to avoid.
    """
    ranks = torch.arange(pp * dp * tp)
    if tp_across_nodes:
        ranks = ranks.reshape(tp, pp, dp).permute(1, 2, 0)
    return DeviceMesh("cpu", ranks.reshape(pp, dp, tp), mesh_dim_names=MESH_DIMS)


def coordinates(mesh):
    """This rank's ``{"pp": i, "dp": j, "tp": k}`` in ``mesh``."""
    return {name: mesh[name].get_local_rank() for name in MESH_DIMS}


def group_ranks(mesh):
    """The global ranks of this rank's group along each mesh dimension:
    ``{"pp": [...], "dp": [...], "tp": [...]}``."""
    return {name: dist.get_process_group_ranks(mesh[name].get_group()) for name in MESH_DIMS}


# ------------------------------------------------------------------ one training step


@contextlib.contextmanager
def _quiet_redistribute():
    # full_tensor() of a (dp, tp)-sharded gradient warns that it takes two all-gathers;
    # that is expected here and would only clutter the output
    logger = logging.getLogger("torch.distributed.tensor._redistribute")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def _batch(vocab, batch, seq, seed):
    """The step's tokens and next-token targets (``batch × seq`` each)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, vocab, (batch, seq + 1), generator=g)
    return tokens[:, :-1], tokens[:, 1:]


def train_step(pp, dp, tp, micro_batches=2, batch=8, model=None, schedule="1F1B",
               recompute=False, fake=False, dtype=torch.float32, steps=1, lr=1e-2,
               tp_across_nodes=False, seed=0):
    """What every rank runs: ``steps`` training steps of :class:`GPT` on a ``(pp, dp, tp)``
    mesh (see the module's docstring for the order TP → checkpointing → FSDP2 → PP).

    Args:
        pp, dp, tp: the mesh's shape; ``pp·dp·tp`` must be the world size.
        micro_batches: per data-parallel replica and step.
        batch: sequences per step, all replicas together (divisible by ``dp``, and
            each replica's share by ``micro_batches``).
        model: keyword arguments of :class:`GPT` (``vocab``, ``hidden``, ``heads``,
            ``layers``, ``seq``, ``dropout``).
        schedule: ``"1F1B"`` or ``"GPipe"`` (:data:`SCHEDULES`).
        recompute: checkpoint every block (full recomputation in the backward).
        fake: under :func:`simcluster.fake_tensors`: shapes, no data (for large sizes).
        dtype: the model's dtype; bfloat16 models train with
            :class:`~workbook.zero.MixedPrecisionAdam` (fp32 master weights), float32
            ones with plain SGD.
        steps: training steps; the last one is measured (the earlier ones warm up).
        tp_across_nodes: see :func:`make_mesh`.

    Barriers mark where the measured step starts and ends, and the peak memory is
    reset at its start (``run.peak_memory(rank)`` is then the measured step's). Returns
    ``{"coords", "groups" (see :func:`coordinates`, :func:`group_ranks`), "losses" (the
    last stage's, per micro-batch), "grads" and "params" (real tensors only:
    ``{name: full tensor}`` of this stage, gradients before the optimizer step)}``.
    """
    model = dict(model or {})
    mesh = make_mesh(pp, dp, tp, tp_across_nodes)      # before fake mode: reads real values
    coords, groups = coordinates(mesh), group_ranks(mesh)
    stage_index = coords["pp"]
    if batch % dp or (batch // dp) % micro_batches:
        raise ValueError(f"batch={batch} does not split into dp={dp} replicas of "
                         f"micro_batches={micro_batches} equal micro-batches")
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        stage = stage_module(GPT(dtype=dtype, seed=seed, **model), stage_index, pp)
        for name, block in list(stage.layers.items()):
            parallelize_module(block, mesh["tp"], tp_plan())
            if recompute:
                stage.layers[name] = checkpoint_wrapper(block, preserve_rng_state=False)
        # parameters and gradients stay in the model's dtype; the fp32 reduction is the
        # optimizer's business (MixedPrecisionAdam), as in lesson 07
        policy = {"mesh": mesh["dp"], "mp_policy": MixedPrecisionPolicy(reduce_dtype=dtype)}
        for block in stage.layers.values():
            fully_shard(block, **policy)
        fully_shard(stage, **policy)
        optimizer = (MixedPrecisionAdam(stage.parameters()) if dtype == torch.bfloat16
                     else torch.optim.SGD(stage.parameters(), lr=lr))
        pipe = pipelining.PipelineStage(stage, stage_index, pp, torch.device("cpu"),
                                        group=mesh["pp"].get_group())
        runner = getattr(pipelining, SCHEDULES[schedule])(pipe, n_microbatches=micro_batches,
                                                          loss_fn=loss_fn)
        vocab, seq = model.get("vocab", 64), model.get("seq", 16)
        replica = slice(coords["dp"] * batch // dp, (coords["dp"] + 1) * batch // dp)
        for step in range(steps):
            tokens, targets = _batch(vocab, batch, seq, seed + 1 + step)
            if step == steps - 1:
                dist.barrier()                  # the measured step starts here
                sc.reset_peak_memory()
            losses = []
            kwargs = {"target": targets[replica], "losses": losses} if stage_index == pp - 1 else {}
            runner.step(*([tokens[replica]] if stage_index == 0 else []), **kwargs)
            if step == steps - 1 and not fake:
                with _quiet_redistribute():
                    grads = {n: p.grad.full_tensor().clone() for n, p in stage.named_parameters()}
            optimizer.step()
            optimizer.zero_grad()
        dist.barrier()                          # ... and ends here
    result = {"coords": coords, "groups": groups,
              "losses": [] if fake else [loss.item() for loss in losses]}
    if not fake:
        with _quiet_redistribute():
            result["params"] = {n: p.full_tensor().detach().clone()
                                for n, p in stage.named_parameters()}
        result["grads"] = grads
    return result


def _plain_name(name):
    """A parameter's name in the whole :class:`GPT` (without checkpoint wrappers)."""
    return name.replace("_checkpoint_wrapped_module.", "")


def reference_step(chunks=4, batch=8, model=None, steps=1, lr=1e-2, seed=0):
    """The steps :func:`train_step` (float32, real tensors) computes, in one process:
    the whole :class:`GPT`, the whole batch in ``chunks`` equal micro-batches (``dp ×
    micro_batches`` of the 3D run: replica 0's first), the mean of their losses, plain SGD.

    Returns ``{"losses": the last step's loss per micro-batch, "grads", "params":
    {name: tensor}}`` after the last step (gradients before its update).
    """
    torch_model = GPT(seed=seed, **dict(model or {}))
    optimizer = torch.optim.SGD(torch_model.parameters(), lr=lr)
    vocab, seq = (model or {}).get("vocab", 64), (model or {}).get("seq", 16)
    for step in range(steps):
        tokens, targets = _batch(vocab, batch, seq, seed + 1 + step)
        losses = []
        for x, y in zip(tokens.chunk(chunks), targets.chunk(chunks)):
            losses.append(loss_fn(torch_model(x), y))
        # the mean over micro-batches of equal size is the whole batch's mean loss
        loss = torch.stack(losses).mean()
        optimizer.zero_grad()
        loss.backward()
        grads = {n: p.grad.detach().clone() for n, p in torch_model.named_parameters()}
        optimizer.step()
    return {"losses": [loss.item() for loss in losses], "grads": grads,
            "params": {n: p.detach().clone() for n, p in torch_model.named_parameters()}}
