"""Determinism: the same program gives bit-identical results every time, and every rank
keeps its own random-number state and default dtype, as if it were its own process."""

import faulthandler
import random

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc


@pytest.fixture(scope="module")
def cluster():
    return sc.Cluster.preset("dgx-a100", nodes=1)


def _assert_identical(a, b, path="result"):
    """Bit-identical comparison of nested results (tensors, arrays, numbers, containers)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} vs {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        assert torch.equal(a, b), f"{path}: tensors differ"
    elif isinstance(a, np.ndarray):
        assert np.array_equal(a, b), f"{path}: arrays differ"
    elif isinstance(a, dict):
        assert a.keys() == b.keys(), path
        for k in a:
            _assert_identical(a[k], b[k], f"{path}[{k!r}]")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_identical(x, y, f"{path}[{i}]")
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"


def _notebook_rng_state():
    return torch.get_rng_state(), random.getstate(), np.random.get_state()


def _assert_same_rng_state(before, after):
    assert torch.equal(before[0], after[0]), "torch RNG state changed"
    assert before[1] == after[1], "random RNG state changed"
    np_before, np_after = before[2], after[2]
    assert np_before[0] == np_after[0]
    assert np.array_equal(np_before[1], np_after[1]), "numpy RNG state changed"
    assert np_before[2:] == np_after[2:], "numpy RNG state changed"


# ======================================================= same program, same bits
def _model():
    return nn.Sequential(nn.Linear(6, 12), nn.Tanh(), nn.Linear(12, 3))


def _random_program(steps):
    r, n = dist.get_rank(), dist.get_world_size()
    # unseeded draws: every rank starts from the simulator's fixed per-process seeds
    a = torch.randn(5)
    b = random.random()
    c = np.random.rand(3)
    # seeded, rank-dependent draws
    torch.manual_seed(100 + r)
    x = torch.randn(5) * (r + 1) + b + float(c.sum())
    dist.all_reduce(x)
    gathered = [torch.empty(5) for _ in range(n)]
    dist.all_gather(gathered, a + r)
    shard = torch.empty(2)
    dist.reduce_scatter(shard, list(torch.randn(2 * n).chunk(n)))
    avg = torch.randn(7, dtype=torch.float64)
    dist.all_reduce(avg, op=dist.ReduceOp.AVG)

    torch.manual_seed(0)
    model = _model()
    ddp = DDP(model, bucket_cap_mb=0.0001)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05, momentum=0.9)
    torch.manual_seed(200 + r)
    for _ in range(steps):
        xb, yb = torch.randn(4, 6), torch.randn(4, 3)  # different on every rank
        opt.zero_grad()
        loss = ((ddp(xb) - yb) ** 2).mean()
        loss.backward()
        opt.step()
    return {
        "a": a, "b": b, "c": c, "x": x, "gathered": gathered, "shard": shard, "avg": avg,
        "params": [p.detach().clone() for p in model.parameters()],
        "loss": loss.detach().clone(),
    }


def test_same_program_twice_is_bit_identical(cluster):
    first = cluster.run(_random_program, world_size=4, args=(3,)).results
    second = cluster.run(_random_program, world_size=4, args=(3,)).results
    _assert_identical(first, second)
    # and a third time, after the notebook has drawn numbers and reseeded its own RNGs
    torch.manual_seed(987)
    random.seed(987)
    np.random.seed(987)
    torch.randn(11), random.random(), np.random.rand(4)
    third = cluster.run(_random_program, world_size=4, args=(3,)).results
    _assert_identical(first, third)


def test_ddp_keeps_parameters_identical_on_every_rank(cluster):
    results = cluster.run(_random_program, world_size=4, args=(3,)).results
    for r in range(1, 4):
        _assert_identical(results[0]["params"], results[r]["params"])
        _assert_identical(results[0]["x"], results[r]["x"])
        _assert_identical(results[0]["gathered"], results[r]["gathered"])
        _assert_identical(results[0]["avg"], results[r]["avg"])
    # the losses differ (each rank has its own data), the parameters do not
    assert not torch.equal(results[0]["loss"], results[1]["loss"])


def _draw_while_polling():
    t = torch.full((3,), float(dist.get_rank()))
    work = dist.all_reduce(t, async_op=True)
    draws = []
    while not work.is_completed():   # a scheduling point: the other ranks run meanwhile
        draws.append(torch.rand(1))
    return t, draws


def test_polling_an_async_collective_is_deterministic(cluster):
    first = cluster.run(_draw_while_polling, world_size=4, timeout=60).results
    second = cluster.run(_draw_while_polling, world_size=4, timeout=60).results
    _assert_identical(first, second)
    assert all(torch.equal(t, torch.full((3,), 6.0)) for t, _ in first)


def _unseeded_draws():
    return torch.randn(4), random.random(), np.random.rand(2), torch.randint(0, 1000, (3,))


def test_every_rank_starts_from_the_same_fresh_process_state(cluster):
    results = cluster.run(_unseeded_draws, world_size=4).results
    for r in range(1, 4):
        _assert_identical(results[0], results[r])
    # and the same again in a run of another size
    _assert_identical(results[0], cluster.run(_unseeded_draws, world_size=2).results[1])


# ======================================== manual_seed then build a model, every rank
def _build_seeded_model():
    torch.manual_seed(0)
    return [p.detach().clone() for p in _model().parameters()]


def test_manual_seed_then_model_gives_identical_parameters_on_every_rank(cluster):
    results = cluster.run(_build_seeded_model, world_size=8).results
    with torch.random.fork_rng():
        torch.manual_seed(0)
        reference = [p.detach().clone() for p in _model().parameters()]
    for r in range(8):
        _assert_identical(results[r], reference, f"rank {r}")


# ============================== each rank's RNG stream ignores the interleaving
def _seed_all(seed):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)


def _draw(k):
    return torch.randn(k), [random.random() for _ in range(k)], np.random.rand(k)


def _draws_with_waits(pattern):
    """Each rank seeds its RNGs, then draws in three rounds, waiting on others between."""
    r, n = dist.get_rank(), dist.get_world_size()
    _seed_all(1000 + r)
    out = [_draw(2 + r)]  # ranks draw different amounts, so a shared stream would show
    token = torch.zeros(1)
    if pattern == "collective":
        dist.all_reduce(token)
    elif pattern == "chain":  # rank r runs only after rank r-1 has drawn again
        if r > 0:
            dist.recv(token, src=r - 1)
        out.append(_draw(3))
        if r < n - 1:
            dist.send(token, dst=r + 1)
    elif pattern == "reverse-chain":  # the last rank goes first
        if r < n - 1:
            dist.recv(token, src=r + 1)
        out.append(_draw(3))
        if r > 0:
            dist.send(token, dst=r - 1)
    elif pattern == "rank-1-waits-longest":
        if r == 1:
            for _ in range(3):
                dist.barrier()
        else:
            for _ in range(3):
                torch.randn(17)  # noise on the other ranks' streams only
                dist.barrier()
            _seed_all(5000 + r)
    if len(out) == 1:
        out.append(_draw(3))
    dist.barrier()
    out.append(_draw(4))
    return out


def _reference_draws(rank, pattern):
    """What one process with the same seed sequence draws, no other rank anywhere."""
    _seed_all(1000 + rank)
    out = [_draw(2 + rank)]
    if pattern == "rank-1-waits-longest" and rank != 1:
        for _ in range(3):
            torch.randn(17)
        _seed_all(5000 + rank)
    out.append(_draw(3))
    out.append(_draw(4))
    return out


@pytest.mark.parametrize("pattern", ["collective", "chain", "reverse-chain",
                                     "rank-1-waits-longest"])
def test_rng_streams_do_not_depend_on_the_interleaving(cluster, pattern):
    results = cluster.run(_draws_with_waits, world_size=4, args=(pattern,)).results
    saved = _notebook_rng_state()
    try:
        for r in range(4):
            _assert_identical(results[r], _reference_draws(r, pattern), f"rank {r}")
    finally:
        torch.set_rng_state(saved[0])
        random.setstate(saved[1])
        np.random.set_state(saved[2])


def _gaussians_across_waits():
    """numpy's legacy randn caches every second Gaussian: a cache must stay per rank."""
    np.random.seed(7)   # the same seed on every rank: their raw states coincide
    out = [np.random.randn(1)]
    dist.barrier()
    out.append(np.random.randn(1))   # served from the cache: the raw state does not move
    dist.barrier()
    out.append(np.random.randn(3))
    return out


