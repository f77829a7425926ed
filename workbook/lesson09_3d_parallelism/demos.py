"""3D parallelism — data × pipeline × tensor — with torch's own APIs: what lesson 09 imports.

The three techniques of lessons 03-07, composed the way torchtitan composes them on one
``DeviceMesh`` of shape ``(pp, dp, tp)`` (tensor-parallel ranks adjacent, so a TP group
sits inside a node; pipeline stages outermost, so stages sit on different nodes):

1. **TP** inside each block: ``parallelize_module`` with lesson 06's plan
   (:func:`workbook.models.tp_plan`) on the mesh's ``"tp"`` dimension;
2. optionally activation checkpointing of each block (full recomputation);
3. **DP** with FSDP2: ``fully_shard`` of each block and of the stage on the ``"dp"``
   dimension (the parameters become 2-D DTensors, sharded over dp and tp), gathered once
   per step and kept until its last backward (``reshard_after_forward=False``; the
   pipeline defers the gradients' reduce-scatter to the last micro-batch): between steps
   everything is sharded, during the step parameters and gradients are whole and only the
   optimizer state is sharded, ZeRO-1's memory (the planner's ``zero=1``);
4. **PP**: the stage becomes a ``torch.distributed.pipelining.PipelineStage`` on the
   ``"pp"`` dimension's group, run by a schedule (1F1B by default).

What is here:

* :class:`GPT`, a small GPT (token and position embeddings, lesson 06's :class:`Block`
  layers, final LayerNorm, LM head) and :func:`stage_module`, the part one stage holds;
* :func:`make_mesh`, the ``(pp, dp, tp)`` mesh, with the TP groups inside or across nodes,
  and :func:`coordinates`, each rank's place in it;
* :func:`train_step`, what every rank runs; :func:`reference_step`, the same step in one
  process; :func:`measure` runs the 3D step on a cluster and returns a :class:`Report3D`;
  :func:`compare_with_reference` sets the two side by side;
* reading a step: :func:`mesh_table` and :func:`draw_mesh` (who sits where),
  :func:`step_traffic` (collectives by mesh dimension), :func:`stage_phases`;
* :func:`planner_config`, the :class:`simcluster.planner.TransformerConfig` of the same
  model, and :func:`cross_check`, the planner's prediction beside the simulator's
  measurement (``tests/test_planner_vs_sim.py``, ``benchmarks/bench_planner_vs_sim.py``);
* :class:`Explorer`, the planner's layouts as sliders, memory bars and a step-time
  breakdown (a widget in Jupyter; a fixed text and picture in a stored notebook).
"""

import contextlib
import functools
import logging
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pipelining
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.distributed.tensor.parallel import parallelize_module
from torch.utils.checkpoint import checkpoint

import simcluster as sc
from workbook.models import Block, MixedPrecisionAdam, tp_plan

MESH_DIMS = ("pp", "dp", "tp")
SCHEDULES = {"GPipe": "ScheduleGPipe", "1F1B": "Schedule1F1B"}

# ---------------------------------------------------------------------- the model


