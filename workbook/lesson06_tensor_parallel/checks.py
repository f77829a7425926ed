"""The checks of lab 06 (tensor and sequence parallelism), on the protocol of
:mod:`workbook.checking`.

Each check runs the learner's code on world sizes 1, 2, 3, 4, 6 and 8 (powers of two and
not; every size divides the models' features and the sequence), on small real layers
(hidden size 24, an MLP of 4,728 parameters), and compares outputs and gradients with
the same layers run whole in one process. Collectives are counted per pass from the
simulator's record of what each rank called (``sc.collectives_called()``) and, where
bytes matter, from ``run.collectives`` and ``run.traffic``.

The semantics the checks hold the learner to (Megatron-LM's, Shoeybi et al. 2019):

* ``CopyToTP`` (f) is the identity in forward and the **sum** over the ranks in backward;
  ``ReduceFromTP`` (g) is the **sum** in forward and the identity in backward. There is
  no divide anywhere: a row-parallel layer's ranks hold partial sums of one output, and a
  column-parallel layer's ranks hold partial gradients of one input. An average
  (``ReduceOp.AVG``, or ``/ t``) where the sum belongs is reported as such.
* Neither may change a tensor it was handed (the input in forward, the incoming gradient
  in backward): the caller still owns it.
* Row-parallel layers add the bias once, after the all-reduce, and every rank holds the
  whole bias (its gradient is then the whole bias gradient on every rank).
* With sequence parallelism the LayerNorm's parameters and the row-parallel bias act on
  this rank's positions only, so their gradients are partial sums; the check adds them
  up over the ranks (what Megatron-LM's ``finalize_model_grads`` all-reduces after
  backward for every sequence-parallel parameter) before comparing.

The reference answers (:mod:`._reference`) are imported inside the checks only.
"""

import torch
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc
from workbook.checking import (Failure, TOLERANCE, answers, check, close_within,
                               first_difference, listed, num, refuse_reference, simulate)
from workbook.hints import Hints
from workbook.lesson06_tensor_parallel.lab import (BATCH, Block, HIDDEN, SEQUENCE,
                                                   activations, make_mlp)

WORLD_SIZES = (1, 2, 3, 4, 6, 8)
OPERATOR_SHAPES = ((5,), (3, 4))
FLOAT_BYTES = 4


_reference = answers(__name__)   # the answers, imported only while a check runs


hint = Hints({
    "operators": [
        "Read the table: each operator communicates in one pass only and passes the tensor "
        "through untouched in the other. In the pass that communicates, what does every rank "
        "hold: a copy of one value, or one part of a sum?",
        "The pass that communicates sums the ranks' tensors with one all-reduce and its "
        "default op, SUM; nothing is divided. An all-reduce writes into the tensor it is "
        "given, and the tensor you were handed still belongs to the caller.",
        "Identity pass: return what came in. Summing pass: make a copy of what came in, "
        "all-reduce the copy in place, return the copy. Four short methods, no ctx needed.",
    ],
    "linears": [
        "A weight has shape (out_features, in_features). Which of the two dimensions does "
        "a column-parallel layer split, which does a row-parallel one, and which part of "
        "the bias does each rank need?",
        "Rank r of t keeps the r-th of t equal blocks of the split dimension. Column-"
        "parallel: the input goes through f first, then this rank's linear with its bias "
        "slice. Row-parallel: the linear without bias gives a partial sum; g adds the "
        "partials up; the whole bias is added once, after g.",
        "Each builder: the block size is given above it; build the block's slice object for "
        "this rank, index the detached full weight with it along the split dimension (and "
        "the bias for column-parallel), copy each piece so it owns its storage, and hand "
        "both to the layer class.",
    ],
    "mlp": [
        "Which layer of full_mlp is cut column-wise and which row-wise, and does GeLU need "
        "anything from the other ranks when each rank holds its own slice of the 4h "
        "features?",
        "Reuse your two builders from exercise 2 on the first and the last module of "
        "full_mlp (the middle one is the GeLU). The layers' own forwards already hold f "
        "and g, so the MLP adds no communication of its own.",
        "__init__: two attributes, fc1 and fc2, each built by one builder call with this "
        "rank and world size. forward: one line that chains fc1, GeLU and fc2.",
    ],
    "sequence": [
        "Count rows: the forward of the gather turns this rank's s/t rows into all s; "
        "the scatter turns s rows of partial sums into this rank's s/t rows of the total. "
        "What does each one's backward do, and which torch.distributed collective writes "
        "into one preallocated buffer?",
        "all_gather_single and reduce_scatter_single each fill an output tensor you "
        "allocate, shaped like the input except along dim 0 (t times more rows, or t times "
        "fewer). Pass them a contiguous input and return the output. Each operator's "
        "backward is the other's forward.",
        "The block's forward, in order: normalize this rank's rows; gather the whole "
        "sequence; the first linear with fc1's weight and bias, then GeLU; the second "
        "linear with fc2's weight only; scatter back to this rank's rows; then add fc2's "
        "bias and the residual input. Do not call the shards' own forwards: they hold f "
        "and g, which the gather and the scatter replace.",
    ],
})


