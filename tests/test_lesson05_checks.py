"""Lab 05's checks (pipeline parallelism): every check passes the reference answer, refuses
the reference itself, and reports each mistake the lab is about — schedules that deadlock,
raise, scale the loss wrongly, mix up the order of messages, hold too many micro-batches or
idle too long — as one exact ❌ line."""

from collections import deque

import pytest
import torch
import torch.distributed as dist

import simcluster as sc
from _check_helpers import learner_namespace, line, not_started
from workbook import checking
from workbook.lesson05_pipeline_parallel import checks, demos
from workbook.lesson05_pipeline_parallel import _reference as R
from workbook.lesson05_pipeline_parallel import checks as lesson05
from workbook.lesson05_pipeline_parallel import lab as lesson05_lab
from workbook.pipeline import bubble_formula

NAMES = {checks.check_gpipe: "GPipe",
         checks.check_1f1b: "1F1B",
         checks.check_interleaved_bubble: "interleaved bubble",
         checks.check_pick_m_v: "pick (m, v)"}   # as each check prints it
GPIPE, ONE_F_ONE_B, INTERLEAVED, PICK = (f"❌ {name}: " for name in NAMES.values())

MINE = learner_namespace(R, R.gpipe, R.one_f_one_b, R.interleaved_bubble, R.pick_m_v)


def expect(capsys, check, answer, message):
    assert line(capsys, check, answer)[1] == message


# ------------------------------------------------------------ the reference passes


VALUES = ("gradients equal the single-process model's on (p, m) (1, 3), (2, 1), (2, 4), "
          "(3, 5), (4, 2), (4, 8); bubble ")
GPIPE_BUBBLES = "p = 2, m = 4: 20.6% (formula 20.0%), p = 4, m = 8: 28.0% (formula 27.3%); "
ONE_F_ONE_B_BUBBLES = ("p = 2, m = 4: 20.5% (formula 20.0%), p = 4, m = 8: 27.8% (formula "
                       "27.3%); ")


GPIPE_VALUES = VALUES.replace("gradients equal", "gradients (and the first stage's input "
                                                 "gradients) equal")


@pytest.mark.parametrize("check, answer, text", [
    (checks.check_gpipe, MINE["gpipe"], GPIPE_VALUES + GPIPE_BUBBLES + "stages held 8 / 8 / 8 / 8 micro-batches "
     "of activations (p = 4, m = 8)"),
    (checks.check_1f1b, MINE["one_f_one_b"], VALUES + ONE_F_ONE_B_BUBBLES + "stages held 4 / 3 / 2 / 1 "
     "micro-batches of activations (p = 4, m = 8)"),
    (checks.check_interleaved_bubble, MINE["interleaved_bubble"],
     "right on 60 cases of p ∈ {1, 2, 4, 8}, m up to 32, v ∈ {1, 2, 4}"),
    (checks.check_pick_m_v, MINE["pick_m_v"], "right on 11 cases (8 feasible, 3 infeasible)"),
])
def test_reference_passes(capsys, check, answer, text):
    expect(capsys, check, answer, f"✅ {NAMES[check]}: {text}")


@pytest.mark.parametrize("check, reference", [
    (checks.check_gpipe, R.gpipe),
    (checks.check_gpipe, demos.gpipe),
    (checks.check_1f1b, R.one_f_one_b),
    (checks.check_interleaved_bubble, R.interleaved_bubble),
    (checks.check_interleaved_bubble, bubble_formula),   # what the lab could import
    (checks.check_pick_m_v, R.pick_m_v),
])
def test_the_reference_itself_is_refused(capsys, check, reference):
    expect(capsys, check, reference,
           f"❌ {NAMES[check]}: this function is the workbook's own reference answer, not "
           "yours — Hint: the exercise is to write it yourself, in the cell above.")


def test_the_lessons_gpipe_is_refused_too(capsys):
    """The lesson shows GPipe by hand with the neighbours' ranks as arguments: a wrapper
    that supplies them is the lesson's answer, not the learner's."""
    def gpipe(stage, inputs, targets, loss_fn, shape):
        rank, p = dist.get_rank(), dist.get_world_size()
        demos.gpipe(stage, inputs, targets, shape, rank - 1 if rank else None,
                        rank + 1 if rank < p - 1 else None, loss_fn)

    expect(capsys, checks.check_gpipe, gpipe,
           "❌ GPipe: this function is the workbook's own reference answer, not yours — Hint: "
           "the exercise is to write it yourself, in the cell above.")


