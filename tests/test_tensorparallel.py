"""workbook.lesson06_tensor_parallel.demos
(lesson 06's measurements) and the simulator behaviour it relies
on: DTensor tensor parallelism charged at the local shard's size, the communication and
activation memory of one layer against the published formulas (docs/reference-numbers.md,
"Tensor-parallel communication" and "Activation memory")."""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc
from workbook.lesson06_tensor_parallel import demos as tp

SMALL = {"hidden": 64, "heads": 8, "seq": 32, "batch": 2}
TRAINING = {"dtype": torch.bfloat16, "dropout": 0.1, **SMALL}


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100")


# ------------------------------------------------- DTensor compute, charged once


def _colwise_linear_compute(n):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import ColwiseParallel, parallelize_module

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    with sc.fake_tensors():
        linear = nn.Linear(n, n, dtype=torch.bfloat16)
        parallelize_module(linear, mesh, ColwiseParallel())
        x = torch.randn(n, n, dtype=torch.bfloat16)
        dist.barrier()
        linear(x)


def _compute_after_last_barrier(run, rank=0):
    start = [c for c in run.collectives if c.op == "barrier"][-1].end
    return sum(e.end - max(e.start, start) for e in run.clock(rank).events
               if e.lane == "compute" and e.end > start)


@pytest.mark.parametrize("t", [1, 4])
def test_a_dtensor_matmul_is_charged_once_at_the_local_shape(node, t):
    # DTensor replays every op on fake tensors of the global shape to learn the output's
    # shape; before the fix that replay was charged too (2x at t=1, 1 + 1/t at t)
    n = 4096
    run = node.run(_colwise_linear_compute, world_size=t, args=(n,))
    expected = 2 * n * n * n / t / node.spec.device_of(0).flops_for(torch.bfloat16)
    assert _compute_after_last_barrier(run) == pytest.approx(expected, rel=0.01)


# ------------------------------------------------------- the layer against one process


