"""workbook.lesson02_gradient_aggregation.checks:
every check passes the reference solution, and reports each kind of
mistake — wrong values, deadlock, exception, infinite loop, collective instead of
point-to-point, wrong dtype, modified input, too many bytes — as one exact ❌ line."""

import re
import threading

import pytest
import torch
import torch.distributed as dist

import simcluster as sc

from workbook.lesson02_gradient_aggregation import demos as A
from _check_helpers import learner_namespace, line, not_started
from workbook import checking
from workbook.lesson02_gradient_aggregation import checks
from workbook.lesson02_gradient_aggregation import _reference as R
from workbook.lesson02_gradient_aggregation import checks as checks_02

ALL = "world sizes 1, 2, 3, 4, 5, 8, sizes 1, 6, 13, 64"


def expect(capsys, check, args, message):
    result, text = line(capsys, check, *args)
    assert text == message
    return result


def learner_copy(reference):
    """The reference answer as a learner would type it: the same source, its own code."""
    return learner_namespace(R, reference)[reference.__name__]


HINTS = checking.HINTS


def simulator_hint(fn, world_size=2, size=1, *args, dtype=torch.float32):
    """The hint the simulator itself gives when ``fn(tensor, *args)`` deadlocks or
    mismatches: the checks must pass it on unchanged."""
    case = checking.Case(world_size, size, dtype)
    with pytest.raises((sc.DeadlockError, sc.CollectiveMismatchError)) as info:
        case.cluster().run(lambda: fn(checking.integer_input(case, dist.get_rank()), *args),
                           world_size=world_size, accounting=False)
    assert info.value.hint
    return info.value.hint

# correct code as a learner would write it, for the wrong code below to build on
my_naive = learner_copy(R.naive_allreduce)
my_ring = learner_copy(R.ring_allreduce)
my_quantize = learner_copy(R.int8_quantize)
my_dequantize = learner_copy(R.int8_dequantize)
my_topk = learner_copy(R.topk_compress)
my_local_sgd = learner_copy(R.local_sgd)
MyServer = learner_copy(R.ParameterServer)


# ------------------------------------------------------------ shared wrong code


def uses_all_reduce(tensor, *args):
    dist.all_reduce(tensor)


def returns_sum(tensor):
    out = tensor.clone()
    dist.all_reduce(out)
    return out