def _cluster():
    """One DGX node: up to 8 ranks on NVLink."""
    return sc.Cluster.preset("dgx-a100", nodes=1)


# ------------------------------------------------------------- models and inputs


def make_linear(in_features, out_features, seed=0):
    """A full ``nn.Linear`` with seeded weights (the same on every rank)."""
    torch.manual_seed(seed)
    return nn.Linear(in_features, out_features)


def _shard(n, rank, world_size):
    size = n // world_size
    return slice(rank * size, (rank + 1) * size)


def _integers(shape, seed):
    """Non-zero integers in [-9, 9] as float32: every order of summation is exact."""
    g = torch.Generator().manual_seed(seed)
    values = torch.randint(1, 10, shape, generator=g) * (torch.randint(0, 2, shape,
                                                                       generator=g) * 2 - 1)
    return values.float()


# a matmul split over ranks adds its partial sums in another order, over long rows
_close = close_within(rtol=1e-4, atol=1e-5)


def _where(world_size, text=""):
    return f"world size {world_size}" + (f", {text}" if text else "")


def _compare(at, expected, got, why, close=None):
    """Fail if ``got`` differs from ``expected`` in shape or values."""
    if not isinstance(got, torch.Tensor):
        raise Failure(f"{at} is {type(got).__name__}, expected a tensor of shape "
                      f"{tuple(expected.shape)}", why)
    if tuple(got.shape) != tuple(expected.shape):
        raise Failure(f"{at} has shape {tuple(got.shape)}, expected "
                      f"{tuple(expected.shape)}", why)
    diff = first_difference(expected, got, close)
    if diff is not None:
        i, e, g = diff
        raise Failure(f"{at}: element {i} is {num(g)}, expected {num(e)}", why)


def _passes(before):
    """The names of the collectives this rank called since ``before`` of them."""
    return sc.collectives_called()[before:]


def _called(names):
    return listed(names) if names else "none"


# ------------------------------------------------------- exercise 1: f and g


def _operator_body(op, shape):
    """Every rank: ``y = op.apply(x)``, ``y.backward(grad)``; what came out, what each
    pass called, and whether the tensors it was handed were changed."""

    def body():
        rank, t = dist.get_rank(), dist.get_world_size()
        seed = 1_000 * t + 10 * rank + len(shape)
        x = _integers(shape, seed).requires_grad_()
        grad = _integers(shape, seed + 5)
        x_before, grad_before = x.detach().clone(), grad.clone()
        start = len(sc.collectives_called())
        y = op.apply(x)
        forward = _passes(start)
        out = y.detach().clone() if isinstance(y, torch.Tensor) else y
        if isinstance(y, torch.Tensor) and y.requires_grad:
            y.backward(grad)
        return {"x": x_before, "grad": grad_before, "out": out, "x_grad": x.grad,
                "x_changed": not torch.equal(x.detach(), x_before),
                "grad_changed": not torch.equal(grad, grad_before),
                "forward": forward, "backward": _passes(start + len(forward))}

    return body


NO_DIVIDE = ("no divide: the ranks hold parts of one sum (partial outputs of a "
             "row-parallel layer, partial input gradients of a column-parallel one), so "
             "the sum is the answer: dist.all_reduce with the default op, SUM.")


