"""Lab 03's checks (data parallelism): every check passes the reference answer, refuses
the reference itself, and reports each mistake the lab is about — including ones that
deadlock, mismatch or raise — as one exact ❌ line."""


import pytest
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc

from _check_helpers import learner_namespace, line, not_started
from workbook import checking
from workbook.lesson03_data_parallel import checks
from workbook.lesson03_data_parallel import _reference as R

NAMES = {checks.check_average_gradients: "average gradients",
         checks.check_allreduce_in_buckets: "all-reduce in buckets",
         checks.check_overlapped_ddp: "overlapped DDP",
         checks.check_accumulation: "gradient accumulation",
         checks.check_distributed_trainer: "DistributedTrainer"}   # as each check prints it
AVERAGE, BUCKETS, OVERLAP, ACCUMULATION, TRAINER = (f"❌ {name}: " for name in NAMES.values())


def expect(capsys, check, answer, message):
    assert line(capsys, check, answer)[1] == message


def learner_copy(*references):
    """The reference answers as a learner would type them: the same source, their own
    code (so that the checks do not refuse them as the workbook's)."""
    return learner_namespace(R, *references)


MINE = learner_copy(R.average_gradients, R.bucket_parameters, R.allreduce_in_buckets,
                    R.OverlappedDDP, R.train_with_accumulation, R.DistributedTrainer)
OverlappedDDP, DistributedTrainer = MINE["OverlappedDDP"], MINE["DistributedTrainer"]


# ------------------------------------------------------------ the reference passes


@pytest.mark.parametrize("check, answer, text", [
    (checks.check_average_gradients, MINE["average_gradients"],
     "gradients equal DDP's on world sizes 1, 2, 3, 4, 5, 8 (bitwise on 1, 2, 4, 8)"),
    (checks.check_allreduce_in_buckets, MINE["allreduce_in_buckets"],
     "gradients and all-reduces equal DDP's on world sizes 1, 2, 3, 4, 5, 8, bucket caps "
     "4000, 1360, 336 bytes"),
    (checks.check_overlapped_ddp, OverlappedDDP,
     "gradients and all-reduces equal DDP's on world sizes 1, 2, 3, 4, 5, 8, bucket caps "
     "4000, 1360, 336 bytes; 9.5 µs of communication hidden behind backward (DDP: 4.3 µs)"),
    (checks.check_accumulation, MINE["train_with_accumulation"],
     "one all-reduce per optimizer step and the big-batch parameters on (world size, "
     "micro-batches) (1, 1), (2, 4), (3, 2), (4, 3), (5, 2), (8, 2)"),
    (checks.check_distributed_trainer, DistributedTrainer,
     "placement, micro-batches and parameters right for (nodes, gpus_per_node, "
     "batch_size, gradient_accumulation) (3, 2, 2, 2), (2, 3, 1, 3), (1, 4, 3, 1), "
     "(4, 1, 2, 2)"),
])
def test_reference_passes(capsys, check, answer, text):
    expect(capsys, check, answer, f"✅ {NAMES[check]}: {text}")


@pytest.mark.parametrize("check, reference, what", [
    (checks.check_average_gradients, R.average_gradients, "function"),
    (checks.check_allreduce_in_buckets, R.allreduce_in_buckets, "function"),
    (checks.check_overlapped_ddp, R.OverlappedDDP, "class"),
    (checks.check_accumulation, R.train_with_accumulation, "function"),
    (checks.check_distributed_trainer, R.DistributedTrainer, "class"),
])
def test_the_reference_itself_is_refused(capsys, check, reference, what):
    expect(capsys, check, reference,
           f"❌ {NAMES[check]}: this {what} is the workbook's own reference answer, not "
           "yours — Hint: the exercise is to write it yourself, in the cell above.")


def test_an_unwritten_exercise_says_so(capsys):
    def average_gradients(model):
        raise NotImplementedError("all-reduce every gradient, then divide")

    not_started(capsys, checks.check_average_gradients, average_gradients,
                NAMES[checks.check_average_gradients], "all-reduce every gradient, then divide")


# ------------------------------------------------------ exercise 1: by hand


def forgot_to_divide(model):
    for p in model.parameters():
        dist.all_reduce(p.grad)


def divided_twice(model):
    n = dist.get_world_size()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= n * n


def only_the_weights(model):
    n = dist.get_world_size()
    for name, p in model.named_parameters():
        if name.endswith("weight"):
            dist.all_reduce(p.grad)
            p.grad /= n


def reduce_to_rank_0(model):
    n = dist.get_world_size()
    for p in model.parameters():
        dist.reduce(p.grad, dst=0)
        p.grad /= n