def test_numpy_cached_gaussian_stays_with_its_rank(cluster):
    saved = _notebook_rng_state()
    try:
        results = cluster.run(_gaussians_across_waits, world_size=3).results
        np.random.seed(7)
        reference = [np.random.randn(1), np.random.randn(1), np.random.randn(3)]
    finally:
        np.random.set_state(saved[2])
    for r in range(3):
        for got, want in zip(results[r], reference):
            assert np.array_equal(got, want), f"rank {r}"


# ====================================== the notebook's own RNG state is untouched
def _reseed_and_draw():
    _seed_all(42 + dist.get_rank())
    draws = _draw(8)
    dist.barrier()
    return draws


def _reseed_then_fail():
    _seed_all(7)
    _draw(5)
    if dist.get_rank() == 1:
        raise RuntimeError("fails after reseeding")
    dist.barrier()


def _reseed_then_loop():
    _seed_all(7)
    _draw(5)
    if dist.get_rank() == 1:
        while True:
            _draw(1)
    dist.barrier()


@pytest.mark.parametrize("fn, error", [
    (_reseed_and_draw, None),
    (_reseed_then_fail, sc.RankError),
    (_reseed_then_loop, sc.SimulationTimeout),
], ids=["ok", "rank-error", "timeout"])
def test_notebook_rng_state_is_unchanged_by_a_run(cluster, fn, error):
    _seed_all(31337)
    torch.randn(3), random.random(), np.random.rand(3)  # somewhere in the middle of a stream
    before = _notebook_rng_state()
    if error is None:
        cluster.run(fn, world_size=4)
    else:
        faulthandler.dump_traceback_later(30, exit=True)  # a hang becomes a loud crash
        try:
            with pytest.raises(error):
                cluster.run(fn, world_size=4, timeout=0.5)
        finally:
            faulthandler.cancel_dump_traceback_later()
    _assert_same_rng_state(before, _notebook_rng_state())
    # the notebook goes on drawing exactly what it would have drawn without the run
    after_run = _draw(3)
    torch.set_rng_state(before[0])
    random.setstate(before[1])
    np.random.set_state(before[2])
    _assert_identical(after_run, _draw(3))


