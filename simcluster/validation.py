"""Checks of what a run and its operations are given, made before anything runs.

Two kinds of callers, one rule per small function:

* the ``sim`` backend (:mod:`simcluster.backend`) checks each rank's buffers when the
  rank calls an operation, as torch's real backends do: dtypes gloo can communicate,
  outputs whose dtype and shape fit the input, contiguous buffers where gloo needs them.
  A wrong call raises ``ValueError`` on the calling rank, naming the operation, the rank
  and both shapes, before it joins the collective — so no rank gets a wrong result.
  (What only shows once every rank has arrived, such as meta tensors on some ranks
  only, is checked in :mod:`simcluster.collectives`.)
* :meth:`simcluster.Cluster.run` checks its arguments with :func:`run_arguments`, so a
  wrong ``timeout``, ``speed_factor`` or ``link_factor`` fails at the call with a
  ``TypeError`` / ``ValueError`` naming the argument, not later inside some rank.

Where gloo and NCCL differ, we accept what either accepts with a well-defined result
(NCCL's numel rule for ``all_gather_into_tensor`` / ``reduce_scatter_tensor``, gloo's
non-contiguous buffers in most collectives) and refuse what both refuse or what gloo
gets wrong (it writes only part of a non-contiguous broadcast or scatter output).
"""

import inspect
import math
import numbers

import torch

from ._torch_internals import is_fake

# What gloo (torch 2.13) can communicate. Others (int16, the unsigned 16/32/64-bit
# integers, float8) fail there with "Invalid scalar type". Complex tensors reach the
# backend as real views (torch.view_as_real), except where torch passes them on as they
# are: both complex types are accepted.
SUPPORTED_DTYPES = (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                    torch.int8, torch.uint8, torch.int32, torch.int64, torch.bool,
                    torch.complex64, torch.complex128)


def _describe(t):
    return f"shape {tuple(t.shape)}, {t.dtype}"


def _where(t):
    """Where a tensor's data lives: ``"meta"`` and ``"fake"`` tensors have none."""
    if t.is_meta:
        return "meta"
    return "fake" if is_fake(t) else t.device.type


# ------------------------------------------------------------------ buffer rules
def check_dtype(op, rank, tensors):
    """Every tensor has a dtype gloo can communicate."""
    for t in tensors:
        if t.dtype not in SUPPORTED_DTYPES:
            names = ", ".join(str(d).removeprefix("torch.") for d in SUPPORTED_DTYPES)
            raise ValueError(
                f"rank {rank}: {op} does not support dtype {t.dtype} (gloo raises "
                f"\"Invalid scalar type\" for it); convert the tensor first, e.g. "
                f"t.to(torch.int32) or t.float(). Supported: {names}.")


def check_strided(op, rank, tensors):
    """Every tensor is dense: sparse tensors are not simulated (they would not be reduced)."""
    for t in tensors:
        if t.layout != torch.strided:
            raise ValueError(
                f"rank {rank}: {op}: sparse tensors ({t.layout}) are not simulated; "
                "communicate t.to_dense() and convert the result back (t.to_sparse()).")


def _name(what, i, indexed):
    """``what[i]`` for an element of the list argument ``what``, else ``what``."""
    return f"{what}[{i}]" if indexed else what


def check_same_dtype(op, rank, tensors, what, reference, reference_name="the input",
                     indexed=True):
    """Every tensor of ``tensors`` (the list argument ``what``) has ``reference``'s dtype.

    ``indexed=False``: ``what`` names a single tensor, not a list.
    """
    for i, t in enumerate(tensors):
        if t.dtype != reference.dtype:
            raise ValueError(
                f"rank {rank}: {op}: {_name(what, i, indexed)} ({_describe(t)}) must have "
                f"the same dtype as {reference_name} ({_describe(reference)}); torch's "
                "backends do not convert.")