def rank_1_skips_a_parameter(model):
    n = dist.get_world_size()
    for i, p in enumerate(model.parameters()):
        if dist.get_rank() == 1 and i == 0:
            continue
        dist.all_reduce(p.grad)
        p.grad /= n


def calls_a_method_tensors_lack(model):
    for p in model.parameters():
        p.grad.all_reduce()


AVERAGE_VALUES = checks.AVERAGE_HINTS["values"]


@pytest.mark.parametrize("answer, message", [
    (forgot_to_divide, "world size 2, step 1: rank 0, 0.weight: 2× DDP's (the sum, not the "
     "mean): element 0 is -0.03474, DDP has -0.01737 — Hint: " + checks.AVERAGE_HINTS["times"]),
    (divided_twice, "world size 2, step 1: rank 0, 0.weight: 1/2 of DDP's: element 0 is "
     "-0.008685, DDP has -0.01737 — Hint: " + checks.AVERAGE_HINTS["over"]),
    (only_the_weights, "world size 2, step 1: rank 0, 0.bias: the gradient is still this "
     "rank's own (not averaged): element 0 is 0.01438, DDP has 0.02602 — Hint: " + checks.AVERAGE_HINTS["own"]),
    (reduce_to_rank_0, "world size 2, step 1: rank 1, 0.weight: differs from DDP's: element "
     "0 is -0.02785, DDP has -0.01737 — Hint: " + AVERAGE_VALUES),
    (rank_1_skips_a_parameter, "world size 2: mismatch in all_reduce #0 on group WORLD: the "
     "shape differs (rank 0: (16, 8), rank 1: (16,)) — Hint: every rank must call the same "
     "collectives, in the same order, with matching arguments."),
    (calls_a_method_tensors_lack, "world size 1: rank 0 raised AttributeError: 'Tensor' "
     "object has no attribute 'all_reduce' — Hint: " + checking.HINTS["exception"]),
])
def test_average_gradients_mistakes(capsys, answer, message):
    expect(capsys, checks.check_average_gradients, answer, AVERAGE + message)


def test_a_sum_on_world_size_3_is_not_passed_as_rounding(capsys):
    """Off power-of-two world sizes the check compares with a tolerance; the mean is
    still required there."""
    def sum_on_three(model):
        p = dist.get_world_size()
        for q in model.parameters():
            dist.all_reduce(q.grad)
            if p != 3:
                q.grad /= p

    _, text = line(capsys, checks.check_average_gradients, sum_on_three)
    assert text.startswith(AVERAGE + "world size 3, step 1: rank 0, 0.weight: 3× DDP's")


# ------------------------------------------------------ exercise 2: buckets


def _all_reduce_buckets(model, buckets):
    p = dist.get_world_size()
    for bucket in buckets:
        flat = torch.cat([q.grad.reshape(-1) for q in bucket])
        dist.all_reduce(flat)
        MINE["_reduce_bucket"](bucket, flat, p)


def buckets_in_parameter_order(model, cap):
    params = list(model.parameters())
    _all_reduce_buckets(model, [b[::-1] for b in MINE["bucket_parameters"](params[::-1],
                                                                           cap)])


def closes_before_the_cap(model, cap):
    buckets, current, size = [], [], 0
    for q in reversed(list(model.parameters())):
        nbytes = q.numel() * q.element_size()
        if current and size + nbytes > cap:
            buckets.append(current)
            current, size = [], 0
        current.append(q)
        size += nbytes
    _all_reduce_buckets(model, buckets + [current])


def closes_past_the_cap(model, cap):
    # `size > cap` where the lab says "reaches the cap or more": a bucket of exactly the
    # cap stays open (caught only by a cap that lands on a running total)
    buckets, current, size = [], [], 0
    for q in reversed(list(model.parameters())):
        current.append(q)
        size += q.numel() * q.element_size()
        if size > cap:
            buckets.append(current)
            current, size = [], 0
    _all_reduce_buckets(model, buckets + ([current] if current else []))


def never_copies_back(model, cap):
    for bucket in MINE["bucket_parameters"](model.parameters(), cap):
        dist.all_reduce(torch.cat([q.grad.reshape(-1) for q in bucket]))


def rank_1_uses_twice_the_cap(model, cap):
    MINE["allreduce_in_buckets"](model, 2 * cap if dist.get_rank() == 1 else cap)


COPY_BACK_HINT, BUCKET_HINT = checks.COPY_BACK_HINT, checks.BUCKET_HINT


