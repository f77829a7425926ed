"""Pipeline schedules run and measured on the simulated cluster: what lesson 05 imports.

The lab asks you to write GPipe and 1F1B yourself; the lesson shows GPipe written by hand
once (:func:`gpipe`) and then uses torch's own :mod:`torch.distributed.pipelining` for
everything else. What is here:

* :func:`gpipe`, the hand-written GPipe schedule one rank runs: every micro-batch
  forward, then every micro-batch backward, with ``send``/``recv`` between stages;
* :func:`pipeline_step`, the function every rank runs: build this rank's stage(s) of an
  MLP (equal or unequal, placed on any ranks), then run one training step with a
  schedule, either :func:`gpipe` (``"hand"``) or one of torch's
  (:data:`TORCH_SCHEDULES`), and record what each stage holds for backward;
  :func:`one_process_step` is the same step in one process, to compare gradients;
* :func:`measure` runs it on a cluster and returns a :class:`PipeReport` (measured bubble
  next to :func:`workbook.pipeline.bubble_formula`, step time, memory per stage, bytes
  sent); :func:`bubble_grid` measures a grid of stage and micro-batch counts, shown by
  :func:`grid_table`, :func:`draw_grid_table` and :func:`plot_grid`; :func:`compare`
  runs several of torch's schedules on one model, shown by :func:`schedule_table` and
  :func:`plot_timelines`.

Sizes. A tiny real model computes in microseconds of simulated time, and then the ~10 µs
latency of each point-to-point message, not the schedule, decides the idle time. The
measurements therefore use :func:`simcluster.fake_tensors` and a wide MLP (width 16,384,
1,024 rows per micro-batch): one stage's forward of one micro-batch takes tens of
milliseconds on an A100 in float32, its activation message a fraction of one.
"""

import contextlib
import inspect
from dataclasses import dataclass, field

import torch
import torch.distributed as dist
import torch.distributed.pipelining as pp
import torch.nn as nn

import simcluster as sc
from workbook import models
from workbook import pipeline

WIDTH = 16384      # features of every layer: compute per message large
ROWS = 1024        # rows of one micro-batch

# torch's schedules: name -> (class name in torch.distributed.pipelining, model chunks per
# rank, how chunks are placed: "loop" = rank r holds stages r, r+p, ...; "v" = r and 2p-1-r)
TORCH_SCHEDULES = {
    "GPipe": ("ScheduleGPipe", 1, "loop"),
    "1F1B": ("Schedule1F1B", 1, "loop"),
    "Interleaved1F1B": ("ScheduleInterleaved1F1B", 2, "loop"),
    "LoopedBFS": ("ScheduleLoopedBFS", 2, "loop"),
    "InterleavedZeroBubble": ("ScheduleInterleavedZeroBubble", 2, "loop"),
    "ZBVZeroBubble": ("ScheduleZBVZeroBubble", 2, "v"),
    "DualPipeV": ("ScheduleDualPipeV", 2, "v"),
}


def _mse(output, target):
    # torch's fused loss keeps only its two inputs for backward, no new tensor: what a
    # stage holds per micro-batch is the same on the last stage as on the others
    return nn.functional.mse_loss(output, target)


# ------------------------------------------------------------ GPipe, written by hand


def gpipe(stage, inputs, targets, shape, prev, next, loss_fn=_mse):
    """One GPipe training step on this rank: all forwards, then all backwards.

    Args:
        stage: this rank's part of the model.
        inputs: the ``m`` micro-batches (read on the first stage only).
        targets: their ``m`` targets (read on the last stage only).
        shape: the shape of the activation between stages (one micro-batch).
        prev, next: the ranks of the stages before and after this one, or None.
        loss_fn: ``loss_fn(output, target)``, on the last stage.

    Gradients add up in ``stage``'s parameters, each micro-batch's loss divided by their
    number (so they equal the gradient of the whole batch's mean loss, as torch's
    schedules compute). Returns the micro-batches' losses on the last stage, else [].
    """
    m = len(inputs)
    stash, losses = [], []
    for i in range(m):                                    # 1. every forward
        if prev is None:
            x = inputs[i].clone()
        else:
            x = torch.empty(shape)
            dist.recv(x, prev)                            # the activation from upstream
        x.requires_grad_()   # every stage, the first too: all stages do equal work
        y = stage(x)
        if next is None:
            y = loss_fn(y, targets[i]) / m
            losses.append(y.detach() * m)
        else:
            dist.send(y.detach(), next)                   # on to the next stage
        stash.append((x, y))                              # kept for backward
    for x, y in stash:                                    # 2. every backward, same order
        if next is None:
            y.backward()
        else:
            grad = torch.empty(shape)
            dist.recv(grad, next)                         # d loss / d y from downstream
            y.backward(grad)
        if prev is not None:
            dist.send(x.grad, prev)                       # d loss / d x upstream
    stash.clear()
    return losses


