"""Every use of a private PyTorch internal lives here, so a torch upgrade touches one file.

Tested with torch 2.13 (pinned in pyproject.toml); ``import simcluster`` warns once when
another version is installed (:func:`warn_if_untested`). Importing changes nothing in
torch. Every attribute a run replaces is one entry of a table (:func:`patches`: what it
replaces, and with what), and every global hook it registers one entry of :data:`HOOKS`;
:func:`patched` applies them all for one run attempt and puts everything back after it.
What we rely on, and why:

* ``torch.distributed.distributed_c10d._world`` holds the process-wide registry of process
  groups. Our ranks are threads of one process, so each thread needs its own registry:
  we swap ``_world`` for a proxy that forwards to a per-thread ``_World`` while a run is
  active. PyTorch's own threaded test backend does the same.
* ``torch._C._distributed_c10d._set_thread_isolation_mode`` gives each thread its own C++
  group-name registry, which functional collectives (DTensor, FSDP2) resolve groups in.
* ``torch.distributed.fsdp._fully_shard._fsdp_param.unsafe_setattr_param`` is how FSDP2
  swaps a module's parameters for sharded ones without ``register_parameter``; it is
  wrapped so memory accounting knows the shards are parameters.
* ``torch.distributed.fsdp._fully_shard._fsdp_param_group.foreach_reduce`` reduce-scatters
  FSDP2's gradients; with ``CPUOffloadPolicy`` it moves each sharded gradient to the host
  with ``.to("cpu")``, which is no move when the simulated GPU is the CPU. It is wrapped
  so accounting hears which gradients went to the host (each ``FSDPParam``'s
  ``offload_to_cpu``, ``sharded_param`` and its ``grad``).
* ``torch._subclasses.FakeTensorMode`` backs :func:`fake_tensor_mode`, and its dispatch
  cache (``_cache_key``, ``FakeTensorMode.cache``, ``_output_from_cache_entry``) backs
  :func:`fake_dispatch`, a faster road to the same cached results. Its results are built
  as ``FakeTensor.__new__`` builds them (``Tensor._make_subclass`` with
  ``dispatch_device=True``, then the attributes of a fresh FakeTensor), without its
  checks.
* ``torch.cpu._current_stream`` is the CPU "stream" that ``torch.cpu.stream(s)`` selects,
  one for the whole process: each rank keeps its own (:func:`cpu_stream`,
  :func:`set_cpu_stream`), and a collective waited on while a side stream is selected
  does not stall the compute stream (:func:`on_side_stream`), as with NCCL.
* DDP's C++ ``Reducer`` keeps its bookkeeping (parameter counts and shapes it checks
  across ranks, the bucket order rank 0 broadcasts, the map of used parameters) in small
  integer tensors that it fills and reads through raw pointers. Inside
  ``sc.fake_tensors()`` those would be fake and have no memory to point at, so while a run
  is active ``dist._verify_params_across_processes``, ``dist.Reducer`` and
  ``Reducer._rebuild_buckets`` run under :class:`_RealBookkeeping`, which keeps those
  tensors real (and the gradient buckets fake). ``unset_fake_temporarily`` does it.
  The used-parameter map (``find_unused_parameters=True``) is written and read back in
  autograd hooks, out of reach of a wrapper: :func:`fake_tensor_mode` is a
  ``FakeTensorMode`` subclass in which an op on real integer tensors alone runs real.
* ``torch.distributed.pipelining``'s schedules vote on their stages' mode in their first
  ``step()`` (``_PipelineSchedule._warmup_p2p``) with one-element integer tensors read by
  ``.item()``, and stages send their metadata with ``send_object_list``. While a run is
  active the warm-up runs under :class:`_RealBookkeeping` (patched when the module is
  imported: at the start of the run, or through an import hook on ``sys.meta_path`` if a
  rank imports it, :class:`_PatchOnImport`) and the object collectives (``dist.*_object*``) with the fake mode
  set aside.
* ``torch.distributed._functional_collectives._are_we_tracing`` takes any fake mode for
  ``torch.compile`` tracing, and a functional collective issued while tracing is waited
  on at once instead of when its result is first used: while a run is active the
  simulator's fake mode is not tracing (:func:`_are_we_tracing`), so communication on
  fake tensors overlaps compute as on real ones.
* ``torch.nn.modules.module._global_forward_pre_hooks`` and the other global module-hook
  dicts are process-wide; while a run is active they are stand-ins in which a hook
  registered in a rank thread fires only for that rank (:class:`_RankLocalHooks`), so
  that ``CommDebugMode`` and ``ModTracker`` opened in a rank see that rank's modules.
* ``dist.init_process_group`` is wrapped, while a run is active, so that a learner's own
  call inside a rank function (as in a ``torchrun`` script) is accepted: the simulator has
  already initialised the default group, and torch would otherwise refuse a second one.
* ``torch.utils._python_dispatch.TorchDispatchMode`` is the base of the per-rank
  accounting mode (:class:`DispatchMode`). Its ``_should_skip_dynamo`` hook is turned off:
  torch would otherwise wrap every op the mode sees in ``torch._dynamo.disable``, which
  imports ``torch._dynamo`` (1-4 s) on the first op and costs ~0.5 µs per op after.
  Its ``ignore_compile_internals`` hook is turned on, so that ``torch.compile`` in a rank
  compiles the learner's code and the mode charges the compiled code's ops.
* ``torch.utils.module_tracker.ModuleTracker``'s ``_get_mod_name`` names modules the way
  torch's own tools do ("Sequential.0"); :class:`ModuleStack` reuses it.
* ``torch._C._disabled_torch_dispatch_impl`` is the ``__torch_dispatch__`` that
  ``nn.Parameter`` and every tensor subclass without a dispatch of its own inherit: the
  accounting mode treats those as plain tensors (:func:`dispatch_kind`), as FakeTensorMode
  does, so that ``p.data`` (a detach torch routes through the mode) works.
* ``torch._C._current_graph_task_id`` tells whether autograd is running a backward pass
  on this thread (:func:`in_backward`).
* ``UntypedStorage._cdata``, the address of a storage's C++ object, identifies the memory
  behind a tensor (:func:`storage_key`) for memory accounting.
* ``torch.utils.flop_counter.flop_registry`` holds torch's FLOP formulas; whether one was
  registered with ``get_raw=True`` shows only in its missing ``__wrapped__``
  (:func:`flop_formula`).
* ``nn.Module._parameters`` holds a module's own parameters (:func:`own_parameters`),
  read on every module call without the cost of ``named_parameters``.
* ``DTensor._op_dispatcher._custom_op_handlers`` is the process-wide table of ops DTensor
  hands to Python handlers instead of its sharding rules. ``loss_parallel()`` adds its
  cross-entropy handlers on entry and removes them on exit; with ranks as threads the
  first rank to leave would take them away from the others. The table is part of each
  rank's process state instead (:func:`dtensor_handlers`, :func:`set_dtensor_handlers`),
  saved and restored at every hand-over like the RNG states. (DTensor's other toggle,
  ``implicit_replication()``, is a thread-local flag in C++ already.)
* ``ShardingPropagator._fake_mode_lock`` wraps DTensor's replay of each op on fake
  tensors of the global shapes, which only learns the output's shape; accounting charges
  nothing inside it (``RunHooks.not_charged`` takes its place), else every DTensor op
  would cost the rank its global size on top of its local one.
* ``torch.distributed.tensor._redistribute``'s ``_gen_transform_infos`` (a
  ``functools.cache``) and ``_planner_cache`` (a dict) cache redistribution plans whose
  shapes and mesh coordinates are one rank's: each rank thread gets caches of its own for
  the run (:class:`_PerRankCache`, :class:`_PerRankDict`), else a rank reuses another's
  plan for its uneven shard and gets wrong values.
* ``c10d._new_group_with_tag`` keeps ``pg_tag``, which torch drops when the default
  group creates sub-groups itself (``new_group`` on a Python group, as the sim's).
* ``torch.ops.c10d.<collective>`` are called, with the groups as ``pg.boxed()`` script
  objects, when a learner's dispatch mode is on (:func:`through_c10d`), so that the mode
  sees a collective as gloo's; ``torch.classes.c10d.ReduceOp()`` stands in for the op.
* ``torch.save`` and ``torch.load`` are wrapped while a run is active, and so are
  ``torch.distributed.checkpoint.filesystem``'s ``_FileSystemWriter.write_data``,
  ``FileSystemReader.read_data`` (whose plan's ``storage_data`` gives each item's file,
  offset and length) and ``FileSystem.create_stream``: the bytes a rank writes to and
  reads from files are charged to its node's storage (:func:`_save` and the entries
  after it).
* numpy's ``np.random.mtrand._rand._bit_generator`` is the legacy global generator; its
  ctypes view gives its raw Mersenne Twister words cheaply (:func:`numpy_rng_words`).
"""

import collections.abc
import ctypes
import contextlib
import functools
import importlib.abc
import inspect
import operator
import os
import pickle
import sys
import threading
import warnings
from typing import NamedTuple

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.utils import flop_counter
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils.module_tracker import ModuleTracker

TESTED_TORCH = "2.13"

_torch_init_process_group = dist.init_process_group   # torch's own, for the default group
_warned_version = False


def warn_if_untested(version=None):
    """Warn, once per process, when torch ``version`` (default: the installed one) is not
    the version simcluster was tested with. Returns True if it warned."""
    global _warned_version
    version = torch.__version__ if version is None else version
    if _warned_version or version.split("+")[0].split(".")[:2] == TESTED_TORCH.split("."):
        return False
    _warned_version = True
    warnings.warn(
        f"simcluster was tested with torch {TESTED_TORCH}, but torch {version} is installed. "
        f"The simulator relies on private parts of torch (listed in "
        f"simcluster/_torch_internals.py) that may have changed: if runs fail or numbers "
        f"look wrong, install the tested version (pip install 'torch=={TESTED_TORCH}.*').",
        RuntimeWarning, stacklevel=2)
    return True