def _judge(at, expected, got, own, total, t, hints):
    """Compare, naming the classic mistakes: the sum where the identity belongs, the
    identity where the sum belongs, the mean where the sum belongs."""
    if isinstance(got, torch.Tensor) and got.shape == expected.shape and t > 1 \
            and not torch.equal(got, expected):
        wants_sum = torch.equal(expected, total)
        if wants_sum and torch.allclose(got, total / t):
            raise Failure(f"{at} is the mean over the {t} ranks, expected their sum",
                          NO_DIVIDE)
        if wants_sum and torch.equal(got, own):
            raise Failure(f"{at} is this rank's own tensor, expected the sum over the "
                          "ranks", hints["missing"])
        if not wants_sum and (torch.equal(got, total) or torch.allclose(got, total / t)):
            what = "sum" if torch.equal(got, total) else "mean"
            raise Failure(f"{at} is the {what} over the ranks, expected this rank's own "
                          "tensor unchanged", hints["sum"])
    _compare(at, expected, got, hints["values"])


OPERATORS = {
    "CopyToTP": {
        "forward": "identity", "backward": "sum",
        "sum": "CopyToTP (f) is the identity in forward: return x as it is; its all-reduce "
               "belongs in backward.",
        "values": "CopyToTP is the identity in forward and the sum over the ranks in "
                  "backward. " + hint.pointer("operators"),
        "missing": "CopyToTP's backward must all-reduce the gradient: every rank's column "
                   "shard contributed a part of the input's gradient.",
    },
    "ReduceFromTP": {
        "forward": "sum", "backward": "identity",
        "sum": "ReduceFromTP (g) is the identity in backward: the gradient of a sum with "
               "respect to each of its terms is the gradient itself; return it as it is.",
        "values": "ReduceFromTP is the sum over the ranks in forward and the identity in "
                  "backward. " + hint.pointer("operators"),
        "missing": "ReduceFromTP's forward must all-reduce: each rank holds a partial sum "
                   "of the output.",
    },
}
IN_PLACE = ("collectives write into the tensor they are given: communicate a copy, never "
            "the tensor you were handed — on a real model the caller still uses it (a "
            "residual branch, another layer's gradient).")


def _check_operator(name, op):
    """One operator on every world size and shape: values of both passes, the tensors it
    was handed left alone, one all-reduce in the pass that sums and none in the other."""
    spec = OPERATORS[name]
    for t in WORLD_SIZES:
        for shape in OPERATOR_SHAPES:
            where = _where(t, f"shape {shape}")
            run = simulate(_cluster(), _operator_body(op, shape), t,
                           lambda rank, where=where: f"{name}, {where}")
            xs = [r["x"] for r in run.results]
            grads = [r["grad"] for r in run.results]
            for rank, result in enumerate(run.results):
                at = f"{name}, {where}: rank {rank}"
                expected = sum(xs) if spec["forward"] == "sum" else xs[rank]
                _judge(f"{at}: the forward output", expected, result["out"], xs[rank],
                       sum(xs), t, spec)
                if result["x_grad"] is None:
                    raise Failure(f"{at}: x.grad is None after backward",
                                  "backward must return the gradient with respect to x.")
                expected = sum(grads) if spec["backward"] == "sum" else grads[rank]
                _judge(f"{at}: x.grad", expected, result["x_grad"], grads[rank], sum(grads),
                       t, spec)
                if result["x_changed"]:
                    raise Failure(f"{at}: forward changed its input x in place", IN_PLACE)
                if result["grad_changed"]:
                    raise Failure(f"{at}: backward changed the incoming gradient in place",
                                  IN_PLACE)
                for phase in ("forward", "backward"):
                    want = ["all_reduce"] if spec[phase] == "sum" else []
                    if result[phase] != want:
                        raise Failure(f"{at}: {phase} called {_called(result[phase])}; "
                                      f"{name} needs {_called(want)} there",
                                      spec["missing"] if want else spec["sum"])


@check("conjugate operators f and g")
def check_conjugate_operators(copy_to_tp, reduce_from_tp):
    """``CopyToTP`` and ``ReduceFromTP``, ``torch.autograd.Function`` s: forward values,
    gradients, tensors left unchanged and all-reduces per pass, on every world size."""
    ref = _reference()
    refuse_reference(copy_to_tp, ref.CopyToTP, "class")
    refuse_reference(reduce_from_tp, ref.ReduceFromTP, "class")
    _check_operator("CopyToTP", copy_to_tp)
    _check_operator("ReduceFromTP", reduce_from_tp)
    return (f"values and gradients right, one all-reduce in the right pass, inputs left "
            f"alone, on world sizes {listed(WORLD_SIZES)}, shapes {listed(OPERATOR_SHAPES)}")


