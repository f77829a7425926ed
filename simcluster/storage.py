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
file is cut to the bytes that reached the disks before the crash.

Not modelled: the copy from the GPU to the host before a write (the tensors' PCIe
crossing), the page cache (every byte goes to or comes from the disks), file-system
metadata and latency per file.
"""

import bisect
import errno
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
        if write:
            key = path if path is not None else ("unnamed", rank, len(self.files))
            used = self.used - self.files.get(key, 0) + nbytes
            if used > self.spec.capacity:
                raise OSError(errno.ENOSPC, (
                    f"rank {rank}: no space left on the storage of {self.node_name} "
                    f"({self.spec.name}, {self.spec.capacity / 1e12:g} TB): writing "
                    f"{nbytes:,} bytes would need {used:,}. Delete old checkpoints "
                    "(keep the last few) or write fewer bytes (a sharded checkpoint, "
                    "no optimizer state for evaluation)."))
            self.files[key] = nbytes
            self.bytes_written += nbytes
            seconds = nbytes / self.spec.write_bandwidth
        else:
            self.bytes_read += nbytes
            seconds = nbytes / self.spec.read_bandwidth
        return self._occupy(start, seconds)

    def tear(self, path, nbytes):
        """A write to ``path`` was cut short (its rank crashed): the real file keeps its
        first ``nbytes``, as a file a process died while writing does."""
        if path is None:
            return
        if os.path.exists(path):
            os.truncate(path, nbytes)
        self.files[path] = nbytes

    def _occupy(self, t, seconds):
        """Use the first ``seconds`` of idle time from ``t`` on; return when that time
        begins and when it ends."""
        starts, ends = self._starts, self._ends
        pieces = []
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
        for a, b in pieces:
            self._mark_busy(a, b)
        return (pieces[0][0] if pieces else t), t

    def _mark_busy(self, start, end):
        """Add ``[start, end)`` to the busy spans, merging neighbours."""
        starts, ends = self._starts, self._ends
        i = bisect.bisect_left(ends, start)
        j = bisect.bisect_right(starts, end)
        if i < j:
            start, end = min(start, starts[i]), max(end, ends[j - 1])
        starts[i:j] = [start]
        ends[i:j] = [end]
