"""Lab 06's checks (tensor and sequence parallelism): every check passes the reference
answer, refuses the reference itself, and reports each mistake the lab is about —
including ones that deadlock or raise — as one exact ❌ line."""

import subprocess
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from _check_helpers import learner_namespace, line, not_started
from workbook import checking
from workbook.lesson06_tensor_parallel import checks
from workbook.lesson06_tensor_parallel import _reference as R

NAMES = {checks.check_conjugate_operators: "conjugate operators f and g",
         checks.check_parallel_linears: "parallel linear layers",
         checks.check_megatron_mlp: "Megatron MLP",
         checks.check_sequence_parallel: "sequence parallelism"}   # as each check prints it
OPERATORS, LINEARS, MLP, SEQUENCE = (f"❌ {name}: " for name in NAMES.values())

MINE = learner_namespace(R, R.CopyToTP, R.ReduceFromTP, R.ColumnParallelLinear,
                         R.RowParallelLinear, R.column_parallel_linear,
                         R.row_parallel_linear, R.MegatronMLP, R.GatherFromSequence,
                         R.ScatterToSequence, R.SequenceParallelBlock)
CopyToTP, ReduceFromTP = MINE["CopyToTP"], MINE["ReduceFromTP"]
ColumnParallelLinear, RowParallelLinear = (MINE["ColumnParallelLinear"],
                                           MINE["RowParallelLinear"])
column_parallel_linear, row_parallel_linear = (MINE["column_parallel_linear"],
                                               MINE["row_parallel_linear"])
MegatronMLP = MINE["MegatronMLP"]
GatherFromSequence, ScatterToSequence = (MINE["GatherFromSequence"],
                                         MINE["ScatterToSequence"])
SequenceParallelBlock = MINE["SequenceParallelBlock"]
SEQUENCE_ANSWER = (GatherFromSequence, ScatterToSequence, SequenceParallelBlock)

EXCEPTION = " — Hint: " + checking.HINTS["exception"]
RETURNED = (" — Hint: rank 1 returned while others wait in a collective: every rank of a "
            "group must call each of its collectives.")


def expect(capsys, check, answers, message):
    assert line(capsys, check, *answers)[1] == message


# ------------------------------------------------------------ the reference passes


@pytest.mark.parametrize("check, answers, text", [
    (checks.check_conjugate_operators, (CopyToTP, ReduceFromTP),
     "values and gradients right, one all-reduce in the right pass, inputs left alone, on "
     "world sizes 1, 2, 3, 4, 6, 8, shapes (5,), (3, 4)"),
    (checks.check_parallel_linears, (column_parallel_linear, row_parallel_linear),
     "shards, outputs and gradients equal nn.Linear(24, 48) column-parallel and "
     "nn.Linear(48, 24) row-parallel, on world sizes 1, 2, 3, 4, 6, 8"),
    (checks.check_megatron_mlp, (MegatronMLP,),
     "outputs and gradients equal the single-process MLP's with one all-reduce of 4608 "
     "bytes per pass, on world sizes 1, 2, 3, 4, 6, 8"),
    (checks.check_sequence_parallel, SEQUENCE_ANSWER,
     "operators, outputs and gradients right, LayerNorm on s/t positions, 4(t-1)/t × 4608 "
     "bytes sent per rank (as the all-reduces), on world sizes 1, 2, 3, 4, 6, 8"),
])
def test_reference_passes(capsys, check, answers, text):
    expect(capsys, check, answers, f"✅ {NAMES[check]}: {text}")


REFERENCE = " is the workbook's own reference answer, not yours — Hint: the exercise is to " \
            "write it yourself, in the cell above."


@pytest.mark.parametrize("check, answers, what", [
    (checks.check_conjugate_operators, (R.CopyToTP, ReduceFromTP), "class"),
    (checks.check_conjugate_operators, (CopyToTP, R.ReduceFromTP), "class"),
    (checks.check_parallel_linears, (R.column_parallel_linear, row_parallel_linear),
     "function"),
    (checks.check_parallel_linears, (column_parallel_linear, R.row_parallel_linear),
     "function"),
    (checks.check_megatron_mlp, (R.MegatronMLP,), "class"),
    (checks.check_sequence_parallel,
     (R.GatherFromSequence, ScatterToSequence, SequenceParallelBlock), "class"),
    (checks.check_sequence_parallel,
     (GatherFromSequence, R.ScatterToSequence, SequenceParallelBlock), "class"),
    (checks.check_sequence_parallel,
     (GatherFromSequence, ScatterToSequence, R.SequenceParallelBlock), "class"),
])
def test_the_reference_itself_is_refused(capsys, check, answers, what):
    expect(capsys, check, answers, f"❌ {NAMES[check]}: this {what}{REFERENCE}")