# --------------------------------------------------- exercise 2: the two linears


LAYERS = {
    # kind: (in, out features; sharded dimension of the weight; collectives per pass)
    "column": (HIDDEN, 2 * HIDDEN, 0, {"forward": [], "backward": ["all_reduce"]}),
    "row": (2 * HIDDEN, HIDDEN, 1, {"forward": ["all_reduce"], "backward": []}),
}
SHARD_HINTS = {
    "column": "column-parallel splits the OUTPUT features, dim 0 of the weight: rank r "
              "keeps the r-th of t blocks of its rows, and the same block of the bias. "
              + hint.pointer("linears"),
    "row": "row-parallel splits the INPUT features, dim 1 of the weight: rank r keeps the "
           "r-th of t blocks of its columns, and the whole bias. " + hint.pointer("linears"),
}
FORWARD_HINTS = {
    "column": "a column-parallel layer passes its input through CopyToTP, then computes "
              "its slice of the output features with its weight and bias. "
              + hint.pointer("linears"),
    "row": "a row-parallel layer's partial product (no bias) must be summed over the ranks "
           "by ReduceFromTP, and the bias added once, after the sum. "
           + hint.pointer("linears"),
}
BIAS_TWICE = ("the bias went into the sum on every rank, so the output holds it t times: "
              "add self.bias after ReduceFromTP, not inside F.linear before it.")
COPY_HINT = ("the shard is a view of the full weight, and a view keeps the whole full "
             "weight's storage alive on every rank: copy the slice, since the point of "
             "tensor parallelism is that a rank stores only its 1/t. "
             + hint.pointer("linears"))


def _parameters(layer, at):
    """``(weight, bias)`` of the learner's layer; a Failure when it has none."""
    if not isinstance(layer, nn.Module):
        raise Failure(f"{at}: returned {type(layer).__name__}, expected an nn.Module",
                      "return a layer of the class given above, built from this rank's "
                      "slices. " + hint.pointer("linears"))
    found = [getattr(layer, name, None) for name in ("weight", "bias")]
    for name, param in zip(("weight", "bias"), found):
        if not isinstance(param, nn.Parameter):
            raise Failure(f"{at}: the layer's `{name}` is {type(param).__name__}, expected "
                          "an nn.Parameter",
                          "pass both slices to the layer class given above: it wraps them "
                          "in nn.Parameter.")
    return found


def _linear_body(kind, fn):
    """Every rank: its layer from ``fn``, forward on its input, backward; what came out,
    what each pass called, and the bytes of storage the layer's parameters keep."""
    in_f, out_f, _, _ = LAYERS[kind]

    def body():
        rank, t = dist.get_rank(), dist.get_world_size()
        layer = fn(make_linear(in_f, out_f), rank, t)
        at = f"{kind} layer, {_where(t)}: rank {rank}"
        weight, bias = _parameters(layer, at)
        x = activations(in_f)
        if kind == "row":
            x = x[..., _shard(in_f, rank, t)]
        x = x.clone().requires_grad_()
        grad = activations(out_f, seed=2)
        if kind == "column":
            grad = grad[..., _shard(out_f, rank, t)]
        start = len(sc.collectives_called())
        y = layer(x)
        forward = _passes(start)
        y.backward(grad)
        stored = sum(p.untyped_storage().nbytes() for p in (weight, bias))
        return {"weight": weight.detach().clone(), "bias": bias.detach().clone(),
                "out": y.detach().clone(), "x_grad": x.grad, "weight_grad": weight.grad,
                "bias_grad": bias.grad, "stored": stored, "forward": forward,
                "backward": _passes(start + len(forward))}

    return body


def _full_linear(kind):
    """The whole layer's output and gradients on the checks' inputs."""
    in_f, out_f, _, _ = LAYERS[kind]
    full = make_linear(in_f, out_f)
    x = activations(in_f).requires_grad_()
    y = full(x)
    y.backward(activations(out_f, seed=2))
    return full, y.detach(), x.grad


