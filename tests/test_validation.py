"""Wrong calls fail at once with an error that names what is wrong.

* Buffers are checked as torch's real backends check them (simcluster/validation.py):
  shapes, dtypes, unsupported dtypes, devices, contiguous point-to-point buffers. The
  wrong calls that gloo rejects on every rank are also run against real gloo in
  tests/test_differential_gloo.py; the ones here are those gloo answers only on one
  rank (the others wait until gloo's timeout) or cannot run at all (meta tensors on one
  rank only).
* ``Cluster.run`` checks its arguments before any rank starts.
* Every simulator error pickles and unpickles with its message and fields.
"""

import pickle
import threading

import pytest
import torch
import torch.distributed as dist

import simcluster as sc
from simcluster import errors

CLUSTER = sc.Cluster.preset("dgx-a100")

# torch 2.13 deprecates all_gather_into_tensor (for all_gather_single); learners still
# call it, so it is what these tests call.
pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")


def _run(fn, world_size=2):
    return CLUSTER.run(fn, world_size=world_size, accounting=False, timeout=60).results


def _raises_on_rank(fn, rank, error, *fragments):
    """``fn`` makes ``rank`` raise ``error``; its message holds every fragment."""
    with pytest.raises(sc.RankError) as info:
        _run(fn)
    assert info.value.rank == rank
    assert isinstance(info.value.original, error)
    message = str(info.value.original)
    for fragment in fragments:
        assert fragment in message, f"{fragment!r} not in {message!r}"


# ============================================================= buffers (item 3)
def test_reduce_scatter_into_a_larger_output_is_refused():
    """It used to return [2, 2, 2, 2]: the 1-element sum broadcast into the output."""
    def fn():
        dist.reduce_scatter(torch.zeros(4), [torch.ones(1)] * 2)

    _raises_on_rank(fn, 0, ValueError, "rank 0", "reduce_scatter", "(1,)", "(4,)")


def test_all_gather_into_tensor_does_not_cast_or_reshape():
    """A float64 output of the wrong size for a float32 input used to be filled anyway."""
    def fn():
        dist.all_gather_into_tensor(torch.zeros(6, dtype=torch.float64), torch.ones(4))

    _raises_on_rank(fn, 0, ValueError, "all_gather_into_tensor", "(6,)", "(4,)",
                    "float64", "float32")


def test_all_gather_into_tensor_of_the_wrong_size_names_both_shapes():
    def fn():
        dist.all_gather_into_tensor(torch.zeros(6), torch.ones(4))

    _raises_on_rank(fn, 0, ValueError, "must hold 8 elements, got 6", "(4,)")


def test_scatter_into_a_larger_output_is_refused():
    """It used to broadcast each 1-element chunk into the 4-element output."""
    def fn():
        chunks = [torch.ones(1), torch.full((1,), 2.0)] if dist.get_rank() == 0 else None
        dist.scatter(torch.zeros(4), chunks, src=0)

    _raises_on_rank(fn, 0, ValueError, "scatter", "scatter_list[0]", "(1,)", "(4,)")


def test_gather_into_larger_outputs_is_refused():
    def fn():
        outs = [torch.zeros(4) for _ in range(2)] if dist.get_rank() == 0 else None
        dist.gather(torch.ones(1), outs, dst=0)

    _raises_on_rank(fn, 0, ValueError, "gather", "output_tensor_list[0]", "(4,)", "(1,)")


def test_a_meta_tensor_on_one_rank_only_is_a_mismatch():
    """It used to leave rank 1's tensor unreduced: [1, 1, 1, 1] instead of [2, 2, 2, 2]."""
    def fn():
        device = "meta" if dist.get_rank() == 0 else "cpu"
        dist.all_reduce(torch.ones(4, device=device))

    with pytest.raises(sc.CollectiveMismatchError) as info:
        _run(fn)
    assert "all_reduce #0 on group WORLD: the ranks' arguments do not fit." in str(info.value)
    assert "rank 0 passes a meta or fake tensor (no data) but rank 1 a real one" in str(
        info.value)


def test_meta_tensors_on_every_rank_still_work():
    def fn():
        t = torch.ones(4, device="meta")
        dist.all_reduce(t)
        out = torch.empty(8, device="meta")
        dist.all_gather_into_tensor(out, t)
        return tuple(out.shape)

    assert _run(fn) == [(8,), (8,)]


def test_mixing_meta_and_real_tensors_in_one_call_is_refused():
    def fn():
        dist.all_gather([torch.empty(4, device="meta"), torch.empty(4)], torch.ones(4))

    _raises_on_rank(fn, 0, ValueError, "all_gather", "one device", "meta", "cpu")


