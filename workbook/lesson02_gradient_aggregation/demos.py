"""Gradient aggregation from point-to-point messages: what lesson 02 and its lab import.

The lab asks you to write the all-reduces, the compressors, the parameter server and
local SGD, so none of them is here. What is here:

* helpers the lab gives you: :func:`chunk_bounds`, :func:`exchange`;
* the methods built on top of the exercises, each taking the piece you write as an
  argument: :func:`int8_allreduce` (your quantizer), :func:`topk_allreduce` and
  :func:`topk_aggregator` (your top-k compressor), :func:`ps_train` (your parameter
  server class);
* :class:`TinyMLP`, the small model and data set every method is compared on, and
  :func:`train`, the data-parallel loop that compares them;
* measuring, outside the ranks: :func:`measure_allreduce`, :func:`ring_trace`,
  :func:`compare`, :func:`print_comparison`, :func:`plot_comparison`.

The lesson runs the workbook's own versions of the exercises through the measuring
functions, by name (``measure_allreduce(cluster, "ring", 8, n)``, ``{"aggregate":
"tree"}`` in :func:`compare`, no ``server_class`` in :func:`ps_train`); the names are
:data:`METHODS`. Those versions live in the private ``._reference``,
which the lab checks compare your code with.

Everything that says "on every rank" runs inside ``cluster.run(...)`` (SPMD).
"""

import heapq
import math

import torch
import torch.distributed as dist
from workbook.lesson02_gradient_aggregation.lab import chunk_bounds, exchange, flat_view
from workbook.models import TinyMLP

# The all-reduces and compressors the measuring functions run by name (the workbook's
# own versions of the lab's exercises).
METHODS = ("naive", "ring", "tree", "halving-doubling", "hierarchical", "fp16", "int8",
           "top-k 1%")

# ------------------------------------------------------------------------- helpers


def _method(name):
    """``(make_aggregate, leaves_mean)`` of the workbook's own method ``name`` (see
    METHODS): ``make_aggregate()`` on a rank returns the function to call on a tensor."""
    from workbook.lesson02_gradient_aggregation._reference import BY_NAME
    if name not in BY_NAME:
        raise ValueError(f"no method named {name!r}: choose one of {', '.join(METHODS)}")
    return BY_NAME[name]


# ------------------------------------------------------------------- compression


def _pack_int8(q, scale):
    """One uint8 message: the int8 values, then the 4 bytes of the float32 scale."""
    return torch.cat([q.reshape(-1).view(torch.uint8),
                      scale.reshape(1).to(torch.float32).view(torch.uint8)])


def _unpack_int8(payload):
    return payload[:-4].view(torch.int8), payload[-4:].clone().view(torch.float32).reshape(())


def int8_allreduce(tensor, quantize, dequantize):
    """All-reduce (SUM) that sends int8, on every rank, with ``quantize(x) -> (q, scale)``
    and ``dequantize(q, scale)`` (lab 02's exercise 5).

    Each rank quantizes, sends chunk ``j`` to rank ``j`` (all-to-all), rank ``j`` sums its
    chunk in float32 and quantizes it again, then everybody sends its chunk to everybody
    (all-gather). ``2(p-1)/p·n`` bytes per rank — a quarter of a float32 ring — plus the
    4-byte scale in every message.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = flat_view(tensor)
    if p == 1:
        flat.copy_(dequantize(*quantize(flat)))
        return
    bounds = chunk_bounds(flat.numel(), p)
    size = lambda r: bounds[r][1] - bounds[r][0]  # noqa: E731
    q, scale = quantize(flat)
    mine = slice(*bounds[rank])
    # all-to-all: my chunk j goes to rank j; I receive everybody's copy of my chunk
    parts = {rank: dequantize(q[mine], scale)}
    for shift in range(1, p):
        dst, src = (rank + shift) % p, (rank - shift) % p
        incoming = torch.empty(size(rank) + 4, dtype=torch.uint8)
        exchange(_pack_int8(q[slice(*bounds[dst])], scale), dst, incoming, src)
        parts[src] = dequantize(*_unpack_int8(incoming))
    total = parts[0].clone()
    for src in range(1, p):                      # rank order: bit-identical every run
        total += parts[src]
    q_sum, s_sum = quantize(total)
    flat[mine] = dequantize(q_sum, s_sum)
    mine_packed = _pack_int8(q_sum, s_sum)
    for shift in range(1, p):                    # all-gather the summed chunks
        dst, src = (rank + shift) % p, (rank - shift) % p
        incoming = torch.empty(size(src) + 4, dtype=torch.uint8)
        exchange(mine_packed, dst, incoming, src)
        flat[slice(*bounds[src])] = dequantize(*_unpack_int8(incoming))


def topk_allreduce(tensor, residual, k, compress):
    """All-reduce (SUM) of top-k sparsified tensors with error feedback, on every rank;
    ``compress(grad, residual, k) -> (values, indices, new_residual)`` (lab 02's
    exercise 5).

    Every rank sends its ``k`` values (float32) and indices (int32) to every other rank,
    packed into one message of ``8k`` bytes: ``(p-1)·8k`` bytes per rank. Returns this
    rank's new residual.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = flat_view(tensor)
    values, indices, new_residual = compress(flat, residual.view(-1), k)
    packed = torch.cat([values.to(torch.float32).reshape(-1),
                        indices.to(torch.int32).reshape(-1).view(torch.float32)])
    received = {rank: packed}
    for shift in range(1, p):
        dst, src = (rank + shift) % p, (rank - shift) % p
        incoming = torch.empty_like(packed)
        exchange(packed, dst, incoming, src)
        received[src] = incoming
    flat.zero_()
    half = packed.numel() // 2
    for src in range(p):                         # rank order: bit-identical every run
        v, i = received[src][:half], received[src][half:].view(torch.int32)
        flat.index_add_(0, i.long(), v.to(flat.dtype))
    return new_residual.view_as(tensor)