class _RankWorld(c10d._World):
    """A ``_World`` whose group tables belong to one rank instead of the whole process."""

    def __init__(self):
        super().__init__()
        self._pg_map, self._pg_names, self._pg_group_ranks = {}, {}, {}
        self._pg_backend_config, self._tags_to_pg, self._pg_to_tag = {}, {}, {}
        self._group_count = 0

    pg_map = property(lambda self: self._pg_map)
    pg_names = property(lambda self: self._pg_names)
    pg_group_ranks = property(lambda self: self._pg_group_ranks)
    pg_backend_config = property(lambda self: self._pg_backend_config)
    tags_to_pg = property(lambda self: self._tags_to_pg)
    pg_to_tag = property(lambda self: self._pg_to_tag)

    @property
    def group_count(self):
        return self._group_count

    @group_count.setter
    def group_count(self, value):
        self._group_count = value




class _ThreadLocalWorld:
    """Stands in for ``c10d._world`` during a run: forwards every attribute to the calling
    rank thread's :class:`_RankWorld` (``registry()`` gives it, None outside a rank).

    Threads that are not simulated ranks (the notebook's own thread, ``outside``) see
    torch's process-wide world (``shared``), untouched.
    """

    def __init__(self, shared, registry):
        object.__setattr__(self, "_shared", shared)
        object.__setattr__(self, "_registry", registry)
        object.__setattr__(self, "_outside", threading.get_ident())

    def _current(self):
        world = self._registry()
        if world is not None:
            return world
        if self._outside != threading.get_ident():
            raise RuntimeError(
                "torch.distributed was used from a thread that is not a rank (a thread a "
                "rank started?). Every simulated rank is a thread with process groups of "
                "its own, which other threads cannot see: call dist.get_rank() and the "
                "collectives on the rank's own thread, and pass what a helper thread "
                "needs (the rank, tensors) to it as arguments.")
        return self._shared

    def __getattr__(self, name):
        return getattr(self._current(), name)

    def __setattr__(self, name, value):
        setattr(self._current(), name, value)


# ------------------------------------------------------------------ the patch table
class RunHooks(NamedTuple):
    """What a run's patches report to and ask, the simulator's side of them (injected, so
    that this module imports nothing from simcluster). Each is called on a rank thread.

    Attributes:
        registry: ``registry()`` -> the calling rank's process-group registry (from
            :func:`rank_registry`), or None on a thread that is not a rank.
        on_storage_resize: ``(storage, nbytes)``: FSDP2 freed or refilled an unsharded
            parameter with ``UntypedStorage.resize_``, which bypasses the dispatcher.
        on_parameter: ``(module, name, param)``: FSDP2 installed a sharded parameter
            without ``register_parameter``.
        on_init_process_group: ``(backend, kwargs)`` -> True when it has handled a rank
            function's own ``dist.init_process_group`` call (see :func:`_init_process_group`).
        on_sharded_gradients: ``([(parameter, gradient), ...])``: FSDP2 reduce-scattered
            gradients (and moved those of offloaded parameters to the host).
        allocating_as: ``(category)`` -> a ``with`` block in which new memory counts as
            ``category``: DDP's buckets, FSDP2's all-gather and reduce-scatter buffers,
            ``GradScaler``'s scale. Nested calls are counted.
        on_io: ``(write, nbytes, path)``: the rank wrote or read a file (path None: a
            file object without a name, or part of a file).
        on_checkpoint: ``()``: the rank has saved a checkpoint (a ``torch.save`` to a file,
            or a ``dcp.save`` whose metadata the coordinator has committed).
        not_charged: a reusable ``with`` block in which the rank is charged nothing
            (DTensor's replay of each op at the global shape).
        bulk: ``()`` -> the calling rank's accounting mode if the simulator may run ops
            with it set aside and charge them in bulk (``paused(bypass=True)``,
            ``charge_timeless(inputs, outputs)``), else None (see
            :func:`_verify_params_in_bulk`).
        on_forward_pre, on_forward_post, on_optimizer_pre, on_optimizer_post: torch's
            global module and optimizer hooks (see :data:`HOOKS`); ``on_parameter`` is
            also the global parameter-registration hook.
    """

    registry: object
    on_storage_resize: object
    on_parameter: object
    on_init_process_group: object
    on_sharded_gradients: object
    allocating_as: object
    on_io: object
    on_checkpoint: object
    not_charged: object
    bulk: object
    on_forward_pre: object
    on_forward_post: object
    on_optimizer_pre: object
    on_optimizer_post: object


class Patch(NamedTuple):
    """One process-wide replacement a run makes: while the run is on,
    ``owner.name = make(original, hooks)``; after it, ``owner.name = original`` again.

    ``owner`` is ``"module"`` or ``"module:Class"`` (an object for the few switches of
    this module's own). ``make`` None: nothing is replaced, the value is only put back
    after the run (torch changes it in every rank). ``imported_by``: the module is slow to
    import and many runs never use it, so the entry is applied only once ``imported_by``
    has been imported, at the start of the run or when a rank first imports it.
    ``undo(replacement)``, if given, runs once the original is back.
    """

    owner: object
    name: str
    make: object
    imported_by: str = None
    undo: object = None


class Hook(NamedTuple):
    """A global hook a run registers with torch's public API (``register``, a
    ``"module:function"``, given the ``RunHooks`` field ``callback``) and removes after;
    torch keeps it in the dict ``table``."""

    register: str
    callback: str
    table: str


class _CppSwitches:
    """torch's C++ switches that the table turns on, as attributes (torch has no getter)."""

    def __init__(self):
        self._thread_isolation = False

    @property
    def thread_isolation(self):
        """``_set_thread_isolation_mode``: each thread has its own C++ group-name registry,
        which functional collectives (DTensor, FSDP2) resolve groups in."""
        return self._thread_isolation

    @thread_isolation.setter
    def thread_isolation(self, on):
        torch._C._distributed_c10d._set_thread_isolation_mode(on)
        self._thread_isolation = on


SWITCHES = _CppSwitches()


def _wrapped(replacement, original):
    """``replacement``, carrying ``original``'s name and docstring (and ``__wrapped__``)."""
    return functools.update_wrapper(replacement, original)


def _resize(original, hooks):
    """``UntypedStorage.resize_`` that tells accounting (FSDP2 frees and refills its
    unsharded parameters with it, out of the dispatcher's sight)."""

    def resize_(storage, nbytes):
        result = original(storage, nbytes)
        hooks.on_storage_resize(storage, nbytes)
        return result

    return resize_


def _setattr_param(original, hooks):
    """FSDP2's ``unsafe_setattr_param``: the sharded parameters it installs are parameters."""

    def unsafe_setattr_param(module, name, param):
        original(module, name, param)
        hooks.on_parameter(module, name, param)

    return _wrapped(unsafe_setattr_param, original)


def _allocating_as(category, original, hooks):
    """``original``, with the memory it allocates counted as ``category``."""

    def call(*args, **kwargs):
        with hooks.allocating_as(category):
            return original(*args, **kwargs)

    return _wrapped(call, original)


def _foreach_reduce(original, hooks):
    """FSDP2's ``foreach_reduce``, whose buffers (the flat reduce-scatter input, the
    output before it becomes the sharded gradients) count as communication buffers; then
    accounting hears of the sharded gradients it made (views into the reduce-scatter's
    output, moved to the host for parameters with ``CPUOffloadPolicy``)."""

    def foreach_reduce(fsdp_params, *args, **kwargs):
        with hooks.allocating_as("communication buffers"):
            result = original(fsdp_params, *args, **kwargs)
        hooks.on_sharded_gradients([(p.sharded_param, p.sharded_param.grad)
                                    for p in fsdp_params])
        return result

    return _wrapped(foreach_reduce, original)


_FSDP = "torch.distributed.fsdp._fully_shard."
_FUNCOL = "torch.distributed._functional_collectives"
_REDISTRIBUTE = "torch.distributed.tensor._redistribute"
_SCHEDULES = "torch.distributed.pipelining.schedules"
_CHECKPOINT = "torch.distributed.checkpoint"
_NN_MODULE = "torch.nn.modules.module"
# torch.nn.modules.module's global forward and backward hook dicts (see _RankLocalHooks)
_MODULE_HOOK_DICTS = ("_global_forward_pre_hooks", "_global_forward_hooks",
                      "_global_forward_hooks_always_called",
                      "_global_forward_hooks_with_kwargs", "_global_backward_pre_hooks",
                      "_global_backward_hooks")
# Collectives of picklable objects send a pickle's bytes and its length in tensors they
# make themselves (from a buffer, which the fake mode would make a meta storage of) and
# read back: they run with the fake mode set aside (pipelining sends its stage metadata so).
_OBJECT_COLLECTIVES = ("all_gather_object", "broadcast_object_list", "gather_object",
                       "recv_object_list", "scatter_object_list", "send_object_list")