def _check_linear(kind, fn):
    """One kind of layer on every world size: shard, output, gradients, collectives per
    pass, storage."""
    _, _, dim, collectives = LAYERS[kind]
    full, y, x_grad = _full_linear(kind)
    for t in WORLD_SIZES:
        run = simulate(_cluster(), _linear_body(kind, fn), t,
                       lambda rank, t=t: f"{kind} layer, {_where(t)}")
        for rank, result in enumerate(run.results):
            at = f"{kind} layer, {_where(t)}: rank {rank}"
            own = _shard(full.weight.shape[dim], rank, t)
            index = (own, slice(None)) if dim == 0 else (slice(None), own)
            weight, bias = full.weight.detach()[index], full.bias.detach()
            if kind == "column":
                bias = bias[own]
            _compare(f"{at}: the weight", weight, result["weight"], SHARD_HINTS[kind])
            _compare(f"{at}: the bias", bias, result["bias"], SHARD_HINTS[kind])
            expected = y[..., own] if kind == "column" else y
            got = result["out"]
            if kind == "row" and t > 1 and got.shape == expected.shape \
                    and torch.allclose(got - expected, (t - 1) * full.bias.detach(),
                                       atol=1e-4):
                raise Failure(f"{at}: the output holds the bias {t} times", BIAS_TWICE)
            _compare(f"{at}: the output", expected, got, FORWARD_HINTS[kind], _close)
            if result["weight_grad"] is None or result["bias_grad"] is None:
                raise Failure(f"{at}: the weight or bias has no gradient after backward",
                              "the forward must use self.weight and self.bias.")
            expected = x_grad if kind == "column" else x_grad[..., own]
            why = ("x.grad must be the whole input's gradient on every rank: each rank's "
                   "rows give only a part of it, and CopyToTP's backward sums them."
                   if kind == "column" else FORWARD_HINTS[kind])
            _compare(f"{at}: x.grad", expected, result["x_grad"], why, _close)
            bias_grad = full.bias.grad if kind == "row" else full.bias.grad[own]
            _compare(f"{at}: weight.grad", full.weight.grad[index], result["weight_grad"],
                     FORWARD_HINTS[kind], _close)
            _compare(f"{at}: bias.grad", bias_grad, result["bias_grad"],
                     FORWARD_HINTS[kind], _close)
            for phase, want in collectives.items():
                if result[phase] != want:
                    raise Failure(f"{at}: {phase} called {_called(result[phase])}; a {kind}-"
                                  f"parallel layer needs {_called(want)} there",
                                  FORWARD_HINTS[kind])
            shard_bytes = (weight.numel() + bias.numel()) * FLOAT_BYTES
            if result["stored"] > shard_bytes:
                raise Failure(f"{at}: the layer's parameters keep {result['stored']} bytes "
                              f"of storage alive; its shard is {shard_bytes} bytes",
                              COPY_HINT)


@check("parallel linear layers")
def check_parallel_linears(column_parallel_linear, row_parallel_linear):
    """``column_parallel_linear(full_linear, rank, world_size)`` and
    ``row_parallel_linear(...)``: each rank's layer from its shard; the shards, outputs
    and gradients compared with the whole ``nn.Linear``, collectives counted per pass."""
    ref = _reference()
    refuse_reference(column_parallel_linear, ref.column_parallel_linear)
    refuse_reference(row_parallel_linear, ref.row_parallel_linear)
    _check_linear("column", column_parallel_linear)
    _check_linear("row", row_parallel_linear)
    return (f"shards, outputs and gradients equal nn.Linear({HIDDEN}, {2 * HIDDEN}) "
            f"column-parallel and nn.Linear({2 * HIDDEN}, {HIDDEN}) row-parallel, on world "
            f"sizes {listed(WORLD_SIZES)}")


# ------------------------------------------------------- exercise 3: the MLP


def _mlp_gradients(layers):
    """``{name: gradient}`` of fc1 and fc2 of a module (the learner's) or Sequential."""
    return {f"{name}.{p}": getattr(layer, p).grad
            for name, layer in zip(("fc1", "fc2"), layers) for p in ("weight", "bias")}


def _layers(model, at):
    layers = [getattr(model, name, None) for name in ("fc1", "fc2")]
    if any(layer is None for layer in layers):
        raise Failure(f"{at}: the model has no `fc1` and `fc2`",
                      "keep the names: self.fc1 (column-parallel), self.fc2 (row-parallel).")
    for name, layer in zip(("fc1", "fc2"), layers):
        _parameters(layer, f"{at}: {name}")
    return layers


