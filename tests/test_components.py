"""Real PyTorch distributed components run unchanged on the simulated cluster.

Each test runs a component on several simulated ranks and compares what it computes with a
single-process reference: DDP, FSDP2 ``fully_shard``, DTensor tensor parallelism,
``torch.distributed.pipelining``, a 2-D device mesh, sub-groups, ``batch_isend_irecv`` and a
learner's own ``init_process_group`` / ``destroy_process_group``.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc

ATOL = 1e-6


@pytest.fixture(scope="module")
def cluster():
    return sc.Cluster.preset("dgx-a100", nodes=1)


def _assert_close(got, want, what):
    assert len(got) == len(want), what
    for i, (a, b) in enumerate(zip(got, want)):
        assert a.shape == b.shape, f"{what}[{i}]: shape {tuple(a.shape)} vs {tuple(b.shape)}"
        assert torch.allclose(a, b, atol=ATOL), (
            f"{what}[{i}]: max abs difference {(a - b).abs().max().item():.3g}")


def _assert_equal_on_every_rank(results, what):
    for r in range(1, len(results)):
        for i, (a, b) in enumerate(zip(results[0], results[r])):
            assert torch.equal(a, b), f"{what}[{i}] differs between rank 0 and rank {r}"


def _mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def _data(steps, batch, seed=1):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(steps, batch, 8, generator=g), torch.randn(steps, batch, 4, generator=g)


def _mse(out, y):
    return ((out - y) ** 2).mean()


def _train_reference(steps, batch, lr=0.1):
    """One process, one model, the whole (concatenated) batch."""
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    xs, ys = _data(steps, batch)
    for s in range(steps):
        opt.zero_grad()
        _mse(model(xs[s]), ys[s]).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


# ======================================================================= DDP
def _ddp_train(steps, batch):
    from torch.nn.parallel import DistributedDataParallel as DDP
    r, n = dist.get_rank(), dist.get_world_size()
    model = _mlp()
    ddp = DDP(model, bucket_cap_mb=0.0001)  # several buckets
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    xs, ys = _data(steps, batch)
    for s in range(steps):
        x, y = xs[s].chunk(n)[r], ys[s].chunk(n)[r]  # each rank: its slice of the batch
        opt.zero_grad()
        _mse(ddp(x), y).backward()
        opt.step()
    return [p.detach().clone() for p in model.parameters()]


def test_ddp_matches_single_process_training(cluster):
    steps, batch = 4, 16
    results = cluster.run(_ddp_train, world_size=4, args=(steps, batch)).results
    _assert_equal_on_every_rank(results, "DDP parameters")
    _assert_close(results[0], _train_reference(steps, batch), "DDP vs reference")
    # and training did change the parameters
    assert not torch.allclose(results[0][0], _mlp()[0].weight)


# ============================================================== FSDP2 fully_shard
def _fsdp_train(steps, batch):
    from torch.distributed.fsdp import fully_shard
    r, n = dist.get_rank(), dist.get_world_size()
    model = _mlp()
    fully_shard(model[0])
    fully_shard(model[2])
    fully_shard(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = _data(steps, batch)
    for s in range(steps):
        x, y = xs[s].chunk(n)[r], ys[s].chunk(n)[r]
        opt.zero_grad()
        _mse(model(x), y).backward()
        opt.step()
    sharded = {k: tuple(v.to_local().shape) for k, v in model.state_dict().items()}
    full = [v.full_tensor().detach().clone() for v in model.state_dict().values()]
    return full, sharded


def test_fsdp2_fully_shard_matches_single_process_training(cluster):
    steps, batch = 3, 8
    results = cluster.run(_fsdp_train, world_size=2, args=(steps, batch)).results
    full = [res[0] for res in results]
    _assert_equal_on_every_rank(full, "FSDP2 full parameters")
    _assert_close(full[0], _train_reference(steps, batch), "FSDP2 vs reference")
    # the parameters really were sharded: each rank holds half of dim 0
    sharded = results[0][1]
    assert sharded["0.weight"] == (8, 8) and sharded["2.weight"] == (2, 16)


# ================================================================ DTensor TP
def _tp_forward_backward():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = _mlp()
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    local_shapes = [tuple(p.to_local().shape) for p in model.parameters()]
    x, y = _data(1, 6)
    out = model(x[0])
    _mse(out, y[0]).backward()
    grads = [p.grad.full_tensor().detach().clone() for p in model.parameters()]
    return out.detach().clone(), grads, local_shapes


def test_dtensor_colwise_rowwise_mlp_matches_reference(cluster):
    results = cluster.run(_tp_forward_backward, world_size=2).results
    model = _mlp()
    x, y = _data(1, 6)
    out = model(x[0])
    _mse(out, y[0]).backward()
    ref_grads = [p.grad for p in model.parameters()]
    for r, (got_out, got_grads, local_shapes) in enumerate(results):
        _assert_close([got_out], [out.detach()], f"TP output on rank {r}")
        _assert_close(got_grads, ref_grads, f"TP grads on rank {r}")
        # colwise shards the first layer's rows, rowwise the second layer's columns
        assert local_shapes == [(8, 8), (8,), (4, 8), (4,)]


# ================================================================ pipelining
def _deep_mlp():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 16), nn.ReLU(),
                         nn.Linear(16, 4))


def _pipeline(schedule_name, n_microbatches):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe
    r, n = dist.get_rank(), dist.get_world_size()
    model = _deep_mlp()
    part = [model[0:2], model[2:5]][r]
    stage = PipelineStage(part, r, n, torch.device("cpu"))
    schedule_cls = {"gpipe": ScheduleGPipe, "1f1b": Schedule1F1B}[schedule_name]
    schedule = schedule_cls(stage, n_microbatches=n_microbatches, loss_fn=_mse)
    x, y = _data(1, 8)
    losses = []
    if r == 0:
        schedule.step(x[0])
    else:
        schedule.step(target=y[0], losses=losses)
    return [p.grad.detach().clone() for p in part.parameters()], [l.detach() for l in losses]



@pytest.mark.parametrize("accounting", [True, False], ids=["accounting", "no-accounting"])
@pytest.mark.parametrize("schedule_name", ["gpipe", "1f1b"])
def test_pipelining_two_stages_matches_reference(cluster, schedule_name, accounting):
    n_mb = 4
    results = cluster.run(_pipeline, world_size=2, args=(schedule_name, n_mb),
                          accounting=accounting).results
    model = _deep_mlp()
    x, y = _data(1, 8)
    mb_losses = [_mse(model(xc), yc) for xc, yc in zip(x[0].chunk(n_mb), y[0].chunk(n_mb))]
    (sum(mb_losses) / n_mb).backward()  # the schedule averages the micro-batch losses' grads
    ref_grads = [p.grad for p in model.parameters()]
    got_grads = results[0][0] + results[1][0]
    _assert_close(got_grads, ref_grads, f"{schedule_name} grads")
    assert results[0][1] == []
    _assert_close(results[1][1], [l.detach() for l in mb_losses], f"{schedule_name} losses")


# =================================================== 2-D mesh: TP inside, FSDP across
def _mesh_2d(steps):
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                                   parallelize_module)
    mesh = init_device_mesh("cpu", (2, 2), mesh_dim_names=("dp", "tp"))
    dp_rank, dp_size = mesh["dp"].get_local_rank(), mesh["dp"].size()
    model = _mlp()
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    fully_shard(model, mesh=mesh["dp"])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = _data(steps, 8)
    outs = []
    for s in range(steps):
        x, y = xs[s].chunk(dp_size)[dp_rank], ys[s].chunk(dp_size)[dp_rank]
        opt.zero_grad()
        out = model(x)
        outs.append(out.detach().clone())
        _mse(out, y).backward()
        opt.step()
    full = [v.full_tensor().detach().clone() for v in model.state_dict().values()]
    return dp_rank, mesh["tp"].get_local_rank(), outs, full


def test_2d_mesh_tp_inside_fsdp_across_matches_reference(cluster):
    steps = 2
    results = cluster.run(_mesh_2d, world_size=4, args=(steps,)).results
    assert [(dp, tp) for dp, tp, _, _ in results] == [(0, 0), (0, 1), (1, 0), (1, 1)]
    # reference: one process, the whole batch; its outputs are the dp slices'
    model = _mlp()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    xs, ys = _data(steps, 8)
    ref_outs = []
    for s in range(steps):
        opt.zero_grad()
        out = model(xs[s])
        ref_outs.append(out.detach().clone())
        _mse(out, ys[s]).backward()
        opt.step()
    for dp, tp, outs, full in results:
        _assert_close(outs, [o.chunk(2)[dp] for o in ref_outs], f"2-D outputs (dp {dp}, tp {tp})")
        _assert_close(full, [p.detach() for p in model.parameters()],
                      f"2-D parameters (dp {dp}, tp {tp})")


# ================================================================= sub-groups
def _subgroups():
    r = dist.get_rank()
    even, odd = dist.new_group([0, 2]), dist.new_group([1, 3])
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]
    mine = even if r % 2 == 0 else odd
    t = torch.tensor([float(r)])
    dist.all_reduce(t, group=mine)
    b = torch.tensor([float(r)])
    dist.broadcast(b, src=2 if r % 2 == 0 else 3, group=mine)  # src is a global rank
    pair = pairs[r // 2]
    gathered = [torch.zeros(2) for _ in range(2)]
    dist.all_gather(gathered, torch.full((2,), float(r * 10)), group=pair)
    w = torch.tensor([1.0])
    dist.all_reduce(w)  # the default group still works after sub-group collectives
    return (t.item(), b.item(), dist.get_rank(mine), dist.get_world_size(mine),
            [g.tolist() for g in gathered], w.item())


def test_new_group_sub_groups(cluster):
    results = cluster.run(_subgroups, world_size=4).results
    assert results == [
        (2.0, 2.0, 0, 2, [[0.0, 0.0], [10.0, 10.0]], 4.0),
        (4.0, 3.0, 0, 2, [[0.0, 0.0], [10.0, 10.0]], 4.0),
        (2.0, 2.0, 1, 2, [[20.0, 20.0], [30.0, 30.0]], 4.0),
        (4.0, 3.0, 1, 2, [[20.0, 20.0], [30.0, 30.0]], 4.0),
    ]


def _not_a_member():
    group = dist.new_group([0, 1])
    t = torch.ones(1)
    if dist.get_rank() in (0, 1):
        dist.all_reduce(t, group=group)
    return t.item(), group == dist.GroupMember.NON_GROUP_MEMBER


def test_ranks_outside_a_sub_group(cluster):
    assert cluster.run(_not_a_member, world_size=3).results == [
        (2.0, False), (2.0, False), (1.0, True)]


# ========================================================== batch_isend_irecv
def _ring_exchange():
    r, n = dist.get_rank(), dist.get_world_size()
    to_right, to_left = torch.full((3,), float(r)), torch.full((2, 2), float(-r))
    from_left, from_right = torch.zeros(3), torch.zeros(2, 2)
    ops = [
        dist.P2POp(dist.isend, to_right, (r + 1) % n),
        dist.P2POp(dist.isend, to_left, (r - 1) % n),
        dist.P2POp(dist.irecv, from_left, (r - 1) % n),
        dist.P2POp(dist.irecv, from_right, (r + 1) % n),
    ]
    for work in dist.batch_isend_irecv(ops):
        work.wait()
    return from_left, from_right


def test_batch_isend_irecv_ring(cluster):
    n = 4
    results = cluster.run(_ring_exchange, world_size=n).results
    for r, (from_left, from_right) in enumerate(results):
        assert torch.equal(from_left, torch.full((3,), float((r - 1) % n)))
        assert torch.equal(from_right, torch.full((2, 2), float(-((r + 1) % n))))


# ================================== the learner's own init / destroy_process_group
def _torchrun_style():
    dist.init_process_group("sim")
    r, n, backend = dist.get_rank(), dist.get_world_size(), dist.get_backend()
    t = torch.tensor([float(r)])
    dist.all_reduce(t)
    dist.destroy_process_group()
    after_destroy = dist.is_initialized()
    # a second init with explicit, matching rank / world_size is accepted too
    dist.init_process_group(backend="sim", rank=r, world_size=n)
    u = torch.ones(1)
    dist.all_reduce(u)
    dist.destroy_process_group()
    return r, n, backend, t.item(), after_destroy, u.item()


def test_learner_init_and_destroy_process_group(cluster):
    results = cluster.run(_torchrun_style, world_size=3).results
    assert results == [(r, 3, "sim", 3.0, False, 3.0) for r in range(3)]
    assert not dist.is_initialized()
    # and the next run starts from a fresh default group
    assert cluster.run(_torchrun_style, world_size=2).results == [
        (r, 2, "sim", 1.0, False, 2.0) for r in range(2)]


def _init_with_wrong_world_size():
    dist.init_process_group("sim", world_size=5)


def test_learner_init_with_wrong_world_size_is_reported(cluster):
    with pytest.raises(sc.RankError) as info:
        cluster.run(_init_with_wrong_world_size, world_size=2)
    assert isinstance(info.value.original, ValueError)
    assert "init_process_group(world_size=5) does not match" in str(info.value.original)