# ============================================= the default dtype is per rank too
def _dtype_changes():
    r = dist.get_rank()
    seen = [torch.get_default_dtype()]
    if r == 0:
        torch.set_default_dtype(torch.float64)
    elif r == 2:
        torch.set_default_dtype(torch.float16)
    dist.barrier()
    seen.append(torch.get_default_dtype())
    seen.append(torch.zeros(1).dtype)
    seen.append(torch.tensor([1.5]).dtype)
    dist.barrier()
    seen.append(nn.Linear(2, 2).weight.dtype)
    return seen


@pytest.mark.parametrize("notebook_dtype", [torch.float32, torch.float64])
def test_default_dtype_changes_do_not_leak(cluster, notebook_dtype):
    previous = torch.get_default_dtype()
    torch.set_default_dtype(notebook_dtype)
    try:
        results = cluster.run(_dtype_changes, world_size=4).results
        assert torch.get_default_dtype() == notebook_dtype
    finally:
        torch.set_default_dtype(previous)
    f32, f64, f16 = torch.float32, torch.float64, torch.float16
    # every rank starts as a fresh process (float32), whatever the notebook uses
    assert results[0] == [f32, f64, f64, f64, f64]
    assert results[1] == [f32, f32, f32, f32, f32]
    assert results[2] == [f32, f16, f16, f16, f16]
    assert results[3] == [f32, f32, f32, f32, f32]


def _set_dtype_then_fail():
    torch.set_default_dtype(torch.float64)
    dist.barrier()
    if dist.get_rank() == 1:
        raise RuntimeError("fails with float64 as default dtype")
    dist.barrier()


def test_default_dtype_is_restored_after_a_failed_run(cluster):
    assert torch.get_default_dtype() == torch.float32
    with pytest.raises(sc.RankError):
        cluster.run(_set_dtype_then_fail, world_size=2)
    assert torch.get_default_dtype() == torch.float32
    assert torch.zeros(1).dtype == torch.float32


def test_a_rank_runs_mkl_on_the_thread_count_torch_was_given():
    """torch.set_num_threads(1) in the notebook reaches MKL in every rank before its
    first matrix multiply (torch applies it per thread, lazily), so a rank's results do
    not depend on the machine's core count."""
    import ctypes
    import glob
    import os
    import threading
    libs = glob.glob(os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.*"))
    try:
        mkl_threads = ctypes.CDLL(libs[0]).mkl_get_max_threads
    except (IndexError, OSError, AttributeError):
        pytest.skip("this torch build has no MKL")
    # Measured the way the simulator starts a rank: in a fresh thread.
    seen = []
    thread = threading.Thread(target=lambda: seen.append(mkl_threads()))
    thread.start()
    thread.join()
    if seen[0] == 1:
        pytest.skip("MKL's default is one thread here: nothing to tell apart")
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        run = sc.Cluster.preset("dgx-a100").run(lambda: mkl_threads(), world_size=2)
    finally:
        torch.set_num_threads(before)
    assert run.results == [1, 1]
