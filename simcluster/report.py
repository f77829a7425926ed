"""``Run`` — the record of one finished run: results, simulated time, memory, traffic."""


class Summary:
    """Per-rank totals of a run; prints as a text table, renders as HTML in a notebook.

    ``rows[r]`` is a dict with keys :data:`COLUMNS`: seconds of compute, communication,
    idle and overlap; ``peak_memory_GiB``, the most memory the rank held at once; and
    ``peak_activations_GiB``, the most its activations alone held at any moment (not
    necessarily at the total peak) — what sets a pipeline stage's memory apart from
    another's.
    """

    COLUMNS = ("rank", "compute_s", "comm_s", "idle_s", "overlap_s", "peak_memory_GiB",
               "peak_activations_GiB")

    def __init__(self, rows):
        self.rows = rows  # one dict per rank, keys COLUMNS

    def _cells(self):
        return [[str(row["rank"])] + [_fmt_seconds(row[c]) for c in self.COLUMNS[1:5]]
                + [f"{row[c]:.3f}" for c in self.COLUMNS[5:]] for row in self.rows]

    def __str__(self):
        header = ["rank", "compute", "communication", "idle", "overlap", "peak memory GiB",
                  "peak activations GiB"]
        cells = [header] + self._cells()
        widths = [max(len(r[i]) for r in cells) for i in range(len(header))]
        return "\n".join("  ".join(c.rjust(w) for c, w in zip(r, widths)) for r in cells)

    def __repr__(self):
        return str(self)

    def _repr_html_(self):
        header = ["rank", "compute", "communication", "idle", "overlap", "peak memory (GiB)",
                  "peak activations (GiB)"]
        head = "".join(f"<th>{h}</th>" for h in header)
        body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row) + "</tr>"
                       for row in self._cells())
        return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _fmt_seconds(s):
    """Seconds in the unit that reads best: s, ms or us."""
    if s >= 1:
        return f"{s:.3f} s"
    if s >= 1e-3:
        return f"{s * 1e3:.3f} ms"
    return f"{s * 1e6:.1f} us"


def _overlap(events):
    """Seconds of communication that ran while the compute stream was busy."""
    compute = sorted((e.start, e.end) for e in events if e.lane == "compute")
    comm = []   # the union of communication spans: a send and a receive may overlap
    for start, end in sorted((e.start, e.end) for e in events if e.lane == "comm"):
        if comm and start <= comm[-1][1]:
            comm[-1] = (comm[-1][0], max(comm[-1][1], end))
        else:
            comm.append((start, end))
    total, i = 0.0, 0
    for cs, ce in comm:
        while i < len(compute) and compute[i][1] <= cs:
            i += 1
        j = i
        while j < len(compute) and compute[j][0] < ce:
            total += max(0.0, min(ce, compute[j][1]) - max(cs, compute[j][0]))
            j += 1
    return total


