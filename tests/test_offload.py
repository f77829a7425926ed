"""CPU offload: pinned host memory and the PCIe link of each simulated GPU.

A rank's CPU tensors live on its simulated GPU; pinned memory lives on the simulated host
(``pin_memory()`` works with no accelerator), in the rank's share of its node's host memory.
FSDP2's ``CPUOffloadPolicy()``, with its defaults, keeps sharded parameters, gradients and
Adam's state there: device memory goes down, and every all-gather first copies its shard
over PCIe (host->device), every reduce-scatter's output goes back (device->host), and the
optimizer step runs at the host's speed — all visible on the timeline.
"""

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard

import simcluster as sc
from simcluster import accounting, spec
from simcluster.accounting import DEVICE_TO_HOST, HOST_TO_DEVICE

N, W, LAYERS, WORLD = 1 << 18, 512, 4, 4
F32 = 4
SHARD = LAYERS * (W * W + W) * F32 // WORLD   # one rank's fp32 parameters (even split)


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100")


def _used(account):
    return {k: v for k, v in account.in_use.items() if v}


# -------------------------------------------------------------- pinned memory
def _pin():
    acc = accounting.current()
    x = torch.arange(N, dtype=torch.float32)
    before = (_used(acc.memory), _used(acc.host), x.is_pinned())
    pinned = x.pin_memory()
    del x
    empty = torch.empty(N, pin_memory=True)
    return (before, (_used(acc.memory), _used(acc.host)), pinned.is_pinned(),
            empty.is_pinned(), torch.equal(pinned, torch.arange(N, dtype=torch.float32)))


def test_pin_memory_copies_into_host_memory_over_pcie(node):
    run = node.run(_pin, world_size=1)
    before, after, pinned, empty_pinned, same = run.results[0]
    assert before == ({"other": N * F32}, {}, False)
    # the device copy is gone (dropped), the pinned copy and the pinned empty are on the host
    assert after[0] == {} or after[0] == {"other": 0}
    assert after[1] == {"other": 2 * N * F32}
    assert pinned and empty_pinned and same
    # torch.equal ran on the GPU: it read the pinned copy back over the link
    assert run.recorder.host_transfers[0] == {HOST_TO_DEVICE: N * F32, DEVICE_TO_HOST: N * F32}
    link = spec.PCIE_GEN4
    seconds = link.latency + N * F32 / (25 * spec.GB)
    transfers = [e for e in run.clock(0).events if e.label == DEVICE_TO_HOST]
    assert len(transfers) == 1 and transfers[0].duration == pytest.approx(seconds)


def test_host_memory_is_a_share_of_the_nodes(node):
    assert node.spec.host_share(3)[0] == 1024 * spec.GiB // 8
    h100 = sc.Cluster.preset("dgx-h100").spec
    assert h100.host_share(0)[0] == 2048 * spec.GiB // 8
    assert h100.host_of(0).link.effective_bandwidth == pytest.approx(50 * spec.GB)


def _pin_too_much():
    torch.empty(3 * 2**20, pin_memory=True)   # 12 MiB of pinned memory


def test_pinning_beyond_the_host_share_raises_out_of_memory():
    host = spec.HostSpec("tiny host", 16 * 2**20, 1e11, 1e12, spec.PCIE_GEN4)
    cluster = sc.Cluster(sc.ClusterSpec("tiny", (sc.NodeSpec("n0", 2, host=host),)))
    with pytest.raises(sc.OutOfMemoryError) as err:
        cluster.run(_pin_too_much, world_size=2)
    message = str(err.value)
    assert "host memory of n0" in message and "Offload less" in message


# ------------------------------------------- the roofline with host memory held
M = 1024   # a 1024 x 1024 fp32 matmul: compute-bound at fp32, memory-bound in TF32


def _device_op_times():
    """Simulated seconds of an fp32 matmul (TF32 allowed) and of an add, on the device."""
    a, b = torch.ones(M, M), torch.ones(M, M)
    times = []
    for op in (torch.mm, torch.add):
        start = sc.now()
        op(a, b)
        times.append(sc.now() - start)
    return times


def _with_and_without_host_memory():
    torch.set_float32_matmul_precision("high")
    without = _device_op_times()
    held = torch.ones(16, pin_memory=True)   # the rank now holds host memory  # noqa: F841
    return without, _device_op_times()


def test_a_device_op_costs_the_same_while_the_rank_holds_host_memory(node):
    """Holding pinned memory sends every op through the host-aware dispatch; an op on
    device tensors still takes its device roofline: the TF32 peak for an fp32 matmul the
    rank allows TF32 for, its output's bytes for an add."""
    without, with_host = node.run(_with_and_without_host_memory, world_size=1).results[0]
    assert with_host == pytest.approx(without, rel=1e-9)
    matmul, add = without
    a100 = node.spec.device_of(0)
    assert matmul == pytest.approx(2 * M**3 / a100.flops_for("tf32"), rel=1e-9)
    assert add == pytest.approx(3 * M * M * F32 / a100.hbm_bandwidth, rel=1e-9)


def _host_add():
    a, b = torch.ones(N, pin_memory=True), torch.ones(N, pin_memory=True)
    start = sc.now()
    a.add_(b)   # on host tensors: the host's CPUs run it
    return sc.now() - start


