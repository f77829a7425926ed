"""Failures on demand: crash a rank or a node, slow a rank, degrade or drop a link.

    from simcluster import faults
    run = cluster.run(train, world_size=8,
                      faults=[faults.Crash(rank=3, at=2.0)],   # simulated seconds
                      max_restarts=2,                          # like torchrun --max-restarts
                      min_world_size=4)                        # like torchrun --nnodes=MIN:MAX

Every fault happens at a simulated time, so a faulty run is as deterministic as any other:
the same faults give the same results and the same ``run.elapsed`` every time.

What a fault does:

* :class:`Crash` — the rank's process dies when its simulated clock reaches ``at`` (the op
  it is running then does not finish). A collective or message that involves it and would
  end after ``at`` never completes. The ranks waiting for it are stuck, as on a real
  cluster, until their watchdog timeout (the ``timeout`` given to
  ``dist.init_process_group``, 10 minutes by default as for NCCL) runs out; the wait is
  charged to their clocks, then they fail too.
* :class:`NodeCrash` — every rank on the node crashes at ``at``.
* :class:`Straggler` — the rank's compute takes ``factor`` times as long from ``start`` to
  ``end``.
* :class:`LinkDegraded` — a node's NVLink fabric (or the network between nodes) has
  ``factor`` times its bandwidth from ``start`` to ``end``.
* :class:`PacketLoss` — a share ``rate`` of the packets that cross the node's NICs is lost
  and sent again: data still arrives, later (see :func:`retransmission_factor` and
  :func:`retransmission_rounds`).

After a crash ``cluster.run`` raises :class:`~simcluster.RankCrashedError`, or, given
``max_restarts``, restarts every rank as torchrun does: see :class:`RestartRecord`.

One crash, start to end, in this module (with the call sites in brackets):

1. :func:`crashes` picks the crash each rank of an attempt meets first, and
   :meth:`FaultState.schedule_crash` makes it the deadline of the rank's clock
   [``cluster.Cluster._attempt``].
2. The clock stops compute and idle waits at the deadline and calls
   :meth:`FaultState.die` [``clock.RankClock``], which records a :class:`Death`, fails
   every operation that waits for the rank (:meth:`FaultState.fail_collective`,
   :meth:`FaultState.fail_message`), and raises ``ProcessDied`` to unwind the rank's thread.
3. An operation that would end after a member's deadline fails instead of completing
   (:meth:`FaultState.dies_before`); every rank that waits on a failed operation gets a
   watchdog deadline (:meth:`FaultState.watch`), and dies in turn when its clock reaches
   it (:meth:`FaultState.die_waiting`) [``backend``: collectives, messages, ``SimWork``].
4. The attempt ends; :func:`failure` makes its :class:`RestartRecord`, and either the run
   restarts (``restart_delay`` later; with one to come, :meth:`FaultState.die` stops the
   survivors then) or :func:`crashed` makes the :class:`~simcluster.RankCrashedError`
   [``cluster.Cluster._run``].
"""

import math
from dataclasses import dataclass
from numbers import Real
from typing import NamedTuple

from .errors import ProcessDied, RankCrashedError
from .scheduler import run_no_more_code

# NCCL's watchdog timeout in torch 2.x: ``dist.init_process_group(timeout=...)`` defaults
# to 10 minutes for NCCL (torch.distributed.constants.default_pg_nccl_timeout).
DEFAULT_WATCHDOG_TIMEOUT_S = 600.0

# Simulated seconds from a crash to the restarted ranks' start: torchrun's agent notices
# the dead worker (it polls its workers every few seconds), stops the other workers, meets
# the other agents again (rendezvous) and starts new processes, which import torch and
# build their process group. The survivors stop then, well before NCCL's watchdog would
# stop them. A round figure, not a measurement; pass ``restart_delay=`` to
# ``cluster.run`` for another.
DEFAULT_RESTART_DELAY_S = 30.0

# The packet size that packet loss is counted in: InfiniBand's largest MTU.
PACKET_BYTES = 4096

# How long a sender waits before resending a lost packet: Linux TCP's minimum
# retransmission timeout, TCP_RTO_MIN = HZ/5 = 200 ms (include/net/tcp.h), what gloo's TCP
# transport meets on a lossy network. Pass ``PacketLoss(..., rto=...)`` for another.
DEFAULT_RTO_S = 0.2


