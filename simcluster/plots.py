"""Pictures of a cluster and of a run: topology, timeline, memory, traffic, module time.

Every function draws into ``ax`` (or a new figure when ``ax`` is None) and returns the
Axes it drew on. None of them calls ``plt.show()`` or prints: a notebook cell ends with
``plt.show()`` itself. The same input always gives the same picture.

The :class:`~simcluster.Run` methods ``timeline``, ``memory_plot``, ``comm_matrix`` and
``module_heatmap`` and :meth:`~simcluster.Cluster.draw` are thin wrappers around these.
"""

import math

import numpy as np

from .memory import CATEGORIES

# Colours of the lanes of a rank's timeline (colour-blind friendly).
LANE_COLORS = {"compute": "#4C72B0", "comm": "#DD8452", "idle": "#C8C8C8", "io": "#55A868"}
LANE_NAMES = {"compute": "compute", "comm": "communication", "idle": "idle (waiting)",
              "io": "storage I/O"}
CATEGORY_COLORS = dict(zip(CATEGORIES, ("#4C72B0", "#55A868", "#C44E52", "#8172B3",
                                        "#DD8452", "#937860")))

# How a rank's death is marked on the timeline: a crash (a fault), and a rank stopped by
# its watchdog while it waited for a dead one.
DEATH_MARKERS = {True: ("X", "#C44E52", "crash"), False: ("|", "#222222", "watchdog stop")}

# Row geometry of the timeline, in rank rows (the y axis is inverted: rank 0 on top).
MAIN_LANE = (-0.42, 0.08)     # compute and idle: the compute stream
COMM_LANE = (0.12, 0.42)      # communication stream, a thinner bar just below


# --------------------------------------------------------------------- helpers
def _pyplot():
    import matplotlib.pyplot as plt

    return plt


def _new_axes(figsize, ncols=1, **kwargs):
    fig, ax = _pyplot().subplots(1, ncols, figsize=figsize, **kwargs)
    return ax


def time_unit(seconds):
    """``(scale, name)`` to show a span of ``seconds``: s, ms or µs."""
    if seconds >= 1:
        return 1.0, "s"
    if seconds >= 1e-3:
        return 1e3, "ms"
    return 1e6, "µs"


def byte_unit(nbytes, binary=False):
    """``(divisor, name)`` to show ``nbytes``: GB/MB/kB/B (GiB/MiB/KiB/B if ``binary``)."""
    units = (((2**30, "GiB"), (2**20, "MiB"), (2**10, "KiB")) if binary
             else ((1e9, "GB"), (1e6, "MB"), (1e3, "kB")))
    for divisor, name in units:
        if nbytes >= divisor:
            return divisor, name
    return 1, "B"


def _check_ranks(ranks, world_size):
    if ranks is None:
        return list(range(world_size))
    ranks = [ranks] if isinstance(ranks, int) else list(ranks)
    for r in ranks:
        if not isinstance(r, (int, np.integer)) or isinstance(r, bool) or not 0 <= r < world_size:
            raise ValueError(f"ranks must be ranks of this run (0..{world_size - 1}), got {r!r}")
    if not ranks:
        raise ValueError("ranks is empty: give at least one rank to plot")
    return sorted(set(int(r) for r in ranks))


def _rank_ticks(ax, ranks, axis="y", fmt="rank {}", fontsize=None):
    """Tick every rank position, labelling at most ~32 of them."""
    step = max(1, math.ceil(len(ranks) / 32))
    positions = list(range(len(ranks)))
    labels = [fmt.format(r) if i % step == 0 else "" for i, r in enumerate(ranks)]
    fontsize = fontsize or (8 if len(ranks) <= 16 else 6)
    if axis == "y":
        ax.set_yticks(positions)
        ax.set_yticklabels(labels, fontsize=fontsize)
    else:
        ax.set_xticks(positions)
        ax.set_xticklabels(labels, fontsize=fontsize)


def _node_boundaries(spec, ranks):
    """Positions ``i`` (between row i-1 and row i) where the node changes."""
    nodes = [spec.node_of(r) for r in ranks]
    return [i for i in range(1, len(nodes)) if nodes[i] != nodes[i - 1]]


