"""Per-rank accounting: charges the torch ops each rank really runs to its clock and memory.

Each rank runs under a :class:`RankAccounting` dispatch mode, which sees every aten op
(also those DDP, FSDP2 or DTensor issue from C++). For each op it

* advances the rank's clock (:mod:`simcluster.clock`) by the roofline time of the op
  (:mod:`simcluster.costmodel`), after first waiting for any input that an asynchronous
  collective is still producing (the way a GPU compute stream waits on an event of the
  communication stream);
* counts every new storage the op creates toward the rank's simulated device memory
  (:mod:`simcluster.memory`), in a category — parameters, gradients, optimizer state,
  activations, communication buffers, other — and forgets it when torch frees it. Meta
  tensors count too, so a model far larger than this laptop can be measured without
  allocating it.

Process-wide hooks (module calls, parameter registration, optimizer steps) tell the
calling rank's mode which module runs and what new memory is for. The
:class:`Recorder` holds everything one run measures.

**Device and host.** A rank's tensors are CPU tensors to torch, and they live on the
simulated GPU: ``"cpu"`` is the device. Its share of the node's host memory
(:class:`~simcluster.spec.HostSpec`) holds pinned memory: what ``pin_memory()``, a factory
with ``pin_memory=True`` or FSDP2's ``CPUOffloadPolicy`` put there (the simulator answers
``is_pinned`` and ``pin_memory`` itself, with no accelerator needed), and what the
optimizer step of host parameters creates. Where an op runs decides where its new tensors
live:

* on the host: a factory with ``pin_memory=True``, an op that writes into a host tensor,
  and every op of an optimizer step whose parameters live on the host (CPU offload runs
  the optimizer on the CPUs). It takes the host's time (:meth:`CostModel.host_roofline`);
  the device tensors it reads cross the PCIe link first (device->host).
* on the device: everything else; the host tensors it reads cross the link first
  (host->device), as FSDP2's ``.to(device)`` of an offloaded shard does (a no-op to torch,
  since both are ``"cpu"``).

A transfer takes ``latency + bytes / PCIe bandwidth`` on the rank's communication stream;
the compute stream waits for it, except on a side stream (FSDP2's all-gather copy-in),
where only the ops that read the result wait. Gradients FSDP2 moves to the host after the
reduce-scatter (``.to("cpu")``, also a no-op to torch) are handed to the host account
(:func:`on_sharded_gradients`).
"""

import contextlib
import os
from typing import NamedTuple

import torch

from . import context
from ._torch_internals import (DEVICE_OP, FAKE, FAKE_MODE_KEY, SUBCLASS, DispatchMode,
                               ModuleStack, _get_dispatch_mode, can_set_aside,
                               dispatch_kind, fake_device, fake_dispatch, fake_mode_active,
                               fake_tensor_class, flop_formula, graph_task_id,
                               key_of_storage, on_side_stream, op_kernel, own_parameters,
                               set_aside, storage_key)
from .clock import CollectiveRecord, RankClock
from .memory import MemoryAccount
from .storage import NodeStorage

HOST_TO_DEVICE, DEVICE_TO_HOST = "host->device", "device->host"
TRANSFERS = (HOST_TO_DEVICE, DEVICE_TO_HOST)


class HostShare(NamedTuple):
    """A rank's share of its node's host memory, as a :class:`MemoryAccount` sees it."""

    name: str
    memory: int
    where: str
    advice: str = ("Offload less (keep the parameters on the GPU, offload only the "
                   "optimizer state), or use more nodes.")


# Ops that only allocate or relabel memory: no time is charged for them.
_FREE_OPS = {"detach", "alias", "lift_fresh", "_local_scalar_dense", "empty", "empty_like",
             "empty_strided", "new_empty", "new_empty_strided", "set_", "resize_",
             # a functional collective's wait (a GPU stream waiting on an event, called
             # several times per result by DTensor) and its autograd wrapper move no data
             "wait_tensor", "_wrap_tensor_autograd"}