def source(fn=gpipe):
    """The source code of ``fn``, to print in the lesson."""
    return inspect.getsource(fn)


# ------------------------------------------------------------ one step on every rank


def stage_ranks(p, v=1, layout="loop"):
    """``[stage indices of rank 0, of rank 1, ...]`` for ``p`` ranks holding ``v`` stages each.

    ``"loop"``: rank ``r`` holds stages ``r, r + p, r + 2p, ...`` (Megatron's interleaving);
    ``"v"``: ``v = 2`` and rank ``r`` holds ``r`` and ``2p - 1 - r`` (the V shape of
    ZBV and DualPipe: the first and last stages on rank 0).
    """
    if layout == "v":
        if v != 2:
            raise ValueError(f"the V layout places exactly 2 stages per rank, not {v}")
        return [[r, 2 * p - 1 - r] for r in range(p)]
    return [[r + k * p for k in range(v)] for r in range(p)]


def _track_held(modules):
    """Sample this rank's memory after every forward of ``modules``.

    Returns a dict that fills in as the step runs: ``"held"``, the most bytes in use
    above the moment of the call (everything the stage keeps until backward, receive
    buffers included), and ``"stashed"``, the most bytes of the ``activations``
    category (what the modules' forwards keep for backward)."""
    start = sc.memory_in_use()
    base, base_stash = sum(start.values()), start["activations"]
    peaks = {"held": 0, "stashed": 0}

    def hook(*_):
        now = sc.memory_in_use()
        peaks["held"] = max(peaks["held"], sum(now.values()) - base)
        peaks["stashed"] = max(peaks["stashed"], now["activations"] - base_stash)

    for module in modules:
        module.register_forward_hook(hook)
    return peaks


def pipeline_step(schedule, m, width=WIDTH, rows=ROWS, layers=1, placement=None,
                  fake=True, seed=0):
    """On every rank: build this rank's stage(s) of an MLP, run one step of ``schedule``.

    Args:
        schedule: ``"hand"`` (:func:`gpipe`) or a name in :data:`TORCH_SCHEDULES`.
        m: micro-batches per step.
        width, rows: the MLP's width and the rows of one micro-batch.
        layers: ``Linear`` + ReLU blocks per stage: a number (equal stages), or one
            number per stage (stages of unequal cost).
        placement: ``placement[s]`` is the rank that runs stage ``s`` (hand-written GPipe
            only; default: stage ``s`` on rank ``s``); the ranks it leaves out return None.
        fake: under :func:`simcluster.fake_tensors` (shapes, no data) or real tensors.
        seed: the model's and the data's seed.

    Gradients are allocated before the step (as after a first step), so what the stage
    holds above its starting memory is what it keeps for backward; a barrier ends the
    set-up, so the step starts at the same time on every rank. Returns
    ``{"held": ..., "stashed": ...}`` (bytes, see :func:`_track_held`), ``"losses"`` (on
    the last stage), ``"grads"`` (real tensors only) and ``"stages"`` (this rank's).
    """
    rank = dist.get_rank()
    order = list(range(dist.get_world_size())) if placement is None else list(placement)
    if rank not in order:
        dist.barrier()
        return None                       # a rank the placement leaves out
    name, v, layout = TORCH_SCHEDULES.get(schedule, (None, 1, "loop"))
    n_stages = len(order) * v
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        counts = [layers] * n_stages if isinstance(layers, int) else list(layers)
        boundaries = [2 * sum(counts[:i + 1]) for i in range(n_stages - 1)]  # 2 modules a block
        parts = pipeline.split(models.mlp(width, sum(counts), seed), n_stages, boundaries)
        if schedule == "hand":
            mine = [order.index(rank)]
        else:
            mine = stage_ranks(len(order), v, layout)[rank]
        for s in mine:
            for param in parts[s].parameters():
                param.grad = torch.zeros_like(param)
        # the batch and its targets, only where the first and the last stage read them
        x = y = None
        if 0 in mine or n_stages - 1 in mine:
            generator = None if fake else torch.Generator().manual_seed(seed + 1)
            x = torch.randn(m * rows, width, generator=generator)
            y = torch.randn(m * rows, width, generator=generator)
        dist.barrier()                   # the step starts when every stage is built
        held = _track_held([parts[s] for s in mine])
        if schedule == "hand":
            s = mine[0]
            prev = None if s == 0 else order[s - 1]
            nxt = None if s == n_stages - 1 else order[s + 1]
            losses = gpipe(parts[s], x.chunk(m) if s == 0 else [None] * m,
                           y.chunk(m) if s == n_stages - 1 else [None] * m,
                           (rows, width), prev, nxt)
        else:
            losses = _torch_step(name, [parts[s] for s in mine], mine, n_stages, m, x, y,
                                 (rows, width))
        grads = [] if fake else [param.grad.detach().clone()
                                 for s in mine for param in parts[s].parameters()]
    return {**held, "losses": losses, "grads": grads, "stages": mine}


