"""In-place all-to-all (output is the input) against answers worked out by hand.

gloo gets ``all_to_all_single(x, x)`` wrong (usually: it races), so the differential test
cannot vouch for the sim here; these expectations are computed from the definition instead.
"""

import torch
import torch.distributed as dist

import simcluster as sc


def _in_place_all_to_all_single():
    rank = dist.get_rank()
    x = torch.arange(6.0) + 100 * rank
    dist.all_to_all_single(x, x)
    return x.tolist()


def _in_place_all_to_all():
    rank = dist.get_rank()
    xs = [torch.tensor([10 * rank + j]) for j in range(dist.get_world_size())]
    dist.all_to_all(xs, xs)
    return [t.item() for t in xs]


def test_in_place_all_to_all_single_matches_its_definition():
    run = sc.Cluster.preset("dgx-a100").run(_in_place_all_to_all_single, world_size=2)
    # rank i receives chunk i of every rank, in rank order
    assert run.results == [[0.0, 1.0, 2.0, 100.0, 101.0, 102.0],
                           [3.0, 4.0, 5.0, 103.0, 104.0, 105.0]]


def test_in_place_all_to_all_matches_its_definition():
    run = sc.Cluster.preset("dgx-a100").run(_in_place_all_to_all, world_size=3)
    assert run.results == [[0, 10, 20], [1, 11, 21], [2, 12, 22]]
