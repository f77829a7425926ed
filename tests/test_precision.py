"""Matmul precision: fp32 matmuls run at the fp32 peak unless the rank allows TF32
(``torch.set_float32_matmul_precision``, ``torch.backends.cuda.matmul.allow_tf32``), a
per-rank setting; bf16/fp16 matmuls under ``torch.autocast`` run at the bf16/fp16 peak."""

import pytest
import torch

import simcluster as sc
from simcluster.spec import TFLOPS

N = 2048
FLOPS = 2 * N**3


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100")


def _matmul_seconds(setting):
    """Seconds of one N x N x N matmul after the rank applied ``setting``."""
    if setting == "allow_tf32":
        torch.backends.cuda.matmul.allow_tf32 = True
    elif setting in ("high", "medium"):
        torch.set_float32_matmul_precision(setting)
    with sc.fake_tensors():
        a, b = torch.randn(N, N), torch.randn(N, N)
        clock = sc.accounting.current().clock
        start = clock.now
        if setting in ("bfloat16", "float16"):
            with torch.autocast("cpu", dtype=getattr(torch, setting)):
                a @ b
        else:
            a @ b
        return clock.now - start, torch.get_float32_matmul_precision()


@pytest.mark.parametrize("setting, tflops", [
    ("default", 19.5), ("high", 156), ("medium", 156), ("allow_tf32", 156),
    ("bfloat16", 312), ("float16", 312)])
def test_matmul_runs_at_the_peak_of_its_precision(node, setting, tflops):
    seconds, _ = node.run(_matmul_seconds, world_size=1, args=(setting,)).results[0]
    expected = FLOPS / (tflops * TFLOPS)
    if tflops == 312:   # autocast first casts both operands: read fp32, write 16-bit
        expected += 2 * N * N * (4 + 2) / node.spec.device_of(0).hbm_bandwidth
    assert seconds == pytest.approx(expected, rel=1e-6)


def _per_rank():
    import torch.distributed as dist
    return _matmul_seconds("high" if dist.get_rank() == 0 else "default")


def test_tf32_is_a_per_rank_setting(node):
    """A rank that allows TF32 changes no other rank, nor the notebook."""
    before = torch.get_float32_matmul_precision()
    (fast, high), (slow, highest) = node.run(_per_rank, world_size=2).results
    assert (high, highest) == ("high", "highest")
    assert fast == pytest.approx(FLOPS / (156 * TFLOPS), rel=1e-6)
    assert slow == pytest.approx(FLOPS / (19.5 * TFLOPS), rel=1e-6)
    assert torch.get_float32_matmul_precision() == before


def _scaled_steps():
    """Three fp16 steps with a GradScaler; the second one's gradients overflow fp16."""
    import torch.nn as nn
    torch.manual_seed(0)
    model = nn.Linear(8, 8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=1)
    log = []
    for step in range(3):
        x = torch.randn(4, 8) * (1e4 if step == 1 else 1.0)
        with torch.autocast("cpu", dtype=torch.float16):
            loss = model(x).square().sum()
        before = model.weight.detach().clone()
        scale = scaler.get_scale()
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
        opt.zero_grad()
        log.append((scale, scaler.get_scale(), not torch.equal(before, model.weight)))
    return log


def test_grad_scaler_skips_the_steps_whose_fp16_gradients_overflow(node):
    """torch.amp.GradScaler works inside a rank (device "cpu", the simulated GPU): a step
    whose scaled fp16 gradients overflow is skipped and the scale backs off; the others
    update the weights and grow it."""
    log = node.run(_scaled_steps, world_size=1).results[0]
    assert log == [(256.0, 512.0, True), (512.0, 256.0, False), (256.0, 512.0, True)]
