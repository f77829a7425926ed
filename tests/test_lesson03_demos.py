"""workbook.lesson03_data_parallel.demos: the shortcuts that make lesson 03 cheaper to
simulate leave what it measures unchanged."""

import pytest
import torch.nn as nn

import simcluster as sc
from workbook.lesson03_data_parallel import demos as dp


@pytest.fixture(scope="module")
def one_node():
    return sc.Cluster.preset("dgx-a100")


def test_ddp_without_init_sync_times_the_same_step(one_node):
    """DDP's construction broadcast comes before the timed step: skipping it
    (init_sync=False) leaves the step's time, collectives and peak as they were."""
    def step(init_sync):
        report, _ = dp.measure(one_node, 4, warmup=2, model_kwargs={"depth": 4},
                               ddp_kwargs={"bucket_cap_mb": 0.3, "init_sync": init_sync})
        return report

    skip, sync = step(False), step(True)
    assert skip.time == pytest.approx(sync.time, rel=1e-12)
    assert skip.comm == pytest.approx(sync.comm, rel=1e-12)
    assert [(c.op, c.nbytes) for c in skip.collectives] == [(c.op, c.nbytes) for c in sync.collectives]
    assert len(skip.all_reduces) > 1 and skip.peak == sync.peak


def _same_step(lean, full):
    """The timed steps agree: times to rounding (the warm-up's length moves the absolute
    simulated times they are differences of), collectives and every peak exactly."""
    for field in ("time", "compute", "comm", "exposed", "hidden"):
        assert getattr(lean, field) == pytest.approx(getattr(full, field), rel=1e-12), field
    assert [(c.op, c.nbytes) for c in lean.collectives] == [(c.op, c.nbytes) for c in full.collectives]
    assert lean.peak == full.peak


@pytest.mark.parametrize("kwargs", [
    # accumulation under no_sync: a warm-up forward that left a backward pending in DDP
    # would make the first no_sync micro-batch all-reduce too
    {"micro_batches": 3},
    {"ddp_kwargs": {"bucket_cap_mb": 0.3, "gradient_as_bucket_view": True}},
    {"barrier_every_step": True, "fake": True},
    {"warmup": 1},                                   # the timed step rebuilds the buckets
], ids=["no_sync", "bucket_view", "barrier_fake", "warmup1"])
def test_lean_warmup_times_the_same_step(one_node, kwargs):
    """dp.measure's warm-up (full_warmup=False: one backward, then forwards, no optimizer
    steps) leaves the timed step as a full warm-up does, and is cheaper."""
    kwargs = {"warmup": 2, "model_kwargs": {"depth": 4}, "batch": 8,
              "ddp_kwargs": {"bucket_cap_mb": 0.3}, **kwargs}
    lean, lean_run = dp.measure(one_node, 4, **kwargs)
    full, full_run = dp.measure(one_node, 4, full_warmup=True, **kwargs)
    _same_step(lean, full)
    assert len(lean.all_reduces) > 1
    if kwargs["warmup"] > 1:      # it skips work: the run ends earlier
        assert lean_run.elapsed < full_run.elapsed


def _with_batchnorm():
    return nn.Sequential(nn.Linear(16, 16), nn.BatchNorm1d(16), nn.ReLU(), nn.Linear(16, 16))


def test_lean_warmup_keeps_buffers_broadcast(one_node, monkeypatch):
    """A model with buffers (ResNet's BatchNorm) warms up with a backward every step:
    a forward under no_sync() would skip DDP's broadcast of the buffers in the timed step."""
    monkeypatch.setitem(dp.MODELS, "with_batchnorm", _with_batchnorm)
    kwargs = {"model": "with_batchnorm", "input_shape": (16,), "batch": 4, "warmup": 2}
    lean, _ = dp.measure(one_node, 2, **kwargs)
    full, _ = dp.measure(one_node, 2, full_warmup=True, **kwargs)
    _same_step(lean, full)
    assert any(c.op == "broadcast" for c in lean.collectives)


def test_large_batch_loss_trains_each_configuration_once():
    """At scale 1 the scaled and unscaled learning rates are one run, computed once; the
    cached loss is what a fresh training gives."""
    small = {"epochs": 1, "samples": 512}
    fresh = dp._final_loss.__wrapped__(0.005, 32, 1, 512)
    assert dp.large_batch_loss(1, False, **small) == fresh
    hits = dp._final_loss.cache_info().hits
    assert dp.large_batch_loss(1, True, **small) == fresh
    assert dp._final_loss.cache_info().hits == hits + 1
    assert dp.large_batch_loss(2, True, **small) != dp.large_batch_loss(2, False, **small)
