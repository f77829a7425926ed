"""The checks of lab 08 (memory and precision), on the protocol of
:mod:`workbook.checking`, and the helpers the lab gives the learner.

* :func:`check_bytes_per_parameter` compares the learner's bytes per parameter with what
  the simulator measures right after an optimizer step (parameters, gradients, optimizer
  state) for every recipe: fp32 / bf16 / fp16 weights, SGD / SGD with momentum / Adam,
  with or without fp32 master weights (:class:`MasterWeights`).
* :func:`check_loss_scaler` trains a small model under ``torch.autocast`` (float16) with the
  learner's ``LossScaler`` and with ``torch.amp.GradScaler``, on sequences of steps whose
  gradients overflow (a scale too large, a huge input, a NaN), and compares them step by
  step: the scale, which steps are skipped, the parameters.
* :func:`check_checkpointing` applies ``torch.utils.checkpoint`` to the blocks the learner
  chooses in a stack of attention and MLP blocks (fake tensors, one simulated A100), for
  three caps on activation memory, two drawn afresh each run at a boundary and one where
  a checkpointed block counted as 0 bytes does not fit: the peak
  must fit, and the recompute time must be
  within 5 % of the best choice's.
* :func:`check_fit` runs the learner's training function on a small simulated device on
  which plain training runs out of memory: it must complete, with every step's loss and
  the trained model's loss within 0.01 % of plain fp32 training on a device large enough.

The reference answers (:mod:`._reference`) are imported inside the checks only.
"""

import contextlib
import functools
import inspect
import itertools
import math
import random

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

import simcluster as sc
from simcluster.accounting import current
from workbook.hints import Hints
from workbook.checking import (Failure, HINTS, answers, check, first_difference, num,
                               number, on_a_rank, raised, refuse_reference, seconds, short,
                               simulate, within_best)
from workbook.lesson08_memory_and_precision.lab import (CHECKPOINT_CAPS, FIT_LR, FIT_MEMORY,
                                                        FIT_STEPS, MiB, SCALER_STEPS,
                                                        _fit_body, _profile, fit_cluster,
                                                        fit_data, fit_model,
                                                        measure_checkpoints, oom_text,
                                                        scaled_training, train_plain)


_reference = answers(__name__)   # the answers, imported only while a check runs


# Progressive help, one step per call of checks.hint("bytes") in the lab: a question, the
# idea, then the shape of the code (workbook.hints).
hint = Hints({
    "bytes": [
        "Which tensors exist per parameter between two steps, for each recipe? Write them "
        "down for ('bfloat16', 'adam', True) before any code.",
        "The weight and its gradient in the weights' dtype; the optimizer's state tensors "
        "in the dtype of the tensor they update; with master weights an fp32 copy of every "
        "parameter, and the optimizer (and its state) works on the copy.",
    ],
    "scaler": [
        "Read GradScaler's rules in the exercise as a small state machine: what does it "
        "have to remember from one call to the next?",
        "State: the scale, the two factors, the interval, how many good steps in a row, "
        "and whether the last step() found an inf or a NaN (update() needs to know).",
        "step() looks at every gradient of every parameter group (torch.isfinite), and "
        "either skips or unscales in place and steps; update() backs off and restarts the "
        "count after a skip, else counts and grows when the count reaches the interval.",
    ],
    "checkpoints": [
        "Estimate first: walk the blocks in forward order; what does the memory hold when "
        "block i runs, and what at the end of the forward? Then: how many choices are "
        "there for eight blocks?",
        "peak_estimate: a running total of what earlier blocks keep (kept, or output when "
        "checkpointed) plus this block's peak, and the total at the end. "
        "choose_checkpoints: 256 subsets are few enough to try every one.",
        "itertools.combinations over every size gives the subsets; keep those whose "
        "estimate fits the cap; return the one with the least total recompute.",
    ],
    "fit": [
        "What takes the memory in plain training here, and which of the lesson's two "
        "tools cuts it without changing the losses?",
        "Micro-batches with gradient accumulation keep the same gradient only if each "
        "micro-batch's loss is divided by their number and the optimizer steps once per "
        "step; checkpointing the blocks cuts what each micro-batch keeps.",
        "Per step: for each of k chunks of x and y, run the blocks (checkpointed), "
        "backward the loss / k and add its value; then one optimizer step and zero_grad.",
    ],
})


