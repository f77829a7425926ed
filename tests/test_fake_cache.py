"""The fast road for ops on fake tensors gives exactly what FakeTensorMode gives.

``_torch_internals.fake_dispatch`` answers repeated ops from FakeTensorMode's own cache
with a cheaper key. A wrong key would hand back a tensor of the wrong shape, or a view
that no longer shares its base's storage: these tests compare every result with what
FakeTensorMode itself returns, and a whole run with and without the cache.
"""

import sys
from pathlib import Path

import pytest
import torch

import simcluster as sc
from simcluster import _torch_internals

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import llama_memory  # noqa: E402

aten = torch.ops.aten


def metadata(t):
    return (tuple(t.shape), t.stride(), t.dtype, t.storage_offset(), t.device,
            t.untyped_storage().nbytes())


CALLS = [  # (name, op, args built from a, b (4x6 fp32), c (6x5 fp32))
    ("view", aten.view.default, lambda a, b, c: (a, [24])),
    ("t", aten.t.default, lambda a, b, c: (a,)),
    ("slice", aten.slice.Tensor, lambda a, b, c: (a, 1, 2, 5)),
    ("select", aten.select.int, lambda a, b, c: (a, 0, 3)),
    ("add", aten.add.Tensor, lambda a, b, c: (a, b)),
    ("mm", aten.mm.default, lambda a, b, c: (a, c)),
    ("sum", aten.sum.dim_IntList, lambda a, b, c: (a, [1])),
    ("to bf16", aten._to_copy.default, lambda a, b, c: (a,)),
    ("empty", aten.empty.memory_format, lambda a, b, c: ([3, 7],)),
    ("split", aten.split.Tensor, lambda a, b, c: (a, 3, 1)),
]


@pytest.mark.parametrize("name,op,make_args", CALLS, ids=[c[0] for c in CALLS])
def test_cached_result_equals_fake_tensor_mode(name, op, make_args):
    kwargs = {"dtype": torch.bfloat16} if name == "to bf16" else {}
    with _torch_internals.fake_tensor_mode():
        a, b, c = torch.empty(4, 6), torch.empty(4, 6), torch.empty(6, 5)
        expected = op(*make_args(a, b, c), **kwargs)
        first = _torch_internals.fake_dispatch(op, make_args(a, b, c), kwargs)
        second = _torch_internals.fake_dispatch(op, make_args(a, b, c), kwargs)  # cached
    for got in (first, second):
        outs = got if isinstance(got, (list, tuple)) else [got]
        wanted = expected if isinstance(expected, (list, tuple)) else [expected]
        assert [metadata(t) for t in outs] == [metadata(t) for t in wanted]
        for t in outs:
            assert _torch_internals.is_fake(t)
            shares = _torch_internals.storage_key(t) == _torch_internals.storage_key(a)
            assert shares == op.is_view, f"{name}: aliasing differs from FakeTensorMode"


def test_in_place_op_returns_its_argument_and_checks_shapes():
    with _torch_internals.fake_tensor_mode():
        a, b = torch.empty(4, 6), torch.empty(4, 6)
        for _ in range(2):
            assert _torch_internals.fake_dispatch(aten.add_.Tensor, (a, b), {}) is a
        with pytest.raises(RuntimeError):  # a shape torch refuses is never cached as fine
            _torch_internals.fake_dispatch(aten.add_.Tensor, (a, torch.empty(5, 6)), {})


def test_a_different_shape_is_not_answered_from_another_shapes_entry():
    with _torch_internals.fake_tensor_mode():
        small, large = torch.empty(2, 3), torch.empty(8, 3)
        assert _torch_internals.fake_dispatch(aten.t.default, (small,), {}).shape == (3, 2)
        assert _torch_internals.fake_dispatch(aten.t.default, (large,), {}).shape == (3, 8)
        as_bf16 = torch.empty(2, 3, dtype=torch.bfloat16)
        out = _torch_internals.fake_dispatch(aten.add.Tensor, (as_bf16, as_bf16), {})
        assert out.dtype == torch.bfloat16


def test_a_whole_run_is_identical_with_and_without_the_cache(monkeypatch):
    cluster = sc.Cluster.from_dict({"nodes": [{"devices": 2, "device": {
        "name": "A100-6GB", "memory_gb": 6, "peak_tflops": {"float32": 19.5},
        "hbm_gbps": 2039}}]})

    def measure():
        run = cluster.run(llama_memory.train_step, args=("fsdp", 1), world_size=2)
        return run.elapsed, run.peak_memory(0), run.results[0], run.summary().rows

    cached = measure()
    monkeypatch.setattr(sc.accounting, "fake_dispatch",
                        lambda func, args, kwargs: func(*args, **kwargs))
    assert measure() == cached


def test_collectives_on_fake_tensors_are_charged_and_size_checked():
    import torch.distributed as dist

    def gather(out_rows):
        with sc.fake_tensors():
            out, inp = torch.empty(out_rows, 3), torch.empty(2, 3)
            dist.all_gather_single(out, inp)
            grad = torch.empty(4, 3)
            dist.all_reduce(grad)
            shard = torch.empty(2, 3)
            dist.reduce_scatter_single(shard, grad)
            return tuple(out.shape), sc.collectives_called()

    cluster = sc.Cluster.preset("dgx-a100")
    run = cluster.run(gather, args=(4,), world_size=2)
    assert run.results[0][0] == (4, 3)
    assert run.elapsed > 0   # the collectives are still charged
    with pytest.raises(sc.SimulationError, match="12 elements, got 6"):
        cluster.run(gather, args=(2,), world_size=2)


