"""workbook.lesson05_pipeline_parallel.demos
(lesson 05's demos) and workbook.pipeline.bubble_uneven."""

import matplotlib
import pytest
import torch

import simcluster as sc
from workbook import models as dp
from workbook import pipeline
from workbook.lesson05_pipeline_parallel import demos as schedules

matplotlib.use("Agg")

SMALL = {"width": 16, "rows": 4, "fake": False}


@pytest.fixture(scope="module")
def cluster():
    return sc.Cluster.preset("dgx-a100")


def _reference_grads(n_stages, m, layers=1):
    """One process, the whole batch: the gradients per stage of the same MLP."""
    model = dp.mlp(SMALL["width"], layers * n_stages, 0)
    g = torch.Generator().manual_seed(1)
    x = torch.randn(m * SMALL["rows"], SMALL["width"], generator=g)
    y = torch.randn(m * SMALL["rows"], SMALL["width"], generator=g)
    torch.nn.functional.mse_loss(model(x), y).backward()
    return [[q.grad for q in part.parameters()] for part in pipeline.split(model, n_stages)]


def _assert_grads_match(run, n_stages, m):
    reference = _reference_grads(n_stages, m)
    for rank, result in enumerate(run.results):
        want = [g for s in result["stages"] for g in reference[s]]
        assert len(result["grads"]) == len(want) > 0
        for got, ref in zip(result["grads"], want):
            assert torch.allclose(got, ref, atol=1e-6), f"rank {rank}"


@pytest.mark.parametrize("p,m", [(2, 3), (3, 4)])
def test_hand_gpipe_gradients_equal_one_process(cluster, p, m):
    run = cluster.run(schedules.pipeline_step, world_size=p, args=("hand", m), kwargs=SMALL)
    _assert_grads_match(run, p, m)
    assert len(run.results[-1]["losses"]) == m and run.results[0]["losses"] == []


@pytest.mark.parametrize("name", ["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble"])
def test_torch_schedules_gradients_equal_one_process(cluster, name):
    p, m = 2, 4
    run = cluster.run(schedules.pipeline_step, world_size=p, args=(name, m), kwargs=SMALL)
    v = schedules.TORCH_SCHEDULES[name][1]
    _assert_grads_match(run, p * v, m)


def test_hand_gpipe_bubble_tracks_formula_and_memory_grows_with_m(cluster):
    reports = {m: schedules.measure(cluster, "hand", 4, m) for m in (4, 8)}
    for m, report in reports.items():
        assert report.formula == pytest.approx(pipeline.bubble_formula(4, m))
        assert 0 <= report.bubble - report.formula < 0.02
    # every micro-batch in flight is held until the backward phase: twice m, twice held
    for a, b in zip(reports[4].held, reports[8].held):
        assert b == pytest.approx(2 * a, rel=0.01)
    assert reports[8].held[0] > 0


def test_one_heavy_stage_sets_the_pace(cluster):
    layers = [1, 1, 2, 1]
    report = schedules.measure(cluster, "hand", 4, 8, layers=layers)
    assert report.bubble == pytest.approx(pipeline.bubble_uneven(layers, 8), abs=0.01)
    assert report.bubble > pipeline.bubble_formula(4, 8) + 0.1


def test_bubble_uneven():
    assert pipeline.bubble_uneven([1, 1, 1, 1], 8) == pytest.approx(pipeline.bubble_formula(4, 8))
    # one stage twice as slow: wall 5 + 7·2 = 19 slots, the stages compute 8·5/4 = 10 each
    assert pipeline.bubble_uneven([1, 1, 2, 1], 8) == pytest.approx(1 - 10 / 19)
    assert pipeline.bubble_uneven([3], 4) == 0


def test_placement_across_nodes_costs_time():
    two_nodes = sc.Cluster.preset("dgx-a100", nodes=2)
    inside = schedules.measure(two_nodes, "hand", 4, 4, placement=[0, 1, 2, 3], world_size=16)
    across = schedules.measure(two_nodes, "hand", 4, 4, placement=[0, 8, 1, 9], world_size=16)
    assert across.elapsed > inside.elapsed
    assert across.ranks == [0, 8, 1, 9]
    assert across.run.results[2] is None          # a rank the placement leaves out
    slow = schedules.measure(two_nodes, "hand", 4, 4, placement=[0, 8, 1, 9], world_size=16,
                             link_factor={"network": 0.1})
    assert slow.elapsed > across.elapsed


