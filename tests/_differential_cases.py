"""The collective cases that ``test_differential_gloo.py`` runs on both ``sim`` and real gloo.

Everything here must be importable by a freshly spawned process (the gloo workers), so it
depends on torch only — never on simcluster or pytest.

:func:`all_cases` runs every case, in one fixed order, on the current default process
group and returns ``{case_name: result}`` (results cloned to CPU). Every rank calls the
same collectives in the same order, so the very same function runs on the simulated
cluster (ranks are threads) and under gloo (one process per rank).

Inputs differ per rank and are deterministic: each comes from a ``torch.Generator`` seeded
with the case name, the rank and a tag, so adding a case never changes another case's
inputs.
"""

import datetime
import os
import tempfile
import time
import traceback
import zlib

import torch
import torch.distributed as dist

# dtypes every collective is tried with. gloo (torch 2.13) supports bfloat16 in all of them.
DTYPES = (torch.float32, torch.float64, torch.int64, torch.bfloat16)
# Lengths chosen not to divide by the world sizes 2, 3 and 4 (7) or by 3 and 4 (10).
LENGTHS = (7, 10)
WORLD_SIZES = (2, 3, 4)

# Further dtypes gloo supports, tried with fewer collectives (all_reduce, broadcast,
# all_gather).
EXTRA_DTYPES = (torch.float16, torch.complex64, torch.complex128, torch.int32, torch.int8,
                torch.uint8, torch.bool)

_DTYPE_NAMES = {torch.float32: "f32", torch.float64: "f64", torch.int64: "i64",
                torch.bfloat16: "bf16", torch.float16: "f16", torch.complex64: "c64",
                torch.complex128: "c128",
                torch.int32: "i32", torch.int8: "i8", torch.uint8: "u8", torch.bool: "bool"}


# ------------------------------------------------------------------------------ inputs
def make_input(case, rank, shape, dtype, tag=0):
    """A deterministic tensor, different for every (case, rank, tag).

    * floats: standard normal values (float32 / float64; complex: both parts);
    * signed integers: in [-9, 9], small enough that a PRODUCT over 4 ranks cannot overflow;
    * uint8: in [0, 255], so that a SUM wraps around (both backends wrap modulo 256);
    * bool: random;
    * bfloat16 / float16: +-2**k with k in [-2, 2]. bfloat16 keeps only 8 significant bits,
      so random values would make a SUM depend on the order of the additions — and gloo's
      ring reduces in a different order than sim's rank order. With powers of two every
      sum or product of up to 4 ranks is exact, so the comparison tests the collective,
      not the rounding.
    """
    seed = zlib.crc32(f"{case}|rank={rank}|tag={tag}".encode())
    gen = torch.Generator().manual_seed(seed)
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    if dtype in (torch.int64, torch.int32, torch.int8):
        return torch.randint(-9, 10, shape, generator=gen).to(dtype)
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=gen).to(dtype)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).to(dtype)
    if dtype.is_complex:
        parts = torch.randn((*shape, 2), generator=gen, dtype=torch.float64)
        return torch.view_as_complex(parts).to(dtype)
    if dtype in (torch.bfloat16, torch.float16):
        exponent = torch.randint(-2, 3, shape, generator=gen).to(torch.float64)
        sign = torch.randint(0, 2, shape, generator=gen).to(torch.float64) * 2 - 1
        return (sign * torch.pow(2.0, exponent)).to(dtype)
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


