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
"""

import contextlib
import threading

import torch

from ._torch_internals import (DispatchMode, ModuleStack, fake_dispatch, fake_mode_active,
                               fake_tensor_types, flop_formula, in_backward, key_of_storage,
                               own_parameters, set_sharding_propagation_context,
                               storage_key)
from .clock import CollectiveRecord, RankClock
from .memory import MemoryAccount

# Ops that only allocate or relabel memory: no time is charged for them.
_FREE_OPS = {"detach", "alias", "lift_fresh", "_local_scalar_dense", "empty", "empty_like",
             "empty_strided", "new_empty", "new_empty_strided", "set_", "resize_"}


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
        self.modules = ModuleStack()
        self.in_optimizer_step = False   # what is allocated now is optimizer state
        self._paused = False     # True while the simulator computes a collective's result
        self.module_time = recorder.module_time[rank]
        self._fake_types = fake_tensor_types()

    @contextlib.contextmanager
    def paused(self):
        """Charge nothing inside this block: the simulator's own work (the copies and
        reductions that stand in for communication) is not the rank's compute."""
        was, self._paused = self._paused, True
        try:
            yield
        finally:
            self._paused = was

    def category(self):
        """The category of memory allocated right now."""
        if self.in_optimizer_step:
            return "optimizer state"
        if in_backward():
            return "gradients"
        if self.modules.inside_module and torch.is_grad_enabled():
            return "activations"
        return "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # This runs for every op of every rank, and each microsecond here is about 5 % of
        # a small model's step: keep it lean (no pytree, cached op info and costs).
        kwargs = kwargs or {}
        fake = False
        for t in types:
            if t is not torch.Tensor:
                if t not in self._fake_types:
                    return NotImplemented  # let tensor subclasses (DTensor) unwrap to plain ops
                fake = True
        run = fake_dispatch if fake or fake_mode_active() else _call
        if self._paused:
            return run(func, args, kwargs)
        is_view, timeless, counter = _OP_INFO.get(func) or _op_info(func)
        if is_view:   # a view reads no data: it neither waits nor takes time
            return run(func, args, kwargs)
        inputs = _tensors(args, [])
        if kwargs:
            _tensors(kwargs.values(), inputs)
        clock = self.clock
        if clock.has_pending_reads:
            for t in inputs:
                clock.wait_for_read(storage_key(t))
        out = run(func, args, kwargs)
        if type(out) is torch.Tensor or isinstance(out, torch.Tensor):
            outputs = [out]
        else:
            outputs = _tensors(out, []) if isinstance(out, (list, tuple)) else []
        self._count_memory(outputs)
        if timeless:
            return out
        nbytes = 0
        for t in inputs:
            nbytes += t.numel() * t.element_size()
        for t in outputs:
            nbytes += t.numel() * t.element_size()
        flops = 0
        if counter is not None:
            try:
                flops = counter(args, kwargs, out)
            except (TypeError, ValueError, RuntimeError):
                flops = 0
        dtype = inputs[0].dtype if inputs else (outputs[0].dtype if outputs else None)
        seconds = self.recorder.cost.roofline(self.rank, flops, dtype, nbytes)
        label = self.modules.innermost()
        clock.flops += flops
        seconds = clock.run_compute(seconds, label)
        module_time = self.module_time
        module_time[label] = module_time.get(label, 0.0) + seconds
        return out

    def _count_memory(self, outputs):
        category = None
        memory = self.memory
        for t in outputs:
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = key_of_storage(storage)
            if not memory.holds(key):
                category = category or self.category()
                memory.allocate(key, storage.nbytes(), category, storage)


def _call(func, args, kwargs):
    return func(*args, **kwargs)


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


def _op_info(func):
    """``(is_view, timeless, flop_formula)`` of an aten op, computed once per op."""
    info = _OP_INFO.get(func)
    if info is None:
        packet = func.overloadpacket
        # prim ops (prim.device, ...) only answer questions about a tensor: no time.
        timeless = packet.__name__ in _FREE_OPS or func.namespace == "prim"
        info = _OP_INFO[func] = (func.is_view, timeless, flop_formula(packet))
    return info


# ------------------------------------------------ process-wide hooks, per rank
_thread = threading.local()


def current():
    """The calling rank thread's :class:`RankAccounting`, or None."""
    return getattr(_thread, "accounting", None)


def bind_thread(accounting):
    """Make ``accounting`` the calling thread's accountant (None to unbind)."""
    _thread.accounting = accounting


def paused():
    """A ``with`` block in which the calling rank is charged nothing (see
    :meth:`RankAccounting.paused`); does nothing outside a rank or without accounting."""
    acc = current()
    return contextlib.nullcontext() if acc is None else acc.paused()