def _merge(intervals, eps):
    """Merge (start, end, name) intervals that touch or are less than ``eps`` apart.

    Returns [(start, end, {name: seconds})]: what a bar one pixel wide can show.
    """
    merged = []
    for start, end, name in sorted(intervals, key=lambda e: (e[0], e[1])):
        if merged and start <= merged[-1][1] + eps:
            last = merged[-1]
            last[1] = max(last[1], end)
            last[2][name] = last[2].get(name, 0.0) + (end - start)
        else:
            merged.append([start, end, {name: end - start}])
    return merged


def _collective_name(label):
    """``"all_reduce #3"`` -> ``"all_reduce"``; point-to-point labels stay as they are."""
    return label.split(" #")[0]


def _bars(rows, lane_y):
    """Rectangles (as polygon vertices) for [(row, start, end)] in a lane."""
    y0, y1 = lane_y
    return [[(s, row + y0), (s, row + y1), (e, row + y1), (e, row + y0)] for row, s, e in rows]


# -------------------------------------------------------------------- timeline
def draw_timeline(recorder, spec, ax=None, ranks=None, max_labels=100, title=None):
    """A Gantt chart of the run: one row per rank (rank 0 on top).

    Each row has two lanes: the compute stream (compute in blue, idle waits in grey,
    reading and writing storage in green, shown only when a rank did) and,
    as a thinner bar just below, the communication stream (orange), labelled with the
    collective's name where the bar is wide enough. Events closer together than about a
    pixel are merged, so thousands of events on many ranks still draw quickly. A rank
    that died (a crash fault, or its watchdog after one) gets a marker at that time.
    """
    from matplotlib.collections import PolyCollection
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    ranks = _check_ranks(ranks, recorder.world_size)
    own_figure = ax is None
    if own_figure:
        ax = _new_axes((10, min(1.6 + 0.42 * len(ranks), 14)))
    clocks = [recorder.clocks[r] for r in ranks]
    span = max((c.end for c in clocks), default=0.0)
    scale, unit = time_unit(span if span > 0 else 1e-6)
    width_px = max(ax.bbox.width, 100.0)
    eps = span / (2 * width_px) if span > 0 else 0.0

    lanes = {"compute": [], "idle": [], "comm": [], "io": []}
    comm_bars = []   # (row, start, end, name)
    for row, clock in enumerate(clocks):
        by_lane = {"compute": [], "idle": [], "comm": [], "io": []}
        for e in clock.events:
            if e.end > e.start:
                by_lane[e.lane].append((e.start, e.end, e.label))
        for lane, intervals in by_lane.items():
            for start, end, names in _merge(intervals, eps):
                lanes[lane].append((row, start * scale, end * scale))
                if lane == "comm":
                    # the collective that takes most of the merged bar names it
                    weights = {}
                    for label, seconds in names.items():
                        name = _collective_name(label)
                        weights[name] = weights.get(name, 0.0) + seconds
                    name = min(weights, key=lambda k: (-weights[k], k))
                    comm_bars.append((row, start * scale, end * scale, name))

    shown = ("compute", "comm", "idle") + (("io",) if lanes["io"] else ())
    for lane, lane_y in (("idle", MAIN_LANE), ("compute", MAIN_LANE), ("io", MAIN_LANE),
                         ("comm", COMM_LANE)):
        if lane not in shown:
            continue
        collection = PolyCollection(_bars(lanes[lane], lane_y), facecolors=LANE_COLORS[lane],
                                    edgecolors="none", linewidths=0, label=LANE_NAMES[lane])
        collection.set_gid(lane)
        ax.add_collection(collection)

    ax.set_xlim(0, span * scale if span > 0 else 1)
    ax.set_ylim(len(ranks) - 0.5, -0.5)          # rank 0 on top
    _rank_ticks(ax, ranks)
    ax.tick_params(axis="y", length=0)
    for i in _node_boundaries(spec, ranks):
        ax.axhline(i - 0.5, color="#888888", linewidth=0.8, linestyle="--", zorder=0)
    ax.set_xlabel(f"simulated time ({unit})")
    ax.set_title(title or f"Timeline: {len(ranks)} rank(s) on {spec.name}", fontsize=10,
                 loc="left")
    ax.grid(axis="x", color="#eeeeee", zorder=-1)
    ax.set_axisbelow(True)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    handles = [Patch(color=LANE_COLORS[k], label=LANE_NAMES[k]) for k in shown]
    deaths = [(ranks.index(r), t, crash) for r, t, crash in recorder.deaths
              if r in ranks]
    for crash in (True, False):
        marker, color, name = DEATH_MARKERS[crash]
        points = [(t * scale, row + sum(MAIN_LANE) / 2) for row, t, c in deaths if c == crash]
        if points:
            xs, ys = zip(*points)
            ax.plot(xs, ys, linestyle="none", marker=marker, color=color, markersize=9,
                    markeredgewidth=2, clip_on=False, zorder=5, gid=name)
            handles.append(Line2D([], [], linestyle="none", marker=marker, color=color,
                                  markeredgewidth=2, label=name))
    if deaths and span > 0:
        # a watchdog stops ranks at the run's very end: leave room for the whole marker
        ax.set_xlim(0, span * scale * 1.03)
    ax.legend(handles=handles, loc="lower right", bbox_to_anchor=(1.0, 1.0),
              ncol=len(handles), fontsize=8, frameon=False, borderaxespad=0.2)
    if own_figure:
        ax.figure.tight_layout()
    _label_comm_bars(ax, comm_bars, len(ranks), span * scale, max_labels)
    return ax