def _number(value, what, fault, low=None, high=None, low_open=False, allow_none=False):
    """``value`` as a float, or ValueError naming the fault, the field and the value."""
    if value is None and allow_none:
        return None
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise ValueError(f"{fault}: {what} must be a finite number, got {value!r}")
    value = float(value)
    if low is not None and (value < low or (low_open and value == low)):
        bound = f"greater than {low:g}" if low_open else f"at least {low:g}"
        raise ValueError(f"{fault}: {what} must be {bound}, got {value!r}")
    if high is not None and value > high:
        raise ValueError(f"{fault}: {what} must be at most {high:g}, got {value!r}")
    return value


def _index(value, what, fault):
    """``value`` as a non-negative int (a rank or node index), or ValueError."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{fault}: {what} must be a non-negative int, got {value!r}")
    return value


def _window(fault, start, end):
    start = _number(start, "start", fault, low=0.0)
    end = _number(end, "end", fault, low=0.0, allow_none=True)
    if end is not None and end <= start:
        raise ValueError(f"{fault}: end ({end!r}) must be after start ({start!r})")
    return start, end


def _set(fault, **fields):
    for name, value in fields.items():
        object.__setattr__(fault, name, value)


@dataclass(frozen=True)
class Crash:
    """Rank ``rank``'s process dies at simulated time ``at`` (seconds).

    The rank stops in the middle of whatever it is doing at ``at``; a later restart
    counts ranks as that attempt numbers them.
    """

    rank: int
    at: float

    def __post_init__(self):
        _set(self, rank=_index(self.rank, "rank", "Crash"),
             at=_number(self.at, "at", "Crash", low=0.0))


@dataclass(frozen=True)
class NodeCrash:
    """Every rank on node ``node`` (an index into the cluster's nodes) dies at ``at``.

    With ``min_world_size`` the job restarts without the node (a smaller world); without
    it, on a replacement node (the same world size).
    """

    node: int
    at: float

    def __post_init__(self):
        _set(self, node=_index(self.node, "node", "NodeCrash"),
             at=_number(self.at, "at", "NodeCrash", low=0.0))


@dataclass(frozen=True)
class Straggler:
    """Rank ``rank`` computes ``factor`` times slower (2: twice as long) from simulated
    time ``start`` until ``end`` (None: to the end of the run).

    Each op is charged at the factor in force when it starts.
    """

    rank: int
    factor: float
    start: float = 0.0
    end: float = None

    def __post_init__(self):
        start, end = _window("Straggler", self.start, self.end)
        _set(self, rank=_index(self.rank, "rank", "Straggler"),
             factor=_number(self.factor, "factor (how many times slower; 1 is normal speed)",
                            "Straggler", low=1.0),
             start=start, end=end)


@dataclass(frozen=True)
class LinkDegraded:
    """Node ``node``'s NVLink fabric, or with ``node="network"`` the links between nodes,
    has ``factor`` times its bandwidth (0.5: half) from ``start`` until ``end``.

    Each collective or message is charged at the factor in force when it starts.
    """

    node: object
    factor: float
    start: float = 0.0
    end: float = None

    def __post_init__(self):
        if self.node != "network":
            _index(self.node, 'node (a node index, or "network")', "LinkDegraded")
        start, end = _window("LinkDegraded", self.start, self.end)
        _set(self, factor=_number(self.factor, "factor (the share of the bandwidth left, "
                                  "0.5 halves it)", "LinkDegraded", low=0.0, high=1.0,
                                  low_open=True),
             start=start, end=end)


@dataclass(frozen=True)
class PacketLoss:
    """A share ``rate`` (0 <= rate <= 0.99) of the packets leaving or entering node
    ``node`` over the network is lost and sent again, for the whole run.

    Data still arrives, later. A transfer that crosses the node's NICs carries
    :func:`retransmission_factor` times its bytes, and it ends only when its unluckiest
    packet has arrived: lost packets are resent after a retransmission timeout ``rto``
    (simulated seconds; default :data:`DEFAULT_RTO_S`), in
    :func:`retransmission_rounds` rounds on average (selective repeat).
    """

    node: int
    rate: float
    rto: float = None

    def __post_init__(self):
        rto = DEFAULT_RTO_S if self.rto is None else self.rto
        _set(self, node=_index(self.node, "node", "PacketLoss"),
             rate=_number(self.rate, "rate (the share of packets lost)", "PacketLoss",
                          low=0.0, high=0.99),
             rto=_number(rto, "rto (the retransmission timeout, seconds)", "PacketLoss",
                         low=0.0))


FAULT_TYPES = (Crash, NodeCrash, Straggler, LinkDegraded, PacketLoss)


def retransmission_factor(rate):
    """How many times each byte crosses a link that loses a share ``rate`` of its packets,
    on average: a packet is sent until it arrives, a geometric number of tries, 1/(1-rate)."""
    return 1.0 / (1.0 - rate)


def retransmission_rounds(rate, packets):
    """How many rounds of resends a message of ``packets`` packets needs on average when
    each try of each packet is lost with probability ``rate``: the expected maximum of
    ``packets`` geometric numbers of tries, minus the first try.

    Each round waits for a retransmission timeout before resending what is missing
    (selective repeat), so this many timeouts are added to the message's time.
    """
    if rate <= 0 or packets <= 0:
        return 0.0
    # E[max of n geometric tries] = sum over k >= 0 of P(max > k) = sum 1 - (1 - rate^k)^n;
    # the terms vanish geometrically, so the sum stops once they are negligible.
    total, k = 0.0, 1
    while True:
        term = 1.0 - (1.0 - rate ** k) ** packets
        total += term
        if term < 1e-12:
            return total
        k += 1


@dataclass(frozen=True)
class RestartRecord:
    """One failure that made ``cluster.run`` restart (``run.restarts``), or the last one
    that it could not survive (``RankCrashedError.restarts``).

    Attributes:
        time: simulated seconds when the rank crashed.
        rank, node: the rank that crashed first (as the failed attempt numbered it) and
            its node's index in the cluster.
        cause: the fault, e.g. ``"Crash(rank=3, at=2.0)"``.
        lost_work: simulated seconds of work the restart has to do again: from the
            attempt's latest checkpoint (a ``torch.save`` to a file, or a committed
            ``dcp.save``, by any rank; one that a crash cut short does not count), or from
            the attempt's start, to the crash; 0 if a surviving rank saved one after it.
        attempt: the attempt that failed (0 is the first run, as
            ``TORCHELASTIC_RESTART_COUNT`` counts).
        world_size: the failed attempt's number of ranks.
        detected: when the last rank of the failed attempt had stopped: torchrun stopped
            the survivors ``restart_delay`` after the crash, or, with no restart left, their
            watchdog timeouts ran out.
        restarted: when the next attempt started (the crash plus ``restart_delay``), or
            None if there was none.
    """

    time: float
    rank: int
    node: int
    cause: str
    lost_work: float
    attempt: int
    world_size: int
    detected: float
    restarted: float = None

    @property
    def downtime(self):
        """Simulated seconds from the crash to the restart (None without a restart)."""
        return None if self.restarted is None else self.restarted - self.time


def check(faults, world_size, nodes):
    """``faults`` as a tuple, each checked against the run; TypeError/ValueError if wrong."""
    if faults is None:
        return ()
    if isinstance(faults, FAULT_TYPES):
        faults = [faults]
    if not isinstance(faults, (list, tuple)):
        raise TypeError(f"faults must be a list of faults (faults.Crash(...), ...), got "
                        f"{type(faults).__name__}")
    for fault in faults:
        if not isinstance(fault, FAULT_TYPES):
            names = ", ".join(f"faults.{t.__name__}" for t in FAULT_TYPES)
            raise TypeError(f"faults: {fault!r} is not a fault; use one of {names}")
        rank = getattr(fault, "rank", None)
        if rank is not None and rank >= world_size:
            raise ValueError(f"{fault}: rank {rank} is out of range for world_size "
                             f"{world_size}")
        node = getattr(fault, "node", None)
        if node is not None and node != "network" and node >= nodes:
            raise ValueError(f"{fault}: node {node} is out of range: the cluster has "
                             f"{nodes} node(s)")
    return tuple(faults)


def check_restarts(max_restarts, min_world_size, restart_delay, world_size):
    """``cluster.run``'s restart arguments; TypeError/ValueError naming the value."""
    if isinstance(max_restarts, bool) or not isinstance(max_restarts, int) or max_restarts < 0:
        raise ValueError(f"max_restarts must be a non-negative int (like torchrun "
                         f"--max-restarts), got {max_restarts!r}")
    if min_world_size is not None and (
            isinstance(min_world_size, bool) or not isinstance(min_world_size, int)
            or not 1 <= min_world_size <= world_size):
        raise ValueError(f"min_world_size must be None or an int from 1 to world_size "
                         f"({world_size}), got {min_world_size!r}")
    _number(restart_delay, "restart_delay (simulated seconds)", "cluster.run", low=0.0)