class GPT(nn.Module):
    """A small GPT: token and learned position embeddings, ``layers`` pre-LayerNorm
    :class:`~workbook.models.Block` layers (biases, GeLU MLP of 4·hidden: the
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
               tp_across_nodes=False, seed=0, on_step=None):
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
            :class:`~workbook.models.MixedPrecisionAdam` (fp32 master weights), float32
            ones with plain SGD.
        steps: training steps; the last one is measured (the earlier ones warm up).
        tp_across_nodes: see :func:`make_mesh`.
        on_step: called by rank 0 once the model is built and after each step (for
            :func:`measure`'s progress bar).

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
        for block in stage.layers.values():
            parallelize_module(block, mesh["tp"], tp_plan())
            if recompute:
                # the block's own forward, checkpointed: its module hooks (FSDP2's) still
                # run around it, and its parameters keep their names
                block.forward = functools.partial(checkpoint, block.forward,
                                                  use_reentrant=False)
        # Gathered once per step, kept until the step's last backward: the pipeline runs
        # every micro-batch's forward through the same layers, and resharding after each
        # would all-gather them again per micro-batch (torchtitan's choice with PP too).
        # Gradients are reduced in the model's dtype; fp32 is MixedPrecisionAdam's business.
        policy = {"mesh": mesh["dp"], "reshard_after_forward": False,
                  "mp_policy": MixedPrecisionPolicy(reduce_dtype=dtype)}
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
        tick = on_step if on_step is not None and dist.get_rank() == 0 else lambda: None
        tick()                                  # the model is built
        for step in range(steps):
            tokens, targets = _batch(vocab, batch, seq, seed + 1 + step)
            if step == steps - 1:
                dist.barrier()                  # the measured step starts here
                sc.reset_peak_memory()
            losses = []
            kwargs = {"target": targets[replica], "losses": losses} if stage_index == pp - 1 else {}
            runner.step(*([tokens[replica]] if stage_index == 0 else []), **kwargs)
            if step == steps - 1 and not fake:
                # a local copy now, gathered after the measured step (full_tensor() would
                # add its all-gathers to the step)
                grads = {n: p.grad.clone() for n, p in stage.named_parameters()}
            optimizer.step()
            optimizer.zero_grad()
            tick()
        dist.barrier()                          # ... and ends here
    result = {"coords": coords, "groups": groups,
              "losses": [] if fake else [loss.item() for loss in losses]}
    if not fake:
        with _quiet_redistribute():
            result["params"] = {n: p.full_tensor().detach().clone()
                                for n, p in stage.named_parameters()}
            result["grads"] = {n: g.full_tensor() for n, g in grads.items()}
    return result


def compare_with_reference(report, steps=1):
    """Set a real-tensor float32 run of :func:`train_step` (``report``, a
    :class:`Report3D`) beside :func:`reference_step` on the same batch.

    Returns ``{"losses": the 3D run's micro-batch losses (replica 0's first),
    "reference_losses", "loss", "grad", "param": the largest absolute differences,
    "moved": the largest change of a parameter in the reference's step (so that a run
    that skipped its update cannot pass), "missing": reference parameters no stage
    returned}``.
    """
    last = sorted((r for r in report.results
                   if r["coords"]["pp"] == report.pp - 1 and r["coords"]["tp"] == 0),
                  key=lambda r: r["coords"]["dp"])       # one last stage per replica
    losses = [loss for r in last for loss in r["losses"]]
    ref = reference_step(chunks=len(losses), steps=steps)
    seen = {n for r in report.results for n in r["grads"]}
    before = dict(GPT().named_parameters())
    return {"losses": losses, "reference_losses": ref["losses"],
            "loss": max(abs(a - b) for a, b in zip(losses, ref["losses"])),
            "grad": max((g - ref["grads"][n]).abs().max().item()
                        for r in report.results for n, g in r["grads"].items()),
            "param": max((q - ref["params"][n]).abs().max().item()
                         for r in report.results for n, q in r["params"].items()),
            "moved": max((ref["params"][n] - q).abs().max().item() for n, q in before.items()),
            "missing": sorted(set(ref["grads"]) - seen)}


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


# ------------------------------------------------------------------ measured on a cluster


@dataclass
class Report3D:
    """One measured 3D training step.

    Attributes:
        pp, dp, tp: the mesh's shape.
        step_time: simulated seconds of the measured step (between its barriers).
        peak: bytes by category at the peak of the rank with the highest peak, plus
            ``"total"``; ``peaks`` the total per rank.
        bubble: ``1 − compute / step_time``, averaged over the ranks.
        results: what :func:`train_step` returned on every rank.
        run: the :class:`simcluster.Run`, for its timeline.
    """

    pp: int
    dp: int
    tp: int
    step_time: float
    peak: dict
    peaks: list = field(repr=False)
    bubble: float = 0.0
    results: list = field(default=None, repr=False)
    run: object = field(default=None, repr=False)

    @property
    def start(self):
        """Simulated time at which the measured step starts."""
        return [c.end for c in self.run.collectives if c.op == "barrier"][-2]


def measure(cluster, pp, dp, tp, progress=None, **kwargs):
    """Run :func:`train_step` (``kwargs``) on ``pp·dp·tp`` ranks of ``cluster``; return
    its :class:`Report3D`. ``progress``: a label for a progress bar over building the
    model and each step (a run takes seconds; the bar shows it is moving)."""
    from workbook import outputs, pipeline

    world = pp * dp * tp
    if progress is not None:
        bar = outputs.progress(range(kwargs.get("steps", 1) + 1), desc=progress)
        kwargs = {**kwargs, "on_step": lambda: bar.update(1)}
    try:
        run = cluster.run(train_step, world_size=world, args=(pp, dp, tp), kwargs=kwargs)
    finally:
        if progress is not None:
            bar.close()
    start, end = [c.end for c in run.collectives if c.op == "barrier"][-2:]
    peaks = [run.peak_memory(r) for r in range(world)]
    worst = max(peaks, key=lambda p: p["total"])
    bubble = pipeline.bubble(run, since=start) - (run.elapsed - end) / (end - start)
    return Report3D(pp, dp, tp, end - start, worst, [p["total"] for p in peaks], bubble,
                    run.results, run)


def planner_config(vocab=64, hidden=32, heads=4, layers=4, seq=16, dropout=0.0):
    """The :class:`simcluster.planner.TransformerConfig` of :class:`GPT` with these sizes
    (untied embeddings: the LM head has its own matrix)."""
    from simcluster import planner

    return planner.TransformerConfig(layers=layers, hidden=hidden, heads=heads, seq_len=seq,
                                     vocab=vocab, tied_embeddings=False, dropout=dropout > 0)


# ------------------------------------------------------------ reading a measured step


def _mesh_of(pp, dp, tp, tp_across_nodes):
    """Rank function: this rank's coordinates and groups (no training)."""
    mesh = make_mesh(pp, dp, tp, tp_across_nodes)
    return coordinates(mesh), group_ranks(mesh)


