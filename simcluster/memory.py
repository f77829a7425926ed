"""Simulated memory: bytes in use on each rank's device (and its share of host memory),
by category.

Accounting (:mod:`simcluster.accounting`) tells a rank's :class:`MemoryAccount` about
every storage torch creates, resizes or frees, and what it is for; the account keeps the
total, the peak, a history over simulated time, and raises
:class:`~simcluster.OutOfMemoryError` beyond the device's capacity.
"""

import weakref

from .errors import OutOfMemoryError

CATEGORIES = ("parameters", "gradients", "optimizer state", "activations",
              "communication buffers", "other")


class MemoryAccount:
    """Bytes in use on one simulated device, by category, with peak and history.

    Attributes:
        capacity: the device's memory in bytes.
        in_use: ``{category: bytes}`` held now.
        total: bytes held now.
        peak, peak_by_category: the largest total so far, and ``in_use`` at that moment.
        category_peaks: ``{category: the most bytes it held at any moment}`` — for one
            category this can exceed its share at the total peak (a pipeline stage's
            activations peak while its gradients are still small).
        history: ``[(simulated time, total bytes)]``, one entry per time the total changed.
    """

    def __init__(self, rank, device, clock):
        self.rank, self.device, self.clock = rank, device, clock
        self.capacity = device.memory
        self.in_use = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self.peak = 0
        self.peak_by_category = dict(self.in_use)
        self.category_peaks = dict(self.in_use)
        self.history = [(0.0, 0)]
        self._live = {}          # storage key -> its _Held (nbytes, category)
        self.live = self._live   # the same dict, read (never written) by the accounting's
        # fast path, which skips holds()' call per op
        self._on_free = self._freed   # one bound method for every _Held's callback
        self._closed = False     # the rank has finished: the record is final

    def holds(self, key):
        """True if storage ``key`` is counted now."""
        return key in self._live

    def category_of(self, key):
        """The category storage ``key`` is counted in, or None if it is not counted."""
        entry = self._live.get(key)
        return None if entry is None else entry.category

    def reset_peak(self):
        """Make the current total the peak, as torch.cuda.reset_peak_memory_stats does."""
        self.peak = self.total
        self.peak_by_category = dict(self.in_use)
        self.category_peaks = dict(self.in_use)

    def close(self):
        """Freeze the record: storages freed after the rank returned change nothing."""
        self._closed = True

    def restart(self):
        """The rank's process was restarted (after a crash): it holds nothing now. The
        peaks and the history stay, so they cover every attempt."""
        self._live.clear()
        self.in_use = dict.fromkeys(CATEGORIES, 0)
        self.total = 0
        self._closed = False
        self.history.append((self.clock.now, 0))

    def allocate(self, key, nbytes, category, storage):
        """Count a new storage; raise :class:`OutOfMemoryError` beyond capacity.

        It is forgotten when torch frees ``storage``.
        """
        live = self._live
        if key in live or nbytes == 0:
            return
        if self.total + nbytes > self.capacity:
            raise OutOfMemoryError(self.rank, self.device, nbytes, self.total,
                                   dict(self.in_use), category)
        # A weak reference whose callback runs when torch frees the storage.
        entry = live[key] = _Held(storage, self._on_free)
        entry.key, entry.nbytes, entry.category = key, nbytes, category
        self._change(category, nbytes)

    def _freed(self, held):
        """Forget the storage ``held`` refers to: torch freed it (the weak reference's
        callback, for every storage)."""
        entry = self._live.pop(held.key, None)
        if entry is not None:
            self._change(entry.category, -entry.nbytes)

    def retag(self, key, category):
        """Move a live storage to ``category`` (e.g. once we learn it is a parameter)."""
        entry = self._live.get(key)
        if entry is not None and entry.category != category and not self._closed:
            self.in_use[entry.category] -= entry.nbytes
            self.in_use[category] += entry.nbytes
            entry.category = category
            if self.in_use[category] > self.category_peaks[category]:
                self.category_peaks[category] = self.in_use[category]

    def hand_over(self, key, other):
        """Move live storage ``key``, with its category, to account ``other`` (its data
        moved from the device to the host, or back); return its bytes (0 if not held)."""
        entry = self._live.pop(key, None)
        if entry is None:
            return 0
        self._change(entry.category, -entry.nbytes)
        other.allocate(key, entry.nbytes, entry.category, entry())
        return entry.nbytes

    def resize(self, key, nbytes, storage):
        """A storage was resized in place (FSDP2 frees and refills parameters this way)."""
        entry = self._live.get(key)
        if entry is None:
            self.allocate(key, nbytes, "other", storage)
            return
        grow = nbytes - entry.nbytes
        if grow > 0 and self.total + grow > self.capacity:
            raise OutOfMemoryError(self.rank, self.device, grow, self.total,
                                   dict(self.in_use), entry.category)
        entry.nbytes = nbytes
        self._change(entry.category, grow)

    def _change(self, category, delta):
        # Runs for every storage allocated and freed: locals, one dict lookup each.
        if self._closed:
            return
        in_use = self.in_use
        held = in_use[category] = in_use[category] + delta
        peaks = self.category_peaks
        if held > peaks[category]:
            peaks[category] = held
        total = self.total = self.total + delta
        if total > self.peak:
            self.peak = total
            self.peak_by_category = dict(in_use)
        t = self.clock.now
        history = self.history
        if history[-1][0] == t:
            history[-1] = (t, total)
        else:
            history.append((t, total))


class _Held(weakref.ref):
    """A storage a :class:`MemoryAccount` counts: a weak reference to it (whose callback
    forgets it when torch frees it) that also holds its key, bytes and category (one
    object per storage: the accounting makes one for nearly every op)."""

    __slots__ = ("key", "nbytes", "category")
