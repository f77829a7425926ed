"""Lab 04's checks (model parallelism, the naive split): every check passes the reference
answer, refuses the reference itself (and the lesson's own naive split), and reports each
mistake the lab is about — including ones that deadlock or raise — as one exact ❌ line."""

import itertools
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from _check_helpers import learner_namespace, line, not_started
from workbook import checking
from workbook.lesson04_model_parallel import checks, demos
from workbook.lesson04_model_parallel import _reference as R

NAMES = {checks.check_forward_backward: "forward and backward across stages",
         checks.check_balance: "balance stages",
         checks.check_boundary_bytes: "bytes across boundaries"}   # as each check prints it
STAGES, BALANCE, BYTES = (f"❌ {name}: " for name in NAMES.values())

MINE = learner_namespace(R, R.forward_backward, R.balance, R.boundary_bytes)


def expect(capsys, check, answer, message):
    assert line(capsys, check, answer)[1] == message


# ------------------------------------------------------------ the reference passes


@pytest.mark.parametrize("check, answer, text", [
    (checks.check_forward_backward, MINE["forward_backward"],
     "loss and gradients equal the whole model's on world sizes 1, 2, 3, 4, activations of 6 "
     "different widths"),
    pytest.param(checks.check_balance, MINE["balance"],
                 "within 0.0% of the best cut's simulated time on 7 profiles (p = 1, 3, 4; "
                 "one stage per layer)", marks=pytest.mark.slow),   # simulates every cut
    (checks.check_boundary_bytes, MINE["boundary_bytes"],
     "bytes per boundary equal the measured traffic on 4 splits (float32, bfloat16, "
     "float64)"),
])
def test_reference_passes(capsys, check, answer, text):
    expect(capsys, check, answer, f"✅ {NAMES[check]}: {text}")


@pytest.mark.parametrize("check, reference", [
    (checks.check_forward_backward, R.forward_backward),
    (checks.check_forward_backward, demos.naive_split_step),
    (checks.check_balance, R.balance),
    (checks.check_boundary_bytes, R.boundary_bytes),
])
def test_the_reference_itself_is_refused(capsys, check, reference):
    expect(capsys, check, reference,
           f"❌ {NAMES[check]}: this function is the workbook's own reference answer, not "
           "yours — Hint: the exercise is to write it yourself, in the cell above.")


def test_an_unwritten_exercise_says_so(capsys):
    def forward_backward(stage, in_shape, x, y, loss_fn):
        raise NotImplementedError("recv, forward, send; then the gradients back")

    not_started(capsys, checks.check_forward_backward, forward_backward,
                NAMES[checks.check_forward_backward], "recv, forward, send; then the gradients back")


def test_the_lab_does_not_import_the_answers():
    # What the lab imports must not load the answers nor the lesson's naive split.
    code = ("import sys, workbook.lesson04_model_parallel.checks, workbook.lesson04_model_parallel.lab; print(sorted("
            "m for m in ('workbook.lesson04_model_parallel._reference', 'workbook.lesson04_model_parallel.demos') "
            "if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout
    assert out.strip() == "[]"


# ------------------------------------------------ exercise 1: forward and backward


def receives_the_gradient_first(stage, in_shape, x, y, loss_fn):
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        x = torch.empty(in_shape)
        dist.recv(x, rank - 1)
        x.requires_grad_()
    out = stage(x)
    if rank == p - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        grad = torch.empty_like(out)
        dist.recv(grad, rank + 1)           # waits for a gradient nobody can compute yet
        dist.send(out.detach(), rank + 1)
        out.backward(grad)
        loss = None
    if rank > 0:
        dist.send(x.grad, rank - 1)
    return loss


def forgets_requires_grad(stage, in_shape, x, y, loss_fn):
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        x = torch.empty(in_shape)
        dist.recv(x, rank - 1)
    out = stage(x)
    loss = None
    if rank == p - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, rank + 1)
        out.backward(grad)
    if rank > 0:
        dist.send(x.grad, rank - 1)
    return loss


def gradient_buffer_shaped_like_the_input(stage, in_shape, x, y, loss_fn):
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        x = torch.empty(in_shape)
        dist.recv(x, rank - 1)
        x.requires_grad_()
    out = stage(x)
    loss = None
    if rank == p - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), rank + 1)
        grad = torch.empty_like(x)
        dist.recv(grad, rank + 1)
        out.backward(grad)
    if rank > 0:
        dist.send(x.grad, rank - 1)
    return loss


def returns_nothing(stage, in_shape, x, y, loss_fn):
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        x = torch.empty(in_shape)
        dist.recv(x, rank - 1)
        x.requires_grad_()
    out = stage(x)
    if rank == p - 1:
        loss_fn(out, y).backward()
    else:
        dist.send(out.detach(), rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, rank + 1)
        out.backward(grad)
    if rank > 0:
        dist.send(x.grad, rank - 1)