def patches():
    """The patch table: every attribute of torch (and of the interpreter) a run replaces,
    as :class:`Patch` entries. The module's docstring says why each is needed."""
    return (
        # per-thread process groups
        Patch("torch.distributed.distributed_c10d", "_world",
              lambda original, hooks: _ThreadLocalWorld(original, hooks.registry)),
        Patch(SWITCHES, "thread_isolation", lambda original, hooks: True),
        *(Patch(module, "init_process_group", _init_process_group)
          for module in ("torch.distributed", "torch.distributed.distributed_c10d")),
        Patch("torch.distributed.distributed_c10d", "_new_group_with_tag", _new_group_with_tag),
        Patch("sys", "excepthook", None),   # init_process_group prefixes it with "[rankN]"
        # memory accounting: what the dispatcher does not see, or cannot label
        Patch("torch:UntypedStorage", "resize_", _resize),
        Patch(_FSDP + "_fsdp_param", "unsafe_setattr_param", _setattr_param),
        Patch(_FSDP + "_fsdp_param_group", "foreach_all_gather",
              functools.partial(_allocating_as, "communication buffers")),
        Patch(_FSDP + "_fsdp_param_group", "foreach_reduce", _foreach_reduce),
        Patch("torch.amp.grad_scaler:GradScaler", "_lazy_init_scale_growth_tracker",
              functools.partial(_allocating_as, "optimizer state")),
        # DDP's reducer, pipelining's warm-up and the object collectives inside
        # sc.fake_tensors(): their integer bookkeeping stays real
        Patch("torch.distributed", "_verify_params_across_processes", _verify_params),
        Patch("torch.distributed", "Reducer", _reducer),
        Patch("torch._C._distributed_c10d:Reducer", "_rebuild_buckets", _rebuild_buckets),
        Patch(_SCHEDULES + ":_PipelineSchedule", "_warmup_p2p",
              lambda original, hooks: _with_real_bookkeeping(original),
              imported_by=_SCHEDULES),
        *(Patch(module, name, lambda original, hooks: _without_fake_mode(original))
          for name in _OBJECT_COLLECTIVES
          for module in ("torch.distributed", "torch.distributed.distributed_c10d")),
        # DTensor and functional collectives on fake tensors
        Patch(_FUNCOL, "_are_we_tracing", _are_we_tracing),
        Patch("torch.distributed.tensor._sharding_prop:ShardingPropagator", "_fake_mode_lock",
              lambda original, hooks: hooks.not_charged),
        # DTensor's redistribution plans and planners depend on the rank's coordinates
        # (uneven shards): one cache per rank, made afresh for each run
        Patch(_REDISTRIBUTE, "_gen_transform_infos",
              lambda original, hooks: _PerRankCache(original.__wrapped__)),
        Patch(_REDISTRIBUTE, "_planner_cache", lambda original, hooks: _PerRankDict()),
        # module hooks registered inside a rank fire for that rank's modules only
        *(Patch(_NN_MODULE, name, _rank_local_hooks, undo=_RankLocalHooks.clear_ranks)
          for name in _MODULE_HOOK_DICTS),
        # file I/O is charged to the node's storage
        Patch("torch", "save", _save),
        Patch("torch", "load", _load),
        Patch(_CHECKPOINT + ".filesystem:_FileSystemWriter", "write_data", _write_data,
              imported_by=_CHECKPOINT),
        Patch(_CHECKPOINT + ".filesystem:FileSystemReader", "read_data", _read_data,
              imported_by=_CHECKPOINT),
        Patch(_CHECKPOINT + ".filesystem:FileSystem", "create_stream", _create_stream,
              imported_by=_CHECKPOINT),
        Patch(_CHECKPOINT + ".state_dict_saver", "_save_state_dict", _save_state_dict,
              imported_by=_CHECKPOINT),
        # a save in a background thread cannot take turns with the ranks: refused
        *(Patch(module, "async_save", _async_save, imported_by=_CHECKPOINT)
          for module in (_CHECKPOINT, _CHECKPOINT + ".state_dict_saver")),
    )


# The global hooks a run registers (torch's public API): accounting follows module calls,
# parameter registration and optimizer steps.
HOOKS = (
    Hook(_NN_MODULE + ":register_module_forward_pre_hook", "on_forward_pre",
         _NN_MODULE + ":_global_forward_pre_hooks"),
    Hook(_NN_MODULE + ":register_module_forward_hook", "on_forward_post",
         _NN_MODULE + ":_global_forward_hooks"),
    Hook(_NN_MODULE + ":register_module_parameter_registration_hook", "on_parameter",
         _NN_MODULE + ":_global_parameter_registration_hooks"),
    Hook("torch.optim.optimizer:register_optimizer_step_pre_hook", "on_optimizer_pre",
         "torch.optim.optimizer:_global_optimizer_pre_hooks"),
    Hook("torch.optim.optimizer:register_optimizer_step_post_hook", "on_optimizer_post",
         "torch.optim.optimizer:_global_optimizer_post_hooks"),
)


def resolve(owner, import_missing=True):
    """The object ``owner`` names (``"module"`` or ``"module:Attr.Attr"``; an object
    stands for itself); None if ``import_missing`` is False and it is not loaded yet."""
    if not isinstance(owner, str):
        return owner
    module_name, _, path = owner.partition(":")
    if import_missing:
        obj = importlib.import_module(module_name)
    else:
        obj = sys.modules.get(module_name)
    try:
        for name in path.split(".") if path else ():
            obj = getattr(obj, name)
    except AttributeError:   # a module still loading
        if import_missing:
            raise
        return None
    return obj


@contextlib.contextmanager
def patched(hooks):
    """A ``with`` block in which every entry of the patch table (:func:`patches`) and every
    global hook of :data:`HOOKS` is in force, reporting to ``hooks`` (a :class:`RunHooks`).

    Entered once per run attempt (on the notebook's thread). Leaving it, also by an
    exception, puts every original back, in reverse order, and removes the hooks: a run
    changes nothing in torch that outlives it. Importing simcluster changes nothing.
    """
    with contextlib.ExitStack() as undo:
        waiting = []   # entries whose module is not imported yet

        def apply(patch, owner):
            original = getattr(owner, patch.name)
            replacement = original if patch.make is None else patch.make(original, hooks)
            setattr(owner, patch.name, replacement)
            undo.callback(_put_back, owner, patch.name, original, replacement, patch.undo)

        def apply_imported():
            for patch in list(waiting):
                owner = resolve(patch.owner, import_missing=False)
                if owner is not None and patch.imported_by in sys.modules:
                    waiting.remove(patch)
                    apply(patch, owner)

        for patch in patches():
            if patch.imported_by is None:
                apply(patch, resolve(patch.owner))
            else:
                waiting.append(patch)
        apply_imported()
        if waiting:
            finder = _PatchOnImport({p.imported_by for p in waiting}, apply_imported)
            sys.meta_path.insert(0, finder)
            undo.callback(sys.meta_path.remove, finder)
        for hook in HOOKS:
            handle = resolve(hook.register)(getattr(hooks, hook.callback))
            undo.callback(handle.remove)
        yield


def _put_back(owner, name, original, replacement, undo):
    setattr(owner, name, original)
    if undo is not None:
        undo(replacement)


class _PatchOnImport(importlib.abc.MetaPathFinder):
    """On ``sys.meta_path`` during a run: when one of the modules ``names`` is first
    imported (inside a rank, even inside ``sc.fake_tensors()``), ``patch()`` runs as soon
    as it has loaded and applies the entries that waited for it."""

    def __init__(self, names, patch):
        self.names, self.patch = names, patch

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.names:
            return None
        for finder in sys.meta_path:
            find = None if finder is self else getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None and spec.loader is not None:
                load, patch = spec.loader.exec_module, self.patch

                def exec_module(module):
                    load(module)
                    patch()

                spec.loader.exec_module = exec_module   # this spec's own loader
                return spec
        return None


def _are_we_tracing(original, hooks):
    """torch's ``_functional_collectives._are_we_tracing``, but ``sc.fake_tensors()`` is
    not tracing.

    Torch takes any active fake mode for ``torch.compile`` tracing, and a functional
    collective issued while tracing waits at once (``wait_tensor``) instead of returning
    an ``AsyncCollectiveTensor`` that waits when its value is first used. On fake tensors
    the communication would then never overlap the compute that follows it, as it does
    on real tensors: a longer step. Torch's own answer is kept for real tracing.
    """

    def are_we_tracing():
        if not _is_sim_fake_mode(torch._C._get_dispatch_mode(
                torch._C._TorchDispatchModeKey.FAKE)):
            return original()
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return original()

    return _wrapped(are_we_tracing, original)


def _is_sim_fake_mode(mode):
    """True for a mode made by :func:`fake_tensor_mode`."""
    return _fake_mode_type is not None and type(mode) is _fake_mode_type


class _RankLocalHooks(dict):
    """Stands in for one of ``torch.nn.modules.module``'s global module-hook dicts while
    a run is active: a hook registered from a rank thread fires only for that rank's
    modules.

    Torch's process-wide module hooks (``register_module_forward_pre_hook`` and the rest)
    fire for every module call in the process. Tools that a learner opens inside a rank,
    such as ``CommDebugMode`` and ``ModTracker``, register them to follow that rank's
    modules; with ranks as threads, every rank's calls would reach every rank's tool
    (``CommDebugMode`` then stops with a ``KeyError`` naming another rank's module).
    Hooks registered outside the ranks (before the run, or by the simulator itself, on
    the thread that started the run: ``outside``) live in torch's own dict and fire for
    everyone, as before.
    """

    def __init__(self, shared):
        super().__init__()
        self.shared = shared          # torch's own dict
        self.ranks = {}               # thread id -> that rank thread's own hooks
        self.outside = None           # the thread that started the run

    def clear_ranks(self):
        """Forget the hooks the ranks of a finished run registered."""
        self.ranks.clear()

    def _own(self, create=False):
        """This thread's own hooks (None on the thread that started the run)."""
        me = threading.get_ident()
        if me == self.outside:
            return None
        own = self.ranks.get(me)
        if own is None and create:
            own = self.ranks[me] = {}
        return own

    def _view(self):
        own = self.ranks.get(threading.get_ident())   # read on every module call: quick
        return {**self.shared, **own} if own else self.shared

    def __setitem__(self, key, value):
        own = self._own(create=True)
        (self.shared if own is None else own)[key] = value

    def __delitem__(self, key):
        own = self._own()
        del (own if own and key in own else self.shared)[key]

    def __getitem__(self, key):
        return self._view()[key]

    def __contains__(self, key):
        return key in self._view()

    def __iter__(self):
        return iter(self._view())

    def __len__(self):
        return len(self._view())

    def get(self, key, default=None):
        return self._view().get(key, default)

    def keys(self):
        return self._view().keys()

    def values(self):
        return self._view().values()

    def items(self):
        return self._view().items()


# Each global module-hook dict's stand-in, made once and kept: a hook's RemovableHandle
# holds a weak reference to the dict it was registered in.
_rank_local_hook_dicts = {}


def _rank_local_hooks(original, hooks):
    """The :class:`_RankLocalHooks` that stands in for torch's dict ``original``."""
    proxy = _rank_local_hook_dicts.get(id(original))
    if proxy is None or proxy.shared is not original:
        proxy = _rank_local_hook_dicts[id(original)] = _RankLocalHooks(original)
    proxy.clear_ranks()
    proxy.outside = threading.get_ident()
    return proxy


def _own(local, make):
    """The calling thread's ``local.value``, made with ``make()`` on its first use."""
    try:
        return local.value
    except AttributeError:
        local.value = make()
        return local.value


