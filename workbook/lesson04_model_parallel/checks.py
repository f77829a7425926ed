"""The checks of lab 04 (model parallelism, the naive split), on the protocol of
:mod:`workbook.checking`.

* :func:`check_forward_backward` runs the learner's stage function on 1–4 ranks, a small
  real MLP whose layers change width (so a buffer of the wrong shape is caught) cut at
  different places, and compares the loss and every parameter's gradient with the same
  model run whole in one process.
* :func:`check_balance` hands the learner per-layer forward times measured on the
  simulator (calling the learner's function on a simulated rank, so that a search that
  never ends is stopped), streams micro-batches through the stages the learner's cut
  makes (fake tensors, :func:`.demos.stream_forward`) and compares the
  simulated time with the best cut's.
* :func:`check_boundary_bytes` compares the learner's count of the bytes crossing each
  boundary with the traffic the simulator measured between the stages.

The reference answers (:mod:`._reference`) and the lesson's module
(:mod:`workbook.lesson04_model_parallel.demos`) are imported inside the checks only.
"""

import functools
import itertools
import math

import torch
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc
from workbook import pipeline
from workbook.hints import Hints
from workbook.checking import (Failure, answers, check, close_within, first_difference,
                               listed, mse, num, number, on_a_rank, refuse_reference,
                               seconds, short, simulate, within_best)
from workbook.lesson04_model_parallel.lab import FEATURES, batch, in_shapes, make_model

# (world size, boundaries) of check_forward_backward; stages start at a Linear, a ReLU
# and a Tanh, and the widths change at every Linear
SPLITS = ((1, []), (2, [3]), (3, [2, 5]), (4, [1, 4, 6]))

hint = Hints({
    "stages": [
        "Draw the two passes for 3 ranks: what does each rank receive, from whom, and what "
        "does it send on, in forward? Then the same in backward, where everything flows the "
        "other way. Which tensor's gradient is what the previous rank needs?",
        "A tensor that arrives by recv is a new leaf: autograd fills its .grad only if it "
        "asks for one. The gradient coming back has the shape of this stage's OUTPUT. A "
        "middle stage starts backward from the gradient it received, not from a loss.",
        "Forward: receive (all but rank 0), run the stage, send a detached output on (all "
        "but the last). Backward: the last rank backward()s its loss; the others receive "
        "their output's gradient and backward from it; all but rank 0 send their input's "
        "gradient back. Only the last rank returns the loss.",
    ],
    "balance": [
        "When many batches stream through the stages, which stage sets the pace? So which "
        "number of a cut do you want as small as possible?",
        "A cut is p - 1 increasing layer indices; a stage's time is the sum of its layers' "
        "times. Among all cuts, find one whose LARGEST stage sum is smallest (not one whose "
        "smallest stage is largest: those differ).",
        "The layer counts here are small: trying every cut (itertools.combinations of the "
        "possible boundaries) is fast enough. For large ones, binary-search the largest "
        "stage time and cut greedily under it.",
    ],
    "bytes": [
        "What crosses a boundary in forward, and what comes back across it in backward? "
        "Which of the two do you know the shape and dtype of?",
        "The shapes follow from running the stages one after another on an input of "
        "in_shape, in the parameters' dtype, without autograd. Bytes are elements × bytes "
        "per element.",
        "The gradient sent back has the same shape and dtype as the activation sent "
        "forward: each boundary carries the activation's bytes twice.",
    ],
})


def _more(exercise, text):
    """A ❌ hint: what the check found to think about, then where the next step is."""
    return f"{text} ({hint.pointer(exercise)})"


HINTS = {
    "requires_grad": _more("stages", "x.grad was None: a received activation is a new leaf "
                           "tensor, and autograd fills a leaf's .grad only if it asks for "
                           "one."),
    "no_grad": _more("stages", "this stage never ran backward: every stage but the last "
                     "starts backward from the gradient of its output, received from the "
                     "next rank."),
    "loss": _more("stages", "only the last rank has the loss (it returns it); every other "
                  "rank returns None, as the lab says."),
    "forward": _more("stages", "the loss differs, so forward already goes wrong: print each "
                     "rank's activation on world size 2 and compare with the whole model's "
                     "layers run one by one."),
    "backward": _more("stages", "the loss is right, so forward is: backward goes wrong. Does "
                      "this stage start backward from the gradient of its output it received, "
                      "and does it send back the gradient of its input?"),
    "collective": "move activations and gradients with dist.send / dist.recv only.",
    "no_messages": "ranks are threads here, but on a real cluster they share no memory: "
                   "send the activation forward and its gradient back.",
}