@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_parallel_layer_equals_one_process(node, sequence_parallel):
    single = tp.measure_layer(node, 1, parallel=False, **SMALL)[0].results[0]
    report, _ = tp.measure_layer(node, 4, sequence_parallel=sequence_parallel, **SMALL)
    outs = [r["out"] for r in report.results]
    x_grads = [r["x_grad"] for r in report.results]
    if sequence_parallel:    # each rank holds its quarter of the positions
        assert outs[0].shape == (2, 8, 64)
        out, x_grad = torch.cat(outs, dim=1), torch.cat(x_grads, dim=1)
    else:
        out, x_grad = outs[0], x_grads[0]
    torch.testing.assert_close(out, single["out"], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(x_grad, single["x_grad"], rtol=1e-5, atol=1e-5)
    for name, grad in report.results[0]["grads"].items():
        torch.testing.assert_close(grad, single["grads"][name], rtol=1e-4, atol=1e-4)
    # the weights really are split: a quarter of wq's rows, of wo's columns
    assert report.results[0]["shards"]["attn.wq.weight"] == (16, 64)
    assert report.results[0]["shards"]["attn.wo.weight"] == (64, 16)


@pytest.mark.parametrize("t", [2, 4, 8])
def test_tensor_parallel_sends_two_all_reduces_per_pass_and_the_published_bytes(node, t):
    report, _ = tp.measure_layer(node, t, **TRAINING)
    assert [c.op for c in report.forward] == ["all_reduce"] * 2
    assert [c.op for c in report.backward] == ["all_reduce"] * 2
    b, s, h = SMALL["batch"], SMALL["seq"], SMALL["hidden"]
    assert all(c.nbytes == b * s * h * 2 for c in report.forward + report.backward)
    assert report.bytes_sent == tp.tp_comm_elements(b, s, h, t) * 2


def test_sequence_parallel_sends_the_same_bytes_as_reduce_scatter_and_all_gather(node):
    tp_only, _ = tp.measure_layer(node, 4, **TRAINING)
    sp, _ = tp.measure_layer(node, 4, sequence_parallel=True, **TRAINING)
    ops = [c.op for c in sp.forward + sp.backward]
    assert ops.count("all_gather_into_tensor") == 4 and ops.count("reduce_scatter_tensor") == 4
    assert "all_reduce" not in ops
    assert sp.bytes_sent == tp_only.bytes_sent


def test_projections_that_each_wrap_their_input_all_reduce_three_times(node):
    naive, _ = tp.measure_layer(node, 4, prepare_inputs=False, **SMALL)
    once, _ = tp.measure_layer(node, 4, **SMALL)
    assert len(naive.backward) == 4 and len(once.backward) == 2
    assert naive.bytes_sent == pytest.approx(1.5 * once.bytes_sent)


# ------------------------------------------------------------------ activation memory


@pytest.mark.parametrize("t", [1, 2, 4, 8])
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_activation_memory_is_the_paper_plus_the_simulators_differences(
        node, t, sequence_parallel):
    report, _ = tp.measure_layer(node, t, sequence_parallel=sequence_parallel, **TRAINING)
    s, b, h, a = SMALL["seq"], SMALL["batch"], SMALL["hidden"], SMALL["heads"]
    assert report.activations == tp.activation_bytes_simulated(s, b, h, a, t, sequence_parallel)
    # and the differences are not nothing: the paper's count is smaller
    assert report.activations > tp.activation_bytes(s, b, h, a, t, sequence_parallel)


@pytest.mark.slow
@pytest.mark.parametrize("sequence_parallel", [False, True], ids=["tp", "tp+sp"])
def test_gpt3_layer_on_fake_tensors_matches_the_formula(node, sequence_parallel):
    gpt3 = {"hidden": 12288, "heads": 96, "seq": 2048, "batch": 1}
    report, _ = tp.measure_layer(node, 8, sequence_parallel=sequence_parallel, fake=True,
                                 dtype=torch.bfloat16, dropout=0.1, **gpt3)
    assert report.activations == tp.activation_bytes_simulated(2048, 1, 12288, 96, 8,
                                                               sequence_parallel)
    one, _ = tp.measure_layer(node, 1, fake=True, dtype=torch.bfloat16, dropout=0.1, **gpt3)
    assert report.compute < one.compute / 6      # the shards' compute, not the whole layer's


# --------------------------------------------------------------------- the formulas


def test_published_formulas():
    # Korthikanti et al. 2022: GPT-3 (a=96, h=12288) at s=2048: 5as/h = 80
    s, b, h, a = 2048, 1, 12288, 96
    assert tp.activation_bytes(s, b, h, a) == s * b * h * 114
    assert tp.activation_bytes(s, b, h, a, 8) == s * b * h * (10 + 3 + 10)
    assert tp.activation_bytes(s, b, h, a, 8, sequence_parallel=True) == s * b * h * (34 / 8 + 10)
    # t = 1: SP changes nothing
    assert tp.activation_bytes(s, b, h, a, 1, True) == tp.activation_bytes(s, b, h, a, 1)
    # Narayanan et al. 2021: nothing to send alone, 8bsh·(t-1)/t otherwise
    assert tp.tp_comm_elements(1, s, h, 1) == 0
    assert tp.tp_comm_elements(1, s, h, 8) == 8 * s * h * 7 / 8


# ------------------------------------------------- placement and the vocabulary


def test_tensor_parallel_all_reduce_is_slower_across_nodes():
    two_nodes = sc.Cluster.preset("dgx-a100", nodes=2)
    nbytes = 2048 * 12288 * 2
    inside = tp.allreduce_time(two_nodes, range(8), nbytes)
    across = tp.allreduce_time(two_nodes, [0, 1, 2, 3, 8, 9, 10, 11], nbytes)
    assert across > 2 * inside


def test_loss_parallel_equals_one_process_and_sends_only_b_s_numbers(node):
    loss_1, _ = node.run(tp.vocab_parallel_step, world_size=1,
                         kwargs={"parallel": False}).results[0]
    run = node.run(tp.vocab_parallel_step, world_size=4)
    loss_4, _ = run.results[0]
    assert loss_4 == pytest.approx(loss_1, rel=1e-6)
    start = [c for c in run.collectives if c.op == "barrier"][-3].end
    sizes = [c.nbytes for c in run.collectives if c.op == "all_reduce" and c.start >= start]
    # embedding (b·s·h floats), three of b·s floats for the loss, the head's input gradient
    assert sorted(sizes) == [128, 128, 128, 4096, 4096]


def test_vocabulary_parallel_loss_keeps_a_t_th_of_the_logits(node):
    kwargs = {"vocab": 8000, "hidden": 32, "seq": 64, "batch": 1, "fake": True,
              "dtype": torch.bfloat16}
    _, one = node.run(tp.vocab_parallel_step, world_size=1,
                      kwargs={"parallel": False, **kwargs}).results[0]
    _, eight = node.run(tp.vocab_parallel_step, world_size=8, kwargs=kwargs).results[0]
    logits_fp32 = 64 * 8000 * 4
    assert one >= logits_fp32 and eight < one / 4


def test_forward_only_measures_the_same_activations_and_no_backward(node):
    both, _ = tp.measure_layer(node, 2, **TRAINING)
    forward, _ = tp.measure_layer(node, 2, backward=False, **TRAINING)
    assert forward.activations == both.activations
    assert forward.backward == [] and len(both.backward) == 2
    assert forward.compute < both.compute / 2