def check_same_shape(op, rank, tensors, what, reference, reference_name="the input"):
    """Every tensor of the list argument ``what`` has ``reference``'s shape."""
    for i, t in enumerate(tensors):
        if t.shape != reference.shape:
            raise ValueError(
                f"rank {rank}: {op}: {what}[{i}] ({_describe(t)}) must have the same shape "
                f"as {reference_name} ({_describe(reference)}).")


def check_same_device(op, rank, tensors):
    """One call's tensors all live on the same device (all meta, all fake, or all real)."""
    if not tensors:
        return
    kind = (type(tensors[0]), tensors[0].device)
    if all((type(t), t.device) == kind for t in tensors):
        return  # the common case, without the slower look at each tensor
    places = {_where(t) for t in tensors}
    if len(places) > 1:
        shown = ", ".join(f"{_where(t)} ({_describe(t)})" for t in tensors)
        raise ValueError(f"rank {rank}: {op}: its tensors must all be on one device, got "
                         f"{shown}.")


def check_length(op, rank, tensors, size, what):
    """A list argument holds one tensor per rank of the group."""
    if tensors is None or len(tensors) != size:
        got = "none" if tensors is None else len(tensors)
        raise ValueError(f"rank {rank}: {op} needs a {what} of {size} tensors (one per rank "
                         f"of the group), got {got}.")


def check_numel(op, rank, tensor, name, expected, reason):
    """``tensor`` (called ``name``) holds ``expected`` elements, for ``reason``."""
    if tensor.numel() != expected:
        raise ValueError(
            f"rank {rank}: {op}: {name} ({_describe(tensor)}) must hold {expected} "
            f"elements, got {tensor.numel()} ({reason}).")


def check_contiguous(op, rank, tensor, what="tensor"):
    """``tensor`` is contiguous, where gloo refuses or mangles a non-contiguous one.

    gloo raises for send / recv ("input tensor has to be contiguous") and for
    all_to_all_single's input ("Tensors must be contiguous"); into a non-contiguous
    broadcast or scatter output it writes only part of the data, into all_to_all_single's
    output it writes past the view. NCCL refuses them all.
    """
    if not tensor.is_contiguous():
        raise ValueError(
            f"rank {rank}: {op} needs a contiguous {what}, got a non-contiguous view "
            f"({_describe(tensor)}, stride {tensor.stride()}); pass a contiguous tensor "
            "(t.contiguous()) and copy it back into the view afterwards.")


def _same_kind(op, rank, reference, others, what, reference_name="the input",
               indexed=True):
    """Rules all buffers share: dense, a supported dtype, ``reference``'s dtype, one device."""
    check_strided(op, rank, [reference, *others])
    check_dtype(op, rank, [reference])
    check_same_dtype(op, rank, others, what, reference, reference_name, indexed)
    check_same_device(op, rank, [reference, *others])


# ------------------------------------------------- one entry point per operation
def tensors(op, rank, tensor_list):
    """all_reduce, reduce: the tensors are read and written in place."""
    check_strided(op, rank, tensor_list)
    check_dtype(op, rank, tensor_list)
    check_same_device(op, rank, tensor_list)


def broadcast(rank, tensor_list):
    """broadcast: like :func:`tensors`, and contiguous (gloo writes part of a view)."""
    tensors("broadcast", rank, tensor_list)
    for t in tensor_list:
        check_contiguous("broadcast", rank, t)


def list_gather(op, rank, size, outputs, inp):
    """all_gather (and gather's destination): ``size`` outputs shaped like the input."""
    check_length(op, rank, outputs, size, "output list")
    _same_kind(op, rank, inp, outputs, "output_tensor_list")
    check_same_shape(op, rank, outputs, "output_tensor_list", inp)


def gather(rank, size, is_root, outputs, inp):
    """gather: the destination's gather_list is checked like all_gather's outputs."""
    if is_root:
        list_gather("gather", rank, size, outputs, inp)
    else:
        tensors("gather", rank, [inp])


