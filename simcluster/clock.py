"""Simulated time: each rank's clock, the events on it, and the record of collectives.

A rank has two streams, as a GPU has: the compute stream runs the torch ops the rank
issues, one after another, and the communication stream runs its collectives and
point-to-point transfers. The communication stream is full duplex, as NVLink and
InfiniBand are: a send leaves on the rank's send lane (egress) while a receive arrives
on its receive lane (ingress), so a rank that sends and receives at once (a ring step,
``batch_isend_irecv`` in a pipeline) pays one transfer, not two. A collective uses
both lanes. Each :class:`RankClock` keeps when each stream and lane is next free,
totals per kind of work, and a list of :class:`ClockEvent` for timelines and traces.
Every collective a run completes is kept as a :class:`CollectiveRecord`
(``run.collectives``).
"""

import bisect
import math
from dataclasses import dataclass
from typing import NamedTuple


class ClockEvent(NamedTuple):
    """A span of simulated time on one rank's stream.

    ``lane`` is ``"compute"`` (an op, or several of the same module in a row), ``"idle"``
    (the compute stream waits, e.g. for communication), ``"comm"`` (the communication
    stream transfers) or ``"io"`` (the rank reads or writes the node's storage, and its
    compute stream waits for it); ``label`` says what ran: a module's name,
    ``"all_reduce #3"``, ``"send 0->1"`` (on rank 0's send lane), ``"recv 0->1"`` (on
    rank 1's receive lane), ``"wait for communication"``, ``"write 4.2 MB"``. Times are
    simulated seconds.
    """

    lane: str
    start: float
    end: float
    label: str

    @property
    def duration(self):
        """Simulated seconds the event lasted."""
        return self.end - self.start


@dataclass(frozen=True, kw_only=True)
class CollectiveRecord:
    """One collective as it ran on the simulated network.

    Attributes:
        op: its name, e.g. ``"all_reduce"``, ``"reduce_scatter_tensor"``.
        algorithm: the algorithm the cost model chose (or was told to use), e.g.
            ``"ring"``, ``"tree"``.
        protocol: NCCL's protocol (``"Simple"``, ``"LL"``, ``"LL128"``), or None when the
            cost model does not model protocols.
        ranks: the global ranks of the group, in group order.
        nbytes: the buffer size the cost model charged, in bytes.
        start, end: simulated seconds; it starts when the last rank of the group arrives.
    """

    op: str
    algorithm: str
    protocol: str | None = None
    ranks: tuple
    nbytes: int
    start: float
    end: float

    @property
    def duration(self):
        """Simulated seconds the collective took."""
        return self.end - self.start


