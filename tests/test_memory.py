"""Simulated device memory: every storage a rank creates is counted, by category, with exact
byte counts; it is forgotten when torch frees it; meta tensors count without allocating;
going over capacity raises an out-of-memory error worded like PyTorch's; FSDP2 shards the
parameters."""

import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc
from simcluster import accounting
from simcluster.accounting import HostShare
from simcluster.clock import RankClock
from simcluster.memory import CATEGORIES, MemoryAccount

GiB, MiB = 2**30, 2**20
F32 = 4  # bytes per float32 element
STEP = torch.tensor(0.0).element_size()  # Adam's per-parameter "step" is an fp32 scalar


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100")


def _in_use():
    """This rank's memory in use right now, by category, plus "total"."""
    memory = accounting.current().memory
    return {**memory.in_use, "total": memory.total}


def _nonzero(snapshot):
    return {k: v for k, v in snapshot.items() if v and k != "total"}


# ======================================================= categories, exactly
def _adam_step(batch, width):
    torch.manual_seed(0)
    log = {"start": _in_use()}
    model = nn.Linear(width, width)
    log["model"] = _in_use()
    opt = torch.optim.Adam(model.parameters(), lr=0.1)
    x = torch.randn(batch, width)
    log["input"] = _in_use()
    y = model(x)
    log["forward"] = _in_use()
    loss = y.square().mean()
    loss.backward()
    log["backward"] = _in_use()
    del y, loss
    log["graph freed"] = _in_use()
    opt.step()
    log["step"] = _in_use()
    opt.zero_grad()
    log["zero_grad"] = _in_use()
    return log


@pytest.fixture(scope="module")
def adam_run(node):
    return node.run(_adam_step, world_size=1, args=(64, 1024))


def test_parameters_gradients_and_adam_state_have_exact_sizes(adam_run):
    log = adam_run.results[0]
    batch, width = 64, 1024
    params = F32 * (width * width + width)  # weight and bias
    x = F32 * batch * width
    y = F32 * batch * width
    loss = F32  # the scalar that survives: mean()'s output
    assert _nonzero(log["start"]) == {}
    assert _nonzero(log["model"]) == {"parameters": params}
    assert _nonzero(log["input"]) == {"parameters": params, "other": x}
    assert _nonzero(log["forward"]) == {"parameters": params, "activations": y, "other": x}
    assert _nonzero(log["backward"]) == {"parameters": params, "gradients": params,
                                         "activations": y, "other": x + loss}
    assert _nonzero(log["graph freed"]) == {"parameters": params, "gradients": params,
                                            "other": x}
    # Adam: exp_avg and exp_avg_sq for each parameter, plus one fp32 "step" per parameter
    adam = 2 * params + 2 * STEP
    assert _nonzero(log["step"]) == {"parameters": params, "gradients": params,
                                     "optimizer state": adam, "other": x}
    assert _nonzero(log["zero_grad"]) == {"parameters": params, "optimizer state": adam,
                                          "other": x}
    for snapshot in log.values():
        assert snapshot["total"] == sum(snapshot[c] for c in CATEGORIES)


def test_peak_is_the_sum_of_the_categories_at_the_peak(adam_run):
    peak = adam_run.peak_memory(0)
    assert set(peak) == set(CATEGORIES) | {"total"}
    assert peak["total"] == sum(peak[c] for c in CATEGORIES)
    memory = adam_run.recorder.memories[0]
    assert peak["total"] == memory.peak == max(total for _, total in memory.history)
    # the peak is inside opt.step(): everything that lives then, plus the step's temporaries
    params = F32 * (1024 * 1024 + 1024)
    assert peak["parameters"] == params and peak["gradients"] == params
    assert peak["optimizer state"] >= 2 * params + 2 * STEP
    assert all(peak["total"] >= s["total"] for s in adam_run.results[0].values())
    assert adam_run.summary().rows[0]["peak_memory_GiB"] == peak["total"] / GiB