class _PerRankCache:
    """A ``functools.cache`` of ``function`` of each thread's own, for a module-level
    cache whose entries hold one rank's view (DTensor's redistribution plans)."""

    def __init__(self, function):
        self._function, self._local = function, threading.local()

    def __call__(self, *args, **kwargs):
        return _own(self._local, lambda: functools.cache(self._function))(*args, **kwargs)

    def cache_clear(self):
        _own(self._local, lambda: functools.cache(self._function)).cache_clear()


class _PerRankDict(collections.abc.MutableMapping):
    """A dict whose contents each thread has of its own (a module-level cache dict)."""

    def __init__(self):
        self._local = threading.local()

    def _dict(self):
        return _own(self._local, dict)

    def __getitem__(self, key):
        return self._dict()[key]

    def __setitem__(self, key, value):
        self._dict()[key] = value

    def __delitem__(self, key):
        del self._dict()[key]

    def __iter__(self):
        return iter(self._dict())

    def __len__(self):
        return len(self._dict())


def _new_group_with_tag(original, hooks):
    """``_new_group_with_tag`` (behind ``new_group``), keeping ``pg_tag`` as gloo does.

    torch hands the creation to a default group that implements ``new_group`` (the
    sim's does) and files the result under ``ptd:<name>`` whatever the tag. Here, as in
    torch's own path for gloo: a group with the tag and these ranks is returned again
    (the group counter still moves on, as it does there), a new one is filed under
    ``user:<tag>`` only, where ``_find_pg_by_ranks_and_tag`` looks.
    """
    signature = inspect.signature(original)

    def new_group_with_tag(*args, **kwargs):
        call = signature.bind(*args, **kwargs)
        call.apply_defaults()
        tag = call.arguments["pg_tag"]
        if tag in (None, "") or hooks.registry() is None:
            return original(*args, **kwargs)
        ranks = call.arguments["ranks"]
        ranks = list(range(c10d.get_world_size())) if ranks is None else list(ranks)
        if call.arguments["sort_ranks"]:
            ranks.sort()
        existing = c10d._find_pg_by_ranks_and_tag(tag, ranks)
        if existing is not None:
            c10d._process_group_name(ranks, call.arguments["use_local_synchronization"])
            return existing
        group = original(*args, **kwargs)
        if group is not None and group is not c10d.GroupMember.NON_GROUP_MEMBER:
            world = c10d._world
            old = world.pg_to_tag[group]
            world.tags_to_pg[old].remove(group)
            if not world.tags_to_pg[old]:
                del world.tags_to_pg[old]
            world.tags_to_pg.setdefault(f"user:{tag}", []).append(group)
            world.pg_to_tag[group] = f"user:{tag}"
        return group

    return _wrapped(new_group_with_tag, original)


def _init_process_group(original, hooks):
    """``dist.init_process_group`` that a rank function may call as it would under torchrun.

    ``hooks.on_init_process_group(backend, kwargs)`` is called on every call; it returns
    True when it has handled the call (the thread is a simulated rank whose default group
    already exists), or False to fall through to torch's own function.
    """

    def init_process_group(backend=None, *args, **kwargs):
        if hooks.on_init_process_group(backend, kwargs):
            return None
        return original(backend, *args, **kwargs)

    init_process_group.__doc__ = original.__doc__
    init_process_group.__wrapped__ = original
    return init_process_group


class _RealBookkeeping(TorchDispatchMode):
    """Inside ``sc.fake_tensors()``: keeps the tensors DDP's C++ reducer reads back real.

    The reducer writes parameter counts, shapes and bucket indices into small integer
    tensors and reads them through raw pointers (``accessor``, ``item``); fake tensors
    have no memory, so torch stops with "The tensor has a non-zero number of elements,
    but its data is not allocated yet". Under this mode integer tensors the reducer
    creates, and every op on real tensors only, run with the fake mode set aside; a
    floating-point tensor it creates (a gradient bucket, as large as the gradients) and
    every op on a fake tensor stay fake, so memory is accounted without being allocated.
    """

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if types:   # a FakeTensor among the arguments
            return func(*args, **kwargs)
        dtype = kwargs.get("dtype")
        creates_floats = (dtype is None or dtype.is_floating_point or dtype.is_complex) \
            and not any(isinstance(a, torch.Tensor) for a in args)
        if creates_floats:
            return func(*args, **kwargs)
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return func(*args, **kwargs)


def _with_real_bookkeeping(function):
    """``function`` (one that keeps bookkeeping in integer tensors it reads back), run
    under :class:`_RealBookkeeping` when tensors are fake."""

    def call(*args, **kwargs):
        if not fake_mode_active():
            return function(*args, **kwargs)
        with _RealBookkeeping():
            return function(*args, **kwargs)

    return functools.update_wrapper(call, function)


def _without_fake_mode(function):
    """``function``, run with ``sc.fake_tensors()`` set aside: everything it makes is real."""

    def call(*args, **kwargs):
        if not fake_mode_active():
            return function(*args, **kwargs)
        from torch._subclasses.fake_tensor import unset_fake_temporarily

        with unset_fake_temporarily():
            return function(*args, **kwargs)

    return functools.update_wrapper(call, function)


def _verify_params(original, hooks):
    """``dist._verify_params_across_processes``, DDP's check at construction that every rank
    has as many parameters, of the same shapes and strides: with real bookkeeping inside
    ``sc.fake_tensors()`` (:func:`_with_real_bookkeeping`), and as
    :func:`_verify_params_in_bulk` where the accounting can charge its per-rank ops in
    bulk (``hooks.bulk()``; elsewhere torch's own C++ runs)."""
    checked = _with_real_bookkeeping(original)

    def verify(process_group, params, logger=None):
        acc = hooks.bulk()
        # (a function mode, such as torch.device("meta"), would see this Python's calls,
        # where it sees nothing of the C++)
        if (acc is None or not params or torch._C._len_torch_function_stack()
                or not acc.fits(8 * (process_group.size() + 1))):
            return checked(process_group, params, logger)
        return _verify_params_in_bulk(acc, process_group, params, logger)

    return functools.update_wrapper(verify, original)


def _verify_params_in_bulk(acc, group, params, logger):
    """torch's C++ ``verify_params_across_processes`` (``reducer.cpp``), step for step, with
    the ops the accounting mode ``acc`` sees in the same order and charged the same, but
    the ones it makes per rank of the group run with the mode set aside.

    On n ranks the C++ makes, on every rank, an ``empty_like`` output per rank for an
    all-gather of the parameter counts and reads each back (``select``, ``item``): 3 n ops
    per rank, 3 M through Python on 1,024 ranks (and n storages per rank to count and
    free). Here the n outputs are rows of one buffer. Why the charges are the same: those
    ops take no time (the accounting charges ``empty_like`` and ``item`` none, a view
    nothing), so all they are charged is a wait for communication still writing what
    they read, and memory: n storages of one element, counted, retagged as
    communication buffers by the all-gather and freed on return, each group at one
    simulated instant. A memory account keeps one history entry per instant and peaks
    of its totals, which rise the same by n allocations of b bytes as by one of n b (a
    device that could not hold them all runs torch's C++, so that out-of-memory comes
    at the same allocation). The ops that take time, and the collectives, run as in
    C++, through the mode and the process group."""
    # at::tensor({count}): an empty (seen by the mode), then a memcpy (not seen)
    size = torch.empty((1,), dtype=torch.long, device=params[0].device)
    n = group.size()
    with acc.paused(bypass=True):
        size.fill_(len(params))
        gathered = torch.empty((n,), dtype=torch.long, device=params[0].device)
        with torch.no_grad():   # (views without autograd's bookkeeping: faster)
            rows = gathered.split(1)
    acc.charge_timeless([size], [gathered])
    group.allgather([rows], [size]).wait()
    acc.charge_timeless([gathered], ())   # the items read it (one storage: one wait)
    with acc.paused(bypass=True):
        counts = gathered.tolist()
    for i, count in enumerate(counts):
        if count != len(params):
            raise RuntimeError(
                f"DDP expects same model across all ranks, but Rank {group.rank()} has "
                f"{len(params)} params, while rank {i} has inconsistent {count} params.")
    # every parameter's sizes then strides, broadcast from rank 0 and compared
    mine = [value for p in params for value in (*p.shape, *p.stride())]
    cpu = torch.device("cpu")   # at::empty without a device
    metadata = torch.empty((len(mine),), dtype=torch.long, device=cpu)
    with acc.paused(bypass=True):   # written through an accessor, cloned: not seen
        metadata.copy_(torch.tensor(mine, dtype=torch.long, device=cpu))
        metadata_dev = metadata.clone()
    group.broadcast([metadata_dev]).wait()
    control = torch.empty((len(mine),), dtype=torch.long, device=cpu)
    control.copy_(metadata_dev)
    with acc.paused(bypass=True):
        theirs = control.tolist()
    i = 0
    for p, param in enumerate(params):
        sizes = list(param.shape)
        for what, values in (("sizes", param.shape), ("strides", param.stride())):
            for value in values:
                if value != theirs[i]:
                    where = f"[{group.rank()}]: " if what == "sizes" else ""
                    message = (f"{where}params[{p}] in this process with sizes {sizes} "
                               f"appears not to match {what} of the same param in "
                               "process 0.")
                    if logger is not None:   # REDUCER_CHECK: log, then throw
                        logger.set_error_and_log(message)
                    raise RuntimeError(message)
                i += 1


def _reducer(original, hooks):
    """DDP's C++ ``Reducer``, with its bookkeeping kept real inside ``sc.fake_tensors()``
    and its gradient buckets (made at construction) allocated as communication buffers,
    or as gradients when the gradients are views into them
    (``gradient_as_bucket_view=True``)."""
    init = _with_real_bookkeeping(original.__init__)

    class Reducer(original):
        def __init__(self, *args, **kwargs):
            # DDP passes gradient_as_bucket_view eighth: its buckets then hold the gradients
            views = args[7] if len(args) > 7 else kwargs.get("gradient_as_bucket_view", False)
            self._sim_bucket_category = "gradients" if views else "communication buffers"
            with hooks.allocating_as(self._sim_bucket_category):
                init(self, *args, **kwargs)

    Reducer.__name__ = Reducer.__qualname__ = original.__name__
    return Reducer


