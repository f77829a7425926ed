"""The checks of lab 02 (gradient aggregation), on the protocol of :mod:`workbook.checking`.

Each check runs the learner's code on several world sizes (1, 2, 3, 4, 5, 8: powers of two
and not) and sizes (1, sizes that do not divide by the world size, ...), compares it with
the reference answer in :mod:`._reference` (imported inside the checks only, so that the
lab never holds it), and — once everything is correct — judges bytes, messages, bytes
between nodes and simulated time against the reference.
"""

import math

import torch
import torch.distributed as dist

import simcluster as sc
from workbook.checking import (Case, Failure, LockedTwice, RecordingLock, SIZES, TOLERANCE,
                               WORLD_SIZES, answers, budget, cases, check,
                               check_messages_sent, check_outputs, check_p2p_only,
                               collectives_so_far, cross_node_budget, cross_node_bytes,
                               first_difference, listed, normal_input, num, on_a_rank,
                               passed_text, raised, refuse_reference, run_in_place, short,
                               simulate, sum_of_inputs, time_budget)


_reference = answers(__name__)   # the answers, imported only while a check runs


# ---------------------------------------------------- the all-reduce family


def _correctness(fn, cases_run, hints, extra_args=lambda case: ()):
    """Run an all-reduce from point-to-point messages on every case; return
    ``{case: run}``. Raises Failure at the first problem."""
    runs = {}
    for case in cases_run:
        run = run_in_place(fn, case, extra_args=extra_args(case), hints=hints)
        check_p2p_only(case, run, hints)
        check_outputs(case, run, sum_of_inputs(run), hints)
        check_messages_sent(case, run, hints)
        runs[case] = run
    return runs


def _largest(runs, world_size=None):
    """The largest-size case on the largest (or given) world size."""
    chosen = [c for c in runs if world_size is None or c.world_size == world_size]
    return max(chosen, key=lambda c: (c.world_size, c.size))


def _timed(fn, reference, case, extra_args=()):
    """``(run, reference_run)`` of ``fn`` and ``reference`` on ``case``, with accounting."""
    return (run_in_place(fn, case, extra_args=extra_args, accounting=True),
            run_in_place(reference, case, extra_args=extra_args, accounting=True))


def _elements_budget(case, run, what, formula, elements, hint):
    """Bytes per rank against a number of elements of the case's dtype."""
    budget(case, "bytes", run.bytes_sent, elements * case.element_size,
           f"{formula} elements of {case.element_size} bytes", hint, what)


@check("naive all-reduce")
def check_naive_allreduce(fn):
    """``fn(tensor)`` on every rank: gather every tensor to rank 0, sum, send the sum back."""
    refuse_reference(fn, _reference().naive_allreduce)
    hints = {"values": "rank 0 adds every other rank's tensor to its own, then sends the "
                       "sum to every rank; every other rank sends its tensor, then receives "
                       "the sum into it."}
    cases_run = cases()
    runs = _correctness(fn, cases_run, hints)
    case = _largest(runs)
    run, n, p = runs[case], case.size, case.world_size
    for rank in range(1, p):
        if run.bytes_sent[rank] != n * case.element_size or run.messages_sent[rank] != 1:
            raise Failure(
                f"{case}: in a naive all-reduce every rank but 0 sends its tensor once, "
                f"to rank 0 ({n * case.element_size} bytes): rank {rank} sent "
                f"{run.messages_sent[rank]} message(s), {run.bytes_sent[rank]} bytes",
                "gather to rank 0, add, broadcast from rank 0: the other ranks talk "
                "only to rank 0.")
    return passed_text(cases_run)