def scatter(rank, size, is_root, output, inputs):
    """scatter: the source's scatter_list holds one tensor per rank shaped like the output."""
    if is_root:
        check_length("scatter", rank, inputs, size, "scatter_list")
        _same_kind("scatter", rank, output, inputs, "scatter_list", "the output")
        check_same_shape("scatter", rank, inputs, "scatter_list", output, "the output")
    else:
        tensors("scatter", rank, [output])
    check_contiguous("scatter", rank, output, "output")  # gloo fills part of a view


def reduce_scatter(rank, size, output, inputs):
    """reduce_scatter: ``size`` inputs, each shaped like the output (gloo's rule)."""
    check_length("reduce_scatter", rank, inputs, size, "input list")
    _same_kind("reduce_scatter", rank, output, inputs, "input_list", "the output")
    check_same_shape("reduce_scatter", rank, inputs, "input_list", output, "the output")


def into_tensor(op, rank, size, big, big_name, small, small_name):
    """all_gather_into_tensor / reduce_scatter_tensor: ``big`` holds ``size`` smalls.

    NCCL checks the number of elements only, so a stacked ``(size, *shape)`` buffer is
    accepted as well as the concatenated one.
    """
    _same_kind(op, rank, small, [big], f"the {big_name}", f"the {small_name}", indexed=False)
    check_numel(op, rank, big, f"the {big_name}", size * small.numel(),
                f"{size} ranks x the {small_name}'s {small.numel()}; the {small_name} has "
                f"{_describe(small)}")


def all_to_all(rank, size, outputs, inputs):
    """all_to_all: one input and one output per rank, all of one dtype."""
    check_length("all_to_all", rank, outputs, size, "output list")
    check_length("all_to_all", rank, inputs, size, "input list")
    first = "input_tensor_list[0]"
    _same_kind("all_to_all", rank, inputs[0], inputs, "input_tensor_list", first)
    check_same_dtype("all_to_all", rank, outputs, "output_tensor_list", inputs[0], first)
    check_same_device("all_to_all", rank, [*inputs, *outputs])


def all_to_all_single(rank, output, inp, output_split_sizes, input_split_sizes):
    """all_to_all_single: same dtype, contiguous buffers; without split sizes, as many
    elements out as in."""
    _same_kind("all_to_all_single", rank, inp, [output], "the output", indexed=False)
    check_contiguous("all_to_all_single", rank, inp, "input")
    check_contiguous("all_to_all_single", rank, output, "output")
    if not output_split_sizes and not input_split_sizes:
        check_numel("all_to_all_single", rank, output, "the output", inp.numel(),
                    f"as many as the input, {_describe(inp)}, without split sizes")


def point_to_point(op, rank, tensor):
    """send / recv: a dense, contiguous buffer (of any dtype: gloo sends the bytes)."""
    check_strided(op, rank, [tensor])
    check_contiguous(op, rank, tensor)


# ----------------------------------------------------------- Cluster.run arguments
def _number(value):
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_function(fn):
    """``fn`` is a plain function: a generator or coroutine function would never run."""
    if not callable(fn):
        raise TypeError(f"cluster.run needs a function to run on every rank, got "
                        f"{type(fn).__name__} {fn!r}")
    if inspect.isgeneratorfunction(fn) or inspect.isasyncgenfunction(fn):
        raise TypeError(f"cluster.run: fn={fn.__name__} is a generator function (it uses "
                        "yield): calling it only creates a generator and its body never "
                        "runs. Return the result instead of yielding it.")
    if inspect.iscoroutinefunction(fn):
        raise TypeError(f"cluster.run: fn={fn.__name__} is an async def function: calling "
                        "it only creates a coroutine and its body never runs. Define it "
                        "with a plain def (ranks are threads; they need no event loop).")