class Run:
    """The record of one finished run.

    Attributes:
        results: ``results[r]`` is what the function returned on rank ``r``.
        world_size: the number of ranks that ran.
        cluster: the :class:`~simcluster.Cluster` it ran on.
        bytes_sent: ``bytes_sent[r]`` — payload bytes rank ``r`` sent point-to-point.
        messages_sent: ``messages_sent[r]`` — point-to-point messages rank ``r`` sent.
        elapsed: simulated seconds from start to the last rank's last work (with
            restarts: of the last attempt, so counting every attempt and the downtime).
        restarts: a :class:`~simcluster.faults.RestartRecord` for each crash that made the
            run restart (``cluster.run(..., max_restarts=...)``); empty without one.
    """

    def __init__(self, cluster, world_size, results, world):
        self.cluster, self.world_size, self.results = cluster, world_size, results
        self.bytes_sent = list(world.bytes_sent)
        self.messages_sent = list(world.messages_sent)
        self.recorder = world.recorder
        self.restarts = []
        self._deaths = dict(world.faults.deaths)  # this attempt's dead ranks (faults.Death)
        self._timeouts = list(world.faults.timeouts)  # each rank's watchdog timeout, seconds

    def __repr__(self):
        return f"<Run of {self.world_size} ranks on {self.cluster.spec.name}>"

    def _need_accounting(self):
        if self.recorder is None:
            raise RuntimeError("this run had accounting=False: run again with accounting on "
                               "to see simulated time and memory")
        return self.recorder

    @property
    def elapsed(self):
        """Simulated seconds until the last rank finished its last compute or communication."""
        return max(c.end for c in self._need_accounting().clocks)

    @property
    def deaths(self):
        """``[(rank, simulated time, crashed), ...]``: every rank whose process died, by
        a fault (``crashed``) or by its watchdog while it waited for a dead rank, over
        every attempt (since the last elastic shrink), in the order they died."""
        # Ranks take turns in wall-clock order, not simulated-time order: a rank that
        # computes alone until it dies late is recorded before one that died early.
        return sorted(self._need_accounting().deaths, key=lambda death: death[1])

    @property
    def collectives(self):
        """Every collective of the run, a :class:`~simcluster.CollectiveRecord` (op,
        algorithm, protocol, ranks, nbytes, start, end, duration), in the order they
        completed."""
        return list(self._need_accounting().collectives)

    @property
    def traffic(self):
        """``{(src, dst): bytes}`` every rank sent to every other, by algorithm and p2p."""
        return dict(self._need_accounting().traffic)

    def clock(self, rank):
        """Rank ``rank``'s :class:`~simcluster.clock.RankClock`: compute, comm and idle
        totals, and its :class:`~simcluster.ClockEvent` list ``events``."""
        return self._need_accounting().clocks[rank]

    def peak_memory(self, rank):
        """``{category: bytes}`` in use on ``rank`` at its peak, plus ``"total"``."""
        memory = self._need_accounting().memories[rank]
        return {**memory.peak_by_category, "total": memory.peak}

    def peak_host_memory(self, rank):
        """``{category: bytes}`` ``rank`` held in host memory at its host peak, plus
        ``"total"`` (pinned memory: what CPU offload keeps off the device)."""
        memory = self._need_accounting().host_memories[rank]
        return {**memory.peak_by_category, "total": memory.peak}

    @property
    def host_transfers(self):
        """Per rank, ``{"host->device": bytes, "device->host": bytes}`` copied over its
        PCIe link."""
        return [dict(t) for t in self._need_accounting().host_transfers]

    @property
    def storage_io(self):
        """Per rank, ``{"write": bytes, "read": bytes}`` it moved to and from its node's
        storage (``torch.save``/``torch.load`` on files, ``dcp.save``/``dcp.load``); the
        simulated seconds it spent on them are ``run.clock(rank).io``."""
        return [dict(t) for t in self._need_accounting().storage_bytes]

    def category_peaks(self, rank):
        """``{category: bytes}``: the most each category held on ``rank`` at any moment.

        Unlike :meth:`peak_memory`, each category's own maximum, wherever in time it fell:
        a pipeline stage's activations peak at the end of its forwards, before the
        gradients that make the total peak exist.
        """
        return dict(self._need_accounting().memories[rank].category_peaks)

    def summary(self):
        """Per rank: compute, communication, idle, overlap (seconds), peak memory and peak
        activation memory (GiB); see :class:`Summary`."""
        rec = self._need_accounting()
        rows = []
        for r, clock in enumerate(rec.clocks):
            memory = rec.memories[r]
            rows.append({"rank": r, "compute_s": clock.compute, "comm_s": clock.comm,
                         "idle_s": clock.idle, "overlap_s": _overlap(clock.events),
                         "peak_memory_GiB": memory.peak / 2**30,
                         "peak_activations_GiB": memory.category_peaks["activations"] / 2**30})
        return Summary(rows)

    # ------------------------------------------------------------ pictures and traces
    def timeline(self, ax=None, ranks=None, max_labels=100):
        """A Gantt chart: one row per rank (rank 0 on top), compute / communication / idle.

        Each rank's row shows its compute stream (compute, and idle waits) with its
        communication stream as a thinner bar just below; wide communication bars are
        labelled with the collective's name (at most ``max_labels`` of them). A rank that
        died is marked where it died: a red X for a crash fault, a bar for a rank its
        watchdog stopped (:attr:`deaths`). ``ranks`` picks the ranks to show. Returns the
        matplotlib Axes; end the cell with ``plt.show()``.
        """
        from .plots import draw_timeline

        return draw_timeline(self._need_accounting(), self.cluster.spec, ax=ax, ranks=ranks,
                             max_labels=max_labels)

    def memory_plot(self, ax=None, ranks=None):
        """Memory in use over simulated time per rank (with the device capacity when it is
        near), and each rank's peak memory by category as stacked bars.

        ``ax``: None for a new 1x2 figure, or a pair of Axes ``(over_time, peaks)``.
        Returns the pair of Axes.
        """
        from .plots import draw_memory

        return draw_memory(self._need_accounting(), self.cluster.spec, ax=ax, ranks=ranks)

    def comm_matrix(self, ax=None):
        """Bytes each rank sent to each other rank as a heatmap (sender rows, receiver
        columns), with node boundaries marked. Returns the Axes."""
        from .plots import draw_comm_matrix

        return draw_comm_matrix(self._need_accounting(), self.cluster.spec, ax=ax)

    def module_heatmap(self, ax=None):
        """Compute time per module (rows) per rank (columns) as a heatmap. Returns the Axes."""
        from .plots import draw_module_heatmap

        return draw_module_heatmap(self._need_accounting(), self.cluster.spec, ax=ax)

    def save_trace(self, path):
        """Write the run as a Chrome trace / Perfetto JSON file and return ``path``.

        Open it at https://ui.perfetto.dev or chrome://tracing: a process per node, a
        compute and a communication thread per rank, idle waits, and memory counters.
        """
        from .trace import save_trace

        return save_trace(self._need_accounting(), self.cluster.spec, path)