@check("ring all-reduce")
def check_ring_allreduce(fn):
    """``fn(tensor)`` on every rank: ring all-reduce (reduce-scatter, then all-gather),
    from point-to-point operations only, leaving the SUM in ``tensor``."""
    ref = _reference()
    refuse_reference(fn, ref.ring_allreduce)
    hints = {"values": "reduce-scatter: at step s, send chunk (i - s - 1) % p to the right "
                       "and add the chunk (i - s - 2) % p from the left; all-gather: send "
                       "chunk (i - s) % p, copy in chunk (i - s - 1) % p (i: your position "
                       "in the ring). Chunk bounds must handle sizes that do not divide by p."}
    cases_run = cases()
    runs = _correctness(fn, cases_run, hints)
    case = _largest(runs)
    p, n = case.world_size, case.size
    _elements_budget(case, runs[case], "ring all-reduce", "2(p-1)/p·n", 2 * (p - 1) * n / p,
                     "send one chunk of about n/p elements per step, 2(p-1) steps: never "
                     "the whole tensor.")
    timed_case = Case(8, 1 << 14)
    time_budget(timed_case, *_timed(fn, ref.ring_allreduce, timed_case),
                "in every step every rank sends and receives at once (agg.exchange): if one "
                "rank sends first and the others receive first, each step travels around "
                "the ring one link at a time.", "reference ring")
    return passed_text(cases_run)


@check("tree all-reduce")
def check_tree_allreduce(fn):
    """``fn(tensor)`` on every rank: reduce up a (binomial or binary) tree to rank 0, then
    broadcast back down it."""
    ref = _reference()
    refuse_reference(fn, ref.tree_allreduce)
    hints = {"values": "reduce: at mask = 1, 2, 4, ..., a rank with (rank & mask) sends to "
                       "rank - mask and stops; one without receives from rank + mask (if it "
                       "exists) and adds. Broadcast: the same tree, in reverse."}
    cases_run = cases()
    runs = _correctness(fn, cases_run, hints)
    case = _largest(runs)
    run, p, n = runs[case], case.world_size, case.size
    depth = math.ceil(math.log2(p))
    budget(case, "messages", run.messages_sent, depth, "⌈log2 p⌉",
           "in a tree every rank talks to its parent and at most ⌈log2 p⌉ children; "
           "rank 0 must not receive from everybody itself.", "a tree all-reduce")
    total = sum(run.bytes_sent)
    target = 2 * (p - 1) * n * case.element_size
    if total > target * TOLERANCE["bytes"]:
        raise Failure(f"{case}: a tree all-reduce sends 2(p-1)·n = {2 * (p - 1) * n} "
                      f"elements ({target} bytes) in all: your ranks sent {total} "
                      f"bytes, {total / target:.2f}× that",
                      "each rank sends its partial sum up once, and receives the "
                      "result once.")
    timed_case = Case(8, 8)
    time_budget(timed_case, *_timed(fn, ref.tree_allreduce, timed_case),
                "a binomial tree takes ⌈log2 p⌉ rounds each way: in round i the ranks with "
                "bit i set send to rank - 2^i, all at the same time.", "binomial tree")
    return passed_text(cases_run)


HALVING_DOUBLING_NODES = Case(8, 1 << 12, ranks_per_node=4)


@check("halving-doubling all-reduce")
def check_halving_doubling_allreduce(fn):
    """``fn(tensor)`` on every rank: recursive-halving reduce-scatter and recursive-doubling
    all-gather (Rabenseifner, nearest partner first as in MPICH), with the extra ranks of a
    non-power-of-two world folded in first and served last."""
    ref = _reference()
    refuse_reference(fn, ref.halving_doubling_allreduce)
    hints = {"values": "with p' the largest power of two ≤ p, ranks ≥ p' first send their "
                       "tensor to rank - p' and later receive the result from it; among the "
                       "first p' ranks, exchange half of your current segment with rank ^ mask "
                       "for mask = 1, 2, ..., p'/2, then undo it in reverse order."}
    cases_run = cases()
    runs = _correctness(fn, cases_run, hints)
    case = _largest(runs, 8)
    p, n = case.world_size, case.size
    _elements_budget(case, runs[case], "halving-doubling", "2(p-1)/p·n", 2 * (p - 1) * n / p,
                     "exchange half of your current segment with your partner, not the "
                     "whole tensor: that is recursive doubling, lg p·n per rank.")
    for case in (_largest(runs, 8), _largest(runs, 5)):
        p = case.world_size
        lg = p.bit_length() - 1
        limit = 2 * lg + (0 if p == 1 << lg else 1)
        budget(case, "messages", runs[case].messages_sent, limit,
               "2·lg p" if p == 1 << lg else "2⌊lg p⌋ + 1",
               "each round pairs rank with rank ^ mask and halves (then doubles) the "
               "segment: lg p rounds each way, not p - 1 ring steps.", "halving-doubling")
    case = HALVING_DOUBLING_NODES
    run = run_in_place(fn, case, accounting=True)
    ref_run = run_in_place(ref.halving_doubling_allreduce, case, accounting=True)
    cross_node_budget(case, run, cross_node_bytes(case, ref_run),
                      f"2n elements of {case.element_size} bytes (nearest partner first, "
                      "as MPICH does)",
                      "start with the nearest partner (mask = 1, 2, 4, ...): the big first "
                      "exchanges then stay inside a node and only the small last ones cross "
                      "the network.", "halving-doubling")
    return passed_text(cases_run)