def test_each_category_has_its_own_peak(adam_run):
    """The activations peak after the forward pass; the total peaks in opt.step(), when
    they are gone: ``category_peaks`` and the summary's ``peak_activations_GiB`` give
    the former, ``peak_memory`` the latter."""
    peaks, at_peak = adam_run.category_peaks(0), adam_run.peak_memory(0)
    activations = F32 * 64 * 1024
    assert at_peak["activations"] == 0
    assert peaks["activations"] == activations
    assert adam_run.summary().rows[0]["peak_activations_GiB"] == activations / GiB
    assert "peak activations GiB" in str(adam_run.summary())
    for category in CATEGORIES:
        assert peaks[category] >= at_peak[category]
        assert peaks[category] >= max(s[category] for s in adam_run.results[0].values())


def _peaks_after_reset():
    x = torch.empty(1024, device="meta")
    with sc.fake_tensors():
        y = nn.Linear(256, 256)(torch.randn(8, 256))
    del x, y
    sc.reset_peak_memory()
    return dict(accounting.current().memory.category_peaks)


def test_reset_peak_memory_resets_the_category_peaks(node):
    peaks = node.run(_peaks_after_reset, world_size=1).results[0]
    assert peaks["activations"] == 0 and peaks["other"] == 0


def _mlp_forward(batch, grad):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(256, 512), nn.ReLU(), nn.Linear(512, 128))
    x = torch.randn(batch, 256)
    before = _in_use()
    with torch.set_grad_enabled(grad):
        y = model(x)
    during = _in_use()
    if grad:
        y.sum().backward()
    del y
    gc.collect()
    return before, during, _in_use()


def test_activations_live_from_forward_until_the_graph_is_freed(node):
    batch = 32
    before, during, after = node.run(_mlp_forward, world_size=1, args=(batch, True)).results[0]
    assert before["activations"] == 0
    # Linear(256, 512)'s output is dropped once ReLU has read it (ReLU saves its own
    # output for backward); what remains is ReLU's output and the model's output.
    assert during["activations"] == F32 * batch * (512 + 128)
    assert after["activations"] == 0
    assert after["gradients"] == F32 * (256 * 512 + 512 + 512 * 128 + 128)


def test_no_grad_forward_keeps_no_activations(node):
    batch = 32
    before, during, after = node.run(_mlp_forward, world_size=1, args=(batch, False)).results[0]
    assert during["activations"] == 0
    assert during["other"] - before["other"] == F32 * batch * 128  # just the output
    assert after["total"] == before["total"]


