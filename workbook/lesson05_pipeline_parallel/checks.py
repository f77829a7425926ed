"""The checks of lab 05 (pipeline parallelism), on the protocol of :mod:`workbook.checking`.

A schedule (GPipe, 1F1B) is run as ``schedule(stage, inputs, targets, loss_fn, shape)`` on
every rank (the lab documents it) and judged twice:

* **values**, on a small real MLP (``workbook.models.mlp``, 8 wide, cut into ``p``
  stages by ``workbook.pipeline.split``) for several ``(p, m)``: every receive is waited
  for, and every stage's gradients (for GPipe also the input gradients the first stage
  returns) equal those of the whole model run in one process on the whole batch;
* **time and memory**, on a large model under ``sc.fake_tensors()`` (shapes without
  values: 8192 wide, micro-batches of 1,024 rows, two layers per stage, so each stage's
  compute takes milliseconds and a message between stages about 1 % of that): the bubble
  measured by ``workbook.pipeline.bubble`` must be within ``BUBBLE_TOLERANCE`` of wall time
  of ``workbook.pipeline.bubble_formula``, and the activations each stage holds at its
  peak, counted in micro-batches, must be GPipe's ``m`` or at most 1F1B's ``p - rank``.
  Memory is read from the simulator (``sc.memory_in_use()``) after each forward of a
  stage. When 1F1B misses either, a values run counts each stage's forwards before its
  first backward, so the hint names the warm-up only when the warm-up is what is wrong.

The reference answers (:mod:`._reference`) are imported inside the checks only.
"""

import math
from contextlib import contextmanager

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

import simcluster as sc
from workbook.checking import (Failure, NotStarted, answers, check, close_within,
                               collectives_so_far, compare_scaled, first_difference, listed,
                               mse, num, number, on_a_rank, refuse_reference, short,
                               simulate)
from workbook.hints import Hints
from workbook.models import mlp
from workbook.pipeline import bubble, bubble_formula, split
from workbook.lesson05_pipeline_parallel.lab import _cluster, _micro_batches_held, _timing_body

WIDTH, DEPTH, ROWS = 8, 4, 2           # the real model: 4 × (Linear(8, 8) + ReLU), 2 rows
VALUE_CASES = ((1, 3), (2, 1), (2, 4), (3, 5), (4, 2), (4, 8))  # (p, m); m < p - 1 too
TIMING_CASES = ((2, 4), (4, 8))
BUBBLE_TOLERANCE = 0.02                # of wall time
HELD_SLACK = 0.5                       # micro-batches: what a stage may keep beyond its share


_reference = answers(__name__)   # the answers, imported only while a check runs