def test_stage_ranks():
    assert schedules.stage_ranks(3) == [[0], [1], [2]]
    assert schedules.stage_ranks(2, 2) == [[0, 2], [1, 3]]
    assert schedules.stage_ranks(3, 2, "v") == [[0, 5], [1, 4], [2, 3]]
    with pytest.raises(ValueError, match="exactly 2 stages"):
        schedules.stage_ranks(2, 3, "v")


def test_grid_table_and_plot(cluster):
    grid = schedules.bubble_grid(cluster, ps=(2,), ms=(1, 2))
    text = schedules.grid_table(grid)
    assert "p = 2" in text and "50.0%" in text and "largest gap" in text
    assert len(schedules.plot_grid(grid).lines) == 2


def test_source_is_the_hand_written_schedule():
    text = schedules.source()
    assert text.startswith("def gpipe(") and "dist.recv" in text and "dist.send" in text


def test_bubble_since_leaves_out_the_set_up(cluster):
    def set_up_then_relay():
        import torch.distributed as dist
        x = torch.ones(256, 256)
        for _ in range(20):              # set-up: every rank computes alone, no bubble
            x = x @ x / 256
        dist.barrier()
        if dist.get_rank() == 1:
            dist.recv(x, 0)
        for _ in range(20):
            x = x @ x / 256
        if dist.get_rank() == 0:
            dist.send(x, 1)

    run = cluster.run(set_up_then_relay, world_size=2)
    start = run.collectives[0].end
    assert pipeline.bubble(run) == pytest.approx(1 - (run.clock(0).compute + run.clock(1).compute)
                                                 / (2 * run.elapsed))
    assert pipeline.bubble(run) < 0.4 < 0.45 < pipeline.bubble(run, since=start) < 0.55


def test_plot_timelines_draws_forward_and_backward(cluster):
    report = schedules.measure(cluster, "hand", 2, 2)
    phases = schedules._phases(report.run, 0, report.run.elapsed - report.elapsed)
    assert len(phases["forward"]) >= 2 and len(phases["backward"]) >= 2
    assert all(start >= 0 for start, _ in phases["forward"] + phases["backward"])
    # the forwards come first in GPipe: every forward starts before the first backward
    first_backward = min(start for start, _ in phases["backward"])
    assert max(start for start, _ in phases["forward"]) < first_backward
    fig = schedules.plot_timelines({"hand": report})
    assert len(fig.axes[0].collections) == 2 * report.p


def test_torch_1f1b_stash_is_bounded_and_gpipe_grows(cluster):
    p, m = 4, 16
    gpipe = schedules.measure(cluster, "GPipe", p, m)
    one_f_one_b = schedules.measure(cluster, "1F1B", p, m)
    assert gpipe.stashed_micro_batches == pytest.approx([m] * p)
    # stage s keeps p - s micro-batches, plus the one torch's loop still refers to
    assert one_f_one_b.stashed_micro_batches == pytest.approx([p - s + 1 for s in range(p)])
    for report in (gpipe, one_f_one_b):
        assert abs(report.bubble - report.formula) < 0.01
    # the simulator's own per-rank record agrees on which stage holds the most
    peaks = [one_f_one_b.run.category_peaks(r)["activations"] for r in range(p)]
    assert peaks == sorted(peaks, reverse=True)


def test_compare_interleaving_halves_the_idle_time_and_sends_more(cluster):
    reports = schedules.compare(cluster, ["1F1B", "Interleaved1F1B"], p=2, m=4)
    plain, interleaved = reports["1F1B"], reports["Interleaved1F1B"]
    assert plain.blocks == interleaved.blocks == [2, 2]          # the same model
    idle = {name: r.bubble / (1 - r.bubble) for name, r in reports.items()}
    assert idle["Interleaved1F1B"] == pytest.approx(idle["1F1B"] / 2, rel=0.1)
    # p - 1 = 1 boundary against v·p - 1 = 3
    assert sum(interleaved.bytes_sent) == pytest.approx(3 * sum(plain.bytes_sent), rel=0.01)
    text = schedules.schedule_table(reports)
    assert "Interleaved1F1B" in text and f"{(2 - 1) / (2 * 4):.3f}" in text


def test_draw_grid_table(cluster):
    import matplotlib.pyplot as plt
    grid = schedules.bubble_grid(cluster, ps=(2,), ms=(1,))
    ax = schedules.draw_grid_table(grid, plt.subplots()[1])
    cells = ax.tables[0].get_celld()
    assert cells[1, 0].get_text().get_text() == f"{grid[2, 1].bubble:.1%} / 50.0%"