def crashes(faults, start, world_size, spec, alive_nodes):
    """``{rank: fault}``: the crash each rank of an attempt meets first.

    The attempt starts at simulated time ``start`` on ``spec``, whose nodes are the
    cluster's nodes ``alive_nodes`` (original indices). Faults before ``start`` belong to
    earlier attempts, or fell while the job was down, and do nothing.
    """
    scheduled = {}

    def add(rank, fault):
        if rank not in scheduled or fault.at < scheduled[rank].at:
            scheduled[rank] = fault

    for fault in faults:
        if isinstance(fault, Crash) and fault.at >= start and fault.rank < world_size:
            add(fault.rank, fault)
        elif isinstance(fault, NodeCrash) and fault.at >= start and fault.node in alive_nodes:
            node = alive_nodes.index(fault.node)
            for rank in range(world_size):
                if spec.node_of(rank) == node:
                    add(rank, fault)
    return scheduled


def rank_list(ranks):
    """``"rank 3"``, ``"ranks 0-2"`` or ``"ranks 0,2,5"``, for messages."""
    ranks = sorted(ranks)
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    return f"ranks {node_list(ranks)}"


def node_list(indices):
    """``"0-2"`` or ``"0,2,5"``."""
    indices = sorted(indices)
    if len(indices) > 2 and indices == list(range(indices[0], indices[-1] + 1)):
        return f"{indices[0]}-{indices[-1]}"
    return ",".join(map(str, indices))