def test_a_wrapper_of_the_reference_is_refused(capsys):
    expect(capsys, checks.check_1f1b, lambda *args: R.one_f_one_b(*args),
           "❌ 1F1B: this function is the workbook's own reference answer, not yours — Hint: "
           "the exercise is to write it yourself, in the cell above.")


def test_an_unwritten_exercise_says_so(capsys):
    def gpipe(stage, inputs, targets, loss_fn, shape):
        raise NotImplementedError("all the forwards, then all the backwards")

    not_started(capsys, checks.check_gpipe, gpipe, NAMES[checks.check_gpipe],
                "all the forwards, then all the backwards")


# ------------------------------------------------- pieces of the wrong schedules


def receive(shape, src):
    """A tensor of ``shape`` received from ``src`` (blocking)."""
    x = torch.empty(shape)
    dist.recv(x, src)
    return x


def forward(stage, i, inputs, targets, loss_fn, shape, scale=True, wants_grad=True,
            first_wants_grad=True):
    """Micro-batch ``i`` through this stage, its input received unless on the first stage
    (where it wants its gradient when ``first_wants_grad``); the last stage returns the
    loss, divided by m when ``scale``."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(inputs)
    if rank == 0:
        x = inputs[i].detach().requires_grad_(first_wants_grad)
    else:
        x = receive(shape, rank - 1)
    if rank > 0 and wants_grad:
        x.requires_grad_()
    y = stage(x)
    if rank == p - 1:
        y = loss_fn(y, targets[i]) / (m if scale else 1)
    return x, y


def backward(x, y, shape, send_back=True):
    """Backward of one micro-batch: from the loss, or from the next stage's gradient."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == p - 1:
        y.backward()
    else:
        y.backward(receive(shape, rank + 1))
    if rank > 0 and send_back:
        dist.send(x.grad, rank - 1)


def send_on(y):
    """Send a stage's output to the next stage (blocking), unless this is the last."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank < p - 1:
        dist.send(y.detach(), rank + 1)


# ------------------------------------------------------------ exercise 1: GPipe


def gpipe_with(order=lambda held: held, scale=True, wants_grad=True, send_back=True,
               send_later=False, first_wants_grad=True, returns=True):
    """GPipe with one thing changed: the order of the backwards, the loss scaling, the
    received input's ``requires_grad``, the first stage's, sending its gradient back,
    sending the activations only after every forward, or returning the first stage's
    input gradients (``returns="every rank"``: on every rank; ``"early"``: read before the
    backward loop, so all None)."""

    def gpipe(stage, inputs, targets, loss_fn, shape):
        held = []
        for i in range(len(inputs)):
            x, y = forward(stage, i, inputs, targets, loss_fn, shape, scale, wants_grad,
                           first_wants_grad)
            if not send_later:
                send_on(y)
            held.append((x, y))
        if send_later:
            for _, y in held:
                send_on(y)
        early = [x.grad for x, _ in held]
        for x, y in order(held):
            backward(x, y, shape, send_back)
        if returns == "every rank" or (returns and dist.get_rank() == 0):
            return early if returns == "early" else [x.grad for x, _ in held]

    return gpipe


def one_f_one_b_as_gpipe(stage, inputs, targets, loss_fn, shape):
    """The right 1F1B, returning the first stage's input gradients as exercise 1 asks:
    right values, but not GPipe's memory."""
    if dist.get_rank() == 0:
        inputs = [x.detach().requires_grad_() for x in inputs]
    MINE["one_f_one_b"](stage, inputs, targets, loss_fn, shape)
    return [x.grad for x in inputs] if dist.get_rank() == 0 else None


def gpipe_receiving_without_wait(stage, inputs, targets, loss_fn, shape):
    """GPipe on irecv whose Work is never waited for: the received tensor is read
    before anything guarantees it holds the message."""
    rank, p, m = dist.get_rank(), dist.get_world_size(), len(inputs)
    held = []
    for i in range(m):
        if rank == 0:
            x = inputs[i].detach().requires_grad_()
        else:
            x = torch.empty(shape)
            dist.irecv(x, rank - 1)
            x.requires_grad_()
        y = stage(x)
        if rank == p - 1:
            y = loss_fn(y, targets[i]) / m
        else:
            dist.send(y.detach(), rank + 1)
        held.append((x, y))
    for x, y in held:
        backward(x, y, shape)
    return [x.grad for x, _ in held] if rank == 0 else None


