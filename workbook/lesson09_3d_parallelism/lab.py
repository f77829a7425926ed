"""What lab 09 (3D parallelism and the planner) gives the learner: the mesh dimensions, the
model and cluster of the layout exercise, and :func:`describe_layout`.

Nothing here is an answer: the reference answers stay in :mod:`._reference`.
"""

import dataclasses

import simcluster as sc
from simcluster import planner


GiB = sc.spec.GiB


DIMS = ("pp", "dp", "tp")


# LLaMA-7B: SwiGLU, an output matrix of its own; and LLaMA-2-70B's shape, grouped-query
# attention with 8 key/value heads for 64 query heads (docs/reference-numbers.md)
LLAMA_7B = planner.TransformerConfig(layers=32, hidden=4096, heads=32, seq_len=2048,
                                     vocab=32000, ffn_hidden=11008, swiglu=True,
                                     tied_embeddings=False)


LAYOUT_GPUS, LAYOUT_BATCH = 32, 256


LAYOUT_CAPS_GIB = (40, 16, 10, 6)


def layout_cluster(memory_cap=None):
    """The lab's 32 A100s (four DGX A100 nodes); with ``memory_cap`` bytes, their memory
    is that cap (what :func:`simcluster.planner.search` then calls fitting)."""
    spec = sc.spec.preset("dgx-a100", nodes=LAYOUT_GPUS // 8)
    if memory_cap is not None:
        device = dataclasses.replace(spec.nodes[0].device, memory=int(memory_cap))
        spec = dataclasses.replace(spec, nodes=tuple(dataclasses.replace(n, device=device)
                                                     for n in spec.nodes))
    return sc.Cluster(spec)


def describe_layout(est):
    """``tp 2 × pp 4 × dp 4, micro-batch 1, selective recomputation, ZeRO-2``."""
    recompute = {"none": "no"}.get(est.recompute, est.recompute)
    text = (f"tp {est.tp} × pp {est.pp} × dp {est.dp}, micro-batch {est.micro_batch}, "
            f"{recompute} recomputation, ZeRO-{est.zero}")
    if est.virtual_stages > 1:
        text += f", {est.virtual_stages} virtual stages"
    return text + (", sequence parallel" if est.sequence_parallel else "")