def mesh_table(cluster, pp, dp, tp, tp_across_nodes=False):
    """``[{"rank", "node", "pp", "dp", "tp", "tp group", "dp group", "pp group"}, ...]``:
    where :func:`make_mesh` puts every rank of ``cluster`` (one short run)."""
    run = cluster.run(_mesh_of, world_size=pp * dp * tp, args=(pp, dp, tp, tp_across_nodes),
                      accounting=False)
    return [{"rank": r, "node": cluster.spec.node_of(r), **coords,
             **{f"{dim} group": groups[dim] for dim in MESH_DIMS}}
            for r, (coords, groups) in enumerate(run.results)]


def step_traffic(report, rank=0):
    """What rank ``rank`` communicated in the measured step of ``report`` (a
    :class:`Report3D`), by mesh dimension: ``{(dimension, op): (calls, simulated
    seconds, largest bytes per call)}`` for its collectives, and ``("pp", "send")`` for
    the activations and gradients it sent to a neighbouring stage."""
    run, start = report.run, report.start
    end = [c.end for c in run.collectives if c.op == "barrier"][-1]
    groups = report.results[rank]["groups"]
    dims = {tuple(ranks): dim for dim, ranks in groups.items()}
    found = {}
    for c in run.collectives:
        if c.op == "barrier" or rank not in c.ranks or not start <= c.start < end:
            continue
        key = (dims.get(tuple(c.ranks), "other"),
               c.op.replace("_into_tensor", "").replace("_tensor", ""))
        calls, seconds, nbytes = found.get(key, (0, 0.0, 0))
        found[key] = (calls + 1, seconds + c.duration, max(nbytes, c.nbytes))
    sends = [e for e in run.clock(rank).events
             if e.lane == "comm" and e.label.startswith("send ") and start <= e.start < end]
    if sends:
        found[("pp", "send")] = (len(sends), sum(e.end - e.start for e in sends), None)
    return found


def stage_phases(report, rank):
    """Seconds rank ``rank`` spent in the measured step of ``report`` on ``{"forward",
    "backward", "other compute", "idle"}``: its compute split by what ran (a module's
    forward, the backward, the rest: the loss, the optimizer step), and the time its
    compute stream waited (for a collective, or for another stage's activations)."""
    start, end = report.start, [c.end for c in report.run.collectives if c.op == "barrier"][-1]
    phases = dict.fromkeys(("forward", "backward", "other compute", "idle"), 0.0)
    for e in report.run.clock(rank).events:
        if e.end <= start or e.start >= end:
            continue
        seconds = min(e.end, end) - max(e.start, start)
        if e.lane == "compute":
            kind = ("backward" if e.label.startswith("(backward") else
                    "other compute" if e.label in ("Global", "(slowed by communication)")
                    else "forward")
            phases[kind] += seconds
        elif e.lane == "idle":
            phases["idle"] += seconds
    return phases


# ------------------------------------------------------------------ the planner explorer