_reference = answers(__name__)   # the answers, imported only while a check runs


def _lesson():
    """The lesson's module, imported only while a check runs (its functions are refused)."""
    from workbook.lesson04_model_parallel import demos
    return demos


def _where(p, boundaries):
    return f"world size {p}" + (f", cut before layers {listed(boundaries)}" if boundaries
                                else "")


# ------------------------------------------------------- exercise 1: forward and backward


def _whole_model(seed):
    """Loss and gradients of the model run whole in one process."""
    model = make_model(seed)
    x, y = batch(seed=seed + 1)
    loss = mse(model(x), y)
    loss.backward()
    return loss.detach(), {name: param.grad for name, param in model.named_parameters()}


def _stage_body(fn, p, boundaries, seed):
    def body():
        rank = dist.get_rank()
        stages = pipeline.split(make_model(seed), p, boundaries)
        x, y = batch(seed=seed + 1)
        shape = in_shapes(stages, x)[rank]
        before = x.clone()
        loss = fn(stages[rank], shape, x if rank == 0 else None,
                  y if rank == p - 1 else None, mse)
        return {"loss": loss.detach().clone() if isinstance(loss, torch.Tensor) else loss,
                "grads": {name: None if q.grad is None else q.grad.clone()
                          for name, q in stages[rank].named_parameters()},
                "x_changed": not torch.equal(before, x),
                "collectives": len(sc.collectives_called())}

    return body


def _run_stages(fn, p, boundaries, seed):
    where = _where(p, boundaries)
    try:
        return simulate(sc.Cluster.preset("dgx-a100"), _stage_body(fn, p, boundaries, seed),
                        p, lambda rank: where)
    except Failure as failure:
        # x.grad was None: handed to dist.send ("... of type torch.Tensor") or read
        if "NoneType" in failure.what or "of type torch.Tensor" in failure.what:
            raise Failure(failure.what, HINTS["requires_grad"]) from None
        raise


_close = close_within()     # float32 rounding of sums in another order


def _compare_stages(where, run, p, seed):
    expected_loss, expected = _whole_model(seed)
    for rank, result in enumerate(run.results):
        if result["collectives"]:
            raise Failure(f"{where}: rank {rank} called a collective", HINTS["collective"])
        if rank == 0 and result["x_changed"]:
            raise Failure(f"{where}: rank 0 changed its input x", "leave x as it is: compute "
                          "with it, don't write into it.")
    if p > 1 and sum(run.messages_sent) == 0:
        raise Failure(f"{where}: no rank sent a message", HINTS["no_messages"])
    last = run.results[p - 1]["loss"]
    if not isinstance(last, torch.Tensor):
        raise Failure(f"{where}: the last rank returned {short(repr(last), 40)}, not the "
                      "loss", HINTS["loss"])
    for rank in range(p - 1):
        returned = run.results[rank]["loss"]
        if returned is not None:
            what = ("a tensor" if isinstance(returned, torch.Tensor)
                    else short(repr(returned), 40))
            raise Failure(f"{where}: rank {rank} returned {what}, not None", HINTS["loss"])
    if not torch.isclose(last, expected_loss, rtol=1e-5, atol=1e-7):
        raise Failure(f"{where}: the loss is {num(last)}, the whole model's is "
                      f"{num(expected_loss)}", HINTS["forward"])
    for rank, result in enumerate(run.results):
        for name, grad in result["grads"].items():
            at = f"{where}: rank {rank}, gradient of {name}"
            if grad is None:
                raise Failure(f"{at} is None (this stage did not run backward)",
                              HINTS["no_grad"])
            if grad.shape != expected[name].shape:
                raise Failure(f"{at} has shape {tuple(grad.shape)}, expected "
                              f"{tuple(expected[name].shape)}", HINTS["backward"])
            diff = first_difference(expected[name], grad, _close)
            if diff is not None:
                i, e, g = diff
                raise Failure(f"{at}, element {i}: expected {num(e)}, got {num(g)}",
                              HINTS["backward"])


@check("forward and backward across stages")
def check_forward_backward(fn):
    """``fn(stage, in_shape, x, y, loss_fn)`` on every rank: the loss on the last rank and
    every stage's gradients equal the whole model's, on world sizes 1–4 and two seeds."""
    refuse_reference(fn, _reference().forward_backward)
    refuse_reference(fn, _lesson().naive_split_step)
    for seed in (0, 10):
        for p, boundaries in SPLITS:
            run = _run_stages(fn, p, boundaries, seed)
            _compare_stages(_where(p, boundaries), run, p, seed)
    return ("loss and gradients equal the whole model's on world sizes "
            f"{listed(p for p, _ in SPLITS)}, activations of 6 different widths")