# ============================================================ freeing
def _alloc_and_free():
    out = {"start": _in_use()["total"]}
    t = torch.ones(MiB // F32)           # a real 1 MiB tensor
    v = t[:10]                           # a view shares the storage: no new memory
    out["tensor and view"] = _in_use()["total"]
    del t
    out["view keeps it alive"] = _in_use()["total"]
    del v
    out["freed"] = _in_use()["total"]
    m = torch.empty(GiB, dtype=torch.uint8, device="meta")
    out["meta"] = _in_use()["total"]
    del m
    out["meta freed"] = _in_use()["total"]
    return out


def test_memory_is_freed_when_tensors_die(node):
    out = node.run(_alloc_and_free, world_size=1).results[0]
    start = out["start"]
    assert out["tensor and view"] == start + MiB
    assert out["view keeps it alive"] == start + MiB
    assert out["freed"] == start
    assert out["meta"] == start + GiB
    assert out["meta freed"] == start


def _rss():
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    return 0


def _big_meta_model():
    rss = _rss()
    model = nn.Linear(65536, 65536, device="meta")  # 16 GiB of fp32 weights
    t = torch.empty(40 * GiB, dtype=torch.uint8, device="meta")
    used = _in_use()
    return used, _rss() - rss, model.weight.is_meta and t.is_meta


def test_meta_tensors_count_without_allocating(node):
    used, rss_growth, meta = node.run(_big_meta_model, world_size=1).results[0]
    assert meta
    assert used["parameters"] == F32 * (65536 * 65536 + 65536)
    assert used["other"] == 40 * GiB
    assert used["total"] > 56 * GiB
    assert rss_growth < 256 * MiB  # this laptop did not allocate 56 GiB


# ====================================================== out of memory
def _oom(rank, first, second):
    if dist.get_rank() == rank:
        keep = torch.empty(first, dtype=torch.uint8, device="meta")  # noqa: F841
        torch.empty(second, dtype=torch.uint8, device="meta")
    dist.barrier()


def test_allocating_beyond_capacity_raises_out_of_memory(node):
    with pytest.raises(sc.OutOfMemoryError) as info:
        node.run(_oom, world_size=2, args=(1, 10 * GiB, 100 * GiB))
    e = info.value
    assert isinstance(e, torch.OutOfMemoryError) and isinstance(e, sc.SimulationError)
    assert e.rank == 1 and e.requested == 100 * GiB and e.capacity == 80 * GiB
    assert e.in_use["other"] == 10 * GiB and sum(e.in_use.values()) == 10 * GiB
    message = str(e)
    assert "rank 1" in message
    assert "Tried to allocate 100.00 GiB" in message
    assert "total capacity of 80.00 GiB" in message
    assert "of which 70.00 GiB is free" in message
    assert "In use: other 10.00 GiB" in message
    assert "A100-80GB" in message


def test_out_of_memory_counts_what_is_already_in_use(node):
    """70 GiB and then 20 GiB: each fits alone, together they do not."""
    with pytest.raises(sc.OutOfMemoryError, match="Tried to allocate 20.00 GiB") as info:
        node.run(_oom, world_size=2, args=(0, 70 * GiB, 20 * GiB))
    assert info.value.rank == 0


def _oom_names_categories():
    nn.Linear(65536, 65536, device="meta")  # dies at once: its 16 GiB are freed
    model = nn.Linear(65536, 65536 * 4, device="meta")  # 64 GiB of parameters
    torch.empty(20 * GiB, dtype=torch.uint8, device="meta")
    return model


def test_refilling_a_freed_storage_beyond_capacity_is_out_of_memory():
    """FSDP2 frees an unsharded parameter with ``resize_(0)`` after its forward and
    refills it with ``resize_(n)`` for the backward: the refill needs ``n`` free bytes,
    on top of what is in use by then."""
    account = MemoryAccount(0, HostShare("a 1000-byte device", 1000, "a test device"),
                            RankClock())
    parameter, activations = torch.UntypedStorage(600), torch.UntypedStorage(500)
    account.allocate(1, 600, "parameters", parameter)
    account.resize(1, 0, parameter)                  # resharded: 0 bytes
    account.allocate(2, 500, "activations", activations)
    account.resize(1, 400, parameter)                # 900 of 1000: fits
    assert (account.total, account.in_use["parameters"]) == (900, 400)
    with pytest.raises(sc.OutOfMemoryError) as error:
        account.resize(1, 600, parameter)            # 200 more: 1100 of 1000
    assert error.value.requested == 200
    assert account.total == 900                      # the failed refill took nothing


def test_out_of_memory_message_names_the_categories_in_use(node):
    with pytest.raises(sc.OutOfMemoryError) as info:
        node.run(_oom_names_categories, world_size=1)
    assert "In use: parameters 64.00 GiB" in str(info.value)
    assert info.value.in_use["parameters"] == F32 * (65536 * 65536 * 4 + 65536 * 4)


def _catch_oom():
    keep = torch.empty(GiB, dtype=torch.uint8, device="meta")  # noqa: F841
    try:
        torch.empty(100 * GiB, dtype=torch.uint8, device="meta")
    except torch.OutOfMemoryError as e:  # what a PyTorch user writes
        caught = type(e).__name__
    return caught, _in_use()["total"]


def test_out_of_memory_can_be_caught_inside_the_rank(node):
    caught, total = node.run(_catch_oom, world_size=1).results[0]
    assert caught == "OutOfMemoryError"
    assert total == GiB  # the failed allocation was not counted


# ================================================== sharded parameters
def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512), nn.ReLU(),
                         nn.Linear(512, 10))