def local_tensor(tensor):
    """The plain tensor holding ``tensor``'s data on this rank (unwraps DTensor)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class RankAccounting(DispatchMode):
    """Charges every aten op this rank runs to its clock and its memory."""

    def __init__(self, rank, recorder):
        super().__init__()
        self.rank, self.recorder = rank, recorder
        self.clock = recorder.clocks[rank]
        self.memory = recorder.memories[rank]
        self.host = recorder.host_memories[rank]
        self.modules = ModuleStack()
        self.in_optimizer_step = False   # what is allocated now is optimizer state
        self.host_step = False           # ... by an optimizer step that runs on the host
        self._paused = False     # True while the simulator computes a collective's result
        self.not_charged = []    # the paused() blocks of NotCharged, innermost last
        self.allocating_as = None   # a category that overrides category() (see allocating_as)
        self.module_time = recorder.module_time[rank]

    @contextlib.contextmanager
    def paused(self, bypass=False):
        """Charge nothing inside this block: the simulator's own work (the copies and
        reductions that stand in for communication) is not the rank's compute.
        (``bypass``: see :meth:`FastRankAccounting.paused`; here its ops still come to
        this mode, which only runs them.)"""
        was, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = was

    def category(self):
        """The category of memory allocated right now.

        In the backward pass a module's forward with grad enabled is activation
        checkpointing recomputing a block: what it allocates is activations again. Any
        other backward allocation is an activation's gradient or a temporary ("other"):
        "gradients" are parameter gradients only, retagged when autograd accumulates one
        into ``param.grad`` (:func:`on_forward_pre` hooks each parameter for that).
        """
        if self.allocating_as is not None:
            return self.allocating_as
        if self.in_optimizer_step:
            return "optimizer state"
        modules = self.modules
        if graph_task_id() != -1:   # in_backward(), without its call (once per new tensor)
            if modules.recomputing and torch.is_grad_enabled():
                return "activations"
            return "other"
        if modules.inside_module and torch.is_grad_enabled():
            return "activations"
        return "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # This runs for every op of every rank, and each microsecond here is about 5 % of
        # a small model's step: keep it lean (no pytree, cached op info and costs).
        kwargs = kwargs or {}
        fake = False
        for t in types:
            if t is not torch.Tensor:
                kind = _KIND.get(t) or _kind(t)
                if kind is SUBCLASS:
                    return NotImplemented  # let tensor subclasses (DTensor) unwrap to plain ops
                if kind is FAKE:
                    fake = True
        run = fake_dispatch if fake or fake_mode_active() else _call
        if self._paused:
            return run(func, args, kwargs)
        is_view, timeless, counter, special = _OP_INFO.get(func) or _op_info(func)
        if is_view:   # a view reads no data: it neither waits nor takes time
            return run(func, args, kwargs)
        if special is not None:
            return special(self, run, args, kwargs)
        inputs = _tensors(args, [])
        if kwargs:
            _tensors(kwargs.values(), inputs)
        clock = self.clock
        if clock.has_pending_reads:
            for t in inputs:
                clock.wait_for_read(storage_key(t))
        if self.host.total or self.host_step or (kwargs and kwargs.get("pin_memory")):
            return self._dispatch_with_host(func, run, args, kwargs, inputs, timeless, counter)
        out = run(func, args, kwargs)
        outputs = [out] if type(out) is torch.Tensor else _outputs(out)
        self._count_memory(outputs, self.memory)
        if not timeless:
            self._charge(func, counter, args, kwargs, out, inputs, outputs, False)
        return out

    def _charge(self, func, counter, args, kwargs, out, inputs, outputs, on_host):
        """Charge one op's roofline time to the clock: its FLOPs, and the bytes of its
        ``inputs`` and ``outputs``, at the device's peaks for its dtype (an fp32 matmul at
        the TF32 peak if the rank allows TF32), or at the host's with ``on_host``.

        Every op that takes time comes here, on the device and on the host: keep it lean,
        it runs for every op of every rank."""
        nbytes = 0
        for t in inputs:
            nbytes += t.numel() * t.element_size()
        for t in outputs:
            nbytes += t.numel() * t.element_size()
        flops = _op_flops(counter, args, kwargs, out)
        clock, label = self.clock, self.modules.innermost()
        if on_host:
            seconds = self.recorder.cost.host_roofline(self.rank, flops, nbytes, clock.now)
            label = f"host: {label}"
        else:
            dtype = inputs[0].dtype if inputs else (outputs[0].dtype if outputs else None)
            if flops and dtype is _F32 and func.overloadpacket in _TF32_OPS:
                dtype = _fp32_matmul_dtype()
            seconds = self.recorder.cost.roofline(self.rank, flops, dtype, nbytes, clock.now)
        clock.flops += flops
        seconds = clock.run_compute(seconds, label)
        module_time = self.module_time
        module_time[label] = module_time.get(label, 0.0) + seconds

    def _dispatch_with_host(self, func, run, args, kwargs, inputs, timeless, counter):
        """One op while the rank holds host memory (see the module's docstring): where it
        runs, what crosses the PCIe link, where its new tensors live."""
        host = self.host
        pinned = bool(kwargs.get("pin_memory"))
        if pinned:   # there is no accelerator to pin with: the simulated host holds it
            kwargs = {**kwargs, "pin_memory": False}
        from_host = from_device = 0
        for t in inputs:   # (python scalars wrapped as tensors are in neither: they are free)
            key = storage_key(t)
            if host.holds(key):
                from_host += _nbytes(t)
            elif self.memory.holds(key):
                from_device += _nbytes(t)
        out = run(func, args, kwargs)
        outputs = _outputs(out)
        on_host = pinned or self.host_step or any(host.holds(storage_key(t)) for t in outputs)
        self._count_memory(outputs, host if on_host else self.memory)
        if timeless:   # it reads no data (detach, alias, empty_like): nothing crosses
            return out
        if on_host and from_device:
            self.transfer(DEVICE_TO_HOST, from_device, outputs)
        elif not on_host and from_host:
            self.transfer(HOST_TO_DEVICE, from_host, outputs)
        self._charge(func, counter, args, kwargs, out, inputs, outputs, on_host)
        return out

    def transfer(self, direction, nbytes, outputs=(), wait=None):
        """Copy ``nbytes`` over the rank's PCIe link in ``direction`` (:data:`TRANSFERS`),
        after what its communication stream has queued. The compute stream waits for it
        (``wait``; default: unless on a side stream); otherwise only the ops that read
        ``outputs`` do."""
        clock = self.clock
        start = max(clock.now, clock.comm_free)
        end = start + self.recorder.cost.host_transfer_time(self.rank, nbytes)
        clock.run_comm(start, end, direction)
        self.recorder.host_transfers[self.rank][direction] += nbytes
        if wait is None:
            wait = not (on_side_stream() and outputs)
        if not wait:
            for t in outputs:
                clock.ready_when_read(storage_key(t), end)
        else:
            clock.wait_until(end, f"wait for {direction}")

    def storage_io(self, write, nbytes, path=None):
        """This rank wrote (``write``) or read ``nbytes`` of its node's storage, starting
        now: its compute stream waits until the node's array has moved them. ``path`` is
        the file written whole (None: part of a file, or no name). A rank that crashes
        before a write ends leaves the file torn: cut to the bytes written by then."""
        if nbytes <= 0 or self._paused:
            return
        storage = self.recorder.storage[self.recorder.spec.node_of(self.rank)]
        clock = self.clock
        # A rank that dies before the transfer ends frees the array at its death, and a
        # cut write leaves the file with what reached the disks (NodeStorage.transfer_until).
        start, end, moved = storage.transfer_until(clock.now, nbytes, write, self.rank, path,
                                                   until=clock.deadline)
        self.recorder.storage_bytes[self.rank]["write" if write else "read"] += moved
        clock.wait_until(start, "wait for storage")
        clock.run_io(end, f"{'write' if write else 'read'} {_size(nbytes)}")

    def _is_pinned(self, run, args, kwargs):
        """``aten.is_pinned``: whether the tensor lives in the simulated host memory."""
        return self.host.holds(storage_key(args[0]))

    def _pin_memory(self, run, args, kwargs):
        """``aten._pin_memory``: a copy of the tensor in the simulated host memory."""
        source = args[0]
        out = run(_CLONE, (source,), {})
        key, nbytes = storage_key(source), _nbytes(source)
        category = (self.memory.category_of(key) or self.host.category_of(key)
                    or self.category())
        if not self.host.holds(key):
            self.transfer(DEVICE_TO_HOST, nbytes, [out])
        storage = out.untyped_storage()
        self.host.allocate(key_of_storage(storage), storage.nbytes(), category, storage)
        return out

    def _to_copy(self, run, args, kwargs):
        """``aten._to_copy``: a cast copy of a parameter (autocast's bf16 weights, which it
        caches for the forward) is a parameter, in another precision; any other copy
        takes the category of what runs now."""
        inputs = _tensors(args, [])
        if self.clock.has_pending_reads:
            self.clock.wait_for_read(storage_key(args[0]))
        if self.memory.category_of(storage_key(args[0])) != "parameters":
            return self._dispatch_with_host(_TO_COPY, run, args, kwargs, inputs, False,
                                            None)
        was, self.allocating_as = self.allocating_as, "parameters"
        try:
            return self._dispatch_with_host(_TO_COPY, run, args, kwargs, inputs, False,
                                            None)
        finally:
            self.allocating_as = was

    def retag(self, key, category):
        """Move live storage ``key`` to ``category``, on the device or the host."""
        self.memory.retag(key, category)
        self.host.retag(key, category)

    def resize(self, storage, nbytes):
        """Storage ``storage`` was resized in place to ``nbytes``."""
        key = key_of_storage(storage)
        (self.host if self.host.holds(key) else self.memory).resize(key, nbytes, storage)

    def to_host(self, tensor):
        """``tensor``'s storage moves from the device to the host (its bytes cross the
        link); nothing happens if it is on the host already."""
        key = storage_key(tensor)
        if key is None or self.host.holds(key) or not self.memory.holds(key):
            return
        nbytes = self.memory.hand_over(key, self.host)
        # FSDP2 copies on its reduce-scatter stream and waits at the end of the backward
        # pass: here the first op that reads the gradient (the optimizer's) waits.
        self.transfer(DEVICE_TO_HOST, nbytes, [tensor], wait=False)

    def on_host(self, tensor):
        """True if ``tensor``'s storage lives in the simulated host memory."""
        return self.host.holds(storage_key(tensor))

    def _count_memory(self, outputs, account):
        """Count the storages among ``outputs`` that no account holds yet in ``account``."""
        category = None
        memory, host = self.memory, self.host
        for t in outputs:
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = key_of_storage(storage)
            if not memory.holds(key) and not (host.total and host.holds(key)):
                category = category or self.category()
                account.allocate(key, storage.nbytes(), category, storage)


