"""Exercise checks: run the learner's function on the simulated cluster and say what is wrong.

Every ``check_*`` function takes the learner's function (or class), runs it on several
world sizes (1, 2, 3, 4, 5, 8: powers of two and not) and tensor sizes (1, sizes that do
not divide by the world size, ...), each on fresh tensors, compares the result with a
reference, and prints exactly one line::

    ✅ ring all-reduce: passed on world sizes 1, 2, 3, 4, 5, 8, sizes 1, 6, 13, 64
    ❌ ring all-reduce: world size 3, size 6: rank 1, index 4: expected 12, got 7 — Hint: ...

It returns True or False (for the progress report) and never raises a learner's mistake
into the kernel: an exception on a rank, a deadlock, an infinite loop (stopped after
``TIMEOUT`` wall-clock seconds), wrong values, shape or dtype, a modified input, or a
collective where only point-to-point messages are allowed all become the ``❌`` line.
Efficiency (bytes and messages per rank; simulated time against the reference, once the
simulator has a clock) is judged only after everything is correct.
"""

import math
import re
import threading

import torch
import torch.distributed as dist

import simcluster as sc

from . import aggregation as ref

TIMEOUT = 10.0            # wall-clock seconds one simulated run may take (infinite loops)
WORLD_SIZES = (1, 2, 3, 4, 5, 8)
SIZES = (1, 6, 13, 64)
TIME_TOLERANCE = 1.25     # learner's simulated time may be this many times the reference's
BYTES_TOLERANCE = 1.05

_PASS, _FAIL = "✅", "❌"


class _Failure(Exception):
    """The first thing that is wrong; ``str`` is what the learner reads."""

    def __init__(self, what, hint):
        super().__init__(what)
        self.what, self.hint = what, hint


def _report(name, body):
    """Run ``body()`` (returns the pass text or raises _Failure), print one line."""
    try:
        passed = body()
    except _Failure as failure:
        print(f"{_FAIL} {name}: {failure.what} — Hint: {failure.hint}")
        return False
    print(f"{_PASS} {name}: {passed}")
    return True


# ----------------------------------------------------------------- formatting


def _num(x):
    """A number as the learner reads it: 12 for 12.0, 0.1235 for 0.123456..."""
    x = float(x)
    if math.isnan(x) or math.isinf(x):
        return str(x)
    if x == int(x) and abs(x) < 1e15:
        return str(int(x))
    text = f"{x:.4g}"
    return f"{x:.1f}" if "e+" in text else text


def _list(values):
    return ", ".join(str(v) for v in values)


def _short(text, limit=140):
    text = str(text).strip().splitlines()[0] if str(text).strip() else ""
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _seconds(s):
    return f"{s * 1e6:.1f} µs" if s < 1e-3 else f"{s * 1e3:.3f} ms"


# ------------------------------------------------------------------ running


def _collectives_so_far():
    """``(count, names)`` of the collectives the calling rank has called in this run.

    Read from the simulator's own per-rank record, so no way of calling a collective
    (``dist.all_reduce``, an alias, functional collectives, a subgroup) escapes it.
    """
    names = sc.collectives_called()
    return len(names), names


def _wait_text(text):
    """``"waiting in send to rank 1 (tag 0, (5,)): ..."`` -> ``"send to rank 1"``."""
    text = str(text)
    if text == "returned from its function":
        return "returned"
    if text.startswith("waiting in "):
        text = text[len("waiting in "):]
    return text.split(" (")[0].split(":")[0]


def _deadlock_text(error):
    items = [f"rank {r}: {_wait_text(w)}" for r, w in sorted(error.pending.items())]
    if len(items) > 4:
        items = items[:4] + [f"… ({len(error.pending)} ranks)"]
    return "deadlock (" + "; ".join(items) + ")"


ACCOUNTING_TIMEOUT = 120.0  # the first run with a clock in a process warms torch up


def _simulate(cluster, body, world_size, where, hints, accounting=False):
    """``cluster.run(body)``; a learner's failure becomes a _Failure naming ``where()``.

    ``where(rank)`` describes the case a rank was in (None: the first failing one).
    Timed runs happen only after the same code passed untimed, so they get a longer
    timeout: the first run with accounting in a process is slow to start.
    """
    timeout = max(TIMEOUT, ACCOUNTING_TIMEOUT) if accounting else TIMEOUT
    try:
        return ref.simulate(cluster, body, world_size, timed=accounting, timeout=timeout)
    except sc.RankError as error:
        raise _raised(f"{where(error.rank)}: rank {error.rank}", error.original,
                      hints.get("exception", _HINTS["exception"])) from None
    except sc.DeadlockError as error:
        raise _Failure(f"{where(None)}: {_deadlock_text(error)}",
                       hints.get("deadlock", _HINTS["deadlock"])) from None
    except sc.CollectiveMismatchError as error:
        text = _short(str(error).replace("collective mismatch in ", "mismatch in "), 200)
        raise _Failure(f"{where(None)}: {text.rstrip('.')}",
                       hints.get("mismatch", _HINTS["mismatch"])) from None
    except sc.SimulationTimeout as error:
        match = re.match(r"rank (\d+)", str(error))
        rank = f"rank {match.group(1)}" if match else "a rank"
        raise _Failure(f"{where(None)}: {rank} was still running after {TIMEOUT:g} s of "
                       "wall-clock time (an infinite loop?)",
                       hints.get("timeout", _HINTS["timeout"])) from None
    except sc.SimulationError as error:
        raise _Failure(f"{where(None)}: {_short(error)}",
                       hints.get("exception", _HINTS["exception"])) from None


def _raised(who, error, hint=None):
    """The _Failure for ``who`` raising ``error`` (an unwritten exercise says so)."""
    if isinstance(error, NotImplementedError):
        hint = _HINTS["not_started"]
    return _Failure(f"{who} raised {type(error).__name__}: {_short(error)}",
                    hint or _HINTS["exception"])


