"""Each node's local storage, as the ranks of a run share it.

A checkpoint written or read inside a rank (``torch.save``/``torch.load`` on a file,
``torch.distributed.checkpoint``'s ``dcp.save``/``dcp.load`` with its file-system
writer and reader) moves its bytes through the node's NVMe array
(:class:`~simcluster.spec.StorageSpec`). The rank waits for it: the I/O takes the rank's
compute stream from the moment it starts until its last byte is on (or off) the disks,
shown as an ``"io"`` event in its timeline (after an idle ``"wait for storage"`` while
the array is busy with other ranks' transfers).

The array serves one transfer at a time at its full sequential bandwidth, in the order
the ranks issue them; a transfer that finds it busy waits, and one issued at a simulated
time when it is idle uses the gap. So the node never moves more than its bandwidth, and
``k`` ranks of a node that write ``n`` bytes each at once all have their bytes on disk
``k·n / bandwidth`` after they started — the same total as if they shared the bandwidth
evenly (the last rank finishes then; earlier ranks in the hand-over order sooner). Nodes
have separate arrays. A rank that crashes while it writes leaves the file torn: the real
file is cut to the bytes that reached the disks before the crash, the array is free from
the crash on (the next rank's transfer need not wait for the rest), and only those bytes
are counted as written.

Not modelled: the copy from the GPU to the host before a write (the tensors' PCIe
crossing), the page cache (every byte goes to or comes from the disks), file-system
metadata and latency per file.
"""

import bisect
import errno
import math
import os


class NodeStorage:
    """One node's NVMe array during a run: when it is busy, and the files on it.

    Attributes:
        spec: the node's :class:`~simcluster.spec.StorageSpec`.
        bytes_written, bytes_read: totals over the run.
        files: ``{path: bytes}`` written by the run's ranks (a file written again
            replaces its old size), to check the capacity.
    """

    def __init__(self, spec, node_name):
        self.spec, self.node_name = spec, node_name
        self.bytes_written = self.bytes_read = 0
        self.files = {}
        self._starts, self._ends = [], []   # busy spans, sorted and disjoint

    @property
    def used(self):
        """Bytes the run's files take on this node's storage."""
        return sum(self.files.values())

    def transfer(self, start, nbytes, write, rank, path=None):
        """Move ``nbytes`` (written if ``write``, else read) for ``rank``, asked for at
        simulated time ``start``; return ``(begin, end)``: when the array starts moving
        them (later than ``start`` if it is busy) and when the last byte has moved.

        Raises ``OSError(ENOSPC)`` when a write would fill the storage beyond its
        capacity, as a full disk does.
        """
        begin, end, _ = self.transfer_until(start, nbytes, write, rank, path)
        return begin, end

    def transfer_until(self, start, nbytes, write, rank, path=None, until=math.inf):
        """:meth:`transfer`, cut short at simulated time ``until`` (the rank dies then):
        the array is busy, and bytes are counted, only until then. Returns ``(begin, end,
        moved)``: ``end`` is when the whole transfer would have ended, ``moved`` the bytes
        moved by ``min(end, until)``; a cut write leaves ``path`` at ``moved`` bytes."""
        key = path if path is not None else ("unnamed", rank, len(self.files))
        if write:
            used = self.used - self.files.get(key, 0) + nbytes
            if used > self.spec.capacity:
                raise OSError(errno.ENOSPC, (
                    f"rank {rank}: no space left on the storage of {self.node_name} "
                    f"({self.spec.name}, {self.spec.capacity / 1e12:g} TB): writing "
                    f"{nbytes:,} bytes would need {used:,}. Delete old checkpoints "
                    "(keep the last few) or write fewer bytes (a sharded checkpoint, "
                    "no optimizer state for evaluation)."))
        seconds = nbytes / (self.spec.write_bandwidth if write else self.spec.read_bandwidth)
        begin, end, done = self._occupy(start, seconds, until)
        if done < seconds:   # cut short
            nbytes = int(nbytes * done / seconds)
            if write:
                self._tear(path, nbytes)
        if write:
            self.files[key] = nbytes
            self.bytes_written += nbytes
        else:
            self.bytes_read += nbytes
        return begin, end, nbytes

    @staticmethod
    def _tear(path, nbytes):
        """A write to ``path`` was cut short (its rank died): the real file keeps at most
        its first ``nbytes``, as a file a process died while writing does. (Never longer
        than it is: a fake tensor's bytes are counted, but only its record is written.)"""
        if path is not None and os.path.exists(path) and os.path.getsize(path) > nbytes:
            os.truncate(path, nbytes)

    def _occupy(self, t, seconds, until=math.inf):
        """Use the first ``seconds`` of idle time from ``t`` on, but none after ``until``;
        return when that time begins, when it would end, and how much of it was used."""
        starts, ends = self._starts, self._ends
        pieces = []
        wanted = seconds
        i = bisect.bisect_right(ends, t)   # the first busy span ending after t
        while seconds > 0:
            if i < len(starts) and starts[i] <= t:
                t = ends[i]                 # busy: wait for the end of the span
                i += 1
                continue
            gap = (starts[i] - t) if i < len(starts) else seconds
            used = min(gap, seconds)
            pieces.append((t, t + used))
            t += used
            seconds -= used
        done = 0.0
        for a, b in pieces:
            b = min(b, until)
            if b > a:
                self._mark_busy(a, b)
                done += b - a
        if t <= until:
            done = wanted   # (not cut: exactly what was asked, without rounding)
        return (pieces[0][0] if pieces else t), t, done

    def _mark_busy(self, start, end):
        """Add ``[start, end)`` to the busy spans, merging neighbours."""
        starts, ends = self._starts, self._ends
        i = bisect.bisect_left(ends, start)
        j = bisect.bisect_right(starts, end)
        if i < j:
            start, end = min(start, starts[i]), max(end, ends[j - 1])
        starts[i:j] = [start]
        ends[i:j] = [end]