def seconds(t):
    """Simulated seconds for a message: ``"2.5 s"``, ``"601.9 s"``, ``"0.000164 s"``."""
    return f"{t:.6g} s"


def on_alive_nodes(link_factor, alive_nodes):
    """``cluster.run``'s ``link_factor`` (keys: the cluster's original node indices, or
    ``"network"``) for an attempt on the nodes ``alive_nodes``: each factor stays with its
    node after an elastic shrink renumbered them, and a lost node's factor is dropped."""
    return {(key if key == "network" else alive_nodes.index(key)): factor
            for key, factor in (link_factor or {}).items()
            if key == "network" or key in alive_nodes}


def slow_down(faults, cost, world_size, alive_nodes):
    """Put the stragglers, degraded links and lossy nodes of ``faults`` into the cost model
    ``cost`` of an attempt with ``world_size`` ranks on the cluster's nodes ``alive_nodes``
    (original indices). Faults on ranks or nodes the attempt does not have do nothing."""
    for fault in faults:
        if isinstance(fault, Straggler) and fault.rank < world_size:
            cost.speed_windows.setdefault(fault.rank, []).append(
                (fault.start, fault.end, fault.factor))
        elif isinstance(fault, LinkDegraded) and (fault.node == "network"
                                                  or fault.node in alive_nodes):
            key = fault.node if fault.node == "network" else alive_nodes.index(fault.node)
            cost.link_windows.setdefault(key, []).append((fault.start, fault.end, fault.factor))
        elif isinstance(fault, PacketLoss) and fault.node in alive_nodes:
            cost.packet_loss[alive_nodes.index(fault.node)] = (fault.rate, fault.rto)


# ------------------------------------------------------- crashes, watchdogs, restarts
class Death(NamedTuple):
    """How a rank's simulated process died (``FaultState.deaths``)."""

    time: float   # simulated seconds
    cause: str    # the fault, e.g. "Crash(rank=3, at=2.0)", or the watchdog's message
    crash: bool   # True: a fault killed it; False: its watchdog, waiting for a dead rank