def _mlp_body(cls):
    def body():
        rank, t = dist.get_rank(), dist.get_world_size()
        model = cls(make_mlp(), rank, t)
        layers = _layers(model, f"{_where(t)}: rank {rank}")
        x = activations().requires_grad_()
        start = len(sc.collectives_called())
        y = model(x)
        forward = _passes(start)
        y.backward(activations(seed=2))
        return {"out": y.detach().clone(), "x_grad": x.grad,
                "grads": _mlp_gradients(layers),
                "forward": forward, "backward": _passes(start + len(forward))}

    return body


def _full_mlp():
    full = make_mlp()
    x = activations().requires_grad_()
    y = full(x)
    y.backward(activations(seed=2))
    return y.detach(), x.grad, _mlp_gradients((full[0], full[2]))


def _expected_shard(name, full_grad, rank, t):
    """The slice of the whole MLP's gradient that rank ``rank`` holds."""
    if name.startswith("fc1"):
        return full_grad[_shard(full_grad.shape[0], rank, t)]
    if name == "fc2.weight":
        return full_grad[:, _shard(full_grad.shape[1], rank, t)]
    return full_grad


def _no_gradient(at, x_grad):
    if x_grad is None:
        raise Failure(f"{at}: x.grad is None after backward",
                      "the output lost its autograd path back to x: torch.distributed's "
                      "collectives are not differentiable, so inside forward only your "
                      "autograd Functions may communicate.")


MLP_HINT = ("the first linear of full_mlp must be column-parallel and the last row-"
            "parallel, built with your exercise 2 functions, and GeLU applied between "
            "them: it acts on each rank's own columns, so nothing needs to move between the "
            "layers. " + hint.pointer("mlp"))
ONE_EACH = ("column-parallel first, then row-parallel: the only all-reduce in forward is "
            "ReduceFromTP after fc2, the only one in backward is CopyToTP's before fc1. "
            "Nothing between the layers: no gather, no extra CopyToTP or ReduceFromTP.")


@check("Megatron MLP")
def check_megatron_mlp(cls):
    """``cls(full_mlp, rank, world_size)``: output, input gradient and every shard's
    gradient equal the single-process MLP's; exactly one all-reduce of the b·s·h
    activation in forward and one in backward (``run.collectives``)."""
    refuse_reference(cls, _reference().MegatronMLP, "class")
    y, x_grad, grads = _full_mlp()
    activation = SEQUENCE * BATCH * HIDDEN * FLOAT_BYTES
    for t in WORLD_SIZES:
        run = simulate(_cluster(), _mlp_body(cls), t, lambda rank, t=t: _where(t),
                       accounting=True)
        for rank, result in enumerate(run.results):
            at = f"{_where(t)}: rank {rank}"
            _compare(f"{at}: the output", y, result["out"], MLP_HINT, _close)
            _no_gradient(at, result["x_grad"])
            _compare(f"{at}: x.grad", x_grad, result["x_grad"], MLP_HINT, _close)
            for name, got in result["grads"].items():
                _compare(f"{at}: {name}.grad", _expected_shard(name, grads[name], rank, t),
                         got, MLP_HINT, _close)
            for phase in ("forward", "backward"):
                if result[phase] != ["all_reduce"]:
                    raise Failure(f"{at}: {phase} called {_called(result[phase])}; the "
                                  "Megatron MLP needs exactly one all_reduce", ONE_EACH)
        sizes = [c.nbytes for c in run.collectives]
        if sizes != [activation, activation]:
            raise Failure(f"{_where(t)}: the all-reduces carry {listed(sizes)} bytes; each "
                          f"should carry the {SEQUENCE}×{BATCH}×{HIDDEN} activation, "
                          f"{activation} bytes", ONE_EACH)
    return (f"outputs and gradients equal the single-process MLP's with one all-reduce of "
            f"{activation} bytes per pass, on world sizes {listed(WORLD_SIZES)}")


# ----------------------------------------------- exercise 4: sequence parallelism


SEQUENCE_OPERATORS = {
    # name: (forward, backward); "gather": concatenate along dim 0, "scatter": this rank's
    # rows of the sum
    "GatherFromSequence": ("gather", "scatter"),
    "ScatterToSequence": ("scatter", "gather"),
}
SEQUENCE_HINTS = {
    "gather": "this pass must all-gather along dim 0: every rank's rows, in rank order, in "
              "one output of t times the rows, from one collective. "
              + hint.pointer("sequence"),
    "scatter": "this pass must reduce-scatter along dim 0: the sum over the ranks, of which "
               "this rank keeps its own 1/t of the rows, from one collective. "
               + hint.pointer("sequence"),
}
ROWS = 3   # rows of a sequence shard in the operators' own test
# Parameters that act on this rank's positions only: their gradients are partial sums.
PARTIAL = ("norm.weight", "norm.bias", "fc2.bias")


