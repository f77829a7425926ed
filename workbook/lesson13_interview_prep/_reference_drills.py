"""The lab's answers for lesson 13's drill set and step-time estimate, worked by hand
as a learner would (formulas, not the drills' own code). Imported by the checks only."""

import math


def drill_answers():
    """The five drills of ``drills.DRILL_SET``, worked from their questions' numbers."""
    # ring_allreduce_time: 2(p−1)α + 2(p−1)/p · n/B
    p, n, alpha, bw = 16, 16e6, 2e-6, 100e9
    ring = 2 * (p - 1) * alpha + 2 * (p - 1) / p * n / bw
    # zero3_per_gpu: 16Ψ/n
    zero3 = 16 * 175e9 / 16
    # gpipe_bubble: (p−1)/(m + p − 1)
    bubble = (8 - 1) / (64 + 8 - 1)
    # young_checkpoint_interval: √(2δM)
    young = math.sqrt(2 * 30 * 2 * 3600)
    # kv_cache_size: 2 · layers · kv_heads · head_dim · 2 bytes × batch × context
    kv = 2 * 80 * 8 * 128 * 2 * 8 * 2048
    return {"ring_allreduce_time": f"{ring * 1e3} ms", "zero3_per_gpu": f"{zero3 / 1e9} GB",
            "gpipe_bubble": bubble, "young_checkpoint_interval": f"{young / 60} min",
            "kv_cache_size": f"{kv / 1e9} GB"}


def estimate():
    """The step-time estimate of ``drills.estimate_problem()``, by hand."""
    params, tokens = 69e9, 1024 * 4096
    flops = 6 * params * tokens
    m = 1024 // 16
    activation = 2 * 1 * 4096 * 8192
    tp_ring = 2 * 7 * 3.4e-6 + 2 * 7 / 8 * activation / 360e9
    shard = 2 * params / 64
    dp_ring = 2 * 15 * 14e-6 + 2 * 15 / 16 * shard / 47.5e9
    return {"flops": flops, "compute_s": flops / (1024 * 989e12),
            "bubble": (8 - 1) / (m + 8 - 1), "tp_comm_s": 4 * 10 * m * tp_ring,
            "dp_comm_s": dp_ring, "dominant": "tp"}