_HINTS = {
    "not_started": "this exercise is not written yet: replace the `raise "
                   "NotImplementedError(...)` line with your code (its message is a hint).",
    "exception": "read the message above; run your function with cluster.run(...) yourself "
                 "to see the whole traceback.",
    "deadlock": "a blocking send() waits until the matching recv() is posted: if two ranks "
                "both send first, neither receives. Exchange with dist.isend/dist.irecv (or "
                "dist.batch_isend_irecv) and wait() for both.",
    "mismatch": "every send needs a recv of the same shape and dtype; send and receive "
                "chunks of the same bounds on both sides.",
    "timeout": "look for a loop whose condition never changes (a step counter that is "
               "never incremented?).",
    "collective": "build it from point-to-point operations only: dist.send, dist.recv, "
                  "dist.isend, dist.irecv, dist.batch_isend_irecv.",
    "no_messages": "ranks are threads here, but on a real cluster they share no memory: "
                   "move the data with send/recv.",
    "unchanged": "every rank must end with the result in `tensor`, written in place "
                 "(tensor += ..., tensor.copy_(...), tensor[a:b] = ...); `tensor = ...` only "
                 "rebinds a local name.",
    "values": "print what each rank holds after each step, on world size 2 or 3.",
    "shape": "keep `tensor`'s shape: work on tensor.view(-1) or slices of it.",
    "dtype": "keep `tensor`'s dtype: create buffers with torch.empty_like(...) or "
             "dtype=tensor.dtype.",
}


# ---------------------------------------------------------------- inputs


def _integer_input(world_size, size, rank, dtype=torch.float32):
    """Non-zero integers in [-9, 9]: every order of summation gives the exact same sum."""
    g = torch.Generator().manual_seed(100_003 * world_size + 1_009 * size + 31 * rank)
    magnitude = torch.randint(1, 10, (size,), generator=g)
    sign = torch.randint(0, 2, (size,), generator=g) * 2 - 1
    return (magnitude * sign).to(dtype)


def _default_input(case, rank):
    return _integer_input(case.world_size, case.size, rank, case.dtype)


def _first_difference(expected, got, close=None):
    """``(index, expected, got)`` of the first element that differs, or None."""
    e, g = expected.reshape(-1), got.reshape(-1)
    if close is None:
        bad = e != g
    else:
        bad = ~close(e, g)
    bad |= torch.isnan(g) & ~torch.isnan(e)
    nz = torch.nonzero(bad)
    if len(nz) == 0:
        return None
    i = int(nz[0])
    return i, e[i].item(), g[i].item()


# ---------------------------------------------------- all-reduce family


class _Case:
    """One run: ``world_size`` ranks, a tensor of ``size`` elements of ``dtype``."""

    def __init__(self, world_size, size, dtype=torch.float32, ranks_per_node=None):
        self.world_size, self.size, self.dtype = world_size, size, dtype
        self.ranks_per_node = ranks_per_node

    def __str__(self):
        text = f"world size {self.world_size}"
        if self.ranks_per_node is not None:
            plural = "s" if self.ranks_per_node > 1 else ""
            text += f" ({self.ranks_per_node} rank{plural} per node)"
        text += f", size {self.size}"
        if self.dtype != torch.float32:
            text += f" ({str(self.dtype).replace('torch.', '')})"
        return text


def _allreduce_cases(world_sizes=WORLD_SIZES, sizes=SIZES):
    cases = []
    for p in world_sizes:
        for i, n in enumerate(sizes):
            # the largest size runs in float64: buffers must follow the input's dtype
            dtype = torch.float64 if i == len(sizes) - 1 else torch.float32
            cases.append(_Case(p, n, dtype))
    return cases


def _cluster_for(case):
    """Nodes of ``ranks_per_node`` devices when the case says so, else one DGX node."""
    if case.ranks_per_node is None:
        return sc.Cluster.preset("dgx-a100", nodes=1)
    k, m = case.ranks_per_node, case.world_size // case.ranks_per_node
    return sc.Cluster(sc.ClusterSpec(f"{m}x{k}", tuple(sc.NodeSpec(f"node{i}", k)
                                                       for i in range(m))))


def _run_allreduce(fn, case, make_input, extra_args=(), accounting=False, hints=None):
    """Run ``fn(tensor, *extra_args)`` on every rank; per rank: input, output, return
    value, collectives."""

    def body():
        rank = dist.get_rank()
        tensor = make_input(case, rank)
        before = tensor.clone()
        returned = fn(tensor, *extra_args)
        count, names = _collectives_so_far()
        return {"input": before, "output": tensor, "returned": returned,
                "collectives": count, "collective_names": names}

    where = lambda rank: str(case)  # noqa: E731
    return _simulate(_cluster_for(case), body, case.world_size, where, hints or {},
                     accounting=accounting)


def _check_no_collectives(case, run, hints):
    for rank, result in enumerate(run.results):
        if result["collectives"]:
            names = result["collective_names"]
            name = names[-1] if names else "a collective"
            raise _Failure(f"{case}: rank {rank} called {name}, a collective",
                           hints.get("collective", _HINTS["collective"]))


def _check_messages_sent(case, run, hints):
    """Right values without a single message: the ranks shared Python objects."""
    if case.world_size > 1 and sum(run.messages_sent) == 0:
        raise _Failure(f"{case}: no rank sent a point-to-point message",
                       hints.get("no_messages", _HINTS["no_messages"]))


def _check_outputs(case, run, expected_for, hints, close=None):
    for rank, result in enumerate(run.results):
        out, expected = result["output"], expected_for(rank)
        if tuple(out.shape) != tuple(expected.shape):
            raise _Failure(f"{case}: rank {rank}: the tensor has shape {tuple(out.shape)}, "
                           f"expected {tuple(expected.shape)}", hints.get("shape", _HINTS["shape"]))
        if out.dtype != expected.dtype:
            raise _Failure(f"{case}: rank {rank}: the tensor has dtype "
                           f"{str(out.dtype).replace('torch.', '')}, expected "
                           f"{str(expected.dtype).replace('torch.', '')}",
                           hints.get("dtype", _HINTS["dtype"]))
    for rank, result in enumerate(run.results):
        out, expected = result["output"], expected_for(rank)
        diff = _first_difference(expected, out, close)
        if diff is None:
            continue
        if case.world_size > 1 and torch.equal(out, result["input"]):
            extra = " and returned a tensor" if isinstance(result["returned"], torch.Tensor) else ""
            raise _Failure(f"{case}: rank {rank} left the tensor unchanged{extra}",
                           hints.get("unchanged", _HINTS["unchanged"]))
        index, e, g = diff
        raise _Failure(f"{case}: rank {rank}, index {index}: expected {_num(e)}, got {_num(g)}",
                       hints.get("values", _HINTS["values"]))