hint = Hints({
    "gpipe": [
        "GPipe runs every forward of the step, then every backward. Before a stage computes "
        "a micro-batch it needs that micro-batch's activation from the stage before it; "
        "before it backpropagates one it needs the gradient from the stage after it. What "
        "must a stage keep between the two phases, and why must its input require grad "
        "(the first stage's too, now that its input gradients are returned)?",
        "Forward phase, micro-batch i: the first stage reads inputs[i] (a copy of it that "
        "wants its gradient), the others receive an activation of the given shape from the "
        "previous rank and make it want its gradient; every stage computes its output; the "
        "last one turns it into the loss (divided by m), the others send it on. Keep "
        "(input, output) per micro-batch.",
        "Backward phase, every stage in the same order (forward order, as torch's "
        "ScheduleGPipe does; reversed works too if every stage reverses): the last stage "
        "backpropagates its loss, the others "
        "receive the gradient of their output and backpropagate it; every stage but the "
        "first sends its input's gradient back, and the first returns the list of its "
        "inputs' gradients. A send needs a matching receive on the other rank, in the same "
        "order.",
    ],
    "1f1b": [
        "1F1B starts a micro-batch's backward as soon as the last stage has its loss. How "
        "many forwards must stage s run before its first backward, and what alternates "
        "after that? Where does a micro-batch wait between its forward and its backward?",
        "exchange: post the send and the receive together (torch's batch_isend_irecv with "
        "P2POp's), then wait on them, so two neighbours that both send never block each "
        "other. A queue of (input, output) pairs: forwards append, backwards take the oldest.",
        "Warm-up: p - 1 - s forwards (each sends its output, receives nothing back). Steady "
        "state: one forward, then one backward of the oldest micro-batch held, exchanging "
        "with the next stage. Cool-down: the remaining backwards, each sending its input's "
        "gradient to the previous stage.",
    ],
    "bubble": [
        "Measure in chunk slots: a chunk is 1/v of a stage. How many slots does one GPU "
        "compute in a phase, and how many does it idle while the pipe fills or drains?",
        "Each GPU computes v·m chunk slots per phase and idles p - 1 of them: the bubble is "
        "the idle share of the wall time, not of the work.",
    ],
    "pick": [
        "Which m are allowed (whole micro-batches, interleaving's rule) and which v? Then: "
        "fewest micro-batches first, fewest chunks second. Both limits say \"at most\".",
        "For each allowed m in increasing order, and for each allowed v in increasing order: "
        "the bubble from your interleaved_bubble, the memory of the first stage from how "
        "many micro-batches it holds times the samples of one micro-batch times "
        "sample_bytes. The first pair within both limits wins; None if no pair is.",
        "Micro-batches the first stage holds: p when v = 1 (plain 1F1B); p + (p - 1)/v only "
        "for the interleaved schedule, v ≥ 2 (at v = 1 that formula would give 2p - 1, "
        "which is not 1F1B).",
    ],
})


def _case(p, m):
    return f"p = {p}, m = {m}"


# ------------------------------------------------------------------ the values


def _data(p, m):
    """``(x, y)``: ``m`` micro-batches of ``ROWS`` rows, the same on every rank."""
    g = torch.Generator().manual_seed(1_000 * p + m)
    return torch.randn(m * ROWS, WIDTH, generator=g), torch.randn(m * ROWS, WIDTH, generator=g)


def _expected_gradients(p, m):
    """Per stage, ``[(name, gradient)]`` of the whole model on the whole batch, one
    process: the mean loss over every row, which is the mean of the micro-batches' losses."""
    model = mlp(WIDTH, DEPTH)
    x, y = _data(p, m)
    mse(model(x), y).backward()
    return [list(stage.named_parameters()) for stage in split(model, p)]


def _expected_input_gradients(p, m):
    """The gradient of the whole batch's mean loss with respect to each input
    micro-batch, one process."""
    x, y = _data(p, m)
    x.requires_grad_()
    mse(mlp(WIDTH, DEPTH)(x), y).backward()
    return list(x.grad.chunk(m))


def _values_body(fn, p, m):
    """What every rank runs: its stage of the real MLP, its micro-batches, the schedule."""

    def body():
        rank = dist.get_rank()
        stage = split(mlp(WIDTH, DEPTH), p)[rank]
        x, y = _data(p, m)
        inputs = list(x.chunk(m)) if rank == 0 else [None] * m
        targets = list(y.chunk(m)) if rank == p - 1 else [None] * m
        returned = fn(stage, inputs, targets, mse, (ROWS, WIDTH))
        _, names = collectives_so_far()
        return {"grads": [None if q.grad is None else q.grad.clone()
                          for q in stage.parameters()],
                "collectives": names, "returned": returned}

    return body


SCHEDULE_HINTS = {
    "exception": "read the message above: it names the line of your schedule that failed.",
    "timeout": "look for a loop that never ends: each phase runs over the m "
               "micro-batches, and m is the length of inputs on every rank.",
}
NONE_INPUT_HINT = ("only the first rank's inputs and the last rank's targets hold tensors "
                   "(the others hold None): the other stages receive their input from the "
                   "stage before.")
NONE_SENT_HINT = ("a stage sent None: its input's gradient exists only if that input "
                  "wanted its gradient before the stage used it (a received tensor has no "
                  "history: make it require grad).")


