"""The program whose ``CommDebugMode`` counts ``test_torch_harness.py`` compares between
the "sim" backend and real gloo. Importable by a freshly spawned gloo worker: it depends
on torch only, never on simcluster or pytest."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.debug import CommDebugMode


def comm_counts():
    """Every c10d collective once (twice for all_reduce), a functional collective and a
    DTensor redistribution, under ``CommDebugMode``: ``{op name: count}``."""
    rank, n = dist.get_rank(), dist.get_world_size()
    t = torch.arange(4.) + rank
    mesh = init_device_mesh("cpu", (n,))
    big = distribute_tensor(torch.arange(24.).reshape(6, 4), mesh, [Shard(0)])
    with CommDebugMode() as mode:
        dist.all_reduce(t)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        dist.broadcast(t, src=0)
        dist.reduce(t, dst=0)
        dist.all_gather([torch.zeros(4) for _ in range(n)], t)
        dist.gather(t, [torch.zeros(4) for _ in range(n)] if rank == 0 else None, dst=0)
        dist.scatter(torch.zeros(4), [torch.ones(4)] * n if rank == 0 else None, src=0)
        dist.all_to_all([torch.zeros(4) for _ in range(n)], [t.clone() for _ in range(n)])
        dist.all_gather_into_tensor(torch.zeros(4 * n), t)
        dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(4 * n))
        dist.reduce_scatter(torch.zeros(4), [torch.ones(4) for _ in range(n)])
        dist.all_to_all_single(torch.zeros(4 * n), torch.ones(4 * n))
        funcol.all_reduce(t, "sum", mesh).wait()
        big.redistribute(mesh, [Replicate()]).to_local()
    return {str(op): count for op, count in mode.get_comm_counts().items()}


def version_bumps():
    """How much each collective moves its output's autograd version counter:
    ``{collective: increase}``. gloo writes some results in C++ out of autograd's sight
    (0) and copies others in with ``copy_`` (1)."""
    rank, n = dist.get_rank(), dist.get_world_size()
    calls = {
        "all_reduce": lambda o: dist.all_reduce(o),
        "broadcast": lambda o: dist.broadcast(o, src=0),
        "reduce": lambda o: dist.reduce(o, dst=0),
        "all_gather": lambda o: dist.all_gather([o] + [torch.zeros(4) for _ in range(n - 1)],
                                                torch.ones(4)),
        "all_gather_into_tensor": lambda o: dist.all_gather_into_tensor(
            o, torch.ones(4 // n)),
        "reduce_scatter_tensor": lambda o: dist.reduce_scatter_tensor(o, torch.ones(4 * n)),
        "reduce_scatter": lambda o: dist.reduce_scatter(o, [torch.ones(4) for _ in range(n)]),
        "all_to_all_single": lambda o: dist.all_to_all_single(o, torch.ones(4)),
        "all_to_all": lambda o: dist.all_to_all([o] + [torch.zeros(4) for _ in range(n - 1)],
                                                [torch.ones(4) for _ in range(n)]),
        "scatter": lambda o: dist.scatter(o, [torch.ones(4)] * n if rank == 0 else None,
                                          src=0),
        "gather": lambda o: dist.gather(torch.ones(4), [o] + [torch.zeros(4)] * (n - 1)
                                        if rank == 0 else None, dst=0),
    }
    bumps = {}
    for name, call in calls.items():
        out = torch.zeros(4)
        before = out._version
        call(out)
        bumps[name] = out._version - before
    return bumps


def counts_and_bumps():
    """What the gloo comparison runs: :func:`comm_counts` and :func:`version_bumps`."""
    return {"counts": comm_counts(), "bumps": version_bumps()}
