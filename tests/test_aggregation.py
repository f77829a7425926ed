"""workbook.lesson02_gradient_aggregation.demos:
what lesson 02 and its lab import — no answers, and the
workbook's own methods runnable by name only through the measuring functions."""

import pytest
import torch

import simcluster as sc
from workbook.lesson02_gradient_aggregation import demos as agg

CLUSTER = sc.Cluster.preset("hetero-11")   # ranks 0-3 on node 0, 4-7 on node 1


@pytest.mark.parametrize("method", agg.METHODS)
def test_every_named_method_runs_and_reports_its_cost(method):
    extra = (4,) if method == "hierarchical" else ()
    m = agg.measure_allreduce(CLUSTER, method, 8, 1 << 10, extra)
    assert m["bytes"] > 0 and m["messages"] > 0 and m["seconds"] > 0
    assert 0 < m["cross_node_bytes"] <= m["total_bytes"]
    exact = method in ("naive", "ring", "tree", "halving-doubling", "hierarchical")
    assert (m["relative_error"] < 1e-6) == exact, m


def test_halving_doubling_pairs_the_nearest_partner_first():
    """MPICH's order: on two nodes of four only the last, smallest exchanges cross the
    network, 2n bytes in all (farthest first would send 8n)."""
    n = 1 << 12
    m = agg.measure_allreduce(CLUSTER, "halving-doubling", 8, n)
    assert m["cross_node_bytes"] == 2 * 4 * n


def test_a_function_is_measured_as_given():
    def doubles(tensor):        # not an all-reduce: the error says so
        tensor *= 2

    m = agg.measure_allreduce(CLUSTER, doubles, 2, 8)
    assert m["bytes"] == 0 and m["relative_error"] > 0.1


def test_an_unknown_name_is_refused_with_the_known_ones():
    with pytest.raises(ValueError, match="no method named 'rings': choose one of naive, ring"):
        agg.measure_allreduce(CLUSTER, "rings", 8, 8)


def test_compare_runs_named_methods_and_the_workbooks_own_server():
    problem = agg.TinyMLP(features=8, hidden=8, classes=3, samples=256, seed=1)
    results = agg.compare(CLUSTER, problem, {
        "tree": {"aggregate": "tree"},
        "fp16": {"aggregate": "fp16"},
        "local SGD": {"aggregate": "ring", "sync_every": 2},
        "PS sync": {"mode": "sync", "speeds": [1] * 7},
    }, steps=4, batch=8)
    for name, r in results.items():
        assert len(r["loss"]) > 1 and r["seconds_per_step"] > 0, name
    assert results["fp16"]["bytes_per_step"] < results["tree"]["bytes_per_step"]
    assert abs(results["fp16"]["loss"][-1] - results["tree"]["loss"][-1]) < 1e-2


def test_compare_passes_a_specs_args_after_the_tensor():
    """Hierarchical needs its ranks per node, which train() cannot know: ``"args"``."""
    problem = agg.TinyMLP(features=8, hidden=8, classes=3, samples=256, seed=1)
    results = agg.compare(CLUSTER, problem, {
        "ring": {"aggregate": "ring"},
        "hierarchical": {"aggregate": "hierarchical", "args": (4,)},
    }, steps=2, batch=8)
    assert results["hierarchical"]["loss"] == pytest.approx(results["ring"]["loss"], rel=1e-5)
    assert results["hierarchical"]["seconds_per_step"] != results["ring"]["seconds_per_step"]


def test_int8_and_topk_all_reduces_take_the_learners_pieces():
    calls = []

    def quantize(x):
        calls.append("q")
        scale = x.abs().max() / 127 if x.abs().max() > 0 else torch.tensor(1.0)
        return torch.round(x / scale).to(torch.int8), scale

    def run():
        t = torch.ones(8)
        agg.int8_allreduce(t, quantize, lambda q, s: q.float() * s)
        return t

    out = CLUSTER.run(run, world_size=2, accounting=False).results[0]
    assert calls and torch.allclose(out, torch.full((8,), 2.0), rtol=1e-2)