def _sum_expected(run):
    total = run.results[0]["input"].clone()
    for result in run.results[1:]:
        total += result["input"]
    return lambda rank: total


def _correctness(fn, cases, hints, extra_args=lambda case: (), make_input=None,
                 expected=_sum_expected, close=None, p2p_only=True):
    """Run every case; return ``{case: run}``. Raises _Failure at the first problem."""
    make_input = make_input or _default_input
    runs = {}
    for case in cases:
        run = _run_allreduce(fn, case, make_input, extra_args(case), hints=hints)
        if p2p_only:
            _check_no_collectives(case, run, hints)
        _check_outputs(case, run, expected(run), hints, close)
        if p2p_only:
            _check_messages_sent(case, run, hints)
        runs[case] = run
    return runs


def _passed(cases):
    world_sizes = sorted({c.world_size for c in cases})
    sizes = sorted({c.size for c in cases})
    return f"passed on world sizes {_list(world_sizes)}, sizes {_list(sizes)}"


def _largest(runs, world_size=None):
    """The largest-size run on the largest (or given) world size."""
    cases = [c for c in runs if world_size is None or c.world_size == world_size]
    return max(cases, key=lambda c: (c.world_size, c.size))


def _elem(case):
    return torch.empty((), dtype=case.dtype).element_size()


def _bytes_budget(case, run, what, formula, target_elements, hint):
    """Fail if the busiest rank sent more than ``target_elements`` (× tolerance)."""
    target = target_elements * _elem(case)
    worst = max(range(case.world_size), key=lambda r: run.bytes_sent[r])
    sent = run.bytes_sent[worst]
    if sent > target * BYTES_TOLERANCE:
        raise _Failure(f"{case}: {what} should send {formula} = {_num(target_elements)} "
                       f"elements ({_num(target)} bytes) per rank: rank {worst} sent "
                       f"{_num(sent)} bytes, {sent / target:.2f}× that", hint)


def _time_budget(fn, reference, case, hint, extra_args=(), reference_name="reference"):
    """Once the simulator has a clock: fail if ``fn`` takes longer than the reference."""
    ref_run = _run_allreduce(reference, case, _default_input, extra_args, accounting=True)
    ref_time = ref.sim_elapsed(ref_run)
    if ref_time is None:
        return
    run = _run_allreduce(fn, case, _default_input, extra_args, accounting=True)
    elapsed = ref.sim_elapsed(run)
    if elapsed > ref_time * TIME_TOLERANCE:
        raise _Failure(f"{case}: took {_seconds(elapsed)} of simulated time, "
                       f"{elapsed / ref_time:.2f}× the {reference_name}'s "
                       f"{_seconds(ref_time)}", hint)


# ----------------------------------------------------------- the checks


def check_naive_allreduce(fn):
    """``fn(tensor)`` on every rank: gather every tensor to rank 0, sum, send the sum back."""
    hints = {"values": "rank 0 adds every other rank's tensor to its own, then sends the "
                       "sum to every rank; every other rank sends its tensor, then receives "
                       "the sum into it."}

    def body():
        cases = _allreduce_cases()
        runs = _correctness(fn, cases, hints)
        case = _largest(runs)
        run, n, p = runs[case], case.size, case.world_size
        for rank in range(1, p):
            if run.bytes_sent[rank] != n * _elem(case) or run.messages_sent[rank] != 1:
                raise _Failure(
                    f"{case}: in a naive all-reduce every rank but 0 sends its tensor once, "
                    f"to rank 0 ({n * _elem(case)} bytes): rank {rank} sent "
                    f"{run.messages_sent[rank]} message(s), {run.bytes_sent[rank]} bytes",
                    "gather to rank 0, add, broadcast from rank 0: the other ranks talk "
                    "only to rank 0.")
        return _passed(cases)

    return _report("naive all-reduce", body)


def check_ring_allreduce(fn):
    """``fn(tensor)`` on every rank: ring all-reduce (reduce-scatter, then all-gather),
    from point-to-point operations only, leaving the SUM in ``tensor``."""
    hints = {"values": "reduce-scatter: at step s, send chunk (rank - s - 1) % p to the right "
                       "and add the chunk (rank - s - 2) % p from the left; all-gather: send "
                       "chunk (rank - s) % p, copy in chunk (rank - s - 1) % p. Chunk bounds "
                       "must handle sizes that do not divide by p."}

    def body():
        cases = _allreduce_cases()
        runs = _correctness(fn, cases, hints)
        case = _largest(runs)
        p, n = case.world_size, case.size
        hint = ("send one chunk of about n/p elements per step, 2(p-1) steps: never the "
                "whole tensor.")
        _bytes_budget(case, runs[case], "ring all-reduce", "2(p-1)/p·n",
                      2 * (p - 1) * n / p, hint)
        _time_budget(fn, ref.ring_allreduce, _Case(8, 1 << 14), "post the send and the "
                     "receive of each step together (isend/irecv), so all p links work "
                     "at once.", reference_name="reference ring")
        return _passed(cases)

    return _report("ring all-reduce", body)


def check_tree_allreduce(fn):
    """``fn(tensor)`` on every rank: reduce up a (binomial or binary) tree to rank 0, then
    broadcast back down it."""
    hints = {"values": "reduce: at mask = 1, 2, 4, ..., a rank with (rank & mask) sends to "
                       "rank - mask and stops; one without receives from rank + mask (if it "
                       "exists) and adds. Broadcast: the same tree, in reverse."}

    def body():
        cases = _allreduce_cases()
        runs = _correctness(fn, cases, hints)
        case = _largest(runs)
        run, p, n = runs[case], case.world_size, case.size
        depth = math.ceil(math.log2(p))
        hint = ("in a tree every rank talks to its parent and at most ⌈log2 p⌉ children; "
                "rank 0 must not receive from everybody itself.")
        busiest = max(range(p), key=lambda r: run.messages_sent[r])
        if run.messages_sent[busiest] > depth:
            raise _Failure(f"{case}: in a tree all-reduce the busiest rank sends ⌈log2 p⌉ = "
                           f"{depth} messages: rank {busiest} sent "
                           f"{run.messages_sent[busiest]}, "
                           f"{run.messages_sent[busiest] / depth:.2f}× that", hint)
        total = sum(run.bytes_sent)
        target = 2 * (p - 1) * n * _elem(case)
        if total > target * BYTES_TOLERANCE:
            raise _Failure(f"{case}: a tree all-reduce sends 2(p-1)·n = {2 * (p - 1) * n} "
                           f"elements ({target} bytes) in all: your ranks sent {total} "
                           f"bytes, {total / target:.2f}× that",
                           "each rank sends its partial sum up once, and receives the "
                           "result once.")
        _time_budget(fn, ref.tree_allreduce, _Case(8, 8), "a binomial tree takes ⌈log2 p⌉ "
                     "rounds each way: in round i the ranks with bit i set send to "
                     "rank - 2^i, all at the same time.", reference_name="binomial tree")
        return _passed(cases)

    return _report("tree all-reduce", body)