_DEMOS = "workbook.lesson08_memory_and_precision.demos"


def refuse_lesson_helpers(fn, what="function"):
    """Fail if ``fn`` is, or names, a function of the lesson's own module
    (:mod:`.demos`): its demos measure what the lab asks the learner to work
    out."""
    candidate = inspect.unwrap(fn) if callable(fn) else fn
    named = [candidate]
    if getattr(candidate, "__code__", None) is not None:
        found = inspect.getclosurevars(candidate)
        named += [*found.nonlocals.values(), *found.globals.values()]
    for value in named:
        module = value.__name__ if inspect.ismodule(value) else getattr(value, "__module__",
                                                                        None)
        # the demos by their name, or by their deprecated alias (workbook._aliases)
        if module in (_DEMOS, "workbook.precision"):
            raise Failure(f"this {what} uses the lesson's own helpers ({_DEMOS}), not yours",
                          HINTS["reference"])


# ------------------------------------------------------------- exercise 1: bytes per parameter


def recipe_text(weights, optimizer, master_weights):
    """``"bfloat16 weights, Adam, fp32 master weights"``."""
    name = {"sgd": "SGD", "momentum": "SGD with momentum", "adam": "Adam"}[optimizer]
    return f"{weights} weights, {name}" + (", fp32 master weights" if master_weights else "")


@functools.cache
def _measured():
    run = sc.Cluster.preset("dgx-a100").run(_reference().measured_bytes_per_parameter,
                                            world_size=1)
    return run.results[0]


def _slips(ref, recipe, measured):
    """``{slip: (the total it gives, why)}`` for one recipe: each part left out, or
    counted in the wrong dtype, that changes this recipe's bytes per parameter."""
    weights, optimizer, master = recipe
    w, n = ref.ELEMENT_BYTES[weights], ref.STATES[optimizer]
    total = sum(measured.values())
    grads, each = measured["gradients"], 4 if master else w   # bytes of one state tensor
    slips = {}
    if master:
        slips["no copy"] = (total - 4, "with master weights there is also an fp32 copy of "
                                       "every parameter (4 bytes), held between steps.")
        if w != 4 and n:
            slips["state dtype"] = (total - 4 * n + n * w, "with master weights the "
                                    "optimizer updates the fp32 copy, so its state is fp32 "
                                    "too (4 bytes per tensor).")
    else:
        slips["copy"] = (total + 4, "without master weights there is no fp32 copy: the "
                                    "optimizer updates the parameter itself.")
        if w != 4 and n:
            slips["state dtype"] = (total - n * w + 4 * n, "without master weights the "
                                    "optimizer's state is in the dtype of the parameter it "
                                    "updates.")
    if w != 4:
        slips["gradient dtype"] = (total - grads + 4, f"a gradient has its parameter's "
                                                      f"dtype ({w} bytes here), not fp32.")
    slips["no gradients"] = (total - grads, "the gradients are held between steps too "
                                            "(until the next zero_grad).")
    if n:
        slips["no state"] = (total - n * each, f"{recipe_text(weights, optimizer, False)}"
                             f"".split(", ")[1] + f" keeps {n} state tensor"
                             f"{'s' if n > 1 else ''} per parameter.")
    return slips


def _bytes_hint(ref, answers, wrong):
    """The hint for a wrong count of bytes per parameter at recipe ``wrong``: the slips
    that give its answer and agree with the answers to every other recipe (``answers``:
    ``{recipe: (answer, measured parts)}``). Two slips can give the same number for one
    recipe (bf16, momentum, master weights: no gradients or bf16 state both give 10);
    the other recipes tell them apart, and if they cannot, the hint names both."""
    def gives(value, target):
        return value is not None and math.isclose(value, target, rel_tol=0.01)

    got, measured = answers[wrong]
    here = {k: why for k, (value, why) in _slips(ref, wrong, measured).items()
            if gives(got, value)}
    agree = []
    for slip, why in here.items():
        consistent = True
        for recipe, (answer, parts) in answers.items():
            value = _slips(ref, recipe, parts).get(slip, (None,))[0]
            if not (gives(answer, sum(parts.values())) or gives(answer, value)):
                consistent = False
                break
        if consistent:
            agree.append(why)
    named = agree or list(here.values())
    if not named:
        return ("compare your count with each part the simulator measured. "
                + hint.pointer("bytes"))
    if len(named) == 1:
        return named[0]
    return "either " + ", or ".join(why.rstrip(".") for why in named) + "."