HIERARCHICAL_CASES = ((1, 1), (2, 1), (2, 2), (4, 2), (6, 2), (6, 3), (8, 4))


@check("hierarchical all-reduce")
def check_hierarchical_allreduce(fn):
    """``fn(tensor, ranks_per_node)`` on every rank: all-reduce inside each node, then across
    nodes (each node's ranks are ``k·j .. k·j + k - 1``), then inside each node again."""
    ref = _reference()
    refuse_reference(fn, ref.hierarchical_allreduce)
    hints = {"values": "ranks k·j .. k·j + k - 1 form node j. Reduce inside the node, "
                       "all-reduce across the nodes among ranks with the same local index "
                       "(local = rank % k), then share the result inside the node."}
    cases_run = [c for p, k in HIERARCHICAL_CASES for c in cases((p,), ranks_per_node=k)]
    runs = _correctness(fn, cases_run, hints, extra_args=lambda case: (case.ranks_per_node,))
    case = Case(8, 1 << 20, ranks_per_node=4)
    n, m = case.size, case.world_size // case.ranks_per_node
    run, ref_run = _timed(fn, ref.hierarchical_allreduce, case, (case.ranks_per_node,))
    cross_node_budget(case, run, 2 * (m - 1) * n * case.element_size,
                      f"2(m-1)·n elements of {case.element_size} bytes (m = {m} nodes)",
                      "finish the reduction inside each node first, so only one partial sum "
                      "per node (or one shard per rank) crosses the network.",
                      "a hierarchical all-reduce")
    time_budget(case, run, ref_run, "run the cross-node step on 1/k of the tensor per rank "
                "(reduce-scatter inside the node first), so all k NICs of a node work at "
                "once.")
    sizes = listed(sorted({c.size for c in runs}))
    return (f"passed on (world size, ranks per node) {listed(HIERARCHICAL_CASES)}, "
            f"sizes {sizes}")


# ---------------------------------------------------------------- compression


FP16_LARGE = 30_000.0


@check("fp16 all-reduce")
def check_fp16_allreduce(fn):
    """``fn(tensor)`` on every rank: send float16 over the wire, leave the MEAN over ranks
    (float32) in ``tensor``; all-reduce the half tensor with your ring (point to point)."""
    refuse_reference(fn, _reference().fp16_allreduce)
    hints = {"values": "divide by the world size, cast to torch.float16, all-reduce the "
                       "half tensor with your ring_allreduce, copy the result back into "
                       "`tensor`.",
             "collective": "all-reduce the half tensor with your ring_allreduce (point to "
                           "point), so its bytes on the wire can be counted."}
    big = Case(8, 16)

    def make_input(case, rank):
        return normal_input(case, rank, FP16_LARGE if case is big else 1.0)

    def close_to_mean(run):
        """``(expected_for, close)``: the mean, within fp16's rounding of each addend."""
        inputs = torch.stack([r["input"].double() for r in run.results])
        mean = (inputs.sum(0) / len(run.results)).float()
        tol = (2e-3 * inputs.abs().sum(0) + 1e-6).float().reshape(-1)
        return (lambda rank: mean), (lambda e, g: (e - g).abs() <= tol)

    cases_run = [Case(p, n) for p in WORLD_SIZES for n in SIZES]
    for case in cases_run + [big]:
        run = run_in_place(fn, case, make_input, hints=hints)
        check_p2p_only(case, run, hints)
        expected, close = close_to_mean(run)
        try:
            check_outputs(case, run, expected, hints, close)
        except Failure as failure:
            if case is big:
                raise Failure(f"values of ±{num(FP16_LARGE)} on world size 8: "
                              + failure.what.split(": ", 1)[1],
                              "fp16 stops at 65504: divide by the world size BEFORE "
                              "casting, so the sum of p values stays in range.") from None
            raise
        check_messages_sent(case, run, hints)
        if case.world_size == 8 and case.size == max(SIZES):
            p, n = case.world_size, case.size
            budget(case, "bytes", run.bytes_sent, 2 * (p - 1) / p * n * 2,
                   "2(p-1)/p·n·2", "all-reduce the float16 copy, not the float32 tensor.",
                   "an fp16 ring")
    return passed_text(cases_run)