def last_stage_backwards_in_reverse(held):
    return held[::-1] if dist.get_rank() == dist.get_world_size() - 1 else held


def gpipe_receives_the_wrong_shape(stage, inputs, targets, loss_fn, shape):
    # too small for the message (a larger buffer gets the bytes at its start, as in gloo)
    return MINE["gpipe"](stage, inputs, targets, loss_fn, (shape[1], shape[0] - 1))


def gpipe_calls_a_collective(stage, inputs, targets, loss_fn, shape):
    """Right values, but a collective among the point-to-point messages."""
    dist.barrier()
    return MINE["gpipe"](stage, inputs, targets, loss_fn, shape)


def gpipe_never_ends(stage, inputs, targets, loss_fn, shape):
    while True:
        pass


LOSS_SCALING = ("divide each micro-batch's loss by m before its backward: the batch's loss "
                "is the mean of the micro-batches'.")
RAISED = ("read the message above. Only the first rank's inputs and the last rank's targets "
          "hold tensors (the others hold None): the other stages receive their input with "
          "dist.recv, and make it want its gradient (x.requires_grad_()) so that backward "
          "fills x.grad to send back.")
HOLDS_M = ("GPipe runs the forward of every micro-batch, then the backward of every "
           "micro-batch, on every stage (the last one too): keep each micro-batch's input and "
           "output until its backward.")


@pytest.mark.parametrize("answer, message", [
    (gpipe_with(send_back=False), "p = 2, m = 1: deadlock (rank 0: recv from rank 1; rank 1: "
     "returned) — Hint: rank 1 returned while others still wait to exchange messages with "
     "it: every send needs a matching recv on the other side."),
    (gpipe_with(wants_grad=False), "p = 2, m = 1: rank 1 raised TypeError: Invalid function "
     "argument. Expected parameter `tensor` of type torch.Tensor — Hint: "
     + checks.NONE_SENT_HINT),
    (gpipe_with(first_wants_grad=False), "p = 1, m = 3: rank 0, the gradient of input "
     "micro-batch 0 is None — Hint: " + checks.FIRST_INPUT_HINT),
    (gpipe_with(returns="early"), "p = 1, m = 3: rank 0, the gradient of input "
     "micro-batch 0 is None — Hint: " + checks.FIRST_INPUT_HINT),
    (gpipe_with(returns="every rank"), "p = 2, m = 1: rank 1 returned a list of 1; only the "
     "first stage (rank 0) returns its input gradients, the other stages return None — Hint: "
     "the other stages already sent their input's gradient back to the stage before them: "
     "return the list only when rank == 0."),
    (gpipe_with(returns=False), "p = 1, m = 3: rank 0 returned None; expected the list of "
     "the 3 input gradients — Hint: " + checks.INPUT_GRADIENTS_HINT),
    (gpipe_receiving_without_wait, "p = 2, m = 1: rank 1 never waited for 1 of its receives "
     "(their Work's wait() was not called) — Hint: " + checks.UNWAITED_HINT),
    (gpipe_with(scale=False), "p = 1, m = 3: rank 0, 0.weight: 3× the reference (the sum "
     "over the micro-batches, not their mean): element 0 is -0.0008787, the single-process "
     "model has -0.0002929 — Hint: " + LOSS_SCALING),
    (gpipe_with(order=last_stage_backwards_in_reverse), "p = 2, m = 4: rank 0, 0.weight: "
     "differs from the reference: element 0 is 0.0003997, the single-process model has "
     "-0.0002363 — Hint: backward of a micro-batch needs the gradient of the same "
     "micro-batch: every stage must send and receive the micro-batches' gradients in the "
     "same order. Print what each rank sends and receives on p = 2, m = 2."),
    (gpipe_receives_the_wrong_shape, "p = 2, m = 1: mismatch in send/recv on group WORLD: the "
     "shape/dtype differs (rank 0: sends (2, 8) torch.float32, rank 1: receives (8, 1) "
     "torch.float32) — Hint: the receiving tensor must have the same shape and dtype as the "
     "sent one."),
    (gpipe_calls_a_collective, "p = 1, m = 3: rank 0 called barrier, a collective — Hint: "
     "pass activations and gradients between neighbouring stages with point-to-point "
     "operations only (dist.send, dist.recv, dist.isend, dist.irecv, "
     "dist.batch_isend_irecv)."),
    (one_f_one_b_as_gpipe, "p = 2, m = 4, fake tensors: stage 0 held at most 2.0 "
     "micro-batches of activations; GPipe holds all 4 — Hint: " + HOLDS_M),
    (gpipe_with(send_later=True), "p = 2, m = 4, fake tensors: the stages idle 33.6% of the "
     "wall time; the formula (p - 1)/(m + p - 1) gives 20.0% — Hint: every stage must start "
     "a micro-batch's forward as soon as its input arrives, and send its output on at once; "
     "then all the backwards."),
])
def test_gpipe_mistakes(capsys, answer, message):
    expect(capsys, checks.check_gpipe, answer, GPIPE + message)


