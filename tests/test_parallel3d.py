"""The lesson 09 demo: a GPT trained on a (pp, dp, tp) mesh equals the one-process model."""

import pytest
import torch

import simcluster as sc
from workbook import parallel3d as p3

TWO_NODES = {"nodes": [{"devices": 4, "count": 2}]}     # 2 nodes x 4 GPUs: 8 ranks


@pytest.fixture(scope="module")
def cluster():
    return sc.Cluster.from_dict(TWO_NODES)


def _compare(run, pp, dp, m, **kwargs):
    """Largest differences (losses, gradients, updated parameters) between the 3D run and
    :func:`p3.reference_step`; also checks that every parameter of the model was seen."""
    ref = p3.reference_step(chunks=dp * m, steps=kwargs.get("steps", 1))
    losses = [loss for r in run.results if r["coords"]["pp"] == pp - 1 and r["coords"]["tp"] == 0
              for loss in r["losses"]]
    assert len(losses) == len(ref["losses"]) == dp * m
    seen = {p3._plain_name(n) for r in run.results for n in r["grads"]}
    assert seen == set(ref["grads"])
    diff = {"loss": max(abs(a - b) for a, b in zip(losses, ref["losses"])),
            "grad": max((g - ref["grads"][p3._plain_name(n)]).abs().max().item()
                        for r in run.results for n, g in r["grads"].items()),
            "param": max((p - ref["params"][p3._plain_name(n)]).abs().max().item()
                         for r in run.results for n, p in r["params"].items())}
    # the step did change the parameters (a run that skips the update would still match)
    moved = max((ref["params"][n] - p).abs().max().item()
                for n, p in dict(p3.GPT().named_parameters()).items())
    assert moved > 1e-4
    return diff


@pytest.mark.parametrize("layout", [(2, 2, 2),
                                    pytest.param((1, 2, 4), marks=pytest.mark.slow),
                                    pytest.param((4, 2, 1), marks=pytest.mark.slow)])
def test_3d_step_equals_one_process(cluster, layout):
    pp, dp, tp = layout
    m = max(2, pp)
    run = cluster.run(p3.train_step, world_size=8, args=layout, kwargs={"micro_batches": m})
    diff = _compare(run, pp, dp, m)
    assert diff["loss"] < 1e-5 and diff["grad"] < 1e-6 and diff["param"] < 1e-6, diff


def test_3d_recompute_two_steps_equal_one_process(cluster):
    run = cluster.run(p3.train_step, world_size=8, args=(2, 2, 2),
                      kwargs={"micro_batches": 2, "recompute": True, "steps": 2,
                              "schedule": "GPipe"})
    diff = _compare(run, 2, 2, 2, steps=2)
    assert diff["loss"] < 1e-5 and diff["grad"] < 1e-6 and diff["param"] < 1e-6, diff


def _mesh_only(pp, dp, tp, across):
    mesh = p3.make_mesh(pp, dp, tp, across)
    return p3.coordinates(mesh), p3.group_ranks(mesh)


@pytest.mark.parametrize("across", [False, True])
def test_mesh_places_tp_inside_or_across_nodes(cluster, across):
    run = cluster.run(_mesh_only, world_size=8, args=(2, 2, 2, across), accounting=False)
    coords = [c for c, _ in run.results]
    # every coordinate once
    assert sorted((c["pp"], c["dp"], c["tp"]) for c in coords) == [
        (i, j, k) for i in range(2) for j in range(2) for k in range(2)]
    node = cluster.spec.node_of
    for rank, (_, groups) in enumerate(run.results):
        assert rank in groups["tp"] and len(groups["tp"]) == 2
        same_node = len({node(r) for r in groups["tp"]}) == 1
        assert same_node != across
        # the pipeline's stages: on different nodes by default, inside one when TP crosses
        assert (len({node(r) for r in groups["pp"]}) == 1) == across
    if not across:
        assert coords[5] == {"pp": 1, "dp": 0, "tp": 1}


def test_tp_across_nodes_is_slower(cluster):
    inside = cluster.run(p3.train_step, world_size=8, args=(2, 2, 2))
    across = cluster.run(p3.train_step, world_size=8, args=(2, 2, 2),
                         kwargs={"tp_across_nodes": True})
    assert across.elapsed > 1.2 * inside.elapsed


def test_bad_batch_names_the_values(cluster):
    with pytest.raises(sc.RankError, match="batch=6 does not split into dp=2"):
        cluster.run(p3.train_step, world_size=8, args=(2, 2, 2), kwargs={"batch": 6},
                    accounting=False)