# ------------------------------------------------------------------ int8 and top-k


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


@check("int8 quantization")
def check_int8_quantization(quantize, dequantize):
    """``quantize(tensor) -> (q, scale)`` with q int8 in [-127, 127], scale a float32 scalar,
    ``dequantize(q, scale) -> float32 tensor``; error at most scale/2; input unchanged."""
    ref = _reference()
    refuse_reference(quantize, ref.int8_quantize, "quantize function")
    refuse_reference(dequantize, ref.int8_dequantize, "dequantize function")
    for name, x in _int8_inputs():
        before = x.clone()
        out = on_a_rank(quantize, (x,), f"{name}: quantize")
        if not isinstance(out, (tuple, list)) or len(out) != 2:
            raise Failure(f"{name}: quantize returned {type(out).__name__}, expected a "
                          "pair (q, scale)", "return q, scale")
        q, scale = out
        if not torch.equal(x, before):
            raise Failure(f"{name}: quantize modified its input",
                          "compute q from x / scale, a new tensor; no in-place ops on x.")
        if not isinstance(q, torch.Tensor) or q.dtype != torch.int8:
            got = q.dtype if isinstance(q, torch.Tensor) else type(q).__name__
            raise Failure(f"{name}: q has dtype {str(got).replace('torch.', '')}, "
                          "expected int8", "finish with .to(torch.int8): one byte per "
                          "element is the point.")
        if tuple(q.shape) != tuple(x.shape):
            raise Failure(f"{name}: q has shape {tuple(q.shape)}, expected "
                          f"{tuple(x.shape)}", "quantize element-wise; keep the shape.")
        s = torch.as_tensor(scale)
        if s.numel() != 1 or not s.dtype.is_floating_point:
            raise Failure(f"{name}: scale should be one float, got "
                          f"{s.numel()} element(s) of {str(s.dtype).replace('torch.', '')}",
                          "scale = x.abs().max() / 127: one number per tensor.")
        s = float(s)
        if not math.isfinite(s) or s <= 0:
            raise Failure(f"{name}: scale is {num(s)}; it must be a positive number",
                          "an all-zero tensor has max |x| = 0: use scale 1 (or any "
                          "positive number) then, never 0.")
        if int(q.min()) < -127:
            raise Failure(f"{name}: q holds {int(q.min())}; keep q in [-127, 127]",
                          "symmetric quantization uses -127..127; clamp after "
                          "rounding.")
        deq = on_a_rank(dequantize, (q, scale), f"{name}: dequantize")
        if not isinstance(deq, torch.Tensor) or deq.dtype != torch.float32:
            got = deq.dtype if isinstance(deq, torch.Tensor) else type(deq).__name__
            raise Failure(f"{name}: dequantize returned "
                          f"{str(got).replace('torch.', '')}, expected float32",
                          "return q.to(torch.float32) * scale.")
        if tuple(deq.shape) != tuple(x.shape):
            raise Failure(f"{name}: dequantize returned shape {tuple(deq.shape)}, "
                          f"expected {tuple(x.shape)}", "return q.to(torch.float32) * scale.")
        err = (deq - x).abs().reshape(-1)
        if torch.isnan(err).any():
            i = int(torch.nonzero(torch.isnan(err))[0])
            raise Failure(f"{name}: dequantize(quantize(x)) is nan at index {i}",
                          "an all-zero tensor has max |x| = 0: dividing by a scale of "
                          "0 gives nan; use scale 1 then.")
        worst = int(err.argmax())
        if err[worst] > s / 2 * (1 + 1e-4) + 1e-12:
            raise Failure(f"{name}: at index {worst} x = {num(x.reshape(-1)[worst])} "
                          f"came back as {num(deq.reshape(-1)[worst])}: an error of "
                          f"{err[worst] / s:.2f}·scale, more than scale/2",
                          "round to the nearest integer (torch.round), don't truncate; "
                          "and use scale = max|x| / 127 so that nothing is clipped.")
        if x.abs().max() > 0 and int(q.abs().max()) < 127:
            raise Failure(f"{name}: the largest |q| is {int(q.abs().max())}; the "
                          "largest |x| should map to 127",
                          "scale = max|x| / 127 uses the whole int8 range: more "
                          "levels, smaller errors.")
    return "passed on sizes 1, 6, 13, 64, shape (3, 5), all zeros, all negative, tiny " \
           "values, one outlier"


