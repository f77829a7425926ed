"""Errors raised by a simulated run.

Every error the simulator raises on purpose derives from :class:`SimulationError`, so a
notebook can catch them all with one ``except``. Each message says what went wrong, on
which rank, in which operation, and what to try next.
"""

import pickle
import traceback

import torch


def _rebuild(cls, args, fields):
    """Unpickle a simulator error without calling its ``__init__`` (see ``__reduce__``)."""
    error = cls.__new__(cls, *args)
    error.args = args
    error.__dict__.update(fields)
    return error


class SimulationError(Exception):
    """Base class of every error raised by a simulated run.

    Errors pickle with their message and fields (so they cross process boundaries:
    pytest-xdist, multiprocessing), although their ``__init__`` takes other arguments
    than the message that Python's default pickling would pass back.
    """

    def __reduce__(self):
        return _rebuild, (type(self), self.args, self.__dict__)


class RankError(SimulationError):
    """A rank's function raised an exception; the other ranks were stopped.

    Attributes:
        rank: the global rank that raised.
        original: the exception raised on that rank.
        traceback_text: the formatted traceback of ``original``, from inside the rank.
    """

    # Some libraries put whole tensor descriptions in a message (DTensor's can run to
    # 100 kB): the error shows the start, ``original`` keeps all of it.
    MESSAGE_LIMIT = 2000

    def __init__(self, rank: int, original: BaseException):
        self.rank = rank
        self.original = original
        self.traceback_text = "".join(
            traceback.format_exception(type(original), original, original.__traceback__)
        )
        message = str(original)
        if len(message) > self.MESSAGE_LIMIT:
            message = (f"{message[:self.MESSAGE_LIMIT]}… ({len(message):,} characters in "
                       "all: the whole message is in .original, the whole traceback in "
                       ".traceback_text)")
        shown = self.traceback_text
        if len(shown) > 3 * self.MESSAGE_LIMIT:   # the frames only, without the long text
            shown = "".join(traceback.format_tb(original.__traceback__))
        super().__init__(
            f"rank {rank} raised {type(original).__name__}: {message}\n"
            f"The other ranks were stopped. Traceback from rank {rank}:\n{shown}"
        )

    def __reduce__(self):
        rebuild, (cls, args, fields) = super().__reduce__()
        try:
            pickle.dumps(self.original)
        except Exception:  # noqa: BLE001 — e.g. it holds a lock: keep its type and text
            stand_in = RuntimeError(f"{type(self.original).__name__}: {self.original}")
            fields = {**fields, "original": stand_in}
        return rebuild, (cls, args, fields)


class DeadlockError(SimulationError):
    """Every rank that is still running is waiting for something that can never happen.

    Attributes:
        pending: ``{rank: description}`` of what each rank was doing when the run stopped.
        recent: ``{rank: [description, ...]}`` — each rank's last few collectives
            (the flight recorder), oldest first.
        hint: what to try next ("" if there is none).
    """

    def __init__(self, pending: dict, recent: dict, hint: str = ""):
        self.pending = pending
        self.recent = recent
        self.hint = hint
        lines = ["deadlock: no rank can make progress."]
        for rank in sorted(pending):
            lines.append(f"  rank {rank}: {pending[rank]}")
            if recent.get(rank):
                lines.append(f"          last collectives: {'; '.join(recent[rank])}")
        if hint:
            lines.append(f"Hint: {hint}")
        super().__init__("\n".join(lines))


class CollectiveMismatchError(SimulationError):
    """Ranks called different collectives at the same point of the same group.

    Attributes:
        field: what differs (``"op"``, ``"shape"``, ``"dtype"``, ``"root"``,
            ``"reduce_op"``, ``"group"``, ...).
        values: ``{rank: value}`` of that field on the ranks involved.
        seq: the collective's sequence number in its group (None for send/recv).
        hint: what to try next ("" if there is none).
    """

    def __init__(self, field: str, values: dict, seq: int, group: str, op: str, hint: str = ""):
        self.field = field
        self.values = values
        self.seq = seq
        self.hint = hint
        shown = ", ".join(f"rank {r}: {v}" for r, v in sorted(values.items()))
        # Without values (known only once every rank arrived) the hint says what differs.
        what = f"the {field} differs ({shown})" if values else f"the ranks' {field} do not fit"
        message = (f"collective mismatch in {op if seq is None else f'{op} #{seq}'} on group "
                   f"{group}: {what}.")
        super().__init__(message + (f"\nHint: {hint}" if hint else ""))


class SimulationTimeout(SimulationError):
    """A rank ran for longer than the run's wall-clock ``timeout`` (an infinite loop?)."""


def _gib(nbytes):
    return f"{nbytes / 2**30:.2f} GiB"


class OutOfMemoryError(SimulationError, torch.OutOfMemoryError):
    """A rank tried to use more memory than its simulated device has.

    Worded like PyTorch's CUDA message. Attributes: ``rank``, ``requested`` (bytes),
    ``capacity`` (bytes), ``in_use`` (``{category: bytes}`` before the request).
    """

    def __init__(self, rank, device, requested, total, in_use, category):
        self.rank, self.requested, self.capacity = rank, requested, device.memory
        self.in_use = in_use
        free = max(device.memory - total, 0)
        used = ", ".join(f"{name} {_gib(b)}" for name, b in in_use.items() if b)
        where = getattr(device, "where", None) or f"GPU {rank} ({device.name})"
        advice = getattr(device, "advice", None) or (
            "Shard what you can (ZeRO/FSDP), use a smaller micro-batch or activation "
            "checkpointing, or lower precision.")
        super().__init__(
            f"Simulated out of memory on rank {rank}. Tried to allocate {_gib(requested)} "
            f"({category}). {where} has a total capacity of "
            f"{_gib(device.memory)} of which {_gib(free)} is free. In use: "
            f"{used or 'nothing'}. {advice}")


class RankCrashedError(SimulationError):
    """A rank crashed (a fault) and the run could not go on: no restarts were allowed, or
    it failed more often than ``max_restarts``, or too few ranks were left to shrink to.

    Attributes:
        rank: the rank that crashed first in the last attempt (as that attempt numbered it).
        node: the index of its node in the cluster.
        time: simulated seconds when it crashed.
        cause: the fault, e.g. ``"Crash(rank=3, at=2.0)"``.
        run: the partial :class:`~simcluster.Run` of the last attempt: ``run.elapsed``
            counts every attempt, including the survivors' watchdog waits, and
            ``run.timeline()`` shows the crash and the wait. ``run.results`` holds what
            the ranks that returned before the failure returned (None for the others).
        restarts: a :class:`~simcluster.faults.RestartRecord` per failure, this one last.
    """

    def __init__(self, rank, node, time, cause, run, restarts, message):
        self.rank, self.node, self.time, self.cause = rank, node, time, cause
        self.run, self.restarts = run, list(restarts)
        super().__init__(message)

    def __reduce__(self):
        # The partial run holds the ranks' records (and the cluster): keep them out of
        # pickles, which only need the message and the numbers.
        rebuild, (cls, args, fields) = super().__reduce__()
        return rebuild, (cls, args, {**fields, "run": None})


class ProcessDied(BaseException):
    """Unwinds a rank whose simulated process died: a crash fault, or its watchdog timeout.

    Internal: a BaseException, so that the learner's ``except Exception`` does not catch
    it, as nothing in a real process catches its own death.
    """
