"""``torch.distributed.pipelining`` on the simulator: every schedule of this torch, as a
learner writes it.

* On small real tensors each schedule's gradients and losses equal the single-process
  model's.
* Inside ``sc.fake_tensors()`` each schedule runs a model far larger than this machine
  (the warm-up vote and the stage metadata travel in small tensors torch reads back with
  ``.item()``; they used to stop with ``DataDependentOutputException``).
* What a pipeline lesson measures behaves as the textbook says: GPipe's activation
  memory grows with the number of micro-batches m, 1F1B's stays bounded by about p
  micro-batches, the bubble follows (p − 1)/(m + p − 1), and a device has one compute
  stream (DualPipeV's overlap of two micro-batches gains nothing here).
"""

import contextlib
import resource
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed import pipelining
from torch.distributed.pipelining import schedules

import simcluster as sc
from workbook.pipeline import bubble, bubble_formula

SCHEDULES = ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
             "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV")
GiB = 2**30


def test_these_are_all_the_schedules_of_this_torch():
    found = {n for n in dir(pipelining) if n.startswith("Schedule") and n != "ScheduleClass"}
    assert found - {"_ScheduleForwardOnly"} == set(SCHEDULES)


def stage_indices(schedule, rank, p):
    """The stages ``rank`` holds: one for GPipe/1F1B, two otherwise — looped (r, r + p)
    or, for the V schedules, (r, 2p − 1 − r)."""
    if schedule in ("ScheduleGPipe", "Schedule1F1B"):
        return [rank]
    if schedule in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV"):
        return [rank, 2 * p - 1 - rank]
    return [rank, rank + p]


def mse(output, target):
    return ((output - target) ** 2).mean()


def make_stage_module(index, width, layers):
    """Stage ``index`` of the model: ``layers`` of Linear + ReLU, seeded by its index so
    every rank (and the reference) builds the same weights."""
    torch.manual_seed(index)
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])


def run_schedule(schedule, m, width, rows, layers, fake=False, static=False):
    """On each rank: build its stages, run one ``step()`` of ``schedule`` over ``m``
    micro-batches of ``rows`` rows; return each stage's ``{index: gradients}`` and the
    last stage's losses. ``static`` gives PipelineStage the shapes (no metadata pass)."""
    r, p = dist.get_rank(), dist.get_world_size()
    indices = stage_indices(schedule, r, p)
    n = p * len(indices)
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        modules = [make_stage_module(i, width, layers) for i in indices]
        shapes = {}
        stages = []
        for module, i in zip(modules, indices):
            if static:
                shapes = {"input_args": torch.empty(rows, width, requires_grad=i > 0),
                          "output_args": torch.empty(rows, width, requires_grad=True)}
            stages.append(pipelining.PipelineStage(module, i, n, torch.device("cpu"), **shapes))
        cls = getattr(pipelining, schedule)
        step = cls(stages[0] if len(stages) == 1 else stages, n_microbatches=m, loss_fn=mse)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(m * rows, width, generator=g), torch.randn(m * rows, width, generator=g)
        losses = []
        step.step(*([x] if 0 in indices else []),
                  **({"target": y, "losses": losses} if n - 1 in indices else {}))
    if fake:
        return None
    return ({i: [q.grad.clone() for q in mod.parameters()] for i, mod in zip(indices, modules)},
            [loss.detach() for loss in losses])


# ---------------------------------------------------------------- real tensors: values
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_matches_the_single_process_model(schedule):
    p, m, width, rows, layers = 2, 4, 8, 2, 1
    run = sc.Cluster.preset("dgx-a100").run(run_schedule, world_size=p,
                                            args=(schedule, m, width, rows, layers))
    grads, losses = {}, []
    for rank_grads, rank_losses in run.results:
        grads.update(rank_grads)
        losses += rank_losses
    n = len(grads)
    model = nn.Sequential(*[make_stage_module(i, width, layers) for i in range(n)])
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(m * rows, width, generator=g), torch.randn(m * rows, width, generator=g)
    want = [mse(model(xc), yc) for xc, yc in zip(x.chunk(m), y.chunk(m))]
    (sum(want) / m).backward()   # the schedules scale each micro-batch's loss by 1/m
    torch.testing.assert_close(losses, [w.detach() for w in want])
    for i in range(n):
        for got, param in zip(grads[i], model[i].parameters()):
            torch.testing.assert_close(got, param.grad, msg=f"{schedule}: stage {i}")


