"""Model parallelism, the naive split, measured: what lesson 04 imports.

The lab asks you to write the forward and backward of a split model with ``send``/``recv``
yourself, to balance stages and to count the bytes crossing a boundary; none of those
answers is here. What is here is the lesson's own demonstration, on fake tensors (shapes,
no data: :func:`simcluster.fake_tensors`) so that the model can be far larger than this
machine:

* :func:`big_mlp`, a 6.4 B-parameter MLP (24 ``Linear(16384, 16384)`` layers), and
  :func:`language_model`, equal blocks plus an output head as costly as four of them;
* :func:`naive_split_step`, the function every rank runs: build its stage of the model,
  forward with ``dist.recv``/``dist.send`` of activations, backward with the gradients
  sent back, one Adam step; :func:`run_naive_split` runs it, on any placement of the
  stages on a cluster's ranks;
* :func:`torch_pipeline_step`, the same step with torch's ``PipelineStage`` and
  ``ScheduleGPipe`` over one micro-batch;
* :func:`stream_forward`, micro-batches streamed through the stages (forward only), which
  runs at the pace of the slowest stage;
* measurements: :func:`sends` (point-to-point transfers read from the ranks' clocks),
  :func:`p2p_formula` (the α–β time of one message on the link between two ranks),
  :func:`layer_times` (forward compute per layer, from the simulator's module events) and
  :func:`stage_memory`.
"""

import torch
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc
from workbook import models, pipeline
from workbook.formulas import p2p_formula  # noqa: F401 (shared with lesson 13's drills)

WIDTH, DEPTH, BATCH = 16384, 24, 2048   # big_mlp: 24 x 268 M parameters; rows per batch


def big_mlp(width=WIDTH, depth=DEPTH):
    """:func:`workbook.models.mlp` of ``depth`` × ``Linear(width, width)`` + ReLU,
    on the meta device (no memory): 6.4 B parameters with the defaults."""
    with torch.device("meta"):
        return models.mlp(width, depth)


def language_model(width=2048, blocks=12, head_ratio=32):
    """A language-model-shaped stack on the meta device: ``blocks`` MLP blocks
    (``width`` → 4·``width`` → ``width``, 8·width² weights each) and an output head
    ``Linear(width, head_ratio·width)`` — with the default ratio 32 the head costs as
    much as four blocks (a vocabulary of 65,536 on a hidden size of 2,048)."""
    with torch.device("meta"):
        torch.manual_seed(0)
        layers = [nn.Sequential(nn.Linear(width, 4 * width), nn.ReLU(),
                                nn.Linear(4 * width, width)) for _ in range(blocks)]
        return nn.Sequential(*layers, nn.Linear(width, head_ratio * width))


def in_features(stage):
    """Features of the activation a stage receives: its first ``Linear``'s inputs."""
    return next(m for m in stage.modules() if isinstance(m, nn.Linear)).in_features


def _materialize(make_model, p, index, boundaries):
    """Stage ``index`` of ``p`` of the meta model ``make_model()``, given fake storage on
    this rank: only this stage's parameters take (simulated) memory. The peak memory
    starts afresh here: the meta model counted while it was being built, until the other
    stages were dropped."""
    stage = pipeline.split(make_model(), p, boundaries)[index]
    with sc.fake_tensors():
        stage.to_empty(device="cpu")
    sc.reset_peak_memory()
    return stage


def naive_split_step(make_model=big_mlp, batch=BATCH, boundaries=None, placement=None,
                     adam=True):
    """One training step of the naive split, on every rank (the function to
    ``cluster.run``).

    Stage ``i`` (of ``len(placement)``, cut by ``boundaries`` as in
    :func:`workbook.pipeline.split`) runs on global rank ``placement[i]`` (default: stage
    ``i`` on rank ``i``); other ranks do nothing. Forward: receive the activation from
    the previous stage, compute, send the output to the next. The last stage computes a
    stand-in loss (mean of squares) and runs backward; every other stage receives the
    gradient of its output, runs backward from it, and sends the gradient of its input
    back. Then an Adam step on each stage's parameters. Fake tensors throughout.
    """
    rank = dist.get_rank()
    placement = list(range(dist.get_world_size())) if placement is None else list(placement)
    if rank not in placement:
        return None
    i, p = placement.index(rank), len(placement)
    stage = _materialize(make_model, p, i, boundaries)
    with sc.fake_tensors():
        optimizer = torch.optim.Adam(stage.parameters()) if adam else None
        x = torch.empty(batch, in_features(stage))
        if i > 0:
            dist.recv(x, placement[i - 1])
            x.requires_grad_()            # so that backward fills x.grad, to send back
        out = stage(x)
        if i == p - 1:
            _square_mean(out, None).backward()
        else:
            dist.send(out.detach(), placement[i + 1])
            grad = torch.empty_like(out)
            dist.recv(grad, placement[i + 1])
            out.backward(grad)
        if i > 0:
            dist.send(x.grad, placement[i - 1])
        if optimizer is not None:
            optimizer.step()


