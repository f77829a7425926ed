"""The lesson 09 demo: a GPT trained on a (pp, dp, tp) mesh equals the one-process model."""

import pytest

import simcluster as sc
from workbook.lesson09_3d_parallelism import demos as p3

TWO_NODES = {"nodes": [{"devices": 4, "count": 2}]}     # 2 nodes x 4 GPUs: 8 ranks


@pytest.fixture(scope="module")
def cluster():
    return sc.Cluster.from_dict(TWO_NODES)


def _check(report, micro_batches, steps=1):
    diff = p3.compare_with_reference(report, steps=steps)
    assert not diff["missing"]                       # every parameter was on some stage
    assert len(diff["losses"]) == len(diff["reference_losses"]) == report.dp * micro_batches
    assert diff["moved"] > 1e-4                      # the step did change the parameters
    assert diff["loss"] < 1e-5 and diff["grad"] < 1e-6 and diff["param"] < 1e-6, diff


@pytest.fixture(scope="module")
def two_steps(cluster):
    """Two 1F1B steps of the (2, 2, 2) layout, 2 micro-batches: checked against the
    one-process model and read for its second step's traffic (one run for both tests)."""
    return p3.measure(cluster, 2, 2, 2, micro_batches=2, steps=2)


def test_3d_two_steps_equal_one_process(two_steps):
    # two steps, so the first step's update is checked too (the slow layouts check one)
    _check(two_steps, 2, steps=2)


@pytest.mark.slow
@pytest.mark.parametrize("layout", [(1, 2, 4), (4, 2, 1)])
def test_3d_step_equals_one_process(cluster, layout):
    pp, dp, tp = layout
    _check(p3.measure(cluster, pp, dp, tp, micro_batches=max(2, pp)), max(2, pp))


def test_3d_recompute_two_steps_equal_one_process(cluster):
    kwargs = {"micro_batches": 2, "steps": 2, "schedule": "GPipe"}
    recomputed = p3.measure(cluster, 2, 2, 2, recompute=True, **kwargs)
    _check(recomputed, 2, steps=2)
    # the blocks kept only their inputs, and ran their forward again in the backward
    plain = p3.measure(cluster, 2, 2, 2, **kwargs)
    assert recomputed.peak["activations"] < 0.7 * plain.peak["activations"]
    assert recomputed.run.recorder.clocks[0].flops > 1.2 * plain.run.recorder.clocks[0].flops


def _mesh_only(pp, dp, tp, across):
    mesh = p3.make_mesh(pp, dp, tp, across)
    return p3.coordinates(mesh), p3.group_ranks(mesh)


@pytest.mark.parametrize("across", [False, True])
def test_mesh_places_tp_inside_or_across_nodes(cluster, across):
    run = cluster.run(_mesh_only, world_size=8, args=(2, 2, 2, across), accounting=False)
    coords = [c for c, _ in run.results]
    # every coordinate once
    assert sorted((c["pp"], c["dp"], c["tp"]) for c in coords) == [
        (i, j, k) for i in range(2) for j in range(2) for k in range(2)]
    node = cluster.spec.node_of
    for rank, (_, groups) in enumerate(run.results):
        assert rank in groups["tp"] and len(groups["tp"]) == 2
        same_node = len({node(r) for r in groups["tp"]}) == 1
        assert same_node != across
        # the pipeline's stages: on different nodes by default, inside one when TP crosses
        assert (len({node(r) for r in groups["pp"]}) == 1) == across
    if not across:
        assert coords[5] == {"pp": 1, "dp": 0, "tp": 1}


def test_tp_across_nodes_is_slower_and_traffic_by_dimension(cluster, two_steps):
    # the second step: the first one also runs the pipeline's shape-inference forward
    inside = two_steps
    across = p3.measure(cluster, 2, 2, 2, tp_across_nodes=True, steps=2)
    assert across.step_time > 1.2 * inside.step_time
    traffic = p3.step_traffic(inside)
    # rank 0: 2 layers x 2 micro-batches x 4 all-reduces (2 forward, 2 backward)
    assert traffic["tp", "all_reduce"][0] == 16
    assert traffic["pp", "send"][0] == 2              # stage 0 sends one activation per micro-batch
    assert traffic["dp", "reduce_scatter"][0] >= 1
    assert traffic["dp", "all_gather"][0] >= 1
    # InfiniBand latency instead of NVLink's (this model's messages are tiny)
    assert p3.step_traffic(across)["tp", "all_reduce"][1] > 1.5 * traffic["tp", "all_reduce"][1]
    phases = p3.stage_phases(inside, 0)
    assert phases["forward"] > 0 and phases["backward"] > 0 and phases["idle"] > 0
    assert sum(phases.values()) == pytest.approx(inside.step_time, rel=1e-6)