TOPK_CASES = ((1, 1), (6, 2), (13, 3), (64, 5))


def _as_tensor(where, value, label):
    """``value`` (a tensor, or numbers torch can make one of) as a tensor, else the ❌."""
    try:
        tensor = torch.as_tensor(value)
    except (TypeError, ValueError, RuntimeError):
        tensor = None
    if tensor is None or tensor.dtype == torch.bool or tensor.is_complex():
        raise Failure(f"{where}: {label} is {short(repr(value), 60)}, not a tensor of "
                      "numbers", "return values, indices, new_residual: three tensors "
                      "(acc[indices], torch.topk(acc.abs(), k).indices, and acc with the "
                      "sent entries set to 0).")
    return tensor


@check("top-k with error feedback")
def check_topk_error_feedback(fn):
    """``fn(grad, residual, k) -> (values, indices, new_residual)``: top-k of
    ``grad + residual`` by magnitude, and everything not sent in ``new_residual``; checked
    over three calls that feed each residual into the next call."""
    refuse_reference(fn, _reference().topk_compress)
    for n, k in TOPK_CASES:
        g = torch.Generator().manual_seed(100 + n)
        residual = torch.zeros(n)
        for number in range(1, 4):
            where = f"size {n}, k = {k}, call {number}"
            grad = torch.randn(n, generator=g)
            grad_before, residual_before = grad.clone(), residual.clone()
            out = on_a_rank(fn, (grad, residual, k), f"{where}: your function")
            if not isinstance(out, (tuple, list)) or len(out) != 3:
                raise Failure(f"{where}: returned {type(out).__name__}, expected "
                              "(values, indices, new_residual)",
                              "return values, indices, new_residual")
            values, indices, new_residual = out
            for arg, before, label in ((grad, grad_before, "grad"),
                                       (residual, residual_before, "residual")):
                if not torch.equal(arg, before):
                    raise Failure(f"{where}: your function modified its `{label}` "
                                  "argument", "work on acc = grad + residual (a new "
                                  "tensor) and return a new residual.")
            acc = grad + residual
            values, indices, new_residual = (
                _as_tensor(where, value, label) for value, label in
                ((values, "values"), (indices, "indices"), (new_residual, "new_residual")))
            if indices.dtype.is_floating_point or indices.numel() != min(k, n) \
                    or values.numel() != min(k, n):
                dtype = str(indices.dtype).replace("torch.", "")
                raise Failure(f"{where}: expected {min(k, n)} values and {min(k, n)} "
                              f"integer indices, got {values.numel()} "
                              f"and {indices.numel()} ({dtype})",
                              "torch.topk(acc.abs(), k).indices, and acc[indices].")
            idx = indices.long().reshape(-1)
            if len(set(idx.tolist())) != idx.numel() or idx.min() < 0 or idx.max() >= n:
                raise Failure(f"{where}: the indices must be k different positions in "
                              f"0..{n - 1}, got {idx.tolist()[:8]}",
                              "torch.topk(acc.abs(), k).indices")
            values = values.reshape(-1).to(acc.dtype)
            if torch.allclose(values, grad[idx]) and not torch.allclose(values, acc[idx]):
                raise Failure(f"{where}: the values are grad[indices]: the residual "
                              "was never added", "error feedback: acc = grad + "
                              "residual, then take the top k of acc.")
            if not torch.allclose(values, acc[idx], rtol=1e-6, atol=1e-7):
                i = int(torch.nonzero(~torch.isclose(values, acc[idx]))[0])
                raise Failure(f"{where}: values[{i}] = {num(values[i])}, but "
                              f"grad + residual at index {int(idx[i])} is "
                              f"{num(acc[idx[i]])}", "values = acc[indices], signs "
                              "included (pick by |acc|, send acc).")
            unsent = torch.ones(n, dtype=torch.bool)
            unsent[idx] = False
            if unsent.any() and acc[unsent].abs().max() > values.abs().min() + 1e-7:
                raise Failure(f"{where}: |acc| = {num(acc[unsent].abs().max())} was "
                              f"left out while {num(values.abs().min())} was sent",
                              "pick the k largest by magnitude: torch.topk(acc.abs(), "
                              "k), not torch.topk(acc, k).")
            if tuple(new_residual.shape) != (n,):
                raise Failure(f"{where}: the new residual has shape "
                              f"{tuple(new_residual.shape)}, expected ({n},)",
                              "the residual is dense, like the gradient.")
            new_residual = new_residual.to(acc.dtype)
            sent = torch.zeros(n)
            sent[idx] = values
            diff = first_difference(acc, sent + new_residual,
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
                raise Failure(f"{where}: residual accounting at index {i}: grad + old "
                              f"residual = {num(e)}, but sent + new residual = "
                              f"{num(got)}", hint)
            residual = new_residual.clone()
    return "passed on sizes 1, 6, 13, 64 with k = 1, 2, 3, 5, three calls each"


# -------------------------------------------------------------- parameter server


class _Server:
    """Calls the learner's parameter server and turns its mistakes into Failures."""

    def __init__(self, cls, mode, params, lr=0.5, workers=3, bound=3):
        self.mode = f"{mode} mode" + (f" (bound {bound})" if mode == "bounded" else "")
        try:
            self.ps = cls(params, lr=lr, num_workers=workers, mode=mode, bound=bound)
        except Exception as error:  # noqa: BLE001
            raise raised(f"{self.mode}: ParameterServer(...)", error) from None
        if not hasattr(self.ps, "lock"):
            raise Failure(f"{self.mode}: the server has no `lock` attribute",
                          "create self.lock = threading.Lock() in __init__.")
        self.lock = self.ps.lock = RecordingLock()

    def fail(self, what, hint):
        """Raise the Failure ``what`` in this server's mode."""
        raise Failure(f"{self.mode}: {what}", hint)

    def call(self, method, *args):
        """``method(*args)`` on the server, which must take and release its lock."""
        text = f"{method}({', '.join(_arg_text(a) for a in args)})"
        before = self.lock.acquired
        try:
            out = getattr(self.ps, method)(*args)
        except LockedTwice:
            self.fail(f"{text} took self.lock while already holding it",
                      "a threading.Lock is not re-entrant: that call would hang forever. Don't "
                      "call one locked method from inside another's `with self.lock:`.")
        except Exception as error:  # noqa: BLE001
            raise raised(f"{self.mode}: {text}", error) from None
        if self.lock.depth:
            self.fail(f"{text} returned while still holding self.lock",
                      "use `with self.lock:` so that every return releases it.")
        if self.lock.acquired == before:
            self.fail(f"{text} did not take self.lock",
                      "ranks are threads: read and write the shared state inside "
                      "`with self.lock:`.")
        return out

    def params_equal(self, expected, after, hint):
        """Fail unless the server's params are ``expected`` ``after`` the calls named."""
        got = self.ps.params
        diff = first_difference(expected, got, lambda e, g: torch.isclose(e, g, atol=1e-6))
        if diff is not None:
            i, e, g = diff
            self.fail(f"after {after}, params[{i}] = {num(g)}, expected {num(e)}", hint)


def _arg_text(arg):
    if isinstance(arg, torch.Tensor):
        return "g"
    if isinstance(arg, range):
        return str(list(arg))
    return repr(arg)


def _ps_scripted(cls):
    """Drive the learner's server through scripted calls in every mode; raise Failure at
    the first rule it breaks."""
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


PS_TIMEOUT_HINT = ("pull, push and sync must return at once: when a worker must wait, pull "
                   "returns None (the caller asks again later); never loop until it may go "
                   "on.")


@check("parameter server")
def check_parameter_server(cls):
    """``cls(params, lr, num_workers, mode, bound)`` with ``pull(worker)``,
    ``push(worker, gradients)`` and ``sync(all_workers)``, in the modes "sync", "async" and
    "bounded"; then trained on the cluster against the reference server, update by
    update."""
    ref = _reference()
    refuse_reference(cls, ref.ParameterServer, "class")
    # on a rank of the cluster, so that a call that never returns is stopped
    simulate(sc.Cluster.preset("dgx-a100", nodes=1), _ps_scripted, 1,
             lambda rank: "the scripted calls", {"timeout": PS_TIMEOUT_HINT}, args=(cls,))
    from workbook.lesson02_gradient_aggregation.demos import TinyMLP, ps_train
    problem = TinyMLP(features=8, hidden=8, classes=3, samples=256, seed=1)
    speeds = [1.0, 1.5, 3.0]
    for mode in ("sync", "async", "bounded"):
        case = f"on the cluster, {mode} mode, 3 workers"
        run, ref_run = (simulate(sc.Cluster.preset("dgx-a100", nodes=1), ps_train, 4,
                                 lambda rank: case, {"timeout": PS_TIMEOUT_HINT},
                                 args=(problem, mode, 4, 0.5, 8, speeds, 1, server))
                        for server in (cls, ref.ParameterServer))
        snaps = [u[2] for u in run.results[0]["updates"]]
        ref_snaps = [u[2] for u in ref_run.results[0]["updates"]]
        if len(snaps) != len(ref_snaps):
            raise Failure(f"{case}: {len(snaps) - 1} updates, expected {len(ref_snaps) - 1}",
                          "see the scripted checks' rules.")
        for step, (e, got) in enumerate(zip(ref_snaps, snaps)):
            diff = first_difference(e, got, lambda x, y: torch.isclose(x, y, atol=1e-5))
            if diff is not None:
                i, ev, gv = diff
                raise Failure(f"{case}: after update {step}, params[{i}] = {num(gv)}, "
                              f"expected {num(ev)}", "compare with the rules the scripted "
                              "part checks.")
    return "passed sync, async and bounded (bound 3 and 1) modes, and training on the " \
           "cluster with 3 workers"


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


@check("local SGD")
def check_local_sgd(fn):
    """``fn(w, batches, grad_fn, lr, sync_every) -> w`` on every rank: an SGD step per batch,
    and the parameters averaged over ranks (``dist.all_reduce``) after every
    ``sync_every`` steps."""
    ref = _reference()
    refuse_reference(fn, ref.local_sgd)

    def run_case(f, p, steps, every):
        case = f"world size {p}, {steps} steps, sync_every={every}"

        def body():
            rank = dist.get_rank()
            w = torch.zeros(4)
            out = f(w, _lsq_problem(p, rank, steps), lsq_grad, 0.05, every)
            count, names = collectives_so_far()
            return out, count, names

        return case, simulate(sc.Cluster.preset("dgx-a100", nodes=1), body, p,
                              lambda rank: case)

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
                raise Failure(f"{case}: rank {rank} called {count} collective(s); local "
                              f"SGD synchronises {steps} // {every} = {syncs} times", hint)
            if not isinstance(out, torch.Tensor) or tuple(out.shape) != (4,):
                raise Failure(f"{case}: rank {rank} returned "
                              f"{type(out).__name__}, expected the parameter tensor",
                              "return w.")
            diff = first_difference(expected.results[rank][0], out,
                                     lambda e, g: torch.isclose(e, g, rtol=1e-4, atol=1e-5))
            if diff is not None:
                i, e, g = diff
                raise Failure(f"{case}: rank {rank} ended with w[{i}] = {num(g)}, "
                              f"expected {num(e)}",
                              "each step: w -= lr · grad_fn(w, x, y); on a sync step "
                              "all-reduce the PARAMETERS (not the gradients) and divide "
                              "by the world size.")
    sizes = sorted({c[0] for c in LOCAL_SGD_CASES})
    return f"passed on world sizes {listed(sizes)}, sync_every 1, 2, 3"