def all_to_all_naive(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    mine = tensor.clone()
    for shift in range(1, p):
        incoming = torch.empty_like(tensor)
        A.exchange(mine, (rank + shift) % p, incoming, (rank - shift) % p)
        tensor += incoming


def blocking_ring(tensor):
    """Every rank sends first, with blocking send: deadlock as soon as p > 1."""
    rank, p = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    for _ in range(p - 1):
        dist.send(tensor, (rank + 1) % p)
        dist.recv(incoming, (rank - 1) % p)


def whole_tensor_ring(tensor):
    """Correct sum, but passes the whole tensor around the ring p - 1 times."""
    rank, p = dist.get_rank(), dist.get_world_size()
    passing = tensor.clone()
    for _ in range(p - 1):
        incoming = torch.empty_like(tensor)
        A.exchange(passing, (rank + 1) % p, incoming, (rank - 1) % p)
        tensor += incoming
        passing = incoming


def chunk_ring(tensor):
    """tensor.chunk(p) gives fewer than p chunks when size < p."""
    rank, p = dist.get_rank(), dist.get_world_size()
    chunks = tensor.view(-1).chunk(p)
    for step in range(p - 1):
        send, recv = chunks[(rank - step - 1) % p], chunks[(rank - step - 2) % p]
        incoming = torch.empty_like(recv)
        A.exchange(send, (rank + 1) % p, incoming, (rank - 1) % p)
        recv += incoming


def float32_buffer_ring(tensor):
    """Receive buffers made with torch.zeros(...): float32 even for a float64 tensor."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return
    flat = tensor.view(-1)
    bounds = A.chunk_bounds(flat.numel(), p)
    for step in range(p - 1):
        s0, s1 = bounds[(rank - step - 1) % p]
        r0, r1 = bounds[(rank - step - 2) % p]
        incoming = torch.zeros(r1 - r0)
        A.exchange(flat[s0:s1], (rank + 1) % p, incoming, (rank - 1) % p)
        flat[r0:r1] += incoming
    for step in range(p - 1):
        s0, s1 = bounds[(rank - step) % p]
        r0, r1 = bounds[(rank - step - 1) % p]
        incoming = torch.zeros(r1 - r0)
        A.exchange(flat[s0:s1], (rank + 1) % p, incoming, (rank - 1) % p)
        flat[r0:r1] = incoming


def forever_ring(tensor):
    step = 0
    while step < dist.get_world_size() - 1:
        pass


def wrong_shape(tensor):
    my_ring(tensor)
    tensor.resize_(tensor.numel() + 1)


def reduce_scatter_only(tensor):
    """Forgets the all-gather: each rank holds only its own chunk of the sum."""
    p = dist.get_world_size()
    if p > 1:
        flat = tensor.view(-1)
        R.ring_reduce_scatter(flat, list(range(p)), A.chunk_bounds(flat.numel(), p))


# ---------------------------------------------------------------- naive


def naive_no_broadcast(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        incoming = torch.empty_like(tensor)
        for src in range(1, p):
            dist.recv(incoming, src)
            tensor += incoming
    else:
        dist.send(tensor, 0)


def naive_root_sends_first(tensor):
    """Rank 0 broadcasts before it gathers; everybody else sends first: deadlock."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if rank == 0:
        for dst in range(1, p):
            dist.send(tensor, dst)
    else:
        dist.send(tensor, 0)
        dist.recv(tensor, 0)


def test_naive_reference(capsys):
    expect(capsys, checks.check_naive_allreduce, (learner_copy(R.naive_allreduce),),
           f"✅ naive all-reduce: passed on {ALL}")


def test_naive_mistakes(capsys):
    expect(capsys, checks.check_naive_allreduce, (naive_no_broadcast,),
           "❌ naive all-reduce: world size 2, size 1: rank 1 left the tensor unchanged — "
           "Hint: " + HINTS["unchanged"])
    expect(capsys, checks.check_naive_allreduce, (naive_root_sends_first,),
           "❌ naive all-reduce: world size 2, size 1: deadlock (rank 0: send to rank 1; "
           "rank 1: send to rank 0) — Hint: " + simulator_hint(naive_root_sends_first))
    expect(capsys, checks.check_naive_allreduce, (all_to_all_naive,),
           "❌ naive all-reduce: world size 8, size 64 (float64): in a naive all-reduce every "
           "rank but 0 sends its tensor once, to rank 0 (512 bytes): rank 1 sent 7 "
           "message(s), 3584 bytes — Hint: gather to rank 0, add, broadcast from rank 0: the "
           "other ranks talk only to rank 0.")
    expect(capsys, checks.check_naive_allreduce, (uses_all_reduce,),
           "❌ naive all-reduce: world size 1, size 1: rank 0 called all_reduce, a collective "
           "— Hint: " + HINTS["collective"])


# ----------------------------------------------------------------- ring


def test_ring_reference(capsys):
    expect(capsys, checks.check_ring_allreduce, (learner_copy(R.ring_allreduce),),
           f"✅ ring all-reduce: passed on {ALL}")


RING_VALUES_HINT = HINTS["values"]


def test_ring_mistakes(capsys, short_timeout):
    ring = checks.check_ring_allreduce
    expect(capsys, ring, (uses_all_reduce,),
           "❌ ring all-reduce: world size 1, size 1: rank 0 called all_reduce, a collective "
           "— Hint: " + HINTS["collective"])
    expect(capsys, ring, (blocking_ring,),
           "❌ ring all-reduce: world size 2, size 1: deadlock (rank 0: send to rank 1; "
           "rank 1: send to rank 0) — Hint: " + simulator_hint(blocking_ring))
    expect(capsys, ring, (chunk_ring,),
           "❌ ring all-reduce: world size 2, size 1: rank 0 raised IndexError: tuple index "
           "out of range — Hint: " + HINTS["exception"])
    expect(capsys, ring, (float32_buffer_ring,),
           "❌ ring all-reduce: world size 2, size 64 (float64): mismatch in send/recv on "
           "group WORLD: the shape/dtype differs (rank 0: receives (32,) torch.float32, rank 1: "
           "sends (32,) torch.float64) — Hint: " + simulator_hint(float32_buffer_ring, 2, 64, dtype=torch.float64))
    expect(capsys, ring, (forever_ring,),
           "❌ ring all-reduce: world size 2, size 1: rank 0 was still running after 2 s of "
           "work: the ranks used 2 s of CPU time (an endless loop?) — Hint: " + HINTS["timeout"])
    expect(capsys, ring, (returns_sum,),
           "❌ ring all-reduce: world size 1, size 1: rank 0 called all_reduce, a collective "
           "— Hint: " + HINTS["collective"])
    expect(capsys, ring, (wrong_shape,),
           "❌ ring all-reduce: world size 1, size 1: rank 0: the tensor has shape (2,), "
           "expected (1,) — Hint: " + HINTS["shape"])
    expect(capsys, ring, (whole_tensor_ring,),
           "❌ ring all-reduce: world size 8, size 64 (float64): ring all-reduce sends "
           "2(p-1)/p·n elements of 8 bytes = 896 bytes per rank: rank 0 sent 3584, 4.00× "
           "that — Hint: send one chunk of about n/p elements per step, 2(p-1) steps: never "
           "the whole tensor.")
    expect(capsys, ring, (reduce_scatter_only,),
           "❌ ring all-reduce: world size 2, size 1: rank 1 left the tensor unchanged — Hint: "
           + HINTS["unchanged"])


def ring_mean(tensor):
    """The mean, not the sum."""
    my_ring(tensor)
    tensor /= dist.get_world_size()


def test_ring_wrong_values_name_rank_index_expected_and_got(capsys):
    expect(capsys, checks.check_ring_allreduce, (ring_mean,),
           "❌ ring all-reduce: world size 2, size 1: rank 0, index 0: expected 5, got 2.5 — "
           "Hint: reduce-scatter: at step s, send chunk (i - s - 1) % p to the right and add "
           "the chunk (i - s - 2) % p from the left; all-gather: send chunk (i - s) % p, copy "
           "in chunk (i - s - 1) % p (i: your position in the ring). Chunk bounds must handle "
           "sizes that do not divide by p.")


def test_unwritten_exercise_says_so(capsys):
    def stub(tensor):
        raise NotImplementedError("send one chunk per step")

    not_started(capsys, checks.check_ring_allreduce, (stub,), "ring all-reduce",
                "send one chunk per step")


def test_ring_returning_a_new_tensor_is_reported(capsys):
    def returns_new(tensor):
        out = tensor.clone()
        my_ring(out)
        return out

    expect(capsys, checks.check_ring_allreduce, (returns_new,),
           "❌ ring all-reduce: world size 2, size 1: rank 0 left the tensor unchanged and "
           "returned a tensor — Hint: " + HINTS["unchanged"])


# ----------------------------------------------------------------- tree


def tree_no_bounds_check(tensor):
    """Receives from rank + mask even when that rank does not exist (p not a power of 2)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    incoming, mask = torch.empty_like(tensor), 1
    while mask < p:
        if rank & mask:
            dist.send(tensor, rank - mask)
            break
        dist.recv(incoming, rank + mask)
        tensor += incoming
        mask <<= 1
    # broadcast back down, as in the reference
    mask = 1
    while mask < p and not rank & mask:
        mask <<= 1
    if mask < p:
        dist.recv(tensor, rank - mask)
    mask >>= 1
    while mask > 0:
        if rank + mask < p:
            dist.send(tensor, rank + mask)
        mask >>= 1


def tree_reduce_only(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    incoming, mask = torch.empty_like(tensor), 1
    while mask < p:
        if rank & mask:
            dist.send(tensor, rank - mask)
            break
        if rank + mask < p:
            dist.recv(incoming, rank + mask)
            tensor += incoming
        mask <<= 1


def binary_tree(tensor):
    """A heap-ordered binary tree: correct, but its two children take turns."""
    rank, p = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    children = [c for c in (2 * rank + 1, 2 * rank + 2) if c < p]
    for child in children:
        dist.recv(incoming, child)
        tensor += incoming
    if rank:
        dist.send(tensor, (rank - 1) // 2)
        dist.recv(tensor, (rank - 1) // 2)
    for child in children:
        dist.send(tensor, child)


def test_tree_reference(capsys):
    expect(capsys, checks.check_tree_allreduce, (learner_copy(R.tree_allreduce),),
           f"✅ tree all-reduce: passed on {ALL}")


def test_tree_mistakes(capsys):
    tree = checks.check_tree_allreduce
    expect(capsys, tree, (tree_no_bounds_check,),
           "❌ tree all-reduce: world size 3, size 1: rank 2 raised ValueError: rank 2: "
           "receive rank 3 is out of range for a group of size 3 — Hint: "
           + HINTS["exception"])
    expect(capsys, tree, (tree_reduce_only,),
           "❌ tree all-reduce: world size 2, size 1: rank 1 left the tensor unchanged — Hint: "
           + HINTS["unchanged"])
    expect(capsys, tree, (my_naive,),
           "❌ tree all-reduce: world size 8, size 64 (float64): a tree all-reduce sends "
           "⌈log2 p⌉ = 3 messages per rank: rank 0 sent 7, 2.33× that — Hint: in "
           "a "
           "tree every rank talks to its parent and at most ⌈log2 p⌉ children; rank 0 must "
           "not receive from everybody itself.")
    expect(capsys, tree, (uses_all_reduce,),
           "❌ tree all-reduce: world size 1, size 1: rank 0 called all_reduce, a collective "
           "— Hint: " + HINTS["collective"])


def test_tree_slower_than_binomial_is_reported_once_time_is_simulated(capsys):
    result, text = line(capsys, checks.check_tree_allreduce, binary_tree)
    assert re.fullmatch(
        r"❌ tree all-reduce: world size 8, size 8: took [\d.]+ µs of simulated time, "
        r"1\.\d\d× the binomial tree's [\d.]+ µs — Hint: a binomial tree takes ⌈log2 p⌉ "
        r"rounds each way: in round i the ranks with bit i set send to rank - 2\^i, all at "
        r"the same time\.", text), text


# ----------------------------------------------------- halving-doubling


def recursive_doubling(tensor):
    """Exchanges the whole tensor with rank ^ mask: lg p·n bytes per rank."""
    rank, p = dist.get_rank(), dist.get_world_size()
    p2 = 1 << (p.bit_length() - 1)
    if rank >= p2:
        dist.send(tensor, rank - p2)
        dist.recv(tensor, rank - p2)
        return
    if rank < p - p2:
        incoming = torch.empty_like(tensor)
        dist.recv(incoming, rank + p2)
        tensor += incoming
    mask = 1
    while mask < p2:
        incoming = torch.empty_like(tensor)
        A.exchange(tensor.clone(), rank ^ mask, incoming, rank ^ mask)
        tensor += incoming
        mask <<= 1
    if rank < p - p2:
        dist.send(tensor, rank + p2)


def halving_doubling_powers_of_two_only(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    mask = 1
    while mask < p:
        incoming = torch.empty_like(tensor)
        A.exchange(tensor.clone(), rank ^ mask, incoming, rank ^ mask)
        tensor += incoming
        mask <<= 1


def blocking_pairs(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    mask = 1
    while mask < p:
        incoming = torch.empty_like(tensor)
        dist.send(tensor, rank ^ mask)
        dist.recv(incoming, rank ^ mask)
        tensor += incoming
        mask <<= 1


def test_halving_doubling_reference(capsys):
    expect(capsys, checks.check_halving_doubling_allreduce, (learner_copy(R.halving_doubling_allreduce),),
           f"✅ halving-doubling all-reduce: passed on {ALL}")


def test_halving_doubling_mistakes(capsys):
    hd = checks.check_halving_doubling_allreduce
    expect(capsys, hd, (recursive_doubling,),
           "❌ halving-doubling all-reduce: world size 8, size 64 (float64): halving-doubling "
           "sends 2(p-1)/p·n elements of 8 bytes = 896 bytes per rank: rank 0 sent 1536, "
           "1.71× that — Hint: exchange half of your current segment with your "
           "partner, not the whole tensor: that is recursive doubling, lg p·n per rank.")
    expect(capsys, hd, (halving_doubling_powers_of_two_only,),
           "❌ halving-doubling all-reduce: world size 3, size 1: rank 1 raised ValueError: "
           "rank 1: send rank 3 is out of range for a group of size 3 — Hint: "
           + HINTS["exception"])
    expect(capsys, hd, (my_ring,),
           "❌ halving-doubling all-reduce: world size 8, size 64 (float64): halving-doubling "
           "sends 2·lg p = 6 messages per rank: rank 0 sent 14, 2.33× that — Hint: each "
           "round pairs rank with rank ^ mask and halves (then doubles) the segment: lg p "
           "rounds each way, not p - 1 ring steps.")
    expect(capsys, hd, (blocking_pairs,),
           "❌ halving-doubling all-reduce: world size 2, size 1: deadlock (rank 0: send to "
           "rank 1; rank 1: send to rank 0) — Hint: " + simulator_hint(blocking_pairs))


# ----------------------------------------------------------- hierarchical


def flat_ring(tensor, ranks_per_node):
    my_ring(tensor)


def inside_nodes_only(tensor, ranks_per_node):
    rank = dist.get_rank()
    node = rank // ranks_per_node
    ranks = [node * ranks_per_node + j for j in range(ranks_per_node)]
    flat = tensor.view(-1)
    if len(ranks) > 1:
        bounds = A.chunk_bounds(flat.numel(), len(ranks))
        R.ring_reduce_scatter(flat, ranks, bounds)
        R.ring_all_gather(flat, ranks, bounds)


def wrong_nodes(tensor, ranks_per_node):
    """Takes rank % k as the node: groups ranks that are on different nodes."""
    rank, p = dist.get_rank(), dist.get_world_size()
    k = ranks_per_node
    node_ranks = [rank % k + j * k for j in range(p // k)]
    flat = tensor.view(-1)
    bounds = A.chunk_bounds(flat.numel(), len(node_ranks))
    R.ring_reduce_scatter(flat, node_ranks, bounds)
    R.ring_all_gather(flat, node_ranks, bounds)
    peers = [(rank // k) * k + j for j in range(k)]
    if len(peers) > 1:
        R.ring_reduce_scatter(flat, peers, A.chunk_bounds(flat.numel(), k))


def test_hierarchical_reference(capsys):
    expect(capsys, checks.check_hierarchical_allreduce, (learner_copy(R.hierarchical_allreduce),),
           "✅ hierarchical all-reduce: passed on (world size, ranks per node) (1, 1), (2, 1), "
           "(2, 2), (4, 2), (6, 2), (6, 3), (8, 4), sizes 1, 6, 13, 64")


def test_hierarchical_mistakes(capsys):
    hier = checks.check_hierarchical_allreduce
    expect(capsys, hier, (uses_all_reduce,),
           "❌ hierarchical all-reduce: world size 1 (1 rank per node), size 1: rank 0 called "
           "all_reduce, a collective — Hint: " + HINTS["collective"])
    expect(capsys, hier, (inside_nodes_only,),
           "❌ hierarchical all-reduce: world size 2 (1 rank per node), size 1: rank 0 sent no "
           "message and left the tensor unchanged — Hint: " + HINTS["silent"])
    expect(capsys, hier, (wrong_nodes,),
           "❌ hierarchical all-reduce: world size 2 (2 ranks per node), size 1: rank 1 left the "
           "tensor unchanged — Hint: " + HINTS["unchanged"])
    expect(capsys, hier, (flat_ring,),
           "❌ hierarchical all-reduce: world size 8 (4 ranks per node), size 1048576: across "
           "the nodes a hierarchical all-reduce sends 2(m-1)·n elements of 4 bytes (m = 2 "
           "nodes) = 8388608 bytes: yours sent 14680064 bytes between nodes, 1.75× that — Hint: finish "
           "the reduction inside each node first, so only one partial sum per node (or one "
           "shard per rank) crosses the network.")


# ---------------------------------------------------------------- fp16


def fp16_divide_after(tensor):
    half = tensor.to(torch.float16)
    my_ring(half)
    tensor.copy_(half)
    tensor /= dist.get_world_size()


def fp32_mean(tensor):
    my_ring(tensor)
    tensor /= dist.get_world_size()


def fp16_sum(tensor):
    half = tensor.to(torch.float16)
    my_ring(half)
    tensor.copy_(half)


def fp16_collective(tensor):
    half = (tensor / dist.get_world_size()).to(torch.float16)
    dist.all_reduce(half)
    tensor.copy_(half)


def test_fp16_reference(capsys):
    expect(capsys, checks.check_fp16_allreduce, (learner_copy(R.fp16_allreduce),),
           f"✅ fp16 all-reduce: passed on {ALL}")


def test_fp16_mistakes(capsys):
    fp16 = checks.check_fp16_allreduce
    expect(capsys, fp16, (fp16_divide_after,),
           "❌ fp16 all-reduce: values of ±30000 on world size 8: rank 0, index 0: expected "
           "15097.6, got inf — Hint: fp16 stops at 65504: divide by the world size BEFORE "
           "casting, so the sum of p values stays in range.")
    expect(capsys, fp16, (fp32_mean,),
           "❌ fp16 all-reduce: world size 8, size 64: an fp16 ring sends 2(p-1)/p·n·2 = 224 "
           "bytes per rank: rank 0 sent 448, 2.00× that — Hint: all-reduce the float16 "
           "copy, not the float32 tensor.")
    expect(capsys, fp16, (fp16_sum,),
           "❌ fp16 all-reduce: world size 2, size 1: rank 0, index 0: expected 0.5343, got "
           "1.068 — Hint: divide by the world size, cast to torch.float16, all-reduce the half "
           "tensor with your ring_allreduce, copy the result back into `tensor`.")
    expect(capsys, fp16, (fp16_collective,),
           "❌ fp16 all-reduce: world size 1, size 1: rank 0 called all_reduce, a collective — "
           "Hint: all-reduce the half tensor with your ring_allreduce (point to point), so its "
           "bytes on the wire can be counted.")


# ---------------------------------------------------------------- int8


def quantize_floor(x):
    q, scale = my_quantize(x)
    return torch.floor(x / scale).clamp(-127, 127).to(torch.int8), scale


def quantize_zero_scale(x):
    scale = x.abs().max() / 127
    return torch.round(x / scale).clamp(-127, 127).to(torch.int8), scale


def quantize_no_cast(x):
    q, scale = my_quantize(x)
    return q.float(), scale


def quantize_narrow(x):
    scale = x.abs().max() / 63 if x.abs().max() > 0 else torch.tensor(1.0)
    return torch.round(x / scale).to(torch.int8), scale


def quantize_in_place(x):
    scale = x.abs().max() / 127 if x.abs().max() > 0 else torch.tensor(1.0)
    return x.div_(scale).round_().to(torch.int8), scale


def test_int8_reference(capsys):
    expect(capsys, checks.check_int8_quantization,
           (learner_copy(R.int8_quantize), learner_copy(R.int8_dequantize)),
           "✅ int8 quantization: passed on sizes 1, 6, 13, 64, shape (3, 5), all zeros, all "
           "negative, tiny values, one outlier")


def test_int8_mistakes(capsys):
    check = checks.check_int8_quantization
    expect(capsys, check, (quantize_floor, my_dequantize),
           "❌ int8 quantization: size 6: at index 3 x = 0.4181 came back as 0.4109: an error "
           "of 0.71·scale, more than scale/2 — Hint: round to the nearest integer "
           "(torch.round), don't truncate; and use scale = max|x| / 127 so that nothing is "
           "clipped.")
    expect(capsys, check, (quantize_zero_scale, my_dequantize),
           "❌ int8 quantization: all zeros: scale is 0; it must be a positive number — Hint: "
           "an all-zero tensor has max |x| = 0: use scale 1 (or any positive number) then, "
           "never 0.")
    expect(capsys, check, (quantize_no_cast, my_dequantize),
           "❌ int8 quantization: size 1: q has dtype float32, expected int8 — Hint: finish "
           "with .to(torch.int8): one byte per element is the point.")
    expect(capsys, check, (quantize_narrow, my_dequantize),
           "❌ int8 quantization: size 1: the largest |q| is 63; the largest |x| should map to "
           "127 — Hint: scale = max|x| / 127 uses the whole int8 range: more levels, smaller "
           "errors.")
    expect(capsys, check, (quantize_in_place, my_dequantize),
           "❌ int8 quantization: size 1: quantize modified its input — Hint: compute q from "
           "x / scale, a new tensor; no in-place ops on x.")
    expect(capsys, check, (my_quantize, lambda q, s: q.double() * s),
           "❌ int8 quantization: size 1: dequantize returned float64, expected float32 — "
           "Hint: return q.to(torch.float32) * scale.")


# ---------------------------------------------------------------- top-k


def topk_no_feedback(grad, residual, k):
    return my_topk(grad, torch.zeros_like(residual), k)


def topk_signed(grad, residual, k):
    acc = grad + residual
    idx = torch.topk(acc, k).indices
    new = acc.clone()
    new[idx] = 0
    return acc[idx], idx, new


def topk_reset(grad, residual, k):
    values, idx, _ = my_topk(grad, residual, k)
    return values, idx, torch.zeros_like(grad)


def topk_in_place(grad, residual, k):
    residual += grad
    idx = torch.topk(residual.abs(), k).indices
    values = residual[idx].clone()
    residual[idx] = 0
    return values, idx, residual.clone()


def topk_drops_old_residual(grad, residual, k):
    values, idx, _ = my_topk(grad, residual, k)
    new = grad.clone()
    new[idx] = 0
    return values, idx, new


def test_topk_reference(capsys):
    expect(capsys, checks.check_topk_error_feedback, (learner_copy(R.topk_compress),),
           "✅ top-k with error feedback: passed on sizes 1, 6, 13, 64 with k = 1, 2, 3, 5, "
           "three calls each")


def test_topk_mistakes(capsys):
    check = checks.check_topk_error_feedback
    expect(capsys, check, (topk_no_feedback,),
           "❌ top-k with error feedback: size 6, k = 2, call 2: the values are grad[indices]: "
           "the residual was never added — Hint: error feedback: acc = grad + residual, then "
           "take the top k of acc.")
    expect(capsys, check, (topk_signed,),
           "❌ top-k with error feedback: size 6, k = 2, call 1: |acc| = 1.561 was left out "
           "while 0.04838 was sent — Hint: pick the k largest by magnitude: "
           "torch.topk(acc.abs(), k), not torch.topk(acc, k).")
    expect(capsys, check, (topk_reset,),
           "❌ top-k with error feedback: size 6, k = 2, call 1: residual accounting at index 1: "
           "grad + old residual = -0.2641, but sent + new residual = 0 — Hint: the residual "
           "must keep what was not sent, not be reset to 0.")
    expect(capsys, check, (topk_in_place,),
           "❌ top-k with error feedback: size 6, k = 2, call 1: your function modified its "
           "`residual` argument — Hint: work on acc = grad + residual (a new tensor) and "
           "return a new residual.")
    expect(capsys, check, (topk_drops_old_residual,),
           "❌ top-k with error feedback: size 6, k = 2, call 2: residual accounting at index 2: "
           "grad + old residual = 0.2198, but sent + new residual = 0.629 — Hint: the new "
           "residual is acc minus what was sent, with acc = grad + OLD residual: you dropped "
           "the old residual.")


# ------------------------------------------------------------ parameter server


class NoLock(MyServer):
    def pull(self, worker):
        self.pulled[worker] = self.version
        return self.params.clone()


class SyncAppliesAtOnce(MyServer):
    def push(self, worker, gradients):
        with self.lock:
            self.clock[worker] += 1
            self.pending[worker] = gradients.clone()
            self.params -= self.lr * gradients / self.num_workers


class KeepsReference(MyServer):
    def push(self, worker, gradients):
        with self.lock:
            self.clock[worker] += 1
            if self.mode == "sync":
                self.pending[worker] = gradients
                return
            self.staleness.append(self.version - self.pulled[worker])
            self.params -= self.lr * gradients
            self.version += 1


class FixedBound(MyServer):
    def pull(self, worker):
        with self.lock:
            if self.mode == "sync" and worker in self.pending:
                return None
            if self.mode == "bounded" and self.clock[worker] - min(self.clock) > 3:
                return None
            self.pulled[worker] = self.version
            return self.params.clone()


class LeavesLockHeld(MyServer):
    def pull(self, worker):
        self.lock.acquire()
        if self.mode == "sync" and worker in self.pending:
            return None
        self.pulled[worker] = self.version
        out = self.params.clone()
        self.lock.release()
        return out


class LocksTwice(MyServer):
    def sync(self, all_workers):
        with self.lock:
            if all(w in self.pending for w in all_workers):
                self.pull(0)        # pull takes self.lock again: a real Lock hangs here
            return super().sync(all_workers)


class RaisesInSync(MyServer):
    def sync(self, all_workers):
        with self.lock:
            mean = sum(self.pending[w] for w in all_workers) / len(all_workers)
            self.params -= self.lr * mean
            self.version += 1
            self.pending.clear()
            return True


def test_parameter_server_reference(capsys):
    expect(capsys, checks.check_parameter_server, (learner_copy(R.ParameterServer),),
           "✅ parameter server: passed sync, async and bounded (bound 3 and 1) modes, and "
           "training on the cluster with 3 workers")


def test_parameter_server_mistakes(capsys):
    check = checks.check_parameter_server
    expect(capsys, check, (NoLock,),
           "❌ parameter server: sync mode: pull(0) did not take self.lock — Hint: ranks are "
           "threads: read and write the shared state inside `with self.lock:`.")
    expect(capsys, check, (SyncAppliesAtOnce,),
           "❌ parameter server: sync mode: after push(0, g), push(1, g), params[0] = -0.2427, "
           "expected 0 — Hint: in sync mode push only stores the gradient; sync() applies "
           "them.")
    expect(capsys, check, (KeepsReference,),
           "❌ parameter server: sync mode: after sync([0, 1, 2]), params[0] = -0.2308, "
           "expected -0.1497 — Hint: params -= lr · mean of the round's gradients; store a copy "
           "of each gradient in push (the worker may reuse its buffer).")
    expect(capsys, check, (FixedBound,),
           "❌ parameter server: bounded mode (bound 1): worker 0 is 2 pushes ahead of the "
           "slowest worker, yet pull(0) did not return None — Hint: pull must return None "
           "while clock[worker] - min(clock) > bound (use self.bound, not a fixed 3).")
    expect(capsys, check, (LeavesLockHeld,),
           "❌ parameter server: sync mode: pull(0) returned while still holding self.lock — "
           "Hint: use `with self.lock:` so that every return releases it.")
    expect(capsys, check, (LocksTwice,),
           "❌ parameter server: sync mode: sync([0, 1, 2]) took self.lock while already holding "
           "it — Hint: a threading.Lock is not re-entrant: that call would hang forever. Don't "
           "call one locked method from inside another's `with self.lock:`.")
    expect(capsys, check, (RaisesInSync,),
           "❌ parameter server: sync mode: sync([0, 1, 2]) raised KeyError: 2 — Hint: "
           + HINTS["exception"])


def test_recording_lock_works_from_threads():
    lock = checking.RecordingLock()
    counter = []

    def work():
        for _ in range(100):
            with lock:
                counter.append(1)

    threads = [threading.Thread(target=work) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert lock.acquired == 400 and lock.depth == 0 and len(counter) == 400


# ------------------------------------------------------------------ local SGD


def sync_every_step(w, batches, grad_fn, lr, sync_every):
    return my_local_sgd(w, batches, grad_fn, lr, 1)


def averages_gradients(w, batches, grad_fn, lr, sync_every):
    p = dist.get_world_size()
    w = w.clone()
    for step, (x, y) in enumerate(batches):
        g = grad_fn(w, x, y)
        if (step + 1) % sync_every == 0:
            dist.all_reduce(g)
            g /= p
        w -= lr * g
    return w


def forgets_to_divide(w, batches, grad_fn, lr, sync_every):
    w = w.clone()
    for step, (x, y) in enumerate(batches):
        w -= lr * grad_fn(w, x, y)
        if (step + 1) % sync_every == 0:
            dist.all_reduce(w)
    return w


def ring_instead(w, batches, grad_fn, lr, sync_every):
    w = w.clone()
    for step, (x, y) in enumerate(batches):
        w -= lr * grad_fn(w, x, y)
        if (step + 1) % sync_every == 0:
            my_ring(w)
            w /= dist.get_world_size()
    return w


def test_local_sgd_reference(capsys):
    expect(capsys, checks.check_local_sgd, (learner_copy(R.local_sgd),),
           "✅ local SGD: passed on world sizes 1, 2, 3, 4, 5, 8, sync_every 1, 2, 3")


def test_local_sgd_mistakes(capsys):
    check = checks.check_local_sgd
    expect(capsys, check, (sync_every_step,),
           "❌ local SGD: world size 2, 6 steps, sync_every=2: rank 0 called 6 collective(s); "
           "local SGD synchronises 6 // 2 = 3 times — Hint: all-reduce after step i (counting "
           "from 0) when (i + 1) % sync_every == 0, and nowhere else.")
    hint = ("each step: w -= lr · grad_fn(w, x, y); on a sync step all-reduce the PARAMETERS "
            "(not the gradients) and divide by the world size.")
    expect(capsys, check, (averages_gradients,),
           "❌ local SGD: world size 2, 6 steps, sync_every=2: rank 0 ended with w[0] = 0.4564, "
           "expected 0.2726 — Hint: " + hint)
    expect(capsys, check, (forgets_to_divide,),
           "❌ local SGD: world size 2, 4 steps, sync_every=1: rank 0 ended with w[0] = 2.715, "
           "expected 0.3225 — Hint: " + hint)
    expect(capsys, check, (ring_instead,),
           "❌ local SGD: world size 1, 4 steps, sync_every=1: rank 0 called 0 collective(s); "
           "local SGD synchronises 4 // 1 = 4 times — Hint: average the parameters with "
           "dist.all_reduce (then divide by the world size): the check counts those calls.")


# ------------------------------------------------------------ the one-line contract


def test_every_check_returns_bool_and_never_raises(capsys):
    def explodes(*args):
        raise RuntimeError("boom\nsecond line")

    for check, args in [
        (checks.check_naive_allreduce, (explodes,)),
        (checks.check_ring_allreduce, (explodes,)),
        (checks.check_tree_allreduce, (explodes,)),
        (checks.check_halving_doubling_allreduce, (explodes,)),
        (checks.check_hierarchical_allreduce, (explodes,)),
        (checks.check_fp16_allreduce, (explodes,)),
        (checks.check_int8_quantization, (explodes, explodes)),
        (checks.check_topk_error_feedback, (explodes,)),
        (checks.check_local_sgd, (explodes,)),
    ]:
        result, text = line(capsys, check, *args)
        assert result is False
        assert "raised RuntimeError: boom — Hint:" in text, text


# ------------------------------------------------- what the review found untested


def computes_everyones_input(tensor):
    """The right sum without a message: it recomputes every rank's input itself (the
    ranks are threads of one process; on a cluster this could not work)."""
    p = dist.get_world_size()
    case = checking.Case(p, tensor.numel(), tensor.dtype)
    tensor.copy_(sum(checking.integer_input(case, r) for r in range(p)))


def test_right_values_without_a_message_are_caught(capsys):
    expect(capsys, checks.check_ring_allreduce, (computes_everyones_input,),
           "❌ ring all-reduce: world size 2, size 1: no rank sent a point-to-point message "
           "— Hint: " + HINTS["no_messages"])


def ring_short_loops(tensor):
    """range(p - 2): on two ranks neither loop runs."""
    rank, p = dist.get_rank(), dist.get_world_size()
    flat = tensor.view(-1)
    bounds = A.chunk_bounds(flat.numel(), p)
    for step in range(p - 2):
        s0, s1 = bounds[(rank - step - 1) % p]
        r0, r1 = bounds[(rank - step - 2) % p]
        incoming = torch.empty(r1 - r0, dtype=flat.dtype)
        A.exchange(flat[s0:s1], (rank + 1) % p, incoming, (rank - 1) % p)
        flat[r0:r1] += incoming


def test_a_ring_that_takes_no_step_is_told_about_its_loop_bounds(capsys):
    expect(capsys, checks.check_ring_allreduce, (ring_short_loops,),
           "❌ ring all-reduce: world size 2, size 1: rank 0 sent no message and left the "
           "tensor unchanged — Hint: " + HINTS["silent"])


def recv_first_ring(tensor):
    rank, p = dist.get_rank(), dist.get_world_size()
    incoming = torch.empty_like(tensor)
    for _ in range(p - 1):
        dist.recv(incoming, (rank - 1) % p)
        dist.send(tensor, (rank + 1) % p)


def root_only_receives(tensor):
    """Rank 0 waits for everybody; the others return without sending."""
    if dist.get_rank() == 0:
        for src in range(1, dist.get_world_size()):
            dist.recv(torch.empty_like(tensor), src)


@pytest.mark.parametrize("fn, pending", [
    (recv_first_ring, "rank 0: recv from rank 1; rank 1: recv from rank 0"),
    (root_only_receives, "rank 0: recv from rank 1; rank 1: returned"),
])
def test_every_deadlock_gets_the_simulators_hint_for_it(capsys, fn, pending):
    hint = simulator_hint(fn)
    assert "both send first" not in hint and "If every rank sends first" not in hint
    expect(capsys, checks.check_ring_allreduce, (fn,),
           f"❌ ring all-reduce: world size 2, size 1: deadlock ({pending}) — Hint: {hint}")


def test_a_timeout_names_the_time_the_run_was_given(capsys, monkeypatch):
    monkeypatch.setattr(checking, "ACCOUNTING_TIMEOUT", 1.5)

    def loops_when_large(tensor):
        my_ring(tensor)
        while tensor.numel() > 1000:     # only the timed run's tensor is this large
            pass

    result, text = line(capsys, checks.check_ring_allreduce, loops_when_large)
    assert re.fullmatch(r"❌ ring all-reduce: world size 8, size 16384: rank \d was still "
                        r"running after 1\.5 s of work: the ranks used 1\.5 s of CPU time \(an endless "
                        r"loop\?\) — "
                        "Hint: " + re.escape(HINTS["timeout"]), text), text


# ------------------------------------------------------- the time budget of each check


def ring_relay(tensor):
    """A correct ring without deadlock because rank 0 sends first and every other rank
    receives first: the same bytes and messages, but each step travels around the ring
    one link at a time."""
    rank, p = dist.get_rank(), dist.get_world_size()
    if p == 1:
        return
    flat = tensor.view(-1)
    bounds = A.chunk_bounds(flat.numel(), p)
    right, left = (rank + 1) % p, (rank - 1) % p

    def step(send, recv):
        if rank == 0:
            dist.send(send.clone(), right)
            dist.recv(recv, left)
        else:
            dist.recv(recv, left)
            dist.send(send.clone(), right)

    for s in range(p - 1):
        s0, s1 = bounds[(rank - s - 1) % p]
        r0, r1 = bounds[(rank - s - 2) % p]
        incoming = torch.empty(r1 - r0, dtype=flat.dtype)
        step(flat[s0:s1], incoming)
        flat[r0:r1] += incoming
    for s in range(p - 1):
        s0, s1 = bounds[(rank - s) % p]
        r0, r1 = bounds[(rank - s - 1) % p]
        incoming = torch.empty(r1 - r0, dtype=flat.dtype)
        step(flat[s0:s1], incoming)
        flat[r0:r1] = incoming


def hd_with(order):
    """Halving-doubling with partners in ``order(p2)`` (a list of masks)."""

    def halving_doubling(tensor):
        rank, p = dist.get_rank(), dist.get_world_size()
        flat = tensor.view(-1)
        p2 = 1 << (p.bit_length() - 1)
        if rank >= p2:
            dist.send(flat, rank - p2)
            dist.recv(flat, rank - p2)
            return
        if rank < p - p2:
            incoming = torch.empty_like(flat)
            dist.recv(incoming, rank + p2)
            flat += incoming

        lo, hi, history = 0, flat.numel(), []
        for mask in order(p2):
            partner, mid = rank ^ mask, (lo + hi) // 2
            history.append((partner, lo, hi))
            keep, give = ((lo, mid), (mid, hi)) if rank < partner else ((mid, hi), (lo, mid))
            incoming = torch.empty(keep[1] - keep[0], dtype=flat.dtype)
            A.exchange(flat[give[0]:give[1]], partner, incoming, partner)
            flat[keep[0]:keep[1]] += incoming
            lo, hi = keep
        while history:
            partner, plo, phi = history.pop()
            other = (hi, phi) if lo == plo else (plo, lo)
            incoming = torch.empty(other[1] - other[0], dtype=flat.dtype)
            A.exchange(flat[lo:hi].clone(), partner, incoming, partner)
            flat[other[0]:other[1]] = incoming
            lo, hi = plo, phi
        if rank < p - p2:
            dist.send(flat, rank + p2)

    return halving_doubling


def nearest_first(p2):
    return [1 << i for i in range(p2.bit_length() - 1)]


def farthest_first(p2):
    return nearest_first(p2)[::-1]


def test_halving_doubling_in_mpich_order_passes_and_farthest_first_crosses_nodes(capsys):
    expect(capsys, checks.check_halving_doubling_allreduce, (hd_with(nearest_first),),
           f"✅ halving-doubling all-reduce: passed on {ALL}")
    expect(capsys, checks.check_halving_doubling_allreduce, (hd_with(farthest_first),),
           "❌ halving-doubling all-reduce: world size 8 (4 ranks per node), size 4096: across "
           "the nodes halving-doubling sends 2n elements of 4 bytes (nearest partner first, "
           "as MPICH does) = 32768 bytes: yours sent 131072 bytes between nodes, 4.00× that "
           "— Hint: start with the nearest partner (mask = 1, 2, 4, ...): the big first "
           "exchanges then stay inside a node and only the small last ones cross the "
           "network.")


def test_the_reference_sends_2n_across_two_nodes_of_eight():
    """Issue 17: MPICH's order on 16 ranks in 2 nodes of 8 crosses with 2n bytes, as the
    simulator's own built-in halving-doubling does."""
    case = checking.Case(16, 1 << 12, ranks_per_node=8)
    run = checking.run_in_place(R.halving_doubling_allreduce, case, accounting=True)
    assert checking.cross_node_bytes(case, run) == 2 * case.size * 4