def _sequence_operator_body(op, kind):
    def body():
        rank, t = dist.get_rank(), dist.get_world_size()
        rows = ROWS if kind == "gather" else ROWS * t
        seed = 7_000 * t + 10 * rank
        x = _integers((rows, 2), seed).requires_grad_()
        x_before = x.detach().clone()
        grad_rows = ROWS * t if kind == "gather" else ROWS
        grad = _integers((grad_rows, 2), seed + 5)
        grad_before = grad.clone()
        start = len(sc.collectives_called())
        y = op.apply(x)
        forward = _passes(start)
        out = y.detach().clone() if isinstance(y, torch.Tensor) else y
        if isinstance(y, torch.Tensor) and y.requires_grad and y.shape == grad.shape:
            y.backward(grad)
        return {"x": x_before, "grad": grad_before, "out": out, "x_grad": x.grad,
                "changed": not (torch.equal(x.detach(), x_before)
                                and torch.equal(grad, grad_before)),
                "forward": forward, "backward": _passes(start + len(forward))}

    return body


def _sequence_expected(kind, tensors, rank, t):
    if kind == "gather":
        return torch.cat(tensors)
    return sum(tensors)[_shard(ROWS * t, rank, t)]


def _check_sequence_operator(name, op):
    forward, backward = SEQUENCE_OPERATORS[name]
    for t in WORLD_SIZES:
        run = simulate(_cluster(), _sequence_operator_body(op, forward), t,
                       lambda rank, t=t: f"{name}, {_where(t)}")
        xs = [r["x"] for r in run.results]
        grads = [r["grad"] for r in run.results]
        for rank, result in enumerate(run.results):
            at = f"{name}, {_where(t)}: rank {rank}"
            _compare(f"{at}: the forward output", _sequence_expected(forward, xs, rank, t),
                     result["out"], SEQUENCE_HINTS[forward])
            _compare(f"{at}: x.grad", _sequence_expected(backward, grads, rank, t),
                     result["x_grad"], SEQUENCE_HINTS[backward])
            if result["changed"]:
                raise Failure(f"{at}: a tensor it was handed changed", IN_PLACE)
            for phase, kind in (("forward", forward), ("backward", backward)):
                if len(result[phase]) != 1:
                    raise Failure(f"{at}: {phase} called {_called(result[phase])}; it needs "
                                  "exactly one collective", SEQUENCE_HINTS[kind])


def _sequence_body(cls):
    def body():
        rank, t = dist.get_rank(), dist.get_world_size()
        model = cls(Block(), rank, t)
        at = f"{_where(t)}: rank {rank}"
        norm = getattr(model, "norm", None)
        if not isinstance(norm, nn.LayerNorm):
            raise Failure(f"{at}: the block has no LayerNorm `norm`",
                          "keep the __init__ given above.")
        layers = _layers(model, at)
        rows = []
        norm.register_forward_pre_hook(lambda module, args: rows.append(args[0].shape[0]))
        own = _shard(SEQUENCE, rank, t)
        x = activations()[own].clone().requires_grad_()
        start = len(sc.collectives_called())
        y = model(x)
        forward = _passes(start)
        y.backward(activations(seed=2)[own])
        grads = {**_mlp_gradients(layers), "norm.weight": norm.weight.grad,
                 "norm.bias": norm.bias.grad}
        return {"out": y.detach().clone(), "x_grad": x.grad, "grads": grads,
                "norm_rows": rows, "forward": forward,
                "backward": _passes(start + len(forward))}

    return body


def _full_block():
    full = Block()
    x = activations().requires_grad_()
    y = full(x)
    y.backward(activations(seed=2))
    grads = {**_mlp_gradients((full.mlp[0], full.mlp[2])), "norm.weight": full.norm.weight
             .grad, "norm.bias": full.norm.bias.grad}
    return y.detach(), x.grad, grads


