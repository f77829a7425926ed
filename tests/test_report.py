"""Pictures and traces of a run: timeline, memory, traffic matrix, module heatmap, Chrome
trace, and the cluster's topology. Each test checks what the picture *says* (rows, colours,
values, labels), not only that it draws."""

import gc
import io
import json
import time

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.nn as nn  # noqa: E402
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.colors import to_rgba  # noqa: E402
from torch.nn.parallel import DistributedDataParallel as DDP  # noqa: E402

import simcluster as sc  # noqa: E402
from simcluster import plots  # noqa: E402
from simcluster.accounting import Recorder  # noqa: E402
from simcluster.memory import CATEGORIES  # noqa: E402
from simcluster.spec import preset  # noqa: E402
from simcluster.trace import trace_events  # noqa: E402

# 2 nodes x 2 GPUs: 4 ranks with a node boundary between ranks 1 and 2.
SMALL = {"name": "two-by-two", "nodes": [{"devices": 2, "count": 2}]}


def _ddp(steps):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 8))
    ddp = DDP(model, bucket_cap_mb=1)
    opt = torch.optim.Adam(ddp.parameters(), lr=0.1)
    for _ in range(steps):
        x = torch.randn(16, 64)
        opt.zero_grad()
        ddp(x).square().mean().backward()
        opt.step()


def _ring():
    """Each rank sends a different amount to the next rank: known, asymmetric traffic."""
    r, n = dist.get_rank(), dist.get_world_size()
    out = torch.ones(1000 * (r + 1))
    inp = torch.empty(1000 * ((r - 1) % n + 1))
    reqs = [dist.isend(out, (r + 1) % n), dist.irecv(inp, (r - 1) % n)]
    for q in reqs:
        q.wait()


@pytest.fixture(scope="module")
def run():
    return sc.Cluster.from_dict(SMALL).run(_ddp, world_size=4, args=(2,))


@pytest.fixture(scope="module")
def ring_run():
    return sc.Cluster.from_dict(SMALL).run(_ring, world_size=4)


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _lane_collections(ax):
    return {c.get_gid(): c for c in ax.collections
            if isinstance(c, PolyCollection) and c.get_gid() in plots.LANE_COLORS}


def _bars(collection):
    """[(x0, x1, y0, y1)] of a PolyCollection of rectangles."""
    out = []
    for path in collection.get_paths():
        v = path.vertices
        out.append((v[:, 0].min(), v[:, 0].max(), v[:, 1].min(), v[:, 1].max()))
    return out


def _png(fig):
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=60)
    return buf.getvalue()


# ---------------------------------------------------------------------- timeline
def test_timeline_has_one_row_per_rank_rank0_on_top(run):
    ax = run.timeline()
    assert [t.get_text() for t in ax.get_yticklabels()] == [f"rank {r}" for r in range(4)]
    assert list(ax.get_yticks()) == [0, 1, 2, 3]
    bottom, top = ax.get_ylim()
    assert bottom > top, "y axis is inverted so that rank 0 is the top row"
    lanes = _lane_collections(ax)
    assert set(lanes) == {"compute", "comm", "idle"}
    for lane in ("compute", "comm"):
        rows = {round((y0 + y1) / 2) for _, _, y0, y1 in _bars(lanes[lane])}
        assert rows == {0, 1, 2, 3}, f"every rank has {lane} bars in its own row"


def test_timeline_lanes_have_distinct_colours_and_a_legend(run):
    ax = run.timeline()
    lanes = _lane_collections(ax)
    colours = {lane: tuple(c.get_facecolor()[0]) for lane, c in lanes.items()}
    for lane, colour in colours.items():
        assert colour == pytest.approx(to_rgba(plots.LANE_COLORS[lane]))
    assert len(set(colours.values())) == 3
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    assert legend == ["compute", "communication", "idle (waiting)"]


