"""The ``sim`` torch.distributed backend: a ``ProcessGroup`` whose ranks are threads.

Each rank's calls arrive here through the ordinary ``torch.distributed`` API. A collective
is matched across ranks by its sequence number in its group; when the last rank of the
group arrives, :mod:`simcluster.collectives` computes the result for everybody, and every
rank's ``Work`` completes. Point-to-point messages are matched by (source, destination,
tag), first come first served. Whenever a rank must wait, it hands the baton to the
scheduler, which knows what every rank is waiting for — so mismatches and deadlocks are
explained instead of hanging.
"""

import functools
from collections import defaultdict, deque

import torch
import torch.distributed as dist

from . import accounting, collectives, context, validation
from ._torch_internals import (WorkBase, backend_options_fields, on_side_stream, reduce_op_name,
                               register_backend, through_c10d)
from .errors import CollectiveMismatchError, DeadlockError
from .faults import FaultState, seconds

FLIGHT_RECORDER_LENGTH = 5


def _shape(t):
    return tuple(t.shape)


def _shapes(tensors):
    """The shape of one tensor, or a list of shapes for several (as reports show them)."""
    shapes = [_shape(t) for t in tensors]
    return shapes[0] if len(shapes) == 1 else shapes


def _dtypes(tensors):
    dtypes = [t.dtype for t in tensors]
    return dtypes[0] if len(dtypes) == 1 else dtypes


def _nbytes(tensors):
    return sum(t.numel() * t.element_size() for t in tensors)


def _option(opts, name, default):
    """``opts.name``, or ``default`` when torch passed no options object."""
    return default if opts is None else getattr(opts, name)


def _reduce_op(opts):
    """A stand-in for the c10d ops' ``reduce_op`` argument: torch offers Python no way to
    make its script object for an op other than SUM (the default one), and the
    collective itself uses ``opts``, not this."""
    return torch.classes.c10d.ReduceOp()


def _via_c10d(op_name, c10d_args):
    """Decorates a :class:`SimProcessGroup` operation so that dispatch modes see it as
    gloo's: as the op ``torch.ops.c10d.<op_name>``, called with
    ``c10d_args(group, *arguments)`` (see :func:`_torch_internals.through_c10d`)."""
    op = getattr(torch.ops.c10d, op_name).default

    def decorate(operation):
        def method(self, *args, **kwargs):
            return through_c10d(op, lambda: c10d_args(self, *args, **kwargs),
                                lambda: operation(self, *args, **kwargs))

        return functools.update_wrapper(method, operation)

    return decorate


class _Collective:
    """One collective call, shared by the ranks of its group while they arrive."""

    def __init__(self, group, seq, name, spec, first_rank):
        self.group, self.seq, self.name = group, seq, name
        self.spec, self.spec_rank = spec, first_rank
        self.args = {}
        self.arrivals = {}   # group rank -> simulated time it reached the collective
        self.done = False
        self.failed = None   # why it can never complete (a member died), else None
        self.end = 0.0       # simulated time the collective finishes

    def __str__(self):
        return f"{self.name} #{self.seq} on group {self.group.label}"


class _Wait:
    """What a blocked rank is waiting for; the scheduler stores it, deadlock reports read it."""

    def __init__(self, kind, text, collective=None, call_index=None):
        self.kind, self.text = kind, text
        self.collective, self.call_index = collective, call_index

    def __str__(self):
        return str(self.text)


class _Message:
    """A posted send or receive that waits for its partner."""

    def __init__(self, kind, src, dst, tag, tensor, posted):
        self.kind = kind   # "send" or "recv"
        self.src, self.dst, self.tag, self.tensor = src, dst, tag, tensor
        self.posted = posted  # simulated time its rank's compute stream posted it
        self.done = False
        self.failed = None    # why it can never complete (the partner died), else None
        self.end = 0.0

    def poster(self):
        """The rank that posted it: a send's source, a receive's destination."""
        return self.src if self.kind == "send" else self.dst

    def __str__(self):
        if self.kind == "send":
            return f"send {self.src}->{self.dst} (tag {self.tag})"
        return f"recv {'any' if self.src is None else self.src}->{self.dst} (tag {self.tag})"


class _GroupState:
    """The state one process group shares across its ranks."""

    def __init__(self, name, ranks, is_default):
        self.name, self.ranks = name, ranks
        self.label = "WORLD" if is_default else f"{name} (ranks {_rank_list(ranks)})"
        self.next_seq = [0] * len(ranks)
        self.open = {}


