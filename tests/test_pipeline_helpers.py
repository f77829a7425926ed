"""workbook.pipeline: stage splitting, the bubble formula, and the measured bubble."""

import pytest
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc
from workbook import pipeline


def _layers(n):
    return nn.Sequential(*[nn.Linear(2, 2) for _ in range(n)])


def test_split_equal_and_uneven():
    model = _layers(10)
    stages = pipeline.split(model, 4)
    assert [len(s) for s in stages] == [3, 3, 2, 2]
    assert stages[0][0] is model[0] and stages[-1][-1] is model[9]
    assert [len(s) for s in pipeline.split(model, 3, [2, 7])] == [2, 5, 3]


@pytest.mark.parametrize("boundaries", [[5], [0, 4, 8], [4, 4, 8], [3, 8, 10], [8, 4, 2]])
def test_split_refuses_bad_boundaries(boundaries):
    with pytest.raises(ValueError, match="do not cut 10 layers into 4"):
        pipeline.split(_layers(10), 4, boundaries)


def test_bubble_formula():
    assert pipeline.bubble_formula(4, 8) == pytest.approx(3 / 11)
    assert pipeline.bubble_formula(4, 8, v=2) == pytest.approx(3 / 19)
    assert pipeline.bubble_formula(1, 8) == 0


def test_measured_bubble_of_a_relay():
    # Rank 0 computes, then rank 1: each idles half of the wall time, give or take the
    # message between them.
    def relay():
        import torch
        x = torch.ones(256, 256)
        if dist.get_rank() == 1:
            dist.recv(x, 0)
        for _ in range(20):
            x = x @ x / 256
        if dist.get_rank() == 0 and dist.get_world_size() == 2:
            dist.send(x, 1)

    run = sc.Cluster.preset("dgx-a100").run(relay, world_size=2)
    assert 0.45 < pipeline.bubble(run) < 0.55
    clock = run.clock(1)
    assert pipeline.bubble(run, ranks=[1]) == pytest.approx(1 - clock.compute / run.elapsed)
    alone = sc.Cluster.preset("dgx-a100").run(relay, world_size=1)
    assert pipeline.bubble(alone) == pytest.approx(0, abs=1e-9)
