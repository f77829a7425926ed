"""Per-rank simulated clocks and memory, charged from the torch ops each rank really runs.

Each rank runs under a :class:`RankAccounting` dispatch mode, which sees every aten op
(also those DDP, FSDP2 or DTensor issue from C++). For each op it

* advances the rank's clock by the roofline time of the op (:mod:`simcluster.costmodel`),
  stretched while a collective runs on the same device, after first waiting for any
  input that an asynchronous collective is still producing (the way a GPU compute
  stream waits on an event of the communication stream);
* counts every new storage the op creates toward the rank's simulated device memory, in
  a category — parameters, gradients, optimizer state, activations, communication
  buffers, other — and forgets it when torch frees it. Meta tensors count too, so a
  model far larger than this laptop can be measured without allocating it.
"""

import bisect
import threading
import weakref

import torch
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.module_tracker import ModuleTracker

from ._torch_internals import fake_dispatch, fake_mode_active
from .errors import OutOfMemoryError

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations",
              "communication buffers", "other")

# Ops that only allocate or relabel memory: no time is charged for them.
_FREE_OPS = {"detach", "alias", "lift_fresh", "_local_scalar_dense", "empty", "empty_like",
             "empty_strided", "new_empty", "new_empty_strided", "set_", "resize_"}


class RankClock:
    """One rank's simulated time: a compute stream and a communication stream.

    Compute that runs while the communication stream is busy takes ``overlap_slowdown``
    times as long: NCCL's kernels occupy SMs and HBM bandwidth of the same GPU
    (:data:`simcluster.costmodel.OVERLAP_SLOWDOWN`).
    """

    def __init__(self, overlap_slowdown=1.0):
        self.now = 0.0          # when the compute stream is next free
        self.comm_free = 0.0    # when the communication stream is next free
        self.compute = 0.0
        self.comm = 0.0
        self.idle = 0.0
        self.flops = 0
        self.events = []        # (lane, start, end, label), lane: compute | comm | idle
        self.ready_at = {}      # storage key -> time an async collective finishes writing it
        self.overlap_slowdown = overlap_slowdown
        self._busy_starts, self._busy_ends = [], []  # communication, sorted and disjoint

    def run_compute(self, seconds, label):
        """Run ``seconds`` of compute (at full speed) in ``label`` on the compute stream;
        return how long it took, slowed where the communication stream is busy."""
        if seconds <= 0:
            return 0.0
        start, self.now = self.now, self._compute_end(self.now, seconds)
        self.compute += self.now - start
        last = self.events[-1] if self.events else None
        if last and last[0] == "compute" and last[3] == label and last[2] == start:
            self.events[-1] = ("compute", last[1], self.now, label)
        else:
            self.events.append(("compute", start, self.now, label))
        return self.now - start

    def _compute_end(self, t, work):
        """When ``work`` seconds of full-speed compute started at ``t`` end."""
        ends = self._busy_ends
        if not ends or ends[-1] <= t:   # the usual case: no communication ahead
            return t + work
        i = bisect.bisect_right(ends, t)   # the first busy span ending after t
        for begin, end in zip(self._busy_starts[i:], ends[i:]):
            if begin > t:
                if work <= begin - t:
                    return t + work
                work -= begin - t
                t = begin
            if work * self.overlap_slowdown <= end - t:
                return t + work * self.overlap_slowdown
            work -= (end - t) / self.overlap_slowdown
            t = end
        return t + work

    def run_comm(self, start, end, label):
        """Record that the communication stream was busy from ``start`` to ``end``.

        Compute charged before this was known ran at full speed where it overlaps: the work
        it could not have done in that time is charged now, after it.
        """
        self.comm_free = max(self.comm_free, end)
        self.comm += end - start
        self.events.append(("comm", start, end, label))
        if self.overlap_slowdown == 1.0:
            return
        fresh = self._mark_busy(start, end)
        overlap = 0.0
        for lane, s, e, _ in reversed(self.events):
            if lane == "compute":
                if e <= start:
                    break   # compute events are in time order: nothing earlier overlaps
                overlap += sum(max(0.0, min(e, b) - max(s, a)) for a, b in fresh)
        self.run_compute(overlap * (1 - 1 / self.overlap_slowdown), "(slowed by communication)")

    def _mark_busy(self, start, end):
        """Add ``[start, end)`` to the busy spans; return its parts that were not busy."""
        starts, ends = self._busy_starts, self._busy_ends
        i = j = bisect.bisect_right(ends, start)
        fresh, t = [], start
        while j < len(starts) and starts[j] < end:
            if starts[j] > t:
                fresh.append((t, starts[j]))
            t = max(t, ends[j])
            j += 1
        if t < end:
            fresh.append((t, end))
        starts[i:j] = [min([start] + starts[i:j])]
        ends[i:j] = [max([end] + ends[i:j])]
        return fresh

    def wait_until(self, t, label):
        """The compute stream waits (idle) until simulated time ``t``."""
        if t > self.now:
            self.events.append(("idle", self.now, t, label))
            self.idle += t - self.now
            self.now = t

    @property
    def end(self):
        """When this rank's last work, compute or communication, finished."""
        return max(self.now, self.comm_free)


