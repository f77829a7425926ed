"""The checks of lab 03 (data parallelism), on the protocol of :mod:`workbook.checking`.

Each check runs the learner's code on small real models (an MLP of a few hundred
parameters) on world sizes 1, 2, 3, 4, 5 and 8 (powers of two and not), and compares the
gradients or parameters with torch's own ``DistributedDataParallel`` run on the same data:
bitwise where the order of reduction allows (DDP scales by 1/p before summing, the lab
divides after: the same bits when p is a power of two), ``allclose`` otherwise. Collective
counts and sizes are read from the simulator's record (``sc.collectives_called()``,
``run.collectives``), overlap from ``run.summary()``. The reference answers
(:mod:`._reference`) are imported inside the checks only.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc
from workbook.checking import (SCALE, Failure, WORLD_SIZES, answers, check, close_within,
                               compare_scaled, first_difference, listed, mse, num, on_a_rank,
                               refuse_reference, seconds, short, simulate)
from workbook.hints import Hints
from workbook.lesson03_data_parallel.lab import batch, make_mlp

# bytes: 1, 2 and 3 buckets of the MLP's 1,936 bytes. Backward's order (reversed) makes
# running totals of 16, 272, 336, 1360, 1424, 1936 bytes: caps of 1360 and 336 land on a
# total, so a bucket closed at `size > cap` instead of `size >= cap` differs from DDP's
# (336 bytes: DDP makes buckets of 336, 1024, 576; `>` makes 1360, 576).
BUCKET_CAPS = (4_000, 1_360, 336)
RULE_CAPS = (*BUCKET_CAPS, 1)        # and 1 byte: every parameter its own bucket
STEPS = 2                           # the second step runs on DDP's rebuilt buckets
PER_RANK = 4                        # samples per rank and step
LR = 0.1


_reference = answers(__name__)   # the answers, imported only while a check runs


def _cluster():
    """One DGX node: up to 8 ranks."""
    return sc.Cluster.preset("dgx-a100", nodes=1)


def _names(model):
    return [name for name, _ in model.named_parameters()]


# ------------------------------------------------------ one step's gradients, by rank


def _gradient_steps(world_size, prepare, after_backward):
    """The body every rank runs: ``STEPS`` steps of forward on its shard, backward,
    ``after_backward(model)``, the gradients recorded, an SGD step. ``prepare(model)``
    returns the module to call (the model, or DDP around it)."""

    def body():
        rank = dist.get_rank()
        model = make_mlp()
        module = prepare(model)
        steps = []
        for step in range(STEPS):
            x, y = batch(PER_RANK * world_size, step)
            shard = slice(PER_RANK * rank, PER_RANK * (rank + 1))
            before = len(sc.collectives_called())
            mse(module(x[shard]), y[shard]).backward()
            local = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
            after_backward(model)
            grads = [None if p.grad is None else p.grad.clone() for p in model.parameters()]
            called = sc.collectives_called()[before:]
            steps.append({"local": local, "grads": grads, "collectives": called})
            with torch.no_grad():
                for p in model.parameters():
                    if p.grad is not None:   # a None gradient is reported afterwards
                        p -= LR * p.grad
            model.zero_grad()
        return steps

    return body


_DDP_RUNS = {}


def ddp_run(world_size, bucket_cap=None):
    """torch's DDP on the checks' MLP and data, with accounting (cached per case)."""
    key = (world_size, bucket_cap)
    if key not in _DDP_RUNS:
        kwargs = {} if bucket_cap is None else {"bucket_cap_mb": bucket_cap / 2**20}
        body = _gradient_steps(world_size, lambda m: DDP(m, **kwargs), lambda m: None)
        _DDP_RUNS[key] = _cluster().run(body, world_size=world_size)
    return _DDP_RUNS[key]


def ddp_buckets(world_size, bucket_cap):
    """The bytes of each all-reduce DDP issues per step once its buckets are rebuilt
    (its second step), in order."""
    run = ddp_run(world_size, bucket_cap)
    count = run.results[0][-1]["collectives"].count("all_reduce")
    sizes = [c.nbytes for c in run.collectives if c.op == "all_reduce"]
    return sizes[-count:]


def _close(world_size):
    """How gradients are compared with DDP's: DDP multiplies by 1/p before the sum, the
    lab divides after it. For p a power of two both are exact scalings (the same bits):
    None, bitwise; otherwise within rounding."""
    return None if world_size & (world_size - 1) == 0 else close_within()


hint = Hints({
    "average": [
        "After backward() each rank holds the gradient of its own shard's loss. Which "
        "collective leaves every rank with the same combination of all ranks' tensors, and "
        "is that combination already the mean?",
        "dist.all_reduce sums in place on every rank. The mean over p ranks is that sum "
        "divided by p, for every parameter, in the same order on every rank.",
        "One loop over the model's parameters: all-reduce each gradient, then divide it in "
        "place (the tensor param.grad itself, not a new one).",
    ],
    "buckets": [
        "Backward produces gradients from the last layer to the first: in which order do "
        "DDP's buckets fill? And when exactly is a bucket full? Re-read \"reaches the cap "
        "or more\".",
        "Keep a running byte count of the current bucket (elements × bytes per element). "
        "The parameter that makes the count reach the cap stays in; the next bucket starts "
        "empty; what is left at the end is the last bucket. Return a list of lists.",
        "copy_back: the flat tensor holds the bucket's gradients one after another, in the "
        "bucket's order; walk the bucket with an offset and view each slice in its "
        "gradient's shape. allreduce_in_buckets: per bucket, flatten, all-reduce once, "
        "copy back.",
    ],
    "overlap": [
        "Autograd calls your hook once per parameter, when its gradient is complete. How "
        "does the hook know it just saw the LAST gradient of its bucket? And what must the "
        "all-reduce it launches return, so that backward is not blocked?",
        "Count the ready gradients of each bucket; when the count reaches the bucket's "
        "length, flatten it and launch an asynchronous all-reduce (async_op=True gives a "
        "Work). Keep what finish() will need: which bucket, the flat tensor, the Work.",
        "finish(): an asynchronous all-reduce has finished only once its Work's wait() "
        "returns; then copy back as in exercise 2. Reset the per-step state: the hooks "
        "fire again in the next step.",
    ],
    "accumulation": [
        "Of the k backward passes, which one must all-reduce? DDP decides that in forward, "
        "not in backward. And k micro-batch losses added up are k times which loss?",
        "ddp_model.no_sync() is a context manager that switches DDP's all-reduce off for "
        "the forward and backward inside it. Scale each micro-batch's loss by 1/k, so the "
        "accumulated gradient is the mean over the micro-batches.",
        "Every micro-batch but the last: forward and backward inside no_sync(). The last "
        "one outside it. Then one optimizer step, and zero the gradients.",
    ],
    "trainer": [
        "batch_size is per GPU: how many samples does one optimizer step see, over every "
        "node, GPU and micro-batch? A preset node has 8 GPUs: how do you describe nodes of "
        "gpus_per_node GPUs?",
        "sc.ClusterSpec(name, nodes) takes a tuple of sc.NodeSpec(name, devices), one per "
        "node. In train, step s owns rows s·global_batch to (s+1)·global_batch; rank r's "
        "share of them is contiguous, batch_size·gradient_accumulation rows long, in rank "
        "order.",
        "Cut rank r's rows of the step into gradient_accumulation micro-batches of "
        "batch_size rows, as a list of (inputs, targets) pairs, and train the step with "
        "your train_with_accumulation.",
    ],
})


def _more(exercise, text):
    """A ❌ hint: what the check found to think about, then where the next step is."""
    return f"{text} ({hint.pointer(exercise)})"


AVERAGE_HINTS = {
    "times": "all_reduce sums: the mean is the sum divided by the world size.",
    "over": "the sum is divided more than once (or by p²): divide once, by the world size.",
    "own": "this gradient was never combined with the other ranks': every parameter's "
           "gradient needs it, none skipped.",
    "values": _more("average", "every rank must end with the same mean of all ranks' "
                    "gradients (a collective that leaves it on every rank, not on one)."),
}


def _compare_gradients(where, run, expected_run, names, hints, unfinished=None):
    """Fail at the first rank, step and parameter whose gradient differs from DDP's.
    ``unfinished``: the hint for a gradient that is this rank's own divided by p (an
    all-reduce copied back before it finished); else that is judged as other values."""
    p = run.world_size
    close = _close(p)
    for step in range(STEPS):
        for rank in range(p):
            got_step, exp_step = run.results[rank][step], expected_run.results[rank][step]
            for name, local, got, exp in zip(names, got_step["local"], got_step["grads"],
                                             exp_step["grads"]):
                at = f"{where}, step {step + 1}: rank {rank}, {name}"
                if got is None:
                    raise Failure(f"{at}: the gradient is None", hints["own"])
                if (unfinished and p > 1 and first_difference(exp, got, _close(p))
                        and torch.allclose(got, local / p, **SCALE)):
                    raise Failure(f"{at}: the gradient is this rank's own divided by {p}: "
                                  "the all-reduce had not summed it yet when it was copied "
                                  "back", unfinished)
                compare_scaled(at, exp, got, p, hints, own=local, close=close,
                               theirs="DDP's", holder="DDP")


def _run_learner(where, world_size, body, accounting=False):
    return simulate(_cluster(), body, world_size, lambda rank: where,
                    accounting=accounting)


def _case_text(world_size, bucket_cap=None):
    text = f"world size {world_size}"
    return text if bucket_cap is None else f"{text}, bucket cap {bucket_cap} bytes"


# ------------------------------------------------------------ exercise 1: by hand


@check("average gradients")
def check_average_gradients(fn):
    """``fn(model)`` on every rank after ``backward()``: every gradient becomes its mean
    over the ranks; compared with DDP's gradients, two steps, world sizes 1–8."""
    refuse_reference(fn, _reference().average_gradients)
    for p in WORLD_SIZES:
        where = _case_text(p)
        run = _run_learner(where, p, _gradient_steps(p, lambda m: m, fn))
        _compare_gradients(where, run, ddp_run(p), _names(make_mlp()), AVERAGE_HINTS)
    return (f"gradients equal DDP's on world sizes {listed(WORLD_SIZES)} (bitwise on 1, 2, "
            "4, 8)")


