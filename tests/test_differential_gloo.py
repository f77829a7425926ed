"""Differential test: every collective on the ``sim`` backend gives what real gloo gives.

``_differential_cases.all_cases`` runs every case (each collective, several dtypes, roots,
shapes, sub-groups, point-to-point patterns) on the current default group. We run it once
per world size on the simulated cluster (ranks are threads of this process) and once on
real gloo (one spawned process per rank, over loopback), then compare every rank's result
of every case: exactly for integers, with ``torch.testing.assert_close`` for floats (gloo
reduces in a different order than sim's rank order, so float sums may differ in the
last bits).

Each (world size, case) pair is its own test id, e.g. ``test_sim_matches_gloo[n3-reduce-
dst1-SUM-f32]``. Both runs happen once per module (a module-scoped fixture), so the
whole file costs one simulated run per world size plus one spawn of 4 gloo processes
(each serves world sizes 2, 3 and 4 in turn).

Cases named ``wrong-...`` make a call that gloo rejects on every rank (an output of the
wrong shape or dtype, an unsupported dtype, a non-contiguous send or receive buffer):
each backend records whether the call raised, so the test demands that sim raises too
(the messages differ). Cases named ``...-noncontiguous`` pass views that gloo accepts:
sim must give the same result.

Where gloo cannot run a case as written (uneven all_to_all lists, stacked shapes for
all_gather_into_tensor / reduce_scatter_tensor), the gloo side runs an equivalent composed
from what gloo has; see the comments in ``_differential_cases.py``. Cases where gloo's own
answer cannot be trusted are skipped (``GLOO_UNRELIABLE`` below, with why) and checked
by hand elsewhere.
"""

import os
import sys

import pytest
import torch

# The gloo workers are spawned interpreters that import the cases module by name: put
# this directory on sys.path (they inherit the parent's sys.path) whatever pytest's
# import mode is.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import _differential_cases as cases  # noqa: E402

import simcluster as sc  # noqa: E402

pytestmark = [
    pytest.mark.slow,  # spawns 4 gloo processes: ~15 s on two idle cores
    # all_cases deliberately calls all_gather_into_tensor / reduce_scatter_tensor, which
    # torch 2.13 deprecates (for all_gather_single / reduce_scatter_single, also covered).
    pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning"),
]

WORLD_SIZES = cases.WORLD_SIZES

# Cases where gloo's own answer cannot be trusted, so there is nothing to compare with:
# {(world_size or None for all, case): reason}. Each is checked by hand elsewhere.
GLOO_UNRELIABLE = {
    (None, "all_to_all_single-in-place"): (
        "gloo bug, not sim: gloo's all_to_all_single usually gives wrong results when the "
        "output is the input (n=2, x = arange(6) + 100*rank: gloo leaves rank 1 at "
        "[100..105] instead of [3, 4, 5, 103, 104, 105]), but not always: it races. The "
        "sim's in-place result is checked against the hand-computed answer in "
        "tests/test_inplace_collectives.py."),
}


# ------------------------------------------------------------------------ comparison
def _error_of(value):
    if isinstance(value, dict) and set(value) == {"__error__"}:
        return value["__error__"]
    return None