class FastRankAccounting(RankAccounting):
    """:class:`RankAccounting` with the fast path: the same charges (clock, memory by
    category, events), for fewer Python calls per op; the default.

    * The simulator's own work (a collective's result, a message's copy) runs with the
      mode set aside (:func:`~simcluster._torch_internals.set_aside`), straight into
      torch's kernels, where :class:`RankAccounting` sees each op only to charge nothing.
      Taken when this mode is the innermost one and no fake mode is active; otherwise
      the ops come here as before.
    * Each op's fixed facts (view, timeless, FLOP formula, special, kernel, TF32) are
      looked up by ``id(func)``, and the kernel is called directly.
    * The memory count and the charge are inlined; an op's seconds are kept by (dtype,
      FLOPs, bytes), of which the roofline is a pure function (unless a straggler
      window slows the rank down: then it is called every time).
    * ``prim.device`` on a FakeTensor (C++ asking its device: half the ops on a fake
      model) is answered first, with the two things the full path does for it.

    ``SIMCLUSTER_FAST_PATH=0`` in the environment selects :class:`RankAccounting`, the
    reference that ``tests/test_fast_path.py`` compares this one against.
    """

    @contextlib.contextmanager
    def paused(self, bypass=False):
        """:meth:`RankAccounting.paused`; with ``bypass``, the ops of the block also skip
        this mode (the simulator's own copies and reductions, on plain tensors)."""
        was, self._paused = self._paused, True
        try:
            if bypass:
                with set_aside(self):
                    yield
            else:
                yield
        finally:
            self._paused = was

    def charge_timeless(self, inputs, outputs):
        """Charge what one timeless op (``empty_like``, ``item``: no time) that read
        ``inputs`` and created ``outputs`` is charged in :meth:`__torch_dispatch__`, for an
        op that ran with this mode set aside: it waits for communication still writing
        its inputs and counts its new storages. Ops that run in bulk (DDP's shape check
        on n ranks makes n tensors per rank) are charged without a Python call per op."""
        clock = self.clock
        if clock.pending_reads:
            for t in inputs:
                clock.wait_for_read(storage_key(t))
        host = self.host
        on_host = (self.host_step or any(host.holds(storage_key(t)) for t in outputs)
                   if host.total or self.host_step else False)
        self._count_memory(outputs, host if on_host else self.memory)

    def fits(self, nbytes):
        """True if ``nbytes`` more of new storage would fit where :meth:`charge_timeless`
        counts it."""
        account = self.host if self.host_step else self.memory
        return account.total + nbytes <= account.capacity

    def __init__(self, rank, recorder):
        super().__init__(rank, recorder)
        cost = recorder.cost
        # An op's seconds on the device by (dtype, FLOPs, bytes): CostModel.roofline is a
        # pure function of them unless a straggler fault slows this rank down for a
        # window of simulated time (faults.slow_down sets those before the run starts).
        self._seconds = None if cost is None or rank in cost.speed_windows else {}
        self._fake_tensor = fake_tensor_class()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # RankAccounting.__torch_dispatch__, step for step, with fewer calls: keep the
        # two in step (tests/test_fast_path.py runs the lessons' workloads on both).
        if func is DEVICE_OP and type(args[0]) is self._fake_tensor:
            # C++ asks a FakeTensor its device (half the ops on a fake model). The steps
            # below that do something for it: its input waits for communication, and
            # fake_dispatch answers (a timeless op that returns no tensor: no charge).
            clock = self.clock
            if clock.pending_reads and not self._paused:
                clock.wait_for_read(storage_key(args[0]))
            return fake_device(args[0])
        fake = False
        for t in types:
            if t is not _TENSOR:
                kind = _KIND.get(t) or _kind(t)
                if kind is SUBCLASS:
                    return NotImplemented
                if kind is FAKE:
                    fake = True
        is_view, timeless, counter, special, kernel, tf32 = (_FAST_INFO.get(id(func))
                                                             or _fast_info(func))
        if fake or _get_dispatch_mode(FAKE_MODE_KEY) is not None:
            if self._paused or is_view:
                return fake_dispatch(func, args, kwargs or {})
            run = fake_dispatch
        elif self._paused or is_view:
            return kernel(*args, **kwargs) if kwargs else kernel(*args)
        else:
            run = None
        kwargs = kwargs or {}
        if special is not None:
            return special(self, run or _call, args, kwargs)
        inputs = []
        for v in args:
            if isinstance(v, _TENSOR):
                inputs.append(v)
            elif isinstance(v, (list, tuple)):
                for x in v:
                    if isinstance(x, _TENSOR):
                        inputs.append(x)
        if kwargs:
            _tensors(kwargs.values(), inputs)
        clock = self.clock
        if clock.pending_reads:
            for t in inputs:
                clock.wait_for_read(storage_key(t))
        if self.host.total or self.host_step or (kwargs and kwargs.get("pin_memory")):
            return self._dispatch_with_host(func, run or _call, args, kwargs, inputs,
                                            timeless, counter)
        out = kernel(*args, **kwargs) if run is None else run(func, args, kwargs)
        outputs = [out] if type(out) is _TENSOR else _outputs(out)
        # _count_memory(outputs, self.memory), inlined; the host holds nothing (above).
        memory = self.memory
        live, category = memory.live, None
        for t in outputs:
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = storage._cdata
            if key not in live:
                category = category or self.category()
                memory.allocate(key, storage.nbytes(), category, storage)
        if timeless:
            return out
        # _charge(func, counter, args, kwargs, out, inputs, outputs, False), inlined, with
        # the seconds from the cache where it may be
        try:
            nbytes = 0
            for t in inputs:
                nbytes += t.nbytes   # numel() * element_size(), in one attribute
            for t in outputs:
                nbytes += t.nbytes
        except (RuntimeError, NotImplementedError, TypeError):   # a sparse tensor has none
            nbytes = sum(_nbytes(t) for t in inputs) + sum(_nbytes(t) for t in outputs)
        flops = 0 if counter is None else _op_flops(counter, args, kwargs, out)
        # self.modules.innermost(), inlined
        label = "(backward)" if graph_task_id() != -1 else self.modules.innermost_label
        dtype = inputs[0].dtype if inputs else (outputs[0].dtype if outputs else None)
        if flops and dtype is _F32 and tf32:
            dtype = _fp32_matmul_dtype()
        memo = self._seconds
        key = (dtype, flops, nbytes)
        seconds = None if memo is None else memo.get(key)
        if seconds is None:
            seconds = self.recorder.cost.roofline(self.rank, flops, dtype, nbytes, clock.now)
            if memo is not None:
                memo[key] = seconds
        clock.flops += flops
        seconds = clock.run_compute(seconds, label)
        module_time = self.module_time
        module_time[label] = module_time.get(label, 0.0) + seconds
        return out