# How far an answer may be from the measurement: the measurement is exact up to a few
# bytes of bookkeeping per parameter tensor; the smallest slip (a 2-byte part of 16) is 12 %.
BYTES_TOL = 0.01


@check("bytes per parameter")
def check_bytes_per_parameter(fn):
    """``fn(weights, optimizer, master_weights)``: bytes per parameter (parameters,
    gradients, optimizer state) right after a step, for all 18 recipes, equal to the
    simulator's measurement (within 1 %)."""
    ref = _reference()
    refuse_reference(fn, ref.bytes_per_parameter)
    refuse_reference(fn, ref.measured_bytes_per_parameter)
    refuse_lesson_helpers(fn)
    recipes = list(_measured())

    def ask_all():
        answers = []
        for recipe in recipes:
            try:
                answers.append((True, fn(*recipe)))
            except Exception as error:  # noqa: BLE001 — the learner's mistake, reported
                answers.append((False, error))
                break
        return answers

    answers = on_a_rank(ask_all, (), "bytes_per_parameter")
    given = {recipe: (number(got), _measured()[recipe])
             for recipe, (returned, got) in zip(recipes, answers) if returned}
    for recipe, (returned, got) in zip(recipes, answers):
        where = recipe_text(*recipe)
        if not returned:
            raise raised(where, got, HINTS["called"])
        measured = _measured()[recipe]
        total = sum(measured.values())
        if number(got) is None or not math.isclose(number(got), total, rel_tol=BYTES_TOL):
            said = num(got) if number(got) is not None else short(repr(got), 60)
            parts = ", ".join(f"{k} {num(round(v, 2))}" for k, v in measured.items())
            raise Failure(f"{where}: you said {said} bytes per parameter, the simulator "
                          f"measured {num(round(total, 2))} ({parts})",
                          _bytes_hint(ref, given, recipe))
    return f"all {len(recipes)} recipes equal the simulator's measurement"


# ------------------------------------------------------------- exercise 2: loss scaling

SCALER_CASES = (
    {"init_scale": 2.0**24, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 3},
    {"init_scale": 2.0**8, "growth_factor": 4.0, "backoff_factor": 0.25, "growth_interval": 2},
    {"init_scale": 1.0, "growth_factor": 2.0, "backoff_factor": 0.5, "growth_interval": 1},
)


def _case_text(case):
    return (f"init_scale {num(case['init_scale'])}, ×{num(case['growth_factor'])} after "
            f"{case['growth_interval']} good steps, ×{num(case['backoff_factor'])} on "
            "overflow")


def _scaler_log(cls, case):
    where = _case_text(case)
    run = simulate(sc.Cluster.preset("dgx-a100"),
                   lambda: scaled_training(cls, case), 1, lambda rank: where)
    return run.results[0]


@functools.cache
def _grad_scaler_log(index):
    return _scaler_log(functools.partial(torch.amp.GradScaler, "cpu"), SCALER_CASES[index])