def _exception_hint(failure):
    """A rank raised: name the cause the error's message points to (None where a tensor
    was needed: the inputs or targets of a middle stage, or an input gradient that was
    never computed), else the generic hint."""
    what = failure.what
    if isinstance(failure, NotStarted) or " raised " not in what:
        return failure
    if "Expected parameter `tensor`" in what:
        return Failure(what, NONE_SENT_HINT)
    if "NoneType" in what:
        return Failure(what, NONE_INPUT_HINT)
    return failure
CLOSE = dict(rtol=1e-4, atol=1e-6)


GRADIENT_HINTS = {
    "times": "divide each micro-batch's loss by m before its backward: the batch's loss is "
             "the mean of the micro-batches'.",
    "over": "divide each micro-batch's loss by m once, on the last stage only.",
    "values": "backward of a micro-batch needs the gradient of the same micro-batch: every "
              "stage must send and receive the micro-batches' gradients in the same order. "
              "Print what each rank sends and receives on p = 2, m = 2.",
}


UNWAITED_HINT = ("an asynchronous receive (irecv, or one posted by batch_isend_irecv) "
                 "returns at once: its tensor holds the message only once the Work it "
                 "returned has been waited for. Wait on every Work before reading what it "
                 "received.")


@contextmanager
def _watching_receives():
    """Every receive posted while the block runs, and which ones were waited for
    (``wait()``, ``result()``, or an ``is_completed()`` that said yes). A receive never
    waited for is a race on a real GPU: nothing guarantees its buffer is filled yet.
    Yields the list of ``[receiving rank, waited]`` pairs."""
    from simcluster.backend import SimWork
    posted = []
    init, wait, completed = SimWork.__init__, SimWork.wait, SimWork.is_completed

    def watched_init(self, *args, **kwargs):
        init(self, *args, **kwargs)
        message = getattr(self, "_pending", None)     # the posted send or receive
        if getattr(message, "kind", None) == "recv":
            self._watched = [message.dst, False]
            posted.append(self._watched)

    def watched_wait(self, *args, **kwargs):
        result = wait(self, *args, **kwargs)
        if hasattr(self, "_watched"):
            self._watched[1] = True
        return result

    def watched_completed(self):
        done = completed(self)
        if done and hasattr(self, "_watched"):
            self._watched[1] = True
        return done

    SimWork.__init__, SimWork.wait, SimWork.is_completed = (watched_init, watched_wait,
                                                            watched_completed)
    try:
        yield posted
    finally:
        SimWork.__init__, SimWork.wait, SimWork.is_completed = init, wait, completed


def _check_waited(where, posted):
    """Fail if a rank read a receive it never waited for."""
    unwaited = {}
    for rank, waited in posted:
        if not waited:
            unwaited[rank] = unwaited.get(rank, 0) + 1
    if unwaited:
        rank = min(unwaited)
        raise Failure(f"{where}: rank {rank} never waited for {unwaited[rank]} of its "
                      "receives (their Work's wait() was not called)", UNWAITED_HINT)


def _compare_gradients(where, run, expected, m):
    """Fail at the first rank and parameter whose gradient differs from the reference."""
    close = close_within(**CLOSE)
    for rank, result in enumerate(run.results):
        if result["collectives"]:
            raise Failure(f"{where}: rank {rank} called {result['collectives'][-1]}, a "
                          "collective",
                          "pass activations and gradients between neighbouring stages with "
                          "point-to-point operations only (dist.send, dist.recv, dist.isend, "
                          "dist.irecv, dist.batch_isend_irecv).")
        for (name, param), got in zip(expected[rank], result["grads"]):
            at = f"{where}: rank {rank}, {name}"
            if got is None:
                raise Failure(f"{at}: the gradient is None",
                              "every stage must run backward on each of its micro-batches: "
                              "the last from its loss, the others from the gradient the next "
                              "stage sends back for its output.")
            compare_scaled(at, param.grad, got, m, GRADIENT_HINTS, close=close,
                           holder="the single-process model",
                           summed="the sum over the micro-batches, not their mean")