# -------------------------------------------------------- fake tensors: a model too big
WIDTH, ROWS = 16384, 1024            # a Linear's weight is 1 GiB of fp32


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_runs_a_model_too_large_to_be_real(schedule):
    """4 ranks, each holding 4 GiB of weights: ~40 GiB of device memory simulated in all,
    none of it allocated; one compute stream per device."""
    p, m = 4, 8
    layers = 4 // len(stage_indices(schedule, 0, p))      # 4 layers per rank
    run = sc.Cluster.preset("dgx-a100").run(run_schedule, world_size=p,
                                            args=(schedule, m, WIDTH, ROWS, layers, True))
    peaks = [run.peak_memory(r) for r in range(p)]
    for r, peak in enumerate(peaks):
        assert peak["parameters"] == 4 * (WIDTH * WIDTH + WIDTH) * 4, f"rank {r}"
        assert peak["total"] > 8 * GiB, f"rank {r}: weights and gradients"
        assert run.category_peaks(r)["activations"] > 0, f"rank {r}"
    max_rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024   # Linux: KiB
    assert max_rss < sum(peak["total"] for peak in peaks) / 4
    for r in range(p):
        compute = sorted((e.start, e.end) for e in run.clock(r).events if e.lane == "compute")
        assert all(a[1] <= b[0] for a, b in zip(compute, compute[1:])), (
            f"rank {r}: two compute events overlap; a device has one compute stream")
    assert run.elapsed > 0


# ------------------------------------------------------ what a pipeline lesson measures
def _measure(schedule, m, p=4, layers=2):
    return sc.Cluster.preset("dgx-a100").run(
        run_schedule, world_size=p, args=(schedule, m, 8192, 1024, layers, True, True))


@pytest.fixture(scope="module")
def gpipe_and_1f1b():
    return {(s, m): _measure(s, m) for s in ("ScheduleGPipe", "Schedule1F1B") for m in (4, 8, 16)}


def test_gpipe_activations_grow_with_m_and_1f1b_activations_do_not(gpipe_and_1f1b):
    p = 4
    # what backward keeps of one micro-batch: each layer's ReLU output (the next Linear's
    # input; ReLU's backward reads it too), 2 layers × 1024 × 8192 fp32
    per_micro_batch = 2 * 1024 * 8192 * 4
    for r in range(p - 1):   # the last stage also keeps every micro-batch's output
        for m in (4, 8, 16):
            gpipe = gpipe_and_1f1b["ScheduleGPipe", m].category_peaks(r)["activations"]
            assert m * per_micro_batch <= gpipe <= (m + 1) * per_micro_batch, (r, m)
            one_f_one_b = gpipe_and_1f1b["Schedule1F1B", m].category_peaks(r)["activations"]
            assert one_f_one_b <= (p - r + 1) * per_micro_batch, (r, m)
        assert gpipe_and_1f1b["Schedule1F1B", 8].category_peaks(r)["activations"] == \
            gpipe_and_1f1b["Schedule1F1B", 16].category_peaks(r)["activations"]
    # the summary shows it: stage 0 of GPipe holds all 16 micro-batches, of 1F1B about p
    rows = {s: gpipe_and_1f1b[s, 16].summary().rows[0] for s in ("ScheduleGPipe", "Schedule1F1B")}
    assert rows["ScheduleGPipe"]["peak_activations_GiB"] > 3 * rows["Schedule1F1B"]["peak_activations_GiB"]