def _roots(n):
    """Several roots (src / dst) for rooted collectives: first, middle, last."""
    return sorted({0, n // 2, n - 1})


def _clone(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu().clone()
    if isinstance(value, (list, tuple)):
        return type(value)(_clone(v) for v in value)
    if isinstance(value, dict):
        return {k: _clone(v) for k, v in value.items()}
    return value


def _op(name):
    return getattr(dist.ReduceOp, name)


def _on_gloo():
    """True under real gloo: the few cases gloo cannot run as written compose an equivalent."""
    return dist.get_backend() == "gloo"


# ------------------------------------------------------------------------------- cases
# A case is ``fn(name, rank, n, groups) -> result``. ``groups`` maps a name to
# ``(group, global ranks)`` for the sub-groups all_cases creates once, up front, on every
# rank (non-members get torch's NON_GROUP_MEMBER and must not use it).

def _all_reduce(op, dtype, shape):
    def case(name, rank, n, groups):
        x = make_input(name, rank, shape, dtype)
        dist.all_reduce(x, op=_op(op))
        return x
    return case


def _all_reduce_async_many(name, rank, n, groups):
    """Three all-reduces in flight at once, waited for in reverse order."""
    xs = [make_input(name, rank, 7, dt, tag=i)
          for i, dt in enumerate((torch.float32, torch.int64, torch.bfloat16))]
    works = [dist.all_reduce(x, async_op=True) for x in xs]
    for work in reversed(works):
        work.wait()
    return xs


def _all_reduce_noncontiguous(name, rank, n, groups):
    base = make_input(name, rank, (5, 3), torch.float32)
    view = base.t()  # a transposed, non-contiguous view: the result must land in ``base``
    dist.all_reduce(view)
    return base


def _broadcast(src, dtype, length):
    def case(name, rank, n, groups):
        x = make_input(name, rank, length, dtype)
        dist.broadcast(x, src=src)
        return x
    return case


def _reduce(dst, op, dtype, length):
    def case(name, rank, n, groups):
        x = make_input(name, rank, length, dtype)
        dist.reduce(x, dst=dst, op=_op(op))
        # Only dst's result is defined: gloo leaves scratch values in the others' tensors.
        return x if rank == dst else None
    return case


def _all_gather(dtype, shape):
    def case(name, rank, n, groups):
        x = make_input(name, rank, shape, dtype)
        outs = [torch.empty_like(x) for _ in range(n)]
        dist.all_gather(outs, x)
        return outs
    return case


def _all_gather_into_tensor(dtype, shape, stacked, api="all_gather_into_tensor"):
    """``api``: torch 2.13 deprecates all_gather_into_tensor for all_gather_single."""
    gather_into = getattr(dist, api)

    def case(name, rank, n, groups):
        x = make_input(name, rank, shape, dtype)
        if stacked:
            out = torch.empty((n, *x.shape), dtype=dtype)             # (n, *shape)
        else:
            out = torch.empty((n * x.shape[0], *x.shape[1:]), dtype=dtype)  # concatenated
        if stacked and _on_gloo():
            # gloo rejects the stacked output shape ("ProcessGroupGloo::allgather: invalid
            # tensor size ... expected (2, 3), got (1, 2, 3)"), which torch documents and
            # NCCL accepts. gloo's equivalent: gather into the concatenated view of it.
            gather_into(out.view(n * x.shape[0], *x.shape[1:]), x)
        else:
            gather_into(out, x)
        return out
    return case


def _reduce_scatter(op, dtype, length):
    def case(name, rank, n, groups):
        inputs = [make_input(name, rank, length, dtype, tag=i) for i in range(n)]
        out = torch.empty(length, dtype=dtype)
        dist.reduce_scatter(out, inputs, op=_op(op))
        return out
    return case


def _reduce_scatter_tensor(op, dtype, out_shape, in_shape_of, api="reduce_scatter_tensor"):
    """``api``: torch 2.13 deprecates reduce_scatter_tensor for reduce_scatter_single."""
    scatter_from = getattr(dist, api)

    def case(name, rank, n, groups):
        inp = make_input(name, rank, in_shape_of(n), dtype)
        out = torch.empty(out_shape, dtype=dtype)
        if _on_gloo() and inp.shape[0] != n * out.shape[0]:
            # gloo insists on input.shape[0] == world_size * output.shape[0] ("Check failed:
            # outputShape[0] * worldSize == inputShape[0]"); the stacked input (n, *out_shape)
            # is accepted by torch's API and by NCCL. gloo's equivalent: the same elements
            # viewed as the concatenated input.
            inp = inp.view(n * out.shape[0], *out.shape[1:])
        scatter_from(out, inp, op=_op(op))
        return out
    return case


def _all_to_all(dtype, size_of):
    """``size_of(sender, receiver)``: the length rank ``sender`` sends to ``receiver``."""
    def case(name, rank, n, groups):
        inputs = [make_input(name, rank, size_of(rank, j), dtype, tag=j) for j in range(n)]
        outputs = [torch.empty(size_of(j, rank), dtype=dtype) for j in range(n)]
        if _on_gloo() and len({t.shape for t in inputs + outputs}) > 1:
            # gloo's all_to_all needs every tensor to have the same size ("ProcessGroupGloo::
            # alltoall: invalid tensor size at index 1"); torch's API and NCCL allow one
            # size per pair. gloo's equivalent, composed from point-to-point ops: an
            # isend/irecv with every peer and a local copy for the rank itself.
            works = []
            for j in range(n):
                if j == rank:
                    outputs[j].copy_(inputs[j])
                else:
                    works.append(dist.irecv(outputs[j], src=j))
                    works.append(dist.isend(inputs[j], dst=j))
            for work in works:
                work.wait()
        else:
            dist.all_to_all(outputs, inputs)
        return outputs
    return case


def _all_to_all_single(dtype, rows_of, cols):
    """``rows_of(sender, receiver)`` rows of ``cols`` columns (cols=None: 1-D); None: equal."""
    def case(name, rank, n, groups):
        tail = () if cols is None else (cols,)
        if rows_of is None:
            inp = make_input(name, rank, (3 * n, *tail), dtype)
            out = torch.empty_like(inp)
            dist.all_to_all_single(out, inp)
            return out
        in_splits = [rows_of(rank, j) for j in range(n)]
        out_splits = [rows_of(j, rank) for j in range(n)]
        inp = make_input(name, rank, (sum(in_splits), *tail), dtype)
        out = torch.empty((sum(out_splits), *tail), dtype=dtype)
        dist.all_to_all_single(out, inp, output_split_sizes=out_splits,
                               input_split_sizes=in_splits)
        return out
    return case


def _gather(dst, dtype, length):
    def case(name, rank, n, groups):
        x = make_input(name, rank, length, dtype)
        outs = [torch.empty_like(x) for _ in range(n)] if rank == dst else None
        dist.gather(x, outs, dst=dst)
        return outs
    return case


def _scatter(src, dtype, length):
    def case(name, rank, n, groups):
        chunks = ([make_input(name, rank, length, dtype, tag=i) for i in range(n)]
                  if rank == src else None)
        out = torch.full((length,), -1).to(dtype)
        dist.scatter(out, chunks, src=src)
        return out
    return case


def _barrier(name, rank, n, groups):
    """Barriers cannot be observed, only survived: world, async, and every sub-group."""
    dist.barrier()
    dist.barrier(async_op=True).wait()
    for group, ranks in groups.values():
        if rank in ranks:
            dist.barrier(group=group)
    return torch.tensor([rank])


def _send_recv_ring(dtype):
    """Blocking send/recv around the ring; even ranks send first, odd ranks receive first."""
    def case(name, rank, n, groups):
        x = make_input(name, rank, 7, dtype)
        got = torch.empty_like(x)
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        if rank % 2 == 0:
            dist.send(x, dst=nxt)
            dist.recv(got, src=prv)
        else:
            dist.recv(got, src=prv)
            dist.send(x, dst=nxt)
        return got
    return case


def _send_recv_mismatched(sent, received):
    """Around the ring, a send of ``sent`` (shape, dtype) into a receive buffer of
    ``received`` (shape, dtype) filled with 7s. gloo moves bytes and checks only their
    count: a receive buffer of other shape or dtype but at least as many bytes is filled
    from the start with the sent bytes, the rest stays. (One with fewer bytes aborts
    gloo's receiving process; tests/test_validation.py checks that sim raises.)"""
    def case(name, rank, n, groups):
        x = make_input(name, rank, sent[0], sent[1])
        got = torch.full(received[0], 7, dtype=received[1])
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        if rank % 2 == 0:
            dist.send(x, dst=nxt)
            dist.recv(got, src=prv)
        else:
            dist.recv(got, src=prv)
            dist.send(x, dst=nxt)
        return got
    return case


# Receives from any source use a tag of their own. gloo announces an any-source receive
# to every peer; a peer that did not answer it keeps the announcement, and a later message
# of that peer with the same tag (in a later case) is delivered into the stale buffer,
# aborting the process ("op.preamble.length <= op.nbytes. 28 vs 24. Received data size
# doesn't match expected size"), seen with 3 outstanding any-source irecvs on 4 ranks.
_ANY_SOURCE_TAG, _ANY_SOURCE_ASYNC_TAG = 7, 8


def _recv_any_source(name, rank, n, groups):
    """Rank 0 receives from any source; every other rank sends one message."""
    if rank == 0:
        got = []
        for _ in range(n - 1):
            buf = torch.empty(4, dtype=torch.float64)
            src = dist.recv(buf, tag=_ANY_SOURCE_TAG)
            got.append((src, buf))
        return sorted(got, key=lambda item: item[0])  # arrival order may differ under gloo
    dist.send(make_input(name, rank, 4, torch.float64), dst=0, tag=_ANY_SOURCE_TAG)
    return None


def _isend_irecv_ring(dtype):
    """Both directions around the ring at once, with distinct tags."""
    def case(name, rank, n, groups):
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        to_next = make_input(name, rank, 10, dtype, tag=1)
        to_prev = make_input(name, rank, 7, dtype, tag=2)
        from_prev, from_next = torch.empty(10, dtype=dtype), torch.empty(7, dtype=dtype)
        works = [dist.irecv(from_prev, src=prv, tag=1), dist.irecv(from_next, src=nxt, tag=2),
                 dist.isend(to_next, dst=nxt, tag=1), dist.isend(to_prev, dst=prv, tag=2)]
        for work in works:
            work.wait()
        return [from_prev, from_next]
    return case


def _isend_irecv_tags(name, rank, n, groups):
    """Rank 0 sends two messages to rank 1; rank 1 receives them in the opposite order."""
    if rank == 0:
        a, b = (make_input(name, rank, 7, torch.float32, tag=t) for t in (5, 6))
        works = [dist.isend(a, dst=1, tag=5), dist.isend(b, dst=1, tag=6)]
        for work in works:
            work.wait()
        return None
    if rank == 1:
        a, b = torch.empty(7), torch.empty(7)
        work_b = dist.irecv(b, src=0, tag=6)
        work_a = dist.irecv(a, src=0, tag=5)
        work_b.wait()
        work_a.wait()
        return [a, b]
    return None


def _batch_isend_irecv_ring(dtype):
    def case(name, rank, n, groups):
        nxt, prv = (rank + 1) % n, (rank - 1) % n
        to_next = make_input(name, rank, 10, dtype, tag=1)
        to_prev = make_input(name, rank, 7, dtype, tag=2)
        from_prev, from_next = torch.empty(10, dtype=dtype), torch.empty(7, dtype=dtype)
        ops = [dist.P2POp(dist.isend, to_next, nxt), dist.P2POp(dist.irecv, from_prev, prv),
               dist.P2POp(dist.isend, to_prev, prv), dist.P2POp(dist.irecv, from_next, nxt)]
        if n == 2:  # next and previous are the same rank: keep one message per direction
            ops = ops[:2]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return [from_prev, from_next] if n > 2 else [from_prev]
    return case


# --- sub-groups (new_group). ``groups`` maps a name to the group every rank created.
def _group_ranks(n):
    return {
        "even": list(range(0, n, 2)),
        "odd": list(range(1, n, 2)),
        "tail": list(range(1, n)),     # every rank but 0: group rank r is global rank r + 1
        "ends": sorted({0, n - 1}),    # non-adjacent global ranks for n > 2
    }


def _in(groups, key, rank):
    """The sub-group ``key`` if ``rank`` belongs to it, else None."""
    group, ranks = groups[key]
    return group if rank in ranks else None


def _group_all_reduce(key, dtype, op="SUM"):
    def case(name, rank, n, groups):
        group = _in(groups, key, rank)
        x = make_input(name, rank, 7, dtype)
        if group is None:
            return x  # ranks outside the group keep their input untouched
        dist.all_reduce(x, op=_op(op), group=group)
        return x
    return case


def _group_broadcast(key):
    def case(name, rank, n, groups):
        group = _in(groups, key, rank)
        x = make_input(name, rank, 10, torch.float32)
        if group is not None:
            src = dist.get_process_group_ranks(group)[-1]  # a global rank, as torch wants
            dist.broadcast(x, src=src, group=group)
        return x
    return case


def _group_all_gather(key):
    def case(name, rank, n, groups):
        group = _in(groups, key, rank)
        if group is None:
            return None
        x = make_input(name, rank, 7, torch.int64)
        outs = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
        dist.all_gather(outs, x, group=group)
        return outs
    return case


def _group_reduce(key):
    def case(name, rank, n, groups):
        group = _in(groups, key, rank)
        if group is None:
            return None
        dst = dist.get_process_group_ranks(group)[-1]
        x = make_input(name, rank, 7, torch.float64)
        dist.reduce(x, dst=dst, group=group)
        return x if rank == dst else None
    return case


def _group_reduce_scatter_tensor(key):
    def case(name, rank, n, groups):
        group = _in(groups, key, rank)
        if group is None:
            return None
        size = dist.get_world_size(group)
        inp = make_input(name, rank, 5 * size, torch.float32)
        out = torch.empty(5)
        dist.reduce_scatter_tensor(out, inp, group=group)
        return out
    return case


def _group_gather_scatter(key):
    def case(name, rank, n, groups):
        group = _in(groups, key, rank)
        if group is None:
            return None
        ranks = dist.get_process_group_ranks(group)
        root = ranks[-1]
        x = make_input(name, rank, 7, torch.int64)
        gathered = [torch.empty_like(x) for _ in ranks] if rank == root else None
        dist.gather(x, gathered, dst=root, group=group)
        chunks = ([make_input(name, rank, 4, torch.int64, tag=i) for i in range(len(ranks))]
                  if rank == root else None)
        out = torch.empty(4, dtype=torch.int64)
        dist.scatter(out, chunks, src=root, group=group)
        return [gathered, out]
    return case


def _group_send_recv(key):
    """Point-to-point inside a sub-group: peers named by global rank, around its ring."""
    def case(name, rank, n, groups):
        group = _in(groups, key, rank)
        if group is None:
            return None
        ranks = dist.get_process_group_ranks(group)
        if len(ranks) < 2:
            return None
        me = ranks.index(rank)
        nxt, prv = ranks[(me + 1) % len(ranks)], ranks[(me - 1) % len(ranks)]
        x = make_input(name, rank, 7, torch.float32)
        got = torch.empty_like(x)
        ops = [dist.P2POp(dist.isend, x, nxt, group=group),
               dist.P2POp(dist.irecv, got, prv, group=group)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        return got
    return case


# --- object collectives (pickle over broadcast / all_gather / gather / scatter)
def _all_gather_object(name, rank, n, groups):
    out = [None] * n
    dist.all_gather_object(out, {"rank": rank, "text": "x" * (3 * rank + 1)})
    return out


def _broadcast_object_list(name, rank, n, groups):
    objs = [rank, "from rank %d" % rank, {"k": [rank] * rank}]
    dist.broadcast_object_list(objs, src=n - 1)
    return objs


def _gather_object(name, rank, n, groups):
    out = [None] * n if rank == 0 else None
    dist.gather_object(("rank", rank, list(range(rank))), out, dst=0)
    return out


def _scatter_object_list(name, rank, n, groups):
    src = 1 % n
    out = [None]
    inputs = [{"to": i, "pad": "y" * i} for i in range(n)] if rank == src else None
    dist.scatter_object_list(out, inputs, src=src)
    return out


def _all_reduce_requires_grad(name, rank, n, groups):
    """A leaf that requires grad: backends write behind autograd's back, no error."""
    x = make_input(name, rank, 7, torch.float32).requires_grad_()
    dist.all_reduce(x)
    return x.detach()


def _empty_tensors(name, rank, n, groups):
    """Zero-element tensors through the main collectives."""
    x = torch.empty(0)
    dist.all_reduce(x)
    dist.broadcast(x, src=n - 1)
    outs = [torch.empty(0) for _ in range(n)]
    dist.all_gather(outs, x)
    out = torch.empty(0)
    dist.all_gather_into_tensor(out, x)
    a2a = torch.empty(0)
    dist.all_to_all_single(a2a, x, [0] * n, [0] * n)
    return [x, outs, out, a2a]


def _all_gather_into_tensor_in_place(name, rank, n, groups):
    """FSDP's pattern: each rank's input is its own chunk of the output."""
    out = torch.zeros(5 * n, dtype=torch.float32)
    out[5 * rank:5 * (rank + 1)] = make_input(name, rank, 5, torch.float32)
    dist.all_gather_into_tensor(out, out[5 * rank:5 * (rank + 1)])
    return out


def _reduce_scatter_tensor_in_place(name, rank, n, groups):
    """The output is this rank's own chunk of the input."""
    inp = make_input(name, rank, 5 * n, torch.float64)
    dist.reduce_scatter_tensor(inp[5 * rank:5 * (rank + 1)], inp)
    return inp[5 * rank:5 * (rank + 1)]


def _all_to_all_single_in_place(name, rank, n, groups):
    """Output and input are the same tensor (gloo supports this)."""
    x = make_input(name, rank, (3 * n,), torch.float32)
    dist.all_to_all_single(x, x)
    return x


def _all_to_all_in_place(name, rank, n, groups):
    """The output list is the input list (gloo supports this)."""
    xs = [make_input(name, rank, 3, torch.int64, tag=j) for j in range(n)]
    dist.all_to_all(xs, xs)
    return xs


def _irecv_any_source(name, rank, n, groups):
    """Rank 0 posts n-1 receives from any source at once; the others isend."""
    if rank == 0:
        bufs = [torch.empty(3, dtype=torch.float64) for _ in range(n - 1)]
        works = [dist.irecv(buf, tag=_ANY_SOURCE_ASYNC_TAG) for buf in bufs]
        for work in works:
            work.wait()
        return sorted(bufs, key=lambda b: b[0].item())  # arrival order may differ
    x = make_input(name, rank, 3, torch.float64)
    x[0] = rank  # the sort key above
    dist.isend(x, dst=0, tag=_ANY_SOURCE_ASYNC_TAG).wait()
    return None


def _p2p_across_collective(name, rank, n, groups):
    """Point-to-point posted before, and waited for after, an all_reduce."""
    nxt, prv = (rank + 1) % n, (rank - 1) % n
    got = torch.empty(7)
    works = [dist.irecv(got, src=prv), dist.isend(make_input(name, rank, 7, torch.float32),
                                                  dst=nxt)]
    y = make_input(name, rank, 10, torch.int64, tag=1)
    dist.all_reduce(y, op=dist.ReduceOp.MAX)
    for work in works:
        work.wait()
    return [got, y]


# --- non-contiguous buffers: gloo accepts them in these collectives, so the simulator must
# give the same result. Each view is every other element of a base tensor; the case
# returns the base, so an element written outside the view shows too. (gloo refuses them
# in send / recv and as all_to_all_single's input; into a non-contiguous broadcast or
# scatter output it writes only the first half, into all_to_all_single's output it writes
# past the view: the simulator refuses all of those, see _wrong_cases below and
# tests/test_validation.py.)
def _strided(shape, dtype=torch.float32, fill=None, name=None, rank=None, tag=0):
    """A view of every other element along the last dim; filled with -1 or an input."""
    shape = tuple(shape) if isinstance(shape, (tuple, list)) else (shape,)
    base = torch.full((*shape, 2), -1.0, dtype=dtype)
    if fill == "input":
        base[..., 0] = make_input(name, rank, shape, dtype, tag)
    return base, base[..., 0]


def _all_gather_non_contiguous(name, rank, n, groups):
    _, inp = _strided(7, fill="input", name=name, rank=rank)
    outs = [_strided(7) for _ in range(n)]
    dist.all_gather([view for _, view in outs], inp)
    return [base for base, _ in outs]


def _all_gather_into_tensor_non_contiguous(name, rank, n, groups):
    _, inp = _strided(5, fill="input", name=name, rank=rank)
    base, out = _strided(5 * n)
    dist.all_gather_into_tensor(out, inp)
    return base


def _reduce_scatter_tensor_non_contiguous(name, rank, n, groups):
    _, inp = _strided(5 * n, fill="input", name=name, rank=rank)
    base, out = _strided(5)
    dist.reduce_scatter_tensor(out, inp)
    return base


def _gather_non_contiguous(name, rank, n, groups):
    _, inp = _strided(4, fill="input", name=name, rank=rank)
    outs = [_strided(4) for _ in range(n)] if rank == n - 1 else None
    dist.gather(inp, [view for _, view in outs] if outs else None, dst=n - 1)
    return [base for base, _ in outs] if outs else None


def _all_to_all_non_contiguous(name, rank, n, groups):
    inputs = [_strided(3, fill="input", name=name, rank=rank, tag=j)[1] for j in range(n)]
    outs = [_strided(3) for _ in range(n)]
    dist.all_to_all([view for _, view in outs], inputs)
    return [base for base, _ in outs]


# --- wrong calls that gloo rejects on every rank, before anything is sent: the simulator
# must reject them too (each rank raises; the message may differ). Calls that gloo
# rejects on one rank only (a scatter_list that does not fit the source's output) leave
# the other ranks waiting until gloo's timeout: tests/test_validation.py has those.
RAISED = "raised"


def _wrong(call):
    """A case that makes every rank ``call(rank, n)``; returns RAISED if it raised."""
    def case(name, rank, n, groups):
        try:
            call(rank, n)
        except (RuntimeError, ValueError, TypeError):
            return RAISED
        return "returned"
    return case


def _wrong_cases():
    """``[(name, call)]``: each call is wrong on every rank."""
    def send_non_contiguous(rank, n):
        dist.isend(torch.ones(4, 2)[:, 0], dst=(rank + 1) % n).wait()

    def recv_non_contiguous(rank, n):
        dist.irecv(torch.zeros(4, 2)[:, 0], src=(rank - 1) % n).wait()

    def f64(k):
        return torch.zeros(k, dtype=torch.float64)

    return [
        ("reduce_scatter-larger-output",
         lambda r, n: dist.reduce_scatter(torch.zeros(4), [torch.ones(1)] * n)),
        ("reduce_scatter-smaller-output",
         lambda r, n: dist.reduce_scatter(torch.zeros(1), [torch.ones(4)] * n)),
        ("reduce_scatter-f64-output",
         lambda r, n: dist.reduce_scatter(f64(4), [torch.ones(4)] * n)),
        ("all_gather_into_tensor-f64-output-wrong-size",
         lambda r, n: dist.all_gather_into_tensor(f64(3 * n), torch.ones(4))),
        ("all_gather_into_tensor-f64-output",
         lambda r, n: dist.all_gather_into_tensor(f64(4 * n), torch.ones(4))),
        ("all_gather_into_tensor-wrong-size",
         lambda r, n: dist.all_gather_into_tensor(torch.zeros(3 * n), torch.ones(4))),
        ("all_gather-larger-outputs",
         lambda r, n: dist.all_gather([torch.zeros(5) for _ in range(n)], torch.ones(4))),
        ("all_gather-f64-outputs",
         lambda r, n: dist.all_gather([f64(4) for _ in range(n)], torch.ones(4))),
        ("reduce_scatter_tensor-f64-output",
         lambda r, n: dist.reduce_scatter_tensor(f64(4), torch.ones(4 * n))),
        ("reduce_scatter_tensor-wrong-size",
         lambda r, n: dist.reduce_scatter_tensor(torch.zeros(4), torch.ones(3 * n))),
        ("all_to_all-f64-outputs",
         lambda r, n: dist.all_to_all([f64(4) for _ in range(n)],
                                      [torch.ones(4) for _ in range(n)])),
        ("all_to_all_single-f64-output",
         lambda r, n: dist.all_to_all_single(f64(4 * n), torch.ones(4 * n))),
        ("all_to_all_single-wrong-size",
         lambda r, n: dist.all_to_all_single(torch.zeros(3 * n), torch.ones(4 * n))),
        ("all_reduce-int16", lambda r, n: dist.all_reduce(torch.ones(4, dtype=torch.int16))),
        ("all_reduce-uint16",
         lambda r, n: dist.all_reduce(torch.ones(4, dtype=torch.uint16))),
        ("all_reduce-uint32",
         lambda r, n: dist.all_reduce(torch.ones(4, dtype=torch.uint32))),
        ("all_reduce-float8",
         lambda r, n: dist.all_reduce(torch.ones(4).to(torch.float8_e4m3fn))),
        ("broadcast-uint16",
         lambda r, n: dist.broadcast(torch.ones(4, dtype=torch.uint16), src=0)),
        ("all_gather-int16",
         lambda r, n: dist.all_gather([torch.zeros(4, dtype=torch.int16) for _ in range(n)],
                                      torch.ones(4, dtype=torch.int16))),
        ("all_to_all_single-non-contiguous-input",
         lambda r, n: dist.all_to_all_single(torch.zeros(4 * n),
                                             torch.ones(4 * n, 2)[:, 0])),
        ("send-non-contiguous", send_non_contiguous),
        ("recv-non-contiguous", recv_non_contiguous),
    ]


def case_list(n):
    """``[(name, fn)]`` for world size ``n``, in the order :func:`all_cases` runs them.

    Pure: builds the list without touching torch.distributed, so the test can list the
    case names at collection time.
    """
    cases = []

    def add(name, fn):
        cases.append((name, fn))

    for dt in DTYPES:
        d = _DTYPE_NAMES[dt]
        for op in ("SUM", "AVG", "MIN", "MAX", "PRODUCT"):
            if op == "AVG" and not dt.is_floating_point:
                # gloo (torch 2.13) supports AVG for floating dtypes, bfloat16 included, so
                # AVG is compared directly, not as SUM / world size. AVG of integers is
                # rejected by both backends (gloo: "result type Float can't be cast to the
                # desired output type Long", raised at wait(); sim: ValueError up front),
                # so there is nothing to compare.
                continue
            for length in (LENGTHS if op == "SUM" else LENGTHS[:1]):
                add(f"all_reduce-{op}-{d}-len{length}", _all_reduce(op, dt, length))
    for op in ("BAND", "BOR", "BXOR"):
        add(f"all_reduce-{op}-i64-len10", _all_reduce(op, torch.int64, 10))
    for dt in EXTRA_DTYPES:
        d = _DTYPE_NAMES[dt]
        for op in ("SUM", "MAX"):
            if dt.is_complex and op == "MAX":
                continue  # no order on complex numbers: both backends reject it
            add(f"all_reduce-{op}-{d}-len10", _all_reduce(op, dt, 10))
        add(f"broadcast-src{n - 1}-{d}", _broadcast(n - 1, dt, 10))
        add(f"all_gather-{d}", _all_gather(dt, 7))
    add("all_reduce-SUM-f32-2d", _all_reduce("SUM", torch.float32, (3, 5)))
    add("all_reduce-requires-grad", _all_reduce_requires_grad)
    add("empty-tensors", _empty_tensors)
    add("all_reduce-SUM-f64-0d", _all_reduce("SUM", torch.float64, ()))
    add("all_reduce-async-many", _all_reduce_async_many)
    add("all_reduce-noncontiguous", _all_reduce_noncontiguous)
    add("all_gather-noncontiguous", _all_gather_non_contiguous)
    add("all_gather_into_tensor-noncontiguous", _all_gather_into_tensor_non_contiguous)
    add("reduce_scatter_tensor-noncontiguous", _reduce_scatter_tensor_non_contiguous)
    add("gather-noncontiguous", _gather_non_contiguous)
    add("all_to_all-noncontiguous", _all_to_all_non_contiguous)
    for name, call in _wrong_cases():
        add(f"wrong-{name}", _wrong(call))

    for src in _roots(n):
        for dt in DTYPES:
            add(f"broadcast-src{src}-{_DTYPE_NAMES[dt]}", _broadcast(src, dt, 10))
    for dst in _roots(n):
        for dt in DTYPES:
            add(f"reduce-dst{dst}-SUM-{_DTYPE_NAMES[dt]}", _reduce(dst, "SUM", dt, 7))
    last = n - 1
    add(f"reduce-dst{last}-MAX-i64", _reduce(last, "MAX", torch.int64, 10))
    add(f"reduce-dst{last}-MIN-f32", _reduce(last, "MIN", torch.float32, 10))
    add(f"reduce-dst{last}-PRODUCT-f64", _reduce(last, "PRODUCT", torch.float64, 10))
    add(f"reduce-dst{last}-AVG-f32", _reduce(last, "AVG", torch.float32, 10))

    for dt in DTYPES:
        d = _DTYPE_NAMES[dt]
        add(f"all_gather-{d}", _all_gather(dt, 7))
        add(f"all_gather_into_tensor-{d}", _all_gather_into_tensor(dt, (7,), stacked=False))
    for dt in (torch.float32, torch.int64):
        add(f"all_gather_single-{_DTYPE_NAMES[dt]}",
            _all_gather_into_tensor(dt, (7,), stacked=False, api="all_gather_single"))
    add("all_gather-f32-2d", _all_gather(torch.float32, (2, 3)))
    add("all_gather_into_tensor-f32-2d-concat",
        _all_gather_into_tensor(torch.float32, (2, 3), stacked=False))
    add("all_gather_into_tensor-f32-2d-stacked",
        _all_gather_into_tensor(torch.float32, (2, 3), stacked=True))
    add("all_gather_into_tensor-in-place", _all_gather_into_tensor_in_place)

    # gloo (torch 2.13) has reduce_scatter and reduce_scatter_tensor natively, with every
    # reduce op; only reduce_scatter_tensor's stacked input shape needs a workaround.
    for dt in DTYPES:
        d = _DTYPE_NAMES[dt]
        add(f"reduce_scatter-SUM-{d}", _reduce_scatter("SUM", dt, 7))
        add(f"reduce_scatter_tensor-SUM-{d}",
            _reduce_scatter_tensor("SUM", dt, (5,), lambda n: (5 * n,)))
    for dt in (torch.float32, torch.int64):
        add(f"reduce_scatter_single-SUM-{_DTYPE_NAMES[dt]}",
            _reduce_scatter_tensor("SUM", dt, (5,), lambda n: (5 * n,),
                                   api="reduce_scatter_single"))
    for op in ("AVG", "MIN", "MAX", "PRODUCT"):
        add(f"reduce_scatter-{op}-f64", _reduce_scatter(op, torch.float64, 10))
        add(f"reduce_scatter_tensor-{op}-f32",
            _reduce_scatter_tensor(op, torch.float32, (5,), lambda n: (5 * n,)))
    add("reduce_scatter_tensor-SUM-f32-2d",
        _reduce_scatter_tensor("SUM", torch.float32, (2, 3), lambda n: (2 * n, 3)))
    add("reduce_scatter_tensor-SUM-i64-stacked",
        _reduce_scatter_tensor("SUM", torch.int64, (2, 3), lambda n: (n, 2, 3)))
    add("reduce_scatter_tensor-in-place", _reduce_scatter_tensor_in_place)

    for dt in DTYPES:
        d = _DTYPE_NAMES[dt]
        add(f"all_to_all-equal-{d}", _all_to_all(dt, lambda s, r: 3))
        # Every (sender, receiver) pair has its own length, some of them 0.
        add(f"all_to_all-uneven-{d}", _all_to_all(dt, lambda s, r: (s + 2 * r) % 4))
        add(f"all_to_all_single-equal-{d}", _all_to_all_single(dt, None, None))
        add(f"all_to_all_single-uneven-{d}",
            _all_to_all_single(dt, lambda s, r: (2 * s + 3 * r + 1) % 4, None))
    add("all_to_all_single-equal-f32-2d", _all_to_all_single(torch.float32, None, 3))
    add("all_to_all_single-uneven-f32-2d",
        _all_to_all_single(torch.float32, lambda s, r: (s + r) % 3, 3))
    add("all_to_all_single-in-place", _all_to_all_single_in_place)
    add("all_to_all-in-place", _all_to_all_in_place)

    for root in _roots(n):
        for dt in DTYPES:
            d = _DTYPE_NAMES[dt]
            add(f"gather-dst{root}-{d}", _gather(root, dt, 7))
            add(f"scatter-src{root}-{d}", _scatter(root, dt, 7))

    add("barrier", _barrier)

    for dt in DTYPES:
        d = _DTYPE_NAMES[dt]
        add(f"send_recv-ring-{d}", _send_recv_ring(dt))
        add(f"isend_irecv-ring-{d}", _isend_irecv_ring(dt))
        add(f"batch_isend_irecv-ring-{d}", _batch_isend_irecv_ring(dt))
    # Buffers that differ from the sent tensor but hold at least as many bytes (the bytes
    # are compared exactly: the results are integers, or floats from floats).
    f32, i32, i64 = torch.float32, torch.int32, torch.int64
    for key, sent, received in [("scalar-into-1", ((), f32), ((1,), f32)),
                                ("2x3-into-3x2", ((2, 3), f32), ((3, 2), f32)),
                                ("4-into-6", ((4,), i64), ((6,), i64)),
                                ("f32-into-i32", ((4,), f32), ((4,), i32)),
                                ("i32x4-into-i64x2", ((4,), i32), ((2,), i64)),
                                ("i64x2-into-i32x5", ((2,), i64), ((5,), i32))]:
        add(f"send_recv-other-buffer-{key}", _send_recv_mismatched(sent, received))
    add("isend_irecv-tags-out-of-order", _isend_irecv_tags)
    add("recv-any-source", _recv_any_source)
    add("irecv-any-source", _irecv_any_source)
    add("isend_irecv-across-all_reduce", _p2p_across_collective)

    for key in _group_ranks(n):
        add(f"new_group-{key}-all_reduce-SUM-f32", _group_all_reduce(key, torch.float32))
        add(f"new_group-{key}-all_reduce-MAX-i64", _group_all_reduce(key, torch.int64, "MAX"))
        add(f"new_group-{key}-broadcast", _group_broadcast(key))
        add(f"new_group-{key}-all_gather", _group_all_gather(key))
        add(f"new_group-{key}-reduce", _group_reduce(key))
        add(f"new_group-{key}-reduce_scatter_tensor", _group_reduce_scatter_tensor(key))
        add(f"new_group-{key}-gather-scatter", _group_gather_scatter(key))
        add(f"new_group-{key}-batch_isend_irecv", _group_send_recv(key))

    add("all_gather_object", _all_gather_object)
    add("broadcast_object_list", _broadcast_object_list)
    add("gather_object", _gather_object)
    add("scatter_object_list", _scatter_object_list)
    return cases


def case_names(n):
    return [name for name, _ in case_list(n)]


def all_cases():
    """Run every case on the current default group; return ``{case_name: result}``.

    A case that raises is recorded as ``{"__error__": "Type: message"}`` (the comparison
    then reports which backend raised what) and the next case runs.
    """
    rank, n = dist.get_rank(), dist.get_world_size()
    # Every rank creates every sub-group, in the same order, as torch requires.
    groups = {key: (dist.new_group(ranks), ranks) for key, ranks in _group_ranks(n).items()}
    results = {}
    for name, fn in case_list(n):
        try:
            results[name] = _clone(fn(name, rank, n, groups))
        except Exception as exc:  # noqa: BLE001 — recorded and compared, not hidden
            results[name] = {"__error__": f"{type(exc).__name__}: {exc}"}
    return results


# ----------------------------------------------------------------------- gloo runner
def _result_path(out_dir, world_size, rank, suffix):
    return os.path.join(out_dir, f"ws{world_size}-rank{rank}.{suffix}")


def gloo_worker(rank, world_sizes, port, out_dir, timeout_s, target=None):
    """One spawned process: for each world size it takes part in, be gloo rank ``rank``
    and run ``target`` (default :func:`all_cases`), saving what it returns.

    One process serves every world size (a fresh default group each time, on its own
    store prefix) so that the whole differential run pays for ``import torch`` in
    max(world_sizes) processes instead of sum(world_sizes): on two busy cores that import
    dominates the run time.
    """
    torch.set_num_threads(1)
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore("127.0.0.1", port, None, is_master=False, timeout=timeout)
    for world_size in world_sizes:
        if rank >= world_size:
            continue
        try:
            dist.init_process_group("gloo", store=dist.PrefixStore(f"ws{world_size}/", store),
                                    rank=rank, world_size=world_size, timeout=timeout)
            try:
                results = (target or all_cases)()
            finally:
                dist.destroy_process_group()
            tmp = _result_path(out_dir, world_size, rank, "tmp")
            torch.save(results, tmp)
            os.replace(tmp, _result_path(out_dir, world_size, rank, "pt"))
        except BaseException:
            with open(_result_path(out_dir, world_size, rank, "err"), "w") as f:
                f.write(traceback.format_exc())
            raise  # the other ranks of this world size would only time out: stop here


class GlooRun:
    """:func:`all_cases` on real gloo, one spawned process per rank, over loopback.

    ``target`` runs another function instead; it must be picklable by reference (a
    module-level function the spawned interpreters can import) and take no arguments.

    ``start()`` spawns the workers and returns at once, so the caller can run the
    simulator meanwhile (the workers spend most of their time importing torch);
    ``collect()`` waits for them and returns ``{world_size: [rank 0's results, ...]}``,
    or for a world size that failed, ``{world_size: RuntimeError(...)}`` with the
    workers' tracebacks. ``close()`` (also called by ``collect``) terminates, then kills,
    any worker still alive and removes the temporary directory: call it in a ``finally``.

    The parent hosts the TCPStore on a port the OS picks (no free-port race); workers
    connect to it on 127.0.0.1 and gloo itself is pinned to the loopback interface
    (GLOO_SOCKET_IFNAME=lo). Workers run with OMP_NUM_THREADS=1.
    """

    ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "GLOO_SOCKET_IFNAME": "lo"}

    def __init__(self, world_sizes=WORLD_SIZES, timeout_s=90.0, target=None):
        self.world_sizes, self.timeout_s, self.target = tuple(world_sizes), timeout_s, target
        self._procs, self._store, self._dir, self._deadline = [], None, None, None

    def start(self):
        import multiprocessing

        ctx = multiprocessing.get_context("spawn")
        self._dir = tempfile.TemporaryDirectory(prefix="gloo-diff-")
        self._store = dist.TCPStore("127.0.0.1", 0, None, is_master=True,
                                    wait_for_workers=False,
                                    timeout=datetime.timedelta(seconds=self.timeout_s))
        self._deadline = time.monotonic() + self.timeout_s
        saved = {k: os.environ.get(k) for k in self.ENV}
        try:
            os.environ.update(self.ENV)  # inherited by the spawned interpreters
            for rank in range(max(self.world_sizes)):
                proc = ctx.Process(target=gloo_worker, name=f"gloo-rank-{rank}", daemon=True,
                                   args=(rank, self.world_sizes, self._store.port,
                                         self._dir.name, self.timeout_s / 3, self.target))
                self._procs.append(proc)
                proc.start()
        except BaseException:
            self.close()
            raise
        finally:
            for k, v in saved.items():
                if v is None:
                    os.environ.pop(k, None)
                else:
                    os.environ[k] = v
        return self

    def close(self):
        """Terminate (then kill) every worker still alive; drop the store and temp dir."""
        for proc in self._procs:
            if proc.pid is not None and proc.is_alive():
                proc.terminate()
        for proc in self._procs:
            if proc.pid is None:
                continue
            proc.join(5)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
        self._store = None
        if self._dir is not None:
            self._dir.cleanup()
            self._dir = None

    def collect(self):
        try:
            for proc in self._procs:
                proc.join(max(0.0, self._deadline - time.monotonic()))
            hung = {p.name for p in self._procs if p.is_alive()}
            for proc in self._procs:
                if proc.is_alive():
                    proc.terminate()
                proc.join(5)
            return {n: self._load(n, hung) for n in self.world_sizes}
        finally:
            self.close()

    def _load(self, world_size, hung):
        out_dir, problems = self._dir.name, []
        for rank in range(world_size):
            err = _result_path(out_dir, world_size, rank, "err")
            proc = self._procs[rank]
            if os.path.exists(err):
                with open(err) as f:
                    problems.append(f"gloo rank {rank} raised:\n{f.read()}")
            elif not os.path.exists(_result_path(out_dir, world_size, rank, "pt")):
                problems.append(
                    f"gloo rank {rank} saved no results (exit code {proc.exitcode}"
                    + (f"; still running after {self.timeout_s} s, terminated"
                       if proc.name in hung else "") + ")")
        if problems:
            return RuntimeError(f"gloo run of world size {world_size} failed:\n"
                                + "\n".join(problems))
        return [torch.load(_result_path(out_dir, world_size, r, "pt"), weights_only=True)
                for r in range(world_size)]


def run_gloo(world_sizes=WORLD_SIZES, timeout_s=90.0):
    """Start a :class:`GlooRun` and collect it."""
    return GlooRun(world_sizes, timeout_s).start().collect()