@pytest.mark.parametrize("side", ["send", "recv"])
def test_point_to_point_into_a_non_contiguous_view_is_refused(side):
    """gloo: "input tensor has to be contiguous"; the receive used to be accepted."""
    def fn():
        view = torch.zeros(4, 2)[:, 0]
        if dist.get_rank() == 0:
            dist.send(view if side == "send" else torch.ones(4), dst=1)
        else:
            dist.recv(view if side == "recv" else torch.zeros(4), src=0)

    rank = 0 if side == "send" else 1
    _raises_on_rank(fn, rank, ValueError, f"rank {rank}", side, "contiguous", "(4,)")


@pytest.mark.parametrize("call, where", [
    (lambda view: dist.broadcast(view, src=0), "broadcast needs a contiguous tensor"),
    (lambda view: dist.scatter(view, [torch.ones(4)] * 2 if dist.get_rank() == 0 else None,
                               src=0), "scatter needs a contiguous output"),
    (lambda view: dist.all_to_all_single(torch.zeros(4), view),
     "all_to_all_single needs a contiguous input"),
    (lambda view: dist.all_to_all_single(view, torch.ones(4)),
     "all_to_all_single needs a contiguous output"),
], ids=["broadcast", "scatter", "all_to_all_single-input", "all_to_all_single-output"])
def test_non_contiguous_buffers_gloo_mangles_are_refused(call, where):
    """gloo fills only half of a strided broadcast or scatter output and writes past a
    strided all_to_all_single output (seen with torch 2.13); NCCL refuses all three."""
    def fn():
        call(torch.zeros(4, 2)[:, 0])

    _raises_on_rank(fn, 0, ValueError, where, "stride (2,)")


def test_all_gather_into_a_non_contiguous_output_fills_it():
    """NCCL's numel rule: any output of the right size, here a transposed (3, 8) view."""
    def fn():
        out = torch.zeros(8, 3).t()
        dist.all_gather_into_tensor(out, torch.full((3, 4), dist.get_rank() + 1.0))
        return out

    expected = torch.cat([torch.ones(12), torch.full((12,), 2.0)]).view(3, 8)
    for result in _run(fn):
        assert torch.equal(result, expected)


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
@pytest.mark.filterwarnings("ignore:Sparse invariant checks are implicitly disabled")
@pytest.mark.parametrize("call", [
    lambda: dist.all_reduce(torch.sparse_coo_tensor([[0, 2]], [1.0, 2.0], (4,))),
    lambda: dist.broadcast(torch.ones(2, 2).to_sparse_csr(), src=0),
    lambda: dist.send(torch.ones(4).to_sparse(), dst=1),
], ids=["all_reduce-coo", "broadcast-csr", "send-coo"])
def test_sparse_tensors_are_refused(call):
    """A sparse all_reduce used to return each rank's own tensor, unreduced."""
    def fn():
        if dist.get_rank() == 0:
            call()

    _raises_on_rank(fn, 0, ValueError, "sparse tensors", "are not simulated", "to_dense()")


# ============================================================ dtypes (item 9)
@pytest.mark.parametrize("dtype", [torch.uint16, torch.int16, torch.uint32,
                                   torch.float8_e4m3fn])
def test_an_unsupported_dtype_says_so(dtype):
    """gloo raises "Invalid scalar type"; uint16 used to fail with '"add_stub" not
    implemented for 'UInt16'' as a mismatch of the ranks' arguments."""
    def fn():
        dist.all_reduce(torch.ones(4).to(dtype))

    _raises_on_rank(fn, 0, ValueError, "all_reduce does not support dtype", str(dtype))


@pytest.mark.parametrize("dtype", [torch.uint16, torch.float8_e4m3fn])
def test_send_and_recv_take_any_dtype(dtype):
    """gloo sends the bytes, whatever the dtype: a float8 message arrives intact."""
    def fn():
        if dist.get_rank() == 0:
            dist.send(torch.full((4,), 3.0).to(dtype), dst=1)
            return None
        got = torch.zeros(4).to(dtype)
        dist.recv(got, src=0)
        return got.float()

    assert torch.equal(_run(fn)[1], torch.full((4,), 3.0))


def test_an_unsupported_dtype_in_a_broadcast_says_so():
    def fn():
        dist.broadcast(torch.ones(4, dtype=torch.uint16), src=0)

    _raises_on_rank(fn, 0, ValueError, "broadcast does not support dtype torch.uint16")


# ====================================================== run arguments (item 7)
def _noop():
    return None


def _generator():
    yield dist.get_rank()


async def _coroutine():
    return dist.get_rank()