def test_an_op_on_host_tensors_takes_the_hosts_roofline_of_its_inputs_and_outputs(node):
    seconds = node.run(_host_add, world_size=1).results[0]
    _, host_bytes_per_s, _ = node.spec.host_share(0)
    assert seconds == pytest.approx(3 * N * F32 / host_bytes_per_s, rel=1e-9)   # a, b read; a written


# ------------------------------------------------------ FSDP2 CPUOffloadPolicy
def _fsdp(offload, fake=False, steps=2, mp=False, accumulate=1):
    """FSDP2 on an MLP of ``LAYERS`` equal layers, Adam; returns memory per account at the
    end, the host transfers per step and (real tensors) the local parameters."""
    acc = accounting.current()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    kwargs = {"mesh": mesh}
    if offload:
        kwargs["offload_policy"] = CPUOffloadPolicy()
    if mp:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                   reduce_dtype=torch.float32)
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        torch.manual_seed(0)
        model = nn.Sequential(*[nn.Linear(W, W) for _ in range(LAYERS)])
        for layer in model:
            fully_shard(layer, **kwargs)
        fully_shard(model, **kwargs)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
        torch.manual_seed(1 + dist.get_rank())
        per_step = []
        for _ in range(steps):
            before = dict(acc.recorder.host_transfers[acc.rank])
            for _ in range(accumulate):
                model(torch.randn(8, W)).sum().backward()
            optimizer.step()
            optimizer.zero_grad()
            after = acc.recorder.host_transfers[acc.rank]
            per_step.append({k: after[k] - before[k] for k in after})
        memory = (_used(acc.memory), _used(acc.host))
        params = None if fake else [p.to_local().detach().clone() for p in model.parameters()]
        return memory, per_step, params


@pytest.fixture(scope="module")
def fsdp_runs(node):
    return {offload: node.run(_fsdp, world_size=WORLD, args=(offload,))
            for offload in (False, True)}


def test_offload_with_defaults_trains_like_no_offload(fsdp_runs):
    for plain, offloaded in zip(fsdp_runs[False].results, fsdp_runs[True].results):
        assert all(torch.equal(a, b) for a, b in zip(plain[2], offloaded[2]))


def test_offload_moves_parameters_and_adam_state_to_the_host(fsdp_runs):
    adam = 2 * SHARD + 2 * LAYERS * F32        # exp_avg, exp_avg_sq and a step per tensor
    (device, host), _, _ = fsdp_runs[True].results[0]
    (plain_device, plain_host), _, _ = fsdp_runs[False].results[0]
    assert plain_device["parameters"] == SHARD and plain_device["optimizer state"] == adam
    assert plain_host == {}
    assert host == {"parameters": SHARD, "optimizer state": adam}
    assert "parameters" not in device and "optimizer state" not in device
    assert fsdp_runs[True].peak_memory(0)["total"] < fsdp_runs[False].peak_memory(0)["total"]


def test_offload_copies_each_shard_in_and_each_gradient_out_per_step(fsdp_runs):
    """Forward and backward all-gather every layer (host->device: 2 shards per step); the
    reduce-scatter's output goes back (device->host: one shard of gradients per step)."""
    _, per_step, _ = fsdp_runs[True].results[0]
    for step in per_step:
        assert step == {HOST_TO_DEVICE: pytest.approx(2 * SHARD, rel=0.3),
                        DEVICE_TO_HOST: SHARD}
    assert fsdp_runs[False].recorder.host_transfers[0] == {HOST_TO_DEVICE: 0,
                                                          DEVICE_TO_HOST: 0}


def test_offload_costs_time_on_the_timeline(fsdp_runs):
    plain, offloaded = fsdp_runs[False], fsdp_runs[True]
    events = offloaded.clock(0).events
    copies = [e for e in events if e.lane == "comm" and e.label in (HOST_TO_DEVICE,
                                                                   DEVICE_TO_HOST)]
    moved = sum(offloaded.recorder.host_transfers[0].values())
    assert sum(e.duration for e in copies) >= moved / (25 * spec.GB)
    assert any(e.label.startswith("host: ") for e in events)   # Adam ran on the CPUs
    assert offloaded.elapsed > plain.elapsed + sum(e.duration for e in copies) / 2


def test_offload_on_fake_tensors_matches_real(node, fsdp_runs):
    fake = node.run(_fsdp, world_size=WORLD, args=(True, True))
    real = fsdp_runs[True]
    assert [r[:2] for r in fake.results] == [r[:2] for r in real.results]   # memory, copies


def test_offload_with_bf16_parameters_copies_fp32_shards(node, fsdp_runs):
    """FSDP2 copies the fp32 shard to the GPU, then casts it: PCIe carries 4 bytes each."""
    mixed = node.run(_fsdp, world_size=WORLD, args=(True, False, 2, True))
    assert mixed.results[0][1] == fsdp_runs[True].results[0][1]


def test_offload_with_gradient_accumulation(node):
    """The second micro-batch's gradients are added into the host gradients: they cross
    the link too, and the result equals the same accumulation without offload."""
    plain = node.run(_fsdp, world_size=WORLD, args=(False, False, 1, False, 2)).results
    offloaded = node.run(_fsdp, world_size=WORLD, args=(True, False, 1, False, 2)).results
    for a, b in zip(plain, offloaded):
        assert all(torch.allclose(x, y, rtol=1e-6, atol=1e-7) for x, y in zip(a[2], b[2]))
    assert offloaded[0][1][0][DEVICE_TO_HOST] == 2 * SHARD
