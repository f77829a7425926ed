"""What each collective computes, once every rank of the group has arrived.

Each function receives the ranks' arguments as a list in group-rank order and writes the
results into the ranks' output tensors. Reductions always run in rank order
(``((x0 + x1) + x2) + ...``), which is what makes results bit-identical from run to run.

Writes go through ``.data``: collectives mutate tensors behind autograd's back, as gloo
does, and leave the autograd version counter alone (a write through ``.detach()`` bumps
it, and autograd then refuses a backward that saved the tensor as "modified by an
inplace operation", which gloo's all_reduce never causes). Where gloo itself copies the
result in with ``copy_`` after its algorithm (all_gather, gather, all_to_all and the
reduce-scatters; measured against gloo in tests/test_torch_harness.py), the counter moves
as there: :func:`_copied_in`.

Meta and fake tensors hold no data: for them only the sizes are checked, and nothing is
computed or written (a 7B model's FSDP all-gathers would otherwise run thousands of
fake copies, each costing as much Python as a real one). Either every rank passes such
tensors or none does: a mix would leave the real ranks' tensors unreduced.

Each rank's own buffers were checked when it called the operation
(:mod:`simcluster.validation`); what only shows once every rank has arrived raises
``RuntimeError`` here, and the backend reports it as a mismatch of the ranks' arguments.
"""

import torch

from ._torch_internals import is_fake, no_dispatch_mode, reduce_op_name

_FLOAT_ONLY = {"AVG"}
_INT_ONLY = {"BAND", "BOR", "BXOR"}


def check_reduce_op(op_name, dtype, rank):
    """Raise a clear error when ``op_name`` cannot reduce tensors of ``dtype``."""
    if op_name == "PREMUL_SUM":
        raise NotImplementedError(
            f"rank {rank}: ReduceOp.PREMUL_SUM is an NCCL-only op and is not simulated; "
            "multiply by the factor, then use ReduceOp.SUM.")
    floating = dtype.is_floating_point or dtype.is_complex
    if op_name in _FLOAT_ONLY and not floating:
        raise ValueError(
            f"rank {rank}: ReduceOp.{op_name} needs a floating-point tensor, got {dtype}. "
            "Use ReduceOp.SUM and divide by the world size yourself.")
    if op_name in _INT_ONLY and floating:
        raise ValueError(
            f"rank {rank}: ReduceOp.{op_name} is a bitwise op and needs an integer or bool "
            f"tensor, got {dtype}.")


def reduce_tensors(tensors, op):
    """Reduce ``tensors`` (rank order) with ``op`` into a new tensor."""
    name = reduce_op_name(op) if not isinstance(op, str) else op
    _check_data(tensors)
    out = tensors[0].detach().clone()
    for t in tensors[1:]:
        t = t.detach()
        if name in ("SUM", "AVG"):
            out.add_(t)
        elif name == "PRODUCT":
            out.mul_(t)
        elif name == "MIN":
            torch.minimum(out, t, out=out)
        elif name == "MAX":
            torch.maximum(out, t, out=out)
        elif name == "BAND":
            out.bitwise_and_(t)
        elif name == "BOR":
            out.bitwise_or_(t)
        elif name == "BXOR":
            out.bitwise_xor_(t)
        else:
            raise NotImplementedError(f"reduce op {name} is not simulated")
    if name == "AVG":
        out.div_(len(tensors))
    return out


def _no_data(tensor):
    return tensor.is_meta or is_fake(tensor)


def _check_data(tensors):
    """``tensors`` (one per rank, in rank order) all hold data, or none does.

    One tensor per rank is enough: a rank's own tensors were checked to be alike
    (:func:`simcluster.validation.check_same_device`).
    """
    empty = [r for r, t in enumerate(tensors) if _no_data(t)]
    if empty and len(empty) < len(tensors):
        full = [r for r in range(len(tensors)) if r not in empty]
        raise RuntimeError(
            f"rank {empty[0]} passes a meta or fake tensor (no data) but rank {full[0]} a "
            "real one: either every rank uses sc.fake_tensors() / device='meta' for this "
            "collective, or none does")


