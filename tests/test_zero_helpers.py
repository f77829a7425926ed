"""workbook.lesson07_zero_fsdp.demos:
the ZeRO stages as torch spells them, measured on the simulated cluster,
against the ZeRO paper's formula (docs/reference-numbers.md, "ZeRO")."""

import pytest
import torch

import simcluster as sc
from workbook.lesson07_zero_fsdp import demos as zero

N = 4


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100")


@pytest.fixture(scope="module")
def stages(node):
    return {s: zero.measure_stage(node, s, N)[0] for s in range(4)}


def test_mixed_precision_adam_on_fp32_parameters_is_adam():
    torch.manual_seed(0)
    ours, theirs = torch.nn.Linear(8, 8), torch.nn.Linear(8, 8)
    theirs.load_state_dict(ours.state_dict())
    opt_ours = zero.MixedPrecisionAdam(ours.parameters(), lr=1e-2)
    opt_theirs = torch.optim.Adam(theirs.parameters(), lr=1e-2, foreach=False)
    for step in range(3):
        x = torch.randn(4, 8, generator=torch.Generator().manual_seed(step))
        for model, opt in ((ours, opt_ours), (theirs, opt_theirs)):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
    for a, b in zip(ours.parameters(), theirs.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def test_mixed_precision_adam_keeps_twelve_bytes_per_parameter():
    model = torch.nn.Linear(16, 16, bias=False, dtype=torch.bfloat16)
    opt = zero.MixedPrecisionAdam(model.parameters())
    model(torch.randn(2, 16, dtype=torch.bfloat16)).float().sum().backward()
    opt.step()
    state = opt.state[model.weight]
    assert sum(t.numel() * t.element_size() for t in state.values()
               if isinstance(t, torch.Tensor)) == zero.K * model.weight.numel()
    assert state["master"].dtype == torch.float32 and model.weight.dtype == torch.bfloat16


def test_formula_gives_the_papers_table():
    got = [zero.model_state_bytes(7.5e9, 64, s) / zero.GB for s in range(4)]
    assert got == pytest.approx([120, 31.4, 16.6, 1.9], abs=0.05)
    assert zero.model_state_bytes(7.5e9, 1, 3) == zero.model_state_bytes(7.5e9, 1, 0)


def test_stage_memory_per_category_follows_the_formula(stages):
    per = {s: r.per_parameter(r.state) for s, r in stages.items()}
    assert [per[s]["optimizer state"] for s in range(4)] == [12, 12 / N, 12 / N, 12 / N]
    assert [per[s]["gradients"] for s in range(4)] == [2, 2, 2 / N, 2 / N]
    assert [per[s]["parameters"] for s in range(4)] == [2, 2, 2 / N, 2 / N]
    # between forward and backward: stage 2 holds the whole model, stage 3 one layer of 8
    assert stages[2].param_peak / stages[2].psi == 2 + 2 / N
    assert stages[3].param_peak / stages[3].psi == 2 / N + 2 / 8


def test_all_stages_train_to_the_same_parameters(stages):
    reference = torch.cat([p.flatten() for p in stages[0].results[0]["params"]])
    zero1 = torch.cat([p.flatten() for p in stages[1].results[0]["params"]])
    assert torch.equal(zero1, reference)
    for s in (2, 3):
        results = stages[s].results
        whole = torch.cat([torch.cat([r["params"][i] for r in results]).flatten()
                           for i in range(len(results[0]["params"]))])
        assert torch.equal(whole, reference)


def test_communication_is_two_psi_and_three_psi(stages):
    ring = (N - 1) / N
    sent = {s: r.bytes_sent / (2 * r.psi) for s, r in stages.items()}   # in Ψ bf16 values
    assert sent[2] == pytest.approx(2 * ring)
    assert sent[3] == pytest.approx(3 * ring)
    assert sent[0] == pytest.approx(2 * ring, rel=1e-3)      # + DDP's bucket-order broadcast
    assert sent[1] > sent[0] + 0.9 * ring                     # ZeroRedundancyOptimizer broadcasts
    assert stages[3].ops == {"all_gather": 16, "reduce_scatter": 8}
    assert stages[2].ops == {"all_gather": 8, "reduce_scatter": 8}


def test_policies_need_fsdp2(node):
    with pytest.raises(sc.SimulationError, match="stage 2 or 3"):
        node.run(zero.zero_step, world_size=2, args=(1,), kwargs={"offload": True})


def test_mixed_precision_policy_keeps_fp32_shards(node):
    report = zero.measure_stage(node, 3, N, mixed=True)[0]
    per = report.per_parameter(report.state)
    assert per["parameters"] == 4 / N and per["gradients"] == 4 / N
    assert per["optimizer state"] == pytest.approx(8 / N, rel=1e-2)
    # two bf16 all-gathers and one fp32 reduce-scatter of Ψ values, each (N-1)/N
    assert report.bytes_sent / report.psi == pytest.approx((2 + 2 + 4) * (N - 1) / N)


def test_cpu_offload_moves_model_states_to_the_host_and_costs_time(node):
    plain, offloaded = (zero.measure_stage(node, 3, N, offload=flag)[0] for flag in (False, True))
    states = ("parameters", "gradients", "optimizer state")
    assert all(not offloaded.state.get(k) for k in states)
    assert {k: offloaded.host[k] for k in states} == {k: plain.state[k] for k in states}
    assert all(offloaded.host_transfers.values()) and not any(plain.host_transfers.values())
    assert offloaded.seconds > plain.seconds


@pytest.mark.slow
def test_explicit_prefetch_overlaps_all_gathers(node):
    wide = {"layers": 4, "width": 1024, "batch": 512, "fake": True}
    (plain, run_plain), (ahead, run_ahead) = (zero.measure_stage(node, 3, 4, prefetch=p, **wide)
                                              for p in (False, True))
    assert ahead.ops == plain.ops and ahead.param_peak == plain.param_peak
    assert run_ahead.summary().rows[0]["overlap_s"] > run_plain.summary().rows[0]["overlap_s"]
    assert ahead.seconds < plain.seconds


def test_zero3_communication_does_not_shrink_with_gpus_and_loses_when_exposed():
    steps = {g: zero.zero3_vs_tp_step(g) for g in (384, 1536)}
    assert steps[1536]["compute"] == pytest.approx(steps[384]["compute"] / 4)
    assert steps[1536]["zero3_comm"] == pytest.approx(steps[384]["zero3_comm"], rel=0.05)
    assert steps[384]["zero3_exposed"] < steps[384]["ptdp"]       # few GPUs: ZeRO-3 wins
    assert steps[1536]["zero3_exposed"] > steps[1536]["ptdp"]     # many GPUs: it loses