class MemoryAccount:
    """Bytes in use on one simulated device, by category, with peak and history."""

    def __init__(self, rank, device, clock):
        self.rank, self.device, self.clock = rank, device, clock
        self.capacity = device.memory
        self.in_use = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak = 0
        self.peak_by_category = dict(self.in_use)
        self.history = [(0.0, 0)]        # (simulated time, total bytes)
        self.live = {}                   # storage key -> [nbytes, category]
        self.closed = False              # the rank has finished: the record is final

    def reset_peak(self):
        """Make the current total the peak, as torch.cuda.reset_peak_memory_stats does."""
        self.peak = self.total
        self.peak_by_category = dict(self.in_use)

    def close(self):
        """Freeze the record: storages freed after the rank returned change nothing."""
        self.closed = True

    def allocate(self, key, nbytes, category, storage):
        """Count a new storage; raise :class:`OutOfMemoryError` beyond capacity."""
        if key in self.live or nbytes == 0:
            return
        if self.total + nbytes > self.capacity:
            raise OutOfMemoryError(self.rank, self.device, nbytes, self.total,
                                   dict(self.in_use), category)
        # A weak reference whose callback runs when torch frees the storage.
        self.live[key] = [nbytes, category, weakref.ref(storage, lambda _, k=key: self.free(k))]
        self._change(category, nbytes)

    def free(self, key):
        entry = self.live.pop(key, None)
        if entry is not None:
            self._change(entry[1], -entry[0])

    def retag(self, key, category):
        """Move a live storage to ``category`` (e.g. once we learn it is a parameter)."""
        entry = self.live.get(key)
        if entry is not None and entry[1] != category and not self.closed:
            self.in_use[entry[1]] -= entry[0]
            self.in_use[category] += entry[0]
            entry[1] = category

    def resize(self, key, nbytes, storage):
        """A storage was resized in place (FSDP2 frees and refills parameters this way)."""
        entry = self.live.get(key)
        if entry is None:
            self.allocate(key, nbytes, "other", storage)
            return
        grow = nbytes - entry[0]
        if grow > 0 and self.total + grow > self.capacity:
            raise OutOfMemoryError(self.rank, self.device, grow, self.total,
                                   dict(self.in_use), entry[1])
        entry[0] = nbytes
        self._change(entry[1], grow)

    def _change(self, category, delta):
        if self.closed:
            return
        self.in_use[category] += delta
        self.total += delta
        if self.total > self.peak:
            self.peak = self.total
            self.peak_by_category = dict(self.in_use)
        t = self.clock.now
        if self.history[-1][0] == t:
            self.history[-1] = (t, self.total)
        else:
            self.history.append((t, self.total))


