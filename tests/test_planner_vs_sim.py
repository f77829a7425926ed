"""The planner against the executing simulator (issue 13's cross-check).

Three layouts of 8 simulated A100s (two 4-GPU nodes), tp x pp x dp in {2x2x2, 1x4x2,
4x1x2}: a 4-layer GPT of hidden 8,192 (64 heads, 2,048 tokens, vocabulary 512; 3.2 B
parameters), bf16 with mixed-precision Adam, 8 micro-batches of 2 sequences per replica,
on fake tensors, run by :func:`workbook.lesson09_3d_parallelism.demos.train_step` (TP with
``parallelize_module``, FSDP2 over dp keeping the step's gathered layers, torch's 1F1B),
measured on its second step (:func:`workbook.lesson09_3d_parallelism.demos.cross_check`). The planner
predicts the same layout with ``efficiency=planner.ROOFLINE`` (every kernel at the
device's peak, as the simulator charges them), ``recompute="none"`` and ``zero=1``
(during a step FSDP2 under a pipeline holds whole parameters and gradients and a shard of
the optimizer state). ``benchmarks/bench_planner_vs_sim.py`` prints the numbers.

What agrees, and what does not:

* step time within 15 % on all three layouts; the simulator is 5-9 % slower because it
  executes work the planner does not count: FSDP2's copies into and out of its
  all-gather buffers, a gradient accumulation per micro-batch, an unfused
  mixed-precision Adam (~100 bytes per parameter instead of 34), and compute slowed while
  pipeline sends run beside it;
* peak memory within 15 % too (5-9 % more on the simulator); by category, optimizer
  state to 1 %, gradients (with the backward's activation gradients) to 6 %,
  activations to 10 %. Parameters differ by FSDP2's design: it keeps its 1/dp shard
  beside the gathered copy (1.5x the planner's ZeRO-1 parameters at dp = 2), which
  Megatron-LM's distributed optimizer, the planner's model, does not; the test pins that
  factor.
"""

import pytest

import simcluster as sc
from workbook.lesson09_3d_parallelism import demos as p3

pytestmark = pytest.mark.slow

LAYOUTS = p3.CROSS_CHECK_LAYOUTS          # (tp, pp, dp) as the issue writes them


@pytest.fixture(scope="module")
def pairs():
    """``{(tp, pp, dp): (Report3D, Estimate)}`` for the three layouts."""
    cluster = sc.Cluster.from_dict({"nodes": [{"devices": 4, "count": 2}]})
    return {layout: (report, est) for layout, report, est in p3.cross_check(cluster)}


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "x".join(map(str, x)))
def test_step_time_within_15_percent(pairs, layout):
    report, est = pairs[layout]
    assert abs(report.step_time / est.step_time - 1) <= 0.15, (report.step_time, est.step_time)


@pytest.mark.parametrize("layout", LAYOUTS, ids=lambda x: "x".join(map(str, x)))
def test_memory_categories_the_planner_models(pairs, layout):
    report, est = pairs[layout]
    tp, pp, dp = layout
    # Adam's fp32 master weights, momentum and variance, sharded over dp: the same bytes
    assert report.peak["optimizer state"] == pytest.approx(est.memory["optimizer"], rel=0.01)
    # whole gradients while they accumulate, and the backward's activation gradients: the
    # planner books both as "gradients", the simulator the latter among its temporaries
    # ("other", with the rest of the backward's scratch memory)
    assert report.peak["gradients"] <= est.memory["gradients"]
    assert report.peak["gradients"] + report.peak["other"] >= 0.94 * est.memory["gradients"]
    # what the forwards keep for the backward (Korthikanti et al.; no dropout)
    assert report.peak["activations"] == pytest.approx(
        est.memory["activations"] + est.memory["workspace"], rel=0.10)
    # FSDP2: the gathered (whole) parameters plus its own 1/dp shard
    assert report.peak["parameters"] == pytest.approx(
        est.memory["parameters"] * (1 + 1 / dp), rel=0.02)


def test_peak_memory_within_15_percent(pairs):
    for layout, (report, est) in pairs.items():
        assert abs(report.peak["total"] / est.memory_per_gpu - 1) <= 0.15, (
            layout, report.peak, est.memory)