def check_halving_doubling_allreduce(fn):
    """``fn(tensor)`` on every rank: recursive-halving reduce-scatter and recursive-doubling
    all-gather (Rabenseifner), with the extra ranks of a non-power-of-two world folded in
    first and served last."""
    hints = {"values": "with p' the largest power of two ≤ p, ranks ≥ p' first send their "
                       "tensor to rank - p' and later receive the result from it; among the "
                       "first p' ranks, exchange half of your current segment with rank ^ mask "
                       "for mask = p'/2, ..., 1, then undo it for mask = 1, ..., p'/2."}

    def body():
        cases = _allreduce_cases()
        runs = _correctness(fn, cases, hints)
        case = _largest(runs, 8)
        run, p, n = runs[case], case.world_size, case.size
        _bytes_budget(case, run, "halving-doubling", "2(p-1)/p·n", 2 * (p - 1) * n / p,
                      "exchange half of your current segment with your partner, not the "
                      "whole tensor: that is recursive doubling, lg p·n per rank.")
        for case in (_largest(runs, 8), _largest(runs, 5)):
            run, p = runs[case], case.world_size
            lg = p.bit_length() - 1
            limit = 2 * lg + (0 if p == 1 << lg else 1)
            formula = "2·lg p" if p == 1 << lg else "2⌊lg p⌋ + 1"
            busiest = max(range(p), key=lambda r: run.messages_sent[r])
            if run.messages_sent[busiest] > limit:
                raise _Failure(f"{case}: halving-doubling takes {formula} = {limit} messages "
                               f"per rank: rank {busiest} sent {run.messages_sent[busiest]}, "
                               f"{run.messages_sent[busiest] / limit:.2f}× that",
                               "each round pairs rank with rank ^ mask and halves (then "
                               "doubles) the segment: lg p rounds each way, not p - 1 "
                               "ring steps.")
        _time_budget(fn, ref.halving_doubling_allreduce, _Case(8, 1 << 12), "post the send "
                     "and receive of each round together (isend/irecv).",
                     reference_name="reference")
        return _passed(cases)

    return _report("halving-doubling all-reduce", body)


HIERARCHICAL_CASES = ((1, 1), (2, 1), (2, 2), (4, 2), (6, 2), (6, 3), (8, 4))


def check_hierarchical_allreduce(fn):
    """``fn(tensor, ranks_per_node)`` on every rank: all-reduce inside each node, then across
    nodes (each node's ranks are ``k·j .. k·j + k - 1``), then inside each node again."""
    hints = {"values": "ranks k·j .. k·j + k - 1 form node j. Reduce inside the node, "
                       "all-reduce across the nodes among ranks with the same local index "
                       "(local = rank % k), then share the result inside the node."}

    def body():
        cases = [_Case(p, n, dtype, ranks_per_node=k) for (p, k) in HIERARCHICAL_CASES
                 for n, dtype in zip(SIZES, (torch.float32,) * (len(SIZES) - 1) + (torch.float64,))]
        runs = _correctness(fn, cases, hints, extra_args=lambda case: (case.ranks_per_node,))
        case = max(runs, key=lambda c: (c.world_size, c.size))
        p, n, k = case.world_size, case.size, case.ranks_per_node
        m = p // k
        run = _run_allreduce(fn, case, _default_input, (k,), accounting=True)
        traffic = ref.traffic(run)
        if traffic is not None:
            cluster = _cluster_for(case)
            node = cluster.spec.placement
            crossing = sum(b for (src, dst), b in traffic.items()
                           if node(src)[0] != node(dst)[0])
            target = 2 * (m - 1) * n * _elem(case)
            if crossing > target * BYTES_TOLERANCE:
                raise _Failure(f"{case}: across the nodes a hierarchical all-reduce sends "
                               f"2(m-1)·n = {2 * (m - 1) * n} elements ({target} bytes) for "
                               f"m = {m} nodes: yours sent {crossing} bytes between nodes, "
                               f"{crossing / target:.2f}× that",
                               "finish the reduction inside each node first, so only one "
                               "partial sum per node (or one shard per rank) crosses the "
                               "network.")
        _time_budget(fn, ref.hierarchical_allreduce, _Case(8, 1 << 14, ranks_per_node=4),
                     "run the cross-node step on 1/k of the tensor per rank (reduce-scatter "
                     "inside the node first), so all k NICs of a node work at once.",
                     extra_args=(4,), reference_name="reference")
        sizes = _list(sorted({c.size for c in cases}))
        return (f"passed on (world size, ranks per node) {_list(HIERARCHICAL_CASES)}, "
                f"sizes {sizes}")

    return _report("hierarchical all-reduce", body)


# ---------------------------------------------------------------- compression