def _check_values(fn, input_gradients=False):
    """Run ``fn`` on every value case; fail at the first receive never waited for, or
    the first wrong gradient (``input_gradients``: and the ones rank 0 returns)."""
    for p, m in VALUE_CASES:
        where = _case(p, m)
        with _watching_receives() as posted:
            try:
                run = simulate(_cluster(), _values_body(fn, p, m), p, lambda rank: where,
                               SCHEDULE_HINTS)
            except Failure as failure:
                raise _exception_hint(failure) from None
        if p > 1 and sum(run.messages_sent) == 0:
            raise Failure(f"{where}: no rank sent a point-to-point message",
                          "ranks are threads here, but on a real cluster they share no "
                          "memory: send the activations and gradients with send/recv.")
        _check_waited(where, posted)
        _compare_gradients(where, run, _expected_gradients(p, m), m)
        if input_gradients:
            _compare_input_gradients(where, run.results[0]["returned"],
                                     _expected_input_gradients(p, m))
            _check_others_return_none(where, run)


def _check_others_return_none(where, run):
    """Only the first stage has a layer before it to hand input gradients to: every other
    rank returns None, as the lab says."""
    for rank, result in enumerate(run.results[1:], 1):
        got = result["returned"]
        if got is not None:
            said = (f"a {type(got).__name__} of {len(got)}" if isinstance(got, (list, tuple))
                    else short(repr(got), 40))
            raise Failure(f"{where}: rank {rank} returned {said}; only the first stage "
                          "(rank 0) returns its input gradients, the other stages return None",
                          "the other stages already sent their input's gradient back to the "
                          "stage before them: return the list only when rank == 0.")


INPUT_GRADIENTS_HINT = ("the layer before the pipeline needs d loss / d input of every "
                        "micro-batch: on the first stage, return them as a list, in "
                        "micro-batch order.")
FIRST_INPUT_HINT = ("two causes leave it None: the first stage's input comes from the data, "
                    "not from a recv, but its gradient is needed too, so make it want its "
                    "gradient before the stage uses it, as the other stages do with what "
                    "they receive; and x.grad is filled only by the backward, so read it "
                    "after the backward loop, not before.")
INPUT_VALUES_HINT = ("micro-batch i's input gradient is what backward leaves on micro-batch "
                     "i's input, once the gradient from the stage after has been "
                     "backpropagated through it (the loss divided by m, as always).")


def _compare_input_gradients(where, got, expected):
    """Rank 0's return value: the ``m`` gradients of the loss with respect to its input
    micro-batches."""
    m = len(expected)
    if not isinstance(got, (list, tuple)) or len(got) != m:
        said = (f"a {type(got).__name__} of {len(got)}" if isinstance(got, (list, tuple))
                else short(repr(got), 40))
        raise Failure(f"{where}: rank 0 returned {said}; expected the list of the {m} "
                      "input gradients", INPUT_GRADIENTS_HINT)
    close = close_within(**CLOSE)
    for i, (g, e) in enumerate(zip(got, expected)):
        at = f"{where}: rank 0, the gradient of input micro-batch {i}"
        if g is None:
            raise Failure(f"{at} is None", FIRST_INPUT_HINT)
        if not isinstance(g, torch.Tensor) or g.shape != e.shape:
            said = tuple(g.shape) if isinstance(g, torch.Tensor) else type(g).__name__
            raise Failure(f"{at} is {said}, expected shape {tuple(e.shape)}",
                          INPUT_GRADIENTS_HINT)
        compare_scaled(at, e, g.detach(), m, {**GRADIENT_HINTS, "values": INPUT_VALUES_HINT},
                       close=close, holder="the single-process model",
                       summed="the sum over the micro-batches, not their mean")


# ------------------------------------------------------------- time and memory