def test_timeline_comm_lane_is_a_thinner_bar_below_compute(run):
    ax = run.timeline()
    lanes = _lane_collections(ax)
    (_, _, c0, c1), (_, _, m0, m1) = _bars(lanes["comm"])[0], _bars(lanes["compute"])[0]
    row_c, row_m = round((c0 + c1) / 2), round((m0 + m1) / 2)
    assert c1 - c0 < m1 - m0, "communication is the thinner lane"
    # y grows downwards: the comm lane of a row starts below (after) its compute lane
    assert c0 - row_c > m1 - row_m - 1e-9
    assert c1 - row_c < 0.5 and m0 - row_m > -0.5, "both lanes stay inside the rank's row"


def test_timeline_bars_match_the_clocks(run):
    ax = run.timeline()
    rec = run.recorder
    scale = 1e6   # this run is microseconds long
    assert "(µs)" in ax.get_xlabel()
    assert ax.get_xlim()[1] == pytest.approx(run.elapsed * scale)
    lanes = _lane_collections(ax)
    for lane, total in (("comm", "comm"), ("idle", "idle"), ("compute", "compute")):
        for r in range(4):
            drawn = sum(x1 - x0 for x0, x1, y0, y1 in _bars(lanes[lane])
                        if round((y0 + y1) / 2) == r)
            expected = getattr(rec.clocks[r], total) * scale
            # merging closes gaps under a pixel: drawn time may only grow, and not much
            assert drawn >= expected * (1 - 1e-9) - 1e-9
            assert drawn <= expected + 0.05 * run.elapsed * scale


def test_timeline_labels_communication_with_the_collective(run):
    ax = run.timeline()
    labels = [t for t in ax.texts if t.get_gid() == "comm-label"]
    names = {t.get_text() for t in labels}
    assert "all_reduce" in names and names <= {"all_reduce", "broadcast", "all_gather"}
    comm = _bars(_lane_collections(ax)["comm"])
    for t in labels:   # each label sits inside a communication bar
        x, y = t.get_position()
        assert any(x0 <= x <= x1 and y0 <= y <= y1 for x0, x1, y0, y1 in comm)
    assert not [t for t in run.timeline(max_labels=0).texts if t.get_gid() == "comm-label"]
    assert len([t for t in run.timeline(max_labels=2).texts
                if t.get_gid() == "comm-label"]) == 2


def test_timeline_of_chosen_ranks_into_a_given_axes(run):
    fig, ax = plt.subplots()
    assert run.timeline(ax=ax, ranks=[3, 1]) is ax
    assert [t.get_text() for t in ax.get_yticklabels()] == ["rank 1", "rank 3"]
    # a dashed line separates the two nodes (rank 1 on node 0, rank 3 on node 1)
    assert [line.get_ydata()[0] for line in ax.lines] == [0.5]
    with pytest.raises(ValueError, match="ranks"):
        run.timeline(ranks=[7])


