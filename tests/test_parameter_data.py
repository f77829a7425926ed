"""``p.data`` on parameters inside a rank, with accounting on.

Under a dispatch mode torch detaches a tensor through the mode with the tensor's own type
among the op's types, so ``nn.Parameter(...).data`` used to stop with "Multiple dispatch
failed for 'torch.ops.aten.detach'; all __torch_dispatch__ handlers returned
NotImplemented". Every learner writes ``p.data`` somewhere (``w.data.normal_()``,
``p.data -= lr * p.grad``), and ``torch.distributed.optim.ZeroRedundancyOptimizer`` does
too. These tests read and write ``.data`` as torch allows, on real and fake tensors, and
check values against torch without the simulator and memory against the sizes.
"""

import contextlib
import gc

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc
from simcluster import accounting

N = 1024
F32 = 4


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100", nodes=1)


def _memory():
    memory = accounting.current().memory
    return {**{k: v for k, v in memory.in_use.items() if v}, "total": memory.total}


# ------------------------------------------------------------ reads and writes
def _reads_and_writes():
    """What a learner does with ``.data``; returns the values it saw (runs anywhere)."""
    torch.manual_seed(0)
    p = nn.Parameter(torch.randn(N))
    seen = [p.data.clone()]
    p.data.copy_(torch.arange(N, dtype=torch.float32))
    seen.append(p.detach().clone())
    p.data -= 0.5 * torch.ones(N)
    seen.append(p.detach().clone())
    p.data.normal_()
    seen.append(p.detach().clone())
    p.data = torch.full((2 * N,), 3.0)
    seen.append(p.detach().clone())
    return seen, p.requires_grad, type(p).__name__


def test_data_reads_and_writes_give_what_torch_gives(node):
    expected = _reads_and_writes()
    for result in node.run(_reads_and_writes, world_size=2).results:
        seen, requires_grad, kind = result
        assert len(seen) == len(expected[0])
        for got, want in zip(seen, expected[0]):
            assert torch.equal(got, want)
        assert (requires_grad, kind) == expected[1:] == (True, "Parameter")


def _read_is_a_view():
    p = nn.Parameter(torch.randn(N))
    before = _memory()
    data = p.data
    after = _memory()
    return (before, after, type(data) is torch.Tensor, data.requires_grad,
            data.untyped_storage()._cdata == p.untyped_storage()._cdata)


def test_data_shares_the_parameters_memory_and_costs_none(node):
    run = node.run(_read_is_a_view, world_size=1)
    before, after, plain, requires_grad, shared = run.results[0]
    assert before == after == {"other": N * F32, "total": N * F32}
    assert plain and not requires_grad and shared


def _replace_data():
    torch.manual_seed(0)
    model = nn.Linear(N, 1, bias=False)
    start = _memory()
    model.weight.data = torch.zeros(1, 2 * N)   # the old storage is freed, the new one counted
    gc.collect()
    replaced = _memory()
    model(torch.ones(4, 2 * N))                 # a forward makes it a parameter again
    return start, replaced, _memory()["parameters"]


def test_replacing_data_frees_the_old_storage_and_counts_the_new(node):
    start, replaced, parameters = node.run(_replace_data, world_size=1).results[0]
    assert start == {"parameters": N * F32, "total": N * F32}
    assert replaced == {"other": 2 * N * F32, "total": 2 * N * F32}
    assert parameters == 2 * N * F32


class _Tagged(torch.Tensor):
    """A learner's own tensor subclass, without a ``__torch_dispatch__``."""


def _own_subclass():
    t = torch.Tensor._make_subclass(_Tagged, torch.ones(N))
    t.data.mul_(2.0)
    return type(t).__name__, (t * 1).sum().item(), _memory()


def test_a_subclass_without_its_own_dispatch_is_a_plain_tensor(node):
    kind, total, memory = node.run(_own_subclass, world_size=1).results[0]
    assert (kind, total) == ("_Tagged", 2.0 * N)
    assert memory == {"other": N * F32, "total": N * F32}


# ------------------------------------------------ hand-written SGD under DDP
def _model():
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Linear(64, 64, bias=False) for _ in range(4)])


def _batches(steps):
    torch.manual_seed(100 + dist.get_rank())
    return [torch.randn(8, 64) for _ in range(steps)]