@pytest.mark.parametrize("answer, message", [
    (lambda model, cap: MINE["average_gradients"](model),
     "world size 1, bucket cap 4000 bytes, step 1: rank 0 called 6 collective(s) "
     "(all_reduce); DDP all-reduces 1 bucket(s) — Hint: " + BUCKET_HINT),
    (buckets_in_parameter_order, "world size 1, bucket cap 1360 bytes: your all-reduces "
     "carry 1600, 336 bytes; DDP's buckets carry 1360, 576 bytes — Hint: "
     + checks.FORWARD_ORDER_HINT),
    (closes_before_the_cap, "world size 1, bucket cap 336 bytes, step 1: rank 0 called 4 "
     "collective(s) (all_reduce); DDP all-reduces 3 bucket(s) — Hint: " + BUCKET_HINT),
    (closes_past_the_cap, "world size 1, bucket cap 1360 bytes: your all-reduces carry "
     "1424, 512 bytes; DDP's buckets carry 1360, 576 bytes — Hint: a bucket that holds "
     "exactly 1360 bytes has reached the cap: it is full (\"reaches the cap or more\"). "
     "(more help: checks.hint('buckets'))"),
    (never_copies_back, "world size 2, bucket cap 4000 bytes, step 1: rank 0, 0.weight: the "
     "gradient is still this rank's own (not averaged): element 0 is 0.02095, DDP has "
     "-0.01737 — Hint: " + COPY_BACK_HINT),
    (rank_1_uses_twice_the_cap, "world size 2, bucket cap 1360 bytes: mismatch in "
     "all_reduce #0 on group WORLD: the shape differs (rank 0: (340,), rank 1: (484,)) — "
     "Hint: every rank must call the same collectives, in the same order, with matching "
     "arguments."),
])
def test_allreduce_in_buckets_mistakes(capsys, answer, message):
    expect(capsys, checks.check_allreduce_in_buckets, answer, BUCKETS + message)


# ------------------------------------------------------ exercise 3: overlap


class ForgetsToWait(OverlappedDDP):
    def finish(self):
        p = dist.get_world_size()
        for i, flat, _ in self.pending:
            MINE["_reduce_bucket"](self.buckets[i], flat, p)
        self.pending, self.ready = [], [0] * len(self.buckets)


class CopiesBackInReverse(OverlappedDDP):
    """Waits, but writes the flat tensor's slices back to the wrong gradients: the
    overlap check must not blame wait() for that."""

    def finish(self):
        p = dist.get_world_size()
        for i, flat, work in self.pending:
            work.wait()
            flat /= p
            offset = 0
            for q in reversed(self.buckets[i]):
                n = q.numel()
                q.grad.copy_(flat[offset:offset + n].view_as(q.grad) if q.grad.numel() == n
                             else q.grad)
                offset += n
        self.pending, self.ready = [], [0] * len(self.buckets)


class AllReducesInFinish:
    """Correct values, but nothing runs during backward."""

    def __init__(self, model, bucket_cap_bytes):
        self.model, self.cap = model, bucket_cap_bytes

    def finish(self):
        MINE["allreduce_in_buckets"](self.model, self.cap)


class NeverResetsItsCounters(OverlappedDDP):
    def finish(self):
        p = dist.get_world_size()
        for i, flat, work in self.pending:
            work.wait()
            MINE["_reduce_bucket"](self.buckets[i], flat, p)
        self.pending = []


class NeverClearsPending(OverlappedDDP):
    """Right values every step (the stale buckets are copied back first, this step's
    after them), but finish() leaves this step's all-reduces in self.pending."""

    def finish(self):
        p = dist.get_world_size()
        for i, flat, work in self.pending:
            work.wait()
            MINE["_reduce_bucket"](self.buckets[i], flat, p)
        self.ready = [0] * len(self.buckets)


class LaunchesOnTheFirstGradient(OverlappedDDP):
    """The newcomer trial's: a bucket's all-reduce starts when its FIRST gradient is
    ready, flattening the others as zeros."""

    def _grad_ready(self, param):
        i = self.bucket_of[param]
        self.ready[i] += 1
        if self.ready[i] == 1:
            flat = torch.cat([q.grad.reshape(-1) if q.grad is not None
                              else torch.zeros(q.numel()) for q in self.buckets[i]])
            self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))


class HookRaises(OverlappedDDP):
    def _grad_ready(self, param):
        raise KeyError("bucket of this parameter")