def assert_same(sim, gloo, where="result"):
    """Assert the sim result equals the gloo one; the message says where they differ.

    Tensors: same dtype and shape; floating point with ``assert_close`` (default
    tolerances for the dtype), everything else exactly. Lists, tuples and dicts are
    compared element by element; other values with ``==``. A case that raised on a
    backend is recorded as ``{"__error__": "..."}`` and reported as such.
    """
    sim_error, gloo_error = _error_of(sim), _error_of(gloo)
    if sim_error or gloo_error:
        if sim_error == gloo_error:
            return
        raise AssertionError(f"{where}: sim {'raised ' + sim_error if sim_error else 'ran'}, "
                             f"gloo {'raised ' + gloo_error if gloo_error else 'ran'}")
    if isinstance(gloo, torch.Tensor):
        if not isinstance(sim, torch.Tensor):
            raise AssertionError(f"{where}: sim gave {type(sim).__name__}, gloo a tensor")
        if sim.dtype != gloo.dtype or sim.shape != gloo.shape:
            raise AssertionError(f"{where}: sim gave {sim.dtype} {tuple(sim.shape)}, gloo "
                                 f"{gloo.dtype} {tuple(gloo.shape)}")
        if gloo.is_floating_point() or gloo.is_complex():
            torch.testing.assert_close(sim, gloo, msg=lambda m: f"{where}: {m}")
        elif not torch.equal(sim, gloo):
            diff = (sim != gloo).nonzero()
            first = tuple(diff[0].tolist())
            raise AssertionError(
                f"{where}: {len(diff)} of {gloo.numel()} elements differ; first at index "
                f"{first}: sim {sim[first].item()}, gloo {gloo[first].item()}\n"
                f"sim:  {sim.tolist()}\ngloo: {gloo.tolist()}")
        return
    if isinstance(gloo, (list, tuple)):
        if type(sim) is not type(gloo) or len(sim) != len(gloo):
            raise AssertionError(f"{where}: sim gave {type(sim).__name__} of "
                                 f"{len(sim) if hasattr(sim, '__len__') else '?'}, gloo "
                                 f"{type(gloo).__name__} of {len(gloo)}")
        for i, (s, g) in enumerate(zip(sim, gloo)):
            assert_same(s, g, f"{where}[{i}]")
        return
    if isinstance(gloo, dict):
        if not isinstance(sim, dict) or set(sim) != set(gloo):
            raise AssertionError(f"{where}: sim gave {sim!r}, gloo {gloo!r}")
        for key in gloo:
            assert_same(sim[key], gloo[key], f"{where}[{key!r}]")
        return
    if sim != gloo:
        raise AssertionError(f"{where}: sim gave {sim!r}, gloo {gloo!r}")


# -------------------------------------------------------------------------- the runs
class _Runs:
    """Both backends' results for every selected world size, computed once per module.

    On first use: spawn the gloo workers, run the simulator for every world size while
    they start up (they spend most of their time importing torch, the simulator runs in
    this process: the two overlap on two cores), then collect gloo's results. A failure
    is remembered and reported by every test that needs it, instead of re-running the
    backends for each of the hundreds of test ids.
    """

    def __init__(self, world_sizes):
        self.world_sizes = world_sizes
        self._sim, self._gloo, self._gloo_run = None, None, None

    def _prepare(self):
        if self._sim is not None:
            return
        try:
            self._gloo_run = cases.GlooRun(self.world_sizes).start()
        except Exception as exc:  # noqa: BLE001 — reported by every test that needs it
            self._gloo = {n: exc for n in self.world_sizes}
        self._sim = {}
        for n in self.world_sizes:
            try:
                cluster = sc.Cluster.preset("dgx-a100", nodes=1)
                self._sim[n] = cluster.run(cases.all_cases, world_size=n, timeout=60).results
            except Exception as exc:  # noqa: BLE001
                self._sim[n] = exc
        if self._gloo is None:
            try:
                self._gloo = self._gloo_run.collect()
            except Exception as exc:  # noqa: BLE001
                self._gloo = {n: exc for n in self.world_sizes}

    def sim(self, n):
        self._prepare()
        return self._unwrap(self._sim.get(n), f"sim run of world size {n}")

    def gloo(self, n):
        self._prepare()
        return self._unwrap(self._gloo.get(n), f"gloo run of world size {n}")

    def close(self):
        if self._gloo_run is not None:
            self._gloo_run.close()  # never leave a worker behind, whatever happened

    @staticmethod
    def _unwrap(value, what):
        if value is None:
            pytest.fail(f"{what}: not run (world size not selected)", pytrace=False)
        if isinstance(value, BaseException):
            pytest.fail(f"{what} failed: {type(value).__name__}: {value}", pytrace=False)
        return value