def _label_comm_bars(ax, bars, nrows, xspan, max_labels):
    """Write the collective's name inside the communication bars wide enough for it,
    top rows first, at most ``max_labels`` of them."""
    if not bars or not max_labels or xspan <= 0:
        return
    bbox = ax.bbox
    row_px = bbox.height / nrows
    lane_px = (COMM_LANE[1] - COMM_LANE[0]) * row_px
    dpi = ax.figure.dpi
    fontsize = min(7.0, lane_px * 0.8 * 72 / dpi)
    if fontsize < 4.5:
        return      # rows too thin to write in
    px_per_unit = bbox.width / xspan
    char_px = 0.6 * fontsize * dpi / 72
    fits = [b for b in bars if (b[2] - b[1]) * px_per_unit >= char_px * len(b[3]) + 4]
    fits.sort(key=lambda b: (b[0], b[1]))
    for row, start, end, name in fits[:max_labels]:
        ax.text((start + end) / 2, row + sum(COMM_LANE) / 2, name, ha="center", va="center",
                fontsize=fontsize, color="#222222", clip_on=True, gid="comm-label")


# ---------------------------------------------------------------------- memory
def draw_memory(recorder, spec, ax=None, ranks=None):
    """Memory in use over simulated time per rank, and each rank's peak by category.

    ``ax``: None (a new 1x2 figure), a pair of Axes ``(over_time, peak_bars)``, or one
    Axes (then only the over-time plot is drawn). Returns the pair (the second may be None).
    """
    ranks = _check_ranks(ranks, recorder.world_size)
    own_figure = ax is None
    if own_figure:
        ax_time, ax_bar = _new_axes((12, 4.2), ncols=2, width_ratios=[3, 2])
    elif isinstance(ax, (tuple, list, np.ndarray)):
        ax_time, ax_bar = ax
    else:
        ax_time, ax_bar = ax, None
    memories = [recorder.memories[r] for r in ranks]
    span = max((recorder.clocks[r].end for r in ranks), default=0.0)
    span = max([span] + [m.history[-1][0] for m in memories])
    scale, tunit = time_unit(span if span > 0 else 1e-6)
    peak = max(m.peak for m in memories)
    capacities = sorted({(m.capacity, m.device.name) for m in memories})
    shown_caps = [(c, name) for c, name in capacities if peak > 0 and c <= 2 * peak]
    divisor, bunit = byte_unit(max([peak] + [c for c, _ in shown_caps]), binary=True)

    colors = _rank_colors(len(ranks))
    for i, (r, m) in enumerate(zip(ranks, memories)):
        t = [h[0] * scale for h in m.history] + [span * scale]
        b = [h[1] / divisor for h in m.history] + [m.history[-1][1] / divisor]
        ax_time.step(t, b, where="post", color=colors[i], linewidth=1.2,
                     label=f"rank {r}", gid=f"memory-rank-{r}",
                     zorder=3 - i / len(ranks))      # lower ranks on top
    for c, name in shown_caps:
        ax_time.axhline(c / divisor, color="#C44E52", linestyle="--", linewidth=1.2,
                        label=f"capacity {name} ({c / divisor:.3g} {bunit})", gid="capacity")
    ax_time.set_xlim(0, span * scale if span > 0 else 1)
    ax_time.set_ylim(bottom=0)
    ax_time.set_xlabel(f"simulated time ({tunit})")
    ax_time.set_ylabel(f"memory in use ({bunit})")
    hidden = [(c, name) for c, name in capacities if (c, name) not in shown_caps]
    note = "".join(f"; {name} capacity {c / 2**30:.3g} GiB is off the scale"
                   for c, name in hidden)
    ax_time.set_title(f"Memory over time{note}", fontsize=10, loc="left")
    if len(ranks) <= 8 or shown_caps:
        handles, labels = ax_time.get_legend_handles_labels()
        if len(ranks) > 8:   # keep only the capacity line in the legend
            keep = [(h, lab) for h, lab in zip(handles, labels) if lab.startswith("capacity")]
            handles, labels = [h for h, _ in keep], [lab for _, lab in keep]
        ax_time.legend(handles, labels, fontsize=7, loc="best")
    if len(ranks) > 8:
        _rank_colorbar(ax_time, ranks)
    for side in ("top", "right"):
        ax_time.spines[side].set_visible(False)

    if ax_bar is not None:
        x = np.arange(len(ranks))
        bottom = np.zeros(len(ranks))
        for category in CATEGORIES:
            values = np.array([m.peak_by_category.get(category, 0) for m in memories],
                              dtype=float) / divisor
            if not values.any():
                continue
            ax_bar.bar(x, values, bottom=bottom, color=CATEGORY_COLORS[category],
                       label=category, width=0.8, gid=f"peak-{category}")
            bottom += values
        _rank_ticks(ax_bar, ranks, axis="x", fmt="{}")
        ax_bar.set_xlabel("rank")
        ax_bar.set_ylabel(f"memory at peak ({bunit})")
        ax_bar.set_title("Peak memory by category", fontsize=10, loc="left")
        ax_bar.set_xlim(-0.6, len(ranks) - 0.4)
        if bottom.any():
            ax_bar.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.0, 1.0),
                          frameon=False)
        for side in ("top", "right"):
            ax_bar.spines[side].set_visible(False)
    if own_figure:
        ax_time.figure.tight_layout()
    return ax_time, ax_bar