# --------------------------------------------------------- exercise 2: buckets


def _check_buckets(where, run, p, cap, hint, next_step_hint=None):
    """The learner's all-reduces per step match DDP's buckets in number and bytes
    (``next_step_hint``: when only a step after the first is wrong)."""
    expected = ddp_buckets(p, cap)
    for step in range(STEPS):
        names = run.results[0][step]["collectives"]
        if names.count("all_reduce") != len(expected) or len(names) != len(expected):
            raise Failure(f"{where}, step {step + 1}: rank 0 called {len(names)} "
                          f"collective(s) ({listed(sorted(set(names))) or 'none'}); DDP "
                          f"all-reduces {len(expected)} bucket(s)",
                          next_step_hint if step and next_step_hint else hint)
    got = [c.nbytes for c in run.collectives if c.op == "all_reduce"][-len(expected):]
    if got != expected:
        raise Failure(f"{where}: your all-reduces carry {listed(got)} bytes; DDP's buckets "
                      f"carry {listed(expected)} bytes",
                      _sizes_hint(cap, got) if hint is BUCKET_HINT else hint)


COPY_BACK_HINT = _more("buckets", "the gradients were never overwritten: flattening makes "
                       "a NEW tensor, so the all-reduced values must be copied back into "
                       "each gradient, divided by the world size.")