# --------------------------------------------------------------- parameter server


def ps_train(problem, mode, steps, lr, batch, speeds, bound=3, server_class=None):
    """Train ``problem`` with a parameter server; call on every rank (``cluster.run``).

    Rank 0 is the server and holds ``server_class(params, lr, workers, mode, bound)``
    (lab 02's exercise 1; None: the workbook's own); ranks ``1..W`` are workers
    ``0..W-1``. A worker receives the parameters (its *pull*: one message from the
    server), computes a gradient on its next mini-batch, and sends it back (its *push*:
    one message to the server), until the server says stop. The server hands out
    ``steps·W`` gradients in all, the work of ``steps`` synchronous rounds.

    Worker ``w`` needs ``speeds[w]`` ticks per gradient. The server takes the pushes in
    the order they would finish, so a fast worker comes back more often than a slow one
    and — in async mode — pushes gradients computed on parameters that others have
    changed since (staleness). Each reply carries one extra float in front: 1 = here are
    the parameters, 0 = stop.

    Returns on rank 0 a dict: ``updates`` — ``(tick, gradients_so_far, params)`` after
    every update, starting with the initial parameters; ``staleness`` — the server's
    record. Workers return None.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    workers, n = p - 1, problem.num_params
    if rank != 0:
        w, step = rank - 1, 0
        message = torch.empty(n + 1)
        while True:
            dist.recv(message, 0)                                   # pull (or stop)
            if message[0] == 0:
                return None
            x, y = problem.batch(step, w, workers, batch)
            _, grad = problem.loss_and_grad(message[1:], x, y)
            dist.send(grad, 0)                                      # push
            step += 1
    if server_class is None:
        from workbook.lesson02_gradient_aggregation._reference import (ParameterServer as
                                                                       server_class)
    ps = server_class(problem.init_params(), lr=lr, num_workers=workers, mode=mode,
                      bound=bound)
    updates = [(0.0, 0, ps.params.clone())]
    total, issued, received = steps * workers, 0, 0
    waiting, events = [], []
    stop = torch.zeros(n + 1)

    def start(w, now):
        nonlocal issued
        if issued >= total:
            dist.send(stop, w + 1)
            return
        params = ps.pull(w)
        if params is None:
            waiting.append(w)
            return
        issued += 1
        dist.send(torch.cat([torch.ones(1), params]), w + 1)
        heapq.heappush(events, (now + speeds[w], w))

    for w in range(workers):
        start(w, 0.0)
    grad = torch.empty(n)
    while events:
        now, w = heapq.heappop(events)
        dist.recv(grad, w + 1)
        ps.push(w, grad)
        received += 1
        if mode != "sync" or ps.sync(range(workers)):
            updates.append((now, received, ps.params.clone()))
        ready = sorted(waiting + [w])
        waiting.clear()
        for v in ready:
            start(v, now)
    for w in sorted(waiting):        # still waiting when the work ran out
        dist.send(stop, w + 1)
    return {"updates": updates, "staleness": list(ps.staleness)}


# ---------------------------------------------------------------- model and data


# ------------------------------------------------------------- data-parallel loop


def topk_aggregator(k, compress):
    """``make_aggregate`` for :func:`train`: top-k all-reduce with ``compress`` (your
    top-k compressor) and this rank's residual."""

    def make_aggregate():
        residual = None

        def aggregate(tensor):
            nonlocal residual
            if residual is None:
                residual = torch.zeros_like(tensor)
            residual = topk_allreduce(tensor, residual, k, compress)

        return aggregate

    return make_aggregate