GiB = 2**30
#: Colours of the step-time terms and memory categories in :class:`Explorer`'s pictures.
TERM_COLORS = {"compute": "tab:blue", "recompute": "tab:cyan", "tp_communication": "tab:red",
               "pp_communication": "tab:pink", "bubble": "lightgray",
               "dp_communication": "tab:orange", "optimizer": "tab:green"}
TERM_NAMES = {"tp_communication": "TP comm", "pp_communication": "PP comm",
              "dp_communication": "DP comm", "optimizer": "optimizer step"}
# The explorer's memory categories, in colours none of the step's terms uses.
MEMORY_COLORS = {"parameters": "tab:purple", "gradients": "tab:brown",
                 "optimizer": "tab:olive", "activations": "goldenrod",
                 "workspace": "khaki", "other": "tab:gray"}
MEMORY_NAMES = {"optimizer": "optimizer state"}


def _stacked_bar(ax, parts, end, unit):
    """One horizontal bar of ``parts`` = ``[(label, value, colour)]`` on an axis from 0 to
    ``end``; a bar longer than that is cut at the edge, with its total written there."""
    left = 0.0
    for label, value, color in parts:
        ax.barh([0], [value], left=left, color=color, label=label)
        left += value
    ax.set(yticks=[], xlim=(0, end), ylim=(-0.6, 0.6))
    if left > end:
        ax.text(end, 0, f"{left:,.1f} {unit} →", ha="right", va="center", fontsize=9,
                fontweight="bold", color="white",
                bbox={"facecolor": "black", "alpha": 0.6, "lw": 0})