BUCKET_HINT = _more("buckets", "one all-reduce per bucket, and DDP's buckets: filled in the "
                    "order backward produces gradients, closed when they reach the cap.")
EARLY_HINT = _more("buckets", "launch a bucket's all-reduce when its LAST gradient is "
                   "ready (the count equals the bucket's size), not on its first: the flat "
                   "tensor holds the gradients as they are when it is built.")
COPY_VALUES_HINT = _more("buckets", "each gradient gets the slice of the all-reduced flat "
                         "tensor at its own offset, in the order the bucket was "
                         "flattened, divided by the world size.")


def _bucket_names(model, buckets):
    names = {param: name for name, param in model.named_parameters()}
    return [[names.get(q, "?") for q in bucket] for bucket in buckets]


def _expected_buckets(model, cap):
    """DDP's buckets of ``model`` at ``cap`` (by parameter name), read off the sizes of the
    all-reduces torch's DDP issues once it has rebuilt its buckets."""
    sizes, params, buckets = ddp_buckets(2, cap), list(model.named_parameters())[::-1], []
    for size in sizes:
        bucket, total = [], 0
        while total < size:
            name, param = params.pop(0)
            bucket.append(name)
            total += param.numel() * param.element_size()
        buckets.append(bucket)
    return buckets


FORWARD_ORDER_HINT = _more("buckets", "your buckets follow the forward order: backward "
                           "produces the LAST layer's gradients first, and DDP fills its "
                           "buckets in that order.")


USED_UP_HINT = _more("buckets", "no parameter reached a bucket: params is a generator "
                     "(model.parameters()), which can be read only once; a first pass over "
                     "it (a sum(), a len(list(...))) leaves nothing for the loop. Start with "
                     "params = list(params).")


def _past_the_cap_hint(cap):
    return _more("buckets", f"a bucket that holds exactly {cap} bytes has reached the cap: "
                 "it is full (\"reaches the cap or more\").")


def _nbytes(model):
    """``{name: bytes of its gradient}`` of ``model``'s parameters."""
    return {name: q.numel() * q.element_size() for name, q in model.named_parameters()}


def _buckets_by(model, cap, forward=False, past=False):
    """Buckets (by name) by DDP's rule, or filled in ``forward`` order, or closed only
    once ``past`` the cap (``> cap``): the two slips the hints name."""
    sizes = _nbytes(model)
    order = list(sizes) if forward else list(sizes)[::-1]
    buckets, current, total = [], [], 0
    for name in order:
        current.append(name)
        total += sizes[name]
        if total > cap if past else total >= cap:
            buckets.append(current)
            current, total = [], 0
    return buckets + ([current] if current else [])


def _rule_hint(model, cap, got_names):
    """What a wrong set of buckets did: closed at `> cap`, filled in forward order, or else."""
    flat = [name for bucket in got_names for name in bucket]
    if flat == list(_nbytes(model)):
        return FORWARD_ORDER_HINT
    if got_names == _buckets_by(model, cap, past=True):
        return _past_the_cap_hint(cap)
    return BUCKET_HINT


def _sizes_hint(cap, got):
    """The same for the bytes of a step's all-reduces (the checks' MLP)."""
    model = make_mlp()
    sizes = _nbytes(model)
    for buckets, hint in ((_buckets_by(model, cap, forward=True), FORWARD_ORDER_HINT),
                          (_buckets_by(model, cap, past=True), _past_the_cap_hint(cap))):
        if got == [sum(sizes[n] for n in bucket) for bucket in buckets]:
            return hint
    return BUCKET_HINT


