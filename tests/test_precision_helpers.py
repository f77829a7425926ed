"""workbook.lesson08_memory_and_precision.demos,
lesson 08's helpers: the GPT and its checkpointing modes compute the
same gradients as the plain model; one measured step counts model states, activations
and time as the formulas say; the number formats; fp16 gradients that underflow and
GradScaler's skipped steps."""

import math

import pytest
import torch

import simcluster as sc
from workbook.lesson08_memory_and_precision import demos as P

SMALL = dict(layers=3, hidden=32, heads=4, seq=16, batch=4)


@pytest.fixture(scope="module")
def gpu():
    return P.a100()


def _gradients(**checkpointing):
    """Loss and parameter gradients of one real forward/backward of a small GPT."""
    torch.manual_seed(0)
    model = P.GPT(3, 32, 4, dropout=0.1, **checkpointing)
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1), requires_grad=True)
    torch.manual_seed(2)                 # dropout's masks: the same draws in every mode
    loss = model(x).square().mean()
    loss.backward()
    return loss.item(), [p.grad.clone() for p in model.parameters()], x.grad.clone()


@pytest.mark.parametrize("checkpointing", [{"checkpoint": [0, 2]}, {"checkpoint": "all"},
                                           {"selective": True}, {"segments": 2}])
def test_checkpointing_gives_the_plain_models_gradients(checkpointing):
    """Recomputation replays dropout with the same random numbers: identical results."""
    loss, grads, x_grad = _gradients()
    loss_c, grads_c, x_grad_c = _gradients(**checkpointing)
    assert loss_c == loss
    assert all(torch.equal(g, h) for g, h in zip(grads, grads_c))
    assert torch.equal(x_grad, x_grad_c)


def test_parameter_count():
    model = P.GPT(3, 32, 4)
    assert P.parameter_count(3, 32) == sum(p.numel() for p in model.parameters())


@pytest.fixture(scope="module")
def plain(gpu):
    return P.measure(gpu, **SMALL)


def test_fp32_adam_keeps_16_bytes_per_parameter(plain):
    tensors = len(list(P.GPT(SMALL["layers"], SMALL["hidden"], SMALL["heads"]).parameters()))
    assert plain.state["parameters"] == 4 * plain.psi
    assert plain.state["gradients"] == 4 * plain.psi
    # Adam: momentum and variance, and a one-element fp32 step counter per tensor
    assert plain.state["optimizer state"] == 8 * plain.psi + 4 * tensors
    assert plain.state.get("activations", 0) == 0          # freed by the backward
    assert plain.peak["activations"] > 0 and plain.seconds > 0 and plain.oom is None


def test_selective_recomputation_drops_the_attention_tensors(gpu, plain):
    """Per layer, fp32 on CPU: softmax output, dropout mask and dropout output, 4 bytes
    each per element of the a·s²·b scores."""
    s, b, a, layers = SMALL["seq"], SMALL["batch"], SMALL["heads"], SMALL["layers"]
    selective = P.measure(gpu, selective=True, **SMALL)
    assert plain.activations - selective.activations == layers * 12 * a * s * s * b
    assert selective.seconds > plain.seconds                # the core attention, again


def test_full_recomputation_keeps_each_blocks_input(gpu, plain):
    s, b, h, layers = SMALL["seq"], SMALL["batch"], SMALL["hidden"], SMALL["layers"]
    full = P.measure(gpu, checkpoint="all", **SMALL)
    shorter = P.measure(gpu, checkpoint="all", **dict(SMALL, layers=layers - 1))
    # one more checkpointed block keeps exactly its fp32 input
    assert full.activations - shorter.activations == 4 * s * b * h
    assert full.activations < plain.activations / 10
    one = P.measure(gpu, checkpoint=[0], **SMALL)
    assert full.activations < one.activations < plain.activations
    assert plain.seconds < one.seconds < full.seconds


def test_accumulation_divides_the_activations(gpu, plain):
    four = P.measure(gpu, micro_batches=4, **SMALL)
    assert four.activations * 4 == plain.activations
    states = ("parameters", "gradients", "optimizer state")
    assert [four.state[c] for c in states] == [plain.state[c] for c in states]
    assert four.peak["total"] < plain.peak["total"]


def test_precisions_order_the_step_times(gpu):
    wide = dict(SMALL, hidden=256, seq=128)       # matmul-bound enough to tell them apart
    times = {p: P.measure(gpu, precision=p, **wide) for p in ("fp32", "tf32", "bf16")}
    assert times["bf16"].seconds < times["tf32"].seconds < times["fp32"].seconds
    assert times["bf16"].activations < times["fp32"].activations
    # autocast keeps fp32 parameters; its bf16 weight copies count as parameters
    assert times["bf16"].state["parameters"] == times["fp32"].state["parameters"]
    assert times["bf16"].peak["parameters"] > times["fp32"].peak["parameters"]