@pytest.fixture(scope="module")
def runs(request):
    """The sim and gloo results, for the world sizes of the selected tests."""
    selected = {
        item.callspec.params["world_size"]
        for item in request.session.items
        if getattr(item, "module", None) is request.module
        and "world_size" in getattr(getattr(item, "callspec", None), "params", {})
    }
    needed = set(selected) | {2}  # the corrupted-result test uses world size 2
    result = _Runs(tuple(sorted(needed)))
    try:
        yield result
    finally:
        result.close()


def _params():
    params = []
    for n in WORLD_SIZES:
        for name in cases.case_names(n):
            reason = GLOO_UNRELIABLE.get((n, name)) or GLOO_UNRELIABLE.get((None, name))
            marks = [pytest.mark.skip(reason=reason)] if reason else []
            params.append(pytest.param(n, name, id=f"n{n}-{name}", marks=marks))
    return params


# ------------------------------------------------------------------------------ tests
@pytest.mark.parametrize("world_size, case", _params())
def test_sim_matches_gloo(runs, world_size, case):
    sim, gloo = runs.sim(world_size), runs.gloo(world_size)
    for rank in range(world_size):
        assert case in sim[rank], f"sim rank {rank} has no result for {case}"
        assert case in gloo[rank], f"gloo rank {rank} has no result for {case}"
        assert_same(sim[rank][case], gloo[rank][case], f"{case}, rank {rank}")


@pytest.mark.parametrize("world_size", WORLD_SIZES, ids=lambda n: f"n{n}")
def test_inputs_differ_per_rank(runs, world_size):
    """Guards the harness itself: identical inputs on every rank would hide many bugs
    (a broadcast from the wrong root, a gather in the wrong order)."""
    for rank_result in runs.sim(world_size):
        for dtype in ("f32", "f64", "i64", "bf16"):
            chunks = rank_result[f"all_gather-{dtype}"]
            assert len(chunks) == world_size
            for i in range(world_size):
                for j in range(i):
                    assert not torch.equal(chunks[i], chunks[j]), (dtype, i, j)


def test_comparison_detects_a_corrupted_sim_result(runs):
    """The suite can fail: corrupt real sim results and check assert_same reports it."""
    sim, gloo = runs.sim(2), runs.gloo(2)

    def corrupt(case, rank, change):
        good, reference = sim[rank][case], gloo[rank][case]
        assert_same(good, reference, case)  # the uncorrupted result passes
        bad = cases._clone(good)
        change(bad)
        with pytest.raises(AssertionError, match=case):
            assert_same(bad, reference, case)

    def bump(t, amount):
        t.view(-1)[3] += amount

    # float: an error of 1e-3 is far above float32 rounding, and must be caught
    corrupt("all_reduce-SUM-f32-len7", 0, lambda t: bump(t, 1e-3))
    corrupt("all_reduce-AVG-bf16-len7", 1, lambda t: bump(t, 0.25))
    # integers compare exactly: off by one fails
    corrupt("all_reduce-SUM-i64-len10", 1, lambda t: bump(t, 1))
    # a chunk inside a list result (all_gather), and a list of the wrong length
    corrupt("all_gather-i64", 0, lambda chunks: bump(chunks[1], 1))
    corrupt("gather-dst0-f64", 0, lambda chunks: chunks.pop())
    # the wrong dtype, even with equal values
    sim_copy = sim[0]["broadcast-src1-f32"].double()
    with pytest.raises(AssertionError, match="float64"):
        assert_same(sim_copy, gloo[0]["broadcast-src1-f32"], "broadcast")
    # a value where gloo has none (reduce: only dst has a result), and a raised case
    with pytest.raises(AssertionError):
        assert_same(torch.zeros(7), gloo[1]["reduce-dst0-SUM-f32"], "reduce")
    with pytest.raises(AssertionError, match="sim raised"):
        assert_same({"__error__": "ValueError: boom"}, gloo[0]["barrier"], "barrier")
