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
from workbook.checking import (Failure, WORLD_SIZES, answers, check, close_within,
                               compare_scaled, first_difference, listed, mse, num, on_a_rank,
                               refuse_reference, seconds, simulate)
from workbook.lesson03_data_parallel.lab import batch, make_mlp

BUCKET_CAPS = (4_000, 1_100, 300)   # bytes: 1, 2 and 3 buckets of the MLP's 1,936 bytes
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


AVERAGE_HINTS = {
    "times": "divide every gradient by the world size after the all-reduce: "
               "all_reduce sums.",
    "over": "divide once, by the world size: you divided more than once (or by p²).",
    "own": "every parameter's gradient needs the all-reduce: loop over "
             "model.parameters(), skip none.",
    "values": "all_reduce (SUM) each gradient in place on every rank, then divide by the "
              "world size; every rank must end with the same mean (all_reduce, not reduce).",
}


def _compare_gradients(where, run, expected_run, names, hints):
    """Fail at the first rank, step and parameter whose gradient differs from DDP's."""
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
                      f"carry {listed(expected)} bytes", hint)


COPY_BACK_HINT = ("torch.cat makes a new tensor: after its all-reduce, copy each "
                  "gradient's slice back (param.grad.copy_(...)), divided by the world "
                  "size.")
BUCKET_HINT = ("walk model.parameters() in REVERSE order, add each gradient to the "
               "current bucket, and close the bucket as soon as it holds at least "
               "bucket_cap_bytes; then one all_reduce per bucket, of the flattened "
               "gradients (torch.cat of grad.reshape(-1)).")


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


WAIT_HINT = ("finish() must wait() on every bucket's work before it copies the averaged "
             "values back: an async all-reduce has not finished when the call returns.")
OVERLAP_HINT = ("launch each bucket's all-reduce from the hook (dist.all_reduce(flat, "
                "async_op=True)) as soon as its last gradient is ready, not in finish(): "
                "then it runs while backward computes the earlier layers.")


@check("overlapped DDP")
def check_overlapped_ddp(cls):
    """``cls(model, bucket_cap_bytes)`` built before training; ``finish()`` after each
    ``backward()``. Gradients and all-reduces compared with DDP, and communication must
    overlap backward on the simulator's record (``run.summary()``'s ``overlap``)."""
    refuse_reference(cls, _reference().OverlappedDDP, "class")
    hints = {**AVERAGE_HINTS, "own": COPY_BACK_HINT, "values": WAIT_HINT}
    for p in WORLD_SIZES:
        for cap in BUCKET_CAPS:
            where = _case_text(p, cap)
            wrappers = {}

            def prepare(model, cap=cap):
                wrappers[dist.get_rank()] = cls(model, cap)
                return model

            body = _gradient_steps(p, prepare,
                                   lambda m: wrappers[dist.get_rank()].finish())
            run = _run_learner(where, p, body, accounting=True)
            _compare_gradients(where, run, ddp_run(p, cap), _names(make_mlp()), hints)
            _check_buckets(where, run, p, cap, BUCKET_HINT,
                           "finish() must also reset what counts each bucket's ready "
                           "gradients: the hooks fire again in the next step's backward.")
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
    if not isinstance(params, (list, tuple)) or len(params) != len(expected):
        raise Failure(f"{where}: rank {rank} returned {type(params).__name__}, expected "
                      f"the list of its {len(expected)} parameters", hint)
    close = lambda e, g: torch.isclose(e, g, rtol=1e-4, atol=1e-6)  # noqa: E731
    for name, got, exp in zip(names, params, expected):
        diff = first_difference(exp, got, close)
        if diff is not None:
            i, e, g = diff
            raise Failure(f"{where}: rank {rank}, {name}, element {i}: {num(g)}, the "
                          f"big-batch run has {num(e)}", hint)


ACCUMULATION_HINT = ("divide each micro-batch's loss by the number of micro-batches, "
                     "run forward and backward of every micro-batch but the last inside "
                     "`with ddp_model.no_sync():`, then optimizer.step() and "
                     "optimizer.zero_grad() once.")