def _show(model, buckets):
    """``4.bias, 4.weight (272 B) | 2.bias ...``: each bucket's parameters and bytes."""
    params = dict(model.named_parameters())
    sizes = [sum(params[n].numel() * params[n].element_size() for n in bucket)
             for bucket in buckets]
    return " | ".join(f"{', '.join(bucket)} ({size} B)"
                      for bucket, size in zip(buckets, sizes)) or "none"


@check("bucket rule")
def check_bucket_parameters(fn):
    """``fn(params, bucket_cap_bytes)`` on its own: the list of DDP's buckets (lists of
    parameters) of the checks' MLP, for caps that land on a running total, above the
    model and below every parameter."""
    refuse_reference(fn, _reference().bucket_parameters)
    model = make_mlp()
    for cap in RULE_CAPS:
        where = f"bucket cap {cap} bytes"
        params = model.parameters()
        got = on_a_rank(fn, (params, cap), f"{where}: bucket_parameters")
        used_up = next(params, None) is None   # read to its end by the learner's code
        if not isinstance(got, list) or not all(isinstance(b, list) for b in got):
            raise Failure(f"{where}: returned a {type(got).__name__}, not a list of buckets",
                          _more("buckets", "return a list whose items are lists of "
                                "parameters (a generator can be read only once, and "
                                "OverlappedDDP needs len() of it)."))
        if not all(isinstance(q, torch.nn.Parameter) for b in got for q in b):
            raise Failure(f"{where}: a bucket holds something other than the parameters "
                          "it was given", _more("buckets", "put the parameters themselves "
                                                "into the buckets (not their gradients or "
                                                "sizes)."))
        got_names, expected = _bucket_names(model, got), _expected_buckets(model, cap)
        if got_names != expected:
            empty = used_up and not any(got_names)
            raise Failure(f"{where}: your buckets are {_show(model, got_names)}; DDP's are "
                          f"{_show(model, expected)}",
                          USED_UP_HINT if empty else _rule_hint(model, cap, got_names))
    return (f"DDP's buckets for caps of {listed(RULE_CAPS)} bytes (1,360 and 336 land on a "
            "bucket's exact size)")


@check("all-reduce in buckets")
def check_allreduce_in_buckets(fn):
    """``fn(model, bucket_cap_bytes)`` on every rank after ``backward()``: DDP's buckets,
    one all-reduce each; gradients compared with DDP, all-reduces counted and sized."""
    refuse_reference(fn, _reference().allreduce_in_buckets)
    hints = {**AVERAGE_HINTS, "own": COPY_BACK_HINT,
             "values": "copy each bucket's all-reduced values back into the right "
                       "gradients, in the order you flattened them, divided by the world "
                       "size."}
    for p in WORLD_SIZES:
        for cap in BUCKET_CAPS:
            where = _case_text(p, cap)
            run = _run_learner(where, p, _gradient_steps(p, lambda m: m,
                                                         lambda m: fn(m, cap)),
                               accounting=True)
            _compare_gradients(where, run, ddp_run(p, cap), _names(make_mlp()), hints)
            _check_buckets(where, run, p, cap, BUCKET_HINT)
    return (f"gradients and all-reduces equal DDP's on world sizes {listed(WORLD_SIZES)}, "
            f"bucket caps {listed(BUCKET_CAPS)} bytes")


# --------------------------------------------------------------- exercise 3: overlap


def make_wide_mlp():
    """The overlap check's model: four 256 × 256 layers, enough compute in backward to
    hide an all-reduce behind."""
    torch.manual_seed(0)
    layers = []
    for _ in range(4):
        layers += [nn.Linear(256, 256), nn.ReLU()]
    return nn.Sequential(*layers)


OVERLAP_WORLD, OVERLAP_CAP, OVERLAP_BATCH = 4, 1 << 16, 32


def _overlap_body(prepare):
    """Two steps of the wide MLP; ``prepare(model)`` returns the module to call and what
    to call after each backward."""

    def body():
        rank = dist.get_rank()
        model = make_wide_mlp()
        module, finish = prepare(model)
        g = torch.Generator().manual_seed(3)
        for _ in range(STEPS):
            x = torch.randn(OVERLAP_BATCH * OVERLAP_WORLD, 256, generator=g)
            module(x[OVERLAP_BATCH * rank:OVERLAP_BATCH * (rank + 1)]).square().mean() \
                .backward()
            finish()
            model.zero_grad()

    return body


def _hidden(run):
    """Communication time that ran while compute was busy, on the busiest rank."""
    return max(row["overlap_s"] for row in run.summary().rows)


WAIT_HINT = _more("overlap", "an asynchronous all-reduce has not finished when the call "
                  "returns: what must finish() do with each bucket's Work before it reads "
                  "the flat tensor?")
OVERLAP_HINT = _more("overlap", "nothing ran while backward computed: each bucket's "
                     "all-reduce must start, without blocking, from the hook that sees its "
                     "last gradient, not in finish().")