def _colormap(name):
    import matplotlib

    return matplotlib.colormaps[name]


def _rank_colors(n):
    import matplotlib

    if n <= 8:      # one colour per rank, named in the legend
        cmap = matplotlib.colormaps["tab10"]
        return [cmap(i) for i in range(n)]
    cmap = matplotlib.colormaps["viridis"]   # a colour scale, shown as a colour bar
    return [cmap(i / (n - 1)) for i in range(n)]


def _rank_colorbar(ax, ranks):
    import matplotlib
    from matplotlib.cm import ScalarMappable
    from matplotlib.colors import Normalize

    mappable = ScalarMappable(Normalize(ranks[0], ranks[-1]), matplotlib.colormaps["viridis"])
    ax.figure.colorbar(mappable, ax=ax, label="rank", pad=0.01)


# ------------------------------------------------------------- traffic matrix
def traffic_matrix(recorder, ranks=None):
    """``m[i, j]`` = bytes rank ``ranks[i]`` sent to rank ``ranks[j]`` (a float array)."""
    ranks = _check_ranks(ranks, recorder.world_size)
    index = {r: i for i, r in enumerate(ranks)}
    m = np.zeros((len(ranks), len(ranks)))
    for (src, dst), nbytes in recorder.traffic.items():
        if src in index and dst in index:
            m[index[src], index[dst]] += nbytes
    return m