def test_gpipe_backwards_in_reverse_on_every_stage_passes(capsys):
    """The lab asks for the same order on every stage, not for forward order: reversed
    on every stage gives the same gradients (torch's ScheduleGPipe uses forward order)."""
    assert line(capsys, checks.check_gpipe, gpipe_with(order=lambda held: held[::-1]))[0]


def test_an_endless_schedule_is_stopped(capsys, short_timeout):
    expect(capsys, checks.check_gpipe, gpipe_never_ends,
           GPIPE + "p = 1, m = 3: rank 0 was still running after 2 s of work: the ranks used 2 s of "
           "CPU time (an endless loop?) — Hint: look for a loop that never ends: each phase runs over "
           "the m micro-batches, and m is the length of inputs on every rank.")


def test_a_schedule_that_skips_the_stage_module_is_told_to_call_it(capsys):
    """The checks count activations when the stage module returns: calling its layers one
    by one is reported, not misread as holding nothing."""

    def gpipe(stage, inputs, targets, loss_fn, shape):
        return MINE["gpipe"](lambda x: stage[1:](stage[0](x)), inputs, targets, loss_fn, shape)

    expect(capsys, checks.check_gpipe, gpipe,
           GPIPE + "p = 2, m = 4, fake tensors: stage 0 was called 0 time(s); expected once "
           "per micro-batch (4) — Hint: call this rank's stage as stage(x) once for each "
           "micro-batch.")


# ------------------------------------------------------------- exercise 2: 1F1B


def one_f_one_b_with(warmup=lambda p, rank: p - rank - 1):
    """1F1B with blocking sends, each stage sending before it receives, and a given number
    of warm-up forwards."""

    def one_f_one_b(stage, inputs, targets, loss_fn, shape):
        rank, p, m = dist.get_rank(), dist.get_world_size(), len(inputs)
        held, w = deque(), min(warmup(p, rank), m)
        for i in range(m):
            x, y = forward(stage, i, inputs, targets, loss_fn, shape)
            send_on(y)
            held.append((x, y))
            if i >= w:
                backward(*held.popleft(), shape)
        while held:
            backward(*held.popleft(), shape)

    return one_f_one_b


def one_f_one_b_unscaled(stage, inputs, targets, loss_fn, shape):
    """The right schedule, but every micro-batch's loss counts m times."""
    m = len(inputs)
    MINE["one_f_one_b"](stage, inputs, targets, lambda o, t: loss_fn(o, t) * m, shape)


def one_f_one_b_every_rank_takes_inputs(stage, inputs, targets, loss_fn, shape):
    """Runs the stage on `inputs[0]` on every rank, where past the first stage it is None:
    the stage raises."""
    stage(inputs[0])
    MINE["one_f_one_b"](stage, inputs, targets, loss_fn, shape)


def one_f_one_b_keeping_everything(stage, inputs, targets, loss_fn, shape):
    """The right order, but every micro-batch's output is kept to the end: 1F1B's
    timing, GPipe's memory."""
    kept, original = [], stage.forward

    def forward(x):
        kept.append(original(x))
        return kept[-1]

    stage.forward = forward
    MINE["one_f_one_b"](stage, inputs, targets, loss_fn, shape)


def one_f_one_b_on(exchange):
    """The reference 1F1B, as a learner would type it, on another ``exchange``."""
    import inspect

    namespace = {**vars(R), "_exchange": exchange}
    exec(compile(inspect.getsource(R.one_f_one_b), "<learner>", "exec"), namespace)
    return namespace["one_f_one_b"]


def one_f_one_b_blocking_exchange():
    """Blocking sends and receives, even ranks sending first and odd ranks receiving
    first: no deadlock, and no extra wait (the deadlock hint offers it)."""

    def exchange(send, send_to, recv_from, shape):
        got = None if recv_from is None else torch.empty(shape)
        first = dist.get_rank() % 2 == 0
        if first and send is not None and send_to is not None:
            dist.send(send, send_to)
        if got is not None:
            dist.recv(got, recv_from)
        if not first and send is not None and send_to is not None:
            dist.send(send, send_to)
        return got

    return one_f_one_b_on(exchange)