def rank_accounting(rank, recorder):
    """The accounting dispatch mode for ``rank``: :class:`FastRankAccounting`, or the
    reference :class:`RankAccounting` if ``SIMCLUSTER_FAST_PATH=0`` (read at each run)."""
    fast = os.environ.get(FAST_PATH_ENV, "1") != "0"
    return (FastRankAccounting if fast else RankAccounting)(rank, recorder)


FAST_PATH_ENV = "SIMCLUSTER_FAST_PATH"
_TENSOR = torch.Tensor
_F32 = torch.float32
# fp32 matrix multiplies that cuBLAS runs on tensor cores in TF32 when the rank allows it
_TF32_OPS = {torch.ops.aten.mm, torch.ops.aten.addmm, torch.ops.aten.bmm,
             torch.ops.aten.baddbmm}


def _fp32_matmul_dtype():
    """What an fp32 matmul computes in on this rank: "tf32" (tensor cores) if it set
    ``torch.set_float32_matmul_precision("high")`` or ``"medium"`` (or
    ``torch.backends.cuda.matmul.allow_tf32 = True``), else float32, PyTorch's default
    ("highest"). On CUDA "medium" also runs in TF32: cuBLAS has no bf16 path for fp32."""
    return _F32 if torch.get_float32_matmul_precision() == "highest" else "tf32"