@pytest.mark.parametrize("answer, message", [
    (ForgetsToWait, "world size 2, bucket cap 4000 bytes, step 1: rank 0, 0.weight: the "
     "gradient is this rank's own divided by 2: the all-reduce had not summed it yet when "
     "it was copied back — Hint: " + checks.WAIT_HINT),
    (CopiesBackInReverse, "world size 1, bucket cap 4000 bytes, step 1: rank 0, 0.weight: "
     "differs from DDP's: element 0 is -0.09328, DDP has -0.01825 — Hint: "
     + checks.COPY_VALUES_HINT),
    (AllReducesInFinish, "world size 4, four 256×256 layers, bucket cap 65536 bytes: no "
     "communication overlapped backward (hidden time 0; DDP hides 4.3 µs) — Hint: "
     + checks.OVERLAP_HINT),
    (NeverResetsItsCounters, "world size 1, bucket cap 4000 bytes, step 2: rank 0 called 0 "
     "collective(s) (none); DDP all-reduces 1 bucket(s) — Hint: " + checks.RESET_HINT),
    (NeverClearsPending, "world size 1, bucket cap 4000 bytes, step 1: after finish(), rank "
     "0's self.pending still holds 1 all-reduce(s) it has already copied back — Hint: "
     + checks.STALE_HINT),
    (LaunchesOnTheFirstGradient, "world size 1, bucket cap 4000 bytes, step 1: rank 0, "
     "0.weight: all zeros after finish(), though backward made it nonzero: its bucket was "
     "flattened and all-reduced before this gradient was ready — Hint: " + checks.EARLY_HINT),
    (HookRaises, "world size 1, bucket cap 4000 bytes: rank 0 raised KeyError: 'bucket of "
     "this parameter' — Hint: " + checking.HINTS["exception"]),
])
def test_overlapped_ddp_mistakes(capsys, answer, message):
    expect(capsys, checks.check_overlapped_ddp, answer, OVERLAP + message)


# ------------------------------------------------------ exercise 4: accumulation