# ------------------------------------------------------------- exercise 2: balance

UNIT_WIDTH, UNIT_BATCH = 2048, 4096   # a block of hidden k·2048 costs k units
MICRO_BATCHES = 4
BALANCE_TOLERANCE = 1.03               # the learner's cut may be 3 % slower than the best
BALANCE_HINT = _more("balance", "the slowest stage sets the pace of the stream: is your "
                     "cut's LARGEST stage sum as small as it can be?")
# (name, cost of each layer in units, stages): a language model with a heavy head, a
# heavy first layer, uneven layers where cutting at the running average goes wrong; a
# heavy second layer where making the FASTEST stage as slow as possible gives [2, 3]
# (stages 5, 2, 2; its only cut with no stage of 1) while the best cut is [1, 2] (1, 4,
# 4): 1.25× slower. ([1, 1, 1, 2] ties every cut on the fastest stage, so measured
# times' last bits would decide.) The limits: one stage, and one stage per layer.
PROFILES = (("language model (heavy head)", (1,) * 8 + (4,), 3),
            ("language model (heavy head)", (1,) * 8 + (4,), 4),
            ("heavy first and last layers", (4, 1, 1, 1, 1, 1, 1, 4), 3),
            ("uneven layers", (2, 3, 1, 3, 2, 4, 1, 1, 3, 2), 4),
            ("heavy second layer", (1, 4, 2, 2), 3),
            ("one stage", (2, 1, 3), 1),
            ("one stage per layer", (2, 1, 3), 3))


def profile_model(units):
    """A meta-device stack whose layer ``i`` is two ``Linear`` of hidden
    ``units[i]·UNIT_WIDTH`` (an MLP block without its activation, which costs little):
    its compute is proportional to ``units[i]``."""
    with torch.device("meta"):
        return nn.Sequential(*[nn.Sequential(nn.Linear(UNIT_WIDTH, k * UNIT_WIDTH),
                                             nn.Linear(k * UNIT_WIDTH, UNIT_WIDTH))
                               for k in units])


@functools.cache
def measured_layer_times(units):
    """Forward seconds of each layer of :func:`profile_model`, measured on one rank."""
    mp = _lesson()
    run = sc.Cluster.preset("dgx-a100").run(
        mp.stream_forward, world_size=1, args=(functools.partial(profile_model, units), 1,
                                               UNIT_BATCH))
    times = mp.layer_times(run)
    return tuple(times[i] for i in range(len(units)))


def _stream(units, p, boundaries, where):
    """Simulated seconds of :data:`MICRO_BATCHES` streamed through the cut stages."""
    mp = _lesson()
    run = simulate(sc.Cluster.preset("dgx-a100"), mp.stream_forward, p, lambda rank: where,
                   accounting=True, args=(functools.partial(profile_model, units),
                                          MICRO_BATCHES, UNIT_BATCH, boundaries))
    return run.elapsed


@functools.cache
def _best(units, p):
    cut = _reference().balance(measured_layer_times(units), p)
    return cut, _stream(units, p, cut, "the best cut")


def _stage_sums(times, p, cut):
    edges = [0, *cut, len(times)]
    return [sum(times[a:b]) for a, b in zip(edges, edges[1:])]


def _valid_cut(where, cut, n, p):
    """The learner's answer as a list of ints, or the Failure saying what is wrong."""
    hint = (f"return the {p - 1} indices of the layers where stages 1 … {p - 1} start, "
            f"increasing, each between 1 and {n - 1} (layer 0 always starts stage 0).")
    try:
        cut = [int(b) for b in cut]
    except (TypeError, ValueError):
        raise Failure(f"{where}: returned {cut!r}, not a list of layer indices", hint) from None
    if len(cut) != p - 1 or cut != sorted(set(cut)) or (cut and not 0 < cut[0] <= cut[-1] < n):
        raise Failure(f"{where}: returned {cut}, which does not cut {n} layers into {p} "
                      "non-empty stages", hint)
    return cut


BALANCE_CALLED = ("read the message above; call balance(layer_times, p) yourself on a short "
                  "list to see the whole traceback.")