def _op_flops(counter, args, kwargs, out):
    """The FLOPs ``counter`` (an op's formula, or None) gives for one call; 0 when it has
    none or cannot read the call's arguments."""
    if counter is None:
        return 0
    try:
        return counter(args, kwargs, out)
    except (TypeError, ValueError, RuntimeError):
        return 0


def _call(func, args, kwargs):
    return func(*args, **kwargs)


def _outputs(out):
    """The tensors an op returned, as a list."""
    if type(out) is torch.Tensor or isinstance(out, torch.Tensor):
        return [out]
    return _tensors(out, []) if isinstance(out, (list, tuple)) else []


def _nbytes(t):
    return t.numel() * t.element_size()


def _size(nbytes):
    """``"4.2 MB"``: a byte count for a timeline label."""
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"


def _tensors(values, into):
    """Append the tensors among ``values`` (and inside lists/tuples in them) to ``into``."""
    for v in values:
        if isinstance(v, torch.Tensor):
            into.append(v)
        elif isinstance(v, (list, tuple)):
            for x in v:
                if isinstance(x, torch.Tensor):
                    into.append(x)
    return into


def tensors_in(values):
    """The tensors among ``values``, looking one level into lists and tuples."""
    return _tensors(values, [])


_OP_INFO = {}
_CLONE = torch.ops.aten.clone.default
_TO_COPY = torch.ops.aten._to_copy.default
# Ops the simulator answers itself: pinned memory is the simulated host's; a cast of a
# parameter is a parameter.
_SPECIAL = {torch.ops.aten.is_pinned.default: RankAccounting._is_pinned,
            torch.ops.aten._pin_memory.default: RankAccounting._pin_memory,
            _TO_COPY: RankAccounting._to_copy}