def all_reduces_every_micro_batch(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    for x, y in micro_batches:
        (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


def backward_only_in_no_sync(ddp_model, optimizer, micro_batches, loss_fn):
    """Forward outside no_sync(): DDP has already prepared to all-reduce."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        loss = loss_fn(ddp_model(x), y) / k
        if i < k - 1:
            with ddp_model.no_sync():
                loss.backward()
        else:
            loss.backward()
    optimizer.step()
    optimizer.zero_grad()


def forgot_to_scale_the_loss(ddp_model, optimizer, micro_batches, loss_fn):
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            loss_fn(ddp_model(x), y).backward()
    x, y = micro_batches[-1]
    loss_fn(ddp_model(x), y).backward()
    optimizer.step()
    optimizer.zero_grad()


def everything_in_no_sync(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    with ddp_model.no_sync():
        for x, y in micro_batches:
            (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


def syncs_the_first_micro_batch(ddp_model, optimizer, micro_batches, loss_fn):
    """The newcomer trial's: the one all-reduce after the FIRST backward, no_sync() on
    the later ones."""
    k = len(micro_batches)
    for i, (x, y) in enumerate(micro_batches):
        if i == 0:
            (loss_fn(ddp_model(x), y) / k).backward()
        else:
            with ddp_model.no_sync():
                (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


def rank_1_never_syncs(ddp_model, optimizer, micro_batches, loss_fn):
    """Deadlocks: rank 1 never joins the other ranks' all-reduce."""
    if dist.get_rank() == 1:
        return everything_in_no_sync(ddp_model, optimizer, micro_batches, loss_fn)
    return MINE["train_with_accumulation"](ddp_model, optimizer, micro_batches, loss_fn)


ACCUMULATION_HINT, IN_NO_SYNC = checks.ACCUMULATION_HINT, checks.IN_NO_SYNC_HINT


@pytest.mark.parametrize("answer, message", [
    (all_reduces_every_micro_batch, "world size 2, 4 micro-batches of 2, optimizer step 1: "
     "rank 0 all-reduced 4 time(s); DDP needs 1 (one bucket) — Hint: " + IN_NO_SYNC),
    (backward_only_in_no_sync, "world size 2, 4 micro-batches of 2, optimizer step 1: "
     "rank 0 all-reduced 4 time(s); DDP needs 1 (one bucket) — Hint: " + IN_NO_SYNC),
    (forgot_to_scale_the_loss, "world size 2, 4 micro-batches of 2, after 3 steps: rank 0, "
     "0.weight, element 0: -0.01774, the big-batch run has -0.006516 — Hint: "
     + checks.SCALE_HINT),
    (everything_in_no_sync, "world size 1, 1 micro-batch of 2, optimizer step 1: rank 0 "
     "all-reduced 0 time(s); DDP needs 1 (one bucket) — Hint: " + checks.LAST_OUTSIDE_HINT),
    (syncs_the_first_micro_batch, "world size 2, 4 micro-batches of 2, after 3 steps: rank "
     "0, 0.weight, element 0: -0.006341, the big-batch run has -0.006516 — Hint: "
     + checks.SYNC_FIRST_HINT),
    (rank_1_never_syncs, "world size 2, 4 micro-batches of 2: deadlock (rank 0: all_reduce "
     "#3 on group WORLD; rank 1: returned) — Hint: rank 1 returned while others wait in a "
     "collective: every rank of a group must call each of its collectives."),
])
def test_accumulation_mistakes(capsys, short_timeout, answer, message):
    expect(capsys, checks.check_accumulation, answer, ACCUMULATION + message)


# zero_grad placement (newcomer trial): where the gradients are cleared decides what the
# step sees; each wrong place gets the cause the check finds in the gradients it saw


def never_zeroes(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            (loss_fn(ddp_model(x), y) / k).backward()
    x, y = micro_batches[-1]
    (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.step()


def zeroes_before_the_step(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            (loss_fn(ddp_model(x), y) / k).backward()
    x, y = micro_batches[-1]
    (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.zero_grad()
    optimizer.step()


def zeroes_every_micro_batch(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            optimizer.zero_grad()
            (loss_fn(ddp_model(x), y) / k).backward()
    x, y = micro_batches[-1]
    optimizer.zero_grad()
    (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.step()


def steps_every_micro_batch(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            (loss_fn(ddp_model(x), y) / k).backward()
            optimizer.step()
    x, y = micro_batches[-1]
    (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


def zeroes_at_the_start(ddp_model, optimizer, micro_batches, loss_fn):
    """The common idiom: clear, then accumulate and step. As right as clearing at the
    end: no gradient of one call reaches the next call's step."""
    optimizer.zero_grad()
    k = len(micro_batches)
    with ddp_model.no_sync():
        for x, y in micro_batches[:-1]:
            (loss_fn(ddp_model(x), y) / k).backward()
    x, y = micro_batches[-1]
    (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.step()


@pytest.mark.parametrize("answer, message", [
    (never_zeroes, "world size 1, 1 micro-batch of 2, after 3 steps: rank 0, 0.weight, "
     "element 0: -0.004562, the big-batch run has -0.004436 — Hint: " + checks.LEFTOVER_HINT),
    (zeroes_before_the_step, "world size 1, 1 micro-batch of 2, after 3 steps: rank 0, "
     "0.weight, element 0: -0.002647, the big-batch run has -0.004436 — Hint: "
     + checks.ZEROED_BEFORE_STEP_HINT),
    (zeroes_every_micro_batch, "world size 2, 4 micro-batches of 2, after 3 steps: rank 0, "
     "0.weight, element 0: -0.002763, the big-batch run has -0.006516 — Hint: "
     + checks.ZEROED_BETWEEN_HINT),
    (steps_every_micro_batch, "world size 2, 4 micro-batches of 2, call 1: rank 0 ran 4 "
     "optimizer step(s); one call is one step — Hint: " + checks.STEPS_HINT),
])
def test_accumulation_zero_grad_and_step_mistakes(capsys, answer, message):
    expect(capsys, checks.check_accumulation, answer, ACCUMULATION + message)


def test_clearing_the_gradients_at_the_start_is_right_too(capsys):
    assert line(capsys, checks.check_accumulation, zeroes_at_the_start)[0]


# ------------------------------------------------------ exercise 5: the trainer


class PresetNodes(DistributedTrainer):
    """Nodes of a preset have 8 GPUs: all ranks land on node 0."""

    def __init__(self, nodes, gpus_per_node, batch_size, gradient_accumulation=1):
        super().__init__(nodes, gpus_per_node, batch_size, gradient_accumulation)
        self.cluster = sc.Cluster.preset("dgx-a100", nodes=nodes)


class OneBigNode(DistributedTrainer):
    def __init__(self, nodes, gpus_per_node, batch_size, gradient_accumulation=1):
        super().__init__(nodes, gpus_per_node, batch_size, gradient_accumulation)
        self.cluster = sc.Cluster(sc.ClusterSpec(
            "one", (sc.NodeSpec("node0", nodes * gpus_per_node),)))


class BatchSizeIsGlobal(DistributedTrainer):
    def __init__(self, nodes, gpus_per_node, batch_size, gradient_accumulation=1):
        super().__init__(nodes, gpus_per_node, batch_size, gradient_accumulation)
        self.global_batch = batch_size


class EveryRankTakesTheSameSamples(DistributedTrainer):
    def train(self, make_model, inputs, targets, loss_fn, lr, steps):
        b, k = self.batch_size, self.gradient_accumulation
        model = DDP(make_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(steps):
            start = step * self.global_batch
            micro = [(inputs[start + i * b:start + (i + 1) * b],
                      targets[start + i * b:start + (i + 1) * b]) for i in range(k)]
            MINE["train_with_accumulation"](model, optimizer, micro, loss_fn)
        return [p.detach().clone() for p in model.parameters()]


class InterleavedRows(DistributedTrainer):
    """Every row of the step used once, rank r taking every p-th row (as torch's
    DistributedSampler deals them): the same gradient, but not the rows the lab gives."""

    def train(self, make_model, inputs, targets, loss_fn, lr, steps):
        rank, b, k = dist.get_rank(), self.batch_size, self.gradient_accumulation
        model = DDP(make_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(steps):
            rows = torch.arange(step * self.global_batch, (step + 1) * self.global_batch)
            mine = rows[rank::self.world_size]
            micro = [(inputs[mine[i * b:(i + 1) * b]], targets[mine[i * b:(i + 1) * b]])
                     for i in range(k)]
            MINE["train_with_accumulation"](model, optimizer, micro, loss_fn)
        return [p.detach().clone() for p in model.parameters()]


class IgnoresAccumulation(DistributedTrainer):
    def train(self, make_model, inputs, targets, loss_fn, lr, steps):
        rank, b = dist.get_rank(), self.batch_size
        model = DDP(make_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(steps):
            start = step * self.global_batch + rank * b
            MINE["train_with_accumulation"](
                model, optimizer, [(inputs[start:start + b], targets[start:start + b])],
                loss_fn)
        return [p.detach().clone() for p in model.parameters()]


class RightRowsWrongStep(DistributedTrainer):
    """The rows are right; exercise 4 is wrong (the loss is not scaled by 1/k)."""

    def train(self, make_model, inputs, targets, loss_fn, lr, steps):
        rank, b, k = dist.get_rank(), self.batch_size, self.gradient_accumulation
        model = DDP(make_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(steps):
            start = step * self.global_batch + rank * b * k
            for i in range(k):
                rows = slice(start + i * b, start + (i + 1) * b)
                loss_fn(model(inputs[rows]), targets[rows]).backward()
            optimizer.step()
            optimizer.zero_grad()
        return [p.detach().clone() for p in model.parameters()]


class Rank3Raises(DistributedTrainer):
    def train(self, *args):
        if dist.get_rank() == 3:
            raise IndexError("list index out of range")
        return super().train(*args)


SEED_CASE = ("DistributedTrainer(nodes=3, gpus_per_node=2, batch_size=2, "
             "gradient_accumulation=2)")
PLACEMENT_HINT = ("the ranks need 3 node(s) of 2 GPU(s) each; a preset node has 8. "
                  "(more help: checks.hint('trainer'))")


@pytest.mark.parametrize("answer, message", [
    (PresetNodes, "node 0 has 8 GPU(s), expected 2: rank 2 would not start node 1 — Hint: "
     + PLACEMENT_HINT),
    (OneBigNode, "the cluster has 1 node(s), expected 3 — Hint: " + PLACEMENT_HINT),
    (BatchSizeIsGlobal, "global_batch is 2, expected batch_size × nodes × gpus_per_node × "
     "gradient_accumulation = 24 — Hint: batch_size is per GPU, as in the article: the global "
     "batch counts every GPU and every micro-batch. (more help: checks.hint('trainer'))"),
    (EveryRankTakesTheSameSamples, "rank 1, step 1, micro-batch 1 trained on rows 0–1; the "
     "lab gives it rows 4–5 — Hint: " + checks.ROWS_HINT),
    (InterleavedRows, "rank 0, step 1, micro-batch 1 trained on rows 0, 6; the lab gives it "
     "rows 0–1 — Hint: " + checks.ROWS_HINT),
    (RightRowsWrongStep, "rank 0, 0.weight, element 0: -0.000532, the big-batch run has "
     "-0.001584 — Hint: " + checks.STEP_HINT),
    (IgnoresAccumulation, "rank 0 computed 2 loss(es) on micro-batches of 2 sample(s) in 2 "
     "steps; expected 4 of 2 — Hint: each optimizer step, every rank takes "
     "gradient_accumulation micro-batches of batch_size samples (batch_size is per GPU). "
     "(more help: checks.hint('trainer'))"),
    (Rank3Raises, "rank 3 raised IndexError: list index out of range — Hint: "
     + checking.HINTS["exception"]),
])
def test_distributed_trainer_mistakes(capsys, answer, message):
    expect(capsys, checks.check_distributed_trainer, answer, TRAINER + f"{SEED_CASE}: "
           + message)


class WaitsInTheHook(OverlappedDDP):
    """Right values and buckets, but each bucket's all-reduce blocks backward."""

    def _grad_ready(self, param):
        launched = len(self.pending)
        super()._grad_ready(param)
        if len(self.pending) > launched:
            self.pending[-1][2].wait()


def test_a_blocking_all_reduce_in_the_hook_hides_nothing(capsys):
    expect(capsys, checks.check_overlapped_ddp, WaitsInTheHook, OVERLAP
           + "world size 4, four 256×256 layers, bucket cap 65536 bytes: no communication "
           "overlapped backward (hidden time 0; DDP hides 4.3 µs) — Hint: " + checks.OVERLAP_HINT)


# ------------------------------------- one more that raises or deadlocks, per exercise


def stacks_the_gradients(model, cap):
    for bucket in MINE["bucket_parameters"](model.parameters(), cap):
        flat = torch.stack([q.grad for q in bucket])
        dist.all_reduce(flat)


class Rank1SkipsTheFirstBucket(OverlappedDDP):
    def _grad_ready(self, param):
        if dist.get_rank() == 1 and self.bucket_of[param] == 0:
            return
        super()._grad_ready(param)


def no_sync_without_parentheses(ddp_model, optimizer, micro_batches, loss_fn):
    k = len(micro_batches)
    with ddp_model.no_sync:
        for x, y in micro_batches[:-1]:
            (loss_fn(ddp_model(x), y) / k).backward()
    x, y = micro_batches[-1]
    (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


class Rank0TakesAnExtraStep(DistributedTrainer):
    def train(self, make_model, inputs, targets, loss_fn, lr, steps):
        extra = 1 if dist.get_rank() == 0 else 0
        return super().train(make_model, inputs, targets, loss_fn, lr, steps + extra)


@pytest.mark.parametrize("check, answer, message", [
    (checks.check_allreduce_in_buckets, stacks_the_gradients, "world size 1, bucket cap "
     "4000 bytes: rank 0 raised RuntimeError: stack expects each tensor to be equal size, "
     "but got [4] at entry 0 and [4, 16] at entry 1 — Hint: " + checking.HINTS["exception"]),
    (checks.check_overlapped_ddp, Rank1SkipsTheFirstBucket, "world size 2, bucket cap 4000 "
     "bytes: deadlock (rank 0: all_reduce #0 on group WORLD; rank 1: returned) — Hint: rank "
     "1 returned while others wait in a collective: every rank of a group must call each "
     "of its collectives."),
    (checks.check_accumulation, no_sync_without_parentheses, "world size 1, 1 micro-batch "
     "of 2: rank 0 raised TypeError: 'method' object does not support the context manager "
     "protocol — Hint: " + checking.HINTS["exception"]),
    (checks.check_distributed_trainer, Rank0TakesAnExtraStep, "DistributedTrainer(nodes=3, "
     "gpus_per_node=2, batch_size=2, gradient_accumulation=2): deadlock (rank 0: "
     "all_reduce #7 on group WORLD; rank 1: returned; rank 2: returned; rank 3: returned; "
     "… (6 ranks)) — Hint: ranks 1-5 returned while others wait in a collective: every "
     "rank of a group must call each of its collectives."),
])
def test_more_mistakes_that_raise_or_deadlock(capsys, short_timeout, check, answer,
                                              message):
    expect(capsys, check, answer, f"❌ {NAMES[check]}: {message}")


# ------------------------- a constructor that loops or exits (issue 24, item 8)


def test_a_trainer_constructor_that_loops_or_exits_is_a_failure(capsys, short_timeout):
    class LoopsInInit(MINE["DistributedTrainer"]):
        def __init__(self, *args):
            while True:
                pass

    class ExitsInInit(MINE["DistributedTrainer"]):
        def __init__(self, *args):
            exit()

    expect(capsys, checks.check_distributed_trainer, LoopsInInit,
           TRAINER + f"{SEED_CASE}: your function was still running after 2 s of work: it "
           "used 2 s of CPU time (an endless loop?) — Hint: " + checking.HINTS["timeout"])
    expect(capsys, checks.check_distributed_trainer, ExitsInInit,
           TRAINER + f"{SEED_CASE} called sys.exit(None) — Hint: " + checking.HINTS["exit"])


# ------------------------------------------- the bucket rule, checked on its own (issue 30)

RULE = "❌ bucket rule: "


def rule_past_the_cap(params, cap):
    buckets, current, size = [], [], 0
    for q in reversed(list(params)):
        current.append(q)
        size += q.numel() * q.element_size()
        if size > cap:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def rule_as_a_generator(params, cap):
    yield from MINE["bucket_parameters"](params, cap)


def rule_in_forward_order(params, cap):
    buckets, current, size = [], [], 0
    for q in params:
        current.append(q)
        size += q.numel() * q.element_size()
        if size >= cap:
            buckets.append(current)
            current, size = [], 0
    return buckets + ([current] if current else [])


def rule_reads_the_generator_twice(params, cap):
    """The newcomer trial's: a sum over ``params`` first, then the loop finds it empty."""
    total = sum(q.numel() for q in params)
    assert total > 0
    return MINE["bucket_parameters"](params, cap)


def rule_that_loops(params, cap):
    while True:
        pass


def test_the_bucket_rule_passes_the_reference_and_refuses_it(capsys):
    expect(capsys, checks.check_bucket_parameters, learner_copy(R.bucket_parameters)[
        "bucket_parameters"],
           "✅ bucket rule: DDP's buckets for caps of 4000, 1360, 336, 1 bytes (1,360 and 336 "
           "land on a bucket's exact size)")
    assert line(capsys, checks.check_bucket_parameters, R.bucket_parameters)[1].startswith(
        RULE + "this function is the workbook's own reference answer")


@pytest.mark.parametrize("answer, message", [
    (rule_past_the_cap, "bucket cap 1360 bytes: your buckets are 4.bias, 4.weight, 2.bias, "
     "2.weight, 0.bias (1424 B) | 0.weight (512 B); DDP's are 4.bias, 4.weight, 2.bias, "
     "2.weight (1360 B) | 0.bias, 0.weight (576 B) — Hint: a bucket that holds exactly 1360 "
     "bytes has reached the cap: it is full (\"reaches the cap or more\"). (more help: "
     "checks.hint('buckets'))"),
    (rule_as_a_generator, "bucket cap 4000 bytes: returned a generator, not a list of "
     "buckets — Hint: return a list whose items are lists of parameters (a generator can be "
     "read only once, and OverlappedDDP needs len() of it). (more help: "
     "checks.hint('buckets'))"),
    (rule_in_forward_order, "bucket cap 4000 bytes: your buckets are 0.weight, 0.bias, "
     "2.weight, 2.bias, 4.weight, 4.bias (1936 B); DDP's are 4.bias, 4.weight, 2.bias, "
     "2.weight, 0.bias, 0.weight (1936 B) — Hint: your buckets follow the "
     "forward order: backward produces the LAST layer's gradients first, and DDP fills its "
     "buckets in that order. (more help: checks.hint('buckets'))"),
    (lambda params, cap: [], "bucket cap 4000 bytes: your buckets are none; DDP's are 4.bias, "
     "4.weight, 2.bias, 2.weight, 0.bias, 0.weight (1936 B) — Hint: " + BUCKET_HINT),
    (rule_reads_the_generator_twice, "bucket cap 4000 bytes: your buckets are none; DDP's are "
     "4.bias, 4.weight, 2.bias, 2.weight, 0.bias, 0.weight (1936 B) — Hint: "
     + checks.USED_UP_HINT),
])
def test_bucket_rule_mistakes(capsys, answer, message):
    expect(capsys, checks.check_bucket_parameters, answer, RULE + message)


def test_a_bucket_rule_that_loops_or_exits_is_a_failure(capsys, short_timeout):
    expect(capsys, checks.check_bucket_parameters, rule_that_loops, RULE + "bucket cap 4000 "
           "bytes: bucket_parameters: your function was still running after 2 s of "
           "work: it used 2 s of CPU time (an endless loop?) — Hint: " + checking.HINTS["timeout"])
    expect(capsys, checks.check_bucket_parameters, lambda params, cap: exit(3), RULE
           + "bucket cap 4000 bytes: bucket_parameters called sys.exit(3) — Hint: "
           + checking.HINTS["exit"])


def test_overlapped_ddp_on_a_generator_rule_names_the_rule(capsys):
    class OnAGenerator(OverlappedDDP):
        def __init__(self, model, cap):
            self.buckets = rule_as_a_generator(model.parameters(), cap)
            self.ready = [0] * len(self.buckets)

    text = line(capsys, checks.check_overlapped_ddp, OnAGenerator)[1]
    assert text.endswith("— Hint: " + checks.GENERATOR_HINT), text