class SubclassOfTheReference(R.CopyToTP):
    pass


def test_a_subclass_of_the_reference_operator_is_refused(capsys):
    expect(capsys, checks.check_conjugate_operators, (SubclassOfTheReference, ReduceFromTP),
           f"❌ {NAMES[checks.check_conjugate_operators]}: this class{REFERENCE}")


def test_what_the_lab_imports_holds_no_answer():
    """The lab imports its checks, workbook.quiz and the lab's models: none of
    them may load the reference answers."""
    code = ("import sys, workbook.quiz, workbook.lesson06_tensor_parallel.checks, workbook.lesson06_tensor_parallel.lab; "
            "print('workbook.lesson06_tensor_parallel._reference' in sys.modules)")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            check=True)
    assert result.stdout.strip() == "False"


def test_an_unwritten_exercise_says_so(capsys):
    class Unwritten(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            raise NotImplementedError("f is the identity in forward: return x")

        @staticmethod
        def backward(ctx, grad):
            raise NotImplementedError("sum the gradient over the ranks")

    not_started(capsys, checks.check_conjugate_operators, (Unwritten, ReduceFromTP),
                NAMES[checks.check_conjugate_operators], "f is the identity in forward: return x")


# ------------------------------------------------------- exercise 1: f and g


def _function(forward, backward):
    """An autograd Function with the given static forward and backward."""
    return type("Learners", (torch.autograd.Function,),
                {"forward": staticmethod(forward), "backward": staticmethod(backward)})


def _summed(x):
    x = x.clone()
    dist.all_reduce(x)
    return x


def _identity(ctx, tensor):
    return tensor


def _rank_0_sums(ctx, grad):
    grad = grad.clone()
    if dist.get_rank() == 0:
        dist.all_reduce(grad)
    return grad


def _sums_in_place(ctx, tensor):
    dist.all_reduce(tensor)
    return tensor


Copy_sums_in_forward = _function(lambda ctx, x: _summed(x), _identity)
Copy_forgets_the_sum = _function(_identity, _identity)
Copy_sums_the_gradient_in_place = _function(_identity, _sums_in_place)
Copy_sums_on_rank_0_only = _function(_identity, _rank_0_sums)
Reduce_averages = _function(lambda ctx, x: _summed(x) / dist.get_world_size(), _identity)
Reduce_avg_op = _function(
    lambda ctx, x: dist.all_reduce(y := x.clone(), op=dist.ReduceOp.AVG) or y, _identity)
Reduce_in_place = _function(_sums_in_place, _identity)
Reduce_sums_in_backward = _function(lambda ctx, x: _summed(x),
                                    lambda ctx, grad: _summed(grad))
Reduce_returns_what_all_reduce_returns = _function(
    lambda ctx, x: dist.all_reduce(x.clone()), _identity)
Reduce_waits_on_none = _function(lambda ctx, x: dist.all_reduce(x.clone()).wait(),
                                 _identity)

F_IDENTITY = ("CopyToTP (f) is the identity in forward: return x as it is; its all-reduce "
              "belongs in backward.")
NO_DIVIDE = ("no divide: the ranks hold parts of one sum (partial outputs of a row-parallel "
             "layer, partial input gradients of a column-parallel one), so the sum is the "
             "answer: dist.all_reduce with the default op, SUM.")
IN_PLACE = ("collectives write into the tensor they are given: communicate a copy, never the "
            "tensor you were handed — on a real model the caller still uses it (a residual "
            "branch, another layer's gradient).")


@pytest.mark.parametrize("answers, message", [
    ((Copy_sums_in_forward, ReduceFromTP), "CopyToTP, world size 1, shape (5,): rank 0: "
     "forward called all_reduce; CopyToTP needs none there — Hint: " + F_IDENTITY),
    ((Copy_forgets_the_sum, ReduceFromTP), "CopyToTP, world size 1, shape (5,): rank 0: "
     "backward called none; CopyToTP needs all_reduce there — Hint: CopyToTP's backward "
     "must all-reduce the gradient: every rank's column shard contributed a part of the "
     "input's gradient."),
    ((Copy_sums_the_gradient_in_place, ReduceFromTP), "CopyToTP, world size 2, shape (5,): "
     "rank 0: backward changed the incoming gradient in place — Hint: " + IN_PLACE),
    ((CopyToTP, Reduce_averages), "ReduceFromTP, world size 2, shape (5,): rank 0: the "
     "forward output is the mean over the 2 ranks, expected their sum — Hint: " + NO_DIVIDE),
    ((CopyToTP, Reduce_avg_op), "ReduceFromTP, world size 2, shape (5,): rank 0: the "
     "forward output is the mean over the 2 ranks, expected their sum — Hint: " + NO_DIVIDE),
    ((CopyToTP, Reduce_in_place), "ReduceFromTP, world size 2, shape (5,): rank 0: forward "
     "changed its input x in place — Hint: " + IN_PLACE),
    ((CopyToTP, Reduce_sums_in_backward), "ReduceFromTP, world size 1, shape (5,): rank 0: "
     "backward called all_reduce; ReduceFromTP needs none there — Hint: ReduceFromTP (g) is "
     "the identity in backward: the gradient of a sum with respect to each of its terms is "
     "the gradient itself; return it as it is."),
    ((CopyToTP, Reduce_returns_what_all_reduce_returns), "ReduceFromTP, world size 1, shape "
     "(5,): rank 0: the forward output is NoneType, expected a tensor of shape (5,) — Hint: "
     "ReduceFromTP is the sum over the ranks in forward and the identity in backward. "
     "more help: checks.hint('operators')"),
    ((CopyToTP, Reduce_waits_on_none), "ReduceFromTP, world size 1, shape (5,): rank 0 "
     "raised AttributeError: 'NoneType' object has no attribute 'wait'" + EXCEPTION),
    ((Copy_sums_on_rank_0_only, ReduceFromTP), "CopyToTP, world size 2, shape (5,): "
     "deadlock (rank 0: all_reduce #0 on group WORLD; rank 1: returned)" + RETURNED),
])
def test_operator_mistakes(capsys, short_timeout, answers, message):
    expect(capsys, checks.check_conjugate_operators, answers, OPERATORS + message)


def test_the_sum_in_the_identity_pass_is_named_past_world_size_1(capsys, monkeypatch):
    """With t = 1 a sum changes no value; from t = 2 on the check says what came out."""
    from workbook.lesson06_tensor_parallel import checks as lesson

    monkeypatch.setattr(lesson, "WORLD_SIZES", (2,))
    expect(capsys, checks.check_conjugate_operators, (Copy_sums_in_forward, ReduceFromTP),
           OPERATORS + "CopyToTP, world size 2, shape (5,): rank 0: the forward output is "
           "the sum over the ranks, expected this rank's own tensor unchanged — Hint: "
           + F_IDENTITY)
    expect(capsys, checks.check_conjugate_operators, (Copy_forgets_the_sum, ReduceFromTP),
           OPERATORS + "CopyToTP, world size 2, shape (5,): rank 0: x.grad is this rank's "
           "own tensor, expected the sum over the ranks — Hint: CopyToTP's backward must "
           "all-reduce the gradient: every rank's column shard contributed a part of the "
           "input's gradient.")


# --------------------------------------------------- exercise 2: the two linears


class RowBiasOnEveryRank(RowParallelLinear):
    def forward(self, x):
        return ReduceFromTP.apply(F.linear(x, self.weight, self.bias))


class ColumnWithoutCopy(ColumnParallelLinear):
    def forward(self, x):
        return F.linear(x, self.weight, self.bias)


def _rebuilt(cls, build):
    def build_as(full, rank, world_size):
        layer = build(full, rank, world_size)
        return cls(layer.weight.detach(), layer.bias.detach())
    return build_as


def column_splits_the_inputs(full, rank, world_size):
    n = full.in_features // world_size
    own = slice(rank * n, (rank + 1) * n)
    return ColumnParallelLinear(full.weight.detach()[:, own].clone(),
                                full.bias.detach()[own].clone())


def column_keeps_views(full, rank, world_size):
    n = full.out_features // world_size
    own = slice(rank * n, (rank + 1) * n)
    return ColumnParallelLinear(full.weight.detach()[own], full.bias.detach()[own])


def row_slices_the_bias(full, rank, world_size):
    n = full.in_features // world_size
    own = slice(rank * n, (rank + 1) * n)
    return RowParallelLinear(full.weight.detach()[:, own].clone(),
                             full.bias.detach()[own].clone())


def returns_the_full_layer(full, rank, world_size):
    return full


def returns_the_weight(full, rank, world_size):
    return column_parallel_linear(full, rank, world_size).weight


class ColumnDetachesItsWeight(ColumnParallelLinear):
    def forward(self, x):
        return F.linear(CopyToTP.apply(x), self.weight.detach(), self.bias)


COLUMN_FORWARD = ("a column-parallel layer passes its input through CopyToTP, then computes its "
                  "slice of the output features with its weight and bias. more help: "
                  "checks.hint('linears')")


@pytest.mark.parametrize("answers, message", [
    ((column_parallel_linear, _rebuilt(RowBiasOnEveryRank, row_parallel_linear)),
     "row layer, world size 2: rank 0: the output holds the bias 2 times — Hint: the bias "
     "went into the sum on every rank, so the output holds it t times: add self.bias after "
     "ReduceFromTP, not inside F.linear before it."),
    ((_rebuilt(ColumnWithoutCopy, column_parallel_linear), row_parallel_linear),
     "column layer, world size 1: rank 0: backward called none; a column-parallel layer "
     "needs all_reduce there — Hint: " + COLUMN_FORWARD),
    ((column_keeps_views, row_parallel_linear), "column layer, world size 2: rank 0: the "
     "layer's parameters keep 4800 bytes of storage alive; its shard is 2400 bytes — Hint: "
     "the shard is a view of the full weight, and a view keeps the whole full weight's "
     "storage alive on every rank: copy the slice, since the point of tensor parallelism is "
     "that a rank stores only its 1/t. more help: checks.hint('linears')"),
    ((returns_the_full_layer, row_parallel_linear), "column layer, world size 1: rank 0: "
     "backward called none; a column-parallel layer needs all_reduce there — Hint: "
     + COLUMN_FORWARD),
    ((returns_the_weight, row_parallel_linear), "column layer, world size 1: rank 0: "
     "returned Parameter, expected an nn.Module — Hint: return a layer of the class given "
     "above, built from this rank's slices. more help: checks.hint('linears')"),
    ((_rebuilt(ColumnDetachesItsWeight, column_parallel_linear), row_parallel_linear),
     "column layer, world size 1: rank 0: the weight or bias has no gradient after "
     "backward — Hint: the forward must use self.weight and self.bias."),
    ((column_splits_the_inputs, row_parallel_linear), "column layer, world size 1: rank 0 "
     "raised RuntimeError: The expanded size of the tensor (48) must match the existing "
     "size (24) at non-singleton dimension 1.  Target sizes: [48, 48].  Tensor sizes…"
     + EXCEPTION),
    ((column_parallel_linear, row_slices_the_bias), "row layer, world size 2: rank 1 raised "
     "RuntimeError: The size of tensor a (24) must match the size of tensor b (0) at "
     "non-singleton dimension 2" + EXCEPTION),
])
def test_parallel_linear_mistakes(capsys, answers, message):
    expect(capsys, checks.check_parallel_linears, answers, LINEARS + message)


def test_a_column_layer_without_copy_has_a_partial_input_gradient(capsys, monkeypatch):
    from workbook.lesson06_tensor_parallel import checks as lesson

    monkeypatch.setattr(lesson, "WORLD_SIZES", (2,))
    _, text = line(capsys, checks.check_parallel_linears,
                   _rebuilt(ColumnWithoutCopy, column_parallel_linear), row_parallel_linear)
    assert text.startswith(LINEARS + "column layer, world size 2: rank 0: x.grad: element 0")
    assert text.endswith("— Hint: x.grad must be the whole input's gradient on every rank: "
                         "each rank's rows give only a part of it, and CopyToTP's backward "
                         "sums them.")


# ------------------------------------------------------- exercise 3: the MLP


class BroadcastsTheInputFirst(MegatronMLP):
    def forward(self, x):
        x = x.clone()
        dist.broadcast(x, 0)
        return super().forward(x)


class CopiesAgainBeforeFc2(MegatronMLP):
    def forward(self, x):
        return self.fc2(CopyToTP.apply(F.gelu(self.fc1(x))))


class RowParallelFirst(MegatronMLP):
    def __init__(self, full_mlp, rank, world_size):
        nn.Module.__init__(self)
        self.fc1 = row_parallel_linear(full_mlp[0], rank, world_size)
        self.fc2 = column_parallel_linear(full_mlp[2], rank, world_size)


class GathersBetweenTheLayers(nn.Module):
    """dist.all_gather is not differentiable: fc1 drops out of the graph."""

    def __init__(self, full_mlp, rank, world_size):
        super().__init__()
        self.fc1 = column_parallel_linear(full_mlp[0], rank, world_size)
        self.fc2 = full_mlp[2]

    def forward(self, x):
        h = F.gelu(self.fc1(x))
        parts = [torch.empty_like(h) for _ in range(dist.get_world_size())]
        dist.all_gather(parts, h)
        return self.fc2(torch.cat(parts, dim=-1))


class Rank0AloneReduces(MegatronMLP):
    def forward(self, x):
        h = F.gelu(self.fc1(x))
        if dist.get_rank() == 0:
            return self.fc2(h)
        return F.linear(h, self.fc2.weight) + self.fc2.bias


class NamesItsLayersDifferently(nn.Module):
    def __init__(self, full_mlp, rank, world_size):
        super().__init__()
        self.up = column_parallel_linear(full_mlp[0], rank, world_size)
        self.down = row_parallel_linear(full_mlp[2], rank, world_size)

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


ONE_EACH = ("column-parallel first, then row-parallel: the only all-reduce in forward is "
            "ReduceFromTP after fc2, the only one in backward is CopyToTP's before fc1. "
            "Nothing between the layers: no gather, no extra CopyToTP or ReduceFromTP.")


@pytest.mark.parametrize("answer, message", [
    (BroadcastsTheInputFirst, "world size 1: rank 0: forward called broadcast, all_reduce; "
     "the Megatron MLP needs exactly one all_reduce — Hint: " + ONE_EACH),
    (CopiesAgainBeforeFc2, "world size 1: rank 0: backward called all_reduce, all_reduce; "
     "the Megatron MLP needs exactly one all_reduce — Hint: " + ONE_EACH),
    (RowParallelFirst, "world size 1: the all-reduces carry 18432, 18432 bytes; each should "
     "carry the 24×2×24 activation, 4608 bytes — Hint: " + ONE_EACH),
    (GathersBetweenTheLayers, "world size 1: rank 0: x.grad is None after backward — Hint: "
     "the output lost its autograd path back to x: torch.distributed's collectives are not "
     "differentiable, so inside forward only your autograd Functions may communicate."),
    (NamesItsLayersDifferently, "world size 1: rank 0: the model has no `fc1` and `fc2` — "
     "Hint: keep the names: self.fc1 (column-parallel), self.fc2 (row-parallel)."),
    (Rank0AloneReduces, "world size 2: deadlock (rank 0: all_reduce #1 on group WORLD; "
     "rank 1: returned)" + RETURNED),
])
def test_megatron_mlp_mistakes(capsys, short_timeout, answer, message):
    expect(capsys, checks.check_megatron_mlp, (answer,), MLP + message)


# ----------------------------------------------- exercise 4: sequence parallelism


def _block(gather, scatter, bias_before_scatter=False, norm_after_gather=False):
    """A learner's SequenceParallelBlock on the given operators and mistakes."""

    class Block(SequenceParallelBlock):
        def forward(self, x):
            h = self.norm(gather.apply(x)) if norm_after_gather else \
                gather.apply(self.norm(x))
            h = F.gelu(F.linear(h, self.fc1.weight, self.fc1.bias))
            if bias_before_scatter:
                return x + scatter.apply(F.linear(h, self.fc2.weight, self.fc2.bias))
            return x + scatter.apply(F.linear(h, self.fc2.weight)) + self.fc2.bias

    return Block


def _rows(tensor, rank, t):
    n = tensor.shape[0] // t
    return tensor[rank * n:(rank + 1) * n]


Gather_slices_the_gradient = _function(
    lambda ctx, x: GatherFromSequence.forward(ctx, x),
    lambda ctx, grad: _rows(grad, dist.get_rank(), dist.get_world_size()))
Scatter_by_all_reduce = _function(
    lambda ctx, x: _rows(_summed(x), dist.get_rank(), dist.get_world_size()),
    lambda ctx, grad: ScatterToSequence.backward(ctx, grad))
Scatter_into_a_full_buffer = _function(
    lambda ctx, x: dist.reduce_scatter_single(out := torch.empty_like(x), x) or out,
    lambda ctx, grad: ScatterToSequence.backward(ctx, grad))


class BarrierInForward(SequenceParallelBlock):
    def forward(self, x):
        dist.barrier()
        return super().forward(x)


def _rank_0_gathers(ctx, x):
    if dist.get_rank() == 0:
        return GatherFromSequence.forward(ctx, x)
    return x.repeat(dist.get_world_size(), *([1] * (x.dim() - 1)))


Gather_on_rank_0_only = _function(_rank_0_gathers,
                                  lambda ctx, grad: GatherFromSequence.backward(ctx, grad))

BLOCK_HINT = ("the block must normalize its own rows, gather the sequence before the "
              "column-parallel product, scatter the row-parallel partial sums back to its "
              "rows, and only then add fc2's bias and the residual; the shards' own forwards "
              "would add f and g on top. more help: checks.hint('sequence')")
BYTES_HINT = ("an all-reduce sends 2(t-1)/t of the tensor per rank; an all-gather or a "
              "reduce-scatter (t-1)/t. Sequence parallelism replaces each all-reduce by one "
              "of each, for the same bytes: no all_reduce and no extra collective.")


@pytest.mark.parametrize("answers, message", [
    ((GatherFromSequence, ScatterToSequence,
      _block(GatherFromSequence, ScatterToSequence, norm_after_gather=True)),
     "block, world size 2: rank 0: LayerNorm ran on 24 positions; with sequence parallelism "
     "each rank normalizes its own 12 — Hint: apply self.norm to x, this rank's rows, BEFORE "
     "GatherFromSequence: sequence parallelism exists to run LayerNorm (and dropout, and the "
     "residual) on s/t positions, with 1/t of their activations."),
    ((Gather_slices_the_gradient, ScatterToSequence,
      _block(Gather_slices_the_gradient, ScatterToSequence)),
     "GatherFromSequence, world size 1: rank 0: backward called none; it needs exactly one "
     "collective — Hint: this pass must reduce-scatter along dim 0: the sum over the ranks, "
     "of which this rank keeps its own 1/t of the rows, from one collective. more help: "
     "checks.hint('sequence')"),
    ((GatherFromSequence, Scatter_by_all_reduce,
      _block(GatherFromSequence, Scatter_by_all_reduce)),
     "block, world size 2: rank 0 sent 11520 bytes; the two all-reduces it replaces send "
     "4(t-1)/t × 4608 = 9216 — Hint: " + BYTES_HINT),
    ((GatherFromSequence, ScatterToSequence, BarrierInForward),
     "block, world size 2: rank 0's forward called barrier, all_gather_into_tensor, "
     "reduce_scatter_tensor; sequence parallelism needs one all-gather and one "
     "reduce-scatter — Hint: " + BYTES_HINT),
    ((GatherFromSequence, ScatterToSequence,
      _block(GatherFromSequence, ScatterToSequence, bias_before_scatter=True)),
     "block, world size 2: rank 0: the output: element 0 is -1.879, expected -1.81 — Hint: "
     + BLOCK_HINT),
    ((GatherFromSequence, Scatter_into_a_full_buffer,
      _block(GatherFromSequence, Scatter_into_a_full_buffer)),
     "ScatterToSequence, world size 2: rank 0 raised ValueError: rank 0: "
     "reduce_scatter_tensor: the input (shape (6, 2), torch.float32) must hold 24 elements, "
     "got 12 (2 ranks x the output's 12; the output…" + EXCEPTION),
    ((Gather_on_rank_0_only, ScatterToSequence,
      _block(Gather_on_rank_0_only, ScatterToSequence)),
     "GatherFromSequence, world size 2: mismatch in all_gather_into_tensor #0 on group "
     "WORLD: the op differs (rank 0: all_gather_into_tensor, rank 1: reduce_scatter_tensor) "
     "— Hint: every rank must call the same collectives, in the same order, with matching "
     "arguments."),
])
def test_sequence_parallel_mistakes(capsys, short_timeout, answers, message):
    expect(capsys, checks.check_sequence_parallel, answers, SEQUENCE + message)