def one_f_one_b_without_wait():
    """The right 1F1B whose exchange posts its send and receive together but never waits
    on them (the newcomer trial's missing .wait())."""

    def exchange(send, send_to, recv_from, shape):
        ops, got = [], None
        if send is not None and send_to is not None:
            ops.append(dist.P2POp(dist.isend, send, send_to))
        if recv_from is not None:
            got = torch.empty(shape)
            ops.append(dist.P2POp(dist.irecv, got, recv_from))
        if ops:
            dist.batch_isend_irecv(ops)
        return got

    return one_f_one_b_on(exchange)


@pytest.mark.parametrize("answer, message", [
    (one_f_one_b_with(), "p = 2, m = 4: deadlock (rank 0: send to rank 1; rank 1: send to "
     "rank 0) — Hint: blocking send() waits until the matching recv() is posted (as NCCL "
     "does for large messages). If every rank sends first, nobody receives: use isend/irecv "
     "or batch_isend_irecv, or let even ranks send first and odd ranks receive first."),
    (one_f_one_b_every_rank_takes_inputs, "p = 2, m = 1: rank 1 raised TypeError: linear(): "
     "argument 'input' (position 1) must be Tensor, not NoneType — Hint: "
     + checks.NONE_INPUT_HINT),
    (one_f_one_b_without_wait(), "p = 2, m = 1: rank 0 never waited for 1 of its receives "
     "(their Work's wait() was not called) — Hint: " + checks.UNWAITED_HINT),
    (one_f_one_b_unscaled, "p = 1, m = 3: rank 0, 0.weight: 3× the reference (the sum over "
     "the micro-batches, not their mean): element 0 is -0.0008787, the single-process model "
     "has -0.0002929 — Hint: " + LOSS_SCALING),
    (MINE["gpipe"], "p = 2, m = 4, fake tensors: stage 0 held 4.0 micro-batches of "
     "activations; 1F1B holds at most p - rank = 2 — Hint: stage 0 ran 4 forward(s) before "
     "its first backward, 1F1B runs 2: p - r - 1 warm-up forwards (here 1), then one more "
     "before the first backward. With fewer, the stages wait for each other; with more, "
     "they hold more activations."),
    (one_f_one_b_with(warmup=lambda p, rank: 0), "p = 2, m = 4, fake tensors: the stages "
     "idle 50.2% of the wall time; the formula (p - 1)/(m + p - 1) gives 20.0% — Hint: stage "
     "0 ran 1 forward(s) before its first backward, 1F1B runs 2: p - r - 1 warm-up forwards "
     "(here 1), then one more before the first backward. With fewer, the stages wait for "
     "each other; with more, they hold more activations."),
    (one_f_one_b_keeping_everything, "p = 2, m = 4, fake tensors: stage 0 held 3.0 "
     "micro-batches of activations; 1F1B holds at most p - rank = 2 — Hint: "
     + checks.DROP_HINT),
])
def test_1f1b_mistakes(capsys, answer, message):
    expect(capsys, checks.check_1f1b, answer, ONE_F_ONE_B + message)


def test_1f1b_on_blocking_calls_in_even_odd_order_passes(capsys):
    assert line(capsys, checks.check_1f1b, one_f_one_b_blocking_exchange())[0]


def test_1f1b_warmup_longer_than_the_batch_is_caught(capsys):
    """Warm-up p - rank - 1 without min(..., m): with m < p - 1 (p = 4, m = 2) the first
    stage asks for micro-batches that do not exist."""
    import inspect
    source = inspect.getsource(R.one_f_one_b)
    assert "min(p - rank - 1, m)" in source
    namespace = dict(vars(R))
    exec(source.replace("min(p - rank - 1, m)", "p - rank - 1"), namespace)
    ok, text = line(capsys, checks.check_1f1b, namespace["one_f_one_b"])
    assert not ok and "p = 4, m = 2" in text, text


# ---------------------------------------------------- exercise 3: interleaved bubble


IDEAL = ("(p - 1)/(v·m) is the bubble relative to the ideal time (the papers' ratio); as a "
         "fraction of the wall time, divide by the whole: ideal v·m plus bubble p - 1, in "
         "chunk slots.")