def storage_key(tensor):
    """A stable identity for the memory behind ``tensor`` (None if it has none)."""
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def local_tensor(tensor):
    """The plain tensor holding ``tensor``'s data on this rank (unwraps DTensor)."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


class _RankModuleTracker(ModuleTracker):
    """torch's ModuleTracker, fed by process-wide hooks that only forward this rank's calls.

    It follows modules through the forward pass only: torch's version also hooks the
    backward pass with multi-grad hooks, which break ``torch.autograd.grad`` on leaf
    inputs (as torch.distributed.pipelining calls it). Backward time is labelled
    "(backward)" instead.
    """

    _innermost = "Global"   # the deepest module running now, kept as parents change

    def _fw_pre_hook(self, mod, input):
        self.parents.add(self._get_mod_name(mod))
        self._innermost = max(self.parents, key=len)

    def _fw_post_hook(self, mod, input, output):
        self.parents.discard(self._get_mod_name(mod))
        self._innermost = max(self.parents, key=len)

    def innermost(self):
        """The label of the module running now: the deepest one, or "(backward)"."""
        if torch._C._current_graph_task_id() != -1:
            return "(backward)"
        return self._innermost


class RankAccounting(TorchDispatchMode):
    """Charges every aten op this rank runs to its clock and its memory."""

    def __init__(self, rank, recorder):
        super().__init__()
        self.rank, self.recorder = rank, recorder
        self.clock = recorder.clocks[rank]
        self.memory = recorder.memories[rank]
        self.modules = _RankModuleTracker()
        self.phase = None        # "optimizer" or "communication" while inside those
        self.paused = False      # True while the backend computes a collective's result
        self.module_time = recorder.module_time[rank]

    def category(self):
        """The category of memory allocated right now."""
        if self.phase == "optimizer":
            return "optimizer state"
        if self.phase == "communication":
            return "communication buffers"
        if torch._C._current_graph_task_id() != -1:
            return "gradients"
        if len(self.modules.parents) > 1 and torch.is_grad_enabled():
            return "activations"
        return "other"

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        # This runs for every op of every rank, and each microsecond here is about 5 % of
        # a small model's step: keep it lean (no pytree, cached op info and costs).
        kwargs = kwargs or {}
        if self.paused:
            return func(*args, **kwargs)
        fake = False
        for t in types:
            if t is not torch.Tensor:
                if not _is_fake(t):
                    return NotImplemented  # let tensor subclasses (DTensor) unwrap to plain ops
                fake = True
        is_view, timeless, counter = _OP_INFO.get(func) or _op_info(func)
        run = fake_dispatch if fake or fake_mode_active() else _call
        if is_view:   # a view reads no data: it neither waits nor takes time
            return run(func, args, kwargs)
        inputs = _tensors(args, [])
        if kwargs:
            _tensors(kwargs.values(), inputs)
        clock = self.clock
        if clock.ready_at:
            for t in inputs:
                ready = clock.ready_at.pop(storage_key(t), None)
                if ready is not None:
                    clock.wait_until(ready, "wait for communication")
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
        for t in outputs:
            try:
                storage = t.untyped_storage()
            except (RuntimeError, NotImplementedError):
                continue
            key = storage._cdata
            if key not in self.memory.live:
                category = category or self.category()
                self.memory.allocate(key, storage.nbytes(), category, storage)


_FAKE_TYPES = ("FakeTensor", "FunctionalTensor")


def _call(func, args, kwargs):
    return func(*args, **kwargs)


def _is_fake(t):
    return t.__name__ in _FAKE_TYPES


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


def _shapes(value):
    """``value`` with every tensor replaced by its shape, and lists by tuples (hashable)."""
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, (list, tuple)):
        return tuple(_shapes(v) for v in value)
    return value


def flop_formula(packet):
    """``count(args, kwargs, out) -> FLOPs`` for an aten op (packet), or None if unknown.

    The formulas of ``torch.utils.flop_counter``, whose pytree mapping of arguments costs
    30-50 µs a call (a nested one for addmm): results are remembered per shapes, so
    a training loop pays it once per distinct matmul.
    """
    counter = flop_counter.flop_registry.get(packet)
    if counter is None:
        return None
    if not hasattr(counter, "__wrapped__"):
        # registered with get_raw=True: it may read tensor values (variable-length
        # attention's offsets), so shapes alone cannot stand for its arguments
        return lambda args, kwargs, out: counter(*args, **kwargs, out_val=out)
    known = {}

    def count(args, kwargs, out):
        try:
            key = (_shapes(args), _shapes(tuple(kwargs.items())), _shapes(out))
            return known[key]
        except KeyError:
            flops = known[key] = counter(*args, **kwargs, out_val=out)
            return flops
        except TypeError:   # an unhashable argument: count without remembering
            return counter(*args, **kwargs, out_val=out)

    return count


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


def on_forward_pre(module, args):
    acc = current()
    if acc is not None:
        acc.modules._fw_pre_hook(module, args)
        # Parameters can get new storage without register_parameter (to_empty, FSDP2's
        # resharding): whatever a module holds as a parameter when it runs is one.
        for param in module._parameters.values():
            if param is not None:
                acc.memory.retag(storage_key(local_tensor(param)), "parameters")


def on_forward_post(module, args, output):
    acc = current()
    if acc is not None:
        acc.modules._fw_post_hook(module, args, output)


def on_parameter(module, name, param):
    acc = current()
    if acc is not None and param is not None:
        key = storage_key(local_tensor(param))
        acc.memory.retag(key, "parameters")


def on_optimizer_pre(optimizer, args, kwargs):
    acc = current()
    if acc is not None:
        acc.phase = "optimizer"


def on_optimizer_post(optimizer, args, kwargs):
    acc = current()
    if acc is not None:
        acc.phase = None
        # Gradients that the optimizer reads were created during backward; state it
        # created is already "optimizer state". Parameters stay parameters.


def on_storage_resize(storage, nbytes):
    acc = current()
    if acc is not None:
        acc.memory.resize(storage._cdata, nbytes, storage)


class Recorder:
    """Everything a run measures: clocks, memory, traffic, per-module compute time."""

    def __init__(self, spec, world_size, cost):
        self.spec, self.world_size, self.cost = spec, world_size, cost
        slowdown = 1.0 if cost is None else cost.overlap_slowdown
        self.clocks = [RankClock(slowdown) for _ in range(world_size)]
        self.memories = [MemoryAccount(r, spec.device_of(r), self.clocks[r])
                         for r in range(world_size)]
        self.module_time = [{} for _ in range(world_size)]
        self.traffic = {}        # (src, dst) -> bytes
        self.collectives = []    # (op, algorithm, ranks, nbytes, start, end)

    def add_traffic(self, src, dst, nbytes):
        self.traffic[(src, dst)] = self.traffic.get((src, dst), 0) + nbytes


_hooks = []


def install_hooks():
    """Install the process-wide hooks that feed each rank's accountant."""
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer

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
