"""DistributedDataParallel on fake tensors, as written: ``DDP(model)`` inside
``sc.fake_tensors()``, several steps.

DDP's C++ reducer keeps its bookkeeping (the parameter shapes it checks across ranks at
construction, the bucket order rank 0 broadcasts after the first step) in small tensors
it reads through raw pointers; on fake tensors both used to stop with "The tensor has a
non-zero number of elements, but its data is not allocated yet". A fake run must issue
exactly the collectives of the same run on real tensors, at the same simulated times,
with the same memory, since that is what lets a lesson measure a model too large to run.
"""

import contextlib

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc

WIDTH, LAYERS, BATCH = 512, 4, 8


def make_model(width=WIDTH, layers=LAYERS):
    """An MLP whose weights are 1 MiB each, so that bucket caps split it differently."""
    return nn.Sequential(*[m for _ in range(layers) for m in (nn.Linear(width, width), nn.ReLU())])


def gradient_bytes(model):
    return sum(p.numel() * p.element_size() for p in model.parameters())


def train(fake, steps=3, micro_batches=1, world_size=4, **ddp_kwargs):
    """Train ``make_model()`` under DDP for ``steps`` optimizer steps of ``micro_batches``
    each (all but the last under ``no_sync()``); return the run and the per-step
    collective counts rank 0 saw."""

    def fn():
        with sc.fake_tensors() if fake else contextlib.nullcontext():
            torch.manual_seed(0)
            ddp = DDP(make_model(), **ddp_kwargs)
            optimizer = torch.optim.Adam(ddp.parameters())
            called = [len(sc.collectives_called())]
            for _ in range(steps):
                for _ in range(micro_batches - 1):
                    with ddp.no_sync():
                        ddp(torch.randn(BATCH, WIDTH)).sum().backward()
                ddp(torch.randn(BATCH, WIDTH)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
                called.append(len(sc.collectives_called()))
            return called

    return sc.Cluster.preset("dgx-a100", nodes=1).run(fn, world_size=world_size)


def records(run):
    return [(c.op, c.ranks, c.nbytes, c.start, c.end) for c in run.collectives]


def all_reduced_bytes_per_step(run):
    """Bytes all-reduced in each optimizer step, from the simulator's record."""
    per_step, ops = [], [c for c in run.collectives]
    bounds = run.results[0]
    for start, end in zip(bounds, bounds[1:]):
        per_step.append(sum(c.nbytes for c in ops[start:end] if c.op == "all_reduce"))
    return per_step


@pytest.mark.parametrize("bucket_cap_mb", [25, 1, 0.5])
def test_fake_ddp_matches_real_ddp_step_for_step(bucket_cap_mb):
    fake = train(True, bucket_cap_mb=bucket_cap_mb)
    real = train(False, bucket_cap_mb=bucket_cap_mb)
    # the same collectives (construction checks, the bucket rebuild's broadcasts, every
    # bucket's all-reduce), with the same sizes, at the same simulated times
    assert records(fake) == records(real)
    assert fake.elapsed == real.elapsed
    for rank in range(4):
        assert fake.peak_memory(rank) == real.peak_memory(rank)
    # every step all-reduces every gradient byte exactly once
    grads = gradient_bytes(make_model())
    assert all_reduced_bytes_per_step(fake) == [grads] * 3


def test_bucket_cap_sets_the_number_of_all_reduces():
    # after the first step DDP rebuilds its buckets: 1 MiB weights in 1 MiB buckets
    # give one all-reduce per layer; 25 MB holds the whole model
    per_step = {}
    for cap in (25, 1):
        run = train(True, bucket_cap_mb=cap)
        ops = [c.op for c in run.collectives]
        bounds = run.results[0]
        per_step[cap] = ops[bounds[-2]:bounds[-1]].count("all_reduce")
    assert per_step == {25: 1, 1: LAYERS}


def test_no_sync_all_reduces_once_per_optimizer_step():
    fake = train(True, micro_batches=4, bucket_cap_mb=1)
    real = train(False, micro_batches=4, bucket_cap_mb=1)
    assert records(fake) == records(real)
    grads = gradient_bytes(make_model())
    assert all_reduced_bytes_per_step(fake) == [grads] * 3
    for rank in range(4):
        assert fake.peak_memory(rank) == real.peak_memory(rank)


def test_fake_ddp_checks_the_models_agree():
    """DDP still compares the ranks' parameter shapes at construction on fake tensors."""

    def fn():
        with sc.fake_tensors():
            width = WIDTH if dist.get_rank() == 0 else WIDTH // 2
            DDP(make_model(width=width))

    with pytest.raises(sc.RankError, match="appears not to match sizes of the same param in process 0"):
        sc.Cluster.preset("dgx-a100", nodes=1).run(fn, world_size=2)


def test_large_model_is_accounted_without_being_allocated():
    """A 16.8M-parameter model (67 MB of fp32 per copy) on 8 ranks: its gradients are
    all-reduced each step and its memory is accounted, from shapes alone."""
    width, layers = 2048, 4

    def fn():
        with sc.fake_tensors():
            ddp = DDP(make_model(width, layers))
            optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
            for _ in range(2):
                ddp(torch.randn(BATCH, width)).sum().backward()
                optimizer.step()
                optimizer.zero_grad()
            return sc.memory_in_use()

    run = sc.Cluster.preset("dgx-a100", nodes=1).run(fn, world_size=8)
    psi = 4 * (width * width + width) * layers   # bytes of fp32 parameters
    reduces = [c for c in run.collectives if c.op == "all_reduce"]
    assert sum(c.nbytes for c in reduces) == 2 * psi
    assert all(c.ranks == tuple(range(8)) or list(c.ranks) == list(range(8)) for c in reduces)
    assert run.results[0]["parameters"] == psi
    peak = run.peak_memory(0)
    # the total peaks in backward, before the last layer's gradient is accumulated into
    # its .grad (until then it is "other", like an activation's gradient)
    assert peak["parameters"] == psi and peak["gradients"] <= psi
    assert run.category_peaks(0)["gradients"] == psi
    assert psi * 2 <= peak["total"] < psi * 4


def _what_stays_real():
    from simcluster._torch_internals import is_fake

    with sc.fake_tensors():
        counts = torch.tensor([1, 2, 3])              # made from real data: real
        counts[0] = 5                                 # and written in place
        total = int(counts.sum().item())              # so it can be read back
        weights = torch.randn(4, 4)                   # floating point: fake
        index = torch.zeros(4, dtype=torch.long)      # made by a factory: fake
        gathered = weights[counts[:2] % 4]            # touches a fake tensor: fake
        return (total, is_fake(counts), is_fake(weights), is_fake(index), is_fake(gathered))


def test_ops_on_real_integer_tensors_alone_run_real_inside_fake_tensors():
    run = sc.Cluster.preset("dgx-a100", nodes=1).run(_what_stays_real, world_size=1)
    assert run.results[0] == (10, False, True, True, True)


class _Branches(nn.Module):
    """A trunk every rank uses, and a branch only the ranks in ``users`` use."""

    def __init__(self, users):
        super().__init__()
        self.users = users
        self.trunk, self.branch = nn.Linear(WIDTH, WIDTH), nn.Linear(WIDTH, WIDTH)

    def forward(self, x):
        x = self.trunk(x)
        return self.branch(x) if dist.get_rank() in self.users else x


def _find_unused(fake, users, steps=2):
    def fn():
        with sc.fake_tensors() if fake else contextlib.nullcontext():
            torch.manual_seed(0)
            ddp = DDP(_Branches(users), find_unused_parameters=True)
            for _ in range(steps):
                ddp.zero_grad(set_to_none=True)
                ddp(torch.randn(BATCH, WIDTH)).sum().backward()
            return [p.grad is not None for p in ddp.module.branch.parameters()]

    return sc.Cluster.preset("dgx-a100", nodes=1).run(fn, world_size=4)


@pytest.mark.parametrize("users", [(), (0,), (0, 1, 2, 3)], ids=["nobody", "rank 0", "all"])
def test_find_unused_parameters_on_fake_tensors_matches_real(users):
    """DDP marks the parameters each rank used in a small integer tensor, all-reduces it
    and reads it back with ``.item()`` after the backward pass (it used to stop with
    ``DataDependentOutputException: aten._local_scalar_dense``). The branch gets a
    gradient on every rank iff some rank used it, on fake tensors as on real ones."""
    fake, real = _find_unused(True, users), _find_unused(False, users)
    assert fake.results == real.results == [[bool(users)] * 2] * 4
    assert records(fake) == records(real)
    for rank in range(4):
        assert fake.peak_memory(rank) == real.peak_memory(rank)


def test_torch_is_restored_after_the_run():
    train(True, steps=1, world_size=2)
    assert dist.Reducer is torch._C._distributed_c10d.Reducer
    assert not hasattr(dist._verify_params_across_processes, "__wrapped__")