@pytest.mark.parametrize("kwargs, error, match", [
    ({"timeout": float("inf")}, ValueError, r"timeout must be a positive number of "
                                            r"seconds \(and finite\), got inf"),
    ({"timeout": float("nan")}, ValueError, "timeout"),
    ({"timeout": "10"}, TypeError, "timeout"),
    ({"link_factor": {"network": 0}}, ValueError, r"link_factor\['network'\] must be a "
                                                  "positive"),
    ({"link_factor": {"network": -0.5}}, ValueError, r"link_factor\['network'\]"),
    ({"link_factor": {"netwrok": 0.5}}, ValueError, "link_factor: unknown link 'netwrok'"),
    ({"link_factor": {3: 0.5}}, ValueError, "link_factor: unknown link 3"),
    ({"link_factor": {-1: 0.5}}, ValueError, "link_factor: unknown link -1"),
    ({"link_factor": 0.5}, TypeError, "link_factor must be a dict"),
    ({"speed_factor": 2.0}, TypeError, "speed_factor must be a dict"),
    ({"speed_factor": {0: 0}}, ValueError, r"speed_factor\[0\] must be a positive"),
    ({"speed_factor": {0: -2.0}}, ValueError, r"speed_factor\[0\]"),
    ({"speed_factor": {0: "fast"}}, TypeError, r"speed_factor\[0\] must be a number"),
    ({"speed_factor": {2: 2.0}}, ValueError, "speed_factor: 2 is not a rank of this run"),
    ({"speed_factor": {-1: 2.0}}, ValueError, "speed_factor: -1 is not a rank"),
])
def test_run_arguments_are_checked_at_the_call(kwargs, error, match):
    with pytest.raises(error, match=match):
        CLUSTER.run(_noop, world_size=2, **kwargs)


@pytest.mark.parametrize("fn, match", [(_generator, "generator function"),
                                       (_coroutine, "async def")])
def test_a_generator_or_async_function_is_refused(fn, match):
    """Both used to "run": every rank returned a generator or coroutine object."""
    with pytest.raises(TypeError, match=match):
        CLUSTER.run(fn, world_size=2)


def test_valid_factors_still_run():
    run = CLUSTER.run(_noop, world_size=2, speed_factor={1: 2.0},
                      link_factor={0: 0.5, "network": 0.25}, timeout=30)
    assert run.results == [None, None]


# ================================================================ pickling (item 8)
def _raised(exc):
    """``exc`` after being raised and caught, so that it carries a traceback."""
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 — the point is to catch anything
        return caught


def _every_error():
    device = CLUSTER.spec.device_of(0)
    return [
        errors.SimulationError("plain"),
        errors.SimulationTimeout("rank 3 ran for longer than 0.2 s"),
        errors.RankError(3, _raised(RuntimeError("the real bug"))),
        errors.DeadlockError({0: "waiting in all_reduce #0", 1: "returned"},
                             {0: ["barrier #0 (WORLD)"]}, "every rank must call it"),
        errors.CollectiveMismatchError("shape", {0: (4,), 1: (5,)}, 2, "WORLD",
                                       "all_reduce", "make the shapes agree"),
        errors.OutOfMemoryError(1, device, 2**30, 80 * 2**30, {"parameters": 2**30},
                                "parameters"),
        # (its partial run is never pickled: tests/test_faults.py checks that with a real one)
        errors.RankCrashedError(3, 0, 2.0, "Crash(rank=3, at=2.0)", None, [],
                                "rank 3 (node 0) crashed at 2 s"),
    ]


def test_every_error_class_is_covered():
    """A new error class must be added to _every_error (and so to the pickling test)."""
    def subclasses(cls):
        return {cls} | {s for c in cls.__subclasses__() for s in subclasses(c)}

    defined = {c for c in subclasses(errors.SimulationError)
               if c.__module__ == errors.__name__}
    assert defined == {type(e) for e in _every_error()}


@pytest.mark.parametrize("error", _every_error(), ids=lambda e: type(e).__name__)
def test_every_error_pickles_with_its_message_and_fields(error):
    copy = pickle.loads(pickle.dumps(error))
    assert type(copy) is type(error)
    assert str(copy) == str(error)
    assert copy.args == error.args
    fields = {k: v for k, v in vars(error).items() if k != "original"}
    assert {k: v for k, v in vars(copy).items() if k != "original"} == fields
    if isinstance(error, errors.RankError):
        assert type(copy.original) is RuntimeError
        assert str(copy.original) == "the real bug"


def test_a_rank_error_from_a_real_run_pickles():
    def fn():
        if dist.get_rank() == 1:
            raise KeyError("missing")

    with pytest.raises(sc.RankError) as info:
        _run(fn)
    copy = pickle.loads(pickle.dumps(info.value))
    assert copy.rank == 1 and isinstance(copy.original, KeyError)
    assert "missing" in copy.traceback_text and str(copy) == str(info.value)


def test_a_rank_error_whose_original_cannot_be_pickled_keeps_its_text():
    class Unpicklable(Exception):
        def __init__(self):
            super().__init__("holds a lock")
            self.lock = threading.Lock()

    error = errors.RankError(2, _raised(Unpicklable()))
    copy = pickle.loads(pickle.dumps(error))
    assert str(copy) == str(error) and copy.rank == 2
    assert str(copy.original) == "Unpicklable: holds a lock"
