"""Side streams: a collective waited on under ``torch.cpu.stream(s)`` does not stall compute.

On GPUs, FSDP2 runs its all-gathers and reduce-scatters on streams of their own: waiting
for one makes that stream wait, and the compute stream waits only when it needs the
result. The simulator follows the same rule for ``torch.cpu.stream(s)``, which is what
FSDP2 uses on the sim's CPU device, so FSDP2's backward prefetch overlaps compute here
as it does on a real cluster.
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn

import simcluster as sc

MiB = 2**20


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100")


def _sync_all_reduce_then_matmul(side_stream):
    grad = torch.ones(64 * MiB // 4)
    a = torch.randn(1024, 1024)
    if side_stream:
        with torch.cpu.stream(torch.cpu.Stream()):
            dist.all_reduce(grad)          # sync, but on a stream of its own
    else:
        dist.all_reduce(grad)
    a @ a                                  # compute that does not need the result
    grad.mul_(0.5)                         # reads the result: waits here


def test_a_collective_on_a_side_stream_overlaps_compute(node):
    plain = node.run(_sync_all_reduce_then_matmul, args=(False,), world_size=8)
    side = node.run(_sync_all_reduce_then_matmul, args=(True,), world_size=8)
    comm = side.recorder.clocks[0].comm
    matmul = 2 * 1024**3 / 19.5e12        # fp32 on an A100
    assert comm > matmul
    # In order: the all-reduce, then the matmul. Side stream: the matmul runs during it,
    # slowed by the all-reduce's kernels sharing the GPU.
    assert plain.elapsed == pytest.approx(side.elapsed + matmul, rel=0.02)
    slowed = matmul * sc.costmodel.OVERLAP_SLOWDOWN
    assert side.summary().rows[0]["overlap_s"] == pytest.approx(slowed, rel=0.02)
    assert plain.summary().rows[0]["overlap_s"] == 0


def _stream_is_per_rank():
    mine = torch.cpu.current_stream()      # the rank's default stream
    if dist.get_rank() == 0:
        side = torch.cpu.Stream()
        with torch.cpu.stream(side):
            dist.barrier()                 # rank 0 hands over inside its side stream
            return torch.cpu.current_stream() is side
    dist.barrier()                         # the others run while rank 0 is in there
    return torch.cpu.current_stream() is mine


def test_each_rank_keeps_its_own_selected_stream(node):
    before = torch.cpu.current_stream()
    assert node.run(_stream_is_per_rank, world_size=4).results == [True] * 4
    assert torch.cpu.current_stream() is before   # the notebook's own is untouched


def _sharded_layers():
    """Four 512x512 linear layers, each sharded with FSDP2 over every rank."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(512, 512) for _ in range(4)])
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model


def _fsdp_step(batch):
    _sharded_layers()(torch.randn(batch, 512)).sum().backward()


@pytest.mark.slow                     # 16 ranks of real 8192 x 512 matmuls: ~25 s of CPU
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_fsdp2_backward_prefetch_and_reduce_scatter_overlap_compute():
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    run = cluster.run(_fsdp_step, args=(8192,), world_size=16)
    row = run.summary().rows[0]
    # each layer is gathered in forward and again in backward, then reduce-scattered
    collectives = [c.op for c in run.collectives]
    assert collectives.count("all_gather_into_tensor") == 8
    assert collectives.count("reduce_scatter_tensor") == 4
    # The forward all-gathers are waited on at once (nothing prefetches them); in
    # backward, communication hides behind compute.
    assert row["overlap_s"] > 0.4 * row["comm_s"]
    assert row["idle_s"] < 0.5 * row["comm_s"]


def _fsdp_forward(prefetch):
    model = _sharded_layers()
    if prefetch:   # each layer starts gathering the next one before it computes
        for layer, after in zip(model[:-1], model[1:]):
            layer.set_modules_to_forward_prefetch([after])
    with torch.no_grad():
        model(torch.randn(8192, 512))


@pytest.mark.slow                     # two runs of 16 ranks: ~20 s of CPU
@pytest.mark.filterwarnings("ignore::UserWarning")
def test_fsdp2_explicit_forward_prefetch_hides_all_but_the_first_all_gather():
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    plain, prefetched = (cluster.run(_fsdp_forward, args=(p,), world_size=16).summary().rows[0]
                         for p in (False, True))
    assert plain["overlap_s"] == 0 and plain["idle_s"] == pytest.approx(plain["comm_s"])
    # only the first layer's all-gather (a quarter of the communication) is still waited on
    assert prefetched["idle_s"] == pytest.approx(plain["comm_s"] / 4, rel=0.01)
    assert prefetched["overlap_s"] == pytest.approx(plain["comm_s"] * 3 / 4, rel=0.01)