def _synthetic_recorder(world_size, events_per_rank):
    spec = preset("dgx-a100", nodes=world_size // 8)
    rec = Recorder(spec, world_size, cost=None)
    for r, clock in enumerate(rec.clocks):
        for i in range(events_per_rank):
            clock.run_compute(1e-7 * (1 + (i + r) % 3), f"layer{i % 7}")
            if i % 50 == 49:
                clock.run_comm(clock.now, clock.now + 2e-5, f"all_reduce #{i}")
                clock.wait_until(clock.now + 2e-5, "wait for communication")
    return rec, spec


def test_timeline_of_64_ranks_is_quick():
    rec, spec = _synthetic_recorder(64, 3000)
    assert sum(len(c.events) for c in rec.clocks) > 64 * 3000
    start = time.process_time()   # CPU time: other load on the machine does not count
    ax = plots.draw_timeline(rec, spec)
    ax.figure.canvas.draw()
    seconds = time.process_time() - start
    lanes = _lane_collections(ax)
    rows = {round((y0 + y1) / 2) for _, _, y0, y1 in _bars(lanes["compute"])}
    assert rows == set(range(64))
    drawn = sum(len(c.get_paths()) for c in lanes.values())
    assert drawn < 64 * 200, "tiny events are merged before drawing"
    # about 1 s of CPU; drawing every one of the 200,000 events unmerged took minutes
    assert seconds < 30, f"64-rank timeline took {seconds:.1f} s of CPU time"


# ------------------------------------------------------------------------ memory
def test_memory_plot_lines_follow_history(run):
    ax_time, ax_bar = run.memory_plot()
    assert ax_time.figure is ax_bar.figure
    lines = {line.get_gid(): line for line in ax_time.lines}
    assert "capacity" not in lines, "80 GiB is far above a few MiB: no capacity line"
    assert "off the scale" in ax_time.get_title(loc="left")
    divisor = _binary_unit(ax_time.get_ylabel())
    assert divisor == 2**10 if run.recorder.memories[0].peak < 2**20 else divisor == 2**20
    for r in range(4):
        history = run.recorder.memories[r].history
        y = lines[f"memory-rank-{r}"].get_ydata()
        assert np.allclose(y[:len(history)], [b / divisor for _, b in history])
        assert lines[f"memory-rank-{r}"].get_drawstyle() == "steps-post"


def _binary_unit(label):
    return {"(B)": 1, "(KiB)": 2**10, "(MiB)": 2**20, "(GiB)": 2**30}[label.split()[-1]]


def test_memory_plot_stacks_peak_by_category(run):
    ax_time, ax_bar = run.memory_plot()
    divisor = _binary_unit(ax_bar.get_ylabel())
    heights = np.zeros(4)
    seen = []
    for container in ax_bar.containers:
        category = container.get_label()
        seen.append(category)
        got = np.array([p.get_height() for p in container.patches])
        want = [run.recorder.memories[r].peak_by_category[category] / divisor for r in range(4)]
        assert np.allclose(got, want)
        colour = to_rgba(plots.CATEGORY_COLORS[category])
        assert container.patches[0].get_facecolor() == pytest.approx(colour)
        heights += got
    assert seen == [c for c in CATEGORIES if c in seen]
    assert {"parameters", "gradients", "optimizer state"} <= set(seen)
    assert np.allclose(heights, [run.recorder.memories[r].peak / divisor for r in range(4)])


def test_memory_plot_into_given_axes(run):
    fig, (a, b) = plt.subplots(1, 2)
    assert run.memory_plot(ax=(a, b), ranks=[0, 2]) == (a, b)
    assert [line.get_gid() for line in a.lines] == ["memory-rank-0", "memory-rank-2"]
    assert [t.get_text() for t in b.get_xticklabels()] == ["0", "2"]
    fig, c = plt.subplots()
    assert run.memory_plot(ax=c) == (c, None)
    assert len(c.lines) == 4 and not c.containers


def test_memory_plot_shows_capacity_when_near_the_peak(run):
    # a device 1.5 x as large as this program's peak: the capacity line belongs in the plot
    peak = max(m.peak for m in run.recorder.memories)
    small_gpu = {"name": "tiny", "memory_gb": 1.5 * peak / 2**30,
                 "peak_tflops": {"float32": 1}, "hbm_gbps": 100}
    cluster = sc.Cluster.from_dict({"nodes": [{"devices": 2, "device": small_gpu}]})
    run = cluster.run(_ddp, world_size=2, args=(2,))
    capacity = run.recorder.memories[0].capacity
    assert run.recorder.memories[0].peak * 2 >= capacity
    ax_time, ax_bar = run.memory_plot(ranks=[1])
    lines = [line for line in ax_time.lines if line.get_gid() == "capacity"]
    assert len(lines) == 1 and lines[0].get_linestyle() == "--"
    assert lines[0].get_ydata()[0] == pytest.approx(capacity / _binary_unit(ax_time.get_ylabel()))
    assert [line.get_gid() for line in ax_time.lines if line.get_gid() != "capacity"] == [
        "memory-rank-1"]
    assert any("capacity" in t.get_text() for t in ax_time.get_legend().get_texts())


# --------------------------------------------------------------- traffic matrix
def test_comm_matrix_values_are_the_recorded_traffic(ring_run):
    ax = ring_run.comm_matrix()
    image = ax.get_images()[0]
    label = ax.figure.axes[-1].get_ylabel()
    assert label in ("bytes sent (kB)", "bytes sent (MB)", "bytes sent (GB)")
    divisor = {"kB": 1e3, "MB": 1e6, "GB": 1e9}[label.split("(")[1].rstrip(")")]
    values = np.ma.filled(image.get_array(), 0) * divisor
    expected = np.zeros((4, 4))
    for (src, dst), nbytes in ring_run.recorder.traffic.items():
        expected[src, dst] = nbytes
    assert np.allclose(values, expected)
    # sender rows, receiver columns: rank 3 sends 16 kB to rank 0
    assert values[3, 0] == pytest.approx(4 * 1000 * 4)
    assert values[0, 3] == 0
    assert "receiver" in ax.get_xlabel() and "sender" in ax.get_ylabel()


def test_comm_matrix_marks_node_boundaries(run):
    ax = run.comm_matrix()
    bounds = [line for line in ax.lines if line.get_gid() == "node-boundary"]
    assert sorted(line.get_ydata()[0] for line in bounds if line.get_ydata()[0]
                  == line.get_ydata()[1]) == [1.5]
    assert sorted(line.get_xdata()[0] for line in bounds if line.get_xdata()[0]
                  == line.get_xdata()[1]) == [1.5]
    assert np.allclose(plots.traffic_matrix(run.recorder).sum(),
                       sum(run.recorder.traffic.values()))


# --------------------------------------------------------------- module heatmap
def test_module_heatmap_is_module_time(run):
    ax = run.module_heatmap()
    rec = run.recorder
    modules = list(dict.fromkeys(m for r in range(4) for m in rec.module_time[r]))
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == [plots._module_label(m) for m in modules]
    assert "DistributedDataParallel.module.0" in labels
    assert [t.get_text() for t in ax.get_xticklabels()] == ["0", "1", "2", "3"]
    data = np.asarray(ax.get_images()[0].get_array())
    assert data.shape == (len(modules), 4)
    unit = ax.figure.axes[-1].get_ylabel()
    scale = {"(µs)": 1e6, "(ms)": 1e3, "(s)": 1}[unit.split()[-1]]
    for i, m in enumerate(modules):
        for r in range(4):
            assert data[i, r] == pytest.approx(rec.module_time[r].get(m, 0.0) * scale)


# ------------------------------------------------------------------------ trace
def test_save_trace_structure(run, tmp_path):
    path = tmp_path / "run.json"
    assert run.save_trace(str(path)) == str(path)
    trace = json.loads(path.read_text())
    events = trace["traceEvents"]
    meta = [e for e in events if e["ph"] == "M"]
    processes = {e["pid"]: e["args"]["name"] for e in meta if e["name"] == "process_name"}
    assert processes == {0: "node0 (A100-80GB)", 1: "node1 (A100-80GB)"}
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in meta
               if e["name"] == "thread_name"}
    assert threads == {(0, 0): "rank 0 compute", (0, 1): "rank 0 comm",
                       (0, 2): "rank 1 compute", (0, 3): "rank 1 comm",
                       (1, 0): "rank 2 compute", (1, 1): "rank 2 comm",
                       (1, 2): "rank 3 compute", (1, 3): "rank 3 comm"}
    rec = run.recorder
    complete = [e for e in events if e["ph"] == "X"]
    assert len(complete) == sum(len(c.events) for c in rec.clocks)
    for r, (pid, local) in enumerate([(0, 0), (0, 1), (1, 0), (1, 1)]):
        mine = [e for e in complete if e["args"]["rank"] == r]
        assert {e["pid"] for e in mine} == {pid}
        for lane, tid in (("compute", 2 * local), ("idle", 2 * local), ("comm", 2 * local + 1)):
            lane_events = [e for e in mine if e["cat"] == lane]
            assert {e["tid"] for e in lane_events} == {tid}
            spent = getattr(rec.clocks[r], lane)
            assert sum(e["dur"] for e in lane_events) == pytest.approx(spent * 1e6, abs=1e-2)
        counters = [e for e in events if e["ph"] == "C" and e["name"] == f"rank {r} memory"]
        assert [(c["ts"], c["args"]["bytes"]) for c in counters] == [
            (round(t * 1e6, 3), b) for t, b in rec.memories[r].history]
    reduce = next(e for e in complete if e["name"].startswith("all_reduce"))
    assert reduce["cat"] == "comm" and reduce["args"]["ranks"] == [0, 1, 2, 3]
    assert reduce["args"]["bytes"] > 0 and reduce["args"]["algorithm"]
    assert any(e["cat"] == "idle" for e in complete)
    assert trace["otherData"]["world_size"] == 4