MLP_PARAM_BYTES = F32 * (2 * (512 * 512 + 512) + 512 * 10 + 10)


def _ddp_parameter_memory():
    from torch.nn.parallel import DistributedDataParallel as DDP
    ddp = DDP(_mlp())
    gc.collect()
    used = _in_use()
    del ddp
    return used


def _fsdp_parameter_memory():
    from torch.distributed.fsdp import fully_shard
    model = _mlp()
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer)
    fully_shard(model)
    gc.collect()
    local = sum(p.to_local().numel() * p.to_local().element_size()
                for p in model.parameters())
    return _in_use(), local


@pytest.fixture(scope="module")
def sharded(node):
    world = 4
    ddp = node.run(_ddp_parameter_memory, world_size=world).results
    fsdp = node.run(_fsdp_parameter_memory, world_size=world).results
    return world, ddp, fsdp


def test_ddp_keeps_every_parameter_on_every_rank(sharded):
    world, ddp, _ = sharded
    assert all(used["parameters"] == MLP_PARAM_BYTES for used in ddp)


def test_fsdp2_frees_the_full_parameters_and_keeps_one_shard(sharded):
    """The sharded parameters are about 1/world_size of DDP's (dim 0 is padded to a multiple
    of world_size: Linear(512, 10) keeps 3 of 12 rows on each of 4 ranks)."""
    world, _, fsdp = sharded
    for used, local in fsdp:
        assert local == pytest.approx(MLP_PARAM_BYTES / world, rel=0.01)
        # everything this rank holds now is its (padded) shard and a few bytes of
        # bookkeeping: the full parameters are gone
        assert used["total"] == pytest.approx(MLP_PARAM_BYTES / world, rel=0.01)
        assert used["total"] >= local


def test_fsdp2_parameter_memory_is_one_shard_of_ddps(sharded):
    world, ddp, fsdp = sharded
    for used, local in fsdp:
        assert used["parameters"] == pytest.approx(ddp[0]["parameters"] / world, rel=0.01)
        assert used["parameters"] >= local  # the last rank's shard is padded


# ============================= buffers handed to a collective are freed on time
def _drop_buffer_while_rank0_keeps_its_work():
    t = torch.ones(MiB // F32)
    work = dist.all_reduce(t, async_op=True)
    work.wait()
    kept = work if dist.get_rank() == 0 else None
    del t, work
    gc.collect()
    total = _in_use()["total"]
    dist.barrier()
    return total, kept is not None


def test_a_rank_holding_its_work_does_not_keep_other_ranks_buffers(node):
    results = node.run(_drop_buffer_while_rank0_keeps_its_work, world_size=2).results
    assert results[1] == (0, False)


def _fsdp_train_step():
    from torch.distributed.fsdp import fully_shard
    model = _mlp()
    for layer in (model[0], model[2], model[4]):
        fully_shard(layer)
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model(torch.randn(16, 512)).square().mean().backward()
    local_grads = sum(p.grad.to_local().numel() * F32 for p in model.parameters())
    after_backward = _in_use()["gradients"]
    opt.step()
    opt.zero_grad()
    gc.collect()
    return local_grads, after_backward, _in_use()["gradients"]


def test_fsdp2_keeps_only_sharded_gradients(node):
    for local, after_backward, after_zero_grad in node.run(_fsdp_train_step,
                                                           world_size=4).results:
        assert after_backward == pytest.approx(MLP_PARAM_BYTES / 4, rel=0.01)
        assert after_backward >= local  # the last rank's shard is padded
        assert after_zero_grad == 0
