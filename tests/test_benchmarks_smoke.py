"""The benchmarks run (quick mode, tiny sizes). No timing is asserted: only that each
benchmark completes and that what it trains is correct."""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))  # `benchmarks` is imported from the repository root

pytestmark = pytest.mark.slow


def test_bench_ddp_quick():
    from benchmarks import bench_ddp

    r = bench_ddp.main(quick=True, verbose=False)
    for variant in ("serial", "serial_watched", "sim", "gloo"):
        assert r[variant]["loop"]["median"] > 0
    assert r["gloo"]["e2e"]["median"] > 0
    # The sim and gloo trained the same model on the same data.
    assert r["loss_diff_sim_vs_gloo"] < 1e-4
    assert r["sim_deterministic"]
    for goal in ("accounting_goal_met", "raw_goal_met", "gloo_goal_met"):
        assert isinstance(r[goal], bool)
    assert r["watched_over_serial"] > 0


def test_bench_scale_quick():
    from benchmarks import bench_scale

    r = bench_scale.main(quick=True, verbose=False)
    assert r["ranks"] == 16
    assert set(r["phases"]) == {"allreduce_rank", "hand_dp_rank", "ddp_rank"}
    for name, phase in r["phases"].items():
        assert phase["ok"], f"{name}: {phase['detail']}"
    assert r["peak_rss_mib"] > 0


def test_profile_sim_quick():
    from benchmarks import profile_sim

    r = profile_sim.main(quick=True, verbose=False)
    assert "serial floor" in r["ablation"]
    assert r["unit_costs"]["per_step"]["hand_over"] > 0
    # counted on the mode the run really uses (FastRankAccounting has its own dispatch)
    assert r["unit_costs"]["per_step"]["dispatched_ops"] > 0
    assert r["profile"]["total_s"] > 0


def test_bench_import_quick():
    from benchmarks import bench_import

    r = bench_import.main(quick=True, verbose=False)
    assert r["modules"]["torch"]["over_torch"] == 1.0
    assert r["modules"]["simcluster"]["wall"] > 0
    assert isinstance(r["goal_met"], bool)


def test_bench_notebooks_quick():
    from benchmarks import bench_notebooks

    r = bench_notebooks.main(quick=True, verbose=False)
    assert list(r) == ["notebooks/00_simulated_cluster.ipynb"]
    row = r["notebooks/00_simulated_cluster.ipynb"]
    assert row["wall"] > 0 and row["cpu"] > 0
    assert row["goal"] == bench_notebooks.GOALS["notebooks"] == 45
    assert row["goal_met"] == (row["wall"] <= row["goal"])
    # Lesson, solution and lab, in that order; a lab has no goal of its own.
    assert [f"{p.parent.name}/{p.name[:2]}" for p in bench_notebooks.notebooks(("04",))] \
        == ["notebooks/04", "solutions/04", "labs/04"]
    assert bench_notebooks.GOALS["solutions"] == 30 and bench_notebooks.GOALS["labs"] is None
    # --nbval-env times the kernels as `make test` runs them.
    assert bench_notebooks.nbval_env()["ATEN_CPU_CAPABILITY"] == "default"


def test_bench_fake_dispatch_quick():
    from benchmarks import bench_fake_dispatch

    r = bench_fake_dispatch.main(quick=True, verbose=False)
    assert "mul.out (DDP's bucket copy)" in r
    for row in r.values():
        assert row["torch"] > 0 and row["sim"] > 0


def test_bench_scheduling_quick():
    from benchmarks import bench_scheduling

    r = bench_scheduling.main(quick=True, verbose=False)
    assert len(r["rows"]) == 8 and all(row["jobs_per_s"] > 0 for row in r["rows"])
    assert r["goal_met"] == (r["slowest_s"] < bench_scheduling.GOAL_S)


def test_bench_serving_quick():
    from benchmarks import bench_serving

    r = bench_serving.main(quick=True, verbose=False)
    assert r["round robin, 4 replicas"]["per_second"] > 0
    assert isinstance(r["goal_met"], bool)
