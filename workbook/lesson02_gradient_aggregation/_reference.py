"""The answers of lab 02: what the checks compare a learner's code with.

Private on purpose: neither the lesson nor the lab imports this module (they import
:mod:`.demos`, whose measuring functions run these by name), and the checks
import it only inside their functions. A check handed one of these functions (or a
subclass of :class:`ParameterServer`) answers ❌: the exercise is to write it.

Everything here runs inside ``cluster.run(...)`` on every rank (SPMD), and the
all-reduces use only ``send``/``recv``/``isend``/``irecv``, so the simulated network sees
and charges every byte. They leave the element-wise SUM in ``tensor``, in place.
"""

import threading

import torch
import torch.distributed as dist

from workbook._parameter_server import ParameterServer  # noqa: F401  (lab 02's answer)
from workbook.lesson02_gradient_aggregation.lab import chunk_bounds, exchange, flat_view

# ------------------------------------------------------------------- all-reduces


def naive_allreduce(tensor):
    """Gather every tensor on rank 0, add them up there, send the sum back to everyone.

    Rank 0 receives and sends ``(p-1)·n`` elements: the root is the bottleneck.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for src in range(1, p):
            dist.recv(incoming, src)
            tensor += incoming
        for dst in range(1, p):
            dist.send(tensor, dst)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)


def ring_reduce_scatter(flat, ranks, bounds):
    """Ring reduce-scatter of the 1-D ``flat`` over global ``ranks`` (ring order).

    Afterwards the rank at position ``i`` of ``ranks`` holds chunk ``i`` (``bounds[i]``)
    summed over all of ``ranks``; its other chunks hold partial sums.
    """
    p = len(ranks)
    i = ranks.index(dist.get_rank())
    right, left = ranks[(i + 1) % p], ranks[(i - 1) % p]
    for step in range(p - 1):
        s0, s1 = bounds[(i - step - 1) % p]
        r0, r1 = bounds[(i - step - 2) % p]
        incoming = torch.empty(r1 - r0, dtype=flat.dtype)
        exchange(flat[s0:s1], right, incoming, left)
        flat[r0:r1] += incoming


def ring_all_gather(flat, ranks, bounds):
    """Ring all-gather: the rank at position ``i`` contributes chunk ``i`` of ``flat``."""
    p = len(ranks)
    i = ranks.index(dist.get_rank())
    right, left = ranks[(i + 1) % p], ranks[(i - 1) % p]
    for step in range(p - 1):
        s0, s1 = bounds[(i - step) % p]
        r0, r1 = bounds[(i - step - 1) % p]
        incoming = torch.empty(r1 - r0, dtype=flat.dtype)
        exchange(flat[s0:s1], right, incoming, left)
        flat[r0:r1] = incoming


def ring_allreduce(tensor):
    """Ring all-reduce: reduce-scatter, then all-gather, one chunk of ``n/p`` per step.

    Each rank sends ``2(p-1)/p·n`` elements in ``2(p-1)`` messages, whatever ``p`` is.
    """
    p = dist.get_world_size()
    if p == 1:
        return
    flat = flat_view(tensor)
    ranks, bounds = list(range(p)), chunk_bounds(flat.numel(), p)
    ring_reduce_scatter(flat, ranks, bounds)
    ring_all_gather(flat, ranks, bounds)


def tree_allreduce(tensor):
    """Binomial-tree reduce to rank 0, then binomial-tree broadcast from rank 0.

    ``2⌈lg p⌉`` rounds of whole-tensor messages: few steps (good for small tensors),
    but every step moves all ``n`` elements (bad for large ones).
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    mask = 1
    while mask < p:                       # reduce: children send up, parents add
        if rank & mask:
            dist.send(tensor, rank - mask)
            break
        if rank + mask < p:
            dist.recv(incoming, rank + mask)
            tensor += incoming
        mask <<= 1
    mask = 1
    while mask < p and not rank & mask:   # broadcast: receive from the parent...
        mask <<= 1
    if mask < p:
        dist.recv(tensor, rank - mask)
    mask >>= 1
    while mask > 0:                        # ...then send to the children, biggest first
        if rank + mask < p:
            dist.send(tensor, rank + mask)
        mask >>= 1