@pytest.mark.parametrize("answer, message", [
    (lambda p, m, v: (p - 1) / (v * m), "p = 2, m = 1, v = 1: returned 1, expected 0.5 — "
     "Hint: " + IDEAL),
    (lambda p, m, v: (p - 1) / (m + p - 1), "p = 2, m = 1, v = 2: returned 0.5, expected "
     "0.3333 — Hint: that is 1F1B's bubble: with v chunks each slot is v times shorter."),
    (lambda p, m, v: 100 * (p - 1) / (v * m + p - 1), "p = 2, m = 1, v = 1: returned 50, "
     "expected 0.5 — Hint: return a fraction (0.25), not a percentage (25)."),
    (lambda p, m, v: f"{(p - 1) / (v * m + p - 1):.0%}", "p = 1, m = 1, v = 1: returned "
     "'0%', not a number — Hint: return the fraction as a float (0.25 for 25 %)."),
    (lambda p, m, v: (p - 1) / (v * m - 1), "interleaved_bubble(1, 1, 1) raised "
     "ZeroDivisionError: division by zero — Hint: " + checking.HINTS["called"]),
])
def test_interleaved_bubble_mistakes(capsys, answer, message):
    expect(capsys, checks.check_interleaved_bubble, answer, INTERLEAVED + message)


# ----------------------------------------------------------- exercise 4: pick (m, v)