@check("balance stages")
def check_balance(fn):
    """``fn(layer_times, p)`` returns where to cut; the stream of micro-batches through the
    learner's stages is within 3 % of the best cut's simulated time, on several profiles."""
    refuse_reference(fn, _reference().balance)
    worst = 0.0
    for name, units, p in PROFILES:
        times = measured_layer_times(units)
        where = f"{name}, {len(units)} layers, p = {p}"
        cut = _valid_cut(where, on_a_rank(fn, (list(times), p), f"{where}: balance",
                                         BALANCE_CALLED), len(units), p)
        best_cut, best = _best(units, p)
        mine = _stream(units, p, cut, where)
        stages = ", ".join(seconds(s) for s in _stage_sums(times, p, cut))
        worst = max(worst, within_best(
            where, mine, best, BALANCE_TOLERANCE,
            f"your cut {cut} makes stages of {stages}; {MICRO_BATCHES} micro-batches took",
            f"the best cut {best_cut}'s {seconds(best)}", BALANCE_HINT))
    return (f"within {worst - 1:.1%} of the best cut's simulated time on {len(PROFILES)} "
            "profiles (p = 1, 3, 4; one stage per layer)")


# ------------------------------------------------------ exercise 3: bytes on the link

# (world size, boundaries, rows, dtype) of check_boundary_bytes
BYTE_CASES = ((2, [2], 5, torch.float32), (3, [2, 5], 7, torch.bfloat16),
              (4, [1, 3, 6], 3, torch.float64), (4, [2, 4, 7], 16, torch.float32))


def _measured_bytes(p, boundaries, rows, dtype):
    """Bytes the reference sends across each boundary (both directions), measured."""
    ref = _reference()

    def body():
        rank = dist.get_rank()
        stages = pipeline.split(make_model(0, dtype), p, boundaries)
        x, y = batch(rows, dtype=dtype)
        ref.forward_backward(stages[rank], in_shapes(stages, x)[rank], x, y, mse)

    traffic = sc.Cluster.preset("dgx-a100").run(body, world_size=p).traffic
    return [traffic.get((i, i + 1), 0) + traffic.get((i + 1, i), 0) for i in range(p - 1)]


def _byte_counts(fn, p):
    """``fn`` whose answer, if it is an iterable (a generator too), is read into a list on
    the rank, where a generator that never ends is stopped; ``p`` + 1 items are enough to
    say there are too many."""

    def counts(*args):
        got = fn(*args)
        if isinstance(got, (str, bytes, dict)) or not hasattr(got, "__iter__"):
            return got
        return list(itertools.islice(got, p + 1))

    return counts


def _is_count(value):
    """A whole, finite number of bytes (an int, a numpy int, a float like 40.0)."""
    value = number(value)
    return value is not None and math.isfinite(value) and value == int(value) and value >= 0


@check("bytes across boundaries")
def check_boundary_bytes(fn):
    """``fn(stages, in_shape)`` returns the bytes crossing each boundary in one forward and
    backward step; compared with the simulator's measured traffic."""
    refuse_reference(fn, _reference().boundary_bytes)
    for p, boundaries, rows, dtype in BYTE_CASES:
        dtype_text = str(dtype).replace("torch.", "")
        where = f"{_where(p, boundaries)}; {rows} rows of {dtype_text}"
        expected = _measured_bytes(p, boundaries, rows, dtype)
        stages = pipeline.split(make_model(0, dtype), p, boundaries)
        got = on_a_rank(_byte_counts(fn, p), (stages, (rows, FEATURES)),
                        f"{where}: boundary_bytes")
        if not isinstance(got, list) or not all(_is_count(b) for b in got):
            raise Failure(f"{where}: returned {short(repr(got), 80)}, not a list of byte "
                          "counts", "return one number per boundary: a list of "
                          "len(stages) - 1 ints.")
        got = [int(b) for b in got]
        if len(got) != p - 1:
            raise Failure(f"{where}: returned {len(got)} numbers for {p - 1} boundaries",
                          "one number per boundary between consecutive stages: "
                          "len(stages) - 1 of them.")
        for i, (e, g) in enumerate(zip(expected, got)):
            if e == g:
                continue
            size = torch.empty((), dtype=dtype).element_size()
            if 2 * g == e:
                hint = _more("bytes", "that is the forward activation only: what comes "
                             "back across the same boundary in backward?")
            elif g * size == e:
                hint = _more("bytes", "that is a count of elements: the link carries bytes.")
            else:
                hint = _more("bytes", "the activation leaving stage i is the output of its "
                             "last layer: what shape and dtype does it have for this input?")
            raise Failure(f"{where}: boundary {i} (stage {i} → {i + 1}): the simulator "
                          f"measured {num(e)} bytes, you said {num(g)}", hint)
    return (f"bytes per boundary equal the measured traffic on {len(BYTE_CASES)} splits "
            "(float32, bfloat16, float64)")
