"""workbook.lesson10_failure_handling.demos:
the checkpoint-interval formulas and simulation, FEC arithmetic,
differential snapshots and the parameter-server recovery flow that lesson 10 runs."""

import math

import pytest
import torch

import simcluster as sc
from workbook import models as agg
from workbook.lesson10_failure_handling import demos as fail


@pytest.mark.parametrize("mtbf_min, paper_min", [(24 * 60, 117), (6 * 60, 57), (15, 9.1)])
def test_daly_reproduces_his_published_examples(mtbf_min, paper_min):
    # Daly (2006): δ = 5 min gives 117 / 57 / 9.1 min for M = 24 h / 6 h / 15 min
    got = fail.daly_interval(5, mtbf_min)
    assert round(got, 1 if paper_min < 10 else 0) == paper_min
    assert got < fail.young_interval(5, mtbf_min)        # the correction shortens it


def test_young_and_daly_limits():
    assert fail.young_interval(2, 8) == pytest.approx(math.sqrt(32))
    assert fail.daly_interval(30, 10) == 10               # δ ≥ 2M: checkpoint every M


def test_expected_goodput_is_daly_closed_form():
    tau, delta, m, r = 50.0, 5.0, 360.0, 10.0
    segment = m * math.exp(r / m) * (math.exp((tau + delta) / m) - 1)
    assert fail.expected_goodput(tau, delta, m, r) == pytest.approx(tau / segment)
    # no failures at all in the limit: only the checkpoint costs
    assert fail.expected_goodput(tau, delta, 1e12, r) == pytest.approx(tau / (tau + delta))


def test_simulation_without_failures_counts_only_checkpoints():
    mean, stderr, failures = fail.simulate_goodput(10.0, 1.0, 1e15, 5.0, work=95.0, trials=4)
    # 9 full segments and one of 5: 95 of work, 10 checkpoints of 1
    assert mean == pytest.approx(95 / 105)
    assert failures == 0 and stderr == pytest.approx(0, abs=1e-12)


@pytest.mark.parametrize("interval", [20.0, 57.0, 200.0])
def test_simulation_agrees_with_daly_expectation(interval):
    mean, stderr, failures = fail.simulate_goodput(interval, 5.0, 360.0, 10.0,
                                                   work=40 * 360.0, trials=300)
    assert failures > 30                                  # it did fail, many times
    assert abs(mean - fail.expected_goodput(interval, 5.0, 360.0, 10.0)) < 4 * stderr + 2e-3


def test_simulation_is_deterministic_and_seeded():
    a = fail.simulate_goodput(30.0, 5.0, 60.0, 5.0, work=600.0, trials=50, seed=3)
    b = fail.simulate_goodput(30.0, 5.0, 60.0, 5.0, work=600.0, trials=50, seed=3)
    c = fail.simulate_goodput(30.0, 5.0, 60.0, 5.0, work=600.0, trials=50, seed=4)
    assert a == b and a != c


def test_sweep_finds_the_optimum_near_daly():
    s = fail.goodput_sweep(5.0, 360.0, 10.0, [10.0, 25.0, 57.0, 130.0, 300.0], trials=100)
    assert s["best"] == 57.0
    assert s["daly"] == pytest.approx(fail.daly_interval(5.0, 360.0))
    assert s["at_daly"] > s["simulated"][0] and s["at_daly"] > s["simulated"][-1]


def test_fec_group_loss_and_parity():
    p = 0.2
    assert fail.fec_group_loss(p, 8, 1) == pytest.approx(1 - 0.8**9 - 9 * 0.2 * 0.8**8)
    assert fail.fec_group_loss(p, 8, 0) == pytest.approx(1 - 0.8**8)
    assert fail.fec_group_loss(0.0, 8, 1) == 0
    r = fail.fec_parity_needed(p, 8, 1e-3)
    assert fail.fec_group_loss(p, 8, r) <= 1e-3 < fail.fec_group_loss(p, 8, r - 1)


def test_snapshot_delta_counts_changed_bits():
    old = {"w": torch.zeros(1000), "step": torch.tensor(3)}
    same = fail.snapshot_delta(old, {"w": torch.zeros(1000), "step": torch.tensor(4)})
    assert same["full"] == 4000 and same["changed"] == 0
    new = old["w"].clone()
    new[:10] = 1.0
    d = fail.snapshot_delta(old, {"w": new})
    assert d["changed"] == 10 * (4 + 4)                   # value and index per element
    assert d["xor_zlib"] < d["full"] / 10                 # mostly zeros: compresses


def _ps(cluster, problem, **kwargs):
    import tempfile
    with tempfile.TemporaryDirectory() as d:
        run = cluster.run(fail.sharded_ps_train, world_size=6, args=(problem, 12, 2, 4, d),
                          kwargs={"checkpoint_every": 4, **kwargs})
    slices = {j: v for shard in run.results[:2] if shard for j, v in shard.items()}
    return torch.cat([slices[j][0] for j in sorted(slices)]), [slices[j][1] for j in sorted(slices)]


@pytest.mark.slow
def test_parameter_server_recovery_flow():
    cluster, problem = sc.Cluster.preset("dgx-a100"), agg.TinyMLP()
    base, applied = _ps(cluster, problem)
    assert applied == [12, 12]
    # a worker's tasks rescheduled: nothing lost, bit-identical
    params, applied = _ps(cluster, problem, worker_fails={3: 5})
    assert applied == [12, 12] and torch.equal(params, base)
    # the protocol article's flow: the shard reloads its checkpoint (round 8) and the others carry
    # on, so the rounds 8-9 of its slice are lost
    params, applied = _ps(cluster, problem, shard_fails={1: 10})
    assert applied == [12, 10] and not torch.equal(params, base)
    # everybody rolls back to the checkpoint: bit-identical again
    params, applied = _ps(cluster, problem, shard_fails={1: 10}, worker_fails={2: 3},
                          recovery="rollback")
    assert applied == [12, 12] and torch.equal(params, base)


def test_the_goodput_figure_is_shown_unscaled_with_one_legible_legend():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sweep = fail.goodput_sweep(5.0, 60.0, 10.0, [10.0, 20.0, 40.0], work_mtbfs=2, trials=3)
    fig = fail.plot_goodput({"MTBF 1 h": sweep, "again": sweep, "and again": sweep})
    assert fig.get_figwidth() <= 10.5, "wider than a notebook: JupyterLab would shrink it"
    (legend,) = fig.legends
    assert min(text.get_fontsize() for text in legend.get_texts()) >= 9
    assert all(ax.get_legend() is None for ax in fig.axes)
    assert "Young 24.5" in fig.axes[0].get_title()
    plt.close("all")