def halving_doubling_allreduce(tensor):
    """Rabenseifner's all-reduce, in MPICH's order: recursive-halving reduce-scatter with
    the nearest partner first (``mask = 1, 2, 4, …``), then recursive-doubling all-gather
    back out (``mask = …, 2, 1``).

    With ``p`` a power of two each rank sends ``2(p-1)/p·n`` elements (like ring) in only
    ``2 lg p`` messages (like tree). Nearest first, the large early exchanges stay between
    neighbouring ranks — inside a node — and only the small late ones cross the network.
    The ``p - p'`` ranks above the largest power of two ``p'`` first hand their tensor to a
    partner, wait, and get the sum back.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = flat_view(tensor)
    p2 = 1 << (p.bit_length() - 1)
    extra = p - p2
    if rank >= p2:                       # not in the power-of-two group: hand over, wait
        dist.send(flat, rank - p2)
        dist.recv(flat, rank - p2)
        return
    if rank < extra:                     # take the extra rank's tensor first
        incoming = torch.empty_like(flat)
        dist.recv(incoming, rank + p2)
        flat += incoming
    lo, hi, history = 0, flat.numel(), []
    mask = 1
    while mask < p2:                     # recursive halving: keep half, send half
        partner, mid = rank ^ mask, (lo + hi) // 2
        history.append((partner, lo, hi))
        keep, give = ((lo, mid), (mid, hi)) if rank < partner else ((mid, hi), (lo, mid))
        incoming = torch.empty(keep[1] - keep[0], dtype=flat.dtype)
        exchange(flat[give[0]:give[1]], partner, incoming, partner)
        flat[keep[0]:keep[1]] += incoming
        lo, hi = keep
        mask <<= 1
    while history:                       # recursive doubling: the same pairs, in reverse
        partner, plo, phi = history.pop()
        other = (hi, phi) if lo == plo else (plo, lo)
        incoming = torch.empty(other[1] - other[0], dtype=flat.dtype)
        exchange(flat[lo:hi], partner, incoming, partner)
        flat[other[0]:other[1]] = incoming
        lo, hi = plo, phi
    if rank < extra:                     # give the extra rank its result
        dist.send(flat, rank + p2)


def hierarchical_allreduce(tensor, ranks_per_node):
    """Reduce-scatter inside each node, all-reduce each shard across nodes, all-gather
    inside each node.

    Ranks ``k·j .. k·j + k-1`` form node ``j`` (``k = ranks_per_node``). Only ``1/k`` of
    the tensor crosses the network per rank, on ``k`` NICs at once: ``2(m-1)·n``
    elements cross node boundaries in all, for ``m`` nodes.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    k = ranks_per_node
    if p % k:
        raise ValueError(f"world size {p} is not a multiple of ranks_per_node={k}")
    m = p // k
    flat = flat_view(tensor)
    node, local = divmod(rank, k)
    node_ranks = [node * k + j for j in range(k)]
    bounds = chunk_bounds(flat.numel(), k)
    ring_reduce_scatter(flat, node_ranks, bounds)          # fast links: NVLink
    s0, s1 = bounds[local]
    shard = flat[s0:s1]
    peers = [j * k + local for j in range(m)]               # slow links: one NIC each
    shard_bounds = chunk_bounds(shard.numel(), m)
    ring_reduce_scatter(shard, peers, shard_bounds)
    ring_all_gather(shard, peers, shard_bounds)
    ring_all_gather(flat, node_ranks, bounds)               # fast links again


# ------------------------------------------------------------------- compression