def test_trace_names_the_protocol_of_a_collective_when_the_cost_model_gives_one():
    spec = preset("dgx-a100", nodes=1)
    rec = Recorder(spec, 2, cost=None)
    for r in range(2):
        rec.clocks[r].run_comm(0.0, 1e-5, "all_reduce #0")
        rec.clocks[r].run_comm(1e-5, 3e-5, "broadcast #1")
    rec.record_collective("all_reduce", "ring", (0, 1), 64, 0.0, 1e-5, protocol="LL128")
    rec.record_collective("broadcast", "tree", (0, 1), 64, 1e-5, 3e-5)
    args = [e["args"] for e in trace_events(rec, spec) if e["ph"] == "X" and e["args"]["rank"] == 0]
    assert args == [{"rank": 0, "algorithm": "ring", "bytes": 64, "ranks": [0, 1],
                     "protocol": "LL128"},
                    {"rank": 0, "algorithm": "tree", "bytes": 64, "ranks": [0, 1]}]


def _without_end_of_run_memory(text, elapsed):
    """The trace minus memory counters at the very end of the run.

    Storages a finished rank function leaves behind are freed (and counted) whenever
    Python gets round to it, e.g. by the garbage collector, which may be after the run;
    the memory counter at the run's end time can then differ between two identical runs.
    """
    end = round(elapsed * 1e6, 3)
    return [line for line in text.splitlines()
            if not ('"ph": "C"' in line and json.loads(line.rstrip(","))["ts"] >= end)]