def test_the_bubble_follows_the_formula(gpipe_and_1f1b):
    """With the stage shapes given (no metadata pass on the first step) and compute that
    dwarfs communication, the middle stages idle (p − 1)/(m + p − 1) of the time, for
    GPipe and 1F1B alike. (The first and last stages differ: the first computes no input
    gradient, the last computes the loss.)"""
    for (schedule, m), run in gpipe_and_1f1b.items():
        assert bubble(run, [1, 2]) == pytest.approx(bubble_formula(4, m), abs=0.015), (schedule, m)
    for m in (4, 8, 16):
        assert gpipe_and_1f1b["ScheduleGPipe", m].elapsed == pytest.approx(
            gpipe_and_1f1b["Schedule1F1B", m].elapsed, rel=0.01)


def test_torch_is_restored_after_the_run():
    from torch.distributed.pipelining import schedules

    warmup, recv = schedules._PipelineSchedule._warmup_p2p, dist.recv_object_list
    sc.Cluster.preset("dgx-a100").run(run_schedule, world_size=2,
                                      args=("ScheduleGPipe", 2, 8, 2, 1, True))
    assert schedules._PipelineSchedule._warmup_p2p is warmup
    assert dist.recv_object_list is recv


def test_dualpipev_gains_nothing_from_its_overlap_on_one_compute_stream():
    """DualPipeV's OVERLAP_F_B steps pair a forward with a backward; on one compute stream
    (and with torch's default, which runs them in turn) each costs both, so DualPipeV is
    slower than ZBVZeroBubble on the same V-shaped stages for the same compute: torch's
    own action lists replayed with unit costs (F = I = W = 1, full backward 2, messages
    free) idle 11.1 % and 5.9 % of the step, (1 - 0.059) / (1 - 0.111) = 1.06 times the
    time."""
    runs = {s: _measure(s, 8, layers=1) for s in ("ScheduleZBVZeroBubble", "ScheduleDualPipeV")}
    assert runs["ScheduleDualPipeV"].elapsed > 1.03 * runs["ScheduleZBVZeroBubble"].elapsed
    for r in range(4):   # the same work on each rank, in a different order
        assert runs["ScheduleDualPipeV"].clock(r).compute == pytest.approx(
            runs["ScheduleZBVZeroBubble"].clock(r).compute, rel=0.01)


def _needs(action, stage_rank, last):
    """The messages ``(kind, sending stage, micro-batch)`` a compute action of torch's
    runtime waits for (none from a stage on the same rank: the V's turn)."""
    C = schedules._ComputationType
    needs = []
    for a in action.sub_actions or (action,):
        s, mb = a.stage_index, a.microbatch_index
        if a.computation_type == C.FORWARD and s > 0 and stage_rank[s - 1] != stage_rank[s]:
            needs.append(("F", s - 1, mb))
        if (a.computation_type in (C.FULL_BACKWARD, C.BACKWARD_INPUT) and s < last
                and stage_rank[s + 1] != stage_rank[s]):
            needs.append(("B", s + 1, mb))
    return needs


def _replay(order, stage_rank, cost, message, starts):
    """Torch's action lists ``order`` (``{rank: [action, ...]}``) as a plain event model,
    independent of the simulator's threads: each rank runs its actions in turn, a compute
    action takes ``cost[rank, action]`` once the messages it needs have arrived, a send
    or a receive is posted when its rank reaches it (neither blocks), and a message
    arrives ``message`` seconds after both are posted. Rank ``r`` starts at ``starts[r]``.
    Returns ``{(rank, action): end}``."""
    C = schedules._ComputationType
    last = max(stage_rank)
    now, at, posted, ends = dict(starts), dict.fromkeys(order, 0), {}, {}
    progress = True
    while progress:
        progress = False
        for rank, actions in order.items():
            while at[rank] < len(actions):
                a = actions[at[rank]]
                kind = a.computation_type
                if kind in (C.SEND_F, C.SEND_B, C.RECV_F, C.RECV_B):
                    key = {C.SEND_F: ("F", a.stage_index), C.SEND_B: ("B", a.stage_index),
                           C.RECV_F: ("F", a.stage_index - 1),
                           C.RECV_B: ("B", a.stage_index + 1)}[kind] + (a.microbatch_index,)
                    posted.setdefault(key, []).append(now[rank])
                else:
                    needs = _needs(a, stage_rank, last)
                    if any(len(posted.get(k, ())) < 2 for k in needs):
                        break   # its sender has not got there yet
                    start = max([now[rank]] + [max(posted[k]) + message for k in needs])
                    now[rank] = ends[rank, a] = start + cost[rank, a]
                at[rank] += 1
                progress = True
    assert all(at[r] == len(order[r]) for r in order), "the replay is stuck"
    return ends