def fp16_allreduce(tensor, allreduce=ring_allreduce):
    """All-reduce in half precision; leaves the MEAN (not the sum) in ``tensor``.

    Divides by ``p`` before casting, so that the fp16 sum cannot overflow past 65,504
    (PyTorch's ``fp16_compress_hook`` casts first and divides after), sends half the
    bytes, and casts back on arrival. ``allreduce`` is the (SUM) algorithm that moves the
    half-precision copy.
    """
    half = (tensor / dist.get_world_size()).to(torch.float16)
    allreduce(half)
    tensor.copy_(half)


def int8_quantize(tensor):
    """``(q, scale)``: int8 values in [-127, 127] and a float32 scale, ``tensor ≈ q·scale``.

    Symmetric, one scale per tensor; rounding to nearest keeps the error within
    ``scale/2``. An all-zero tensor gets scale 1 (no division by zero).
    """
    amax = tensor.detach().abs().max().float() if tensor.numel() else torch.zeros(())
    scale = amax / 127 if amax > 0 else torch.ones((), dtype=torch.float32)
    q = torch.round(tensor.detach().float() / scale).clamp_(-127, 127).to(torch.int8)
    return q, scale.reshape(())


def int8_dequantize(q, scale):
    """Undo :func:`int8_quantize`: float32 ``q·scale``."""
    return q.to(torch.float32) * scale


def topk_compress(grad, residual, k):
    """Top-k sparsification with error feedback.

    Adds the ``residual`` (what earlier calls did not send) to ``grad``, keeps the ``k``
    entries of largest magnitude, and returns ``(values, indices, new_residual)``:
    ``new_residual`` is everything that was not sent, so nothing is ever lost — it is
    only delayed. ``grad`` and ``residual`` are left unchanged.
    """
    acc = grad + residual
    k = min(k, acc.numel())
    indices = torch.topk(acc.abs().view(-1), k).indices
    values = acc.view(-1)[indices]
    new_residual = acc.clone()
    new_residual.view(-1)[indices] = 0
    return values, indices, new_residual


# -------------------------------------------------------------- parameter server


# ---------------------------------------------------------------------- local SGD


def local_sgd(w, batches, grad_fn, lr, sync_every):
    """Local SGD: every rank takes SGD steps on its own batches and averages the
    *parameters* with the others (``dist.all_reduce``) after every ``sync_every`` steps.

    ``sync_every=1`` is ordinary synchronous data parallelism; larger values trade
    communication for drift between the ranks' models. Returns this rank's parameters.
    """
    p = dist.get_world_size()
    w = w.clone()
    for step, (x, y) in enumerate(batches):
        w -= lr * grad_fn(w, x, y)
        if (step + 1) % sync_every == 0:
            dist.all_reduce(w)
            w /= p
    return w


# ------------------------------------------------------- what the lesson runs by name


def _topk_1_percent():
    """``make_aggregate``: top-k all-reduce of 1 % of the elements, with error feedback."""
    from workbook.lesson02_gradient_aggregation.demos import topk_allreduce
    residual = None

    def aggregate(tensor):
        nonlocal residual
        if residual is None:
            residual = torch.zeros_like(tensor)
        residual = topk_allreduce(tensor, residual, max(1, tensor.numel() // 100),
                                  topk_compress)

    return aggregate


def _int8(tensor):
    from workbook.lesson02_gradient_aggregation.demos import int8_allreduce
    int8_allreduce(tensor, int8_quantize, int8_dequantize)


# name -> (make_aggregate: called once per rank, returns the function to call on a
# tensor; whether that leaves the MEAN instead of the sum)
BY_NAME = {
    "naive": (lambda: naive_allreduce, False),
    "ring": (lambda: ring_allreduce, False),
    "tree": (lambda: tree_allreduce, False),
    "halving-doubling": (lambda: halving_doubling_allreduce, False),
    "hierarchical": (lambda: hierarchical_allreduce, False),
    "fp16": (lambda: fp16_allreduce, True),
    "int8": (lambda: _int8, False),
    "top-k 1%": (_topk_1_percent, False),
}