def draw_comm_matrix(recorder, spec, ax=None, ranks=None):
    """Bytes sent between ranks as a heatmap: sender rows, receiver columns.

    Cells with no traffic stay blank; dashed lines mark node boundaries.
    """
    ranks = _check_ranks(ranks, recorder.world_size)
    n = len(ranks)
    own_figure = ax is None
    if own_figure:
        size = min(4.5 + 0.12 * n, 11)
        ax = _new_axes((size + 1.4, size))
    m = traffic_matrix(recorder, ranks)
    divisor, unit = byte_unit(m.max(), binary=False)
    values = np.ma.masked_equal(m / divisor, 0)
    from matplotlib.colors import ListedColormap

    # start the scale at a visible blue, so that little traffic differs from none (white)
    blues = _colormap("Blues")(np.linspace(0.18, 1.0, 256))
    cmap = ListedColormap(blues, name="traffic").with_extremes(bad="white")
    image = ax.imshow(values, cmap=cmap, vmin=0, vmax=max(m.max() / divisor, 1e-12),
                      interpolation="nearest", aspect="equal")
    image.set_gid("traffic")
    ax.figure.colorbar(image, ax=ax, label=f"bytes sent ({unit})", fraction=0.046, pad=0.04)
    _rank_ticks(ax, ranks, axis="x", fmt="{}")
    _rank_ticks(ax, ranks, axis="y", fmt="{}")
    ax.set_xlabel("receiver (dst rank)")
    ax.set_ylabel("sender (src rank)")
    ax.set_title(f"Traffic between ranks ({_fmt_bytes(m.sum())} in all)", fontsize=10,
                 loc="left")
    for i in _node_boundaries(spec, ranks):
        ax.axhline(i - 0.5, color="#C44E52", linewidth=1.2, linestyle="--", gid="node-boundary")
        ax.axvline(i - 0.5, color="#C44E52", linewidth=1.2, linestyle="--", gid="node-boundary")
    if n <= 8:
        top = m.max()
        for i in range(n):
            for j in range(n):
                if m[i, j]:
                    ax.text(j, i, f"{m[i, j] / divisor:.3g}", ha="center", va="center",
                            fontsize=7, color="white" if m[i, j] > 0.6 * top else "#222222")
    ax.tick_params(length=0)
    if own_figure:
        ax.figure.tight_layout()
    return ax


def _fmt_bytes(nbytes):
    divisor, unit = byte_unit(nbytes)
    return f"{nbytes / divisor:.3g} {unit}"


# ------------------------------------------------------------- module heatmap
def module_matrix(recorder, ranks=None):
    """``(modules, m)``: module labels in order of first use and ``m[module, rank]`` seconds."""
    ranks = _check_ranks(ranks, recorder.world_size)
    modules = []
    seen = set()
    for r in ranks:
        for label in recorder.module_time[r]:
            if label not in seen:
                seen.add(label)
                modules.append(label)
    m = np.zeros((len(modules), len(ranks)))
    for j, r in enumerate(ranks):
        for i, label in enumerate(modules):
            m[i, j] = recorder.module_time[r].get(label, 0.0)
    return modules, m


def draw_module_heatmap(recorder, spec, ax=None, ranks=None):
    """Compute time per module (rows, in order of first use) per rank (columns)."""
    ranks = _check_ranks(ranks, recorder.world_size)
    modules, m = module_matrix(recorder, ranks)
    own_figure = ax is None
    if own_figure:
        longest = max((len(s) for s in modules), default=6)
        ax = _new_axes((min(3.0 + 0.06 * longest * 1.2 + 0.45 * len(ranks), 16),
                        min(1.8 + 0.32 * max(len(modules), 1), 14)))
    scale, unit = time_unit(m.max() if m.size else 1e-6)
    import matplotlib

    cmap = matplotlib.colormaps["YlOrBr"]
    data = m * scale if m.size else np.zeros((1, len(ranks)))
    image = ax.imshow(data, cmap=cmap, vmin=0, interpolation="nearest", aspect="auto")
    image.set_gid("module-time")
    ax.figure.colorbar(image, ax=ax, label=f"compute time ({unit})", pad=0.02)
    _rank_ticks(ax, ranks, axis="x", fmt="{}")
    ax.set_yticks(range(len(modules)))
    ax.set_yticklabels([_module_label(s) for s in modules],
                       fontsize=8 if len(modules) <= 30 else 6)
    ax.set_xlabel("rank")
    ax.set_title("Compute time per module", fontsize=10, loc="left")
    if m.size and len(ranks) <= 16 and len(modules) * len(ranks) <= 160:
        top = data.max()
        for i in range(len(modules)):
            for j in range(len(ranks)):
                ax.text(j, i, _fmt_cell(data[i, j], top), ha="center", va="center",
                        fontsize=7, color="white" if data[i, j] > 0.6 * top else "#222222")
    ax.tick_params(length=0)
    if own_figure:
        ax.figure.tight_layout()
    return ax