def _compare_scaler(mine, torch_log, where):
    for step, m in enumerate(mine):
        if m.get("type", "float") != "float":
            at = f"before step {step}" if step < SCALER_STEPS else "at the end"
            kind = m["type"]
            if kind == "int":
                why = ("an int is not a float (int(init_scale) stays an int when multiplied "
                       "by 2): return float(...) of the scale.")
            elif kind.endswith("tensor"):
                why = "a tensor holding the number is not that: return its .item()."
            else:
                why = f"a {kind} is not that: return float(...) of the scale."
            article = "an" if kind[0] in "aeiou8" else "a"
            raise Failure(f"{where}: {at}, get_scale() returned {article} {kind}, not a "
                          "float", "the lab asks for the scale as a Python float, which is "
                          "what GradScaler's get_scale() returns: its callers print, compare "
                          "and log it; " + why)
    for step, (m, t) in enumerate(zip(mine, torch_log)):
        at = f"{where}: before step {step}" if step < SCALER_STEPS else f"{where}: at the end"
        if m["scale"] != t["scale"]:
            previous = torch_log[step - 1] if step else None
            hint = ("start from init_scale." if previous is None else
                    "after a step with inf or NaN gradients (a skipped step), multiply the "
                    "scale by backoff_factor and start counting good steps again."
                    if not previous["stepped"] else
                    "count the good steps in a row; after growth_interval of them, multiply "
                    "the scale by growth_factor and start counting again.")
            raise Failure(f"{at}, your scale is {num(m['scale'])}, GradScaler's "
                          f"{num(t['scale'])}", hint)
        if step == SCALER_STEPS:
            break
        if m["stepped"] != t["stepped"]:
            raise Failure(f"{where}: step {step}: GradScaler "
                          + ("skipped it (a gradient was inf or NaN) and left the weights as "
                             "they were, yours changed them" if not t["stepped"] else
                             "stepped (every gradient was finite), yours left the weights "
                             "as they were"),
                          "when a gradient holds an inf or a NaN the step must not happen "
                          "at all (stepping with zeroed gradients still moves the weights "
                          "with momentum): does your test look at every gradient of every "
                          "parameter group, NaN included?" if not t["stepped"] else
                          "your scaler skipped a step whose gradients were all finite: what "
                          "does it test, and does it forget an earlier step's overflow?")
        for i, (e, g) in enumerate(zip(t["params"], m["params"])):
            diff = first_difference(e, g, lambda a, b: torch.isclose(a, b, rtol=1e-5,
                                                                     atol=1e-7))
            if diff is not None:
                raise Failure(f"{where}: after step {step}, parameter {i}, element "
                              f"{diff[0]}: GradScaler gives {num(diff[1])}, yours "
                              f"{num(diff[2])}", "divide every gradient by the scale "
                              "(unscale) before optimizer.step(): the loss was multiplied "
                              "by it, so its gradients were too.")


@contextlib.contextmanager
def _grad_scalers_made():
    """A list that gets one entry per ``torch.amp.GradScaler`` (or subclass, such as
    ``torch.cuda.amp.GradScaler``) made inside the block: a class that only wraps one has
    the check compare GradScaler with itself."""
    made, original = [], torch.amp.GradScaler.__init__

    @functools.wraps(original)
    def counted(self, *args, **kwargs):
        made.append(type(self))
        original(self, *args, **kwargs)

    torch.amp.GradScaler.__init__ = counted
    try:
        yield made
    finally:
        torch.amp.GradScaler.__init__ = original


@check("loss scaler")
def check_loss_scaler(cls):
    """``cls(init_scale, growth_factor, backoff_factor, growth_interval)`` with
    ``scale(loss)``, ``step(optimizer)``, ``update()`` and ``get_scale()``: on three
    sequences of 14 float16 steps with overflows, the same scale, the same skipped steps
    and the same parameters as ``torch.amp.GradScaler``."""
    refuse_reference(cls, _reference().LossScaler, "class")
    refuse_lesson_helpers(cls, "class")
    if isinstance(cls, type) and issubclass(cls, torch.amp.GradScaler):
        raise Failure("this class is torch.amp.GradScaler", "write LossScaler yourself; "
                      "the check compares it with GradScaler.")
    skipped = 0
    for index, case in enumerate(SCALER_CASES):
        where = _case_text(case)
        torch_log = _grad_scaler_log(index)
        with _grad_scalers_made() as made:
            mine = _scaler_log(cls, case)
        if made:
            raise Failure(f"{where}: your class made a torch.amp.GradScaler and let it do "
                          "the work", "write LossScaler yourself: keep the scale and the "
                          "count of good steps, check the gradients, unscale them and "
                          "decide whether to step. The check compares it with GradScaler.")
        _compare_scaler(mine, torch_log, where)
        skipped += sum(not t["stepped"] for t in torch_log[:-1])
    return (f"the same scales, skipped steps ({skipped} of {len(SCALER_CASES) * SCALER_STEPS})"
            " and parameters as torch.amp.GradScaler")


