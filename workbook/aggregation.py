"""Gradient aggregation from point-to-point messages: the reference code of lesson and lab 02.

Everything here runs inside ``cluster.run(...)`` on every rank (SPMD) unless it says
otherwise, and uses only ``send``/``recv``/``isend``/``irecv``, so the simulated network
sees — and charges — every byte:

* five all-reduces, each leaving the element-wise SUM in ``tensor``, in place:
  :func:`naive_allreduce`, :func:`ring_allreduce`, :func:`tree_allreduce`,
  :func:`halving_doubling_allreduce`, :func:`hierarchical_allreduce`;
* compression: :func:`fp16_allreduce`, :func:`int8_quantize` / :func:`int8_dequantize`
  (and :func:`int8_allreduce`), :func:`topk_compress` with error feedback (and
  :func:`topk_allreduce`);
* :class:`ParameterServer` and :func:`ps_train`, which runs it on the cluster (rank 0
  serves, the other ranks work);
* :func:`local_sgd`;
* :class:`TinyMLP`, the small model and data set every method is compared on, and
  :func:`train`, the data-parallel loop that compares them;
* measuring, outside the ranks: :func:`simulate` (a run, timed or not),
  :func:`sim_elapsed` (the one place that reads the simulated clock),
  :func:`measure_allreduce`, :func:`ring_trace`, :func:`compare`,
  :func:`print_comparison`, :func:`plot_comparison`.

The lab (``solutions/02_gradient_aggregation.ipynb``) asks you to write most of these
yourself; ``workbook.checks`` compares your versions with the ones here.
"""

import heapq
import math
import threading

import torch
import torch.distributed as dist

# ------------------------------------------------------------------------- helpers


def chunk_bounds(n, parts):
    """``[(start, stop), ...]``: ``n`` elements cut into ``parts`` nearly equal chunks.

    The first ``n % parts`` chunks get one element more; with ``n < parts`` some are empty.
    """
    base, extra = divmod(n, parts)
    bounds, start = [], 0
    for i in range(parts):
        stop = start + base + (1 if i < extra else 0)
        bounds.append((start, stop))
        start = stop
    return bounds