def _normal_input(world_size, size, rank, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(7_919 * world_size + 613 * size + 17 * rank)
    return (torch.randn(size, generator=g) * scale).to(dtype)


FP16_LARGE = 30_000.0


def check_fp16_allreduce(fn):
    """``fn(tensor)`` on every rank: send float16 over the wire, leave the MEAN over ranks
    (float32) in ``tensor``; use ``aggregation.ring_allreduce`` (or your own p2p code)."""
    hints = {"values": "divide by the world size, cast to torch.float16, all-reduce the "
                       "half tensor with ring_allreduce, copy the result back into `tensor`.",
             "collective": "all-reduce the half tensor with aggregation.ring_allreduce (point "
                           "to point), so its bytes on the wire can be counted."}
    large = set()

    def make_input(case, rank):
        scale = FP16_LARGE if case in large else 1.0
        return _normal_input(case.world_size, case.size, rank, scale=scale)

    def expected(run):
        p = len(run.results)
        inputs = torch.stack([r["input"].double() for r in run.results])
        mean = (inputs.sum(0) / p).float()
        tol = (2e-3 * inputs.abs().sum(0) + 1e-6).float()
        expected.tol = tol
        return lambda rank: mean

    def close(e, g):
        return (e - g).abs() <= expected.tol.reshape(-1)

    def body():
        cases = [_Case(p, n) for p in WORLD_SIZES for n in SIZES]
        big = _Case(8, 16)
        large.add(big)
        for case in cases + [big]:
            run = _run_allreduce(fn, case, make_input, hints=hints)
            _check_no_collectives(case, run, hints)
            try:
                _check_outputs(case, run, expected(run), hints, close)
            except _Failure as failure:
                if case is big:
                    raise _Failure(f"values of ±{_num(FP16_LARGE)} on world size 8: "
                                   + failure.what.split(": ", 1)[1],
                                   "fp16 stops at 65504: divide by the world size BEFORE "
                                   "casting, so the sum of p values stays in range "
                                   "(PyTorch's fp16_compress_hook does).") from None
                raise
            if case.world_size == 8 and case.size == max(SIZES):
                p, n = case.world_size, case.size
                target = 2 * (p - 1) * n / p * 2
                worst = max(range(p), key=lambda r: run.bytes_sent[r])
                if run.bytes_sent[worst] > target * BYTES_TOLERANCE:
                    raise _Failure(f"{case}: an fp16 ring sends 2(p-1)/p·n·2 bytes = "
                                   f"{_num(target)} bytes per rank: rank {worst} sent "
                                   f"{run.bytes_sent[worst]}, "
                                   f"{run.bytes_sent[worst] / target:.2f}× that",
                                   "all-reduce the float16 copy, not the float32 tensor.")
        return _passed(cases)

    return _report("fp16 all-reduce", body)


def _int8_inputs():
    g = torch.Generator().manual_seed(8)
    yield "size 1", torch.tensor([-2.5])
    for n in (6, 13, 64):
        yield f"size {n}", torch.randn(n, generator=g)
    yield "shape (3, 5)", torch.randn(3, 5, generator=g) * 100
    yield "all zeros", torch.zeros(7)
    yield "all negative", -torch.rand(9, generator=g) - 0.5
    yield "tiny values", torch.randn(10, generator=g) * 1e-6
    yield "one outlier", torch.cat([torch.randn(15, generator=g) * 0.01, torch.tensor([50.0])])


def check_int8_quantization(quantize, dequantize):
    """``quantize(tensor) -> (q, scale)`` with q int8 in [-127, 127], scale a float32 scalar,
    ``dequantize(q, scale) -> float32 tensor``; error at most scale/2; input unchanged."""

    def call(what, f, *args):
        try:
            return f(*args)
        except Exception as error:  # noqa: BLE001 — the learner's mistake, reported
            raise _raised(what, error) from None

    def body():
        for name, x in _int8_inputs():
            before = x.clone()
            out = call(f"{name}: quantize", quantize, x)
            if not isinstance(out, (tuple, list)) or len(out) != 2:
                raise _Failure(f"{name}: quantize returned {type(out).__name__}, expected a "
                               "pair (q, scale)", "return q, scale")
            q, scale = out
            if not torch.equal(x, before):
                raise _Failure(f"{name}: quantize modified its input",
                               "compute q from x / scale, a new tensor; no in-place ops on x.")
            if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
                got = q.dtype if isinstance(q, torch.Tensor) else type(q).__name__
                raise _Failure(f"{name}: q has dtype {str(got).replace('torch.', '')}, "
                               "expected int8", "finish with .to(torch.int8): one byte per "
                               "element is the point.")
            if tuple(q.shape) != tuple(x.shape):
                raise _Failure(f"{name}: q has shape {tuple(q.shape)}, expected "
                               f"{tuple(x.shape)}", "quantize element-wise; keep the shape.")
            s = torch.as_tensor(scale)
            if s.numel() != 1 or not s.dtype.is_floating_point:
                raise _Failure(f"{name}: scale should be one float, got "
                               f"{s.numel()} element(s) of {str(s.dtype).replace('torch.', '')}",
                               "scale = x.abs().max() / 127: one number per tensor.")
            s = float(s)
            if not math.isfinite(s) or s <= 0:
                raise _Failure(f"{name}: scale is {_num(s)}; it must be a positive number",
                               "an all-zero tensor has max |x| = 0: use scale 1 (or any "
                               "positive number) then, never 0.")
            if int(q.min()) < -127:
                raise _Failure(f"{name}: q holds {int(q.min())}; keep q in [-127, 127]",
                               "symmetric quantization uses -127..127; clamp after "
                               "rounding.")
            deq = call(f"{name}: dequantize", dequantize, q, scale)
            if not isinstance(deq, torch.Tensor) or deq.dtype != torch.float32:
                got = deq.dtype if isinstance(deq, torch.Tensor) else type(deq).__name__
                raise _Failure(f"{name}: dequantize returned "
                               f"{str(got).replace('torch.', '')}, expected float32",
                               "return q.to(torch.float32) * scale.")
            if tuple(deq.shape) != tuple(x.shape):
                raise _Failure(f"{name}: dequantize returned shape {tuple(deq.shape)}, "
                               f"expected {tuple(x.shape)}", "return q.to(torch.float32) * scale.")
            err = (deq - x).abs().reshape(-1)
            if torch.isnan(err).any():
                i = int(torch.nonzero(torch.isnan(err))[0])
                raise _Failure(f"{name}: dequantize(quantize(x)) is nan at index {i}",
                               "an all-zero tensor has max |x| = 0: dividing by a scale of "
                               "0 gives nan; use scale 1 then.")
            worst = int(err.argmax())
            if err[worst] > s / 2 * (1 + 1e-4) + 1e-12:
                raise _Failure(f"{name}: at index {worst} x = {_num(x.reshape(-1)[worst])} "
                               f"came back as {_num(deq.reshape(-1)[worst])}: an error of "
                               f"{err[worst] / s:.2f}·scale, more than scale/2",
                               "round to the nearest integer (torch.round), don't truncate; "
                               "and use scale = max|x| / 127 so that nothing is clipped.")
            if x.abs().max() > 0 and int(q.abs().max()) < 127:
                raise _Failure(f"{name}: the largest |q| is {int(q.abs().max())}; the "
                               "largest |x| should map to 127",
                               "scale = max|x| / 127 uses the whole int8 range: more "
                               "levels, smaller errors.")
        return "passed on sizes 1, 6, 13, 64, shape (3, 5), all zeros, all negative, tiny " \
               "values, one outlier"

    return _report("int8 quantization", body)


TOPK_CASES = ((1, 1), (6, 2), (13, 3), (64, 5))


def check_topk_error_feedback(fn):
    """``fn(grad, residual, k) -> (values, indices, new_residual)``: top-k of
    ``grad + residual`` by magnitude, and everything not sent in ``new_residual``; checked
    over three calls that feed each residual into the next call."""

    def body():
        for n, k in TOPK_CASES:
            g = torch.Generator().manual_seed(100 + n)
            residual = torch.zeros(n)
            for call in range(1, 4):
                where = f"size {n}, k = {k}, call {call}"
                grad = torch.randn(n, generator=g)
                grad_before, residual_before = grad.clone(), residual.clone()
                try:
                    out = fn(grad, residual, k)
                except Exception as error:  # noqa: BLE001
                    raise _raised(f"{where}: your function", error) from None
                if not isinstance(out, (tuple, list)) or len(out) != 3:
                    raise _Failure(f"{where}: returned {type(out).__name__}, expected "
                                   "(values, indices, new_residual)",
                                   "return values, indices, new_residual")
                values, indices, new_residual = out
                for arg, before, label in ((grad, grad_before, "grad"),
                                           (residual, residual_before, "residual")):
                    if not torch.equal(arg, before):
                        raise _Failure(f"{where}: your function modified its `{label}` "
                                       "argument", "work on acc = grad + residual (a new "
                                       "tensor) and return a new residual.")
                acc = grad + residual
                indices = torch.as_tensor(indices)
                if indices.dtype.is_floating_point or indices.numel() != min(k, n) \
                        or torch.as_tensor(values).numel() != min(k, n):
                    dtype = str(indices.dtype).replace("torch.", "")
                    raise _Failure(f"{where}: expected {min(k, n)} values and {min(k, n)} "
                                   f"integer indices, got {torch.as_tensor(values).numel()} "
                                   f"and {indices.numel()} ({dtype})",
                                   "torch.topk(acc.abs(), k).indices, and acc[indices].")
                idx = indices.long().reshape(-1)
                if len(set(idx.tolist())) != idx.numel() or idx.min() < 0 or idx.max() >= n:
                    raise _Failure(f"{where}: the indices must be k different positions in "
                                   f"0..{n - 1}, got {idx.tolist()[:8]}",
                                   "torch.topk(acc.abs(), k).indices")
                values = torch.as_tensor(values).reshape(-1)
                if torch.allclose(values, grad[idx]) and not torch.allclose(values, acc[idx]):
                    raise _Failure(f"{where}: the values are grad[indices]: the residual "
                                   "was never added", "error feedback: acc = grad + "
                                   "residual, then take the top k of acc.")
                if not torch.allclose(values, acc[idx], rtol=1e-6, atol=1e-7):
                    i = int(torch.nonzero(~torch.isclose(values, acc[idx]))[0])
                    raise _Failure(f"{where}: values[{i}] = {_num(values[i])}, but "
                                   f"grad + residual at index {int(idx[i])} is "
                                   f"{_num(acc[idx[i]])}", "values = acc[indices], signs "
                                   "included (pick by |acc|, send acc).")
                unsent = torch.ones(n, dtype=torch.bool)
                unsent[idx] = False
                if unsent.any() and acc[unsent].abs().max() > values.abs().min() + 1e-7:
                    raise _Failure(f"{where}: |acc| = {_num(acc[unsent].abs().max())} was "
                                   f"left out while {_num(values.abs().min())} was sent",
                                   "pick the k largest by magnitude: torch.topk(acc.abs(), "
                                   "k), not torch.topk(acc, k).")
                new_residual = torch.as_tensor(new_residual)
                if tuple(new_residual.shape) != (n,):
                    raise _Failure(f"{where}: the new residual has shape "
                                   f"{tuple(new_residual.shape)}, expected ({n},)",
                                   "the residual is dense, like the gradient.")
                sent = torch.zeros(n)
                sent[idx] = values
                diff = _first_difference(acc, sent + new_residual,
                                         lambda e, got: torch.isclose(e, got, atol=1e-6))
                if diff is not None:
                    i, e, got = diff
                    if not new_residual.any() and unsent.any():
                        hint = "the residual must keep what was not sent, not be reset to 0."
                    elif torch.allclose(new_residual[unsent], grad[unsent]) \
                            and residual.any():
                        hint = "the new residual is acc minus what was sent, with acc = " \
                               "grad + OLD residual: you dropped the old residual."
                    else:
                        hint = "new_residual = acc with the sent entries set to 0."
                    raise _Failure(f"{where}: residual accounting at index {i}: grad + old "
                                   f"residual = {_num(e)}, but sent + new residual = "
                                   f"{_num(got)}", hint)
                residual = new_residual.clone()
        return "passed on sizes 1, 6, 13, 64 with k = 1, 2, 3, 5, three calls each"

    return _report("top-k with error feedback", body)


# -------------------------------------------------------------- parameter server


class _LockedTwice(Exception):
    """The learner took ``self.lock`` while already holding it: a real Lock deadlocks."""


class _RecordingLock:
    """Stands in for ``ps.lock``: counts acquisitions, knows if it is held, and refuses a
    second acquisition by the thread that holds it (a ``threading.Lock`` would hang)."""

    def __init__(self):
        self._lock = threading.RLock()
        self.acquired = 0
        self.depth = 0
        self._owner = None

    def acquire(self, *args, **kwargs):
        if self.depth and self._owner == threading.get_ident():
            raise _LockedTwice()
        ok = self._lock.acquire(*args, **kwargs)
        if ok:
            self.acquired += 1
            self.depth += 1
            self._owner = threading.get_ident()
        return ok

    def release(self):
        self.depth -= 1
        if not self.depth:
            self._owner = None
        self._lock.release()

    def locked(self):
        return self.depth > 0

    __enter__ = acquire

    def __exit__(self, *exc):
        self.release()


class _Server:
    """Calls the learner's parameter server and turns its mistakes into _Failures."""

    def __init__(self, cls, mode, params, lr=0.5, workers=3, bound=3):
        self.mode = f"{mode} mode" + (f" (bound {bound})" if mode == "bounded" else "")
        try:
            self.ps = cls(params, lr=lr, num_workers=workers, mode=mode, bound=bound)
        except Exception as error:  # noqa: BLE001
            raise _raised(f"{self.mode}: ParameterServer(...)", error) from None
        if not hasattr(self.ps, "lock"):
            raise _Failure(f"{self.mode}: the server has no `lock` attribute",
                           "create self.lock = threading.Lock() in __init__.")
        self.lock = self.ps.lock = _RecordingLock()

    def fail(self, what, hint):
        raise _Failure(f"{self.mode}: {what}", hint)

    def call(self, method, *args):
        text = f"{method}({', '.join(_arg_text(a) for a in args)})"
        before = self.lock.acquired
        try:
            out = getattr(self.ps, method)(*args)
        except _LockedTwice:
            self.fail(f"{text} took self.lock while already holding it",
                      "a threading.Lock is not re-entrant: that call would hang forever. Don't "
                      "call one locked method from inside another's `with self.lock:`.")
        except Exception as error:  # noqa: BLE001
            raise _raised(f"{self.mode}: {text}", error) from None
        if self.lock.depth:
            self.fail(f"{text} returned while still holding self.lock",
                      "use `with self.lock:` so that every return releases it.")
        if self.lock.acquired == before:
            self.fail(f"{text} did not take self.lock",
                      "ranks are threads: read and write the shared state inside "
                      "`with self.lock:`.")
        return out

    def params_equal(self, expected, after, hint):
        got = self.ps.params
        diff = _first_difference(expected, got, lambda e, g: torch.isclose(e, g, atol=1e-6))
        if diff is not None:
            i, e, g = diff
            self.fail(f"after {after}, params[{i}] = {_num(g)}, expected {_num(e)}", hint)


def _arg_text(arg):
    if isinstance(arg, torch.Tensor):
        return "g"
    if isinstance(arg, range):
        return str(list(arg))
    return repr(arg)


def _ps_scripted(cls):
    init = torch.arange(5, dtype=torch.float32)
    g = torch.Generator().manual_seed(5)
    grads = [torch.randn(5, generator=g) for _ in range(3)]

    # ---- sync
    s = _Server(cls, "sync", init.clone())
    if s.ps.params.data_ptr() == init.data_ptr():
        s.fail("the server keeps the caller's tensor as its params",
               "keep a copy: self.params = params.clone().")
    pulled = s.call("pull", 0)
    if pulled is None or not torch.equal(pulled, init):
        s.fail("pull(0) on a new server did not return the initial parameters",
               "pull returns a copy of self.params.")
    if pulled.data_ptr() == s.ps.params.data_ptr():
        s.fail("pull(0) returned the server's own params tensor, not a copy",
               "return self.params.clone(): a worker that changes its copy must not change "
               "the server.")
    s.call("pull", 1)
    s.call("pull", 2)
    g0 = grads[0].clone()
    s.call("push", 0, g0)
    if not torch.equal(g0, grads[0]):
        s.fail("push(0, g) modified the worker's gradient", "store a copy; never change g.")
    g0.zero_()   # the worker reuses its gradient buffer
    s.call("push", 1, grads[1].clone())
    s.params_equal(init, "push(0, g), push(1, g)",
                   "in sync mode push only stores the gradient; sync() applies them.")
    if s.call("sync", range(3)) is not False:
        s.fail("sync([0, 1, 2]) did not return False after pushes from workers 0 and 1 only",
               "sync applies the update only when every worker in all_workers has pushed "
               "(return False otherwise).")
    s.params_equal(init, "an incomplete sync", "sync must not update before every worker "
                   "has pushed.")
    if s.call("pull", 0) is not None:
        s.fail("worker 0 pushed in this round, yet pull(0) did not return None",
               "in sync mode a worker that has pushed waits (pull returns None) until "
               "sync() has applied the round.")
    s.call("push", 2, grads[2].clone())
    if s.call("sync", range(3)) is not True:
        s.fail("sync([0, 1, 2]) did not return True after all three pushed",
               "return True when the update was applied.")
    expected = init - 0.5 * torch.stack(grads).mean(0)
    s.params_equal(expected, "sync([0, 1, 2])",
                   "params -= lr · mean of the round's gradients; store a copy of each "
                   "gradient in push (the worker may reuse its buffer).")
    if s.ps.version != 1:
        s.fail(f"version is {s.ps.version} after one sync, expected 1",
               "version counts the updates applied.")
    after = s.call("pull", 0)
    if after is None or not torch.equal(after, s.ps.params):
        s.fail("after sync, pull(0) did not return the new parameters",
               "a new round starts: clear pending in sync().")

    # ---- async
    a = _Server(cls, "async", init.clone())
    for w in range(3):
        a.call("pull", w)
    a.call("push", 1, grads[1].clone())
    a.params_equal(init - 0.5 * grads[1], "push(1, g)",
                   "in async mode every push is applied at once: params -= lr · g.")
    a.call("push", 0, grads[0].clone())
    a.params_equal(init - 0.5 * grads[1] - 0.5 * grads[0], "push(1, g), push(0, g)",
                   "params -= lr · g on every push.")
    if list(a.ps.staleness) != [0, 1]:
        a.fail(f"staleness is {list(a.ps.staleness)} after push(1) then push(0), both "
               "computed on version 0; expected [0, 1]",
               "staleness = self.version - self.pulled[worker], recorded before the update.")
    for _ in range(5):
        if a.call("pull", 0) is None:
            a.fail("pull(0) returned None: in async mode nobody waits",
                   "only sync and bounded modes make a worker wait.")
        a.call("push", 0, grads[0].clone())
    if a.ps.version != 7:
        a.fail(f"version is {a.ps.version} after 7 pushes, expected 7",
               "version += 1 on every applied update.")

    # ---- bounded staleness, bound 3 and bound 1
    for bound in (3, 1):
        b = _Server(cls, "bounded", init.clone(), bound=bound)
        for w in range(3):
            b.call("pull", w)
        for step in range(1, bound + 2):
            b.call("push", 0, grads[0].clone())
            allowed = b.call("pull", 0)
            ahead = step
            if ahead <= bound and allowed is None:
                b.fail(f"worker 0 is {ahead} push(es) ahead of the slowest worker, within "
                       f"the bound, yet pull(0) returned None",
                       "wait only when clock[worker] - min(clock) > bound.")
            if ahead > bound and allowed is not None:
                b.fail(f"worker 0 is {ahead} pushes ahead of the slowest worker, yet "
                       f"pull(0) did not return None",
                       "pull must return None while clock[worker] - min(clock) > bound "
                       "(use self.bound, not a fixed 3).")
        b.call("push", 1, grads[1].clone())
        b.call("push", 2, grads[2].clone())
        if b.call("pull", 0) is None:
            b.fail("the slowest workers caught up, yet pull(0) still returned None",
                   "compare with min(self.clock): the slowest worker's pushes.")
        if list(b.ps.staleness)[-2:] != [bound + 1, bound + 2]:
            b.fail(f"staleness is {list(b.ps.staleness)}; workers 1 and 2 pushed gradients "
                   f"computed on version 0 after {bound + 1} and {bound + 2} updates",
                   "bounded mode applies every push at once and records its staleness, "
                   "like async.")


def check_parameter_server(cls):
    """``cls(params, lr, num_workers, mode, bound)`` with ``pull(worker)``,
    ``push(worker, gradients)`` and ``sync(all_workers)``, in the modes "sync", "async" and
    "bounded"; then trained on the cluster against the reference server."""

    def body():
        _ps_scripted(cls)
        problem = ref.TinyMLP(features=8, hidden=8, classes=3, samples=256, seed=1)
        speeds = [1.0, 1.5, 3.0]
        for mode in ("sync", "async", "bounded"):
            outputs = []
            for server in (ref.ParameterServer, cls):
                case = f"on the cluster, {mode} mode, 3 workers"
                run = _simulate(sc.Cluster.preset("dgx-a100", nodes=1), lambda s=server, m=mode:
                                ref.ps_train(problem, s, m, 4, 0.5, 8, speeds, bound=1),
                                4, lambda rank, case=case: case, {})
                outputs.append(run.results[0])
            ref_snaps = [u[2] for u in outputs[0]["updates"]]
            snaps = [u[2] for u in outputs[1]["updates"]]
            if len(snaps) != len(ref_snaps):
                raise _Failure(f"{case}: {len(snaps) - 1} updates, expected "
                               f"{len(ref_snaps) - 1}", "see the scripted checks' rules.")
            for step, (e, got) in enumerate(zip(ref_snaps, snaps)):
                diff = _first_difference(e, got, lambda x, y: torch.isclose(x, y, atol=1e-5))
                if diff is not None:
                    i, ev, gv = diff
                    raise _Failure(f"{case}: after update {step}, params[{i}] = {_num(gv)}, "
                                   f"expected {_num(ev)}", "compare with the rules the "
                                   "scripted part checks.")
        return "passed sync, async and bounded (bound 3 and 1) modes, and training on " \
               "the cluster with 3 workers"

    return _report("parameter server", body)


# ---------------------------------------------------------------------- local SGD


LOCAL_SGD_CASES = ((1, 4, 1), (2, 4, 1), (2, 6, 2), (3, 6, 3), (4, 7, 3), (5, 6, 2), (8, 6, 3))


def _lsq_problem(world_size, rank, steps):
    g = torch.Generator().manual_seed(991 * world_size + rank)
    true_w = torch.tensor([1.0, -2.0, 0.5, 3.0])
    batches = []
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g)
        batches.append((x, x @ true_w + 0.1 * torch.randn(8, generator=g)))
    return batches