def hierarchical_leaders(tensor, ranks_per_node):
    """Correct and within the cross-node budget, but one rank per node does all the
    network work on the whole tensor (one NIC busy instead of k)."""
    rank, p = dist.get_rank(), dist.get_world_size()
    k = ranks_per_node
    node, local = divmod(rank, k)
    flat = tensor.view(-1)
    node_ranks = [node * k + j for j in range(k)]
    bounds = A.chunk_bounds(flat.numel(), k)
    R.ring_reduce_scatter(flat, node_ranks, bounds)
    R.ring_all_gather(flat, node_ranks, bounds)
    leaders = [j * k for j in range(p // k)]
    if local == 0 and len(leaders) > 1:
        lb = A.chunk_bounds(flat.numel(), len(leaders))
        R.ring_reduce_scatter(flat, leaders, lb)
        R.ring_all_gather(flat, leaders, lb)
    if local == 0:
        for j in node_ranks[1:]:
            dist.send(flat, j)
    else:
        dist.recv(flat, node * k)


TIME = r"took [\d.]+ [µm]s of simulated time, \d+\.\d\d× the {}'s [\d.]+ [µm]s — Hint: {}"


@pytest.mark.parametrize("check, fn, case, reference, hint", [
    (checks.check_ring_allreduce, ring_relay, "world size 8, size 16384",
     "reference ring", "in every step every rank sends and receives at once"),
    (checks.check_hierarchical_allreduce, hierarchical_leaders,
     r"world size 8 \(4 ranks per node\), size 1048576", "reference",
     "run the cross-node step on 1/k of the tensor per rank"),
])
def test_correct_but_slow_code_fails_the_time_budget(capsys, check, fn, case, reference,
                                                     hint):
    result, text = line(capsys, check, fn)
    assert re.match(rf"❌ [\w -]+: {case}: " + TIME.format(reference, re.escape(hint)),
                    text), text


class WaitingServer(MyServer):
    """In sync mode pull waits until the round is applied — which never happens, since
    sync() is called by the same thread that waits."""

    def pull(self, worker):
        while self.mode == "sync" and worker in self.pending:
            pass
        return super().pull(worker)


def test_a_parameter_server_that_waits_forever_is_stopped(capsys, short_timeout):
    expect(capsys, checks.check_parameter_server, (WaitingServer,),
           "❌ parameter server: the scripted calls: rank 0 was still running after 2 s of "
           "work: the ranks used 2 s of CPU time (an endless loop?) — Hint: " + checks_02.PS_TIMEOUT_HINT)


@pytest.mark.parametrize("check, references", [
    (checks.check_naive_allreduce, (R.naive_allreduce,)),
    (checks.check_ring_allreduce, (R.ring_allreduce,)),
    (checks.check_tree_allreduce, (R.tree_allreduce,)),
    (checks.check_halving_doubling_allreduce, (R.halving_doubling_allreduce,)),
    (checks.check_hierarchical_allreduce, (R.hierarchical_allreduce,)),
    (checks.check_fp16_allreduce, (R.fp16_allreduce,)),
    (checks.check_int8_quantization, (R.int8_quantize, R.int8_dequantize)),
    (checks.check_topk_error_feedback, (R.topk_compress,)),
    (checks.check_local_sgd, (R.local_sgd,)),
    (checks.check_parameter_server, (R.ParameterServer,)),
])
def test_every_check_refuses_the_workbooks_own_answer(capsys, check, references):
    result, text = line(capsys, check, *references)
    assert not result
    assert "is the workbook's own reference answer, not yours" in text, text
    wrapped = [lambda *args, f=f: f(*args) for f in references]
    if not isinstance(references[0], type):
        assert not line(capsys, check, *wrapped)[0]


def test_the_lab_and_lesson_modules_hold_no_answer():
    import workbook
    from workbook import models
    from workbook.lesson02_gradient_aggregation import demos, lab

    # the answers, with the parameter server lesson 10's demos share
    answers = {v for k, v in vars(R).items() if callable(v) and not k.startswith("_")
               and getattr(v, "__module__", None) in (R.__name__, "workbook._parameter_server")}
    assert R.ParameterServer in answers
    for module in (demos, lab, models, checks, checking, workbook):
        exposed = [k for k, v in vars(module).items() if any(v is a for a in answers)]
        assert not exposed, f"{module.__name__} exposes {exposed}"


# ------------------------- learner functions called directly: loops, sys.exit (issue 24)


def forever(*args, **kwargs):
    while True:
        pass


def exits(*args, **kwargs):
    import sys
    sys.exit(1)


def test_int8_and_topk_stop_an_endless_loop_and_catch_sys_exit(capsys, short_timeout):
    int8, topk = checks.check_int8_quantization, checks.check_topk_error_feedback
    expect(capsys, int8, (forever, my_dequantize),
           "❌ int8 quantization: size 1: quantize: your function was still running after "
           f"2 s of work: it used 2 s of CPU time (an endless loop?) — Hint: {HINTS['timeout']}")
    expect(capsys, int8, (my_quantize, forever),
           "❌ int8 quantization: size 1: dequantize: your function was still running after "
           f"2 s of work: it used 2 s of CPU time (an endless loop?) — Hint: {HINTS['timeout']}")
    expect(capsys, int8, (my_quantize, exits),
           f"❌ int8 quantization: size 1: dequantize called sys.exit(1) — Hint: {HINTS['exit']}")
    expect(capsys, topk, (forever,),
           "❌ top-k with error feedback: size 1, k = 1, call 1: your function: your function "
           "was still running after 2 s of work: it used 2 s of CPU time (an endless loop?) — Hint: "
           f"{HINTS['timeout']}")
    text = expect_fail(capsys, topk, (exits,), "called sys.exit(1)")
    assert "cluster.run" not in text


def expect_fail(capsys, check, args, *parts):
    result, text = line(capsys, check, *args)
    assert not result
    for part in parts:
        assert part in text, text
    return text


def test_a_raising_plain_function_is_not_told_to_use_cluster_run(capsys):
    text = expect_fail(capsys, checks.check_topk_error_feedback,
                       (lambda g, r, k: 1 / 0,), "raised ZeroDivisionError")
    assert "cluster.run" not in text and HINTS["called"] in text


@pytest.mark.parametrize("answer, words", [
    ((None, None, None), "values is None, not a tensor of numbers"),
    ((torch.tensor([1.0]), "abc", torch.zeros(1)), "indices is 'abc', not a tensor"),
    ((torch.tensor([1.0]), torch.tensor([0]), object()), "new_residual is <object"),
])
def test_topk_malformed_returns_are_a_failure(capsys, answer, words):
    expect_fail(capsys, checks.check_topk_error_feedback, (lambda g, r, k: answer,),
                "size 1, k = 1, call 1: " + words)


def test_parameter_server_stops_a_looping_constructor_or_method(capsys, short_timeout):
    class LoopsInInit(MyServer):
        def __init__(self, *args, **kwargs):
            forever()

    class ExitsInPull(MyServer):
        def pull(self, worker):
            exits()

    expect_fail(capsys, checks.check_parameter_server, (LoopsInInit,),
                "the scripted calls: rank 0 was still running after 2 s")
    text = expect_fail(capsys, checks.check_parameter_server, (ExitsInPull,),
                       "the scripted calls: rank 0 called sys.exit(1)")
    assert HINTS["exit"] in text