def _timing_runs(fn):
    """``[(p, m, run)]`` of ``fn`` on the timing cases, under fake tensors."""
    runs = []
    for p, m in TIMING_CASES:
        where = f"{_case(p, m)}, fake tensors"
        hints = {**SCHEDULE_HINTS,
                 "exception": "this run uses fake tensors (shapes without values, to time a "
                              "model of 8192 × 8192 layers): your schedule must not read "
                              "values (.item(), print, if on a tensor). Read the message "
                              "above."}
        runs.append((p, m, simulate(_cluster(), _timing_body(fn, p, m), p, lambda r: where,
                                    hints, accounting=True)))
    return runs


def _held(p, m, run):
    """Micro-batches of activations each rank held at its peak; every stage must have
    run one forward per micro-batch (through its module, where the hook counts them)."""
    for rank, (_, forwards) in enumerate(run.results):
        if forwards != m:
            raise Failure(f"{_case(p, m)}, fake tensors: stage {rank} was called {forwards} "
                          f"time(s); expected once per micro-batch ({m})",
                          "call this rank's stage as stage(x) once for each micro-batch.")
    return _micro_batches_held(run)


def _check_bubble(p, m, run, hint):
    """The measured bubble is within ``BUBBLE_TOLERANCE`` of wall time of the formula."""
    measured, formula = bubble(run), bubble_formula(p, m)
    if abs(measured - formula) > BUBBLE_TOLERANCE:
        raise Failure(f"{_case(p, m)}, fake tensors: the stages idle {measured:.1%} of the "
                      f"wall time; the formula (p - 1)/(m + p - 1) gives {formula:.1%}", hint)
    return measured, formula


def _bubbles_text(measured):
    return ", ".join(f"{_case(p, m)}: {got:.1%} (formula {want:.1%})"
                     for p, m, got, want in measured)


def _held_text(p, m, held):
    return (f"stages held {' / '.join(f'{h:.0f}' for h in held)} micro-batches of activations "
            f"(p = {p}, m = {m})")


# ------------------------------------------------------------ exercise 1: GPipe


def _gpipe_references():
    """The GPipes a learner could import instead of writing one: the lab's answer and the
    lesson's own (which takes its neighbours' ranks too, so a wrapper would fit)."""
    from workbook.lesson05_pipeline_parallel import demos as schedules
    return _reference().gpipe, schedules.gpipe


@check("GPipe")
def check_gpipe(fn):
    """``fn(stage, inputs, targets, loss_fn, shape)`` on every rank: gradients, and the
    input gradients rank 0 returns, equal the single-process model's for several
    ``(p, m)``; every receive is waited for; on the fake-tensor timing model every
    stage holds all ``m`` micro-batches' activations at its peak, and the bubble is within
    2 % of wall time of ``(p - 1)/(m + p - 1)``."""
    for reference in _gpipe_references():
        refuse_reference(fn, reference)
    _check_values(fn, input_gradients=True)
    measured = []
    for p, m, run in _timing_runs(fn):
        held = _held(p, m, run)
        for rank, h in enumerate(held):
            if h < m - HELD_SLACK:
                raise Failure(f"{_case(p, m)}, fake tensors: stage {rank} held at most "
                              f"{h:.1f} micro-batches of activations; GPipe holds all "
                              f"{m}",
                              "GPipe runs the forward of every micro-batch, then the backward "
                              "of every micro-batch, on every stage (the last one too): keep "
                              "each micro-batch's input and output until its backward.")
        measured.append((p, m, *_check_bubble(
            p, m, run, "every stage must start a micro-batch's forward as soon as its input "
                       "arrives, and send its output on at once; then all the backwards.")))
    return (f"gradients (and the first stage's input gradients) equal the single-process "
            f"model's on (p, m) {listed(VALUE_CASES)}; bubble {_bubbles_text(measured)}; "
            f"{_held_text(p, m, held)}")


# ------------------------------------------------------------- exercise 2: 1F1B


DROP_HINT = ("the warm-up is right, so a micro-batch's tensors outlive its backward: once "
             "a micro-batch is backpropagated, nothing may keep its input or output.")