class RankClock:
    """One rank's simulated time: a compute stream and a communication stream.

    Compute that runs while the communication stream is busy takes ``overlap_slowdown``
    times as long: NCCL's kernels occupy SMs and HBM bandwidth of the same GPU
    (:data:`simcluster.costmodel.OVERLAP_SLOWDOWN` says where the figure comes from).

    Attributes:
        now: when the compute stream is next free.
        send_free, recv_free: when the send lane (egress) and the receive lane (ingress)
            of the communication stream are free for good (after their last transfer);
            a point-to-point message may still use an earlier gap (:meth:`lane_clash`).
        comm_free: when the communication stream is all free: the later of the two lanes.
        compute, comm, idle: simulated seconds spent computing, communicating (a send and
            a receive at the same time count once), and waiting on the compute stream.
        io: simulated seconds spent reading and writing storage (not counted in idle).
        flops: floating-point operations the rank's compute performed.
        events: the :class:`ClockEvent` list, in the order they were recorded.
        deadline: when the rank's process dies (a crash fault, or its watchdog timeout);
            ``math.inf`` while nothing threatens it. See :meth:`set_deadline`.
    """

    def __init__(self, overlap_slowdown=1.0):
        self.now = 0.0
        self.send_free = self.recv_free = 0.0
        self.compute = 0.0
        self.comm = 0.0
        self.idle = 0.0
        self.io = 0.0
        self.flops = 0
        self.events = []
        self.overlap_slowdown = overlap_slowdown
        self._ready_at = {}   # storage key -> time an async collective finishes writing it
        self.pending_reads = self._ready_at   # the same dict, read (never written) by
        # the accounting's fast path, which skips has_pending_reads' call per op
        self._busy_starts, self._busy_ends = [], []  # communication spans, sorted, disjoint
        # the same per lane: a message needs only its own lane, a collective both
        self._lanes = {"send": ([], []), "recv": ([], [])}
        self.deadline = math.inf
        self._on_deadline = None   # called (and raises) when the clock reaches the deadline
        self.deadline_label = ""   # what the compute stream waits for until the deadline

    def set_deadline(self, t, on_deadline, label):
        """The rank dies at ``t``, unless an earlier deadline is set: the clock calls
        ``on_deadline()``, which raises, as soon as compute or a wait would pass ``t``.
        ``label`` names a wait that ends with the death (the timeline's idle bar)."""
        if t < self.deadline:
            self.deadline, self._on_deadline, self.deadline_label = t, on_deadline, label

    def die_at_deadline(self, label):
        """The compute stream waits, idle, until the deadline; then the rank dies. ``label``
        names the wait unless the deadline has its own (a watchdog's)."""
        self.wait_until(self.deadline, self.deadline_label or label)
        self._on_deadline()

    def resume_at(self, t, label=None):
        """A restarted process starts at ``t``: its streams are free from then on, nothing
        threatens it, and (given a ``label``) the time until ``t`` is an idle wait."""
        self.deadline, self._on_deadline, self.deadline_label = math.inf, None, ""
        if label is not None:
            self.wait_until(t, label)
        self.now = max(self.now, t)
        self.send_free = max(self.send_free, t)
        self.recv_free = max(self.recv_free, t)
        self._ready_at.clear()

    def run_compute(self, seconds, label, may_die=True):
        """Run ``seconds`` of full-speed compute in ``label`` on the compute stream; return
        how long it took, slowed where the communication stream is busy. Compute that
        would pass the deadline stops there, and the rank dies (unless ``may_die`` is
        False: the clock is charged from another rank's thread, where the death cannot
        be raised; the rank then dies at its next op)."""
        # This runs for every op that takes time: locals, and no call in the usual case.
        if seconds <= 0:
            return 0.0
        start = self.now
        if may_die and start >= self.deadline:
            self._on_deadline()
        ends = self._busy_ends
        if not ends or ends[-1] <= start or self.overlap_slowdown == 1.0:
            now = start + seconds   # no communication ahead, or overlap costs nothing
        else:
            now = self._compute_end(start, seconds)
        dies = may_die and now > self.deadline
        if dies:
            now = self.deadline
        self.now = now
        self.compute += now - start
        events = self.events
        last = events[-1] if events else None
        if last and last.lane == "compute" and last.label == label and last.end == start:
            # consecutive ops of one module are one event: timelines stay small
            events[-1] = _event(ClockEvent, ("compute", last.start, now, label))
        else:
            events.append(_event(ClockEvent, ("compute", start, now, label)))
        if dies:
            self._on_deadline()
        return now - start

    def _compute_end(self, t, work):
        """When ``work`` seconds of full-speed compute started at ``t`` end."""
        ends = self._busy_ends
        if not ends or ends[-1] <= t or self.overlap_slowdown == 1.0:
            # the usual case: no communication ahead, or overlap costs nothing
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

    @property
    def comm_free(self):
        """When the communication stream is all free (both lanes), e.g. for a collective."""
        return max(self.send_free, self.recv_free)

    def run_comm(self, start, end, label, lane=None):
        """Record that the communication stream was busy from ``start`` to ``end``.

        ``lane`` is ``"send"`` or ``"recv"`` for one side of a point-to-point message,
        None for a collective, which occupies both lanes. Compute charged before this was
        known ran at full speed where it overlaps: the work it could not have done in that
        time is charged now, after it.
        """
        if lane != "recv":
            self.send_free = max(self.send_free, end)
            _add_span(*self._lanes["send"], start, end)
        if lane != "send":
            self.recv_free = max(self.recv_free, end)
            _add_span(*self._lanes["recv"], start, end)
        self.events.append(ClockEvent("comm", start, end, label))
        # the parts when no other transfer ran
        fresh = _add_span(self._busy_starts, self._busy_ends, start, end)
        self.comm += sum(b - a for a, b in fresh)
        if self.overlap_slowdown == 1.0:
            return
        overlap = 0.0
        for event in reversed(self.events):
            if event.lane == "compute":
                if event.end <= start:
                    break   # compute events are in time order: nothing earlier overlaps
                overlap += sum(max(0.0, min(event.end, b) - max(event.start, a))
                               for a, b in fresh)
        self.run_compute(overlap * (1 - 1 / self.overlap_slowdown), "(slowed by communication)",
                         may_die=False)

    def lane_clash(self, lane, start, end):
        """The latest end of the transfers already on ``lane`` (``"send"`` or ``"recv"``)
        that overlap ``[start, end)``, or None if the lane is free then.

        Messages are matched in the order the rank threads happen to run, not in simulated
        time, so a message posted early may be matched after one posted later: it still
        gets the gap before that one if it fits."""
        starts, ends = self._lanes[lane]
        i = bisect.bisect_right(ends, start)   # the first span ending after start
        if i < len(starts) and starts[i] < end:
            j = bisect.bisect_left(starts, end)   # the spans from i to j overlap
            return ends[j - 1]
        return None

    def wait_until(self, t, label):
        """The compute stream waits (idle) until simulated time ``t``; the rank dies if
        that is past its deadline."""
        if t > self.deadline:
            self.wait_until(self.deadline, self.deadline_label or label)
            self._on_deadline()
        if t > self.now:
            self.events.append(ClockEvent("idle", self.now, t, label))
            self.idle += t - self.now
            self.now = t

    def run_io(self, end, label):
        """The compute stream waits for storage I/O that started now and ends at ``end``;
        the rank dies at its deadline if that comes first (the I/O is cut short)."""
        if self.now >= self.deadline:
            self._on_deadline()
        stop = min(end, self.deadline)
        if stop > self.now:
            self.events.append(ClockEvent("io", self.now, stop, label))
            self.io += stop - self.now
            self.now = stop
        if end > self.deadline:
            self._on_deadline()

    def ready_when_read(self, key, t):
        """Storage ``key`` is written by communication until ``t``: the compute stream
        waits for that only when an op reads it (as a CUDA stream waits on an event)."""
        self._ready_at[key] = t

    @property
    def has_pending_reads(self):
        """True while some storage is marked by :meth:`ready_when_read` and not yet read."""
        return bool(self._ready_at)

    def wait_for_read(self, key):
        """An op reads storage ``key``: wait until communication has finished writing it."""
        ready = self._ready_at.pop(key, None)
        if ready is not None:
            self.wait_until(ready, "wait for communication")

    @property
    def end(self):
        """When this rank's last work, compute or communication, finished."""
        return max(self.now, self.comm_free)


# ClockEvent(*fields) without the Python frame of NamedTuple's __new__ (per op, above)
_event = tuple.__new__


def _add_span(starts, ends, start, end):
    """Add ``[start, end)`` to the sorted, disjoint spans ``starts``/``ends`` (merging
    what it overlaps); return its parts that were not covered before."""
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
