"""Point-to-point messages are full duplex, as NVLink and InfiniBand are.

A rank sends on its send lane (egress) while it receives on its receive lane (ingress):
an exchange, a ring shift or a pipeline's steady state (activations forward while
gradients come back) costs one transfer per step, not two. Sends of one rank to several
peers share its egress and queue. Expected times are alpha + n·beta with the preset's
link numbers typed in (as in ``test_fidelity.py``), never the cost model's formulas.
"""

import json

import pytest
import torch
import torch.distributed as dist

import simcluster as sc
from simcluster.spec import preset

MiB = 2**20
REL = 1e-9
NVLINK = preset("dgx-a100").nodes[0].fabric
IB = preset("dgx-a100", nodes=2).inter_node_link
SLOWDOWN = 1.189  # overlapped compute runs this much slower (test_fidelity.py: the source)


def _transfer(link, nbytes):
    """alpha + n·beta for one message on ``link``."""
    return link.latency + nbytes / (link.bandwidth * link.efficiency)


def _meta(nbytes):
    return torch.empty(nbytes, dtype=torch.uint8, device="meta")


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100")


def _exchange(nbytes):
    """Ranks 0 and 1 swap ``nbytes`` with one batch_isend_irecv each."""
    peer = 1 - dist.get_rank()
    ops = [dist.P2POp(dist.isend, _meta(nbytes), peer),
           dist.P2POp(dist.irecv, _meta(nbytes), peer)]
    for work in dist.batch_isend_irecv(ops):
        work.wait()


def test_an_exchange_of_two_ranks_takes_one_transfer(node):
    n = 64 * MiB
    run = node.run(_exchange, world_size=2, args=(n,))
    one = _transfer(NVLINK, n)
    assert run.elapsed == pytest.approx(one, rel=REL)
    for r in range(2):
        # the send and the receive overlap: the communication stream was busy once
        assert run.clock(r).comm == pytest.approx(one, rel=REL)
        assert run.summary().rows[r]["comm_s"] == pytest.approx(one, rel=REL)


def _ring_shift(nbytes):
    r, p = dist.get_rank(), dist.get_world_size()
    send = dist.isend(_meta(nbytes), (r + 1) % p)
    recv = dist.irecv(_meta(nbytes), (r - 1) % p)
    send.wait()
    recv.wait()


def test_a_ring_shift_on_four_ranks_takes_one_transfer(node):
    n = 16 * MiB
    run = node.run(_ring_shift, world_size=4, args=(n,))
    assert run.elapsed == pytest.approx(_transfer(NVLINK, n), rel=REL)


def _send_to_two_peers(nbytes):
    r = dist.get_rank()
    if r == 0:
        works = [dist.isend(_meta(nbytes), 1), dist.isend(_meta(nbytes), 2)]
        for work in works:
            work.wait()
    else:
        dist.recv(_meta(nbytes), 0)


def test_two_sends_of_one_rank_share_its_egress(node):
    n = 64 * MiB
    run = node.run(_send_to_two_peers, world_size=3, args=(n,))
    one = _transfer(NVLINK, n)
    assert run.elapsed == pytest.approx(2 * one, rel=REL)
    assert run.clock(0).comm == pytest.approx(2 * one, rel=REL)
    ends = sorted(max(e.end for e in run.clock(r).events if e.lane == "comm") for r in (1, 2))
    assert ends == pytest.approx([one, 2 * one], rel=REL)


STAGES = (0, 8)   # one stage per node: activations and gradients cross InfiniBand


def _matmul(size):
    a = torch.empty(size, size, dtype=torch.bfloat16, device="meta")
    return a @ a


def _pipeline_steady_state(steps, size, nbytes):
    """Two stages in 1F1B's steady state: each step computes, then stage 0 sends an
    activation forward while it receives a gradient back, and stage 1 the reverse."""
    r = dist.get_rank()
    if r not in STAGES:
        return
    peer = STAGES[1 - STAGES.index(r)]
    for _ in range(steps):
        _matmul(size)
        ops = [dist.P2POp(dist.isend, _meta(nbytes), peer),
               dist.P2POp(dist.irecv, _meta(nbytes), peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()


def test_a_pipeline_steady_state_sends_and_receives_at_once():
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    steps, size, n = 4, 4096, 32 * MiB
    run = cluster.run(_pipeline_steady_state, world_size=16, args=(steps, size, n))
    compute = 2 * size**3 / preset("dgx-a100").nodes[0].device.flops_for(torch.bfloat16)
    assert run.elapsed == pytest.approx(steps * (compute + _transfer(IB, n)), rel=REL)


def _exchange_under_compute(nbytes, size):
    """Post an exchange, compute while it runs, then wait for it."""
    peer = 1 - dist.get_rank()
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, _meta(nbytes), peer),
                                    dist.P2POp(dist.irecv, _meta(nbytes), peer)])
    _matmul(size)
    for work in works:
        work.wait()