POSTING_HINT = ("the warm-up is right, so the stages wait on their messages: no stage may "
                "block on a send while its neighbour is busy elsewhere. Post each send "
                "together with the receive that follows it.")


def _first_backward(fn, p, m):
    """Per rank, how many forwards of its stage ran before its first backward reached
    the stage (real values, the values model; None if the run fails)."""

    def body():
        rank = dist.get_rank()
        stage = split(mlp(WIDTH, DEPTH), p)[rank]
        events = []

        def on_output(module, args, output):
            events.append("F")
            if output.requires_grad:
                output.register_hook(lambda grad: events.append("B"))

        stage.register_forward_hook(on_output)
        x, y = _data(p, m)
        inputs = list(x.chunk(m)) if rank == 0 else [None] * m
        targets = list(y.chunk(m)) if rank == p - 1 else [None] * m
        fn(stage, inputs, targets, mse, (ROWS, WIDTH))
        return events.index("B") if "B" in events else len(events)

    try:
        return simulate(_cluster(), body, p, lambda rank: _case(p, m)).results
    except Failure:
        return None


def _warmup_hint(fn, p, m):
    """The warm-up hint, if some stage did not run 1F1B's p - r - 1 warm-up forwards
    (then the forward of its first backward's micro-batch) before its first backward;
    else None."""
    counts = _first_backward(fn, p, m)
    for rank, count in enumerate(counts or []):
        want = min(p - rank - 1, m) + 1 if m > p - rank - 1 else m
        if count != want:
            return (f"stage {rank} ran {count} forward(s) before its first backward, "
                    f"1F1B runs {want}: p - r - 1 warm-up forwards (here "
                    f"{min(p - rank - 1, m)}), then one more before the first backward. "
                    "With fewer, the stages wait for each other; with more, they hold more "
                    "activations.")
    return None


@check("1F1B")
def check_1f1b(fn):
    """``fn(stage, inputs, targets, loss_fn, shape)`` on every rank: gradients as for
    GPipe; on the fake-tensor timing model stage ``r`` holds at most ``p - r``
    micro-batches' activations (a schedule that is GPipe in disguise holds ``m``), and the
    bubble is GPipe's, within 2 % of wall time."""
    refuse_reference(fn, _reference().one_f_one_b)
    _check_values(fn)
    measured = []
    for p, m, run in _timing_runs(fn):
        held = _held(p, m, run)
        for rank, h in enumerate(held):
            allowed = min(m, p - rank)
            if h > allowed + HELD_SLACK:
                raise Failure(f"{_case(p, m)}, fake tensors: stage {rank} held "
                              f"{h:.1f} micro-batches of activations; 1F1B holds at most "
                              f"p - rank = {allowed}",
                              _warmup_hint(fn, p, m) or DROP_HINT)
        try:
            measured.append((p, m, *_check_bubble(p, m, run, POSTING_HINT)))
        except Failure as failure:
            raise Failure(failure.what, _warmup_hint(fn, p, m) or failure.hint) from None
    return (f"gradients equal the single-process model's on (p, m) {listed(VALUE_CASES)}; "
            f"bubble {_bubbles_text(measured)}; {_held_text(p, m, held)}")


# ---------------------------------------------------- exercise 3: interleaved bubble


BUBBLE_GRID = [(p, m, v) for p in (1, 2, 4, 8) for m in (1, 4, 8, 16, 32) for v in (1, 2, 4)]