def test_save_trace_is_deterministic_and_diffable(tmp_path):
    cluster = sc.Cluster.from_dict(SMALL)
    first = cluster.run(_ddp, world_size=4, args=(1,))
    a = first.save_trace(str(tmp_path / "a.json"))
    assert open(first.save_trace(str(tmp_path / "a2.json"))).read() == open(a).read()
    second = cluster.run(_ddp, world_size=4, args=(1,))
    b = second.save_trace(str(tmp_path / "b.json"))
    assert first.elapsed == second.elapsed
    assert (_without_end_of_run_memory(open(a).read(), first.elapsed)
            == _without_end_of_run_memory(open(b).read(), second.elapsed))
    text = open(a).read()
    lines = text.splitlines()
    events = [json.loads(line.rstrip(",")) for line in lines if line.startswith('{"')]
    assert len(events) == len(json.loads(text)["traceEvents"]), "one event per line"
    assert all(line == json.dumps(json.loads(line.rstrip(",")), sort_keys=True)
               + ("," if line.endswith(",") else "")
               for line in lines if line.startswith('{"')), "keys are sorted"


# ------------------------------------------------------------------------ topology
@pytest.mark.parametrize("name,nodes", [("dgx-a100", 1), ("dgx-a100", 2), ("dgx-a100", 3),
                                        ("dgx-a100", 4), ("hetero-11", None)])