class Explorer:
    """The planner's estimate of one layout, with sliders to change it.

    ``Explorer(cfg, cluster, global_batch, tp=..., pp=..., dp=..., micro_batch=...,
    recompute=..., zero=...)`` shows :func:`simcluster.planner.estimate` of that layout:
    memory per GPU by category against the device's capacity, and the step time split
    into its terms. In Jupyter it is a widget (sliders for tp, pp, dp, micro-batch,
    recompute, ZeRO stage); a stored notebook keeps a text summary and a picture of the
    starting layout only, which depend on nothing but the arguments (strict nbval).
    """

    CHOICES = {"tp": (1, 2, 4, 8), "pp": (1, 2, 4, 8, 16), "dp": (1, 2, 4, 8, 16, 32, 64),
               "micro_batch": (1, 2, 4, 8), "recompute": ("none", "selective", "full"),
               "zero": (0, 1, 2, 3)}

    def __init__(self, cfg, cluster, global_batch, **layout):
        self.cfg, self.cluster, self.global_batch = cfg, cluster, global_batch
        self.layout = {"tp": 1, "pp": 1, "dp": 1, "micro_batch": 1, "recompute": "full",
                       "zero": 0, **layout}
        self._widget = None

    def estimate(self, **changes):
        """The planner's :class:`~simcluster.planner.Estimate` of the layout with
        ``changes``, or the ``ValueError`` message that says why it is not a layout."""
        from simcluster import planner

        try:
            return planner.estimate(self.cfg, self.cluster, global_batch=self.global_batch,
                                    **{**self.layout, **changes})
        except ValueError as error:
            return str(error)

    def text(self, est=None):
        """A few lines: the layout, step time, TFLOP/s, memory per GPU and the terms."""
        est = self.estimate() if est is None else est
        if isinstance(est, str):
            return f"not a layout: {est}"
        terms = ", ".join(f"{k.replace('_communication', ' comm')} {v * 1e3:,.0f} ms"
                          for k, v in est.breakdown.items() if v)
        return (f"tp={est.tp} pp={est.pp} dp={est.dp} micro-batch={est.micro_batch} "
                f"recompute={est.recompute} ZeRO-{est.zero}: step {est.step_time:.2f} s, "
                f"MFU {est.mfu:.1%}, {est.memory_per_gpu / GiB:.1f} GiB per GPU "
                f"({'fits' if est.fits else 'does NOT fit'} in "
                f"{est.device_memory / GiB:.0f} GiB)\n  {terms}")

    def figure(self, est=None):
        """Memory per GPU and the step time of ``est`` (default: the layout), one bar each.

        Both axes stay fixed while the sliders move, so that layouts compare by eye: memory
        up to twice the device's capacity, time up to 2.5 times the starting layout's step
        (a longer bar is cut at the edge and its total written there). A layout that does
        not fit is drawn in red. Each colour has one meaning across both panels."""
        import matplotlib.pyplot as plt

        est = self.estimate() if est is None else est
        fig, (mem, time) = plt.subplots(2, 1, figsize=(10, 3.2))
        if isinstance(est, str):
            fig.text(0.5, 0.5, est, ha="center", wrap=True)
            mem.axis("off")
            time.axis("off")
            return fig
        capacity = est.device_memory / GiB
        _stacked_bar(mem, [(MEMORY_NAMES.get(k, k), v / GiB, MEMORY_COLORS.get(k))
                           for k, v in est.memory.items()], 2 * capacity, "GiB")
        mem.axvline(capacity, color="black", ls="--", lw=1.2,
                    label=f"capacity ({capacity:.0f} GiB)")
        mem.set_xlabel("GiB per GPU (worst stage)")
        _stacked_bar(time, [(TERM_NAMES.get(k, k), v, TERM_COLORS.get(k))
                            for k, v in est.breakdown.items()], self._time_axis(), "s")
        time.set_xlabel("seconds per step")
        for ax in (mem, time):
            ax.legend(fontsize=8, loc="center left", bbox_to_anchor=(1.01, 0.5),
                      ncol=2 if ax is time else 1, frameon=False)
        verdict = "fits" if est.fits else "does NOT fit"
        if not est.fits:
            mem.set_facecolor("#fde0e0")
        fig.suptitle(f"tp={est.tp} pp={est.pp} dp={est.dp} mb={est.micro_batch} "
                     f"{est.recompute} ZeRO-{est.zero}: {est.step_time:.2f} s, "
                     f"MFU {est.mfu:.1%}, {est.memory_per_gpu / GiB:.1f} GiB: {verdict}",
                     fontsize=10, color="black" if est.fits else "tab:red")
        fig.tight_layout()
        return fig

    def _time_axis(self):
        """The step-time axis's end, fixed for this explorer: 2.5 times the starting
        layout's step (or 1 s when the starting layout is not one)."""
        start = self.estimate()
        return 2.5 * start.step_time if not isinstance(start, str) else 1.0

    def widget(self):
        """The sliders and the live pictures (built once), or None without ipywidgets."""
        if self._widget is None:
            try:
                import ipywidgets as widgets
            except ImportError:
                return None
            out = widgets.Output()
            controls = {name: widgets.SelectionSlider(options=options, description=name,
                                                      value=self.layout[name],
                                                      continuous_update=False)
                        for name, options in self.CHOICES.items()}

            def redraw(_=None):
                # set the Output's content directly (as workbook.quiz does): printing into
                # it needs a live front end, and would leak into the cell's stored outputs
                est = self.estimate(**{k: c.value for k, c in controls.items()})
                out.outputs = ({"output_type": "stream", "name": "stdout",
                                "text": self.text(est) + "\n"},
                               {"output_type": "display_data", "metadata": {},
                                "data": {"image/png": self._png(est), "text/plain": "(figure)"}})

            for control in controls.values():
                control.observe(redraw, names="value")
            redraw()
            self._widget = widgets.VBox([widgets.HBox(list(controls.values())[:3]),
                                         widgets.HBox(list(controls.values())[3:]), out])
        return self._widget

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {}
        widget = self.widget()
        if widget is not None:
            bundle.update(widget._repr_mimebundle_())
        bundle["image/png"] = self._png()
        bundle["text/plain"] = self.text()
        return bundle

    def _png(self, est=None):
        """:meth:`figure` as base64-encoded PNG (the figure is closed, not shown)."""
        import base64
        import io

        import matplotlib.pyplot as plt

        fig = self.figure(est)
        buffer = io.BytesIO()
        fig.savefig(buffer, format="png", bbox_inches="tight")
        plt.close(fig)
        return base64.b64encode(buffer.getvalue()).decode()


