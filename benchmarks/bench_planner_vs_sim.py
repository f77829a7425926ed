"""The planner against the executing simulator on 8 simulated A100s (issue 13's cross-check).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_planner_vs_sim.py

Runs :func:`workbook.lesson09_3d_parallelism.demos.cross_check` (a 3.2 B-parameter GPT on fake tensors,
tp x pp x dp in {2x2x2, 1x4x2, 4x1x2}, two 4-GPU nodes) and prints, per layout, the
simulated and predicted step time and peak memory per GPU and their ratio, then the memory
by category. ``tests/test_planner_vs_sim.py`` asserts what agrees. Simulated numbers only,
no wall-clock timing; a few minutes of CPU.
"""

import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import simcluster as sc  # noqa: E402
from workbook.lesson09_3d_parallelism import demos as p3  # noqa: E402

GiB = 2**30


def main():
    """Print the comparison; return its rows."""
    cluster = sc.Cluster.from_dict({"nodes": [{"devices": 4, "count": 2}]})
    rows = p3.cross_check(cluster)
    print("planner (efficiency=ROOFLINE, zero=1) vs simulator, 8 A100s on 2 nodes\n")
    print(f"{'tp x pp x dp':>12} {'sim step':>9} {'planner':>9} {'ratio':>6}  "
          f"{'sim peak':>9} {'planner':>9} {'ratio':>6}")
    for (tp, pp, dp), report, est in rows:
        print(f"{f'{tp} x {pp} x {dp}':>12} {report.step_time * 1e3:>7.1f}ms "
              f"{est.step_time * 1e3:>7.1f}ms {report.step_time / est.step_time:>6.3f}  "
              f"{report.peak['total'] / GiB:>6.2f}GiB {est.memory_per_gpu / GiB:>6.2f}GiB "
              f"{report.peak['total'] / est.memory_per_gpu:>6.3f}")
    print("\nmemory at the peak, GiB (simulator | planner)")
    for (tp, pp, dp), report, est in rows:
        sim = ", ".join(f"{k} {v / GiB:.2f}" for k, v in report.peak.items() if v and k != "total")
        plan = ", ".join(f"{k} {v / GiB:.2f}" for k, v in est.memory.items())
        print(f"  {tp} x {pp} x {dp}: {sim} | {plan}")
    return rows


if __name__ == "__main__":
    main()