def one_process_step(n_stages, m, width, rows, layers=1, seed=0):
    """The step :func:`pipeline_step` (real tensors) computes, in one process on the whole
    batch: ``(the mean loss, [gradients of stage 0's parameters, of stage 1's, ...])``."""
    model = models.mlp(width, layers * n_stages, seed)
    generator = torch.Generator().manual_seed(seed + 1)
    x = torch.randn(m * rows, width, generator=generator)
    y = torch.randn(m * rows, width, generator=generator)
    loss = _mse(model(x), y)
    loss.backward()
    return loss.detach(), [[q.grad for q in part.parameters()]
                           for part in pipeline.split(model, n_stages)]


def _torch_step(name, modules, indices, n_stages, m, x, y, shape):
    """One step of torch's schedule ``name`` over this rank's stages; the losses.

    Each stage is told the ``shape`` of its input and output (one micro-batch), so torch
    skips its metadata-inference forward and backward; and the last stage does not keep
    every micro-batch's output for the caller (``return_outputs=False``): the step is
    the schedule's work and nothing else.
    """
    if 0 in indices:
        # the first stage computes its input's gradient too, as in gpipe(): equal stages
        modules[indices.index(0)].register_forward_pre_hook(
            lambda _, args: (args[0].detach().requires_grad_(),))
    stages = [pp.PipelineStage(module, s, n_stages, torch.device("cpu"),
                               input_args=torch.empty(shape, requires_grad=True),
                               output_args=torch.empty(shape, requires_grad=True))
              for module, s in zip(modules, indices)]
    cls = getattr(pp, name)
    schedule = cls(stages[0] if len(stages) == 1 else stages, n_microbatches=m, loss_fn=_mse)
    losses = []
    kwargs = {"return_outputs": False}
    if n_stages - 1 in indices:
        kwargs.update(target=y, losses=losses)
    if 0 in indices:
        schedule.step(x, **kwargs)
    else:
        schedule.step(**kwargs)
    return [loss.detach() for loss in losses]


# ------------------------------------------------------------------ measurements


@dataclass
class PipeReport:
    """One measured pipeline step.

    Attributes:
        schedule, p, m, v: what ran: the schedule, stages (ranks), micro-batches, model
            chunks per rank.
        bubble: measured, ``1 - compute / elapsed`` averaged over the pipeline's ranks.
        formula: :func:`workbook.pipeline.bubble_formula` ``(p, m, v)``.
        elapsed: simulated seconds of the step (from the barrier that ends the set-up).
        ranks: the ranks that ran the pipeline, in stage order.
        held, stashed: per pipeline rank, the most bytes it held above its start, and the
            most bytes of activations its forwards kept for backward (see
            :func:`pipeline_step`).
        blocks: per pipeline rank, the ``Linear`` + ReLU blocks it computes.
        activation_bytes: bytes of one activation between blocks (one micro-batch).
        bytes_sent: point-to-point bytes each pipeline rank sent.
        run: the :class:`simcluster.Run`, for its timeline and summary.
    """

    schedule: str
    p: int
    m: int
    v: int
    bubble: float
    formula: float
    elapsed: float
    ranks: list = field(repr=False)
    held: list = field(repr=False)
    stashed: list = field(repr=False)
    blocks: list = field(repr=False)
    activation_bytes: int = field(repr=False)
    bytes_sent: list = field(repr=False)
    run: object = field(repr=False)

    @property
    def stashed_micro_batches(self):
        """``stashed`` per rank in micro-batches: one micro-batch through one block keeps
        one activation (the ReLU's output) for backward."""
        return [b / (self.activation_bytes * n) for b, n in zip(self.stashed, self.blocks)]