# ------------------------------------------------------------- exercise 3: checkpointing

RECOMPUTE_TOLERANCE = 1.05    # the learner's recompute time may be 5 % above the best
RECOMPUTE_HINT = ("some blocks free many bytes for little recompute time (compare kept − "
                  "output with recompute), and checkpointing a block near the end frees "
                  "nothing if its own recompute is the peak.")


def _chosen_blocks(got, where, n):
    try:
        if any(isinstance(i, bool) for i in got):     # a mask, not indices
            raise TypeError
        chosen = sorted(set(int(i) for i in got))
    except (TypeError, ValueError):
        raise Failure(f"{where}: returned {short(repr(got), 60)}",
                      "return a list of block indices (ints), e.g. [0, 2].") from None
    bad = [i for i in chosen if not 0 <= i < n]
    if bad:
        raise Failure(f"{where}: block {bad[0]} does not exist",
                      f"the blocks are numbered 0 to {n - 1}.")
    return chosen


def _boundary_caps(ref, profile, n=2):
    """``n`` caps drawn afresh each run, each exactly the estimated peak of the best choice
    under it, where "below the cap" (a strict ``<``) costs more than 5 % extra recompute:
    a table of answers for the lab's own caps, or a ``<`` where the lab says "fits", fails."""
    subsets = [set(c) for k in range(len(profile) + 1)
               for c in itertools.combinations(range(len(profile)), k)]
    peaks = sorted({ref.peak_activations(profile, c) for c in subsets})

    def least_recompute(fits):
        costs = [sum(profile[i]["recompute"] for i in c) for c in subsets
                 if fits(ref.peak_activations(profile, c))]
        return min(costs, default=math.inf)

    boundary = [cap for cap in peaks if cap not in CHECKPOINT_CAPS and 0 < least_recompute(
        lambda peak: peak <= cap) * 1.05 < least_recompute(lambda peak: peak < cap)]
    return tuple(sorted(random.sample(boundary, n), reverse=True))


def _outputs_as_nothing(profile, chosen):
    """The estimate with a checkpointed block keeping nothing (the slip: it keeps its
    output, the next block's input)."""
    below = peak = 0
    for i, block in enumerate(profile):
        peak = max(peak, below + block["peak"])
        below += 0 if i in chosen else block["kept"]
    return max(peak, below)


def _least_recompute(profile, estimate, cap):
    """The subset ``estimate`` says fits ``cap`` with the least recompute (or None)."""
    best = None
    for k in range(len(profile) + 1):
        for chosen in itertools.combinations(range(len(profile)), k):
            if estimate(profile, set(chosen)) <= cap:
                cost = sum(profile[i]["recompute"] for i in chosen)
                if best is None or cost < best[0]:
                    best = (cost, set(chosen))
    return None if best is None else best[1]


def _output_caps(ref, profile, n=1):
    """``n`` caps drawn afresh each run at which counting a checkpointed block as 0 bytes
    picks blocks that do not fit (the lab's three caps do not tell it apart)."""
    subsets = [set(c) for k in range(len(profile) + 1)
               for c in itertools.combinations(range(len(profile)), k)]
    caps = sorted({ref.peak_activations(profile, c) for c in subsets}
                  | {_outputs_as_nothing(profile, c) for c in subsets})
    wrong = [cap for cap in caps if cap not in CHECKPOINT_CAPS
             and ref.choose_checkpoints(profile, cap) is not None
             and ref.peak_activations(
                 profile, _least_recompute(profile, _outputs_as_nothing, cap) or set()) > cap]
    return tuple(random.sample(wrong, n))