@check("interleaved bubble")
def check_interleaved_bubble(fn):
    """``fn(p, m, v)``: the bubble of interleaved 1F1B as a fraction of wall time, on
    ``p`` ∈ {1, 2, 4, 8}, ``m`` ∈ {1, 4, 8, 16, 32}, ``v`` ∈ {1, 2, 4}."""
    refuse_reference(fn, _reference().interleaved_bubble)
    refuse_reference(fn, bubble_formula)
    for p, m, v in BUBBLE_GRID:
        where = f"p = {p}, m = {m}, v = {v}"
        got = on_a_rank(fn, (p, m, v), f"interleaved_bubble({p}, {m}, {v})")
        want = bubble_formula(p, m, v)
        if number(got) is None:
            raise Failure(f"{where}: returned {short(repr(got), 60)}, not a number",
                          "return the fraction as a float (0.25 for 25 %).")
        got = number(got)
        if abs(got - want) <= 1e-9:
            continue
        if v > 1 and abs(got - (p - 1) / (m + p - 1)) <= 1e-9:
            hint = "that is 1F1B's bubble: with v chunks each slot is v times shorter."
        elif p > 1 and abs(got - (p - 1) / (v * m)) <= 1e-9:
            hint = ("(p - 1)/(v·m) is the bubble relative to the ideal time (the papers' "
                    "ratio); as a fraction of the wall time, divide by the whole: "
                    "ideal v·m plus bubble p - 1, in chunk slots.")
        elif abs(got - 100 * want) <= 1e-7:
            hint = "return a fraction (0.25), not a percentage (25)."
        else:
            hint = ("count in chunk slots: each stage computes v·m of them, and the "
                    "pipeline fills and drains in p - 1.")
        raise Failure(f"{where}: returned {num(got)}, expected {num(want)}", hint)
    return f"right on {len(BUBBLE_GRID)} cases of p ∈ {{1, 2, 4, 8}}, m up to 32, v ∈ {{1, 2, 4}}"


# ----------------------------------------------------------- exercise 4: pick (m, v)


# (p, batch, layers_per_stage, bubble_target, memory_cap GB, sample_bytes MB)
GB, MB = 10**9, 10**6
PICK_CASES = (
    (4, 64, 6, 0.30, 4 * GB, 100 * MB),     # memory needs m = 8; then 1F1B is enough
    (4, 64, 6, 0.30, 8_500 * MB, 100 * MB), # m = 4 needs chunks: v = 2 holds too much, v = 3 fits
    (8, 256, 4, 0.10, 48 * GB, 100 * MB),   # memory needs m = 16; the bubble then v = 4
    (8, 512, 8, 0.05, 16 * GB, 50 * MB),    # memory needs m = 32; the bubble then v = 8
    (4, 32, 4, 0.01, 80 * GB, 10 * MB),     # none: m = 32, v = 4 still idles 2.3 %
    (8, 64, 4, 0.30, 1 * GB, 200 * MB),     # none: even micro-batches of one sample are too big
    (4, 16, 2, 0.10, 2 * GB, 400 * MB),     # none: the bubble needs v = 2, whose extra
                                            #   activations only v = 1 leaves room for
    # "at most", on the boundary: the answer's bubble is exactly the target (3/15 = 0.2),
    # then its memory exactly the cap (4 x 8 x 100 MB); a strict < picks another pair
    (4, 48, 3, 0.20, 80 * GB, 10 * MB),     # (4, 3), not (8, 3)
    (4, 64, 6, 0.30, 3_200 * MB, 100 * MB), # (8, 1), not (16, 1)
    # m a multiple of p: without that rule, m = 6 (3.2 GB, bubble 33 %) would fit first
    (4, 48, 1, 0.35, 3_500 * MB, 100 * MB), # (8, 1), not (6, 1)
    # m = batch, micro-batches of one sample: only the last m meets the bubble (3/19 = 16 %)
    (4, 16, 1, 0.20, 80 * GB, 10 * MB),     # (16, 1); a search stopping before m = batch misses it
)


def _pick_where(case):
    p, batch, layers, target, cap, sample = case
    return (f"pick_m_v(p={p}, batch={batch}, layers_per_stage={layers}, "
            f"bubble_target={target}, memory_cap={num(cap / GB)} GB, "
            f"sample_bytes={num(sample / MB)} MB)")


def _is_whole(value):
    """A positive whole number (an int, a numpy int, 8.0): a count of micro-batches or
    chunks; 0 would divide by zero in the check."""
    value = number(value)
    return value is not None and math.isfinite(value) and value == int(value) and value >= 1