def exchange(send_tensor, dst, recv_tensor, src):
    """Send ``send_tensor`` to ``dst`` while receiving ``recv_tensor`` from ``src``.

    Both are posted before either is waited for, so a ring of ranks that all call this at
    once cannot deadlock (a blocking ``send`` waits for its matching ``recv``).
    """
    ops = [dist.P2POp(dist.isend, send_tensor, dst), dist.P2POp(dist.irecv, recv_tensor, src)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def sim_elapsed(run):
    """Simulated seconds of ``run`` (``run.elapsed``), or None if it ran without accounting.

    Every timing cell of lesson and lab 02 goes through this one function.
    """
    return run.elapsed if run.recorder is not None else None


# ------------------------------------------------------------ five all-reduces


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


def _flat_view(tensor):
    if not tensor.is_contiguous():
        raise ValueError("these all-reduces work on contiguous tensors")
    return tensor.view(-1)


def ring_allreduce(tensor):
    """Ring all-reduce: reduce-scatter, then all-gather, one chunk of ``n/p`` per step.

    Each rank sends ``2(p-1)/p·n`` elements in ``2(p-1)`` messages, whatever ``p`` is.
    """
    p = dist.get_world_size()
    if p == 1:
        return
    flat = _flat_view(tensor)
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
    """Rabenseifner's all-reduce: recursive-halving reduce-scatter, recursive-doubling
    all-gather.

    With ``p`` a power of two each rank sends ``2(p-1)/p·n`` elements (like ring) in only
    ``2 lg p`` messages (like tree). Otherwise the ``p - p'`` ranks above the largest power
    of two ``p'`` first hand their tensor to a partner, wait, and get the sum back.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = _flat_view(tensor)
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
    mask = p2 >> 1
    while mask:                          # recursive halving: keep half, send half
        partner = rank ^ mask
        mid = (lo + hi) // 2
        history.append((lo, hi))
        if rank & mask:
            keep, give = (mid, hi), (lo, mid)
        else:
            keep, give = (lo, mid), (mid, hi)
        incoming = torch.empty(keep[1] - keep[0], dtype=flat.dtype)
        exchange(flat[give[0]:give[1]], partner, incoming, partner)
        flat[keep[0]:keep[1]] += incoming
        lo, hi = keep
        mask >>= 1
    mask = 1
    while history:                       # recursive doubling: swap halves back
        partner = rank ^ mask
        plo, phi = history.pop()
        other = (hi, phi) if lo == plo else (plo, lo)
        incoming = torch.empty(other[1] - other[0], dtype=flat.dtype)
        exchange(flat[lo:hi], partner, incoming, partner)
        flat[other[0]:other[1]] = incoming
        lo, hi = plo, phi
        mask <<= 1
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
    flat = _flat_view(tensor)
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


ALLREDUCES = {
    "naive": naive_allreduce,
    "ring": ring_allreduce,
    "tree": tree_allreduce,
    "halving-doubling": halving_doubling_allreduce,
    "hierarchical": hierarchical_allreduce,
}

# ------------------------------------------------------------------- compression

def fp16_allreduce(tensor, allreduce=ring_allreduce):
    """All-reduce in half precision; leaves the MEAN (not the sum) in ``tensor``.

    Like PyTorch's ``fp16_compress_hook``: divide by ``p`` first, so the fp16 sum cannot
    overflow past 65,504, send half the bytes, cast back on arrival. ``allreduce`` is
    the (SUM) algorithm that moves the half-precision copy.
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


def _pack_int8(q, scale):
    """One uint8 message: the int8 values, then the 4 bytes of the float32 scale."""
    return torch.cat([q.reshape(-1).view(torch.uint8),
                      scale.reshape(1).to(torch.float32).view(torch.uint8)])


def _unpack_int8(payload):
    return payload[:-4].view(torch.int8), payload[-4:].clone().view(torch.float32).reshape(())


def int8_allreduce(tensor, quantize=int8_quantize, dequantize=int8_dequantize):
    """All-reduce (SUM) that sends int8: each rank quantizes, sends chunk ``j`` to rank
    ``j`` (all-to-all), rank ``j`` sums its chunk in float32 and quantizes it again, then
    everybody sends its chunk to everybody (all-gather). ``2(p-1)/p·n`` bytes per rank —
    a quarter of a float32 ring — plus the 4-byte scale in every message.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = _flat_view(tensor)
    if p == 1:
        flat.copy_(dequantize(*quantize(flat)))
        return
    bounds = chunk_bounds(flat.numel(), p)
    size = lambda r: bounds[r][1] - bounds[r][0]  # noqa: E731
    q, scale = quantize(flat)
    mine = slice(*bounds[rank])
    # all-to-all: my chunk j goes to rank j; I receive everybody's copy of my chunk
    parts = {rank: dequantize(q[mine], scale)}
    for shift in range(1, p):
        dst, src = (rank + shift) % p, (rank - shift) % p
        incoming = torch.empty(size(rank) + 4, dtype=torch.uint8)
        exchange(_pack_int8(q[slice(*bounds[dst])], scale), dst, incoming, src)
        parts[src] = dequantize(*_unpack_int8(incoming))
    total = parts[0].clone()
    for src in range(1, p):                      # rank order: bit-identical every run
        total += parts[src]
    q_sum, s_sum = quantize(total)
    flat[mine] = dequantize(q_sum, s_sum)
    mine_packed = _pack_int8(q_sum, s_sum)
    for shift in range(1, p):                    # all-gather the summed chunks
        dst, src = (rank + shift) % p, (rank - shift) % p
        incoming = torch.empty(size(src) + 4, dtype=torch.uint8)
        exchange(mine_packed, dst, incoming, src)
        flat[slice(*bounds[src])] = dequantize(*_unpack_int8(incoming))


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


def topk_allreduce(tensor, residual, k, compress=topk_compress):
    """All-reduce (SUM) of top-k sparsified tensors with error feedback.

    Every rank sends its ``k`` values (float32) and indices (int32) to every other rank,
    packed into one message of ``8k`` bytes: ``(p-1)·8k`` bytes per rank. Returns this
    rank's new residual.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = _flat_view(tensor)
    values, indices, new_residual = compress(flat, residual.view(-1), k)
    packed = torch.cat([values.to(torch.float32).reshape(-1),
                        indices.to(torch.int32).reshape(-1).view(torch.float32)])
    received = {rank: packed}
    for shift in range(1, p):
        dst, src = (rank + shift) % p, (rank - shift) % p
        incoming = torch.empty_like(packed)
        exchange(packed, dst, incoming, src)
        received[src] = incoming
    flat.zero_()
    half = packed.numel() // 2
    for src in range(p):                         # rank order: bit-identical every run
        v, i = received[src][:half], received[src][half:].view(torch.int32)
        flat.index_add_(0, i.long(), v.to(flat.dtype))
    return new_residual.view_as(tensor)


# --------------------------------------------------------------- parameter server


class ParameterServer:
    """The parameters, and the rules for reading and updating them.

    ``mode``:

    * ``"sync"`` — :meth:`push` only stores a gradient; :meth:`sync` applies the mean of
      one gradient from every worker at once. A worker that pushed must wait (``pull``
      returns None) until that has happened.
    * ``"async"`` — every :meth:`push` is applied at once; nobody waits. A gradient may
      have been computed on parameters several updates old: its *staleness*.
    * ``"bounded"`` — like async, but a worker more than ``bound`` pushes ahead of the
      slowest worker must wait (stale-synchronous parallel, Ho et al. 2013).

    Ranks are threads, so two workers may call in at once: every method holds
    ``self.lock`` while it reads or writes the state.

    State: ``params`` (flat tensor), ``version`` (updates applied), ``clock[w]`` (pushes
    by worker ``w``), ``pulled[w]`` (the version worker ``w`` last pulled), ``pending``
    (sync mode: ``{worker: gradient}`` of this round), ``staleness`` (async and bounded:
    the staleness of every gradient applied, in order).
    """

    MODES = ("sync", "async", "bounded")

    def __init__(self, params, lr, num_workers, mode="sync", bound=3):
        if mode not in self.MODES:
            raise ValueError(f"mode must be one of {self.MODES}, got {mode!r}")
        self.params = params.detach().clone()
        self.lr, self.num_workers, self.mode, self.bound = lr, num_workers, mode, bound
        self.lock = threading.Lock()
        self.version = 0
        self.clock = [0] * num_workers
        self.pulled = [0] * num_workers
        self.pending = {}
        self.staleness = []

    def pull(self, worker):
        """A copy of the parameters for ``worker``, or None if it must wait."""
        with self.lock:
            if self.mode == "sync" and worker in self.pending:
                return None
            if self.mode == "bounded" and self.clock[worker] - min(self.clock) > self.bound:
                return None
            self.pulled[worker] = self.version
            return self.params.clone()

    def push(self, worker, gradients):
        """Take ``worker``'s gradient, computed on the parameters it last pulled."""
        with self.lock:
            self.clock[worker] += 1
            if self.mode == "sync":
                self.pending[worker] = gradients.detach().clone()
                return
            self.staleness.append(self.version - self.pulled[worker])
            self.params -= self.lr * gradients
            self.version += 1

    def sync(self, all_workers):
        """Sync mode: once every worker in ``all_workers`` has pushed, apply the mean of
        their gradients (in worker order) and start a new round. Returns True if it did."""
        with self.lock:
            if any(w not in self.pending for w in all_workers):
                return False
            mean = torch.stack([self.pending[w] for w in sorted(all_workers)]).mean(dim=0)
            self.params -= self.lr * mean
            self.version += 1
            self.pending.clear()
            return True


def ps_train(problem, server_class, mode, steps, lr, batch, speeds, bound=3):
    """Train ``problem`` with a parameter server; call on every rank (``cluster.run``).

    Rank 0 is the server and holds ``server_class(params, lr, workers, mode, bound)``;
    ranks ``1..W`` are workers ``0..W-1``. A worker receives the parameters (its *pull*:
    one message from the server), computes a gradient on its next mini-batch, and sends
    it back (its *push*: one message to the server), until the server says stop. The
    server hands out ``steps·W`` gradients in all, the work of ``steps`` synchronous
    rounds.

    Worker ``w`` needs ``speeds[w]`` ticks per gradient. The server takes the pushes in
    the order they would finish, so a fast worker comes back more often than a slow one
    and — in async mode — pushes gradients computed on parameters that others have
    changed since (staleness). Each reply carries one extra float in front: 1 = here are
    the parameters, 0 = stop.

    Returns on rank 0 a dict: ``updates`` — ``(tick, gradients_so_far, params)`` after
    every update, starting with the initial parameters; ``staleness`` — the server's
    record. Workers return None.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    workers, n = p - 1, problem.num_params
    if rank != 0:
        w, step = rank - 1, 0
        message = torch.empty(n + 1)
        while True:
            dist.recv(message, 0)                                   # pull (or stop)
            if message[0] == 0:
                return None
            x, y = problem.batch(step, w, workers, batch)
            _, grad = problem.loss_and_grad(message[1:], x, y)
            dist.send(grad, 0)                                      # push
            step += 1
    ps = server_class(problem.init_params(), lr=lr, num_workers=workers, mode=mode,
                      bound=bound)
    updates = [(0.0, 0, ps.params.clone())]
    total, issued, received = steps * workers, 0, 0
    waiting, events = [], []
    stop = torch.zeros(n + 1)

    def start(w, now):
        nonlocal issued
        if issued >= total:
            dist.send(stop, w + 1)
            return
        params = ps.pull(w)
        if params is None:
            waiting.append(w)
            return
        issued += 1
        dist.send(torch.cat([torch.ones(1), params]), w + 1)
        heapq.heappush(events, (now + speeds[w], w))

    for w in range(workers):
        start(w, 0.0)
    grad = torch.empty(n)
    while events:
        now, w = heapq.heappop(events)
        dist.recv(grad, w + 1)
        ps.push(w, grad)
        received += 1
        if mode != "sync" or ps.sync(range(workers)):
            updates.append((now, received, ps.params.clone()))
        ready = sorted(waiting + [w])
        waiting.clear()
        for v in ready:
            start(v, now)
    for w in sorted(waiting):        # still waiting when the work ran out
        dist.send(stop, w + 1)
    return {"updates": updates, "staleness": list(ps.staleness)}


# ------------------------------------------------------------------------ local SGD


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


# ---------------------------------------------------------------- model and data


class TinyMLP:
    """A two-layer MLP on a synthetic classification data set; parameters are one flat
    vector, so every aggregation method above moves a single tensor.

    Everything is generated from ``seed``: the data, the initial parameters, and which
    samples each worker gets at each step.
    """

    def __init__(self, features=32, hidden=64, classes=8, samples=4096, seed=0):
        g = torch.Generator().manual_seed(seed)
        centers = 0.5 * torch.randn(classes, features, generator=g)
        self.y = torch.randint(0, classes, (samples,), generator=g)
        self.x = centers[self.y] + torch.randn(samples, features, generator=g)
        self.shapes = [(hidden, features), (hidden,), (classes, hidden), (classes,)]
        self.num_params = sum(math.prod(s) for s in self.shapes)
        self.samples, self.seed = samples, seed
        self._order = torch.randperm(samples, generator=g)

    def init_params(self):
        """The same initial parameters on every rank, every time."""
        g = torch.Generator().manual_seed(self.seed + 1)
        parts = []
        for shape in self.shapes:
            fan_in = shape[1] if len(shape) == 2 else shape[0]
            parts.append((torch.rand(shape, generator=g) * 2 - 1).view(-1) / math.sqrt(fan_in))
        return torch.cat(parts)

    def _forward(self, w, x):
        sizes = [math.prod(s) for s in self.shapes]
        w1, b1, w2, b2 = (t.view(s) for t, s in zip(torch.split(w, sizes), self.shapes))
        return torch.relu(x @ w1.T + b1) @ w2.T + b2

    def loss_and_grad(self, w, x, y):
        """``(loss, gradient)`` of the cross-entropy on the batch ``(x, y)`` at ``w``."""
        w = w.detach().requires_grad_(True)
        loss = torch.nn.functional.cross_entropy(self._forward(w, x), y)
        (grad,) = torch.autograd.grad(loss, w)
        return loss.item(), grad

    def grad(self, w, x, y):
        """Just the gradient (the ``grad_fn`` that :func:`local_sgd` takes)."""
        return self.loss_and_grad(w, x, y)[1]

    def loss(self, w):
        """Cross-entropy on the whole data set (run it outside the cluster)."""
        with torch.no_grad():
            return torch.nn.functional.cross_entropy(self._forward(w, self.x), self.y).item()

    def batch(self, step, worker, workers, size):
        """Worker ``worker``'s mini-batch at ``step``: disjoint across workers and steps
        until the data set wraps around."""
        start = ((step * workers + worker) * size) % self.samples
        idx = self._order[torch.arange(start, start + size) % self.samples]
        return self.x[idx], self.y[idx]


# ------------------------------------------------------------- data-parallel loop


def topk_aggregator(k, compress=topk_compress):
    """``make_aggregate`` for :func:`train`: top-k all-reduce with this rank's residual."""

    def make_aggregate():
        residual = None

        def aggregate(tensor):
            nonlocal residual
            if residual is None:
                residual = torch.zeros_like(tensor)
            residual = topk_allreduce(tensor, residual, k, compress)

        return aggregate

    return make_aggregate


def train(problem, make_aggregate, steps, lr, batch, sync_every=1, mean=False):
    """Data-parallel SGD on ``problem``; call on every rank (``cluster.run``).

    ``make_aggregate()`` is called once on every rank and returns ``aggregate(tensor)``,
    which must leave the SUM over ranks in ``tensor`` (any all-reduce above; a factory so
    that a compressor can keep per-rank state, like top-k's residual) — or the MEAN, with
    ``mean=True`` (like :func:`fp16_allreduce`). With
    ``sync_every == 1`` the gradients are summed every step; with ``sync_every = H > 1``
    it is local SGD: the parameters are averaged every ``H`` steps.

    Returns, on rank 0, its parameters after every step; on other ranks, None.
    """
    rank, p = dist.get_rank(), dist.get_world_size()
    aggregate = make_aggregate()
    w = problem.init_params()
    snapshots = [w.clone()] if rank == 0 else None
    for step in range(steps):
        x, y = problem.batch(step, rank, p, batch)
        _, grad = problem.loss_and_grad(w, x, y)
        if sync_every == 1:
            aggregate(grad)
            w -= lr * (grad if mean else grad / p)
        else:
            w -= lr * grad
            if (step + 1) % sync_every == 0:
                aggregate(w)
                if not mean:
                    w /= p
        if rank == 0:
            snapshots.append(w.clone())
    return snapshots


# ------------------------------------------------------------- measuring helpers


def simulate(cluster, fn, world_size, args=(), kwargs=None, timed=False, **options):
    """``cluster.run(fn, ...)``, with the simulated clock on only when ``timed``.

    Untimed runs skip the simulator's accounting (several times faster in wall-clock
    time).
    """
    return cluster.run(fn, world_size=world_size, args=args, kwargs=kwargs,
                       accounting=timed, **options)


def traffic(run):
    """``{(src, dst): bytes}`` a run sent, or None if it ran without accounting."""
    return run.traffic if run.recorder is not None else None


def _allreduce_once(fn, size, extra_args):
    rank = dist.get_rank()
    tensor = torch.full((size,), float(rank + 1))
    fn(tensor, *extra_args)
    return tensor[0].item()


def measure_allreduce(cluster, fn, world_size, size, extra_args=(), timed=True):
    """Run one all-reduce of ``size`` float32 elements; what it cost.

    Returns a dict: ``bytes`` and ``messages`` (the busiest rank's), ``total_bytes``,
    ``cross_node_bytes`` (None without a traffic record), ``seconds`` (simulated; None
    without a clock) and ``correct`` (every rank got the sum).
    """
    run = simulate(cluster, _allreduce_once, world_size, args=(fn, size, extra_args),
                   timed=timed)
    sent = traffic(run)
    node = cluster.spec.placement
    cross = None if sent is None else sum(
        b for (s, d), b in sent.items() if node(s)[0] != node(d)[0])
    expected = world_size * (world_size + 1) / 2
    return {"bytes": max(run.bytes_sent), "messages": max(run.messages_sent),
            "total_bytes": sum(run.bytes_sent), "cross_node_bytes": cross,
            "seconds": sim_elapsed(run) if timed else None,
            "correct": all(r == expected for r in run.results)}


def _ring_phases(size):
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = torch.full((size,), float(10 ** rank))
    bounds = chunk_bounds(size, p)
    ring_reduce_scatter(flat, list(range(p)), bounds)
    after_reduce_scatter = flat.clone()
    ring_all_gather(flat, list(range(p)), bounds)
    return after_reduce_scatter, flat.clone()


def ring_trace(cluster, world_size):
    """What every rank holds after the ring's reduce-scatter and after its all-gather,
    when rank ``r`` starts with ``10**r`` everywhere: the digits of each number say whose
    contributions it contains (1111 = all four ranks). Prints a table."""
    run = simulate(cluster, _ring_phases, world_size, args=(world_size,))
    width = world_size + 2
    header = "rank | " + " ".join(f"chunk {c}".rjust(width) for c in range(world_size))
    for title, phase in (("after reduce-scatter", 0), ("after all-gather", 1)):
        print(title)
        print(header)
        for rank, result in enumerate(run.results):
            cells = " ".join(f"{int(v)}".rjust(width) for v in result[phase].tolist())
            print(f"{rank:>4} | {cells}")
        print()


def show_source(obj):
    """Print the source code of ``obj`` (a function or class of this module)."""
    import inspect

    print(inspect.getsource(obj).rstrip())


# --------------------------------------------------------------- the comparison


def _time_per_step(run, steps):
    elapsed = sim_elapsed(run)
    return None if elapsed is None else elapsed / steps


def compare(cluster, problem, methods, steps=30, lr=0.5, batch=32, timed_steps=2,
            world_size=8, curves=True):
    """Train ``problem`` with every method; loss curves and simulated time per step.

    ``methods`` maps a name to one of
    ``{"aggregate": make_aggregate}`` (data parallel, :func:`train`; add ``"mean": True``
    when the aggregate leaves the mean),
    ``{"aggregate": make_aggregate, "sync_every": H}`` (local SGD), or
    ``{"server": cls, "mode": mode, "speeds": [...]}`` (parameter server, rank 0 serves).

    Every method sees the same data and does the same work: ``steps`` rounds of one
    mini-batch of ``batch`` samples per worker. Loss curves come from an untimed run of
    ``steps`` steps (one point per round); time per step from a timed run of
    ``timed_steps`` steps (rounded up to a multiple of ``sync_every``); ``curves=False``
    skips the loss curves (the results then have only the time and bytes). Returns
    ``{name: {"samples": [...], "loss": [...], "seconds_per_step": s or None,
    "bytes_per_step": busiest rank's bytes per step}}``.
    """
    results = {}
    for name, spec in methods.items():
        out = {}
        every = spec.get("sync_every", 1)
        short = -(-timed_steps // every) * every
        for timed, n_steps in ((False, steps), (True, short))[0 if curves else 1:]:
            if "server" in spec:
                workers = world_size - 1
                run = simulate(cluster, ps_train, world_size, timed=timed, args=(
                    problem, spec["server"], spec["mode"], n_steps,
                    lr if spec["mode"] == "sync" else lr / workers, batch, spec["speeds"]))
                if not timed:
                    updates = [u for u in run.results[0]["updates"] if u[1] % workers == 0]
                    out["samples"] = [g * batch for _, g, _ in updates]
                    out["loss"] = [problem.loss(w) for _, _, w in updates]
                    out["staleness"] = run.results[0]["staleness"]
            else:
                run = simulate(cluster, train, world_size, timed=timed, args=(
                    problem, spec["aggregate"], n_steps, lr, batch,
                    spec.get("sync_every", 1), spec.get("mean", False)))
                if not timed:
                    snaps = run.results[0]
                    out["samples"] = [s * world_size * batch for s in range(len(snaps))]
                    out["loss"] = [problem.loss(w) for w in snaps]
            if timed:
                out["seconds_per_step"] = _time_per_step(run, n_steps)
                out["bytes_per_step"] = max(run.bytes_sent) / n_steps
        results[name] = out
    return results


def print_comparison(results):
    """One line per method: final loss, simulated time per step, bytes per step."""
    print(f"{'method':<22} {'final loss':>10} {'time/step':>12} {'bytes/step (busiest)':>21}")
    for name, r in results.items():
        t = r["seconds_per_step"]
        t = "n/a" if t is None else f"{t * 1e6:.1f} µs"
        print(f"{name:<22} {r['loss'][-1]:>10.4f} {t:>12} {r['bytes_per_step']:>21,.0f}")


def plot_comparison(results, title=""):
    """Loss against samples processed, and simulated time per step, side by side."""
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.2))
    for name, r in results.items():
        left.plot(r["samples"], r["loss"], label=name)
    left.set_xlabel("samples processed")
    left.set_ylabel("training loss")
    left.set_title("convergence")
    left.legend(fontsize=8)
    timed = [(n, r["seconds_per_step"]) for n, r in results.items()
             if r["seconds_per_step"] is not None]
    if timed:
        names, secs = zip(*timed)
        right.barh(range(len(names)), [s * 1e6 for s in secs])
        right.set_yticks(range(len(names)), names, fontsize=8)
        right.invert_yaxis()
        right.set_xlabel("simulated time per step (µs)")
        right.set_title("time per step")
    else:
        right.text(0.5, 0.5, "simulated time not available", ha="center", va="center")
        right.set_axis_off()
    if title:
        fig.suptitle(title)
    fig.tight_layout()
    return fig