def _check_fits(dst, src):
    if dst.shape != src.shape:
        raise RuntimeError(f"cannot write a tensor of shape {tuple(src.shape)} into one of "
                           f"shape {tuple(dst.shape)}")


def _check_numel(output, expected):
    if output.numel() != expected:
        raise RuntimeError(f"the output has {output.numel()} elements, expected {expected}")


def _write(dst, src):
    _check_fits(dst, src)
    if _no_data(dst):
        return
    dst.data.copy_(src)


def _copied_in(tensors, copies=1):
    """Move the version counter of each of ``tensors`` as ``copies`` in-place copies into
    it would: gloo copies these results in from its own buffers."""
    for t in tensors:
        if not _no_data(t):
            for _ in range(copies):
                torch.autograd.graph.increment_version(t)


def copy_bytes(src, dst):
    """A point-to-point message as gloo delivers it: ``src``'s bytes at the start of
    ``dst``, whatever their shapes and dtypes (``dst`` holds at least as many bytes; both
    are contiguous, as validation requires). The rest of ``dst`` is left as it was."""
    if src.shape == dst.shape and src.dtype == dst.dtype:
        dst.data.copy_(src)
    elif not (_no_data(src) or _no_data(dst)):
        raw = src.detach().reshape(-1).view(torch.uint8)
        dst.data.reshape(-1).view(torch.uint8)[:raw.numel()].copy_(raw)


def all_reduce(args, op):
    """``args[r]`` is rank r's list of tensors; every rank gets the reduction of each."""
    for i in range(len(args[0])):
        _check_data([a[i] for a in args])
        if _no_data(args[0][i]):
            continue   # every rank's tensor has the same shape (checked on arrival)
        result = reduce_tensors([a[i] for a in args], op)
        for a in args:
            _write(a[i], result)


def reduce(args, op, dst):
    """Like :func:`all_reduce`, but only group rank ``dst`` receives the result."""
    for i in range(len(args[0])):
        _write(args[dst][i], reduce_tensors([a[i] for a in args], op))


def broadcast(args, src):
    """Every rank's tensors become copies of group rank ``src``'s."""
    for i in range(len(args[src])):
        _check_data([tensors[i] for tensors in args])
    for r, tensors in enumerate(args):
        if r != src:
            for dst, s in zip(tensors, args[src]):
                _write(dst, s)


def all_gather(args):
    """``args[r] = (outputs, input)``: ``outputs[j]`` on every rank gets rank j's input."""
    inputs = [inp for _, inp in args]
    _check_data(inputs)
    if _all_alike(args, inputs):
        # n copies per rank in one call, in the same order: O(n) Python on n ranks, not
        # O(n^2). Only where no dispatch mode would see the ops (it would see one op
        # instead of n): the accounting's fast path has set its mode aside here.
        inputs = [inp.detach() for inp in inputs]
        for outputs, _ in args:
            torch._foreach_copy_([out.data for out in outputs], inputs)
            torch.autograd.graph.increment_version(outputs)   # as _copied_in: all hold data
        return
    for outputs, _ in args:
        for j, (_, inp) in enumerate(args):
            _write(outputs[j], inp)
        _copied_in(outputs)


def _all_alike(args, inputs):
    """True if :func:`all_gather` may copy with ``torch._foreach_copy_``: no dispatch mode
    is on and the tensors are plain tensors with data, of one shape and dtype. Looked at
    per rank, not per tensor: the backend has checked that a rank's outputs have its
    input's shape, dtype, type and device (``validation.list_gather``)."""
    if not no_dispatch_mode():
        return False
    first = inputs[0]
    shape, dtype = first.shape, first.dtype
    return not first.is_meta and all(
        type(inp) is torch.Tensor and inp.shape == shape and inp.dtype is dtype
        and len(outputs) == len(args) and type(outputs[0]) is torch.Tensor
        and outputs[0].shape == shape and outputs[0].dtype is dtype
        for outputs, inp in args)