RESET_HINT = _more("overlap", "the next step's hooks found this step's counts: finish() "
                   "must leave the per-step state as __init__ made it.")
STALE_HINT = _more("overlap", "finish() handled this step's all-reduces but left them in "
                   "self.pending: every later finish() would wait on them again and copy "
                   "their old values back before the new ones. Once a bucket is copied "
                   "back, it is no longer pending.")
GENERATOR_HINT = _more("buckets", "bucket_parameters must return a list of buckets (run the "
                       "bucket rule's check): __init__ takes len() of it.")


def _still_pending(wrapper):
    """How many launched all-reduces ``wrapper.pending`` (the lab's list of this step's
    (bucket, flat, work)) still holds; 0 when it is gone or not a container."""
    try:
        return len(wrapper.pending)
    except (AttributeError, TypeError):
        return 0


def _check_launched_early(where, run):
    """A gradient that backward made nonzero but that comes back all zeros was flattened
    (as zeros, or not at all) before it was ready: its bucket's all-reduce started too
    early, not at the bucket's last gradient."""
    names = _names(make_mlp())
    for step in range(STEPS):
        for rank in range(run.world_size):
            got_step = run.results[rank][step]
            for name, local, got in zip(names, got_step["local"], got_step["grads"]):
                if (isinstance(got, torch.Tensor) and isinstance(local, torch.Tensor)
                        and local.count_nonzero() and not got.count_nonzero()):
                    raise Failure(f"{where}, step {step + 1}: rank {rank}, {name}: all zeros "
                                  "after finish(), though backward made it nonzero: its "
                                  "bucket was flattened and all-reduced before this "
                                  "gradient was ready", EARLY_HINT)


@check("overlapped DDP")
def check_overlapped_ddp(cls):
    """``cls(model, bucket_cap_bytes)`` built before training; ``finish()`` after each
    ``backward()``. Gradients and all-reduces compared with DDP, ``self.pending`` empty
    after each ``finish()`` (stale work would be waited on and copied back again), and
    communication must overlap backward on the simulator's record
    (``run.summary()``'s ``overlap``)."""
    refuse_reference(cls, _reference().OverlappedDDP, "class")
    hints = {**AVERAGE_HINTS, "own": COPY_BACK_HINT, "values": COPY_VALUES_HINT}
    for p in WORLD_SIZES:
        for cap in BUCKET_CAPS:
            where = _case_text(p, cap)
            wrappers, left = {}, {}

            def prepare(model, cap=cap):
                wrappers[dist.get_rank()] = cls(model, cap)
                return model

            def finish(model, wrappers=wrappers, left=left):
                wrapper = wrappers[dist.get_rank()]
                wrapper.finish()
                left.setdefault(dist.get_rank(), []).append(_still_pending(wrapper))

            body = _gradient_steps(p, prepare, finish)
            try:
                run = _run_learner(where, p, body, accounting=True)
            except Failure as failure:
                if "'generator'" in failure.what:
                    raise Failure(failure.what, GENERATOR_HINT) from None
                raise
            try:
                _compare_gradients(where, run, ddp_run(p, cap), _names(make_mlp()), hints,
                                   unfinished=WAIT_HINT)
            except Failure:
                _check_launched_early(where, run)   # the likelier cause, if it shows
                raise
            _check_buckets(where, run, p, cap, BUCKET_HINT, RESET_HINT)
            for rank, counts in sorted(left.items()):
                for step, count in enumerate(counts):
                    if count:
                        raise Failure(f"{where}, step {step + 1}: after finish(), rank "
                                      f"{rank}'s self.pending still holds {count} "
                                      "all-reduce(s) it has already copied back",
                                      STALE_HINT)
    where = (f"world size {OVERLAP_WORLD}, four 256×256 layers, bucket cap {OVERLAP_CAP} "
             "bytes")
    mine = simulate(_cluster(),
                    _overlap_body(lambda m: (m, cls(m, OVERLAP_CAP).finish)),
                    OVERLAP_WORLD, lambda rank: where, accounting=True)
    ddp = _cluster().run(
        _overlap_body(lambda m: (DDP(m, bucket_cap_mb=OVERLAP_CAP / 2**20), lambda: None)),
        world_size=OVERLAP_WORLD)
    hidden, ddp_hidden = _hidden(mine), _hidden(ddp)
    if hidden <= 0:
        raise Failure(f"{where}: no communication overlapped backward (hidden time 0; "
                      f"DDP hides {seconds(ddp_hidden)})", OVERLAP_HINT)
    return (f"gradients and all-reduces equal DDP's on world sizes {listed(WORLD_SIZES)}, "
            f"bucket caps {listed(BUCKET_CAPS)} bytes; {seconds(hidden)} of communication "
            f"hidden behind backward (DDP: {seconds(ddp_hidden)})")


# ------------------------------------------------------- exercise 4: accumulation


ACCUMULATION_CASES = ((1, 1), (2, 4), (3, 2), (4, 3), (5, 2), (8, 2))   # (p, micro-batches)
MICRO = 2            # samples per micro-batch
OPT_STEPS = 3