def draw_mesh(rows, ax=None, title=None):
    """Draw :func:`mesh_table`'s ``rows``: one box per node, one square per GPU, coloured
    by pipeline stage, labelled ``rank`` and ``(pp, dp, tp)``; the GPUs of one TP group
    are joined by a red line, each on its own level where groups would overlap (TP across
    nodes). Returns the Axes."""
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    if ax is None:
        _, ax = plt.subplots(figsize=(8, 2.4))
    nodes = sorted({row["node"] for row in rows})
    per_node = max(sum(row["node"] == node for row in rows) for node in nodes)
    placed = {}                     # node -> how many of its GPUs are placed so far
    x_of = {}                       # rank -> x: node n's slots start at n * (per_node + 0.6)
    for row in sorted(rows, key=lambda row: row["rank"]):
        slot = placed[row["node"]] = placed.get(row["node"], 0) + 1
        x_of[row["rank"]] = row["node"] * (per_node + 0.6) + slot - 1
    # one level per TP line, the lowest free one: lines that would overlap get their own
    levels = []                     # [(level, xs)] of the TP groups
    for row in rows:
        group = row["tp group"]
        if row["rank"] == group[0] and len(group) > 1:
            xs = sorted(x_of[r] for r in group)
            level = 0
            while any(lvl == level and xs[0] <= other[-1] and other[0] <= xs[-1]
                      for lvl, other in levels):
                level += 1
            levels.append((level, xs))
    bottom = -0.5 - 0.15 * max((lvl for lvl, _ in levels), default=0)
    for node in nodes:
        x0 = node * (per_node + 0.6) - 0.45
        ax.add_patch(Rectangle((x0, bottom - 0.1), per_node - 0.1, 0.85 - bottom, fill=False,
                               ls="--"))
        ax.text(x0 + 0.05, 0.6, f"node {node}", fontsize=8, va="center")
    colors = plt.get_cmap("tab10")
    for row in rows:
        x = x_of[row["rank"]]
        ax.add_patch(Rectangle((x - 0.4, -0.4), 0.8, 0.8, color=colors(row["pp"]), alpha=0.6))
        ax.text(x, 0.1, f"rank {row['rank']}", ha="center", fontsize=8)
        ax.text(x, -0.2, f"({row['pp']},{row['dp']},{row['tp']})", ha="center", fontsize=8)
    for level, xs in levels:
        ax.plot(xs, [-0.5 - 0.15 * level] * len(xs), color="tab:red", lw=2, marker="o", ms=3)
    ax.set(xlim=(-0.7, len(nodes) * (per_node + 0.6) - 0.3), ylim=(bottom - 0.2, 0.8),
           xticks=[], yticks=[])
    ax.set_title(title or "(pp, dp, tp) of every rank; colour: pipeline stage; red: a TP group",
                 fontsize=9, loc="left")
    return ax


# ------------------------------------------------------- the planner against the simulator

#: The cross-check's model: a 4-layer GPT of hidden 8,192 (3.2 B parameters), large enough
#: that its GEMMs, not the simulator's eager elementwise kernels, dominate a step.
CROSS_CHECK_MODEL = {"vocab": 512, "hidden": 8192, "heads": 64, "layers": 4, "seq": 2048}
#: The cross-check's layouts on 8 GPUs, ``(tp, pp, dp)`` as issue 13 writes them.
CROSS_CHECK_LAYOUTS = ((2, 2, 2), (1, 4, 2), (4, 1, 2))


def cross_check(cluster, layouts=CROSS_CHECK_LAYOUTS, model=CROSS_CHECK_MODEL,
                micro_batches=8, micro_batch=2):
    """The planner's prediction beside the simulator's measurement, per layout.

    Each ``(tp, pp, dp)`` layout runs :func:`train_step` on fake tensors (bf16,
    mixed-precision Adam, ``micro_batches`` micro-batches of ``micro_batch`` sequences per
    replica, the second step measured), and :func:`simcluster.planner.estimate` predicts
    it with ``efficiency=planner.ROOFLINE`` (kernels at the device's peaks, as the
    simulator charges them), ``recompute="none"`` and ``zero=1`` (FSDP2 under a pipeline
    holds whole parameters and gradients during a step, and a shard of the optimizer
    state). Returns ``[(layout, Report3D, Estimate), ...]``.
    """
    from simcluster import planner

    cfg = planner_config(**model)
    rows = []
    for tp, pp, dp in layouts:
        batch = dp * micro_batches * micro_batch
        report = measure(cluster, pp, dp, tp, micro_batches=micro_batches, batch=batch,
                         model=model, fake=True, dtype=torch.bfloat16, steps=2)
        est = planner.estimate(cfg, cluster, tp=tp, pp=pp, dp=dp, global_batch=batch,
                               micro_batch=micro_batch, recompute="none", zero=1,
                               efficiency=planner.ROOFLINE)
        rows.append(((tp, pp, dp), report, est))
    return rows