def loss_of_the_stage_sum(stage, in_shape, x, y, loss_fn):
    # every stage but the last backpropagates its own output's sum instead of the
    # gradient it received
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        x = torch.empty(in_shape)
        dist.recv(x, rank - 1)
        x.requires_grad_()
    out = stage(x)
    loss = None
    if rank == p - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, rank + 1)
        out.sum().backward()
    if rank > 0:
        dist.send(x.grad, rank - 1)
    return loss


def returns_the_output_everywhere(stage, in_shape, x, y, loss_fn):
    # the lab says the other ranks return None; this one returns its stage's output
    loss = MINE["forward_backward"](stage, in_shape, x, y, loss_fn)
    return loss if dist.get_rank() == dist.get_world_size() - 1 else stage(
        torch.zeros(in_shape)).detach()


def sends_back_twice_the_gradient(stage, in_shape, x, y, loss_fn):
    # a backward bug: the forward (and the loss) is right
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        x = torch.empty(in_shape)
        dist.recv(x, rank - 1)
        x.requires_grad_()
    out = stage(x)
    loss = None
    if rank == p - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(out.detach(), rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, rank + 1)
        out.backward(2 * grad)
    if rank > 0:
        dist.send(x.grad, rank - 1)
    return loss


def wrong_forward(stage, in_shape, x, y, loss_fn):
    # a forward bug: the next rank gets twice the activation, so the loss differs
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank > 0:
        x = torch.empty(in_shape)
        dist.recv(x, rank - 1)
        x.requires_grad_()
    out = stage(x)
    loss = None
    if rank == p - 1:
        loss = loss_fn(out, y)
        loss.backward()
    else:
        dist.send(2 * out.detach(), rank + 1)
        grad = torch.empty_like(out)
        dist.recv(grad, rank + 1)
        out.backward(grad)
    if rank > 0:
        dist.send(x.grad, rank - 1)
    return loss


@pytest.mark.parametrize("answer, message", [
    (receives_the_gradient_first,
     "world size 2, cut before layers 3: deadlock (rank 0: recv from rank 1; rank 1: recv "
     "from rank 0) — Hint: every waiting rank is receiving and nobody is sending: make one "
     "side send first, or use isend/irecv."),
    (forgets_requires_grad,
     "world size 2, cut before layers 3: rank 1 raised TypeError: Invalid function "
     "argument. Expected parameter `tensor` of type torch.Tensor — Hint: "
     + checks.HINTS["requires_grad"]),
    (gradient_buffer_shaped_like_the_input,
     "world size 2, cut before layers 3: mismatch in send/recv on group WORLD: the "
     "shape/dtype differs (rank 0: receives (5, 6) torch.float32, rank 1: sends (5, 12) "
     "torch.float32) — Hint: the receiving tensor must have the same shape and dtype as "
     "the sent one."),
    (returns_nothing,
     "world size 1: the last rank returned None, not the loss — Hint: " + checks.HINTS["loss"]),
    (returns_the_output_everywhere,
     "world size 2, cut before layers 3: rank 0 returned a tensor, not None — Hint: "
     + checks.HINTS["loss"]),
    (sends_back_twice_the_gradient,
     "world size 2, cut before layers 3: rank 0, gradient of 0.weight, element 0: "
     "expected -0.001508, got -0.003016 — Hint: " + checks.HINTS["backward"]),
    (loss_of_the_stage_sum,
     "world size 2, cut before layers 3: rank 0, gradient of 0.weight, element 0: "
     "expected -0.001508, got 2.74 — Hint: " + checks.HINTS["backward"]),
])
def test_forward_backward_mistakes(capsys, short_timeout, answer, message):
    expect(capsys, checks.check_forward_backward, answer, STAGES + message)


def test_a_stage_that_skips_backward_has_no_gradient(capsys, short_timeout):
    def first_stage_skips_backward(stage, in_shape, x, y, loss_fn):
        rank, p = dist.get_rank(), dist.get_world_size()
        if rank > 0:
            x = torch.empty(in_shape)
            dist.recv(x, rank - 1)
            x.requires_grad_()
        out = stage(x)
        loss = None
        if rank == p - 1:
            loss = loss_fn(out, y)
            loss.backward()
        else:
            dist.send(out.detach(), rank + 1)
            grad = torch.empty_like(out)
            dist.recv(grad, rank + 1)
            if rank > 0:
                out.backward(grad)
        if rank > 0:
            dist.send(x.grad, rank - 1)
        return loss

    expect(capsys, checks.check_forward_backward, first_stage_skips_backward,
           STAGES + "world size 2, cut before layers 3: rank 0, gradient of 0.weight is "
           "None (this stage did not run backward) — Hint: " + checks.HINTS["no_grad"])