def _over_cap_hint(profile, chosen, cap):
    """The hint for a choice whose measured peak is over ``cap``: the slip that makes it
    look as if it fits, when one does."""
    if _outputs_as_nothing(profile, chosen) <= cap:
        outputs = sorted({num(round(profile[i]["output"] / MiB, 1)) for i in chosen})
        return ("these blocks fit only if a checkpointed block keeps nothing after its "
                "forward; it keeps its output (the next block's input, "
                f"{' or '.join(outputs)} MiB here) until backward. "
                + hint.pointer("checkpoints"))
    return ("block i runs (in forward, and again in backward when it is checkpointed) on "
            "top of what the blocks before it keep: its peak plus their kept bytes (only "
            "the output of a checkpointed one). Check that estimate for every block, and "
            "the sum of all kept bytes.")


@check("activation checkpointing")
def check_checkpointing(fn):
    """``fn(profile, cap)`` returns the blocks to checkpoint; for each of six caps (three
    fixed, two drawn at a boundary by :func:`_boundary_caps`, one where a checkpointed
    block counted as 0 bytes does not fit, :func:`_output_caps`) the
    measured peak of activation memory fits, and the recompute time is at most 5 % above
    the best choice's."""
    ref = _reference()
    refuse_reference(fn, ref.choose_checkpoints)
    refuse_lesson_helpers(fn)
    profile = list(_profile())
    _, plain = measure_checkpoints(())
    caps = CHECKPOINT_CAPS + _boundary_caps(ref, profile) + _output_caps(ref, profile)
    worst = 0.0
    for cap in caps:
        where = f"cap {num(cap / MiB)} MiB"
        got = on_a_rank(fn, ([dict(row) for row in profile], cap), where)
        chosen = _chosen_blocks(got, where, len(profile))
        peak, elapsed = measure_checkpoints(chosen)
        if peak > cap:
            raise Failure(f"{where}: checkpointing blocks {chosen} peaks at "
                          f"{num(round(peak / MiB, 1))} MiB of activations",
                          _over_cap_hint(profile, set(chosen), cap))
        best_peak, best = measure_checkpoints(ref.choose_checkpoints(profile, cap))
        assert best_peak <= cap, "the reference's choice must fit"
        mine, theirs = elapsed - plain, best - plain
        worst = max(worst, within_best(
            where, mine, theirs, RECOMPUTE_TOLERANCE,
            f"blocks {chosen} fit, and recomputing them adds to the step",
            f"the best choice's {seconds(theirs)}", RECOMPUTE_HINT))
    return (f"fits the {len(caps)} caps, recompute within {worst - 1:.1%} of the "
            f"best choice's (step {seconds(plain)} without checkpointing)")


# ------------------------------------------------------------- exercise 4: make it fit

# Relative, on each loss. Right answers (micro-batches, checkpointing, bf16 autocast) stay
# within 3e-5; Adam's four steps move the loss only 2 % in all, so leaving out a
# micro-batch (4e-4), reporting one micro-batch's loss (9e-3), never zeroing the gradients
# (2e-3) or fp16 without a scaler (1e-3) would all pass a 1 % tolerance.
FIT_TOLERANCE = 1e-4


def _checked_fit_body(fn, memory):
    """:func:`_fit_body`, or the ``OutOfMemoryError`` it raised (for the check's words)."""
    try:
        return _fit_body(fn, memory)
    except sc.OutOfMemoryError as error:
        return error


@functools.cache
def _plain_fit():
    """Losses and final loss of plain training, in this process (no device limit)."""
    model = fit_model()
    x, y = fit_data()
    losses = train_plain(model, x, y, FIT_STEPS, FIT_LR, None)
    with torch.no_grad():
        return losses, F.mse_loss(model(x), y).item()


def _apart(mine, theirs):
    """``"0.390046, plain training's 0.390056 (0.003 % apart; the check allows 0.01 %)"``:
    six digits, as four can print the same number twice at this tolerance."""
    return (f"{mine:.6g}, plain training's {theirs:.6g} ({abs(mine / theirs - 1):.3%} "
            f"apart; the check allows {FIT_TOLERANCE:.2%})").replace("%", " %")


FIT_HINT = ("the model's parameters, gradients and Adam's state take 16 bytes per "
            "parameter whatever you do here; the rest is activations, proportional to "
            "the batch: run the batch in micro-batches (accumulate gradients, divide each "
            "micro-batch's loss by their number), checkpoint blocks, or both.")


