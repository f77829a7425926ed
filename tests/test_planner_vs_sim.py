"""The planner against the executing simulator (issue 13's cross-check).

Three layouts of 8 simulated A100s (two 4-GPU nodes), tp x pp x dp in {2x2x2, 1x4x2,
4x1x2}: a 4-layer GPT of hidden 8,192 (64 heads, 2,048 tokens, vocabulary 512; 3.2 B
parameters), bf16 with mixed-precision Adam, 8 micro-batches of 2 sequences per replica,
on fake tensors, run by :func:`workbook.parallel3d.train_step` (TP with
``parallelize_module``, FSDP2 over dp keeping the step's gathered layers, torch's 1F1B),
measured on its second step. The planner predicts the same layout with
``efficiency=planner.ROOFLINE`` (every kernel at the device's peak, as the simulator
charges them), ``recompute="none"`` and ``zero=1`` (during a step FSDP2 under a pipeline
holds whole parameters and gradients and a shard of the optimizer state).

What agrees, and what does not (the numbers are in ``CROSS_CHECK`` below and in the
lesson 09 closing note):

* step time within 15 % on all three layouts; the simulator is 10-15 % slower because it
  executes eager kernels the planner takes as Megatron-LM's fused ones (unfused softmax
  and GeLU, FSDP2's copy-in/copy-out, per-micro-batch gradient accumulation, an unfused
  mixed-precision Adam at ~100 bytes per parameter instead of 34);
* peak memory: optimizer state to 1 %, activations to 10 %; parameters and gradients
  not: FSDP2 keeps its 1/dp shard beside the gathered copy and the reduce-scatter's
  sharded gradient beside the whole one, and the backward holds activation gradients.
  The planner's ZeRO model (Megatron-LM's distributed optimizer) has none of these, so
  it under-predicts an FSDP2 run's peak by 11-19 %; the strict xfail below pins that.
"""

import pytest
import torch

import simcluster as sc
from simcluster import planner
from workbook import parallel3d as p3

pytestmark = pytest.mark.slow

MODEL = {"vocab": 512, "hidden": 8192, "heads": 64, "layers": 4, "seq": 2048}
MICRO_BATCHES, MICRO_BATCH = 8, 2
LAYOUTS = [(2, 2, 2), (1, 4, 2), (4, 1, 2)]      # tp, pp, dp as the issue writes them


@pytest.fixture(scope="module")
def cluster():
    return sc.Cluster.from_dict({"nodes": [{"devices": 4, "count": 2}]})


@pytest.fixture(scope="module")
def pairs(cluster):
    """``{(tp, pp, dp): (Report3D, Estimate)}`` for the three layouts."""
    cfg = p3.planner_config(**MODEL)
    found = {}
    for tp, pp, dp in LAYOUTS:
        batch = dp * MICRO_BATCHES * MICRO_BATCH
        report = p3.measure(cluster, pp, dp, tp, micro_batches=MICRO_BATCHES, batch=batch,
                            model=MODEL, fake=True, dtype=torch.bfloat16, steps=2)
        est = planner.estimate(cfg, cluster, tp=tp, pp=pp, dp=dp, global_batch=batch,
                               micro_batch=MICRO_BATCH, recompute="none", zero=1,
                               efficiency=planner.ROOFLINE)
        found[tp, pp, dp] = report, est
    return found


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
    # what the forwards keep for the backward (Korthikanti et al.; no dropout)
    assert report.peak["activations"] == pytest.approx(est.memory["activations"], rel=0.10)
    # FSDP2: the gathered (whole) parameters plus its own 1/dp shard
    assert report.peak["parameters"] == pytest.approx(
        est.memory["parameters"] * (1 + 1 / dp), rel=0.02)


@pytest.mark.xfail(strict=True, reason="FSDP2's shard beside the gathered parameters, its "
                   "sharded gradients beside the whole ones and the backward's activation "
                   "gradients are not in the planner's ZeRO memory model")
def test_peak_memory_within_15_percent(pairs):
    for report, est in pairs.values():
        assert abs(report.peak["total"] / est.memory_per_gpu - 1) <= 0.15