def all_gather_single(args):
    """``args[r] = (output, input)``: the output is every rank's input, stacked on dim 0."""
    inputs = [inp for _, inp in args]
    _check_data(inputs)
    if _no_data(inputs[0]):
        for output in (output for output, _ in args):
            _check_numel(output, len(args) * inputs[0].numel())
        return
    # Stacked once, then viewed as each output's shape: that works for any output of
    # the right size, contiguous or not, and for inputs that are views into an output.
    stacked = torch.stack([inp.detach() for inp in inputs])
    for output, _ in args:
        _write(output, stacked.view(output.shape))
        _copied_in([output], copies=len(args))   # gloo: one copy per rank's chunk


def reduce_scatter(args, op):
    """``args[r] = (output, inputs)``: rank i gets the reduction of every rank's ``inputs[i]``."""
    for i, (output, _) in enumerate(args):
        _write(output, reduce_tensors([inputs[i] for _, inputs in args], op))
        _copied_in([output])


def reduce_scatter_single(args, op):
    """``args[r] = (output, input)``: the input is split on dim 0 into one chunk per rank."""
    n = len(args)
    _check_data([inp for _, inp in args])
    if _no_data(args[0][1]):
        for output, inp in args:
            _check_numel(inp, n * output.numel())
        return
    split = [inp.detach().reshape(n, -1) for _, inp in args]
    for i, (output, _) in enumerate(args):
        _write(output, reduce_tensors([s[i] for s in split], op).view(output.shape))
        _copied_in([output])


def gather(args, dst):
    """``args[r] = (outputs, input)``; only group rank ``dst`` has outputs."""
    _check_data([inp for _, inp in args])
    outputs = args[dst][0]
    for j, (_, inp) in enumerate(args):
        _write(outputs[j], inp)
    _copied_in(outputs)


def scatter(args, src):
    """``args[r] = (output, inputs)``; rank i's output gets group rank ``src``'s ``inputs[i]``."""
    _check_data([output for output, _ in args])
    inputs = args[src][1]
    for i, (output, _) in enumerate(args):
        _write(output, inputs[i])


def all_to_all(args):
    """``args[r] = (outputs, inputs)``: rank i's ``outputs[j]`` gets rank j's ``inputs[i]``."""
    _check_data([ins[0] for _, ins in args])
    # Snapshot the inputs first: an output may share memory with some rank's input.
    inputs = [[t.detach().clone() for t in ins] for _, ins in args]
    for i, (outputs, _) in enumerate(args):
        for j in range(len(args)):
            _write(outputs[j], inputs[j][i])
        _copied_in(outputs)


def _splits(tensor, sizes, n):
    if not sizes:
        return list(tensor.chunk(n)) if tensor.shape[0] % n == 0 else None
    return list(tensor.split(list(sizes)))


def all_to_all_single(args):
    """``args[r] = (output, input, output_splits, input_splits)``, split on dim 0.

    Returns an error message when the split sizes do not fit together, else None.
    """
    n = len(args)
    _check_data([inp for _, inp, _, _ in args])
    outs, ins = [], []
    for r, (output, inp, out_splits, in_splits) in enumerate(args):
        o, i = _splits(output, out_splits, n), _splits(inp, in_splits, n)
        if o is None or i is None:
            return (f"rank {r}: dim 0 ({output.shape[0]} / {inp.shape[0]}) does not divide "
                    f"by the group size {n}; pass output_split_sizes and input_split_sizes")
        outs.append(o)
        ins.append([chunk.detach().clone() for chunk in i])  # in-place calls share memory
    for i in range(n):
        for j in range(n):
            if outs[i][j].shape != ins[j][i].shape:
                return (f"rank {j} sends {tuple(ins[j][i].shape)} to rank {i}, which expects "
                        f"{tuple(outs[i][j].shape)}")
    for i in range(n):
        for j in range(n):
            _write(outs[i][j], ins[j][i])
    return None