def test_explorer_text_picture_and_bad_layout():
    from simcluster import planner

    cfg = planner.TransformerConfig(layers=24, hidden=2304, heads=24, seq_len=2048, vocab=51200)
    dgx = sc.Cluster.preset("dgx-a100", nodes=4)
    explorer = p3.Explorer(cfg, dgx, global_batch=512, dp=32, micro_batch=4)
    est = planner.estimate(cfg, dgx, dp=32, global_batch=512, micro_batch=4)
    text = explorer.text()
    assert text.startswith("tp=1 pp=1 dp=32 micro-batch=4 recompute=full ZeRO-0")
    assert f"step {est.step_time:.2f} s" in text and "fits" in text
    bundle = explorer._repr_mimebundle_()
    assert bundle["text/plain"] == text and bundle["image/png"]
    assert p3.Explorer(cfg, dgx, global_batch=512, tp=5).text() == (
        "not a layout: heads=24 is not divisible by tp=5")


def test_bad_batch_names_the_values(cluster):
    with pytest.raises(sc.RankError, match="batch=6 does not split into dp=2"):
        cluster.run(p3.train_step, world_size=8, args=(2, 2, 2), kwargs={"batch": 6},
                    accounting=False)


def _squares(ax):
    """``{rank: (x, y) of its square's corner}`` and the node boxes' ``(x0, x1)``."""
    from matplotlib.patches import Rectangle

    squares = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_fill()]
    boxes = [p for p in ax.patches if isinstance(p, Rectangle) and not p.get_fill()]
    ranks = [int(t.get_text().split()[1]) for t in ax.texts if t.get_text().startswith("rank ")]
    return dict(zip(ranks, (s.get_x() for s in squares))), \
        [(b.get_x(), b.get_x() + b.get_width()) for b in boxes]


@pytest.mark.parametrize("across", [False, True])
def test_draw_mesh_puts_every_gpu_in_its_node_and_keeps_tp_lines_apart(cluster, across):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = p3.mesh_table(cluster, 2, 2, 2, tp_across_nodes=across)
    ax = p3.draw_mesh(rows)
    x_of, boxes = _squares(ax)
    assert sorted(x_of) == list(range(8))
    for row in rows:
        x0, x1 = boxes[row["node"]]
        assert x0 < x_of[row["rank"]] and x_of[row["rank"]] + 0.8 < x1, row
    xs = sorted(x_of.values())
    assert all(b - a >= 0.8 for a, b in zip(xs, xs[1:])), "squares overlap"
    lines = [(tuple(line.get_xdata()), line.get_ydata()[0]) for line in ax.get_lines()]
    assert len(lines) == 4
    for i, (xa, ya) in enumerate(lines):       # TP lines that overlap in x differ in y
        for xb, yb in lines[i + 1:]:
            if min(xa) <= max(xb) and min(xb) <= max(xa):
                assert ya != yb
    plt.close("all")


def test_the_explorer_keeps_its_axes_and_marks_a_layout_that_does_not_fit():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from simcluster import planner

    row = planner.MEGATRON_TABLE1[4]
    explorer = p3.Explorer(row.config(), sc.Cluster.preset("dgx-a100", nodes=64),
                           global_batch=row.batch, tp=8, pp=2, dp=32, micro_batch=4)
    figures = {name: explorer.figure(explorer.estimate(**changes)) for name, changes in
               (("start", {}), ("no recompute", {"recompute": "none"}),
                ("tp4", {"tp": 4, "dp": 64}))}
    limits = {name: [ax.get_xlim() for ax in fig.axes] for name, fig in figures.items()}
    assert limits["start"] == limits["no recompute"] == limits["tp4"], "axes must not rescale"
    fits, too_big = figures["start"], figures["no recompute"]
    assert "does NOT fit" in too_big._suptitle.get_text()
    assert too_big.axes[0].get_facecolor() != fits.axes[0].get_facecolor()
    memory = {p.get_facecolor() for p in fits.axes[0].patches}
    step = {p.get_facecolor() for p in fits.axes[1].patches}
    assert memory and step and not memory & step, "a colour means one thing in both panels"
    plt.close("all")
