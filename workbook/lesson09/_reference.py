"""Reference answers of lab 09 (3D parallelism and the planner); the checks import them
while they run.

Not imported by the lab or the lesson: the lab asks the learner to write these.
"""

import torch
import torch.distributed as dist

DIMS = ("pp", "dp", "tp")


def build_groups(pp, dp, tp):
    """The calling rank's ``{"pp": ..., "dp": ..., "tp": ...}`` process groups of a
    (pp, dp, tp) mesh laid out as ``init_device_mesh`` does (row-major: tp varies
    fastest). Every rank creates every group, in the same order, as ``new_group`` needs."""
    mesh = torch.arange(pp * dp * tp).view(pp, dp, tp)
    rank, mine = dist.get_rank(), {}
    for dim, name in enumerate(DIMS):
        # each row of the mesh with `dim` moved last is one group along that dimension
        for ranks in mesh.movedim(dim, -1).reshape(-1, mesh.shape[dim]).tolist():
            group = dist.new_group(ranks)
            if rank in ranks:
                mine[name] = group
    return mine


def pipeline_bubble(gpus, tp, pp, global_batch, micro_batch, virtual_stages=1):
    """The pipeline bubble relative to the ideal step, (p − 1)/(v·m), of a (tp, pp, dp)
    layout on ``gpus`` GPUs: each of the d = gpus/(t·p) pipelines runs
    m = B/(b·d) micro-batches (Narayanan et al. 2021, §2.2 and §3.3)."""
    dp = gpus // (tp * pp)
    m = global_batch // (micro_batch * dp)
    return (pp - 1) / (virtual_stages * m)