def test_an_op_outside_aten_that_returns_nothing_is_remembered_and_still_checked():
    import importlib

    # importing FSDP2's collectives registers its ops under torch.ops.fsdp
    importlib.import_module("torch.distributed.fsdp._fully_shard._fsdp_collectives")
    op = torch.ops.fsdp.split_with_sizes_copy.default
    with _torch_internals.fake_tensor_mode():
        gathered = torch.empty(2, 10)            # two ranks' shards of sizes 6 and 4
        outs = [torch.empty(2, 6), torch.empty(2, 4)]
        for _ in range(2):   # the second call is answered from the cache
            assert _torch_internals.fake_dispatch(op, (gathered, [6, 4]), {"dim": 1,
                                                                       "out": outs}) is None
        assert _torch_internals._RETURNS_NOTHING in _torch_internals._fake_cache.entries.values()
        with pytest.raises(RuntimeError, match="split_sizes to sum exactly to 10"):
            _torch_internals.fake_dispatch(op, (gathered, [5, 4]), {"dim": 1, "out": outs})


@pytest.mark.parametrize("make", [
    lambda: torch.nn.Parameter(torch.empty(6, 4, device="meta")),   # to_empty's case
    lambda: torch.empty(6, 4, device="meta").t(),                   # not contiguous
    lambda: torch.empty(6, 4, dtype=torch.bfloat16, device="meta"),
], ids=["parameter", "transposed", "bf16"])
def test_empty_like_of_a_meta_tensor_equals_fake_tensor_modes(make):
    op = aten.empty_like.default
    meta = make()
    with _torch_internals.fake_tensor_mode():
        expected = op(meta, device=torch.device("cpu"), pin_memory=False)
        for _ in range(2):
            got = _torch_internals.fake_dispatch(op, (meta,), {"device": torch.device("cpu"),
                                                               "pin_memory": False})
            assert type(got).__name__ == "FakeTensor"
            assert metadata(got) == metadata(expected)


def test_unsafe_view_is_remembered_and_still_shares_its_input_storage():
    op = aten._unsafe_view.default
    with _torch_internals.fake_tensor_mode():
        a = torch.empty(6, 4)
        expected = op(a, [2, 12])
        for size in ([2, 12], [2, 12], [24]):
            got = _torch_internals.fake_dispatch(op, (a, size), {})
            assert _torch_internals.storage_key(got) == _torch_internals.storage_key(a)
            assert got.shape == tuple(size)
        assert metadata(_torch_internals.fake_dispatch(op, (a, [2, 12]), {})) == metadata(expected)
        other = torch.empty(6, 4)   # same metadata, another storage: the result follows it
        got = _torch_internals.fake_dispatch(op, (other, [2, 12]), {})
        assert _torch_internals.storage_key(got) == _torch_internals.storage_key(other)


def test_an_op_with_out_is_remembered_returns_out_and_still_checks_shapes():
    op = aten.mul.out   # DDP's reducer copies each gradient into its bucket with it
    with _torch_internals.fake_tensor_mode():
        grad, out = torch.empty(4, 6), torch.empty(4, 6)
        expected = op(grad, 0.25, out=out)
        for _ in range(2):   # the second call is answered from the cache
            assert _torch_internals.fake_dispatch(op, (grad, 0.25), {"out": out}) is out
        assert metadata(out) == metadata(expected)
        assert _torch_internals._RETURNS_OUT in _torch_internals._fake_cache.entries.values()
        with pytest.raises(RuntimeError):   # shapes torch refuses are never cached as fine
            _torch_internals.fake_dispatch(aten.mul.out, (grad, torch.empty(5, 7)), {"out": out})
        resized = torch.empty(4, 6)   # torch resizes an out of another shape: not cached
        with pytest.warns(UserWarning, match="resized"):
            got = _torch_internals.fake_dispatch(op, (torch.empty(5, 7), 0.25), {"out": resized})
        assert got is resized and resized.shape == (5, 7)
        other = torch.empty(4, 6)   # same metadata, another tensor: that one is returned
        assert _torch_internals.fake_dispatch(op, (grad, 0.25), {"out": other}) is other


def test_a_cached_result_is_built_as_fake_tensor_builds_it():
    # the cache builds its results without FakeTensor.__new__: same attributes, same
    # dispatch keys (they route autograd and autocast by the fake device)
    with _torch_internals.fake_tensor_mode():
        a, b = torch.empty(4, 6), torch.empty(4, 6)
        expected = aten.add.Tensor(a, b)
        for _ in range(2):
            got = _torch_internals.fake_dispatch(aten.add.Tensor, (a, b), {})
            assert type(got) is type(expected)
            assert vars(got) == vars(expected)
            assert torch._C._dispatch_keys(got) == torch._C._dispatch_keys(expected)
            assert (got.device, got.requires_grad) == (expected.device, expected.requires_grad)
            assert got.fake_mode is expected.fake_mode