def _rebuild_buckets(original, hooks):
    """``Reducer._rebuild_buckets`` (the first forward after a step remakes the buckets),
    with real bookkeeping and the buckets in the category the reducer was made with."""
    rebuild = _with_real_bookkeeping(original)

    def rebuild_buckets(self):
        with hooks.allocating_as(getattr(self, "_sim_bucket_category",
                                         "communication buffers")):
            return rebuild(self)

    return functools.update_wrapper(rebuild_buckets, rebuild)


def fake_tensor_mode():
    """A context in which new tensors have shapes and dtypes but no data (FakeTensorMode),
    except what is computed from real integer tensors alone (see :func:`_fake_mode_class`).
    """
    global _fake_mode_type
    if _fake_mode_type is None:
        _fake_mode_type = _fake_mode_class()
    return _fake_mode_type(allow_non_fake_inputs=True)


_fake_mode_type = None


def _fake_mode_class():
    """FakeTensorMode, but functional collectives reach the simulated network, and an op
    whose tensors are all real integers (or booleans) runs on their data.

    Functional collectives (``torch.ops._c10d_functional``) run their real kernels, which
    call the process group, so DTensor's communication is simulated on fake tensors too.

    Torch's own bookkeeping keeps counters and flags in small integer tensors it made real
    and reads them back with ``.item()``: DDP's reducer marks the parameters a step used
    (``find_unused_parameters=True``) in one and reads it after the backward pass. In
    plain FakeTensorMode every op on them turns them fake, and the read stops with
    ``DataDependentOutputException: aten._local_scalar_dense``. Floating-point data, and
    every op that touches a fake tensor, stay fake, so a large model is still not
    allocated.
    """
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    def real_integers_only(values, found):
        """True if ``values`` hold real integer tensors and no other tensor; None if no
        tensor at all."""
        for value in values:
            if isinstance(value, torch.Tensor):
                if type(value) is not torch.Tensor or value.is_floating_point() \
                        or value.is_complex():
                    return False
                found = True
            elif isinstance(value, (list, tuple)):
                found = real_integers_only(value, found)
                if found is False:
                    return False
        return found

    cpu = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)

    class SimFakeTensorMode(FakeTensorMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            if func.namespace == "_c10d_functional":
                # Functional collectives (DTensor's, torch.compile's) are answered from
                # shapes alone by FakeTensorMode, and never reach the process group. Their
                # CPU kernels call the group as on real tensors (the sim backend moves no
                # data between fake tensors); what they allocate stays fake.
                with self:
                    return func.redispatch(cpu, *args, **kwargs)
            if FakeTensor not in types \
                    and real_integers_only((*args, *kwargs.values()), None) is True:
                return func(*args, **kwargs)   # this mode is off while it dispatches
            return super().__torch_dispatch__(func, types, args, kwargs)

    return SimFakeTensorMode


class _FakeCache:
    """Answers repeated ops on fake tensors from FakeTensorMode's own cache, quickly.

    FakeTensorMode already caches each op's output metadata, but finding the entry costs
    about 200 µs in Python per op (it hashes every tensor's full metadata through several
    layers). A LLaMA-7B step on 8 ranks runs hundreds of thousands of ops, nearly all
    repeats (every layer is the same), so that lookup alone took minutes. Here a cheaper
    key, built from the same facts torch's key is built from (op, global dtype/device/
    inference state, each fake tensor's shape, stride, dtype, offset, device, storage size,
    requires_grad, and every other argument's type and value), maps straight to torch's
    entry, and the result is built from it as torch builds it (:meth:`_simple_output`):
    in-place ops return their argument, views share its storage, new tensors get fresh
    storage. A
    few ops torch will not cache are remembered here when that is safe; other ops, and
    arguments we cannot key, take torch's normal road.
    """

    _SIMPLE = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
               torch.memory_format)

    def __init__(self):
        from torch._subclasses import fake_tensor

        self.fake_tensor = fake_tensor
        # our key -> (torch's key, torch's entry, torch's key state, _simple_output(...))
        self.entries = {}
        self.kept = {}   # id(op) -> op, for every op in a key: an op's id stays its own
        self.fresh_attributes = {}   # device -> a new FakeTensor's attributes but its mode
        self.device_op = DEVICE_OP
        self.proxy = torch._C._TorchDispatchModeKey.PROXY   # tracing keys differently
        self.fake_key = torch._C._TorchDispatchModeKey.FAKE
        self.empty_like = torch.ops.aten.empty_like.default
        self.unsafe_view = torch.ops.aten._unsafe_view.default

    @staticmethod
    def _from_meta(args, kwargs):
        """True for ``empty_like(dense meta tensor or parameter, device=...)``."""
        t = args[0]
        return (type(t) in (torch.Tensor, torch.nn.Parameter) and t.is_meta and len(args) == 1
                and kwargs.get("device") is not None and t.is_contiguous()
                and kwargs.get("memory_format") in (None, torch.preserve_format)
                and set(kwargs) <= {"dtype", "layout", "device", "pin_memory",
                                    "memory_format"})

    @staticmethod
    def _global_key(func):
        """The start of a key: the op (by id: hashing an OpOverload is a Python call), and
        the global state its result depends on."""
        return [id(func), torch.get_default_dtype(), torch._C._get_default_device(),
                torch.is_inference_mode_enabled()]

    def _key_of(self, values, into, modes):
        """Append the key of each of ``values`` to ``into``; False if one cannot be keyed."""
        fake_type, simple = self.fake_tensor.FakeTensor, self._SIMPLE
        for value in values:
            kind = type(value)
            if kind is fake_type:
                constant, layout, mode, shape, dtype, device, requires_grad = \
                    _fake_metadata(value)
                if constant is not None or layout is not torch.strided:
                    return False
                modes.add(mode)
                into.append((shape, value.stride(), dtype, value.storage_offset(), device,
                             requires_grad, value.untyped_storage().nbytes(),
                             dtype.is_complex and (value.is_conj(), value.is_neg())))
            elif kind in simple:
                into.append((kind, value))
            elif kind is list or kind is tuple:
                into.append((kind, len(value)))
                if not self._key_of(value, into, modes):
                    return False
            else:
                return False   # a real tensor, a SymInt, a function, ...: not ours to key
        return True

    def dispatch(self, func, args, kwargs):
        """Run ``func`` on fake tensors, from the cache when this exact call was seen."""
        if func is self.device_op and type(args[0]) is self.fake_tensor.FakeTensor:
            return fake_device(args[0])   # what FakeTensorMode answers, without the trip
        if func is self.empty_like and self._from_meta(args, kwargs):
            # to_empty() on a meta model: torch would first convert each meta tensor into
            # a fake one (~0.7 ms each); a dense tensor's empty_like is just empty_strided.
            t = args[0]   # arguments as the dispatcher boxes them, so torch's key matches
            return self.dispatch(torch.ops.aten.empty_strided.default,
                                 (list(t.shape), list(t.stride())), {
                "dtype": kwargs.get("dtype") or t.dtype, "layout": torch.strided,
                "device": torch.device(kwargs["device"]),
                "pin_memory": bool(kwargs.get("pin_memory"))})
        if func.namespace == "profiler":
            # record_function's markers (FSDP2 sets many) hold no tensors: no fake needed.
            with torch._C._DisableTorchDispatch():
                return func(*args, **kwargs)
        key = self._global_key(func)
        modes = set()
        # A FakeTensor's attributes cost half as much while tensor subclasses' own
        # __torch_function__ is off (torch then skips looking for it on each one).
        with _no_subclass_torch_function():
            keyable = self._key_of(args, key, modes) and (
                not kwargs or self._key_of(kwargs.items(), key, modes))
        if not modes:   # a factory op (empty, zeros, ...): the active fake mode makes it
            active = torch._C._get_dispatch_mode(self.fake_key)
            if active is not None:
                modes.add(active)
        if not keyable or len(modes) != 1 or torch._C._get_dispatch_mode(self.proxy) is not None:
            return func(*args, **kwargs)
        (mode,) = modes
        if mode.shape_env is not None or not mode.cache_enabled:
            return func(*args, **kwargs)
        key = tuple(key)
        hit = self.entries.get(key, self)
        if type(hit) is tuple:   # torch's entry
            simple = hit[3]
            if simple is None:
                return mode._output_from_cache_entry(hit[2], hit[1], hit[0], func, args)
            metadata, view = simple   # a view shares its argument's storage
            return self._fake(mode, metadata, None if view is None else args[view])
        if hit is None:          # seen before: torch does not cache this op
            return func(*args, **kwargs)
        if hit is _RETURNS_NOTHING:
            return None
        if hit is _RETURNS_OUT:
            return kwargs["out"]
        if type(hit) is _Alias:
            return self._fake(mode, hit, args[0])
        # First time: let FakeTensorMode run it (and cache it), then remember its entry.
        self.kept[id(func)] = func
        state = self.fake_tensor._CacheKeyState(mode.shape_env)
        try:
            torch_key = mode._cache_key(state, func, args, kwargs)
        except self.fake_tensor._BypassDispatchCache:
            torch_key = None
        out = func(*args, **kwargs)
        entry = self.fake_tensor.FakeTensorMode.cache.get(torch_key)
        if entry is not None and not isinstance(entry, self.fake_tensor._DispatchCacheBypassEntry):
            self.entries[key] = (torch_key, entry, state, self._simple_output(func, entry))
        elif func is self.unsafe_view and type(out) is self.fake_tensor.FakeTensor \
                and out.untyped_storage()._cdata == args[0].untyped_storage()._cdata:
            # torch will not cache _unsafe_view (~1 ms; matmul on 3-D inputs calls it),
            # because it shares its input's storage without being a view for autograd.
            self.entries[key] = _Alias(tuple(out.shape), out.stride(), out.dtype,
                                       out.storage_offset(), out.requires_grad,
                                       out.fake_device)
        elif out is None and self._unchanged(key, func, args, kwargs):
            # torch will not cache ops outside aten (FSDP2's split_with_sizes_copy,
            # chunk_cat, ~2 ms each), but one that returns nothing and left every tensor's
            # metadata as it was does only that again, given the same metadata.
            self.entries[key] = _RETURNS_NOTHING
        elif out is not None and kwargs.get("out") is out \
                and type(out) is self.fake_tensor.FakeTensor \
                and self._unchanged(key, func, args, kwargs):
            # torch will not cache ops with an out= argument (DDP's reducer copies each
            # gradient into its bucket with mul.out, ~1 ms each); one that wrote into
            # `out` without resizing it does only that again, given the same metadata.
            self.entries[key] = _RETURNS_OUT
        else:
            self.entries[key] = None
        return out

    @staticmethod
    def _simple_output(func, entry):
        """How to build the result of the op ``func`` from torch's cache ``entry``.

        The common case, one plain strided tensor, is built by :meth:`_fake` as torch
        builds it (``_get_output_tensor_from_cache_entry``) without its generality: about
        25 µs instead of 50. It gives ``(its metadata, the index of the argument whose
        storage it shares, or None)``; None sends everything else to torch's own builder.
        """
        info = entry.output_infos[0] if len(entry.output_infos) == 1 else None
        m = info.metadata if info is not None else None
        if entry.is_output_tuple or m is None or info.inplace_idx is not None \
                or m.layout is not torch.strided or m.is_conj or m.is_neg:
            return None
        return m, (info.view_idx if func.is_view else None)

    def _fake(self, mode, m, base=None):
        """A FakeTensor with the metadata ``m``, on ``base``'s storage if given.

        Built as ``FakeTensor(mode, meta, device)`` builds it, at a quarter of the cost
        (its argument checks and a dozen attribute descriptors took ~20 µs of the ~40 µs
        of a cached op): a meta tensor made with every Python mode off, wrapped by
        ``_make_subclass``, given the attributes a fresh FakeTensor on that device has.
        """
        with torch._C._DisableTorchDispatch():   # a plain meta tensor, not a fake one
            out = torch.empty_strided(m.shape, m.stride, dtype=m.dtype, device="meta",
                                      requires_grad=m.requires_grad)
            if base is not None:
                out.set_(base.untyped_storage(), m.storage_offset, m.shape, m.stride)
        attributes = self.fresh_attributes.get(m.device)
        if attributes is None or self.fake_tensor.FakeTensorConfig.debug:
            fake = self.fake_tensor.FakeTensor(mode, out, m.device)
            attributes = dict(vars(fake))
            del attributes["fake_mode"]
            self.fresh_attributes[m.device] = attributes
            return fake
        fake = torch.Tensor._make_subclass(self.fake_tensor.FakeTensor, out, out.requires_grad,
                                           dispatch_device=True,
                                           device_for_backend_keys=attributes["_fake_device"])
        if mode._allow_unsafe_data_ptr_access:
            torch._C._set_warn_deprecated_on_mutable_data_ptr(fake)
        else:
            torch._C._set_throw_on_mutable_data_ptr(fake)
        vars(fake).update(attributes)
        fake.fake_mode = mode
        return fake

    def _unchanged(self, key, func, args, kwargs):
        """Whether the arguments' key is still ``key`` (no shape, stride, size changed)."""
        after = self._global_key(func)
        self._key_of(args, after, set())
        if kwargs:
            self._key_of(kwargs.items(), after, set())
        return tuple(after) == key