def _sgd_by_hand(by_hand, lr=0.1, steps=3):
    model = DDP(_model())
    optimizer = None if by_hand else torch.optim.SGD(model.parameters(), lr=lr)
    for x in _batches(steps):
        model(x).square().mean().backward()
        if by_hand:
            with torch.no_grad():
                for p in model.parameters():
                    p.data -= lr * p.grad
                    p.grad = None
        else:
            optimizer.step()
            optimizer.zero_grad()
    return [p.detach().clone() for p in model.parameters()]


def test_hand_written_sgd_on_data_equals_torch_sgd_under_ddp(node):
    by_hand = node.run(_sgd_by_hand, world_size=2, args=(True,)).results
    torch_sgd = node.run(_sgd_by_hand, world_size=2, args=(False,)).results
    for mine, theirs in zip(by_hand, torch_sgd):   # torch fuses p - lr * g: last-bit rounding
        assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7) for a, b in zip(mine, theirs))
    assert not torch.equal(by_hand[0][0], _model()[0].weight.detach())   # it did train


# ------------------------------------------------ ZeroRedundancyOptimizer (ZeRO-1)
OPTIMIZERS = {"Adam": (torch.optim.Adam, {"lr": 0.01}), "SGD": (torch.optim.SGD, {"lr": 0.1})}


def _train(zero, optimizer, fake=False, steps=3):
    """DDP on ``_model()``, with ``optimizer`` plain or sharded by ZeroRedundancyOptimizer;
    returns the parameters (real tensors only) and the optimizer state held per rank."""
    cls, kwargs = OPTIMIZERS[optimizer]
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        model = DDP(_model())
        if zero:
            opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=cls, **kwargs)
        else:
            opt = cls(model.parameters(), **kwargs)
        for x in _batches(steps):
            model(x).square().mean().backward()
            opt.step()
            opt.zero_grad()
        memory = sc.memory_in_use()
        return None if fake else [p.detach().clone() for p in model.parameters()], memory


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("optimizer", ["Adam", "SGD"])
def test_zero_redundancy_optimizer_equals_the_plain_optimizer(node, world, optimizer):
    zero = node.run(_train, world_size=world, args=(True, optimizer)).results
    plain = node.run(_train, world_size=world, args=(False, optimizer)).results
    for (zero_params, _), (plain_params, _) in zip(zero, plain):
        assert all(torch.allclose(a, b, rtol=1e-6, atol=1e-7)
                   for a, b in zip(zero_params, plain_params))
    assert not torch.equal(zero[0][0][0], _model()[0].weight.detach())   # it did train


@pytest.mark.parametrize("world", [2, 4])
def test_zero_redundancy_optimizer_keeps_one_shard_of_adams_state(node, world):
    """Four equal weights: each of ``world`` ranks keeps the state of 4 / world of them."""
    zero = node.run(_train, world_size=world, args=(True, "Adam")).results
    plain = node.run(_train, world_size=world, args=(False, "Adam")).results
    weight = 64 * 64 * F32
    adam = 4 * (2 * weight + F32)   # exp_avg, exp_avg_sq and a float32 step per weight
    for (_, zero_memory), (_, plain_memory) in zip(zero, plain):
        assert plain_memory["optimizer state"] == adam
        assert zero_memory["optimizer state"] == adam // world
        assert zero_memory["parameters"] == plain_memory["parameters"] == 4 * weight


@pytest.mark.parametrize("optimizer", ["Adam", "SGD"])
def test_zero_redundancy_optimizer_on_fake_tensors_matches_real(node, optimizer):
    """The same collectives (op, bytes) and the same memory as on real tensors."""
    real = node.run(_train, world_size=4, args=(True, optimizer, False))
    fake = node.run(_train, world_size=4, args=(True, optimizer, True))
    assert [(c.op, c.nbytes) for c in fake.collectives] == \
        [(c.op, c.nbytes) for c in real.collectives]
    assert any(c.op == "broadcast" for c in fake.collectives)   # parameters sent from owners
    assert [m for _, m in fake.results] == [m for _, m in real.results]


def _fake_parameter_data():
    with sc.fake_tensors():
        p = nn.Parameter(torch.empty(N))
        before = _memory()
        p.data.normal_()
        p.data -= 0.5 * torch.ones(N)
        gc.collect()
        after = _memory()
        p.data = torch.empty(2 * N)
        gc.collect()
        return before, after, _memory(), tuple(p.shape)


def test_data_on_fake_parameters(node):
    before, after, replaced, shape = node.run(_fake_parameter_data, world_size=1).results[0]
    assert before == after == {"other": N * F32, "total": N * F32}
    assert replaced == {"other": 2 * N * F32, "total": 2 * N * F32}
    assert shape == (2 * N,)