_KIND = {}   # tensor type -> dispatch_kind(type)


def _kind(cls):
    """:func:`dispatch_kind` of a tensor type, computed once per type."""
    kind = _KIND[cls] = dispatch_kind(cls)
    return kind


_FAST_INFO = {}   # id(op) -> _op_info(op) + (its kernel,); ops live as long as torch


def _fast_info(func):
    """:func:`_op_info` of ``func``, the kernel that calling it calls, and whether it is
    one of ``_TF32_OPS``, looked up by ``id(func)``: an ``OpOverload``'s own hash is a
    Python call."""
    info = _FAST_INFO[id(func)] = (*_op_info(func), op_kernel(func),
                                   func.overloadpacket in _TF32_OPS)
    _KEPT.append(func)   # its id stays its own
    return info


_KEPT = []


def _op_info(func):
    """``(is_view, timeless, flop_formula, special)`` of an aten op, computed once per op;
    ``special`` is the :class:`RankAccounting` method that answers it instead of torch."""
    info = _OP_INFO.get(func)
    if info is None:
        packet = func.overloadpacket
        # prim ops (prim.device, ...) only answer questions about a tensor: no time.
        timeless = packet.__name__ in _FREE_OPS or func.namespace == "prim"
        info = _OP_INFO[func] = (func.is_view, timeless, flop_formula(packet),
                                 _SPECIAL.get(func))
    return info