def test_a_step_that_does_not_fit_is_reported(gpu):
    tiny = P.a100(0.0001)        # 107 kB: less than the small GPT needs
    assert tiny.spec.nodes[0].device.memory == int(0.0001 * P.GiB)
    report = P.measure(tiny, **SMALL)
    assert isinstance(report.oom, sc.OutOfMemoryError) and math.isnan(report.seconds)
    assert report.peak["total"] == sum(report.oom.in_use.values())


def test_bad_arguments_raise():
    with pytest.raises(ValueError, match="precision"):
        P.train_steps(precision="fp8")
    with pytest.raises(ValueError, match="multiple"):
        P.train_steps(batch=8, micro_batches=3)
    with pytest.raises(ValueError, match="recompute"):
        P.korthikanti_bytes(1, 1, 1, 1, "half")


def test_korthikanti_bytes():
    s, b, h, a = 2048, 4, 4096, 32
    assert P.korthikanti_bytes(s, b, h, a) == s * b * h * (34 + 5 * a * s / h)
    assert P.korthikanti_bytes(s, b, h, a, "selective") == 34 * s * b * h
    assert P.korthikanti_bytes(s, b, h, a, "full") == 2 * s * b * h


def test_format_table():
    rows = {r[0]: r[1:] for r in P.format_table()}
    assert rows["fp16"] == (5, 10, 65504.0, 2.0**-14, 2.0**-24, 2.0**-10)
    assert rows["tf32"][:2] == (8, 10) and rows["tf32"][2] == torch.finfo(torch.float32).max
    assert rows["tf32"][5] == 2.0**-10
    assert rows["bf16"][3] == torch.finfo(torch.float32).smallest_normal


def _three_ways():
    return {"fp32": P.logit_gradients(half=False), "fp16": P.logit_gradients(),
            "scaled": P.logit_gradients(scale=2.0**16)}


def test_fp16_logit_gradients_underflow_and_scaling_keeps_them(gpu):
    grads = gpu.run(_three_ways, world_size=1).results[0]
    zeros = {k: (g["logits"] == 0).float().mean().item() for k, g in grads.items()}
    assert zeros["fp32"] == 0 and zeros["fp16"] > 0.5 and zeros["scaled"] < 0.05
    head = grads["fp32"]["head"]
    error = {k: ((g["head"] - head).norm() / head.norm()).item() for k, g in grads.items()}
    assert error["scaled"] < error["fp16"]


def test_grad_scaler_skips_overflowing_steps(gpu):
    log = gpu.run(P.scaled_training, world_size=1).results[0]
    scales = [scale for scale, _, _ in log]
    skipped = [i for i, (_, skip, _) in enumerate(log) if skip]
    assert skipped == list(range(16)) and scales[16] == 2.0**16
    assert all(scales[i + 1] == scales[i] / 2 for i in skipped)
    # a skipped step leaves the parameters alone: the next loss is the same
    assert all(log[i + 1][2] == log[i][2] for i in skipped)
    assert log[-1][2] < log[16][2]


def test_sqrt_l_segments_are_best_for_a_chain_of_equal_layers(gpu):
    """A chain of 16 Linear + ReLU layers, each keeping one tensor of its input's size:
    (k − 1) + L/k tensors (+ the loss's input gradient), least at k = √16 = 4."""
    chain = dict(layers=16, width=64, tokens=32)
    one = 32 * 64 * 4
    peaks = {k: gpu.run(P.chain_step, world_size=1, kwargs=dict(chain, segments=k))
             .category_peaks(0)["activations"] for k in (2, 4, 8, 16)}
    assert {k: p / one for k, p in peaks.items()} == {k: k - 1 + 16 // k + 1 for k in peaks}
    assert min(peaks, key=peaks.get) == 4


@pytest.mark.parametrize("kwargs", [{}, {"precision": "bf16", "selective": True, "micro_batches": 2},
                                    {"checkpoint": "all"}, {"segments": 2, "precision": "tf32"}])
def test_cheap_warmup_leaves_the_measured_step_as_a_full_one(gpu, kwargs):
    """The warm-up without a forward (first_optimizer_step) leaves the measured step as a
    real warm-up step does: its peak and each category's peak, what the forward keeps,
    the state after the step, and its time (equal up to the rounding of times measured
    from a different start)."""
    cheap = P.measure(gpu, **SMALL, **kwargs)
    full = P.measure(gpu, full_warmup=True, **SMALL, **kwargs)
    assert cheap.seconds == pytest.approx(full.seconds, rel=1e-12)
    assert (cheap.peak, cheap.held, cheap.state) == (full.peak, full.held, full.state)
    assert cheap.run.category_peaks(0) == full.run.category_peaks(0)
    assert cheap.held["activations"] > 0 and cheap.state["optimizer state"] > 0
    # and the warm-up itself was cheaper: no forward of the model before the barrier
    assert cheap.run.elapsed < full.run.elapsed
