"""Tests written on the distributed test harness that ships in the torch wheel
(``torch.testing._internal``), run on the "sim" backend (see ``_sim_harness.py``): DTensor
redistribution on uneven shards and 2-D meshes, functional collectives, process-group
tags, FSDP2 initialisation, and ``CommDebugMode`` counts equal to gloo's. They are
ours, not copies of torch's tests; they use its harness so that a torch upgrade that
changes what the harness's tests rely on shows here at once.
"""

import os
import sys
import unittest

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
import torch.distributed.distributed_c10d as c10d
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Partial, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode
from torch.testing._internal.common_distributed import MultiThreadedTestCase
from torch.testing._internal.common_fsdp import FSDPTestMultiThread
from torch.testing._internal.distributed._tensor.common_dtensor import DTensorOpTestBase

_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:   # the gloo workers import the program by module name
    sys.path.insert(0, _HERE)

import _comm_counts_program as program  # noqa: E402
import _differential_cases as cases  # noqa: E402
from _sim_harness import CLUSTER, OnTheSim  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:.*is deprecated.*:FutureWarning")

PLACEMENTS_1D = ([Shard(0)], [Shard(1)], [Replicate()])
PLACEMENTS_2D = ([Shard(0), Shard(0)], [Shard(0), Shard(1)], [Shard(1), Shard(0)],
                 [Replicate(), Shard(0)], [Shard(1), Replicate()], [Replicate(), Replicate()])