@check("gradient accumulation")
def check_accumulation(fn):
    """``fn(ddp_model, optimizer, micro_batches, loss_fn)``: one optimizer step over the
    micro-batches, all-reducing once (DDP's one bucket) per step; parameters after three
    steps compared with one process on the whole batch."""
    refuse_reference(fn, _reference().train_with_accumulation)
    names = _names(make_mlp())
    for p, k in ACCUMULATION_CASES:
        where = f"world size {p}, {k} micro-batch{'es' if k > 1 else ''} of {MICRO}"

        def body(p=p, k=k):
            rank = dist.get_rank()
            model = DDP(make_mlp())
            optimizer = torch.optim.SGD(model.parameters(), lr=LR)
            counts = []
            for step in range(OPT_STEPS):
                x, y = batch(MICRO * k * p, step, seed=2)
                start = rank * MICRO * k
                micro = [(x[start + i * MICRO:start + (i + 1) * MICRO],
                          y[start + i * MICRO:start + (i + 1) * MICRO]) for i in range(k)]
                before = len(sc.collectives_called())
                fn(model, optimizer, micro, mse)
                counts.append(sc.collectives_called()[before:].count("all_reduce"))
            return counts, [q.detach().clone() for q in model.module.parameters()]

        run = _run_learner(where, p, body)
        expected = big_batch_reference(MICRO * k * p, OPT_STEPS)
        for rank, (counts, params) in enumerate(run.results):
            for step, count in enumerate(counts):
                if count != 1:
                    hint = ("run forward AND backward of every micro-batch but the last "
                            "inside `with ddp_model.no_sync():` (DDP decides in forward "
                            "whether backward all-reduces)." if count > 1 else
                            "the last micro-batch's backward must run outside no_sync(): "
                            "that one all-reduces the accumulated gradients.")
                    raise Failure(f"{where}, optimizer step {step + 1}: rank {rank} "
                                  f"all-reduced {count} time(s); DDP needs 1 (one bucket)",
                                  hint)
            _compare_parameters(f"{where}, after {OPT_STEPS} steps", rank, params,
                                expected, names, ACCUMULATION_HINT)
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
                      "self.cluster = sc.Cluster(sc.ClusterSpec(name, nodes)), with one "
                      "sc.NodeSpec per node.")
    placement_hint = (f"build {nodes} node(s) of {gpus} GPU(s) each: sc.Cluster(sc."
                      "ClusterSpec(name, tuple(sc.NodeSpec(f'node{i}', gpus_per_node) "
                      "for i in range(nodes)))); a preset has 8 GPUs per node.")
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
                      f"{nodes * gpus}", "world_size = nodes * gpus_per_node")
    expected = b * nodes * gpus * k
    if global_batch != expected:
        raise Failure(f"{where}: global_batch is {global_batch}, expected batch_size × "
                      f"nodes × gpus_per_node × gradient_accumulation = {expected}",
                      "batch_size is per GPU, as in the article: the global batch multiplies "
                      "it by every GPU and every micro-batch.")


@check("DistributedTrainer")
def check_distributed_trainer(cls):
    """``cls(nodes, gpus_per_node, batch_size, gradient_accumulation)`` with ``cluster``,
    ``world_size``, ``global_batch`` and ``train(make_model, inputs, targets, loss_fn, lr,
    steps)`` run on every rank; placement, micro-batch sizes and the resulting parameters
    checked against one process on the global batch."""
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
            seen.setdefault(dist.get_rank(), []).append(len(target))
            return mse(output, target)

        run = simulate(trainer.cluster, trainer.train, nodes * gpus, lambda rank: where,
                       args=(make_mlp, x, y, loss_fn, LR, TRAINER_STEPS))
        for rank in range(nodes * gpus):
            sizes = seen.get(rank, [])
            if sizes != [b] * (k * TRAINER_STEPS):
                raise Failure(f"{where}: rank {rank} computed {len(sizes)} loss(es) on "
                              f"micro-batches of {listed(sorted(set(sizes))) or 'no'} "
                              f"sample(s) in {TRAINER_STEPS} steps; expected "
                              f"{k * TRAINER_STEPS} of {b}",
                              "each optimizer step, every rank takes gradient_accumulation "
                              "micro-batches of batch_size samples (batch_size is per GPU).")
        expected = big_batch_reference(global_batch, TRAINER_STEPS)
        for rank in range(nodes * gpus):
            _compare_parameters(where, rank, run.results[rank], expected, names,
                                "rank r's samples of step s start at s·global_batch + "
                                "r·batch_size·gradient_accumulation; train each step with "
                                "your train_with_accumulation.")
    return ("placement, micro-batches and parameters right for (nodes, gpus_per_node, "
            f"batch_size, gradient_accumulation) {listed(TRAINER_CASES)}")