def measure(cluster, schedule, p, m, layers=1, placement=None, world_size=None,
            width=WIDTH, rows=ROWS, fake=True, **run_kwargs):
    """Run one step of ``schedule`` with ``p`` stages and ``m`` micro-batches on ``cluster``.

    ``layers``, ``width``, ``rows`` and ``fake`` as for :func:`pipeline_step`. ``placement`` (hand-written GPipe) puts stage
    ``s`` on rank ``placement[s]``; with a ``world_size`` larger than ``p`` the other
    ranks do nothing. ``run_kwargs`` go to ``cluster.run`` (``link_factor``,
    ``speed_factor``, ...). Returns a :class:`PipeReport`.
    """
    v = TORCH_SCHEDULES.get(schedule, (None, 1, None))[1]
    ranks = list(range(p)) if placement is None else list(placement)
    run = cluster.run(pipeline_step, world_size=world_size or p, args=(schedule, m),
                      kwargs={"layers": layers, "placement": placement, "width": width,
                              "rows": rows, "fake": fake}, **run_kwargs)
    counts = [layers] * (p * v) if isinstance(layers, int) else list(layers)
    results = [run.results[r] for r in ranks]
    start = next(c.end for c in run.collectives if c.op == "barrier")
    return PipeReport(schedule, p, m, v, pipeline.bubble(run, ranks, since=start),
                      pipeline.bubble_formula(p, m, v), run.elapsed - start, ranks,
                      [res["held"] for res in results], [res["stashed"] for res in results],
                      [sum(counts[s] for s in res["stages"]) for res in results],
                      rows * width * 4, [run.bytes_sent[r] for r in ranks], run)


def bubble_grid(cluster, ps=(2, 4, 8), ms=(1, 4, 8, 16, 32), schedule="hand"):
    """``{(p, m): PipeReport}`` for every ``p`` in ``ps`` and ``m`` in ``ms``, with a
    progress bar (one run per pair)."""
    from workbook.outputs import progress

    pairs = [(p, m) for p in ps for m in ms]
    return {(p, m): measure(cluster, schedule, p, m)
            for p, m in progress(pairs, desc=f"{schedule} runs")}


def grid_table(grid):
    """The grid as text: per ``m`` a row, per ``p`` measured and formula side by side, and
    the largest gap between them."""
    ps = sorted({p for p, _ in grid})
    ms = sorted({m for _, m in grid})
    lines = [f"{'':>4}" + "".join(f"{f'p = {p}':^22}" for p in ps),
             f"{'m':>4}" + "".join(f"{'measured':>11}{'formula':>11}" for _ in ps)]
    for m in ms:
        lines.append(f"{m:>4}" + "".join(f"{grid[p, m].bubble:>11.1%}{grid[p, m].formula:>11.1%}"
                                         for p in ps))
    gap = max(grid.values(), key=lambda r: abs(r.bubble - r.formula))
    lines.append(f"largest gap: {gap.bubble - gap.formula:+.1%} of wall time "
                 f"(p = {gap.p}, m = {gap.m})")
    return "\n".join(lines)


def plot_grid(grid, ax=None):
    """Measured bubble (dots) against the formula (lines) over ``m``, one colour per ``p``.
    Returns the Axes; end the cell with ``plt.show()``."""
    import matplotlib.pyplot as plt

    ax = ax or plt.subplots(figsize=(6, 3.8))[1]
    ps = sorted({p for p, _ in grid})
    ms = sorted({m for _, m in grid})
    fine = [x / 4 for x in range(4 * ms[0], 4 * ms[-1] + 1)]
    for p in ps:
        line, = ax.plot(fine, [pipeline.bubble_formula(p, x) for x in fine], lw=1,
                        label=f"p = {p}: (p−1)/(m+p−1)")
        ax.plot(ms, [grid[p, m].bubble for m in ms], "o", color=line.get_color(),
                label=f"p = {p}: measured")
    ax.set(xscale="log", xticks=ms, xticklabels=[str(m) for m in ms], ylim=(0, 1),
           xlabel="micro-batches m", ylabel="bubble (fraction of wall time)",
           title="GPipe's bubble: measured vs formula")
    ax.legend(fontsize=7, ncol=2)
    return ax


def draw_grid_table(grid, ax):
    """The grid as a table drawn on ``ax`` (measured / formula per cell), to sit beside
    :func:`plot_grid`. Returns the Axes."""
    ps = sorted({p for p, _ in grid})
    ms = sorted({m for _, m in grid})
    cells = [[f"{grid[p, m].bubble:.1%} / {grid[p, m].formula:.1%}" for p in ps] for m in ms]
    ax.axis("off")
    table = ax.table(cells, rowLabels=[f"m = {m}" for m in ms],
                     colLabels=[f"p = {p}" for p in ps], loc="center", cellLoc="center")
    table.scale(1, 1.6)
    ax.set_title("bubble: measured / formula")
    return ax