class DTensorRedistribution(OnTheSim, DTensorOpTestBase):
    """Four ranks; shapes that no mesh dimension divides."""

    def _round_trips(self, mesh, placements, shapes):
        for shape in shapes:
            full = torch.arange(float(torch.Size(shape).numel())).reshape(shape)
            for src in placements:
                dt = distribute_tensor(full, mesh, src)
                self.assertEqual(dt.full_tensor(), full, msg=f"{shape} {src}")
                for dst in placements:
                    moved = dt.redistribute(mesh, dst)
                    self.assertEqual(moved.placements, tuple(dst))
                    self.assertEqual(moved.full_tensor(), full, msg=f"{shape} {src}->{dst}")

    def test_uneven_shards_on_a_1d_mesh(self):
        mesh = init_device_mesh(self.device_type, (self.world_size,))
        self._round_trips(mesh, PLACEMENTS_1D, [(9, 5), (3, 7), (1, 2)])

    def test_uneven_shards_on_a_2d_mesh(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        self._round_trips(mesh, PLACEMENTS_2D, [(9, 5), (5, 3), (3, 9)])

    def test_local_shapes_follow_torch_chunk(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        dt = distribute_tensor(torch.ones(9, 5), mesh, [Shard(0), Shard(0)])
        # chunk(9, 2) -> 5, 4 rows; each chunked again: 3, 2 and 2, 2
        self.assertEqual(dt.to_local().shape[0], (3, 2, 2, 2)[self.rank])

    def test_partial_sums_to_the_whole(self):
        mesh = init_device_mesh(self.device_type, (2, 2))
        local = torch.full((3, 3), float(self.rank + 1))
        dt = DTensor.from_local(local, mesh, [Partial(), Partial()])
        self.assertEqual(dt.full_tensor(), torch.full((3, 3), 10.))


class FunctionalCollectivesAndTags(OnTheSim, MultiThreadedTestCase):
    @property
    def world_size(self):
        return 4

    def setUp(self):
        super().setUp()
        self._spawn_threads()

    def test_functional_collectives(self):
        group = dist.group.WORLD
        x = torch.arange(4.) + 10 * self.rank
        self.assertEqual(funcol.all_reduce(x, "sum", group), torch.arange(4.) * 4 + 60)
        gathered = funcol.all_gather_tensor(x, 0, group)
        self.assertEqual(gathered, torch.cat([torch.arange(4.) + 10 * r for r in range(4)]))
        scattered = funcol.reduce_scatter_tensor(torch.arange(8.), "sum", 0, group)
        self.assertEqual(scattered, torch.arange(8.)[2 * self.rank:2 * self.rank + 2] * 4)
        swapped = funcol.all_to_all_single(x, None, None, group)
        self.assertEqual(swapped, torch.tensor([10. * r + self.rank for r in range(4)]))
        self.assertEqual(funcol.broadcast(x, 2, group), torch.arange(4.) + 20)

    def test_functional_collectives_on_ranks_and_a_tag(self):
        # functional collectives find a group by its ranks and its tag
        everyone = list(range(self.world_size))
        group = c10d._new_group_with_tag(everyone, pg_tag="everyone")
        x = torch.tensor([float(self.rank)])
        with CommDebugMode() as mode:
            out = funcol.all_reduce(x, "sum", everyone, tag="everyone")
        self.assertEqual(out, torch.tensor([6.]))
        self.assertEqual(mode.get_total_counts(), 1)
        self.assertIs(c10d._find_pg_by_ranks_and_tag("everyone", everyone), group)
        self.assertEqual(c10d._get_group_tag(group), "everyone")
        self.assertEqual(len(c10d._world.tags_to_pg["user:everyone"]), 1)

    def test_a_tagged_group_is_created_once(self):
        first = c10d._new_group_with_tag([1, 2], pg_tag="blu")
        again = c10d._new_group_with_tag([1, 2], pg_tag="blu")
        other = dist.new_group([0, 3])
        if self.rank in (1, 2):
            self.assertIs(first, again)
            self.assertEqual(c10d._get_group_tag(first), "blu")
            self.assertIs(c10d._find_pg_by_ranks_and_tag("blu", [1, 2]), first)
            x = torch.ones(1)
            dist.all_reduce(x, group=first)
            self.assertEqual(x, torch.tensor([2.]))
        else:
            self.assertIs(first, c10d.GroupMember.NON_GROUP_MEMBER)
            self.assertIsNone(c10d._find_pg_by_ranks_and_tag("blu", [1, 2]))
            self.assertTrue(c10d._get_group_tag(other).startswith("ptd:"))


class FullyShardInitialisation(OnTheSim, FSDPTestMultiThread):
    @property
    def world_size(self):
        return 2

    def test_fully_shard_shards_on_dim_0_and_matches_the_unsharded_model(self):
        from torch.distributed.fsdp import fully_shard

        torch.manual_seed(0)
        reference = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
        model = nn.Sequential(nn.Linear(5, 7), nn.ReLU(), nn.Linear(7, 3))
        model.load_state_dict(reference.state_dict())
        for layer in (model[0], model[2]):
            fully_shard(layer)
        fully_shard(model)
        for (name, p), (_, q) in zip(model.named_parameters(), reference.named_parameters()):
            self.assertIsInstance(p, DTensor)
            self.assertEqual(p.placements, (Shard(0),))
            self.assertEqual(p.full_tensor(), q, msg=name)
        x = torch.randn(4, 5, generator=torch.Generator().manual_seed(1))
        with CommDebugMode() as mode:
            out = model(x)
        self.assertEqual(out, reference(x))
        self.assertEqual(mode.get_total_counts(), 2)   # one all-gather per layer


def test_the_harness_leaves_the_process_as_it_was():
    """torch's harness freezes torch.backends' flags on import and sets an environment
    variable in every setUp: _sim_harness undoes both for the rest of the suite."""
    before = os.environ.get("TORCH_SHOW_CPP_STACKTRACES")
    result = unittest.TestResult()
    FunctionalCollectivesAndTags("test_a_tagged_group_is_created_once").run(result)
    assert result.wasSuccessful(), result.errors + result.failures
    assert os.environ.get("TORCH_SHOW_CPP_STACKTRACES") == before
    assert not torch.backends.flags_frozen()


# ------------------------------------------------------------- CommDebugMode vs gloo
@pytest.fixture(scope="module")
def sim_and_gloo():
    """``program.counts_and_bumps`` on two simulated ranks and on two gloo processes."""
    gloo = cases.GlooRun(world_sizes=(2,), target=program.counts_and_bumps).start()
    try:
        sim = CLUSTER.run(program.counts_and_bumps, world_size=2).results
        on_gloo = gloo.collect()[2]
    finally:
        gloo.close()
    if isinstance(on_gloo, Exception):
        raise on_gloo
    return sim, on_gloo


@pytest.mark.slow   # spawns 2 gloo processes
def test_comm_debug_mode_counts_on_the_sim_equal_gloos(sim_and_gloo):
    sim, gloo = sim_and_gloo
    assert [r["counts"] for r in sim] == [r["counts"] for r in gloo]
    assert sim[0]["counts"]["c10d.allreduce_"] == 2 and len(sim[0]["counts"]) >= 12


@pytest.mark.slow
def test_collectives_move_the_version_counter_as_gloos_do(sim_and_gloo):
    sim, gloo = sim_and_gloo
    assert [r["bumps"] for r in sim] == [r["bumps"] for r in gloo]
    assert gloo[0]["bumps"]["all_reduce"] == 0   # the case of issue 43
