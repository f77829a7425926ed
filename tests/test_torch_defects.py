"""Five places where the "sim" backend parted from gloo under PyTorch's own distributed
tests (issue 43). Each test runs, inside ``cluster.run``, what one of torch's tests does,
and asserts what gloo does; each failed before its fix:

1. uneven shards on a 2-D mesh came back from ``full_tensor()`` wrong (a zero row in,
   the last row lost): DTensor's redistribution-plan caches were shared by the ranks;
2. all_reduce's write bumped the autograd version counter, so a view of its output, or
   a backward that saved it, failed ("modified by an inplace operation"), where gloo
   writes in C++, out of autograd's sight;
3. ``torch.compile(fullgraph=True)`` in a rank raised ``Unsupported``;
4. ``pg_tag`` was dropped (``ptd:N``), a second creation made a new group;
5. ``CommDebugMode`` counted nothing for the c10d collectives (tests/test_torch_harness.py
   compares its counts with gloo's).
"""

import pytest
import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor

import simcluster as sc


def _run(fn, world_size):
    return sc.Cluster.preset("dgx-a100").run(fn, world_size=world_size).results


# ----------------------------------------------------------------- 1: per-rank plans
def _uneven_2d_round_trip():
    mesh = init_device_mesh("cpu", (2, 2))
    full = torch.arange(45.).reshape(9, 5)
    rows = []
    for placements in ([Shard(0), Shard(0)], [Shard(0), Shard(1)], [Shard(1), Shard(0)],
                       [Replicate(), Shard(0)]):
        dt = distribute_tensor(full, mesh, placements)
        rows.append(torch.equal(dt.full_tensor(), full))
        rows.append(torch.equal(dt.redistribute(mesh, [Shard(1), Replicate()]).full_tensor(),
                                full))
    return rows


def test_uneven_shards_on_a_2d_mesh_come_back_whole_on_every_rank():
    # rank 0's plan (its local shape 5 rows, then 3) reused by rank 2 (4 rows, then 2)
    # gave every rank a zero row and lost the last
    for rank, ok in enumerate(_run(_uneven_2d_round_trip, 4)):
        assert all(ok), f"rank {rank}: {ok}"


# -------------------------------------------------------- 2: the version counter
def _backward_through_a_reduced_saved_tensor():
    x = torch.ones(4, requires_grad=True)
    y = x * 2
    z = y * y                      # saves y for backward
    before = y._version
    dist.all_reduce(y)
    z.sum().backward()             # gloo: no "modified by an inplace operation"
    return y._version - before, x.grad


def _view_of_a_split_output():
    x = torch.ones(4, requires_grad=True)
    first, second = x.clone().split(2)     # views of a multi-output function
    dist.all_reduce(second)
    (second * 3).sum().backward()          # gloo: no "Output 1 of Split is a view"
    return x.grad


def test_all_reduce_leaves_the_version_counter_alone_as_gloo_does():
    for bumped, grad in _run(_backward_through_a_reduced_saved_tensor, 2):
        assert bumped == 0
        # the backward uses the saved y as it is now (reduced, 4s): d(y*y)/dx = 2*y*2
        assert torch.equal(grad, torch.full((4,), 16.))
    for grad in _run(_view_of_a_split_output, 2):
        assert torch.equal(grad, torch.tensor([0., 0., 3., 3.]))
    # (gloo copies all_gather's results in with copy_, which autograd sees: the sim
    # moves the counter there too, see test_torch_harness.py)


# ------------------------------------------------------------- 3: torch.compile
def _compiled_matches_eager():
    def step(w, x):
        return torch.nn.functional.gelu(x @ w).sum(dim=0)

    compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
    torch.manual_seed(dist.get_rank())
    w, x = torch.randn(8, 8), torch.randn(4, 8)
    got = compiled(w, x)
    dist.all_reduce(got)
    want = step(w, x)
    dist.all_reduce(want)
    return torch.equal(got, want)


def test_torch_compile_fullgraph_runs_inside_ranks():
    assert _run(_compiled_matches_eager, 2) == [True, True]


def _matmuls(compiled):
    def step(w, x):
        return (x @ w).relu()

    fn = torch.compile(step, fullgraph=True, backend="aot_eager") if compiled else step
    w, x = torch.randn(512, 512), torch.randn(256, 512)
    for _ in range(4):
        fn(w, x)


def test_compiled_code_is_charged_as_its_eager_ops():
    # the accounting mode sees the compiled graph's ops when they run
    node = sc.Cluster.preset("dgx-a100")
    eager = node.run(_matmuls, world_size=1, args=(False,)).elapsed
    compiled = node.run(_matmuls, world_size=1, args=(True,)).elapsed
    assert eager > 0 and compiled == pytest.approx(eager, rel=1e-12)


# ----------------------------------------------------------------- 4: group tags
def _tagged_groups():
    first = c10d._new_group_with_tag([0, 1], pg_tag="blu")
    again = c10d._new_group_with_tag([0, 1], pg_tag="blu")
    untagged = dist.new_group([0, 1])      # the group counter stayed in step
    if first is c10d.GroupMember.NON_GROUP_MEMBER:
        return "not a member", again is c10d.GroupMember.NON_GROUP_MEMBER
    dist.all_reduce(torch.ones(1), group=untagged)
    return (c10d._get_group_tag(first), first is again,
            c10d._find_pg_by_ranks_and_tag("blu", [0, 1]) is first,
            c10d._find_pg_by_ranks_and_tag("user:blu", [0, 1]) is first,
            first is untagged)


@pytest.mark.parametrize("world_size", [2, 3])
def test_a_group_keeps_its_tag_and_is_found_by_it(world_size):
    results = _run(_tagged_groups, world_size)
    for rank, result in enumerate(results):
        if rank < 2:
            assert result == ("blu", True, True, True, False), f"rank {rank}"
        else:   # as in gloo, a rank outside gets GroupMember.NON_GROUP_MEMBER both times
            assert result == ("not a member", True)