def test_draw_cluster_shows_every_gpu_in_its_node(name, nodes):
    cluster = sc.Cluster.preset(name, nodes=nodes)
    spec = cluster.spec
    ax = cluster.draw()
    patches = {p.get_gid(): p for p in ax.patches if p.get_gid()}
    gpus = [g for g in patches if g.startswith("gpu-")]
    assert sorted(gpus, key=lambda g: int(g[4:])) == [f"gpu-{r}" for r in range(spec.world_size)]
    assert sum(g.startswith("node-") for g in patches) == len(spec.nodes)
    assert "network-switch" in patches
    texts = [t.get_text() for t in ax.texts]
    for r in range(spec.world_size):
        assert str(r) in texts, f"GPU {r} is labelled with its global rank"
    for rank in range(spec.world_size):   # each GPU square lies inside its node's box
        node = spec.node_of(rank)
        box = patches[f"node-{node}"].get_bbox()
        g = patches[f"gpu-{rank}"].get_bbox()
        assert box.x0 < g.x0 and g.x1 < box.x1 and box.y0 < g.y0 and g.y1 < box.y1
    for i, node in enumerate(spec.nodes):
        assert f"fabric-{i}" in patches
        assert sum(g.startswith(f"nic-{i}-") for g in patches) == min(node.nics, 8)
        assert f"{node.name}: {node.devices} × A100-80GB" in texts
    assert any("NVLink3/NVSwitch 300 GB/s" in t for t in texts)
    assert any("HDR InfiniBand" in t for t in texts)
    links = [t for t in texts if t.endswith("× 25 GB/s")]
    assert len(links) == len(spec.nodes)
    if name == "hetero-11":
        assert "8 × 25 GB/s" in links and links.count("4 × 25 GB/s") == 10
        assert "node7: 8 × A100-80GB" in texts


def test_draw_cluster_into_a_given_axes():
    fig, ax = plt.subplots()
    assert sc.Cluster.preset("dgx-h100", nodes=2).draw(ax=ax) is ax
    assert any("NDR InfiniBand" in t.get_text() for t in ax.texts)


# -------------------------------------------------------------- conventions
def _all_plots(run):
    return [run.timeline().figure, run.memory_plot()[0].figure, run.comm_matrix().figure,
            run.module_heatmap().figure, sc.Cluster.from_dict(SMALL).draw().figure,
            sc.Cluster.preset("hetero-11").draw().figure]


def test_plots_do_not_show_or_print_and_are_deterministic(run, monkeypatch, capsys):
    def no_show(*args, **kwargs):
        raise AssertionError("plotting functions must leave plt.show() to the notebook")

    monkeypatch.setattr(plt, "show", no_show)
    gc.collect()   # let leftovers of earlier runs be freed (and counted) before drawing
    first = [_png(fig) for fig in _all_plots(run)]
    plt.close("all")
    second = [_png(fig) for fig in _all_plots(run)]
    assert first == second, "the same run draws the same picture"
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == ""


def test_plots_need_accounting():
    run = sc.Cluster.from_dict(SMALL).run(_ring, world_size=4, accounting=False)
    for method in (run.timeline, run.memory_plot, run.comm_matrix, run.module_heatmap):
        with pytest.raises(RuntimeError, match="accounting"):
            method()
    with pytest.raises(RuntimeError, match="accounting"):
        run.save_trace("unused.json")


def _rooted_collectives(op, root):
    t = torch.ones(8)
    if op == "gather":
        dist.gather(t, [torch.empty(8) for _ in range(4)] if dist.get_rank() == root else None,
                    dst=root)
    elif op == "scatter":
        dist.scatter(t, [torch.ones(8) for _ in range(4)] if dist.get_rank() == root else None,
                     src=root)
    else:
        dist.broadcast(t, src=root)


@pytest.mark.parametrize("op", ["gather", "scatter", "broadcast"])
def test_rooted_collectives_flow_to_or_from_their_root(op):
    run = sc.Cluster.preset("dgx-a100").run(_rooted_collectives, args=(op, 2), world_size=4)
    flows = [(src, dst) for (src, dst), nbytes in run.recorder.traffic.items() if nbytes]
    assert flows
    if op == "gather":
        assert all(dst == 2 for _, dst in flows)
    else:   # scatter, and a broadcast tree rooted at rank 2: nothing flows back to it
        assert all(dst != 2 for _, dst in flows)
        assert any(src == 2 for src, _ in flows)


def test_summary_writes_microseconds_as_the_other_outputs_do():
    from simcluster.report import Summary
    row = {"rank": 0, "compute_s": 2.5e-6, "comm_s": 0.0, "idle_s": 0.004, "overlap_s": 1.5,
           "peak_memory_GiB": 1.0, "peak_activations_GiB": 0.5}
    summary = Summary([row])
    for text in (str(summary), summary._repr_html_()):
        assert "2.5 µs" in text and "0.0 µs" in text and "4.000 ms" in text and "1.500 s" in text
        assert " us" not in text