# ------------------------------------------------ process-wide hooks, per rank
def current():
    """The calling rank thread's :class:`RankAccounting`, or None."""
    me = context.current()
    return None if me is None else me.accounting


def bulk():
    """The calling rank's :class:`FastRankAccounting` if the simulator may run ops with it
    set aside (``paused(bypass=True)``) and charge them itself in bulk
    (:meth:`~FastRankAccounting.charge_timeless`), else None: outside a rank, without
    accounting, on the reference path, while paused, or when the mode cannot be set
    aside (a learner's mode above it would see fewer ops; fake tensors)."""
    acc = current()
    if type(acc) is FastRankAccounting and not acc._paused and can_set_aside(acc):
        return acc
    return None


@contextlib.contextmanager
def allocating_as(category):
    """A ``with`` block in which the calling rank counts the memory it allocates as
    ``category`` (DDP's buckets); does nothing outside a rank or without accounting."""
    acc = current()
    if acc is None:
        yield
        return
    was, acc.allocating_as = acc.allocating_as, category
    try:
        yield
    finally:
        acc.allocating_as = was


def paused(bypass=False):
    """A ``with`` block in which the calling rank is charged nothing (see
    :meth:`RankAccounting.paused`); does nothing outside a rank or without accounting.
    ``bypass``: the block's ops may skip the dispatch mode altogether (the fast path:
    :meth:`FastRankAccounting.paused`); only for the simulator's own work, whose ops
    the mode would only run."""
    acc = current()
    return contextlib.nullcontext() if acc is None else acc.paused(bypass)


def on_forward_pre(module, args):
    """A module's forward starts: track it, and count its parameters as parameters."""
    acc = current()
    if acc is not None:
        acc.modules.enter(module)
        # Parameters can get new storage without register_parameter (to_empty, FSDP2's
        # resharding): whatever a module holds as a parameter when it runs is one.
        for param in own_parameters(module):
            if param is not None:
                acc.retag(storage_key(local_tensor(param)), "parameters")
                if param.requires_grad and not getattr(param, "_sim_grad_hook", False):
                    param.register_post_accumulate_grad_hook(_on_accumulated_grad)
                    param._sim_grad_hook = True


def _on_accumulated_grad(param):
    """Autograd has accumulated ``param``'s gradient into ``param.grad``: that memory is a
    parameter gradient (allocated in backward as "other", like an activation's gradient)."""
    acc = current()
    if acc is not None and param.grad is not None:
        acc.retag(storage_key(local_tensor(param.grad)), "gradients")


def on_forward_post(module, args, output):
    """A module's forward has returned."""
    acc = current()
    if acc is not None:
        acc.modules.leave(module)


def on_parameter(module, name, param):
    """A parameter was registered (or installed by FSDP2): its memory is a parameter's."""
    acc = current()
    if acc is not None and param is not None:
        acc.retag(storage_key(local_tensor(param)), "parameters")


def on_optimizer_pre(optimizer, args, kwargs):
    """An optimizer step starts: what it allocates is optimizer state."""
    acc = current()
    if acc is not None:
        acc.in_optimizer_step = True
        # Offloaded parameters are updated where they live: the CPUs run this step.
        acc.host_step = bool(acc.host.total) and any(
            acc.on_host(local_tensor(p)) for group in optimizer.param_groups
            for p in group["params"])


def on_optimizer_post(optimizer, args, kwargs):
    """An optimizer step has ended."""
    acc = current()
    if acc is not None:
        acc.in_optimizer_step = acc.host_step = False
        # Gradients that the optimizer reads were created during backward; state it
        # created is already "optimizer state". Parameters stay parameters.


def on_storage_io(write, nbytes, path):
    """The calling rank wrote (``write``) or read ``nbytes`` of a file at ``path`` (None:
    a file object without a name)."""
    acc = current()
    if acc is not None:
        acc.storage_io(write, nbytes, path)


def on_checkpoint_saved():
    """The calling rank has saved a checkpoint: a crash after this loses only the work done
    since (``RestartRecord.lost_work``)."""
    me = context.current()
    if me is not None and me.accounting is not None:
        me.world.faults.note_checkpoint(me.rank)


def on_storage_resize(storage, nbytes):
    """A storage was resized in place, bypassing the dispatcher (FSDP2 does this)."""
    acc = current()
    if acc is not None:
        acc.resize(storage, nbytes)