def big_batch_reference(global_batch, steps, lr=LR):
    """One process, the whole global batch per step, SGD: the parameters data
    parallelism must reproduce."""
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    for step in range(steps):
        x, y = batch(global_batch, step, seed=2)
        mse(model(x), y).backward()
        optimizer.step()
        optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def _compare_parameters(where, rank, params, expected, names, hint):
    """Fail at the first of ``params`` (a rank's, after training) not close to
    ``expected``'s."""
    if not isinstance(params, (list, tuple)) or len(params) != len(expected):
        raise Failure(f"{where}: rank {rank} returned {type(params).__name__}, expected "
                      f"the list of its {len(expected)} parameters",
                      "train must return this rank's parameters after training, as the "
                      "last line of the lab's train does.")
    close = lambda e, g: torch.isclose(e, g, rtol=1e-4, atol=1e-6)  # noqa: E731
    for name, got, exp in zip(names, params, expected):
        diff = first_difference(exp, got, close)
        if diff is not None:
            i, e, g = diff
            raise Failure(f"{where}: rank {rank}, {name}, element {i}: {num(g)}, the "
                          f"big-batch run has {num(e)}", hint)


ACCUMULATION_HINT = _more("accumulation", "one all-reduce and one optimizer step, but not "
                          "the big batch's gradient: does every micro-batch run its forward "
                          "and backward on its own rows, with its loss divided by k?")
IN_NO_SYNC_HINT = _more("accumulation", "DDP decides in forward whether the coming backward "
                        "all-reduces: every micro-batch but the last needs its forward AND "
                        "its backward inside no_sync().")
LAST_OUTSIDE_HINT = _more("accumulation", "the accumulated gradients must be all-reduced "
                          "once: by the last micro-batch's backward, outside no_sync().")
SYNC_FIRST_HINT = _more("accumulation", "the step saw the FIRST micro-batch's gradient "
                        "averaged over the ranks and the later ones only local: the one "
                        "all-reduce ran after the first backward. The first k - 1 micro-batches "
                        "go inside no_sync(), the last one outside it, so the all-reduce "
                        "carries the whole sum.")
STEPS_HINT = _more("accumulation", "one call is ONE optimizer step over all k micro-batches: "
                   "step once, after the last backward.")
SCALE_HINT = _more("accumulation", "the step saw k times the big batch's gradient: k "
                   "micro-batch losses, each a mean, add up to k times the batch's mean "
                   "loss. Divide each by k.")
ZEROED_BETWEEN_HINT = _more("accumulation", "the step saw only the last micro-batch's "
                            "gradient: something cleared .grad between the micro-batches. "
                            "The k backward passes must add up in .grad before the step.")
ZEROED_BEFORE_STEP_HINT = _more("accumulation", "the step found no gradient (None or zeros): "
                                "the gradients were cleared before optimizer.step() read "
                                "them. Clear them after the step, or before the first "
                                "backward.")
LEFTOVER_HINT = _more("accumulation", "the first step was right, but the next one also "
                      "added the previous call's gradients, still in .grad: clear the "
                      "gradients once per call (after the step, or before the first "
                      "backward).")


def _accumulation_reference(p, k):
    """One process on the whole batch: the gradient each optimizer step must see, and
    what the first step sees from each rank's LAST micro-batch alone (loss / k)."""
    model = make_mlp()
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    grads, last_only = [], None
    for step in range(OPT_STEPS):
        x, y = batch(MICRO * k * p, step, seed=2)
        if step == 0:
            rows = torch.cat([torch.arange(MICRO * (k * r + k - 1), MICRO * k * (r + 1))
                              for r in range(p)])
            (mse(model(x[rows]), y[rows]) / k).backward()
            last_only = [q.grad.clone() for q in model.parameters()]
            model.zero_grad()
        mse(model(x), y).backward()
        grads.append([q.grad.clone() for q in model.parameters()])
        optimizer.step()
        optimizer.zero_grad()
    return grads, last_only


def _synced_first_only(p, k, rank):
    """The gradient rank ``rank``'s first step sees when the all-reduce runs after its
    first micro-batch: micro-batch 0 averaged over the ranks, the later ones its own."""
    model = make_mlp()
    x, y = batch(MICRO * k * p, 0, seed=2)

    def loss(r, i, scale):
        rows = slice(MICRO * (k * r + i), MICRO * (k * r + i + 1))
        (mse(model(x[rows]), y[rows]) * scale).backward()

    for r in range(p):
        loss(r, 0, 1 / (k * p))
    for i in range(1, k):
        loss(rank, i, 1 / k)
    return [q.grad.clone() for q in model.parameters()]


def _same(got, want):
    """Every gradient of ``got`` (None allowed) close to ``want``'s."""
    return got is not None and all(
        g is not None and g.shape == w.shape and torch.allclose(g, w, rtol=1e-4, atol=1e-6)
        for g, w in zip(got, want))