def on_forward_pre(module, args):
    """A module's forward starts: track it, and count its parameters as parameters."""
    acc = current()
    if acc is not None:
        acc.modules.enter(module)
        # Parameters can get new storage without register_parameter (to_empty, FSDP2's
        # resharding): whatever a module holds as a parameter when it runs is one.
        for param in own_parameters(module):
            if param is not None:
                acc.memory.retag(storage_key(local_tensor(param)), "parameters")


def on_forward_post(module, args, output):
    """A module's forward has returned."""
    acc = current()
    if acc is not None:
        acc.modules.leave(module)


def on_parameter(module, name, param):
    """A parameter was registered (or installed by FSDP2): its memory is a parameter's."""
    acc = current()
    if acc is not None and param is not None:
        acc.memory.retag(storage_key(local_tensor(param)), "parameters")


def on_optimizer_pre(optimizer, args, kwargs):
    """An optimizer step starts: what it allocates is optimizer state."""
    acc = current()
    if acc is not None:
        acc.in_optimizer_step = True


def on_optimizer_post(optimizer, args, kwargs):
    """An optimizer step has ended."""
    acc = current()
    if acc is not None:
        acc.in_optimizer_step = False
        # Gradients that the optimizer reads were created during backward; state it
        # created is already "optimizer state". Parameters stay parameters.


def on_storage_resize(storage, nbytes):
    """A storage was resized in place, bypassing the dispatcher (FSDP2 does this)."""
    acc = current()
    if acc is not None:
        acc.memory.resize(key_of_storage(storage), nbytes, storage)


class Recorder:
    """Everything a run measures: clocks, memory, traffic, per-module compute time.

    Attributes:
        clocks: one :class:`~simcluster.clock.RankClock` per rank.
        memories: one :class:`~simcluster.memory.MemoryAccount` per rank.
        module_time: per rank, ``{module label: simulated compute seconds}``.
        traffic: ``{(src, dst): bytes}`` sent over the simulated links.
        collectives: every completed collective, a
            :class:`~simcluster.clock.CollectiveRecord`, in the order they completed.
    """

    def __init__(self, spec, world_size, cost):
        self.spec, self.world_size, self.cost = spec, world_size, cost
        slowdown = 1.0 if cost is None else cost.overlap_slowdown
        self.clocks = [RankClock(slowdown) for _ in range(world_size)]
        self.memories = [MemoryAccount(r, spec.device_of(r), self.clocks[r])
                         for r in range(world_size)]
        self.module_time = [{} for _ in range(world_size)]
        self.traffic = {}
        self.collectives = []

    def add_traffic(self, src, dst, nbytes):
        """Count ``nbytes`` sent from rank ``src`` to rank ``dst``."""
        self.traffic[(src, dst)] = self.traffic.get((src, dst), 0) + nbytes

    def record_collective(self, op, algorithm, ranks, nbytes, start, end, protocol=None):
        """Keep a :class:`~simcluster.clock.CollectiveRecord` of a completed collective."""
        self.collectives.append(CollectiveRecord(
            op=op, algorithm=algorithm, protocol=protocol, ranks=tuple(ranks),
            nbytes=nbytes, start=start, end=end))


class _NotCharged:
    """A reusable ``with`` block in which the calling rank is charged nothing: DTensor's
    replay of each op at the global shape, which only learns the output's shape."""

    def __enter__(self):
        acc = current()
        _thread.not_charged = getattr(_thread, "not_charged", [])
        _thread.not_charged.append(None if acc is None else acc.paused())
        if _thread.not_charged[-1] is not None:
            _thread.not_charged[-1].__enter__()

    def __exit__(self, *exc):
        block = _thread.not_charged.pop()
        if block is not None:
            block.__exit__(*exc)


class _Removable:
    """A hook handle for a setting of torch's: ``remove()`` restores the default."""

    def __init__(self, undo):
        self.remove = undo


_hooks = []


def install_hooks():
    """Install the process-wide hooks that feed each rank's accountant."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer

    set_sharding_propagation_context(_NotCharged())
    _hooks.append(_Removable(lambda: set_sharding_propagation_context(None)))
    _hooks.extend([
        nn_module.register_module_forward_pre_hook(on_forward_pre),
        nn_module.register_module_forward_hook(on_forward_post),
        nn_module.register_module_parameter_registration_hook(on_parameter),
        optimizer.register_optimizer_step_pre_hook(on_optimizer_pre),
        optimizer.register_optimizer_step_post_hook(on_optimizer_post),
    ])


def remove_hooks():
    """Remove what :func:`install_hooks` installed."""
    while _hooks:
        _hooks.pop().remove()