def test_compute_under_a_send_and_a_receive_is_slowed_once(node):
    """The overlap slowdown applies to the time the communication stream is busy, however
    many transfers run in it at once."""
    n, size = 16 * MiB, 8192
    run = node.run(_exchange_under_compute, world_size=2, args=(n, size))
    comm = _transfer(NVLINK, n)
    compute = 2 * size**3 / preset("dgx-a100").nodes[0].device.flops_for(torch.bfloat16)
    assert compute > comm   # the matmul outlasts the exchange
    expected = comm + (compute - comm / SLOWDOWN)
    assert run.elapsed == pytest.approx(expected, rel=REL)
    for row in run.summary().rows:   # hidden once, not once per direction
        assert row["overlap_s"] == pytest.approx(comm, rel=REL)


def _receive_then_send(nbytes, size):
    """Rank 0 receives while it computes, then sends while the receive still runs."""
    r = dist.get_rank()
    if r == 0:
        recv = dist.irecv(_meta(nbytes), 1)
        _matmul(size)
        dist.send(_meta(nbytes), 1)
        recv.wait()
    else:
        send = dist.isend(_meta(nbytes), 0)
        dist.recv(_meta(nbytes), 0)
        send.wait()


def test_the_trace_puts_receives_on_their_own_thread_so_events_nest(node, tmp_path):
    """Events of one trace thread must nest (Perfetto mis-draws overlapping ones): a
    receive that overlaps a send of the same rank goes on the rank's "recv" thread."""
    n, size = 64 * MiB, 2048
    run = node.run(_receive_then_send, world_size=2, args=(n, size))
    one = _transfer(NVLINK, n)
    recv = next(e for e in run.clock(0).events if e.label == "recv 1->0")
    send = next(e for e in run.clock(0).events if e.label == "send 0->1")
    assert recv.start < send.start < recv.end < send.end   # they overlap, unnested
    assert run.elapsed == pytest.approx(send.start + one, rel=REL)
    trace = json.loads(open(run.save_trace(str(tmp_path / "t.json"))).read())
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    assert names[(0, 16)] == "rank 0 recv" and names[(0, 17)] == "rank 1 recv"
    threads = {}
    for e in trace["traceEvents"]:
        if e["ph"] == "X":
            threads.setdefault((e["pid"], e["tid"]), []).append((e["ts"], e["ts"] + e["dur"]))
    for key, spans in threads.items():
        spans.sort(key=lambda s: (s[0], -s[1]))
        open_ends = []
        for start, end in spans:
            while open_ends and open_ends[-1] <= start:
                open_ends.pop()
            assert not open_ends or end <= open_ends[-1], (names[key], spans)
            open_ends.append(end)


def _early_message_matched_late(nbytes, size):
    """Rank 0 sends to rank 1 at once, computes, then sends to rank 2. Rank 2 matches its
    message first (its receive is posted); rank 1 posts its receive early in simulated
    time, but its thread gets there only after rank 2's message was matched."""
    r = dist.get_rank()
    if r == 0:
        works = [dist.isend(_meta(nbytes), 1)]
        _matmul(size)
        works.append(dist.isend(_meta(nbytes), 2))
        for work in works:
            work.wait()
    elif r == 1:
        dist.recv(_meta(1), 2)        # blocks this thread until rank 2 has run
        dist.recv(_meta(nbytes), 0)
    else:
        late = dist.irecv(_meta(nbytes), 0)   # matched now: after rank 0's matmul
        dist.send(_meta(1), 1)
        late.wait()


def test_a_message_takes_the_lane_when_it_is_free_not_after_later_ones(node):
    """When a message's transfer starts must not depend on the order in which the rank
    threads happened to match messages: rank 0's egress is free when rank 1's message is
    posted and received, so it goes at once, ahead of the later message that was matched
    first. (Before, a lane was 'free after the last transfer matched on it', and rank 1's
    message waited behind rank 0's matmul and its second send: the cause of DualPipeV's
    extra idle time in lesson 05.)"""
    n, size = 64 * MiB, 8192
    run = node.run(_early_message_matched_late, world_size=3, args=(n, size))
    one = _transfer(NVLINK, n)
    compute = 2 * size**3 / preset("dgx-a100").nodes[0].device.flops_for(torch.bfloat16)
    assert compute > 10 * one
    recv = next(e for e in run.clock(1).events if e.label == "recv 0->1")
    later = next(e for e in run.clock(2).events if e.label == "recv 0->2")
    assert recv.end < later.start                     # in the order they were posted
    assert recv.end == pytest.approx(recv.start + one, rel=REL)
    assert recv.end < 2 * one                         # not behind rank 0's matmul
    assert later.start >= compute
