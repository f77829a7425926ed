"""What lab 02 (gradient aggregation) gives the learner besides the lesson's demos: cutting
a flat tensor into chunks (:func:`chunk_bounds`), a deadlock-free pairwise exchange
(:func:`exchange`) and a flat view of a tensor (:func:`flat_view`). The lesson's demos
and the reference answers build on the same ones.

Nothing here is an answer: the reference answers stay in :mod:`._reference`.
"""

import torch
import torch.distributed as dist

from workbook.models import chunk_bounds  # noqa: F401  (the lab imports it from here)


def exchange(send_tensor, dst, recv_tensor, src):
    """Send ``send_tensor`` to ``dst`` while receiving ``recv_tensor`` from ``src``.

    Both are posted before either is waited for, so a ring of ranks that all call this at
    once cannot deadlock (a blocking ``send`` waits for its matching ``recv``).
    """
    ops = [dist.P2POp(dist.isend, send_tensor, dst), dist.P2POp(dist.irecv, recv_tensor, src)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def flat_view(tensor):
    """``tensor.view(-1)``: writes into it land in ``tensor`` (contiguous tensors only)."""
    if not tensor.is_contiguous():
        raise ValueError("these all-reduces work on contiguous tensors")
    return tensor.view(-1)