class FaultState:
    """The crashes, deaths and watchdogs of one run attempt (``SimWorld.faults``).

    A crash is a deadline on the rank's clock (:meth:`schedule_crash`); the clock calls
    :meth:`die` when it reaches it. An operation a dead rank never joins fails, and the
    ranks waiting on it get a watchdog deadline (:meth:`watch`). ``recorder`` gives the
    clocks (None: accounting off, and no faults); ``waiting_for(rank)`` gives the open
    operations of the world that wait for ``rank`` to join or post its side, as
    ``(collectives, messages)``, and takes those messages off their queues.
    """

    def __init__(self, world_size, recorder, waiting_for, stop_after_crash=None):
        self.world_size, self.recorder = world_size, recorder
        self._waiting_for = waiting_for
        # With a restart to come, torchrun's agent stops every surviving worker this many
        # simulated seconds after a crash (before their watchdogs fire); None: no restart.
        self.stop_after_crash = stop_after_crash
        self.deaths = {}   # rank -> Death, for the ranks whose process died
        self.crash_times = {}   # rank -> when its crash fault strikes, this attempt
        # Each rank's latest saved checkpoint (simulated seconds), for a restart's lost work.
        self.checkpoints = [None] * world_size
        # Each rank's watchdog timeout in simulated seconds (dist.init_process_group's).
        self.timeouts = [DEFAULT_WATCHDOG_TIMEOUT_S] * world_size

    def clock(self, rank):
        return self.recorder.clocks[rank] if self.recorder else None

    def schedule_crash(self, rank, t, cause):
        """``rank``'s process dies at simulated time ``t`` (a fault named ``cause``)."""
        self.crash_times[rank] = t
        self.clock(rank).set_deadline(t, lambda: self.die(rank, t, cause, crash=True), "")

    def note_checkpoint(self, rank):
        """``rank`` has saved a checkpoint now (a ``torch.save`` to a file, or a committed
        ``dcp.save``): a crash after this loses only the work done since
        (``RestartRecord.lost_work``)."""
        clock = self.clock(rank)
        if clock is not None:
            self.checkpoints[rank] = clock.end

    def die(self, rank, t, cause, crash):
        """``rank``'s process dies at ``t``: what waits for it fails; unwind the rank."""
        if rank not in self.deaths:
            self.deaths[rank] = Death(t, cause, crash)
            if self.recorder is not None:
                self.recorder.deaths.append((rank, t, crash))
            if crash and self.stop_after_crash is not None:
                self._stop_survivors(t + self.stop_after_crash, f"rank {rank} crashed")
            self._fail_operations_of(rank)
        run_no_more_code()   # no except, finally or with exit of the rank's own runs
        raise ProcessDied()

    def _stop_survivors(self, t, why):
        """torchrun's agent stops every live worker at ``t`` to restart them all."""
        label = f"stopped by torchrun to restart ({why})"
        for r in range(self.world_size):
            clock = self.clock(r)
            if r not in self.deaths and clock is not None:
                clock.set_deadline(t, lambda r=r, clock=clock: self.die(
                    r, max(t, clock.now), label, crash=False), label)

    def check_alive(self, rank):
        """Called as ``rank`` starts an operation: it dies here if its time has come."""
        clock = self.clock(rank)
        if clock is not None and clock.now >= clock.deadline:
            clock.die_at_deadline("")
        if rank in self.deaths:   # it caught its own death and went on
            raise ProcessDied()

    def die_waiting(self, clock, what):
        """The operation a rank waited for failed: its watchdog stops the rank."""
        if clock is None:   # (faults need accounting: cluster.run refuses them without)
            raise ProcessDied()
        clock.die_at_deadline(f"waiting in {what}")

    def watch(self, rank, since, what, reason):
        """``rank`` waits, since ``since``, for ``what``, which failed because of
        ``reason``: its watchdog stops it ``timeout`` seconds after ``since``."""
        clock = self.clock(rank)
        if clock is None or rank in self.deaths:
            return
        timeout = self.timeouts[rank]
        t = since + timeout
        label = f"watchdog: {what} did not finish in {timeout:g} s ({reason})"
        if self.stop_after_crash is not None and self.crash_times:
            # a restart is to come: torchrun stops the rank first (see _stop_survivors)
            stop = max(since, min(self.crash_times.values()) + self.stop_after_crash)
            if stop < t:
                t, label = stop, f"stopped by torchrun to restart ({reason})"
        clock.set_deadline(t, lambda: self.die(rank, max(t, clock.now), label, crash=False),
                           label)

    def fail_collective(self, coll, reason):
        """``coll`` can never complete: every member that joined it waits for its watchdog."""
        coll.failed = reason
        for group_rank, arrival in coll.arrivals.items():
            self.watch(coll.group.ranks[group_rank], arrival, str(coll), reason)

    def fail_message(self, msg, reason):
        """A posted send or receive can never complete: its rank waits for its watchdog."""
        msg.failed = reason
        self.watch(msg.poster(), msg.posted, str(msg), reason)

    def _fail_operations_of(self, rank):
        """Everything that waits for dead ``rank`` to join it fails. (What it joined or
        posted itself before it died stays: it may still complete before the death in
        simulated time, which :meth:`dies_before` decides once it would complete.)"""
        reason = self.dead_reason([rank])
        collectives, messages = self._waiting_for(rank)
        for coll in collectives:
            self.fail_collective(coll, reason)
        for msg in messages:
            self.fail_message(msg, reason)

    def dead_reason(self, ranks):
        """Why an operation among ``ranks`` can never complete (one of them died), or None."""
        for r in ranks:
            if r in self.deaths:
                death = self.deaths[r]
                return (f"rank {r} crashed at {seconds(death.time)}" if death.crash else
                        f"rank {r} stopped at {seconds(death.time)} (its own watchdog)")
        return None

    def dies_before(self, ranks, end):
        """Why an operation among ``ranks`` ending at ``end`` never completes: one of them
        dies before (a crash fault, or its watchdog). None if all live to see it end."""
        for r in ranks:
            clock = self.recorder.clocks[r]
            if clock.deadline < end:
                how = "was stopped by its watchdog" if clock.deadline_label else "crashed"
                return f"rank {r} {how} at {seconds(clock.deadline)}"
        return None