_RETURNS_NOTHING = object()   # a cache entry: the op returns None and changes no metadata
_RETURNS_OUT = object()       # a cache entry: the op returns its out= tensor, unresized


_no_subclass_torch_function = torch._C.DisableTorchFunctionSubclass
# What a FakeTensor's key starts with, in one call: (constant, layout, fake_mode, shape,
# dtype, device, requires_grad); the device as FakeTensor.fake_device gives it
_fake_metadata = operator.attrgetter("constant", "layout", "fake_mode", "shape", "dtype",
                                     "_fake_device", "requires_grad")


class _Alias(NamedTuple):
    """A cache entry: a result on its first argument's storage, with this metadata."""

    shape: tuple
    stride: tuple
    dtype: torch.dtype
    storage_offset: int
    requires_grad: bool
    device: torch.device
_fake_cache = None


def cpu_stream():
    """The CPU stream selected now (``torch.cpu.stream(s)`` selects one, process-wide)."""
    return torch.cpu._current_stream


def set_cpu_stream(stream):
    """Select ``stream`` as the current CPU stream (a rank's own, restored at a switch)."""
    torch.cpu._current_stream = stream


def default_cpu_stream():
    """The CPU stream selected when nothing else is: the rank's compute stream."""
    return torch.cpu._default_cpu_stream


def on_side_stream():
    """True while code runs under ``torch.cpu.stream(s)`` with a stream of its own.

    FSDP2 issues its all-gathers and reduce-scatters that way. On GPUs a collective waited
    on there makes only that stream wait; the compute stream waits later, on an event,
    when it needs the result.
    """
    return torch.cpu._current_stream is not torch.cpu._default_cpu_stream


_FakeTensor = None   # torch._subclasses.fake_tensor.FakeTensor, imported when first asked


def is_fake(tensor):
    """True for a FakeTensor: shapes and dtypes, no data."""
    return isinstance(tensor, _FakeTensor or fake_tensor_class())


def fake_tensor_class():
    """FakeTensor (imported when first asked: a collective asks once per tensor)."""
    global _FakeTensor
    if _FakeTensor is None:
        from torch._subclasses.fake_tensor import FakeTensor as _FakeTensor
    return _FakeTensor


# C++ asks a FakeTensor its device through the dispatch modes, with this op: on a fake
# model half of all the ops a mode sees (:class:`_FakeCache` answers it with fake_device)
DEVICE_OP = torch.ops.prim.device.default
fake_device = operator.attrgetter("fake_device")   # a FakeTensor's device, without a frame

_get_dispatch_mode = torch._C._get_dispatch_mode
FAKE_MODE_KEY = torch._C._TorchDispatchModeKey.FAKE


def fake_mode_active():
    """True inside :func:`fake_tensor_mode` (new tensors are fake)."""
    return _get_dispatch_mode(FAKE_MODE_KEY) is not None


def op_kernel(func):
    """What calling the aten op ``func`` calls: ``func(*a, **k)`` is ``op_kernel(func)(*a,
    **k)``, without ``OpOverload.__call__``'s Python frame (the accounting calls it for
    every op)."""
    kernel = getattr(func, "_op", None) if type(func) is torch._ops.OpOverload else None
    return func if kernel is None else kernel


def no_dispatch_mode():
    """True if no dispatch mode (the accounting's, a fake mode, a learner's) sees the ops
    the calling thread runs now."""
    return torch._C._len_torch_dispatch_stack() == 0


def can_set_aside(mode):
    """True if :func:`set_aside` would set ``mode`` aside now: it is the calling thread's
    innermost dispatch mode and no fake mode is active."""
    n = torch._C._len_torch_dispatch_stack()
    return (n > 0 and torch._C._get_dispatch_stack_at(n - 1) is mode
            and not fake_mode_active())


@contextlib.contextmanager
def set_aside(mode):
    """A ``with`` block in which the dispatch mode ``mode`` sees no op, if it is the
    innermost mode of the calling thread and no fake mode is active (it yields True);
    otherwise nothing changes (it yields False). The simulator's own work (a collective's
    result) then runs straight into torch's kernels instead of through Python per op."""
    if not can_set_aside(mode):
        yield False
        return
    torch._C._pop_torch_dispatch_stack(None)
    try:
        yield True
    finally:
        torch._C._push_on_torch_dispatch_stack(mode)


def fake_dispatch(func, args, kwargs):
    """``func(*args, **kwargs)`` for an op whose tensors are fake, answered from a cache.

    Gives exactly what FakeTensorMode gives; see :class:`_FakeCache` for why and how.
    """
    global _fake_cache
    if _fake_cache is None:
        _fake_cache = _FakeCache()
    return _fake_cache.dispatch(func, args, kwargs)




def rank_registry():
    """A fresh, empty process-group registry for the calling rank thread (what
    ``RunHooks.registry`` gives torch on that thread)."""
    # Backward passes run on the rank's own thread, never on autograd worker threads
    # that would escape the scheduler.
    torch.autograd.set_multithreading_enabled(False).__enter__()
    return _RankWorld()


def destroy_rank_groups():
    """Destroy the calling rank thread's process groups (its run is over)."""
    if dist.is_initialized():
        dist.destroy_process_group()


def register_backend(name, creator):
    """Register ``creator(backend_options, pg_options)`` as torch.distributed backend ``name``."""
    if name.upper() not in dist.Backend._plugins:
        dist.Backend.register_backend(name, creator, extended_api=True, devices=["cpu"])


def backend_options_fields(options):
    """Return ``(group_name, group_rank, group_size, global_ranks)`` from torch's options."""
    return (
        str(options.group_id),
        options.group_rank,
        options.group_size,
        list(options.global_ranks_in_group),
    )


def init_default_group(rank, world_size, store):
    """Initialise the calling rank's default group on the ``sim`` backend."""
    _torch_init_process_group("sim", rank=rank, world_size=world_size, store=store)


def reduce_op_name(op) -> str:
    """``"SUM"``, ``"AVG"``, ... for a ``dist.ReduceOp`` or its ``RedOpType``."""
    op = getattr(op, "op", op)
    return op.name


WorkBase = torch._C._distributed_c10d.Work


# ------------------------------------------------------------- for accounting
class DispatchMode(TorchDispatchMode):
    """``TorchDispatchMode`` without torch's ``torch._dynamo.disable`` wrapper around each op.

    torch wraps a mode's ``__torch_dispatch__`` so that ``torch.compile`` skips its frames;
    the wrapper imports ``torch._dynamo`` on the first op (1-4 s, which would look like a
    hang in the first run) and costs about 0.5 µs on every op after. The simulator's
    modes run eagerly anyway.

    ``ignore_compile_internals``: ``torch.compile`` inside a rank compiles as if no mode
    were on and the mode sees the compiled code's ops when they run (without it dynamo
    would refuse to compile under a mode, or trace into ``__torch_dispatch__``).
    """

    @classmethod
    def _should_skip_dynamo(cls):
        return False

    @classmethod
    def ignore_compile_internals(cls):
        return True