def compare(cluster, names, p, m, blocks=None):
    """``{name: PipeReport}``: one step of each of torch's schedules ``names`` with ``p``
    ranks and ``m`` micro-batches, on the same model of ``blocks`` blocks (default
    ``2p``): a schedule with ``v`` chunks per rank cuts it into ``v·p`` stages."""
    from workbook.outputs import progress

    blocks = blocks or 2 * p
    reports = {}
    for name in progress(names, desc="schedules"):
        v = TORCH_SCHEDULES[name][1]
        reports[name] = measure(cluster, name, p, m, layers=blocks // (v * p))
    return reports


def schedule_table(reports, formula_for=("GPipe", "1F1B", "Interleaved1F1B")):
    """The reports of :func:`compare` as text: the bubble as a fraction of wall time, and
    as idle time over compute time next to the papers' ``(p - 1)/(v·m)`` (for
    ``formula_for``); step time, point-to-point bytes sent per rank, and the activations
    each rank stashed at most, in micro-batches."""
    lines = [f"{'schedule':<22}{'v':>2}{'bubble':>8}{'idle/compute':>14}{'(p-1)/(vm)':>12}"
             f"{'step':>10}{'p2p sent/rank':>15}  stashed per rank (micro-batches)"]
    for name, r in reports.items():
        paper = f"{(r.p - 1) / (r.v * r.m):>12.3f}" if name in formula_for else f"{'—':>12}"
        stashed = " ".join(f"{n:4.1f}" for n in r.stashed_micro_batches)
        lines.append(f"{name:<22}{r.v:>2}{r.bubble:>8.1%}{r.bubble / (1 - r.bubble):>14.3f}"
                     f"{paper}{r.elapsed * 1e3:>7.0f} ms"
                     f"{sum(r.bytes_sent) / len(r.ranks) / 2**30:>11.2f} GiB  {stashed}")
    return "\n".join(lines)


PHASE_COLORS = {"forward": "#8FB3E0", "backward": "#2F5597"}


def _phases(run, rank, start):
    """``{"forward": [(start, width), ...], "backward": [...]}`` in ms from ``start``
    (seconds): rank ``rank``'s compute, told apart by what ran (autograd's backward, or a
    module's forward)."""
    spans = {"forward": [], "backward": []}
    for e in run.clock(rank).events:
        if e.lane == "compute" and e.end > start:
            kind = "backward" if e.label == "(backward)" else "forward"
            spans[kind].append(((max(e.start, start) - start) * 1e3, (e.end - max(e.start, start)) * 1e3))
    return spans


def draw_phases(ax, run, start=0.0, ranks=None, legend=True):
    """The classic pipeline picture of ``run`` on ``ax``: per rank (one row each), forward
    compute light, backward dark, idle white, in ms from ``start`` (seconds). Lessons and
    labs use it so that 1F1B's alternation of forwards and backwards shows."""
    from matplotlib.patches import Patch

    ranks = list(range(run.world_size)) if ranks is None else list(ranks)
    for row, rank in enumerate(ranks):
        for kind, spans in _phases(run, rank, start).items():
            ax.broken_barh(spans, (row - 0.4, 0.8), color=PHASE_COLORS[kind], lw=0)
    ax.set(yticks=range(len(ranks)), ylim=(len(ranks) - 0.5, -0.5),
           yticklabels=[f"rank {r}" for r in ranks])
    ax.tick_params(axis="y", labelsize=7)
    if legend:
        ax.legend(handles=[Patch(color=c, label=k) for k, c in PHASE_COLORS.items()],
                  loc="lower right", bbox_to_anchor=(1, 1), ncol=2, fontsize=8, frameon=False)
    return ax


def plot_timelines(reports):
    """The classic pipeline picture of each report (:func:`draw_phases`), stacked on a
    shared time axis. Returns the figure; end the cell with ``plt.show()``.
    (``run.timeline()`` shows the same runs with messages.)"""
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(len(reports), 1, figsize=(10, 0.6 + 0.95 * len(reports)),
                             sharex=True, squeeze=False)
    for i, (ax, (name, report)) in enumerate(zip(axes[:, 0], reports.items())):
        draw_phases(ax, report.run, start=report.run.elapsed - report.elapsed,
                    ranks=report.ranks, legend=i == 0)
        ax.set_title(f"{name}: step {report.elapsed * 1e3:,.0f} ms, bubble {report.bubble:.0%}",
                     fontsize=9, loc="left")
    axes[-1, 0].set_xlabel("simulated time from the start of the step (ms)")
    fig.tight_layout()
    return fig