def _ranks_named(ranks):
    """``"rank 3"`` or ``"ranks 1-3"``."""
    ranks = list(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {_rank_list(ranks)}"


def _ranks_phrase(ranks):
    """``"rank 3 has"`` or ``"ranks 1-3 have"``."""
    return _ranks_named(ranks) + (" has" if len(list(ranks)) == 1 else " have")


def _rank_list(ranks):
    ranks = list(ranks)
    if len(ranks) > 2 and ranks == list(range(ranks[0], ranks[-1] + 1)):
        return f"{ranks[0]}-{ranks[-1]}"
    return ",".join(map(str, ranks))


class SimWork(WorkBase):
    """The ``Work`` handle returned by every operation of the sim backend."""

    def __init__(self, world, pending, result, what, clock, group_ranks=None):
        super().__init__()
        self._world, self._pending, self._result, self._what = world, pending, result, what
        self._clock = clock  # the waiting rank's simulated clock (None: no accounting)
        self._group_ranks = group_ranks  # receives: the group's global ranks, sender lookup

    def wait(self, timeout=None):
        """Block this rank (letting the others run) until the operation has completed.

        In simulated time the compute stream waits for the communication to end, unless
        a side stream is selected (``torch.cpu.stream(s)``, as FSDP2 does for its
        all-gathers and reduce-scatters): then, as with NCCL, only that stream waits, and
        the compute stream waits when an op reads the result.
        """
        self._world.scheduler.wait_until(self._finished, self._what)
        if self._pending.failed is not None:
            self._world.faults.die_waiting(self._clock, self._pending)
        if self._clock is not None:
            if on_side_stream():
                self._ready_when_read()
            else:
                self._clock.wait_until(self._pending.end, "wait for communication")
        return True

    def _ready_when_read(self):
        """The compute stream waits for this work only when an op reads its result."""
        for t in accounting.tensors_in(self._result):
            self._clock.ready_when_read(accounting.storage_key(t), self._pending.end)

    def _finished(self):
        """Completed, or failed for good (a rank it needs died)."""
        return self._pending.done or self._pending.failed is not None

    def is_completed(self):
        """Whether the operation has completed (or failed: a rank it needs died). A
        scheduling point: a rank that polls (``while not work.is_completed(): ...``) lets
        the other ranks run, so that they can complete it."""
        return self._world.scheduler.poll(self._finished, self._what)

    def is_success(self):
        return self._pending.done and self._pending.failed is None

    def exception(self):
        return None

    def result(self):
        self.wait()
        return self._result

    def get_future(self):
        # C++ callers (DDP's reducer) block on the future directly, outside our scheduler,
        # so hand out a future only once the work has completed.
        self._world.scheduler.wait_until(self._finished, self._what)
        if self._pending.failed is not None:
            self._world.faults.die_waiting(self._clock, self._pending)
        if self._clock is not None:
            self._ready_when_read()
        future = torch.futures.Future()
        future.set_result(self._result)
        return future

    def _source_rank(self):
        """The group rank a completed receive came from (``recv(src=None)`` returns it)."""
        self.wait()
        return self._group_ranks.index(self._pending.src)


class SimWorld:
    """Everything the ranks of one run share: groups, open collectives, mailboxes, and
    (in ``faults``, a :class:`~simcluster.faults.FaultState`) crashes and watchdogs.
    ``stop_after_crash``: see :class:`~simcluster.faults.FaultState`."""

    def __init__(self, scheduler, world_size, recorder=None, stop_after_crash=None):
        self.scheduler = scheduler
        self.recorder = recorder  # simulated time and memory (None: accounting off)
        self.world_size = world_size
        self.store = dist.HashStore()  # torch wants one; the sim backend never uses it
        self.groups = {}
        # Group creation, matched like a collective: for each group torch names by its
        # counter, the first rank's ranks, and who has created it; per rank, how often it
        # created each group named by a hash of its ranks.
        self.creations = {}
        self.created = defaultdict(set)
        self.hashed_names = [defaultdict(int) for _ in range(world_size)]
        self.sends = defaultdict(deque)      # (src, dst, tag) -> posted sends
        self.recvs = defaultdict(deque)      # (src, dst, tag) -> posted receives
        self.any_recvs = defaultdict(deque)  # (dst, tag) -> receives from any source
        # every collective each rank called, oldest first: (name, seq, group label)
        self.calls = [[] for _ in range(world_size)]
        self.bytes_sent = [0] * world_size     # point-to-point payload bytes, per sender
        self.messages_sent = [0] * world_size  # point-to-point messages, per sender
        # crashes, deaths and watchdogs (simcluster.faults)
        self.faults = FaultState(world_size, recorder, self.operations_waiting_for,
                                 stop_after_crash)

    def operations_waiting_for(self, rank):
        """The open operations that wait for ``rank`` to join them or post their other
        side, as ``(collectives, messages)``; the messages are taken off their queues
        (see :meth:`FaultState._fail_operations_of <simcluster.faults.FaultState>`)."""
        collectives, messages = [], []
        for group in self.groups.values():
            if rank not in group.ranks:
                continue
            member = group.ranks.index(rank)
            collectives += [coll for coll in group.open.values()
                            if coll.failed is None and member not in coll.args]
        for queues in (self.sends, self.recvs):
            for (src, dst, _), posted in queues.items():
                if rank in (src, dst):
                    waiting = [m for m in posted if m.poster() != rank]
                    for msg in waiting:
                        posted.remove(msg)
                    messages += waiting
        return collectives, messages

    def collectives_called(self, rank):
        """The names of the collectives global ``rank`` has called, oldest first."""
        return [name for name, _, _ in self.calls[rank]]

    def clock(self, rank):
        """Global ``rank``'s simulated clock, or None when accounting is off."""
        return self.recorder.clocks[rank] if self.recorder else None

    def now(self, rank):
        """When ``rank``'s communication stream can start a collective: its compute stream
        has issued it and both lanes are free."""
        clock = self.clock(rank)
        return max(clock.now, clock.comm_free) if clock else 0.0

    def posted(self, rank):
        """When ``rank``'s compute stream issues a point-to-point op; the transfer waits
        for the lanes it uses when it is matched (see ``_deliver``)."""
        clock = self.clock(rank)
        return clock.now if clock else 0.0

    def group(self, name, ranks, key=None):
        """The shared state of group ``name``, created by the first rank that asks.

        ``key`` tells apart groups that torch gave the same name (default: ``name``).
        """
        key = name if key is None else key
        if key not in self.groups:
            is_default = not ranks
            self.groups[key] = _GroupState(name, ranks or list(range(self.world_size)),
                                           is_default)
        return self.groups[key]

    def create_group(self, rank, name, ranks):
        """Join the creation of group ``name`` of global ``ranks`` as ``rank``.

        Checked like a collective. Torch names a group by a counter that each rank keeps
        for itself, so every rank of the world must create every group, in the same order
        and with the same ranks, members or not: a rank that skips one names its next
        group like the others' skipped one, and would end up in the wrong group. Groups
        created with ``use_local_synchronization=True`` are named by a hash of their ranks
        instead (40 hex digits; all decimal by chance about once in 10^8) and created by
        their members only. Members wait for each other, as in gloo's rendezvous.

        Returns the group's shared state, or None when ``rank`` is not a member.
        """
        counted = name.isdigit()
        if counted:
            key = name
            first_rank, first_ranks = self.creations.setdefault(name, (rank, ranks))
            if first_ranks != ranks:
                self.scheduler.fail(CollectiveMismatchError(
                    "rank list", {first_rank: first_ranks, rank: ranks}, int(name), "WORLD",
                    "new_group",
                    "torch numbers groups with a counter on each rank, so every rank must "
                    "call dist.new_group for every group, in the same order and with the "
                    "same ranks, also the ranks that are not members of it (or create the "
                    "group on its members only, with use_local_synchronization=True)."))
        else:
            self.hashed_names[rank][name] += 1
            key = (name, self.hashed_names[rank][name])
        self.created[key].add(rank)
        if rank not in ranks:
            return None
        missing = lambda: [r for r in ranks if r not in self.created[key]]  # noqa: E731
        label = f"new_group #{name}" if counted else "new_group"
        what = _Wait("new_group", _LazyText(
            lambda: f"waiting in {label} (ranks {_rank_list(ranks)}): "
                    f"{_ranks_phrase(missing())} not called it yet"))
        self.scheduler.wait_until(lambda: not missing(), what)
        return self.group(name, ranks, key)

    # ----------------------------------------------------------------- deadlocks
    def explain_deadlock(self):
        """Build the error that describes why no rank can move."""
        pending, waits = {}, {}
        for rank in range(self.world_size):
            if rank in self.faults.deaths:
                death = self.faults.deaths[rank]
                pending[rank] = f"died at {seconds(death.time)} ({death.cause})"
            elif self.scheduler.is_done(rank):
                pending[rank] = "returned from its function"
            else:
                waits[rank] = self.scheduler.waiting_for(rank)
                pending[rank] = str(waits[rank])
        recent = {r: [f"{name} #{seq} ({label})"
                      for name, seq, label in self.calls[r][-FLIGHT_RECORDER_LENGTH:]]
                  for r in range(self.world_size)}
        mismatch = self._group_mismatch(waits)
        if mismatch:
            return mismatch
        return DeadlockError(pending, recent, self._deadlock_hint(pending, waits))

    def _group_mismatch(self, waits):
        """Ranks stuck in their n-th collective, but on different groups, mismatch."""
        by_index = defaultdict(dict)
        for rank, wait in waits.items():
            if wait is not None and wait.collective is not None:
                by_index[wait.call_index][rank] = wait.collective
        for calls in by_index.values():
            labels = {c.group.label for c in calls.values()}
            members = [set(c.group.ranks) for c in calls.values()]
            overlapping = any(a & b for i, a in enumerate(members) for b in members[i + 1:])
            if len(labels) > 1 and overlapping:
                first = next(iter(calls.values()))
                return CollectiveMismatchError(
                    "group", {r: c.group.label for r, c in calls.items()}, first.seq,
                    first.group.label, first.name,
                    "every rank must call the same collectives on the same groups, in "
                    "the same order.")
        return None

    def _deadlock_hint(self, pending, waits):
        kinds = {w.kind for w in waits.values() if w is not None}
        returned = [r for r, p in pending.items() if p == "returned from its function"]
        if "new_group" in kinds:
            return ("the members of a group wait for each other in dist.new_group: every "
                    "rank must create every group, in the same order, with the same ranks.")
        if returned and "collective" in kinds:
            return (f"{_ranks_named(returned)} returned while others wait in a "
                    "collective: every rank of a group must call each of its collectives.")
        if returned and kinds <= {"send", "recv"}:
            return (f"{_ranks_named(returned)} returned while others still wait to exchange "
                    "messages with it: every send needs a matching recv on the other side.")
        tags = self._tag_mismatch()
        if tags and kinds <= {"send", "recv"}:
            return tags
        if kinds == {"recv"}:
            return ("every waiting rank is receiving and nobody is sending: make one side "
                    "send first, or use isend/irecv.")
        if kinds <= {"send", "recv"}:
            return ("blocking send() waits until the matching recv() is posted (as NCCL "
                    "does for large messages). If every rank sends first, nobody receives: "
                    "use isend/irecv or batch_isend_irecv, or let even ranks send first "
                    "and odd ranks receive first.")
        return ("the ranks are waiting for each other in different places: compare the "
                "operations above, and make every rank reach them in the same order.")

    def _tag_mismatch(self):
        """A hint for a send and a receive between the same ranks that differ only in tag."""
        for (src, dst, send_tag), sends in self.sends.items():
            receives = [tag for (s, d, tag), posted in self.recvs.items()
                        if posted and (s, d) == (src, dst) and tag != send_tag]
            receives += [tag for (d, tag), posted in self.any_recvs.items()
                         if posted and d == dst and tag != send_tag]
            if sends and receives:
                return (f"rank {src} sends to rank {dst} with tag {send_tag}, but rank {dst} "
                        f"receives with tag {receives[0]}: a message goes to the receive "
                        "with the same source and tag, so give both sides the same tag.")
        return None


class SimProcessGroup(dist.ProcessGroup):
    """One rank's view of a process group on the simulated cluster."""

    def __init__(self, world, group, group_rank):
        super().__init__(group_rank, len(group.ranks))
        self._world, self._group, self._group_rank = world, group, group_rank
        self._global_rank = group.ranks[group_rank]

    def getBackendName(self):
        return "sim"

    def new_group(self, ranks, timeout=None, pg_options=None, group_name=None,
                  group_desc=None):
        """Create a sub-group; torch's ``dist.new_group`` asks the default group for it.

        Every rank that calls ``dist.new_group`` gets here (see
        :meth:`SimWorld.create_group` for how creations are matched). Returns None on a
        rank that is not a member, as torch expects.
        """
        ranks = list(ranks)
        state = self._world.create_group(self._global_rank, group_name, ranks)
        if state is None:
            return None
        return SimProcessGroup(self._world, state, ranks.index(self._global_rank))

    @property
    def group_name(self):
        """The name torch.distributed registered this group under."""
        return self._group.name

    @property
    def group_desc(self):
        return self._group.label

    def __repr__(self):
        return f"SimProcessGroup({self._group.label}, rank {self._group_rank})"

    # ------------------------------------------------------------------ plumbing
    def _collective(self, name, spec, arg, finish, result, nbytes):
        """Join collective ``name``; ``finish(args)`` runs once every rank has joined.

        ``spec`` holds the fields that must agree across ranks. ``finish`` returns an
        error message when the ranks' arguments do not fit together, else None.
        ``nbytes`` is the buffer size the cost model charges (see costmodel.OP_FAMILY).
        """
        group, world, me = self._group, self._world, self._group_rank
        world.faults.check_alive(self._global_rank)
        seq = group.next_seq[me]
        group.next_seq[me] += 1
        coll = group.open.get(seq)
        if coll is None:
            coll = group.open[seq] = _Collective(group, seq, name, spec, me)
        else:
            self._check_match(coll, name, spec)
        coll.args[me] = arg
        coll.arrivals[me] = world.now(self._global_rank)
        _tag_as_communication(result)
        calls = world.calls[self._global_rank]
        call_index = len(calls)
        calls.append((name, seq, group.label))
        if coll.failed is None:
            reason = world.faults.dead_reason(
                [group.ranks[r] for r in range(len(group.ranks)) if r not in coll.args]
            ) if world.faults.deaths else None   # (no list of n ranks per call to look at)
            if reason is not None:   # a member died before joining: it never will
                world.faults.fail_collective(coll, reason)
        else:
            world.faults.fail_collective(coll, coll.failed)   # (starts this rank's watchdog)
        if coll.failed is None and len(coll.args) == len(group.ranks):
            self._charge(coll, nbytes)   # fails it if a member dies before it ends
            if coll.failed is None:
                with accounting.paused(bypass=True):
                    try:
                        error = finish([coll.args[r] for r in range(len(group.ranks))])
                    except RuntimeError as exc:  # e.g. an output tensor of the wrong size
                        error = f"the ranks' tensors do not fit together ({exc})"
                if error:
                    world.scheduler.fail(CollectiveMismatchError(
                        "arguments", {}, seq, group.label, name, error))
                coll.done = True
            del group.open[seq]
            # Drop the ranks' tensors so a finished collective keeps no memory alive;
            # the keys stay for the wait description.
            coll.args = dict.fromkeys(coll.args)
        missing = lambda: [group.ranks[r] for r in range(len(group.ranks))  # noqa: E731
                           if r not in coll.args]
        what = _Wait("collective", "", coll, call_index)
        what.text = _LazyText(lambda: f"waiting in {coll}: {_ranks_phrase(missing())} "
                                      "not called it yet")
        return SimWork(world, coll, result, what, world.clock(self._global_rank))

    def _charge(self, coll, nbytes):
        """Put a completed collective on every member's communication stream."""
        recorder = self._world.recorder
        if recorder is None:
            return
        ranks = self._group.ranks
        start = max(coll.arrivals.values())
        charge = recorder.cost.collective_time(coll.name, ranks, nbytes, at=start)
        coll.end = start + charge.seconds
        reason = self._world.faults.dies_before(ranks, coll.end)
        if reason is not None:
            self._world.faults.fail_collective(coll, reason)
            return
        label = f"{coll.name} #{coll.seq}"
        for r in ranks:
            recorder.clocks[r].run_comm(start, coll.end, label)
        recorder.record_collective(coll.name, charge.algorithm, ranks, nbytes, start, coll.end,
                                   protocol=charge.protocol)
        # Rooted collectives (broadcast, reduce, gather, scatter) flow to or from the root.
        root = coll.spec.get("root", 0)
        rooted = list(ranks[root:]) + list(ranks[:root])
        for src, dst, b in recorder.cost.traffic(coll.name, charge.algorithm, rooted, nbytes):
            recorder.add_traffic(src, dst, b)

    def _check_match(self, coll, name, spec):
        if coll.name != name:
            field, mine, theirs = "op", name, coll.name
        else:
            field = next((f for f in spec if spec[f] != coll.spec.get(f)), None)
            if field is None:
                return
            mine, theirs = spec[field], coll.spec.get(field)
        ranks = self._group.ranks
        values = {ranks[coll.spec_rank]: theirs, self._global_rank: mine}
        self._world.scheduler.fail(CollectiveMismatchError(
            field, values, coll.seq, self._group.label, coll.name,
            "every rank must call the same collectives, in the same order, with "
            "matching arguments."))

    def _check_root(self, root, what):
        if not 0 <= root < self.size():
            raise ValueError(f"rank {self._global_rank}: {what} rank {root} is out of range "
                             f"for a group of size {self.size()}")

    def _check_reduce(self, op, tensors):
        name = reduce_op_name(op)
        for t in tensors:
            collectives.check_reduce_op(name, t.dtype, self._global_rank)
        return name

    # --------------------------------------------------------------- collectives
    @_via_c10d("allreduce_", lambda pg, tensors, opts=None: (tensors, pg, _reduce_op(opts), None))
    def allreduce(self, tensors, opts=None):
        validation.tensors("all_reduce", self._global_rank, tensors)
        op = self._check_reduce(_option(opts, "reduceOp", dist.ReduceOp.SUM), tensors)
        spec = {"shape": _shapes(tensors), "dtype": _dtypes(tensors), "reduce_op": op}
        return self._collective("all_reduce", spec, tensors,
                                lambda args: collectives.all_reduce(args, op), tensors,
                                _nbytes(tensors))

    @_via_c10d("allreduce_coalesced_", lambda pg, tensors, opts=None:
               (tensors, pg, _reduce_op(opts)))
    def allreduce_coalesced(self, tensors, opts=None):
        return self.allreduce(tensors, opts)

    @_via_c10d("broadcast_", lambda pg, tensors, opts=None:
               (tensors, pg, _option(opts, "rootRank", 0), 0))
    def broadcast(self, tensors, opts=None):
        validation.broadcast(self._global_rank, tensors)
        self._check_root(_option(opts, "rootRank", 0), "source")
        spec = {"shape": _shapes(tensors), "dtype": _dtypes(tensors),
                "root": _option(opts, "rootRank", 0)}
        return self._collective("broadcast", spec, tensors,
                                lambda args: collectives.broadcast(args, _option(opts, "rootRank", 0)),
                                tensors, _nbytes(tensors))

    @_via_c10d("reduce_", lambda pg, tensors, opts=None:
               (tensors, pg, _reduce_op(opts), _option(opts, "rootRank", 0), 0))
    def reduce(self, tensors, opts=None):
        validation.tensors("reduce", self._global_rank, tensors)
        self._check_root(_option(opts, "rootRank", 0), "destination")
        op = self._check_reduce(_option(opts, "reduceOp", dist.ReduceOp.SUM), tensors)
        spec = {"shape": _shapes(tensors), "dtype": _dtypes(tensors),
                "root": _option(opts, "rootRank", 0), "reduce_op": op}
        return self._collective("reduce", spec, tensors,
                                lambda args: collectives.reduce(args, op, _option(opts, "rootRank", 0)),
                                tensors, _nbytes(tensors))

    @_via_c10d("allgather_", lambda pg, outputs, inputs, opts=None: (outputs, inputs, pg))
    def allgather(self, output_tensors, input_tensors, opts=None):
        outputs, inp = output_tensors[0], input_tensors[0]
        validation.list_gather("all_gather", self._global_rank, self.size(), outputs, inp)
        spec = {"shape": _shape(inp), "dtype": inp.dtype}
        return self._collective("all_gather", spec, (outputs, inp),
                                collectives.all_gather, output_tensors,
                                _nbytes([inp]) * self.size())

    @_via_c10d("allgather_coalesced_", lambda pg, outputs, inputs, opts=None:
               (outputs, inputs, pg))
    def allgather_coalesced(self, output_lists, input_list, opts=None):
        works = [self.allgather([outs], [inp], opts) for outs, inp in zip(output_lists, input_list)]
        return works[-1]

    @_via_c10d("_allgather_base_", lambda pg, output, inp, opts=None: (output, inp, pg))
    def all_gather_single(self, output, inp, opts=None):
        validation.into_tensor("all_gather_into_tensor", self._global_rank, self.size(),
                               output, "output", inp, "input")
        spec = {"shape": _shape(inp), "dtype": inp.dtype}
        return self._collective("all_gather_into_tensor", spec, (output, inp),
                                collectives.all_gather_single, [output], _nbytes([output]))

    @_via_c10d("allgather_into_tensor_coalesced_", lambda pg, outputs, inputs, opts=None:
               (outputs, inputs, pg))
    def all_gather_single_coalesced(self, outputs, inputs, opts=None):
        works = [self.all_gather_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1]

    @_via_c10d("gather_", lambda pg, outputs, inputs, opts=None:
               (outputs, inputs, pg, _option(opts, "rootRank", 0)))
    def gather(self, output_tensors, input_tensors, opts=None):
        self._check_root(_option(opts, "rootRank", 0), "destination")
        inp = input_tensors[0]
        outputs = output_tensors[0] if output_tensors else None
        validation.gather(self._global_rank, self.size(),
                          self._group_rank == _option(opts, "rootRank", 0), outputs, inp)
        spec = {"shape": _shape(inp), "dtype": inp.dtype, "root": _option(opts, "rootRank", 0)}
        return self._collective("gather", spec, (outputs, inp),
                                lambda args: collectives.gather(args, _option(opts, "rootRank", 0)),
                                output_tensors, _nbytes([inp]) * self.size())

    @_via_c10d("scatter_", lambda pg, outputs, inputs, opts=None:
               (outputs, inputs, pg, _option(opts, "rootRank", 0)))
    def scatter(self, output_tensors, input_tensors, opts=None):
        self._check_root(_option(opts, "rootRank", 0), "source")
        out = output_tensors[0]
        inputs = input_tensors[0] if input_tensors else None
        validation.scatter(self._global_rank, self.size(),
                           self._group_rank == _option(opts, "rootRank", 0), out, inputs)
        spec = {"shape": _shape(out), "dtype": out.dtype, "root": _option(opts, "rootRank", 0)}
        return self._collective("scatter", spec, (out, inputs),
                                lambda args: collectives.scatter(args, _option(opts, "rootRank", 0)),
                                output_tensors, _nbytes([out]) * self.size())

    @_via_c10d("reduce_scatter_", lambda pg, outputs, inputs, opts=None:
               (outputs, inputs, pg, _reduce_op(opts)))
    def reduce_scatter(self, output_tensors, input_lists, opts=None):
        out, inputs = output_tensors[0], input_lists[0]
        validation.reduce_scatter(self._global_rank, self.size(), out, inputs)
        op = self._check_reduce(_option(opts, "reduceOp", dist.ReduceOp.SUM), [out])
        spec = {"shape": _shape(out), "dtype": out.dtype, "reduce_op": op}
        return self._collective("reduce_scatter", spec, (out, inputs),
                                lambda args: collectives.reduce_scatter(args, op),
                                output_tensors, _nbytes([out]) * self.size())

    @_via_c10d("_reduce_scatter_base_", lambda pg, output, inp, opts=None:
               (output, inp, pg, _reduce_op(opts)))
    def reduce_scatter_single(self, output, inp, opts=None):
        validation.into_tensor("reduce_scatter_tensor", self._global_rank, self.size(),
                               inp, "input", output, "output")
        op = self._check_reduce(_option(opts, "reduceOp", dist.ReduceOp.SUM), [output])
        spec = {"shape": _shape(output), "dtype": output.dtype, "reduce_op": op}
        return self._collective("reduce_scatter_tensor", spec, (output, inp),
                                lambda args: collectives.reduce_scatter_single(args, op),
                                [output], _nbytes([inp]))

    @_via_c10d("reduce_scatter_tensor_coalesced_", lambda pg, outputs, inputs, opts=None:
               (outputs, inputs, pg, _reduce_op(opts)))
    def reduce_scatter_single_coalesced(self, outputs, inputs,
                                        opts=None):
        works = [self.reduce_scatter_single(o, i, opts) for o, i in zip(outputs, inputs)]
        return works[-1]

    @_via_c10d("alltoall_", lambda pg, outputs, inputs, opts=None: (outputs, inputs, pg))
    def alltoall(self, output_tensors, input_tensors, opts=None):
        validation.all_to_all(self._global_rank, self.size(), output_tensors, input_tensors)
        spec = {"dtype": input_tensors[0].dtype}

        def finish(args):
            for i, (outputs, _) in enumerate(args):
                for j, (_, inputs) in enumerate(args):
                    if outputs[j].shape != inputs[i].shape:
                        return (f"rank {j} sends {_shape(inputs[i])} to rank {i}, which "
                                f"expects {_shape(outputs[j])}")
            collectives.all_to_all(args)
            return None

        return self._collective("all_to_all", spec, (output_tensors, input_tensors),
                                finish, output_tensors, _nbytes(input_tensors))

    @_via_c10d("alltoall_base_", lambda pg, output, inp, out_splits, in_splits, opts=None:
               (output, inp, pg, list(out_splits), list(in_splits)))
    def all_to_all_single(self, output, inp, output_split_sizes, input_split_sizes,
                          opts=None):
        validation.all_to_all_single(self._global_rank, output, inp, output_split_sizes,
                                     input_split_sizes)
        spec = {"dtype": inp.dtype}
        return self._collective(
            "all_to_all_single", spec,
            (output, inp, list(output_split_sizes), list(input_split_sizes)),
            collectives.all_to_all_single, [output], _nbytes([inp]))

    def barrier(self, opts=None):
        return self._collective("barrier", {}, None, lambda args: None, [], 0)

    # Names older torch versions (and some C++ callers) still use.
    _allgather_base = all_gather_single
    allgather_into_tensor_coalesced = all_gather_single_coalesced
    _reduce_scatter_base = reduce_scatter_single
    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced
    alltoall_base = all_to_all_single

    # ---------------------------------------------------------- point to point
    def _peer(self, group_peer, what):
        if not 0 <= group_peer < self.size():
            raise ValueError(f"rank {self._global_rank}: {what} rank {group_peer} is out of "
                             f"range for a group of size {self.size()}")
        if group_peer == self._group_rank:
            raise ValueError(f"rank {self._global_rank}: cannot {what} to or from itself")
        return self._group.ranks[group_peer]

    @_via_c10d("send", lambda pg, tensors, dst, tag: (tensors, pg, dst, tag))
    def send(self, tensors, dst, tag):
        """Post a send; it completes when the matching receive is posted."""
        validation.point_to_point("send", self._global_rank, tensors[0])
        world, me = self._world, self._global_rank
        dst = self._peer(dst, "send")
        world.faults.check_alive(me)
        msg = _Message("send", me, dst, tag, tensors[0], world.posted(me))
        key = (me, dst, tag)
        world.messages_sent[me] += 1
        world.bytes_sent[me] += tensors[0].numel() * tensors[0].element_size()
        partner = world.recvs[key].popleft() if world.recvs[key] else None
        if partner is None and world.any_recvs[(dst, tag)]:
            partner = world.any_recvs[(dst, tag)].popleft()
        if partner is None and dst in world.faults.deaths:
            world.faults.fail_message(msg, world.faults.dead_reason([dst]))
        elif partner is not None:
            self._deliver(msg, partner)
        else:
            world.sends[key].append(msg)
        what = _Wait("send", f"waiting in send to rank {dst} (tag {tag}, shape "
                             f"{_shape(tensors[0])}): rank {dst} has not posted a matching recv")
        return SimWork(world, msg, tensors, what, world.clock(me))

    @_via_c10d("recv_", lambda pg, tensors, src, tag: (tensors, pg, src, tag))
    def recv(self, tensors, src, tag):
        """Post a receive from group rank ``src``; it completes when the send arrives."""
        validation.point_to_point("recv", self._global_rank, tensors[0])
        world, me = self._world, self._global_rank
        src = self._peer(src, "receive")
        world.faults.check_alive(me)
        msg = _Message("recv", src, me, tag, tensors[0], world.posted(me))
        key = (src, me, tag)
        if world.sends[key]:
            self._deliver(world.sends[key].popleft(), msg)
        elif src in world.faults.deaths:
            world.faults.fail_message(msg, world.faults.dead_reason([src]))
        else:
            world.recvs[key].append(msg)
        what = _Wait("recv", f"waiting in recv from rank {src} (tag {tag}, shape "
                             f"{_shape(tensors[0])}): rank {src} has not sent it")
        return SimWork(world, msg, tensors, what, world.clock(me), self._group.ranks)

    @_via_c10d("recv_any_source_", lambda pg, tensors, tag: (tensors, pg, tag))
    def recv_anysource(self, tensors, tag):
        """Post a receive from any rank of the group. Of the sends already waiting, the
        lowest rank's wins (under a schedule seed, a random sender's); else the first
        send posted from now on."""
        validation.point_to_point("recv", self._global_rank, tensors[0])
        world, me = self._world, self._global_rank
        world.faults.check_alive(me)
        msg = _Message("recv", None, me, tag, tensors[0], world.posted(me))
        what = _Wait("recv", f"waiting in recv from any rank (tag {tag}): nobody sent one")
        work = SimWork(world, msg, tensors, what, world.clock(me), self._group.ranks)
        for src in world.scheduler.arrival_order(self._group.ranks):
            key = (src, me, tag)
            if world.sends[key]:
                self._deliver(world.sends[key].popleft(), msg)
                break
        else:
            world.any_recvs[(me, tag)].append(msg)
        return work

    recvAnysource = recv_anysource

    def _deliver(self, send, recv):
        # gloo moves bytes and checks only their count: a receive buffer of another shape
        # or dtype with room for the bytes gets them at its start, the rest left as it was
        # (pipelining's first step sends a () tensor into a (1,) one). One without room
        # aborts gloo's receiving process ("Received data size doesn't match expected
        # size"); here it stops the run, in the words lab checks quote.
        if _nbytes([send.tensor]) > _nbytes([recv.tensor]):
            self._world.scheduler.fail(CollectiveMismatchError(
                "shape/dtype", {send.src: f"sends {_shape(send.tensor)} {send.tensor.dtype}",
                                recv.dst: f"receives {_shape(recv.tensor)} {recv.tensor.dtype}"},
                None, self._group.label, "send/recv",
                "the receiving tensor must have the same shape and dtype as the sent one."))
        recv.src = send.src
        recorder = self._world.recorder
        if recorder is not None:
            # Full duplex, as NVLink and InfiniBand are: the message needs the sender's
            # send lane and the receiver's receive lane, so a rank's send and receive of
            # one batch_isend_irecv overlap, while its sends to several peers queue on its
            # egress (they share its bandwidth): the transfer takes the first time from
            # when both sides have posted it that both lanes are free for it.
            nbytes = _nbytes([send.tensor])
            sender, receiver = recorder.clocks[send.src], recorder.clocks[recv.dst]
            start = max(send.posted, recv.posted)
            while True:
                end = start + recorder.cost.p2p_time(send.src, recv.dst, nbytes, at=start)
                clashes = [c for c in (sender.lane_clash("send", start, end),
                                       receiver.lane_clash("recv", start, end)) if c is not None]
                if not clashes:
                    break
                start = max(clashes)
            send.end = recv.end = end
            reason = self._world.faults.dies_before((send.src, recv.dst), send.end)
            if reason is not None:   # one side dies before the message is through
                self._world.faults.fail_message(send, reason)
                self._world.faults.fail_message(recv, reason)
                return
        with torch.no_grad(), accounting.paused(bypass=True):
            collectives.copy_bytes(send.tensor, recv.tensor)
        send.done = recv.done = True
        if recorder is not None:
            sender.run_comm(start, send.end, f"send {send.src}->{recv.dst}", lane="send")
            receiver.run_comm(start, send.end, f"recv {send.src}->{recv.dst}", lane="recv")
            recorder.add_traffic(send.src, recv.dst, nbytes)


def _tag_as_communication(tensors):
    """Memory that so far counted as "other" and is handed to a collective is a buffer."""
    acc = accounting.current()
    if acc is not None:
        for t in tensors:
            key = accounting.storage_key(t)
            if acc.memory.category_of(key) == "other":
                acc.memory.retag(key, "communication buffers")


class _LazyText:
    """A string computed only when printed (deadlock reports), not on every wait."""

    def __init__(self, make):
        self._make = make

    def __str__(self):
        return self._make()


# ------------------------------------------------------------ backend registration
def current_world():
    """The :class:`SimWorld` of the calling rank thread, or None outside a run."""
    me = context.current()
    return None if me is None else me.world


def create_process_group(options, pg_options=None):
    """torch.distributed's factory for the ``sim`` backend (registered at import)."""
    world = current_world()
    if world is None:
        raise RuntimeError(
            'the "sim" backend only works inside a simulated run: call your function '
            "with cluster.run(fn, world_size=...) instead of calling it directly.")
    name, group_rank, _, global_ranks = backend_options_fields(options)
    return SimProcessGroup(world, world.group(name, global_ranks), group_rank)


register_backend("sim", create_process_group)