class _RunsTheCollective(DispatchMode):
    """At the bottom of the mode stack while :func:`through_c10d` calls a c10d op: runs
    the simulator's collective where torch's kernel would run (that kernel asks the group
    for a C++ backend, which a Python process group does not have)."""

    def __init__(self, run, returns_work_only):
        super().__init__()
        self.run, self.returns_work_only, self.work = run, returns_work_only, None

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.work = self.run()
        boxed = self.work.boxed()
        return boxed if self.returns_work_only else (args[0], boxed)


def through_c10d(op, make_args, run):
    """``run()``, the simulator's collective (it returns the ``Work``), seen by the
    dispatch modes a learner opened (``CommDebugMode``, ``DebugMode``) as the c10d op
    ``op`` called with ``make_args()``, as gloo's collectives are: torch's C++ ``ProcessGroup``
    calls ``torch.ops.c10d.<op>`` and the op reaches gloo, but a Python ``ProcessGroup``
    such as the sim's is called directly, past the dispatcher. Returns the Work.

    Without such a mode (the usual case: only the simulator's own, which charge
    collectives themselves), or inside ``sc.fake_tensors()`` (the fake mode would answer
    the op with its meta kernel instead of running it), ``run()`` runs directly.
    """
    stack = torch._C._len_torch_dispatch_stack()
    if stack == 0 or fake_mode_active():
        return run()
    seeing = [m for m in (torch._C._get_dispatch_stack_at(i) for i in range(stack))
              if not isinstance(m, (DispatchMode, _RealBookkeeping))]
    if not seeing:
        return run()
    runs = _RunsTheCollective(run, len(op._schema.returns) == 1)
    args = tuple(a.boxed() if isinstance(a, dist.ProcessGroup) else a for a in make_args())
    with _disable_current_modes():
        for mode in (runs, *seeing):
            torch._C._push_on_torch_dispatch_stack(mode)
        try:
            op(*args)
        finally:
            for _ in range(len(seeing) + 1):
                torch._C._pop_torch_dispatch_stack(None)
    return runs.work   # the Python object itself: the one the op hands back has lost it


class ModuleStack(ModuleTracker):
    """Which ``nn.Module`` is running now, fed one rank's forward calls by :meth:`enter` and
    :meth:`leave`, with names as torch's ``ModuleTracker`` gives them ("Sequential.0").

    It follows modules through the forward pass only: torch's tracker also hooks the
    backward pass with multi-grad hooks, which break ``torch.autograd.grad`` on leaf
    inputs (as torch.distributed.pipelining calls it). Backward time is labelled
    "(backward)" instead.

    Forwards that run during a backward pass are activation checkpointing's recomputation
    (``torch.utils.checkpoint``): they are tracked apart (:attr:`recomputing`) and never
    join :attr:`parents`, because the non-reentrant checkpoint stops its recomputation
    early, by raising, once it has the tensors backward needs, so their forward never
    returns and they would stay "running" forever.
    """

    innermost_label = "Global"   # the deepest module running now, kept as parents change
    _recomputed = frozenset()   # modules entered during the backward pass, not yet left

    def enter(self, module):
        """``module``'s forward starts."""
        name = self._get_mod_name(module)
        if _graph_task_id() != -1:
            self._recomputed = self._recomputed | {name}
            return
        self._recomputed = frozenset()   # a new forward: recomputations cut short are over
        self.parents.add(name)
        self.innermost_label = max(self.parents, key=len)

    def leave(self, module):
        """``module``'s forward has returned."""
        name = self._get_mod_name(module)
        if name in self._recomputed:
            self._recomputed = self._recomputed - {name}
            return
        self.parents.discard(name)
        self.innermost_label = max(self.parents, key=len)

    @property
    def recomputing(self):
        """True while a module's forward runs inside the backward pass (a checkpointed
        block recomputing its activations)."""
        return bool(self._recomputed)

    @property
    def inside_module(self):
        """True while some module's forward is running."""
        return len(self.parents) > 1

    def innermost(self):
        """The label of the module running now: the deepest one, or "(backward)"."""
        if _graph_task_id() != -1:   # in_backward(), inlined: this runs for every op
            return "(backward)"
        return self.innermost_label


_graph_task_id = torch._C._current_graph_task_id
# -1 outside a backward pass: in_backward() without its call, for the accounting's fast path
graph_task_id = _graph_task_id


def in_backward():
    """True while autograd runs a backward pass on the calling thread."""
    return _graph_task_id() != -1


def storage_key(tensor):
    """A stable identity for the memory behind ``tensor`` (None if it has none)."""
    try:
        return tensor.untyped_storage()._cdata
    except (RuntimeError, NotImplementedError, AttributeError):
        return None


def key_of_storage(storage):
    """The identity of an ``UntypedStorage``, as :func:`storage_key` gives it for a tensor."""
    return storage._cdata


def own_parameters(module):
    """The parameters ``module`` holds itself (not its children's); entries may be None."""
    return module._parameters.values()


def fake_tensor_types():
    """The tensor subclasses that carry no data: FakeTensor and FunctionalTensor."""
    from torch._subclasses.fake_tensor import FakeTensor
    from torch._subclasses.functional_tensor import FunctionalTensor

    return (FakeTensor, FunctionalTensor)


PLAIN, FAKE, SUBCLASS = "plain", "fake", "subclass"


def dispatch_kind(cls):
    """How a dispatch mode should treat a tensor of type ``cls`` that it finds among an
    op's ``types``: ``PLAIN`` (a tensor with data), ``FAKE`` (no data) or ``SUBCLASS``
    (a wrapper such as DTensor, which unwraps itself into plain ops if the mode returns
    ``NotImplemented``).

    A subclass that does not define ``__torch_dispatch__`` (``nn.Parameter``, a learner's
    own ``Tensor`` subclass) inherits ``torch._C._disabled_torch_dispatch_impl``: torch
    never hands it an op, so it is plain. It still shows up in ``types`` when torch detaches
    it under a mode (``p.data`` calls ``aten.detach`` through the mode with the tensor's own
    type), and a mode that answered ``NotImplemented`` there would leave the op with no
    handler at all. FakeTensorMode makes the same distinction (``_check_for_subclass_arg``).
    """
    if issubclass(cls, fake_tensor_types()):
        return FAKE
    if cls.__torch_dispatch__ is torch._C._disabled_torch_dispatch_impl:
        return PLAIN
    return SUBCLASS




def _shapes(value):
    """``value`` with every tensor replaced by its shape, and lists by tuples (hashable)."""
    if isinstance(value, torch.Tensor):
        return value.shape
    if isinstance(value, (list, tuple)):
        return tuple([_shapes(v) for v in value])
    return value


def _shapes_key(args, kwargs, out):
    """What an op's FLOPs depend on: its arguments with every tensor replaced by its
    shape (:func:`_shapes`), as one flat tuple, built with a call only for lists (each
    matmul of every rank builds one)."""
    key = [len(args)]   # where the arguments end and the keyword arguments begin
    for v in args:
        if isinstance(v, torch.Tensor):
            key.append(v.shape)
        elif isinstance(v, (list, tuple)):
            key.append(_shapes(v))
        else:
            key.append(v)
    if kwargs:
        key.append(_shapes(tuple(kwargs.items())))
    key.append(out.shape if isinstance(out, torch.Tensor) else _shapes(out))
    return tuple(key)


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
            key = _shapes_key(args, kwargs, out)
            return known[key]
        except KeyError:
            flops = known[key] = counter(*args, **kwargs, out_val=out)
            return flops
        except TypeError:   # an unhashable argument: count without remembering
            return counter(*args, **kwargs, out_val=out)

    return count


# ------------------------------------------------------------- for DTensor
def _dtensor_dispatcher():
    """DTensor's op dispatcher, or None while DTensor has not been imported."""
    api = sys.modules.get("torch.distributed.tensor._api")
    return None if api is None else api.DTensor._op_dispatcher


def dtensor_handlers():
    """The DTensor custom op handlers in force now, as ``(table, its entries)``, or None
    before DTensor is imported: what :func:`set_dtensor_handlers` puts back."""
    dispatcher = _dtensor_dispatcher()
    if dispatcher is None:
        return None
    table = dispatcher._custom_op_handlers
    return table, dict(table)


def set_dtensor_handlers(state):
    """Make ``state`` (from :func:`dtensor_handlers`) the handlers in force.

    The table is edited in place (torch's ``loss_parallel()`` does so too) and replaced
    only if someone replaced it (context parallelism does). A run imports DTensor before
    its ranks start (:func:`patched` imports FSDP2), so no rank's state is None.
    """
    dispatcher = _dtensor_dispatcher()
    if dispatcher is None or state is None:
        return
    table, entries = state
    if dispatcher._custom_op_handlers is not table:
        dispatcher._custom_op_handlers = table
    if table != entries:
        table.clear()
        table.update(entries)


# ------------------------------------------------------------------ for storage
_in_checkpoint_io = threading.local()   # .depth > 0: inside DCP's reader or writer


@contextlib.contextmanager
def _counted_by_checkpoint():
    """A block whose file I/O DCP's reader or writer wrapper charges itself, so the
    ``torch.save``/``torch.load`` calls it makes on its streams are not charged again."""
    _in_checkpoint_io.depth = getattr(_in_checkpoint_io, "depth", 0) + 1
    try:
        yield
    finally:
        _in_checkpoint_io.depth -= 1


def _charged():
    return getattr(_in_checkpoint_io, "depth", 0) == 0


def _real_file(f):
    """``(path or None, position)`` if ``f`` is a file on disk (a path, or a file object
    with a descriptor), else None (an in-memory buffer such as ``io.BytesIO``)."""
    if isinstance(f, (str, os.PathLike)):
        return os.path.abspath(os.fspath(f)), None
    try:
        f.fileno()
        position = f.tell()
    except (AttributeError, OSError, ValueError):
        return None
    name = getattr(f, "name", None)
    return (os.path.abspath(name) if isinstance(name, str) else None), position