def search(p, batch, layers, target, cap, sample, held=R.micro_batches_held, m_first=True,
           first_m=None, m_end=1):
    """The search of pick_m_v with one thing changed: what the first stage holds, the order
    of the loops, where m starts, or where it stops (``m_end=0``: before m = batch)."""
    ms = [m for m in range(p if first_m is None else first_m, batch + m_end, p)
          if batch % m == 0]
    vs = [v for v in range(1, layers + 1) if layers % v == 0]
    pairs = [(m, v) for m in ms for v in vs] if m_first else [(m, v) for v in vs for m in ms]
    for m, v in pairs:
        if MINE["interleaved_bubble"](p, m, v) <= target and \
                held(p, v) * (batch // m) * sample <= cap:
            return m, v
    return None


CASE_1 = ("pick_m_v(p=4, batch=64, layers_per_stage=6, bubble_target=0.3, memory_cap=4 GB, "
          "sample_bytes=100 MB)")
CASE_2 = CASE_1.replace("4 GB", "8.5 GB")
MEMORY = ("the first stage holds p micro-batches when v = 1 (plain 1F1B), p + (p - 1)/v only "
          "for v ≥ 2 chunks, each of batch/m samples × sample_bytes.")
ALLOWED = ("only some (m, v) are allowed at all: m a multiple of p (interleaving's rule, "
           "kept for v = 1 too) that divides the batch, v a divisor of layers_per_stage. "
           "Skip the others before judging the limits.")


def any_m(p, batch, layers, target, cap, sample):
    """Every m that divides the batch, multiple of p or not (the newcomer trial's
    pick_m_v without m % p == 0)."""
    for m in (m for m in range(1, batch + 1) if batch % m == 0):
        for v in (v for v in range(1, layers + 1) if layers % v == 0):
            if MINE["interleaved_bubble"](p, m, v) <= target and \
                    R.micro_batches_held(p, v) * (batch // m) * sample <= cap:
                return m, v
    return None


NONE = ("try every m that is a multiple of p and divides the batch (m = batch included), and "
        "every v that divides layers_per_stage.")
PREFERENCE = ("among the (m, v) that fit, take the smallest m, then the smallest v; 1F1B "
              "(v = 1) holds p micro-batches.")


@pytest.mark.parametrize("answer, message", [
    (lambda *case: search(*case, held=lambda p, v: 0), CASE_1 + ": (m, v) = (4, 2) holds "
     "8.8 GB of activations on the first stage, above the cap — Hint: " + MEMORY),
    (lambda *case: search(*case, held=lambda p, v: p), CASE_2 + ": (m, v) = (4, 2) holds "
     "8.8 GB of activations on the first stage, above the cap — Hint: " + MEMORY),
    (lambda *case: search(*case, held=lambda p, v: p + (p - 1) / v), CASE_1 + ": returned "
     "(8, 3); expected (8, 1), which fits too with as many micro-batches, fewer chunks "
     "(bubble 27.3%, 3.2 GB) — Hint: " + PREFERENCE),
    (lambda *case: search(*case, m_first=False), CASE_2 + ": returned (8, 1); expected (4, "
     "3), which fits too with fewer micro-batches (bubble 20.0%, 8 GB) — Hint: " + PREFERENCE),
    (lambda *case: search(*case) or (case[1], case[2]), "pick_m_v(p=4, batch=32, "
     "layers_per_stage=4, bubble_target=0.01, memory_cap=80 GB, sample_bytes=10 MB): (m, v) "
     "= (32, 4) idles 2.3% of the wall time, above the target 1% — Hint: check the bubble "
     "with your interleaved_bubble(p, m, v)."),
    (lambda *case: search(*case, first_m=0), CASE_1 + " raised ZeroDivisionError: integer "
     "modulo by zero — Hint: " + checking.HINTS["called"]),
    (lambda *case: [4, 3], CASE_1 + ": (m, v) = (4, 3) holds 8 GB of activations on the "
     "first stage, above the cap — Hint: " + MEMORY),
    (lambda *case: None, CASE_1 + ": returned None, but (m, v) = (8, 1) fits — Hint: " + NONE),
    (lambda *case: search(*case, m_end=0), "pick_m_v(p=4, batch=16, "
     "layers_per_stage=1, bubble_target=0.2, memory_cap=80 GB, sample_bytes=10 MB): returned "
     "None, but (m, v) = (16, 1) fits — Hint: " + NONE),
    (lambda *case: (lambda got: got and got[::-1])(MINE["pick_m_v"](*case)), CASE_1 + ": "
     "returned (1, 8), which looks swapped: the answer is (m, v) = (8, 1) — Hint: return the "
     "micro-batches first, then the chunks: (m, v)."),
    (lambda *case: (6, 1), CASE_1 + ": returned (m, v) = (6, 1), but m = 6 is not a multiple "
     "of p = 4 — Hint: " + ALLOWED),
    (lambda *case: (8, 4), CASE_1 + ": returned (m, v) = (8, 4), but v = 4 does not divide "
     "layers_per_stage = 6 — Hint: " + ALLOWED),
    (any_m, "pick_m_v(p=4, batch=48, layers_per_stage=1, bubble_target=0.35, memory_cap=3.5 "
     "GB, sample_bytes=100 MB): returned (m, v) = (6, 1), but m = 6 is not a multiple of p = "
     "4 — Hint: " + ALLOWED),
    (lambda *case: (lambda got: None if got is None else list(got))(MINE["pick_m_v"](*case)),
     "the list is accepted"),
    (lambda *case: "8, 1", CASE_1 + ": returned '8, 1', expected a pair (m, v) of "
     "positive integers, or None — "
     "Hint: return (m, v), or None when nothing fits."),
])
def test_pick_m_v_mistakes(capsys, answer, message):
    if message == "the list is accepted":   # the lab: a tuple, or a two-item list
        assert line(capsys, checks.check_pick_m_v, answer)[0]
        return
    expect(capsys, checks.check_pick_m_v, answer, PICK + message)


def _strict(bubble=True, memory=True):
    """pick_m_v with "below" where the lab says "at most", for the bubble, the memory or
    both."""
    def pick(p, batch, layers, target, cap, sample):
        for m in (m for m in range(p, batch + 1, p) if batch % m == 0):
            for v in (v for v in range(1, layers + 1) if layers % v == 0):
                b = MINE["interleaved_bubble"](p, m, v)
                held = R.micro_batches_held(p, v) * (batch // m) * sample
                if (b < target if bubble else b <= target) and \
                        (held < cap if memory else held <= cap):
                    return m, v
        return None
    return pick


@pytest.mark.parametrize("answer, message", [
    (_strict(memory=False), "pick_m_v(p=4, batch=48, layers_per_stage=3, bubble_target=0.2, "
     "memory_cap=80 GB, sample_bytes=10 MB): returned (8, 3); expected (4, 3)"),
    (_strict(bubble=False), "pick_m_v(p=4, batch=64, layers_per_stage=6, bubble_target=0.3, "
     "memory_cap=3.2 GB, sample_bytes=100 MB): returned (16, 1); expected (8, 1)"),
    (_strict(), "pick_m_v(p=4, batch=48, layers_per_stage=3, bubble_target=0.2, "),
])
def test_pick_m_v_below_instead_of_at_most_fails(capsys, answer, message):
    """The lab says "at most": a strict < on the bubble or on the memory is caught by a
    case whose answer sits exactly on that limit, and the hint says so."""
    ok, text = line(capsys, checks.check_pick_m_v, answer)
    assert not ok and message in text, text
    assert "landing exactly on the limit counts (<=, not <)" in text, text


def test_every_infeasible_case_has_one_reason():
    """The infeasible cases are infeasible for the reason their comment gives: the bubble
    alone, the memory alone, or only the two together."""
    def fits(case, bubble_only=False, memory_only=False):
        p, batch, layers, target, cap, sample = case
        return search(p, batch, layers, 1.0 if memory_only else target,
                      float("inf") if bubble_only else cap, sample)

    infeasible = [c for c in lesson05.PICK_CASES if R.pick_m_v(*c) is None]
    assert [(fits(c, bubble_only=True) is None, fits(c, memory_only=True) is None)
            for c in infeasible] == [(True, False), (False, True), (False, False)]


# ---------------------- plain functions: loops, sys.exit, malformed returns (issue 24)


def forever(*args):
    while True:
        pass


def exits(*args):
    import sys
    sys.exit(0)


@pytest.mark.parametrize("check, prefix", [
    (checks.check_interleaved_bubble, INTERLEAVED + "interleaved_bubble(1, 1, 1)"),
    (checks.check_pick_m_v, PICK + CASE_1),
])
def test_a_plain_function_that_loops_or_exits_is_a_failure(capsys, short_timeout, check,
                                                           prefix):
    expect(capsys, check, forever, prefix + ": your function was still running after 2 s of "
           "work: it used 2 s of CPU time (an endless loop?) — Hint: " + checking.HINTS["timeout"])
    expect(capsys, check, exits,
           prefix + " called sys.exit(0) — Hint: " + checking.HINTS["exit"])


PAIR = ", expected a pair (m, v) of positive integers, or None — Hint: return (m, v), or " \
       "None when nothing fits."


@pytest.mark.parametrize("answer, said", [
    ((0, 1), "(0, 1)"), ((8, 0), "(8, 0)"), (("8", "1"), "('8', '1')"),
    ((None, None), "(None, None)"), ((8.5, 1), "(8.5, 1)"), ((8, 1, 1), "(8, 1, 1)"),
])
def test_pick_m_v_malformed_pairs_are_a_failure(capsys, answer, said):
    expect(capsys, checks.check_pick_m_v, lambda *case: answer,
           PICK + CASE_1 + ": returned " + said + PAIR)


def test_right_answers_as_numpy_numbers_or_fractions_are_accepted(capsys):
    import numpy as np
    from fractions import Fraction

    bubble = MINE["interleaved_bubble"]
    pick = MINE["pick_m_v"]
    for answer in (lambda p, m, v: Fraction(p - 1, v * m + p - 1),
                   lambda p, m, v: np.float64(bubble(p, m, v))):
        assert line(capsys, checks.check_interleaved_bubble, answer)[0]

    def numpy_pick(*case):
        got = pick(*case)
        return None if got is None else np.array(got)

    def numpy_pair(*case):
        got = pick(*case)
        return None if got is None else tuple(np.int64(x) for x in got)

    assert line(capsys, checks.check_pick_m_v, numpy_pair)[0]
    assert not line(capsys, checks.check_pick_m_v, numpy_pick)[0]   # an array, not a pair


def test_seeing_the_schedules_before_writing_them_says_which_exercise_to_do_first(capsys):
    def gpipe(stage, inputs, targets, loss_fn, shape):
        raise NotImplementedError("all the forwards, then all the backwards")

    assert lesson05_lab.measure_schedule(gpipe, 2, 2, exercise="Exercise 1 (GPipe)") is None
    assert capsys.readouterr().out == (
        "⬜ Exercise 1 (GPipe) is not written yet: do it first, then run this cell again.\n")
    with pytest.raises(sc.RankError):     # a real error, or no exercise named: as before
        lesson05_lab.measure_schedule(lambda *args: 1 / 0, 2, 2, exercise="Exercise 1 (GPipe)")


def test_watching_the_receives_leaves_the_backend_as_it_was(capsys):
    """The check counts waits by wrapping the sim backend's Work while the learner's
    schedule runs; afterwards, failed or not, the backend is untouched."""
    from simcluster.backend import SimWork
    before = (SimWork.__init__, SimWork.wait, SimWork.is_completed)
    assert not line(capsys, checks.check_1f1b, one_f_one_b_without_wait())[0]
    assert not line(capsys, checks.check_gpipe, gpipe_that_raises)[0]
    assert (SimWork.__init__, SimWork.wait, SimWork.is_completed) == before


def gpipe_that_raises(stage, inputs, targets, loss_fn, shape):
    raise RuntimeError("stops the run inside the watched block")
