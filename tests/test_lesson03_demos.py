"""workbook.lesson03_data_parallel.demos: the shortcuts that make lesson 03 cheaper to
simulate leave what it measures unchanged."""

import pytest

import simcluster as sc
from workbook.lesson03_data_parallel import demos as dp


@pytest.fixture(scope="module")
def one_node():
    return sc.Cluster.preset("dgx-a100")


def test_ddp_without_init_sync_times_the_same_step(one_node):
    """DDP's construction broadcast comes before the timed step: skipping it
    (init_sync=False) leaves the step's time, collectives and peak as they were."""
    def step(init_sync):
        report, _ = dp.measure(one_node, 4, warmup=2, model_kwargs={"depth": 4},
                               ddp_kwargs={"bucket_cap_mb": 0.3, "init_sync": init_sync})
        return report

    skip, sync = step(False), step(True)
    assert skip.time == pytest.approx(sync.time, rel=1e-12)
    assert skip.comm == pytest.approx(sync.comm, rel=1e-12)
    assert [(c.op, c.nbytes) for c in skip.collectives] == [(c.op, c.nbytes) for c in sync.collectives]
    assert len(skip.all_reduces) > 1 and skip.peak == sync.peak