def train(problem, make_aggregate, steps, lr, batch, sync_every=1, mean=False):
    """Data-parallel SGD on ``problem``; call on every rank (``cluster.run``).

    ``make_aggregate()`` is called once on every rank and returns ``aggregate(tensor)``,
    which must leave the SUM over ranks in ``tensor`` (an all-reduce; a factory so
    that a compressor can keep per-rank state, like top-k's residual) — or the MEAN, with
    ``mean=True`` (like an fp16 all-reduce). With
    ``sync_every == 1`` the gradients are summed every step; with ``sync_every = H > 1``
    it is local SGD: the parameters are averaged every ``H`` steps.

    Returns, on rank 0, its parameters after every step; on other ranks, None.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    aggregate = make_aggregate()
    w = problem.init_params()
    snapshots = [w.clone()] if rank == 0 else None
    for step in range(steps):
        x, y = problem.batch(step, rank, p, batch)
        _, grad = problem.loss_and_grad(w, x, y)
        if sync_every == 1:
            aggregate(grad)
            w -= lr * (grad if mean else grad / p)
        else:
            w -= lr * grad
            if (step + 1) % sync_every == 0:
                aggregate(w)
                if not mean:
                    w /= p
        if rank == 0:
            snapshots.append(w.clone())
    return snapshots


# ------------------------------------------------------------- measuring helpers


def _allreduce_once(make_aggregate, size, extra_args):
    g = torch.Generator().manual_seed(dist.get_rank())
    tensor = torch.randn(size, generator=g)
    before = tensor.clone()
    make_aggregate()(tensor, *extra_args)
    return before, tensor


def measure_allreduce(cluster, method, world_size, size, extra_args=()):
    """Run one all-reduce of ``size`` float32 elements on ``world_size`` ranks; what it
    cost and how exact it was.

    ``method`` is a function called on every rank as ``method(tensor, *extra_args)`` (it
    leaves the sum in ``tensor``), or the name of one of the workbook's own
    (:data:`METHODS`; "fp16" leaves the mean, which is compared with the mean). Returns a
    dict: ``bytes`` and ``messages`` (the busiest rank's), ``total_bytes``,
    ``cross_node_bytes``, ``seconds`` (simulated) and ``relative_error`` (the norm of
    rank 0's result minus the exact sum, over the norm of the exact sum; 0 for the exact
    methods up to float32 rounding).
    """
    if isinstance(method, str):
        make_aggregate, mean = _method(method)
    else:
        make_aggregate, mean = (lambda: method), False
    run = cluster.run(_allreduce_once, world_size=world_size,
                      args=(make_aggregate, size, extra_args))
    node = cluster.spec.placement
    cross = sum(b for (s, d), b in run.traffic.items() if node(s)[0] != node(d)[0])
    exact = sum(before.double() for before, _ in run.results)
    if mean:
        exact /= world_size
    error = (run.results[0][1].double() - exact).norm() / exact.norm()
    return {"bytes": max(run.bytes_sent), "messages": max(run.messages_sent),
            "total_bytes": sum(run.bytes_sent), "cross_node_bytes": cross,
            "seconds": run.elapsed, "relative_error": error.item()}


def _ring_phases(size):
    from workbook.lesson02_gradient_aggregation._reference import (ring_all_gather,
                                                                   ring_reduce_scatter)
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = torch.full((size,), float(10 ** rank))
    bounds = chunk_bounds(size, p)
    ring_reduce_scatter(flat, list(range(p)), bounds)
    after_reduce_scatter = flat.clone()
    ring_all_gather(flat, list(range(p)), bounds)
    return after_reduce_scatter, flat.clone()


def ring_trace(cluster, world_size):
    """What every rank holds after a ring's reduce-scatter and after its all-gather,
    when rank ``r`` starts with ``10**r`` everywhere: the digits of each number say whose
    contributions it contains (1111 = all four ranks). Prints a table."""
    run = cluster.run(_ring_phases, world_size=world_size, args=(world_size,),
                      accounting=False)
    width = world_size + 2
    header = "rank | " + " ".join(f"chunk {c}".rjust(width) for c in range(world_size))
    for title, phase in (("after reduce-scatter", 0), ("after all-gather", 1)):
        print(title)
        print(header)
        for rank, result in enumerate(run.results):
            cells = " ".join(f"{int(v)}".rjust(width) for v in result[phase].tolist())
            print(f"{rank:>4} | {cells}")
        print()


# --------------------------------------------------------------- the comparison


def _aggregate_factory(spec):
    """``(make_aggregate, leaves_mean)`` from a :func:`compare` method spec; the spec's
    ``"args"`` are passed after the tensor on every call."""
    aggregate = spec["aggregate"]
    if isinstance(aggregate, str):
        make_aggregate, mean = _method(aggregate)
    else:
        make_aggregate, mean = aggregate, spec.get("mean", False)
    extra = tuple(spec.get("args", ()))
    if not extra:
        return make_aggregate, mean
    def make_with_args():
        aggregate = make_aggregate()
        # e.g. hierarchical's ranks per node, which train() cannot know
        return lambda tensor: aggregate(tensor, *extra)

    return make_with_args, mean


def compare(cluster, problem, methods, steps=30, lr=0.5, batch=32, timed_steps=2,
            world_size=8, curves=True, progress=None):
    """Train ``problem`` with every method; loss curves and simulated time per step.

    ``methods`` maps a name to one of
    ``{"aggregate": make_aggregate}`` (data parallel, :func:`train`; add ``"mean": True``
    when the aggregate leaves the mean), or ``{"aggregate": name}`` with a name of
    :data:`METHODS` (the workbook's own all-reduce or compressor); add ``"args": (...)``
    for arguments after the tensor (``{"aggregate": "hierarchical", "args": (4,)}``:
    4 ranks per node),
    either with ``"sync_every": H`` (local SGD), or
    ``{"mode": mode, "speeds": [...]}`` (parameter server, rank 0 serves; add
    ``"server": cls`` for your class, else the workbook's own).

    Every method sees the same data and does the same work: ``steps`` rounds of one
    mini-batch of ``batch`` samples per worker. Loss curves come from a run without
    accounting of ``steps`` steps (one point per round); time per step from a run of
    ``timed_steps`` steps (rounded up to a multiple of ``sync_every``); ``curves=False``
    skips the loss curves (the results then have only the time and bytes); ``progress``
    labels a progress bar over the methods. Returns
    ``{name: {"samples": [...], "loss": [...], "seconds_per_step": s,
    "bytes_per_step": busiest rank's bytes per step}}``.
    """
    from workbook import outputs

    results = {}
    items = methods.items()
    for name, spec in items if progress is None else outputs.progress(items, desc=progress):
        out = {}
        every = spec.get("sync_every", 1)
        short = -(-timed_steps // every) * every
        for timed, n_steps in ((False, steps), (True, short))[0 if curves else 1:]:
            if "mode" in spec:
                workers = world_size - 1
                run = cluster.run(ps_train, world_size=world_size, accounting=timed, args=(
                    problem, spec["mode"], n_steps,
                    lr if spec["mode"] == "sync" else lr / workers, batch, spec["speeds"]),
                    kwargs={"server_class": spec.get("server")})
                if not timed:
                    updates = [u for u in run.results[0]["updates"] if u[1] % workers == 0]
                    out["samples"] = [g * batch for _, g, _ in updates]
                    out["loss"] = [problem.loss(w) for _, _, w in updates]
                    out["staleness"] = run.results[0]["staleness"]
            else:
                make_aggregate, mean = _aggregate_factory(spec)
                run = cluster.run(train, world_size=world_size, accounting=timed, args=(
                    problem, make_aggregate, n_steps, lr, batch, every, mean))
                if not timed:
                    snaps = run.results[0]
                    out["samples"] = [s * world_size * batch for s in range(len(snaps))]
                    out["loss"] = [problem.loss(w) for w in snaps]
            if timed:
                out["seconds_per_step"] = run.elapsed / n_steps
                out["bytes_per_step"] = max(run.bytes_sent) / n_steps
        results[name] = out
    return results


def print_comparison(results):
    """One line per method: final loss, simulated time per step, bytes per step."""
    print(f"{'method':<22} {'final loss':>10} {'time/step':>12} {'bytes/step (busiest)':>21}")
    for name, r in results.items():
        t = f"{r['seconds_per_step'] * 1e6:.1f} µs"
        print(f"{name:<22} {r['loss'][-1]:>10.4f} {t:>12} {r['bytes_per_step']:>21,.0f}")


def plot_comparison(results, title=""):
    """Loss against samples processed, and simulated time per step, side by side."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, r in results.items():
        left.plot(r["samples"], r["loss"], label=name)
    left.set_xlabel("samples processed")
    left.set_ylabel("training loss")
    left.set_title("convergence")
    left.legend(fontsize=8)
    names = list(results)
    right.barh(range(len(names)), [results[n]["seconds_per_step"] * 1e6 for n in names])
    right.set_yticks(range(len(names)), names, fontsize=8)
    right.invert_yaxis()
    right.set_xlabel("simulated time per step (µs)")
    right.set_title("time per step")
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