def test_a_forward_bug_gets_the_forward_hint_not_the_backward_one(capsys, short_timeout):
    text = line(capsys, checks.check_forward_backward, wrong_forward)[1]
    assert text.startswith(STAGES + "world size 2, cut before layers 3: the loss is "), text
    assert text.endswith("— Hint: " + checks.HINTS["forward"]), text


# ------------------------------------------------------------- exercise 2: balance

def equal_layer_counts(layer_times, p):
    n = len(layer_times)
    sizes = [n // p + (1 if i < n % p else 0) for i in range(p)]
    return [sum(sizes[:i + 1]) for i in range(p - 1)]


def cut_at_the_running_average(layer_times, p):
    total, cut, acc = sum(layer_times), [], 0.0
    for i, t in enumerate(layer_times):
        if len(cut) < p - 1 and acc >= (len(cut) + 1) * total / p:
            cut.append(i)
        acc += t
    return cut


def last_layer_of_each_stage(layer_times, p):
    # the best cut, given as the last layer of stages 0 … p-2 instead of the first of the next
    return [b - 1 for b in MINE["balance"](layer_times, p)]


def sorts_the_layers(layer_times, p):
    return layer_times.sort()[:p - 1]


PACE = checks.BALANCE_HINT


def fastest_stage_as_slow_as_possible(layer_times, p):
    # the wrong objective: the smallest stage as large as possible
    n, best, best_min = len(layer_times), None, -1.0
    for cut in itertools.combinations(range(1, n), p - 1):
        edges = (0, *cut, n)
        smallest = min(sum(layer_times[a:b]) for a, b in zip(edges, edges[1:]))
        if smallest > best_min:
            best, best_min = list(cut), smallest
    return best
LM3 = "language model (heavy head), 9 layers, p = 3: "


@pytest.mark.parametrize("answer, message", [
    (equal_layer_counts,
     LM3 + "your cut [3, 6] makes stages of 10.572 ms, 10.572 ms, 21.144 ms; 4 micro-batches "
     "took 106.833 ms, 1.25× the best cut [4, 8]'s 85.689 ms — Hint: " + PACE),
    (cut_at_the_running_average,
     LM3 + "your cut [5, 8] makes stages of 17.620 ms, 10.572 ms, 14.096 ms; 4 micro-batches "
     "took 95.832 ms, 1.12× the best cut [4, 8]'s 85.689 ms — Hint: " + PACE),
    (last_layer_of_each_stage,
     LM3 + "your cut [3, 7] makes stages of 10.572 ms, 14.096 ms, 17.620 ms; 4 micro-batches "
     "took 96.261 ms, 1.12× the best cut [4, 8]'s 85.689 ms — Hint: " + PACE),
    (sorts_the_layers,
     LM3 + "balance raised TypeError: 'NoneType' object is not subscriptable — Hint: read "
     "the message above; call balance(layer_times, p) yourself on a short list to see the "
     "whole traceback."),
    (fastest_stage_as_slow_as_possible,
     "heavy second layer, 4 layers, p = 3: your cut [2, 3] makes stages of 17.620 ms, "
     "7.048 ms, 7.048 ms; 4 micro-batches took 85.161 ms, 1.14× the best cut [1, 2]'s "
     "75.018 ms — Hint: " + PACE),
    (lambda layer_times, p: list(range(1, p + 1)),
     LM3 + "returned [1, 2, 3], which does not cut 9 layers into 3 non-empty stages — Hint: "
     "return the 2 indices of the layers where stages 1 … 2 start, increasing, each "
     "between 1 and 8 (layer 0 always starts stage 0)."),
])
def test_balance_mistakes(capsys, answer, message):
    expect(capsys, checks.check_balance, answer, BALANCE + message)


def test_a_balance_that_never_ends_is_stopped(capsys, short_timeout):
    def cut_where_the_sum_passes(layer_times, p):
        cut, i = [], 1
        while len(cut) < p - 1:
            if sum(layer_times[:i]) > sum(layer_times) / p:
                cut.append(i)          # i is never incremented
        return cut

    expect(capsys, checks.check_balance, cut_where_the_sum_passes,
           BALANCE + LM3 + "balance: your function was still running after 2 s of "
           "work: it used 2 s of CPU time (an endless loop?) — Hint: " + checking.HINTS["timeout"])


# ------------------------------------------------------- exercise 3: boundary bytes

def forward_only(stages, in_shape):
    x = torch.zeros(in_shape, dtype=next(stages[0].parameters()).dtype)
    sizes = []
    with torch.no_grad():
        for stage in stages[:-1]:
            x = stage(x)
            sizes.append(x.numel() * x.element_size())
    return sizes


def counts_elements(stages, in_shape):
    x = torch.zeros(in_shape, dtype=next(stages[0].parameters()).dtype)
    sizes = []
    with torch.no_grad():
        for stage in stages[:-1]:
            x = stage(x)
            sizes.append(2 * x.numel())
    return sizes


def the_stage_inputs(stages, in_shape):
    x = torch.zeros(in_shape, dtype=next(stages[0].parameters()).dtype)
    sizes = []
    with torch.no_grad():
        for stage in stages[:-1]:
            sizes.append(2 * x.numel() * x.element_size())
            x = stage(x)
    return sizes


def assumes_float32(stages, in_shape):
    x = torch.zeros(in_shape)
    sizes = []
    with torch.no_grad():
        for stage in stages[:-1]:
            x = stage(x)
            sizes.append(2 * x.numel() * 4)
    return sizes


BYTES_CASE = "world size 2, cut before layers 2; 5 rows of float32: boundary 0 (stage 0 → 1): "


@pytest.mark.parametrize("answer, message", [
    (forward_only,
     BYTES_CASE + "the simulator measured 640 bytes, you said 320 — Hint: that is the "
     "forward activation only: what comes back across the same boundary in backward? "
     "(more help: checks.hint('bytes'))"),
    (counts_elements,
     BYTES_CASE + "the simulator measured 640 bytes, you said 160 — Hint: that is a count "
     "of elements: the link carries bytes. (more help: checks.hint('bytes'))"),
    (the_stage_inputs,
     BYTES_CASE + "the simulator measured 640 bytes, you said 240 — Hint: the activation "
     "leaving stage i is the output of its last layer: what shape and dtype does it have "
     "for this input? (more help: checks.hint('bytes'))"),
    (assumes_float32,
     "world size 3, cut before layers 2, 5; 7 rows of bfloat16: boundary_bytes raised "
     "RuntimeError: mat1 and mat2 must have the same dtype, but got Float and BFloat16 — "
     "Hint: " + checking.HINTS["called"]),
    (lambda stages, in_shape: [0] * len(stages),
     "world size 2, cut before layers 2; 5 rows of float32: returned 2 numbers for 1 "
     "boundaries — Hint: one number per boundary between consecutive stages: "
     "len(stages) - 1 of them."),
])
def test_boundary_bytes_mistakes(capsys, answer, message):
    expect(capsys, checks.check_boundary_bytes, answer, BYTES + message)


# ---------------------- plain functions: loops, sys.exit, malformed returns (issue 24)

FIRST_SPLIT = "world size 2, cut before layers 2; 5 rows of float32"


def test_boundary_bytes_that_loops_or_exits_is_a_failure(capsys, short_timeout):
    def forever(stages, in_shape):
        while True:
            pass

    def endless_generator(stages, in_shape):
        while True:
            yield 640

    def exits(stages, in_shape):
        raise SystemExit("done")

    expect(capsys, checks.check_boundary_bytes, forever, BYTES + FIRST_SPLIT + ": "
           "boundary_bytes: your function was still running after 2 s of work: it used 2 s of "
           "CPU time (an endless loop?) — Hint: " + checking.HINTS["timeout"])
    # a generator is read on the rank, and only as far as it takes to see too many
    expect(capsys, checks.check_boundary_bytes, endless_generator, BYTES + FIRST_SPLIT +
           ": returned 3 numbers for 1 boundaries — Hint: one number per boundary between "
           "consecutive stages: len(stages) - 1 of them.")
    expect(capsys, checks.check_boundary_bytes, exits, BYTES + FIRST_SPLIT + ": "
           "boundary_bytes called sys.exit('done') — Hint: " + checking.HINTS["exit"])


def raising_generator(stages, in_shape):
    yield 640
    raise ValueError("no more")


@pytest.mark.parametrize("answer, message", [
    (lambda stages, in_shape: [float("inf")], "returned [inf], not a list of byte counts"),
    (lambda stages, in_shape: [float("nan")], "returned [nan], not a list of byte counts"),
    (lambda stages, in_shape: 640, "returned 640, not a list of byte counts"),
    (lambda stages, in_shape: ["640"], "returned ['640'], not a list of byte counts"),
    (raising_generator, "boundary_bytes raised ValueError: no more"),
])
def test_boundary_bytes_malformed_returns_are_a_failure(capsys, answer, message):
    text = line(capsys, checks.check_boundary_bytes, answer)[1]
    assert text.startswith(BYTES + FIRST_SPLIT + ": " + message), text


def test_boundary_bytes_accepts_numpy_integers(capsys):
    import numpy as np
    mine = MINE["boundary_bytes"]
    assert line(capsys, checks.check_boundary_bytes,
                lambda stages, in_shape: [np.int64(b) for b in mine(stages, in_shape)])[0]