BLOCK_HINT = ("the block must normalize its own rows, gather the sequence before the "
              "column-parallel product, scatter the row-parallel partial sums back to its "
              "rows, and only then add fc2's bias and the residual; the shards' own "
              "forwards would add f and g on top. " + hint.pointer("sequence"))
NORM_ROWS_HINT = ("apply self.norm to x, this rank's rows, BEFORE GatherFromSequence: "
                  "sequence parallelism exists to run LayerNorm (and dropout, and the "
                  "residual) on s/t positions, with 1/t of their activations.")
BYTES_HINT = ("an all-reduce sends 2(t-1)/t of the tensor per rank; an all-gather or a "
              "reduce-scatter (t-1)/t. Sequence parallelism replaces each all-reduce by one "
              "of each, for the same bytes: no all_reduce and no extra collective.")


def _traffic_per_rank(run, t):
    sent = [0.0] * t
    for (src, _), nbytes in run.traffic.items():
        sent[src] += nbytes
    return sent


@check("sequence parallelism")
def check_sequence_parallel(gather_from_sequence, scatter_to_sequence, block_cls):
    """The two sequence-parallel operators (values both ways, one collective per pass),
    then ``block_cls(full_block, rank, world_size)`` on this rank's 1/t of the sequence:
    output and gradients equal the whole block's, LayerNorm on s/t rows, and bytes sent
    per rank no more than the two all-reduces it replaces."""
    ref = _reference()
    refuse_reference(gather_from_sequence, ref.GatherFromSequence, "class")
    refuse_reference(scatter_to_sequence, ref.ScatterToSequence, "class")
    refuse_reference(block_cls, ref.SequenceParallelBlock, "class")
    _check_sequence_operator("GatherFromSequence", gather_from_sequence)
    _check_sequence_operator("ScatterToSequence", scatter_to_sequence)
    y, x_grad, grads = _full_block()
    activation = SEQUENCE * BATCH * HIDDEN * FLOAT_BYTES
    for t in WORLD_SIZES:
        where = f"block, {_where(t)}"
        run = simulate(_cluster(), _sequence_body(block_cls), t, lambda rank: where,
                       accounting=True)
        results = run.results
        for rank, result in enumerate(results):
            at = f"{where}: rank {rank}"
            if result["norm_rows"] != [SEQUENCE // t]:
                raise Failure(f"{at}: LayerNorm ran on {listed(result['norm_rows'])} "
                              f"positions; with sequence parallelism each rank normalizes "
                              f"its own {SEQUENCE // t}", NORM_ROWS_HINT)
            own = _shard(SEQUENCE, rank, t)
            _compare(f"{at}: the output", y[own], result["out"], BLOCK_HINT, _close)
            _no_gradient(at, result["x_grad"])
            _compare(f"{at}: x.grad", x_grad[own], result["x_grad"], BLOCK_HINT, _close)
            for name, got in result["grads"].items():
                if name not in PARTIAL:
                    _compare(f"{at}: {name}.grad",
                             _expected_shard(name, grads[name], rank, t), got, BLOCK_HINT,
                             _close)
        for name in PARTIAL:
            got = [r["grads"][name] for r in results]
            if any(g is None for g in got):
                raise Failure(f"{where}: {name} has no gradient", NORM_ROWS_HINT)
            _compare(f"{where}: {name}.grad summed over the ranks", grads[name], sum(got),
                     BLOCK_HINT, _close)
        sent = _traffic_per_rank(run, t)
        target = 4 * (t - 1) / t * activation
        worst = max(range(t), key=lambda r: sent[r])
        if sent[worst] > target * TOLERANCE["bytes"]:
            raise Failure(f"{where}: rank {worst} sent {num(sent[worst])} bytes; the two "
                          f"all-reduces it replaces send 4(t-1)/t × {activation} = "
                          f"{num(target)}", BYTES_HINT)
        for phase in ("forward", "backward"):
            names = results[0][phase]
            if t > 1 and ("all_reduce" in names or len(names) != 2):
                raise Failure(f"{where}: rank 0's {phase} called {_called(names)}; "
                              "sequence parallelism needs one all-gather and one "
                              "reduce-scatter", BYTES_HINT)
    return (f"operators, outputs and gradients right, LayerNorm on s/t positions, "
            f"4(t-1)/t × {activation} bytes sent per rank (as the all-reduces), on world "
            f"sizes {listed(WORLD_SIZES)}")