def on_sharded_gradients(pairs):
    """FSDP2 has reduce-scattered gradients: ``pairs`` are ``(parameter, gradient)``. Each
    gradient (a view into the reduce-scatter's output, allocated as a communication
    buffer) is a gradient. FSDP2 has moved the gradients of offloaded parameters to the
    host (``.to("cpu")``, which torch sees as no move): a gradient goes to the host where
    its parameter lives there, crossing the link once per storage (the reduce-scatter's
    output holds them all)."""
    acc = current()
    if acc is None:
        return
    for param, grad in pairs:
        if grad is not None:
            acc.retag(storage_key(local_tensor(grad)), "gradients")
            if acc.on_host(local_tensor(param)):
                acc.to_host(local_tensor(grad))


class Recorder:
    """Everything a run measures: clocks, memory, traffic, per-module compute time.

    Attributes:
        clocks: one :class:`~simcluster.clock.RankClock` per rank.
        memories: one :class:`~simcluster.memory.MemoryAccount` per rank (its device).
        host_memories: one per rank, its share of its node's host memory.
        host_transfers: per rank, ``{direction: bytes}`` copied over its PCIe link.
        module_time: per rank, ``{module label: simulated compute seconds}``.
        traffic: ``{(src, dst): bytes}`` sent over the simulated links.
        storage: one :class:`~simcluster.storage.NodeStorage` per node, its NVMe array.
        storage_bytes: per rank, ``{"write": bytes, "read": bytes}`` of storage I/O.
        collectives: every completed collective, a
            :class:`~simcluster.clock.CollectiveRecord`, in the order they completed.
        deaths: ``(rank, simulated time, crashed)`` for every rank whose process died,
            by a fault (``crashed``) or by its watchdog, over all attempts of the run.
    """

    def __init__(self, spec, world_size, cost):
        self.spec, self.world_size, self.cost = spec, world_size, cost
        slowdown = 1.0 if cost is None else cost.overlap_slowdown
        self.clocks = [RankClock(slowdown) for _ in range(world_size)]
        self.memories = [MemoryAccount(r, spec.device_of(r), self.clocks[r])
                         for r in range(world_size)]
        self.host_memories = [MemoryAccount(r, _host_share(spec, r), self.clocks[r])
                              for r in range(world_size)]
        self.host_transfers = [dict.fromkeys(TRANSFERS, 0) for _ in range(world_size)]
        self.module_time = [{} for _ in range(world_size)]
        self.traffic = {}
        self.collectives = []
        self.storage = [NodeStorage(node.storage, node.name) for node in spec.nodes]
        self.storage_bytes = [{"write": 0, "read": 0} for _ in range(world_size)]
        self.deaths = []

    def restart(self, t):
        """Every rank's process restarts at simulated time ``t`` (after a crash): the
        clocks go on (the time until ``t`` is an idle wait), the memory is empty."""
        for clock in self.clocks:
            clock.resume_at(t, "down: restarting after a failure")
        for memory in self.memories + self.host_memories:
            memory.restart()

    def add_traffic(self, src, dst, nbytes):
        """Count ``nbytes`` sent from rank ``src`` to rank ``dst``."""
        self.traffic[(src, dst)] = self.traffic.get((src, dst), 0) + nbytes

    def record_collective(self, op, algorithm, ranks, nbytes, start, end, protocol=None):
        """Keep a :class:`~simcluster.clock.CollectiveRecord` of a completed collective."""
        self.collectives.append(CollectiveRecord(
            op=op, algorithm=algorithm, protocol=protocol, ranks=tuple(ranks),
            nbytes=nbytes, start=start, end=end))


def _host_share(spec, rank):
    """Rank ``rank``'s share of its node's host memory, as a memory account's "device"."""
    node = spec.nodes[spec.node_of(rank)]
    memory = spec.host_share(rank)[0]
    return HostShare(f"host memory of {node.name}", memory,
                     f"Rank {rank}'s share of the host memory of {node.name} "
                     f"(1/{node.devices} of {node.host.name})")


class NotCharged:
    """A reusable ``with`` block in which the calling rank is charged nothing: DTensor's
    replay of each op at the global shape, which only learns the output's shape."""

    def __enter__(self):
        acc = current()
        if acc is not None:
            block = acc.paused()
            acc.not_charged.append(block)
            block.__enter__()

    def __exit__(self, *exc):
        acc = current()
        if acc is not None:
            acc.not_charged.pop().__exit__(*exc)