def _file_bytes(f, target, write):
    """Bytes ``torch.save`` wrote to, or ``torch.load`` read from, file ``f``."""
    path, position = target
    if position is None:
        return os.path.getsize(path)
    if write:
        return f.tell() - position
    return os.fstat(f.fileno()).st_size - position


# File I/O inside a rank is charged to its node's storage (``hooks.on_io``), and a saved
# checkpoint is reported (``hooks.on_checkpoint``), by these table entries:
#
# * ``torch.save`` and ``torch.load`` on a path or a file on disk (not on an in-memory
#   buffer): the file's bytes, plus those of the fake tensors (which are saved as records
#   of their shapes, :func:`_records_for_fakes`);
# * ``torch.distributed.checkpoint``'s file-system writer and reader
#   (``_FileSystemWriter.write_data``, ``FileSystemReader.read_data``): the bytes of each
#   file, from the write results and the read plan's ``_StorageInfo`` (offset, length,
#   relative path) — what ``dcp.save`` and ``dcp.load`` move, re-sharded or not; the
#   ``torch.save``/``torch.load`` calls they make on their streams are not counted again;
# * ``FileSystem.create_stream`` outside those two: the checkpoint's metadata file,
#   written by the coordinator in ``finish`` and read in ``read_metadata``;
# * ``state_dict_saver._save_state_dict``, the body of ``dcp.save``, which returns on
#   every rank once the checkpoint is committed.
#
# Importing ``torch.distributed.checkpoint`` takes about a second, so its entries wait
# until it is imported (``imported_by``).
def _save(original, hooks):
    def save(obj, f, *args, **kwargs):
        target = _real_file(f) if _charged() else None
        fake_bytes = {}
        obj = _records_for_fakes(obj, fake_bytes)
        try:
            result = original(obj, f, *args, **kwargs)
        except (AttributeError, TypeError, pickle.PicklingError) as error:
            if "FakeTensorMode" not in str(error):
                raise
            raise TypeError(
                "torch.save cannot write fake tensors (made inside sc.fake_tensors()) "
                "held by this object: save plain containers of them instead, such as "
                "model.state_dict() or optimizer.state_dict() (dicts, lists, tuples and "
                "namedtuples of fake tensors are saved as records of their shapes)"
            ) from None
        if target is not None:
            path, position = target
            # a file object written from its start holds this save alone: name it, so
            # that a crash during the write can tear it
            nbytes = _file_bytes(f, target, True) + sum(fake_bytes.values())
            hooks.on_io(True, nbytes, path if not position else None)
            hooks.on_checkpoint()
        return result

    return _wrapped(save, original)


def _load(original, hooks):
    def load(f, *args, **kwargs):
        target = _real_file(f) if _charged() else None
        fake_bytes = []
        result = _fakes_for_records(original(f, *args, **kwargs), fake_bytes)
        if target is not None:
            hooks.on_io(False, _file_bytes(f, target, False) + sum(fake_bytes), target[0])
        return result

    return _wrapped(load, original)


# A fake tensor (``sc.fake_tensors()``) has no data to save: ``torch.save`` writes this
# record of it instead (plain types, which ``torch.load(weights_only=True)`` accepts) and
# charges the bytes the tensor would take; ``torch.load`` makes a fake tensor of it again.
_FAKE_RECORD = "__simcluster_fake_tensor__"
def _records_for_fakes(obj, fake_bytes):
    """``obj`` with every fake tensor in its dicts, lists and tuples (namedtuples too)
    replaced by a record; ``fake_bytes`` gets ``{storage: bytes}`` of the fakes (shared
    storage counted once). Returns ``obj`` itself when it holds no fake tensor.

    As ``torch.save`` writes a view's whole storage, a record names its storage (by its
    order in ``fake_bytes``) and the view's place in it, and views of one storage load as
    views of one storage again."""
    if isinstance(obj, torch.Tensor):
        if not is_fake(obj):
            return obj
        storage = obj.untyped_storage()
        key = storage_key(obj)
        fake_bytes.setdefault(key, storage.nbytes())
        return {_FAKE_RECORD: True, "shape": list(obj.shape), "dtype": str(obj.dtype),
                "requires_grad": obj.requires_grad, "storage": list(fake_bytes).index(key),
                "storage_bytes": storage.nbytes(), "stride": list(obj.stride()),
                "offset": obj.storage_offset()}
    if isinstance(obj, dict):
        items = [(k, _records_for_fakes(v, fake_bytes)) for k, v in obj.items()]
        if all(new is obj[k] for k, new in items):
            return obj
        return {k: v for k, v in items}
    if type(obj) in (list, tuple) or (isinstance(obj, tuple) and hasattr(obj, "_fields")):
        new = [_records_for_fakes(v, fake_bytes) for v in obj]
        if all(a is b for a, b in zip(new, obj)):
            return obj
        return type(obj)(new) if type(obj) in (list, tuple) else type(obj)(*new)
    return obj


def _fakes_for_records(obj, fake_bytes, storages=None):
    """``obj`` (just loaded) with every fake-tensor record made a fake tensor again;
    ``fake_bytes`` gets the sizes of their storages (each once). Raises if there are
    records outside ``sc.fake_tensors()``, where no fake tensor can be made."""
    storages = {} if storages is None else storages   # storage number -> its fake base
    if isinstance(obj, dict):
        if obj.get(_FAKE_RECORD) is True:
            if not fake_mode_active():
                raise RuntimeError(
                    "this file holds fake tensors (saved inside sc.fake_tensors(), with "
                    "shapes but no data): load it inside `with sc.fake_tensors():` too")
            dtype = getattr(torch, obj["dtype"].removeprefix("torch."))
            if "storage" not in obj:   # a record of an older save: the tensor alone
                tensor = torch.empty(obj["shape"], dtype=dtype)
                fake_bytes.append(tensor.untyped_storage().nbytes())
                return tensor.requires_grad_(obj["requires_grad"])
            base = storages.get(obj["storage"])
            if base is None:
                itemsize = torch.empty((), dtype=dtype).element_size()
                base = storages[obj["storage"]] = torch.empty(
                    obj["storage_bytes"] // itemsize, dtype=dtype)
                fake_bytes.append(obj["storage_bytes"])
            tensor = base.as_strided(obj["shape"], obj["stride"], obj["offset"])
            return tensor.detach().requires_grad_(obj["requires_grad"])
        for k, v in obj.items():
            new = _fakes_for_records(v, fake_bytes, storages)
            if new is not v:
                obj[k] = new
        return obj
    if isinstance(obj, list):
        obj[:] = [_fakes_for_records(v, fake_bytes, storages) for v in obj]
    elif type(obj) is tuple:
        return tuple(_fakes_for_records(v, fake_bytes, storages) for v in obj)
    elif isinstance(obj, tuple) and hasattr(obj, "_fields"):
        return type(obj)(*(_fakes_for_records(v, fake_bytes, storages) for v in obj))
    return obj


def _charge_files(hooks, storage, lengths, write):
    """Charge ``[(relative path, bytes)]`` of a DCP reader or writer, one file at a time.

    If the rank dies (a crash fault raises) during a write, the files it had not started
    are left empty: DCP wrote them all already, the simulated rank never did.
    """
    per_file = {}
    for name, nbytes in lengths:
        per_file[name] = per_file.get(name, 0) + nbytes
    paths = [(str(storage.fs.concat_path(storage.path, name)), n) for name, n in per_file.items()]
    for i, (path, nbytes) in enumerate(paths):
        try:
            hooks.on_io(write, nbytes, path)
        except BaseException:
            for later, _ in paths[i + 1:] if write else ():
                os.truncate(later, 0)
            raise


def _write_data(original, hooks):
    def write_data(self, plan, planner):
        with _counted_by_checkpoint():
            future = original(self, plan, planner)
        _charge_files(hooks, self, ((r.storage_data.relative_path, r.storage_data.length)
                                    for r in future.value()), True)
        return future

    return _wrapped(write_data, original)


def _read_data(original, hooks):
    def read_data(self, plan, planner):
        with _counted_by_checkpoint():
            future = original(self, plan, planner)
        infos = (self.storage_data[item.storage_index] for item in plan.items)
        _charge_files(hooks, self, ((i.relative_path, i.length) for i in infos), False)
        return future

    return _wrapped(read_data, original)


def _save_state_dict(original, hooks):
    def save_state_dict(*args, **kwargs):
        result = original(*args, **kwargs)
        hooks.on_checkpoint()
        return result

    return _wrapped(save_state_dict, original)


def _async_save(original, hooks):
    def async_save(*args, **kwargs):
        raise NotImplementedError(
            "dcp.async_save is not simulated: it writes the checkpoint from a background "
            "thread (or process) while the rank trains on, and the simulator's ranks are "
            "threads that take turns, so that thread could never be scheduled. Use "
            "dcp.save(state_dict, checkpoint_id=...), which the rank waits for (its bytes "
            "are charged to the node's storage).")

    return _wrapped(async_save, original)


def _create_stream(original, hooks):
    @contextlib.contextmanager
    def create_stream(self, path, mode):
        with original(self, path, mode) as stream:
            yield stream
        if _charged():
            hooks.on_io("w" in mode, os.path.getsize(path), os.path.abspath(os.fspath(path)))

    return _wrapped(create_stream, original)


# ------------------------------------------------------------------ for numpy
_NUMPY_MT_SIZE = 624 * 4 + 4   # mt19937_state: uint32 key[624], int pos
_numpy_mt_address = None


def numpy_rng_words():
    """The raw Mersenne Twister words of numpy's global RNG (2.5 kB), read in about 1 µs.

    ``np.random.get_state()`` costs about 50 µs; while these words are unchanged, no
    number was drawn. (A cached second Gaussian from the legacy ``randn`` is handed out
    without moving the words: check ``get_state()[3]`` for one.)
    """
    global _numpy_mt_address
    if _numpy_mt_address is None:
        import numpy as np

        _numpy_mt_address = np.random.mtrand._rand._bit_generator.ctypes.state_address
    return ctypes.string_at(_numpy_mt_address, _NUMPY_MT_SIZE)