def _accumulation_hint(seen, k, p, rank):
    """What the gradients each optimizer step saw (``seen``: rank ``rank``'s, per call)
    say is wrong."""
    grads, last_only = _accumulation_reference(p, k)
    first = seen[0]
    if all(g is None or not g.any() for g in first):
        return ZEROED_BEFORE_STEP_HINT
    if k > 1 and _same(first, [k * g for g in grads[0]]):
        return SCALE_HINT
    if k > 1 and _same(first, last_only):
        return ZEROED_BETWEEN_HINT
    if k > 1 and p > 1 and _same(first, _synced_first_only(p, k, rank)):
        return SYNC_FIRST_HINT
    if _same(first, grads[0]):
        for step in range(1, len(seen)):
            now, before = seen[step], seen[step - 1]
            if None not in now and None not in before and _same(
                    [a - b for a, b in zip(now, before)], grads[step]):
                return LEFTOVER_HINT
    return ACCUMULATION_HINT


@check("gradient accumulation")
def check_accumulation(fn):
    """``fn(ddp_model, optimizer, micro_batches, loss_fn)``: one optimizer step over the
    micro-batches, all-reducing once (DDP's one bucket) per step; parameters after three
    steps compared with one process on the whole batch, and a wrong result explained
    from the gradients each optimizer step saw."""
    refuse_reference(fn, _reference().train_with_accumulation)
    names = _names(make_mlp())
    for p, k in ACCUMULATION_CASES:
        where = f"world size {p}, {k} micro-batch{'es' if k > 1 else ''} of {MICRO}"

        def body(p=p, k=k):
            rank = dist.get_rank()
            model = DDP(make_mlp())
            optimizer = torch.optim.SGD(model.parameters(), lr=LR)
            seen = []     # per optimizer step: the gradients it found

            def record(*_):
                seen.append([None if q.grad is None else q.grad.clone()
                             for q in model.module.parameters()])

            optimizer.register_step_pre_hook(record)
            calls = []    # per call: (all-reduces, optimizer steps, what its first step saw)
            for step in range(OPT_STEPS):
                x, y = batch(MICRO * k * p, step, seed=2)
                start = rank * MICRO * k
                micro = [(x[start + i * MICRO:start + (i + 1) * MICRO],
                          y[start + i * MICRO:start + (i + 1) * MICRO]) for i in range(k)]
                before, steps = len(sc.collectives_called()), len(seen)
                fn(model, optimizer, micro, mse)
                calls.append((sc.collectives_called()[before:].count("all_reduce"),
                              len(seen) - steps, seen[steps] if len(seen) > steps else None))
            return calls, [q.detach().clone() for q in model.module.parameters()]

        run = _run_learner(where, p, body)
        expected = big_batch_reference(MICRO * k * p, OPT_STEPS)
        for rank, (calls, params) in enumerate(run.results):
            for step, (count, steps, _) in enumerate(calls):
                if count != 1:
                    hint = IN_NO_SYNC_HINT if count > 1 else LAST_OUTSIDE_HINT
                    raise Failure(f"{where}, optimizer step {step + 1}: rank {rank} "
                                  f"all-reduced {count} time(s); DDP needs 1 (one bucket)",
                                  hint)
                if steps != 1:
                    raise Failure(f"{where}, call {step + 1}: rank {rank} ran {steps} "
                                  "optimizer step(s); one call is one step", STEPS_HINT)
            try:
                _compare_parameters(f"{where}, after {OPT_STEPS} steps", rank, params,
                                    expected, names, ACCUMULATION_HINT)
            except Failure as failure:
                hint = _accumulation_hint([saw for _, _, saw in calls], k, p, rank)
                raise Failure(failure.what, hint) from None
    return (f"one all-reduce per optimizer step and the big-batch parameters on (world "
            f"size, micro-batches) {listed(ACCUMULATION_CASES)}")


# ------------------------------------------------------------ exercise 5: the trainer


TRAINER_CASES = ((3, 2, 2, 2), (2, 3, 1, 3), (1, 4, 3, 1), (4, 1, 2, 2))
TRAINER_STEPS = 2


def _trainer_case(nodes, gpus, b, k):
    return (f"DistributedTrainer(nodes={nodes}, gpus_per_node={gpus}, batch_size={b}, "
            f"gradient_accumulation={k})")