def lsq_grad(w, x, y):
    """Gradient of the mean squared error of the linear model ``x @ w`` (for local SGD)."""
    return 2 * x.T @ (x @ w - y) / len(y)


def check_local_sgd(fn):
    """``fn(w, batches, grad_fn, lr, sync_every) -> w`` on every rank: an SGD step per batch,
    and the parameters averaged over ranks (``dist.all_reduce``) after every
    ``sync_every`` steps."""

    def run_case(f, p, steps, every):
        case = f"world size {p}, {steps} steps, sync_every={every}"

        def body():
            rank = dist.get_rank()
            w = torch.zeros(4)
            out = f(w, _lsq_problem(p, rank, steps), lsq_grad, 0.05, every)
            count, names = _collectives_so_far()
            return out, count, names

        return case, _simulate(sc.Cluster.preset("dgx-a100", nodes=1), body, p,
                               lambda rank: case, {})

    def body():
        for p, steps, every in LOCAL_SGD_CASES:
            _, expected = run_case(ref.local_sgd, p, steps, every)
            case, run = run_case(fn, p, steps, every)
            for rank, (out, count, names) in enumerate(run.results):
                syncs = steps // every
                if count != syncs:
                    if count == 0:
                        hint = ("average the parameters with dist.all_reduce (then divide by "
                                "the world size): the check counts those calls.")
                    else:
                        hint = "all-reduce after step i (counting from 0) when (i + 1) % " \
                               "sync_every == 0, and nowhere else."
                    raise _Failure(f"{case}: rank {rank} called {count} collective(s); local "
                                   f"SGD synchronises {steps} // {every} = {syncs} times", hint)
                if not isinstance(out, torch.Tensor) or tuple(out.shape) != (4,):
                    raise _Failure(f"{case}: rank {rank} returned "
                                   f"{type(out).__name__}, expected the parameter tensor",
                                   "return w.")
                diff = _first_difference(expected.results[rank][0], out,
                                         lambda e, g: torch.isclose(e, g, rtol=1e-4, atol=1e-5))
                if diff is not None:
                    i, e, g = diff
                    raise _Failure(f"{case}: rank {rank} ended with w[{i}] = {_num(g)}, "
                                   f"expected {_num(e)}",
                                   "each step: w -= lr · grad_fn(w, x, y); on a sync step "
                                   "all-reduce the PARAMETERS (not the gradients) and divide "
                                   "by the world size.")
        sizes = sorted({c[0] for c in LOCAL_SGD_CASES})
        return f"passed on world sizes {_list(sizes)}, sync_every 1, 2, 3"

    return _report("local SGD", body)