@pytest.mark.parametrize("schedule", ["ScheduleZBVZeroBubble", "ScheduleDualPipeV"])
def test_the_simulator_times_torchs_actions_as_an_event_replay_does(schedule, monkeypatch):
    """Each action of torch's runtime ends in the simulator when a replay of the same
    action lists says (:func:`_replay`, with the compute the simulator charged for each
    action and its message time): how the rank threads take turns does not change the
    result. (DualPipeV idled 24.1 % instead of 11 % when a message matched after a later
    one waited behind it.)"""
    log = []

    @contextlib.contextmanager
    def record(action):
        start = sc.now()
        yield
        log.append((dist.get_rank(), action, start, sc.now()))

    monkeypatch.setattr(schedules, "record_function", record)
    monkeypatch.setattr(schedules, "_get_profiler_function_name", lambda action: action)
    p = 4
    run = _measure(schedule, 8, p=p, layers=1)
    stage_rank = {s: r for r in range(p) for s in stage_indices(schedule, r, p)}
    order = {r: [a for rank, a, _, _ in log if rank == r] for r in range(p)}
    cost, sim_end = {}, {}
    for r in range(p):
        compute = [e for e in run.clock(r).events if e.lane == "compute"]
        for rank, a, start, end in log:
            if rank == r:
                sim_end[r, a] = end
                cost[r, a] = sum(max(0.0, min(e.end, end) - max(e.start, start)) for e in compute)
    t0 = min(start for _, _, start, _ in log)
    messages = [e.end - e.start for e in run.clock(0).events
                if e.lane == "comm" and e.label.startswith("send") and e.start >= t0]
    message = max(messages)
    starts = {r: min(start for rank, _, start, _ in log if rank == r) - t0 for r in range(p)}
    ends = _replay(order, stage_rank, cost, message, starts)
    for (r, a), end in ends.items():
        # within a few messages: the replay has no lanes, where two messages to or from
        # one rank at once queue (the largest difference is 1.8 messages)
        assert sim_end[r, a] - t0 == pytest.approx(end, abs=3 * message), (
            f"rank {r}, {a}: the simulator ends it at {(sim_end[r, a] - t0) * 1e3:.2f} ms, "
            f"the replay at {end * 1e3:.2f} ms")


class _TwoLayers(nn.Module):
    def __init__(self, width):
        super().__init__()
        self.a, self.b = nn.Linear(width, width), nn.Linear(width, width)

    def forward(self, x):
        return self.b(torch.relu(self.a(x)))


def _traced_pipeline(fake, width, rows, m):
    """pipeline() splits the traced model at ``b``; each rank builds its stage from it."""
    r = dist.get_rank()
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        torch.manual_seed(0)
        model = _TwoLayers(width)
        g = torch.Generator().manual_seed(1)
        x, y = torch.randn(m * rows, width, generator=g), torch.randn(m * rows, width, generator=g)
        pipe = pipelining.pipeline(model, mb_args=(x.chunk(m)[0],),
                                   split_spec={"b": pipelining.SplitPoint.BEGINNING})
        stage = pipe.build_stage(r, torch.device("cpu"))
        schedule = pipelining.ScheduleGPipe(stage, n_microbatches=m, loss_fn=mse)
        schedule.step(*([x] if r == 0 else []), **({"target": y} if r == 1 else {}))
    if fake:
        return None
    return {name: q.grad for name, q in stage.submod.named_parameters()}