def _fmt_cell(value, top):
    """A cell's value in 3 significant digits; ~0 shown as "<0.001 of the largest"."""
    if value == 0:
        return "0"
    if value < top * 1e-3:
        return f"<{top * 1e-3:.2g}"
    return f"{value:.3g}"


def _module_label(label):
    return "(outside any module)" if label == "Global" else label


# -------------------------------------------------------------- the topology
def draw_cluster(spec, ax=None):
    """The cluster's topology: nodes as boxes holding their GPUs (labelled with global
    ranks), the NVLink/NVSwitch fabric inside each node, and each node's NICs up to the
    network switch, with link bandwidths written on the links.

    Up to four nodes sit in one row under the switch; more nodes sit in two rows, above
    and below the switch. Text shrinks with the drawing, so give a large cluster a wide
    ``ax``.
    """
    from matplotlib.patches import FancyBboxPatch, Rectangle

    nodes = spec.nodes
    gpu, gap, pad = 1.0, 0.3, 0.45
    cols = min(4, max(n.devices for n in nodes))
    node_w = cols * gpu + (cols - 1) * gap + 2 * pad
    title_h, fabric_h = 0.75, 0.9

    def node_h(node):
        rows = math.ceil(node.devices / cols)
        fabric = fabric_h if node.devices > 1 else 0
        return title_h + rows * gpu + (rows - 1) * gap + fabric + pad

    count = len(nodes)
    per_row = count if count <= 4 else math.ceil(count / 2)
    rows = [list(range(i, min(i + per_row, count))) for i in range(0, count, per_row)]
    above = [] if len(rows) == 1 else rows[:1]      # rows drawn above the switch
    below = rows if len(rows) == 1 else rows[1:]
    hgap, link_len = 1.0, 2.2
    row_w = [len(r) * node_w + (len(r) - 1) * hgap for r in rows]
    total_w = max(row_w)
    narrow = total_w < 14          # the switch's label goes on two lines
    switch_h = 1.3 if narrow else 0.9

    placements = []   # (node index, x0, y_top, facing) facing: +1 switch above, -1 below
    for row in below:
        x = (total_w - row_w[rows.index(row)]) / 2
        for i in row:
            placements.append((i, x, -link_len, +1))
            x += node_w + hgap
    for row in above:
        x = (total_w - row_w[rows.index(row)]) / 2
        for i in row:
            placements.append((i, x, switch_h + link_len + node_h(nodes[i]), -1))
            x += node_w + hgap

    ymin = min(top - node_h(nodes[i]) for i, _, top, _ in placements) - 0.4
    ymax = max([switch_h] + [top for _, _, top, _ in placements]) + 0.4
    xmin, xmax = -0.5, total_w + 0.5
    if ax is None:
        unit = min(0.42, 17 / (xmax - xmin), 12 / (ymax - ymin))
        ax = _new_axes(((xmax - xmin) * unit, (ymax - ymin) * unit + 0.45))
        ax.figure.subplots_adjust(left=0, right=1, bottom=0,
                                  top=1 - 0.45 / ax.figure.get_figheight())
    ax.set_xlim(xmin, xmax)
    ax.set_ylim(ymin, ymax)
    ax.set_aspect("equal")
    ax.axis("off")
    # text sizes are for a GPU square of ~0.42 inch; shrink them with the drawing
    px_per_unit = min(ax.bbox.width / (xmax - xmin), ax.bbox.height / (ymax - ymin))
    fs = min(1.3, max(0.3, px_per_unit / (0.42 * ax.figure.dpi)))

    # the switch at y in [0, switch_h]; rows above grow up, rows below grow down
    switch_x0, switch_w = -0.2, total_w + 0.4
    ax.add_patch(FancyBboxPatch((switch_x0, 0), switch_w, switch_h,
                                boxstyle="round,pad=0.02,rounding_size=0.15",
                                facecolor="#3B3B3B", edgecolor="none", gid="network-switch"))
    net = spec.network
    over = f", {net.oversubscription:g}:1 oversubscribed" if net.oversubscription != 1 else ""
    sep = "\n" if narrow else ": "
    ax.text(total_w / 2, switch_h / 2, f"network switch{sep}{net.nic.name}{over}",
            ha="center", va="center", color="white", fontsize=8 * fs, fontweight="bold")

    first_rank = [0]
    for node in nodes[:-1]:
        first_rank.append(first_rank[-1] + node.devices)

    for i, x0, top, facing in placements:
        node = nodes[i]
        h = node_h(node)
        ax.add_patch(FancyBboxPatch((x0, top - h), node_w, h,
                                    boxstyle="round,pad=0.02,rounding_size=0.2",
                                    facecolor="#F3F6FA", edgecolor="#5A6B7D", linewidth=1.2,
                                    gid=f"node-{i}"))
        ax.text(x0 + node_w / 2, top - title_h / 2 - 0.05,
                f"{node.name}: {node.devices} × {node.device.name}",
                ha="center", va="center", fontsize=7.5 * fs, fontweight="bold", color="#1F2D3D")
        gpu_top = top - title_h
        centers = []
        for d in range(node.devices):
            r, c = divmod(d, cols)
            gx = x0 + pad + c * (gpu + gap)
            gy = gpu_top - r * (gpu + gap) - gpu
            ax.add_patch(Rectangle((gx, gy), gpu, gpu, facecolor="#76B900", edgecolor="#3F6300",
                                   linewidth=1, zorder=2, gid=f"gpu-{first_rank[i] + d}"))
            ax.text(gx + gpu / 2, gy + gpu / 2, str(first_rank[i] + d), ha="center",
                    va="center", fontsize=8 * fs, fontweight="bold", color="white", zorder=3)
            centers.append((gx + gpu / 2, gy))
        if node.devices > 1:
            nrows = math.ceil(node.devices / cols)
            bar_y = gpu_top - nrows * gpu - (nrows - 1) * gap - 0.55
            bar_h = 0.3
            ax.add_patch(Rectangle((x0 + pad, bar_y), node_w - 2 * pad, bar_h,
                                   facecolor="#B07AA1", edgecolor="none", zorder=1.6,
                                   gid=f"fabric-{i}"))
            for d, (cx, cy) in enumerate(centers):
                if d >= node.devices - cols:       # last row of GPUs: straight down
                    ax.plot([cx, cx], [cy, bar_y + bar_h], color="#B07AA1", linewidth=1.2,
                            zorder=1.5)
                else:                               # upper rows: pass beside the GPUs below
                    side = cx + gpu / 2 + gap / 2
                    ax.plot([cx, side, side], [cy, cy - gap / 2, bar_y + bar_h],
                            color="#B07AA1", linewidth=1.0, zorder=1.5)
            fabric = node.fabric
            ax.text(x0 + node_w / 2, bar_y - 0.28,
                    f"{fabric.name} {fabric.bandwidth / 1e9:.0f} GB/s/dir",
                    ha="center", va="center", fontsize=6 * fs, color="#6B3F62")
        # NICs on the edge that faces the switch, and the link up (or down) to it
        nic_y = top if facing > 0 else top - h
        shown = min(node.nics, 8)
        nic_w = 0.32
        span = shown * nic_w + (shown - 1) * 0.12
        nx = x0 + (node_w - span) / 2
        for k in range(shown):
            ax.add_patch(Rectangle((nx + k * (nic_w + 0.12), nic_y - 0.12), nic_w, 0.24,
                                   facecolor="#4C72B0", edgecolor="white", linewidth=0.5,
                                   zorder=3, gid=f"nic-{i}-{k}"))
        if node.nics:
            mid = x0 + node_w / 2
            end = 0 if facing > 0 else switch_h
            ax.plot([mid, mid], [nic_y, end], color="#4C72B0", linewidth=2.2, zorder=0.4,
                    gid=f"link-{i}")
            bw = spec.inter_node_link.bandwidth / 1e9
            ax.text(mid + 0.12, (nic_y + end) / 2, f"{node.nics} × {bw:.0f} GB/s",
                    ha="left", va="center", fontsize=6.5 * fs, color="#2E4A7A",
                    bbox=dict(boxstyle="round,pad=0.15", facecolor="white",
                              edgecolor="none", alpha=0.85))

    ax.set_title(f"{spec.name}: {count} node(s), {spec.world_size} GPUs", fontsize=10)
    return ax