def check_timeout(timeout, name="timeout"):
    """``timeout`` (the argument ``name``) is None or a finite positive number of seconds."""
    if timeout is None:
        return
    if not _number(timeout):
        raise TypeError(f"{name} must be a positive number of seconds (or None), got "
                        f"{timeout!r}")
    if not (timeout > 0 and math.isfinite(timeout)):
        raise ValueError(f"{name} must be a positive number of seconds (and finite), got "
                         f"{timeout!r}; for no limit leave it out ({name}=None)")


def check_schedule_seed(seed):
    """``schedule_seed`` is None or an int >= 0 (a bool is not a seed); returns it as a
    Python int (``random.Random`` refuses numpy's)."""
    if seed is None:
        return None
    if not isinstance(seed, numbers.Integral) or isinstance(seed, bool):
        raise TypeError(f"schedule_seed must be an int >= 0 (or None for round-robin), got "
                        f"{seed!r} ({type(seed).__name__})")
    if seed < 0:
        raise ValueError(f"schedule_seed must be an int >= 0 (or None for round-robin), got "
                         f"{seed}")
    return int(seed)


def _check_factor(argument, key, factor):
    if not _number(factor):
        raise TypeError(f"{argument}[{key!r}] must be a number, got {factor!r}")
    if not (factor > 0 and math.isfinite(factor)):
        raise ValueError(f"{argument}[{key!r}] must be a positive, finite number, got "
                         f"{factor!r}")


def _check_dict(argument, value, example):
    if not isinstance(value, dict):
        raise TypeError(f"{argument} must be a dict like {example}, got "
                        f"{type(value).__name__} {value!r}")


def check_speed_factor(speed_factor, world_size):
    """``{rank: factor}`` with ranks of the run and positive factors."""
    if speed_factor is None:
        return
    _check_dict("speed_factor", speed_factor, "{3: 2.0} (rank 3 computes 2x slower)")
    for rank, factor in speed_factor.items():
        if not isinstance(rank, int) or isinstance(rank, bool) or not 0 <= rank < world_size:
            raise ValueError(f"speed_factor: {rank!r} is not a rank of this run (ranks "
                             f"0-{world_size - 1})")
        _check_factor("speed_factor", rank, factor)


def check_link_factor(link_factor, nodes):
    """``{node_index or "network": factor}`` with existing nodes and positive factors."""
    if link_factor is None:
        return
    _check_dict("link_factor", link_factor,
                '{"network": 0.5} or {0: 0.5} (node 0\'s fabric at half bandwidth)')
    for key, factor in link_factor.items():
        is_node = isinstance(key, int) and not isinstance(key, bool) and 0 <= key < nodes
        if key != "network" and not is_node:
            raise ValueError(f"link_factor: unknown link {key!r}; use \"network\" or a node "
                             f"index 0-{nodes - 1}")
        _check_factor("link_factor", key, factor)


def run_arguments(cluster, fn, world_size, args, kwargs, timeout, speed_factor,
                  link_factor):
    """Check :meth:`Cluster.run`'s arguments; return the world size to use."""
    check_function(fn)
    if world_size is None:
        world_size = cluster.world_size
    if not isinstance(world_size, int) or isinstance(world_size, bool):
        raise TypeError(f"world_size must be an int, got {type(world_size).__name__}")
    if not 1 <= world_size <= cluster.world_size:
        raise ValueError(f"world_size must be between 1 and {cluster.world_size} (the "
                         f"devices in {cluster.spec.name}), got {world_size}")
    if not isinstance(args, (tuple, list)):
        raise TypeError(f"args must be a tuple, got {type(args).__name__}; "
                        "for one argument write args=(x,)")
    if kwargs is not None and not isinstance(kwargs, dict):
        raise TypeError(f"kwargs must be a dict, got {type(kwargs).__name__}")
    check_timeout(timeout)
    check_speed_factor(speed_factor, world_size)
    check_link_factor(link_factor, len(cluster.spec.nodes))
    return world_size
