"""Reference answers of lab 09 (3D parallelism and the planner); the checks import them
while they run.

Not imported by the lab or the lesson: the lab asks the learner to write these.
"""

import torch
import torch.distributed as dist

from workbook.lesson09_3d_parallelism.lab import DIMS


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


def model_flops(cfg, global_batch, recompute="none"):
    """FLOPs of one training iteration of ``global_batch`` sequences, counting matrix
    multiplies (2 FLOPs per multiply-add): each layer's weight matrices and its two
    attention products forward, twice that backward, the output layer; full recomputation
    repeats every layer's forward, selective only its attention products."""
    s, h, tokens = cfg.seq_len, cfg.hidden, global_batch * cfg.seq_len
    kv = cfg.kv * cfg.head_dim                     # K and V widths (GQA: fewer heads)
    matrices = [h * h, h * kv, h * kv, h * h]      # Q, K, V, attention output
    matrices += [h * cfg.ffn] * (3 if cfg.swiglu else 2)
    attention = 2 * 2 * global_batch * s * s * h   # Q·Kᵀ and scores·V
    layer = 2 * tokens * sum(matrices) + attention
    output = 2 * tokens * h * cfg.vocab
    again = {"none": 0, "selective": attention, "full": layer}[recompute]
    return 3 * (cfg.layers * layer + output) + cfg.layers * again


def choose_layout(cfg, cluster, global_batch, memory_cap):
    """The fastest layout the planner predicts under ``memory_cap`` bytes per GPU, among
    every tp (dividing the heads, inside a node), pp (dividing the layers), recompute,
    ZeRO stage and micro-batch on all of ``cluster``'s GPUs."""
    from simcluster import planner

    gpus, per_node = cluster.spec.world_size, cluster.spec.nodes[0].devices
    best = None
    for tp in (t for t in range(1, per_node + 1) if cfg.heads % t == 0 and gpus % t == 0):
        for pp in (p for p in range(1, cfg.layers + 1)
                   if cfg.layers % p == 0 and gpus % (tp * p) == 0):
            dp = gpus // (tp * pp)
            for b in (b for b in range(1, global_batch // dp + 1)
                      if global_batch % (dp * b) == 0):
                for recompute in ("none", "selective", "full"):
                    for zero in range(4 if dp > 1 else 1):
                        layout = {"tp": tp, "pp": pp, "dp": dp, "micro_batch": b,
                                  "recompute": recompute, "zero": zero}
                        try:
                            est = planner.estimate(cfg, cluster, global_batch=global_batch,
                                                   **layout)
                        except ValueError:
                            continue
                        if est.memory_per_gpu <= memory_cap and (
                                best is None or est.step_time < best[0]):
                            best = (est.step_time, layout)
    return best[1]