def _check_placement(where, trainer, nodes, gpus, b, k):
    """The trainer's cluster has ``nodes`` nodes of ``gpus`` GPUs, and its world size and
    global batch follow from the article's rule (``batch_size`` per GPU)."""
    spec = getattr(getattr(trainer, "cluster", None), "spec", None)
    if spec is None:
        raise Failure(f"{where}: no `cluster` attribute holding an sc.Cluster",
                      _more("trainer", "the check reads the placement from self.cluster, "
                            "a simulated cluster built in __init__."))
    placement_hint = _more("trainer", f"the ranks need {nodes} node(s) of {gpus} GPU(s) "
                           "each; a preset node has 8.")
    if len(spec.nodes) != nodes:
        raise Failure(f"{where}: the cluster has {len(spec.nodes)} node(s), expected "
                      f"{nodes}", placement_hint)
    for i, node in enumerate(spec.nodes):
        if node.devices != gpus:
            raise Failure(f"{where}: node {i} has {node.devices} GPU(s), expected {gpus}: "
                          f"rank {gpus} would not start node 1", placement_hint)
    world, global_batch = getattr(trainer, "world_size", None), getattr(
        trainer, "global_batch", None)
    if world != nodes * gpus:
        raise Failure(f"{where}: world_size is {world}, expected nodes × gpus_per_node = "
                      f"{nodes * gpus}", _more("trainer", "every GPU of every node is a rank."))
    expected = b * nodes * gpus * k
    if global_batch != expected:
        raise Failure(f"{where}: global_batch is {global_batch}, expected batch_size × "
                      f"nodes × gpus_per_node × gradient_accumulation = {expected}",
                      _more("trainer", "batch_size is per GPU, as in the article: the "
                            "global batch counts every GPU and every micro-batch."))


ROWS_HINT = _more("trainer", "within a step, rank r's share is ONE contiguous block of "
                  "batch_size × gradient_accumulation rows, right after the blocks of ranks "
                  "0 … r−1, cut into micro-batches in order. (Other shares would give the "
                  "same gradient; the lab fixes this one, and the check reads it.)")
STEP_HINT = _more("trainer", "every rank trained on the right rows, so the step itself is "
                  "wrong: does your train_with_accumulation pass exercise 4's check?")


def _span(start, n):
    """``rows 4–5``, or ``row 4``."""
    return f"row {start}" if n == 1 else f"rows {start}–{start + n - 1}"


def _rows_of(target, y):
    """Which rows of ``y`` a micro-batch's targets are: ``rows 4–5``, ``rows 1, 7``."""
    rows = []
    for row in target.reshape(len(target), -1):
        found = (y.reshape(len(y), -1) == row).all(dim=1).nonzero().flatten().tolist()
        if not found:
            return "rows that are not in the step's targets"
        rows.append(found[0])
    if rows == list(range(rows[0], rows[0] + len(rows))):
        return _span(rows[0], len(rows))
    return f"rows {short(listed(rows), 40)}"


@check("DistributedTrainer")
def check_distributed_trainer(cls):
    """``cls(nodes, gpus_per_node, batch_size, gradient_accumulation)`` with ``cluster``,
    ``world_size``, ``global_batch`` and ``train(make_model, inputs, targets, loss_fn, lr,
    steps)`` run on every rank; placement, micro-batch sizes, the rows each rank's loss
    saw (any split gives the same gradient, so the rows are read from the loss) and the
    resulting parameters checked against one process on the global batch."""
    refuse_reference(cls, _reference().DistributedTrainer, "class")
    names = _names(make_mlp())
    for nodes, gpus, b, k in TRAINER_CASES:
        where = _trainer_case(nodes, gpus, b, k)
        trainer = on_a_rank(cls, (nodes, gpus, b, k), where)
        _check_placement(where, trainer, nodes, gpus, b, k)
        global_batch = b * nodes * gpus * k
        x = torch.cat([batch(global_batch, s, seed=2)[0] for s in range(TRAINER_STEPS)])
        y = torch.cat([batch(global_batch, s, seed=2)[1] for s in range(TRAINER_STEPS)])
        seen = {}

        def loss_fn(output, target):
            seen.setdefault(dist.get_rank(), []).append(target.detach().clone())
            return mse(output, target)

        run = simulate(trainer.cluster, trainer.train, nodes * gpus, lambda rank: where,
                       args=(make_mlp, x, y, loss_fn, LR, TRAINER_STEPS))
        for rank in range(nodes * gpus):
            targets = seen.get(rank, [])
            sizes = [len(t) for t in targets]
            if sizes != [b] * (k * TRAINER_STEPS):
                raise Failure(f"{where}: rank {rank} computed {len(sizes)} loss(es) on "
                              f"micro-batches of {listed(sorted(set(sizes))) or 'no'} "
                              f"sample(s) in {TRAINER_STEPS} steps; expected "
                              f"{k * TRAINER_STEPS} of {b}",
                              _more("trainer", "each optimizer step, every rank takes "
                                    "gradient_accumulation micro-batches of batch_size "
                                    "samples (batch_size is per GPU)."))
            for i, target in enumerate(targets):
                step, micro = divmod(i, k)
                start = step * global_batch + rank * b * k + micro * b
                if not torch.equal(target, y[start:start + b]):
                    raise Failure(f"{where}: rank {rank}, step {step + 1}, micro-batch "
                                  f"{micro + 1} trained on {_rows_of(target, y)}; the lab "
                                  f"gives it {_span(start, b)}", ROWS_HINT)
        expected = big_batch_reference(global_batch, TRAINER_STEPS)
        for rank in range(nodes * gpus):
            _compare_parameters(where, rank, run.results[rank], expected, names,
                                STEP_HINT)
    return ("placement, micro-batches and parameters right for (nodes, gpus_per_node, "
            f"batch_size, gradient_accumulation) {listed(TRAINER_CASES)}")