def failure(faults, run, scheduled, attempt, start, alive_nodes):
    """The :class:`RestartRecord` of a failed attempt (its :class:`FaultState`
    ``faults``, its partial ``run``, the crashes ``scheduled`` for it), and the original
    indices of the nodes a NodeCrash took down."""
    crashed_ranks = {r: d for r, d in faults.deaths.items() if d.crash} or faults.deaths
    rank = min(crashed_ranks, key=lambda r: (crashed_ranks[r].time, r))
    death = crashed_ranks[rank]
    # The latest checkpoint saved in this attempt (a torch.save to a file, or a dcp.save
    # once committed; a write the crash cut short never counts). Another rank may finish
    # one after the crash, before its watchdog fires: then no work is lost.
    resume = max((t for t in faults.checkpoints if t is not None and t >= start),
                 default=start)
    node = alive_nodes[run.cluster.spec.node_of(rank)]
    dead_nodes = {alive_nodes[run.cluster.spec.node_of(r)] for r, d in faults.deaths.items()
                  if d.crash and isinstance(scheduled.get(r), NodeCrash)}
    record = RestartRecord(
        time=death.time, rank=rank, node=node, cause=death.cause,
        lost_work=max(0.0, death.time - resume), attempt=attempt,
        world_size=faults.world_size, detected=run.elapsed)
    return record, dead_nodes


def crashed(record, run, restarts, advice):
    """The :class:`~simcluster.RankCrashedError` that ends a run after the failure
    ``record`` (``advice``: what to change)."""
    stopped = sorted(r for r, d in run._deaths.items() if not d.crash)
    waited = ""
    if stopped:
        timeouts = sorted({run._timeouts[r] for r in stopped})
        waited = (f" {rank_list(stopped).capitalize()} waited for it until their "
                  f"watchdog timeout ({' / '.join(f'{t:g}' for t in timeouts)} s, set by "
                  "dist.init_process_group(timeout=...)) and stopped; the run ended at "
                  f"{seconds(record.detected)}.")
    message = (f"rank {record.rank} (node {record.node}) crashed at "
               f"{seconds(record.time)} of simulated time ({record.cause}), in attempt "
               f"{record.attempt}.{waited} {advice} "
               "The partial run is in .run: .run.timeline() shows the crash and the wait.")
    return RankCrashedError(record.rank, record.node, record.time, record.cause, run,
                            restarts + [record], message)