@check("pick (m, v)")
def check_pick_m_v(fn):
    """``fn(p, batch, layers_per_stage, bubble_target, memory_cap, sample_bytes)``: the
    fewest micro-batches, then the fewest chunks, meeting both limits, or None; on cases
    where the bubble, the memory, both or neither decide, three of them infeasible."""
    ref = _reference()
    refuse_reference(fn, ref.pick_m_v)
    for case in PICK_CASES:
        where = _pick_where(case)
        p, batch, layers, target, cap, sample = case
        got = on_a_rank(fn, case, where)
        want = ref.pick_m_v(*case)
        if isinstance(got, list):
            got = tuple(got)
        if got is None and want is None:
            continue
        if got is None:
            raise Failure(f"{where}: returned None, but (m, v) = {want} fits",
                          "try every m that is a multiple of p and divides the batch (m = batch "
                          "included), and "
                          "every v that divides layers_per_stage.")
        if not (isinstance(got, tuple) and len(got) == 2
                and all(_is_whole(x) for x in got)):
            raise Failure(f"{where}: returned {short(repr(got), 60)}, expected a pair (m, v) "
                          "of positive integers, or None",
                          "return (m, v), or None when nothing fits.")
        got = tuple(int(x) for x in got)
        if got == want:
            continue
        if got[::-1] == want:
            raise Failure(f"{where}: returned {got}, which looks swapped: the answer is "
                          f"(m, v) = {want}", "return the micro-batches first, then the "
                          "chunks: (m, v).")
        m, v = got
        broken = (f"m = {m} is not a multiple of p = {p}" if m % p else
                  f"m = {m} does not divide the batch of {batch}" if batch % m else
                  f"v = {v} does not divide layers_per_stage = {layers}" if layers % v
                  else None)
        if broken:
            raise Failure(f"{where}: returned (m, v) = {got}, but {broken}",
                          "only some (m, v) are allowed at all: m a multiple of p "
                          "(interleaving's rule, kept for v = 1 too) that divides the batch, "
                          "v a divisor of layers_per_stage. Skip the others before "
                          "judging the limits.")
        b = ref.interleaved_bubble(p, m, v)
        if b > target:
            raise Failure(f"{where}: (m, v) = {got} idles {b:.1%} of the wall time, above "
                          f"the target {target:.0%}", "check the bubble with your "
                          "interleaved_bubble(p, m, v).")
        memory = ref.micro_batches_held(p, v) * (batch // m) * sample
        if memory > cap:
            raise Failure(f"{where}: (m, v) = {got} holds {num(memory / GB)} GB of "
                          f"activations on the first stage, above the cap",
                          "the first stage holds p micro-batches when v = 1 (plain 1F1B), "
                          "p + (p - 1)/v only for v ≥ 2 chunks, each of batch/m samples × "
                          "sample_bytes.")
        m, v = want
        better = "fewer micro-batches" if m < got[0] else "as many micro-batches, fewer chunks"
        b, memory = ref.interleaved_bubble(p, m, v), ref.micro_batches_held(p, v) * (batch // m) * sample
        hint = ("among the (m, v) that fit, take the smallest m, then the smallest v; "
                "1F1B (v = 1) holds p micro-batches.")
        # An answer sitting exactly on a limit is what a strict < misses.
        on_limit = [what for what, exact in (("its bubble is exactly bubble_target",
                                              math.isclose(b, target)),
                                             ("its memory is exactly memory_cap",
                                              math.isclose(memory, cap))) if exact]
        if on_limit:
            hint = (f"{' and '.join(on_limit)}: both limits say \"at most\", so landing "
                    "exactly on the limit counts (<=, not <).")
        raise Failure(f"{where}: returned {got}; expected {want}, which fits too with "
                      f"{better} (bubble {b:.1%}, {num(memory / GB)} GB)", hint)
    feasible = sum(ref.pick_m_v(*c) is not None for c in PICK_CASES)
    return (f"right on {len(PICK_CASES)} cases ({feasible} feasible, "
            f"{len(PICK_CASES) - feasible} infeasible)")