def _loss_hint(step, ratio):
    """The hint for the first step whose loss differs: at step 0 the model is the initial
    one, so only the loss reported (or an update inside the step) can differ; later, with
    step 0 right, it is the training itself."""
    if step == 0:
        times = round(ratio)
        summed = (f"it is {times}× the whole batch's: " if times > 1 and abs(ratio - times)
                  < 1e-3 * times else "")
        return (f"{summed}step 0 starts from the initial model, so what differs is the loss "
                "you report (or an update inside the step): the loss of a step is the mean "
                "over the whole batch (with k equal micro-batches, add up each one's mean "
                "loss / k, over every micro-batch); optimizer.step() and "
                "optimizer.zero_grad() once per step, after every micro-batch.")
    return (f"steps before {step} match, so the loss is reported right and the training "
            "differs: one optimizer.step() and one optimizer.zero_grad() per step, after "
            "every micro-batch's backward, the same lr; autocast, if any, around the "
            "forward only, in bfloat16 (float16 without a loss scaler loses small "
            "gradients).")


@check("make it fit")
def check_fit(fn):
    """``fn(model, x, y, steps, lr, memory)`` trains on a simulated GPU of 16 and of 12
    MiB, on which plain training runs out of memory; it must finish, and every returned
    loss and the trained model's loss must be within 0.01 % of plain fp32 training's."""
    refuse_reference(fn, _reference().fit)
    refuse_lesson_helpers(fn)
    if inspect.unwrap(fn) is train_plain:
        raise Failure("this is train_plain, which runs out of memory", FIT_HINT)
    expected, final = _plain_fit()
    model = fit_model()
    x, y = fit_data()
    for memory in FIT_MEMORY:
        where = f"{num(memory / MiB)}-MiB GPU"
        run = simulate(fit_cluster(memory), _checked_fit_body, 1, lambda rank: where,
                       accounting=True, args=(fn, memory))
        if isinstance(run.results[0], sc.OutOfMemoryError):
            raise Failure(f"{where}: {oom_text(run.results[0])}", FIT_HINT)
        losses, params = run.results[0]
        if (not isinstance(losses, (list, tuple)) or len(losses) != FIT_STEPS
                or any(number(v) is None for v in losses)):
            raise Failure(f"{where}: returned {short(repr(losses), 60)}",
                          f"return a list of {FIT_STEPS} floats: each step's loss on the "
                          "whole batch, summed over micro-batches of the mean loss divided "
                          "by their number.")
        for step, v in enumerate(losses):
            if not isinstance(v, float):
                kind = (f"a {v.dim()}-d tensor" if isinstance(v, torch.Tensor)
                        else f"a value of type {type(v).__name__}")
                raise Failure(f"{where}: step {step}'s loss is {kind}, not a float",
                              "the lab asks for a list of Python floats, as train_plain "
                              "returns: a tensor holding the loss is not that (and one "
                              "that still has its graph keeps the step's activations "
                              "alive).")
        for step, (e, g) in enumerate(zip(expected, map(number, losses))):
            if not math.isclose(g, e, rel_tol=FIT_TOLERANCE):
                raise Failure(f"{where}: step {step}: your loss is {_apart(g, e)}",
                              _loss_hint(step, g / e))
        model.load_state_dict(params)
        with torch.no_grad():
            trained = F.mse_loss(model(x), y).item()
        if not math.isclose(trained, final, rel_tol=FIT_TOLERANCE):
            raise Failure(f"{where}: after training, the model's loss is "
                          f"{_apart(trained, final)}", "train on the whole batch "
                          "each step (every micro-batch), with the given lr, Adam, and "
                          "one optimizer.step() and one optimizer.zero_grad() per step. "
                          f"If your micro-batches differ in size (x.chunk(k) when k does "
                          f"not divide the batch of {len(x)}), weight each one's mean loss "
                          f"by its size / {len(x)}, not by 1/k.")
        peak = run.peak_memory(0)["total"]
    return (f"trains on GPUs of {' and '.join(num(m / MiB) for m in FIT_MEMORY)} MiB (peak "
            f"{peak / MiB:.1f} MiB on the last), the same losses as plain training")