def test_the_pipeline_frontend_runs_and_matches_the_single_process_model():
    """``pipeline()``'s stages warm up by sending a 0-d tensor into a 1-element buffer
    (NCCL matches messages by element count, not shape)."""
    m, width, rows = 4, 8, 2
    run = sc.Cluster.preset("dgx-a100").run(_traced_pipeline, world_size=2,
                                            args=(False, width, rows, m))
    torch.manual_seed(0)
    model = _TwoLayers(width)
    g = torch.Generator().manual_seed(1)
    x, y = torch.randn(m * rows, width, generator=g), torch.randn(m * rows, width, generator=g)
    (sum(mse(model(xc), yc) for xc, yc in zip(x.chunk(m), y.chunk(m))) / m).backward()
    grads = [*run.results[0].values(), *run.results[1].values()]   # a's, then b's
    assert len(grads) == 4
    for got, param in zip(grads, model.parameters()):
        torch.testing.assert_close(got, param.grad)
    fake = sc.Cluster.preset("dgx-a100").run(_traced_pipeline, world_size=2,
                                             args=(True, WIDTH, ROWS, m))
    assert fake.peak_memory(1)["parameters"] >= (WIDTH * WIDTH + WIDTH) * 4   # 1 GiB a layer


def _send_and_receive(sent_shape, received_shape):
    if dist.get_rank() == 0:
        dist.send(torch.arange(float(torch.Size(sent_shape).numel())).reshape(sent_shape), 1)
        return None
    buffer = torch.zeros(received_shape)
    dist.recv(buffer, 0)
    return buffer.tolist()


def test_a_message_needs_room_for_its_bytes_not_the_same_shape():
    """As in gloo (tests/test_differential_gloo.py, send_recv-other-buffer-*)."""
    node = sc.Cluster.preset("dgx-a100")
    assert node.run(_send_and_receive, world_size=2, args=((), (1,))).results[1] == [0.0]
    assert node.run(_send_and_receive, world_size=2,
                    args=((2, 3), (3, 2))).results[1] == [[0, 1], [2, 3], [4, 5]]
    with pytest.raises(sc.CollectiveMismatchError, match="shape/dtype differs"):
        node.run(_send_and_receive, world_size=2, args=((4,), (3,)))


# Runs in a fresh interpreter, where torch.distributed.pipelining is not imported yet.
_IMPORTED_INSIDE_FAKE_TENSORS = """
import sys, torch, torch.nn as nn, torch.distributed as dist
import simcluster as sc
assert "torch.distributed.pipelining" not in sys.modules
def fn():
    r, p = dist.get_rank(), dist.get_world_size()
    with sc.fake_tensors():
        from torch.distributed.pipelining import PipelineStage, ScheduleGPipe
        stage = PipelineStage(nn.Linear(4096, 4096), r, p, torch.device("cpu"))
        schedule = ScheduleGPipe(stage, n_microbatches=2, loss_fn=lambda o, t: o.sum())
        x = torch.randn(8, 4096)
        schedule.step(x) if r == 0 else schedule.step(target=x, losses=[])
    return "ok"
run = sc.Cluster.preset("dgx-a100").run(fn, world_size=2)
from torch.distributed.pipelining import schedules
print(run.results, hasattr(schedules._PipelineSchedule._warmup_p2p, "__wrapped__"),
      [type(f).__name__ for f in sys.meta_path if "Pipelining" in type(f).__name__])
"""


@pytest.mark.slow
def test_pipelining_imported_inside_fake_tensors_works_too():
    out = subprocess.run([sys.executable, "-c", _IMPORTED_INSIDE_FAKE_TENSORS], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    assert out.strip().splitlines()[-1] == "['ok', 'ok'] False []"