def _square_mean(output, target):
    """The stand-in loss of the lesson's steps: the mean of the squared output."""
    return output.square().mean()


def torch_pipeline_step(make_model=big_mlp, batch=BATCH, micro_batches=1):
    """The same step with torch's own :mod:`torch.distributed.pipelining`: each rank wraps
    its stage in a ``PipelineStage`` and ``ScheduleGPipe`` runs forward and backward over
    ``micro_batches`` micro-batches (one: the naive split). No optimizer step. The stage
    is told its input and output shapes: without them it would infer them by running its
    forward once more before the step."""
    from torch.distributed import pipelining

    rank, p = dist.get_rank(), dist.get_world_size()
    stage = _materialize(make_model, p, rank, None)
    rows = batch // micro_batches
    out_features = [m for m in stage.modules() if isinstance(m, nn.Linear)][-1].out_features
    with sc.fake_tensors():
        piped = pipelining.PipelineStage(
            stage, rank, p, torch.device("cpu"),
            input_args=torch.empty(rows, in_features(stage), requires_grad=rank > 0),
            output_args=torch.empty(rows, out_features, requires_grad=True))
        schedule = pipelining.ScheduleGPipe(piped, n_microbatches=micro_batches,
                                            loss_fn=_square_mean)
        x = torch.empty(batch, in_features(stage))
        if rank == 0:
            schedule.step(x)
        elif rank == p - 1:
            schedule.step(target=torch.empty(batch, 1))
        else:
            schedule.step()


def run_naive_split(cluster, p=None, placement=None, **kwargs):
    """Run :func:`naive_split_step` with ``p`` stages on ranks ``0 … p-1``, or on the
    ranks ``placement``; returns the :class:`~simcluster.Run` (raises
    :class:`simcluster.OutOfMemoryError` when a stage does not fit)."""
    placement = list(range(p)) if placement is None else list(placement)
    return cluster.run(naive_split_step, world_size=max(placement) + 1,
                       kwargs={"placement": placement, **kwargs})


def stream_forward(make_model, micro_batches, batch, boundaries=None):
    """On every rank: ``micro_batches`` batches of ``batch`` rows flow through the stages,
    forward only (as in serving a split model). Each stage receives a batch, computes,
    and hands its output to the next stage with ``isend``, so it can start the next batch
    at once: once the stream is full every stage works, and the slowest sets the pace."""
    rank, p = dist.get_rank(), dist.get_world_size()
    stage = _materialize(make_model, p, rank, boundaries)
    with sc.fake_tensors(), torch.no_grad():
        pending = []
        for _ in range(micro_batches):
            x = torch.empty(batch, in_features(stage))
            if rank > 0:
                dist.recv(x, rank - 1)
            out = stage(x)
            if rank < p - 1:
                pending.append(dist.isend(out, rank + 1))
        for work in pending:
            work.wait()


# -------------------------------------------------------------------- measurements


def sends(run):
    """``{(src, dst): [simulated seconds of each transfer]}`` of a run's point-to-point
    messages, read from the sending ranks' communication streams."""
    found = {}
    for rank in range(run.world_size):
        for event in run.clock(rank).events:
            if event.lane == "comm" and event.label.startswith("send "):
                src, dst = (int(r) for r in event.label[5:].split("->"))
                if src == rank:
                    found.setdefault((src, dst), []).append(event.duration)
    return found


def layer_times(run, rank=0):
    """Forward compute seconds of each top-level layer that ran on ``rank``:
    ``{layer index: seconds}``, summed from the simulator's module events (labelled
    ``Sequential.<index>`` or ``Sequential.<index>.<sub-module>``). Backward is charged to
    ``(backward)`` as a whole, not per module."""
    times = {}
    for event in run.clock(rank).events:
        parts = event.label.split(".")
        if event.lane == "compute" and len(parts) > 1 and parts[1].isdigit():
            times[int(parts[1])] = times.get(int(parts[1]), 0.0) + event.duration
    return dict(sorted(times.items()))


def stage_memory(run, ranks):
    """Peak memory in GiB of each rank of ``ranks``, ``{rank: {category: GiB}}``."""
    return {r: {k: v / 2**30 for k, v in run.peak_memory(r).items()} for r in ranks}
