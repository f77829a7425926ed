"""Boundaries of the simulator core that an outside mutation run changed with no unit test
noticing (issue 43): the packet-loss retransmission factor, the out-of-memory check at
exactly full capacity, and the receiver's ingress-lane contention. Each test fails when
the factor, the boundary or the contention is changed.

Expected times are alpha + n·beta with the preset's link numbers, as in
``test_p2p_duplex.py``, never the cost model's own formulas.
"""

import pytest
import torch
import torch.distributed as dist

import simcluster as sc
from simcluster import faults
from simcluster.accounting import HostShare
from simcluster.clock import RankClock
from simcluster.memory import MemoryAccount
from simcluster.spec import ClusterSpec, NodeSpec, preset

MiB = 2**20
REL = 1e-9
NVLINK = preset("dgx-a100").nodes[0].fabric


def _transfer(link, nbytes):
    """alpha + n·beta for one message on ``link``."""
    return link.latency + nbytes / (link.bandwidth * link.efficiency)


def _meta(nbytes):
    return torch.empty(nbytes, dtype=torch.uint8, device="meta")


# ------------------------------------------------------------ retransmission factor
@pytest.mark.parametrize("rate, factor", [(0.0, 1.0), (0.2, 1.25), (0.5, 2.0), (0.75, 4.0)])
def test_each_byte_crosses_a_lossy_link_one_over_one_minus_rate_times(rate, factor):
    # a packet is sent until it arrives: a geometric number of tries, mean 1/(1 - rate)
    assert faults.retransmission_factor(rate) == pytest.approx(factor, rel=1e-12)


def _send_across(nbytes):
    if dist.get_rank() == 0:
        dist.send(_meta(nbytes), dst=2)       # node 0 -> node 1
    elif dist.get_rank() == 2:
        dist.recv(_meta(nbytes), src=0)


def test_packet_loss_sends_the_bytes_of_a_message_again():
    """With no retransmission timeout (rto=0), only the factor is left: half the packets
    lost, every byte crosses twice, so the bandwidth term of the message doubles."""
    spec = ClusterSpec("two-by-two", nodes=(NodeSpec("a", 2), NodeSpec("b", 2)))
    link = spec.inter_node_link
    n = 64 * MiB
    run = sc.Cluster(spec).run(_send_across, world_size=4, args=(n,),
                               faults=[faults.PacketLoss(node=1, rate=0.5, rto=0.0)])
    (send,) = [e for e in run.clock(0).events if e.label == "send 0->2"]
    assert send.duration == pytest.approx(
        link.latency + 2 * n / (link.bandwidth * link.efficiency), rel=REL)


# ---------------------------------------------------- out of memory at full capacity
def _account(capacity):
    return MemoryAccount(0, HostShare("a test device", capacity, "a test device"), RankClock())


def test_filling_memory_to_exactly_its_capacity_is_not_out_of_memory():
    account = _account(1000)
    first, second = torch.UntypedStorage(600), torch.UntypedStorage(400)
    account.allocate(1, 600, "parameters", first)
    account.allocate(2, 400, "activations", second)      # 1000 of 1000: fits
    assert account.total == 1000
    byte = torch.UntypedStorage(1)
    with pytest.raises(sc.OutOfMemoryError) as error:
        account.allocate(3, 1, "other", byte)            # one byte more
    assert error.value.requested == 1


def test_refilling_a_storage_to_exactly_full_capacity_is_not_out_of_memory():
    account = _account(1000)
    parameter = torch.UntypedStorage(1000)
    account.allocate(1, 1000, "parameters", parameter)
    account.resize(1, 0, parameter)
    account.resize(1, 1000, parameter)                   # back to 1000 of 1000
    assert account.total == 1000
    account.resize(1, 0, parameter)
    byte = torch.UntypedStorage(1)                       # held: freed storages are forgotten
    account.allocate(2, 1, "other", byte)
    with pytest.raises(sc.OutOfMemoryError):
        account.resize(1, 1000, parameter)               # 1001 of 1000


def _fill(nbytes):
    keep = torch.empty(nbytes, dtype=torch.uint8, device="meta")  # noqa: F841
    dist.barrier()


def test_a_run_may_use_every_byte_of_the_device():
    node = sc.Cluster.preset("dgx-a100")
    capacity = node.spec.nodes[0].device.memory
    node.run(_fill, world_size=1, args=(capacity,))
    with pytest.raises(sc.OutOfMemoryError):
        node.run(_fill, world_size=1, args=(capacity + 1,))


# ------------------------------------------------------ the receiver's ingress lane
def _two_into_one(nbytes):
    """Ranks 0 and 1 each send ``nbytes`` to rank 2 at the same time."""
    rank = dist.get_rank()
    if rank in (0, 1):
        dist.send(_meta(nbytes), dst=2)
    elif rank == 2:
        works = [dist.irecv(_meta(nbytes), src=src) for src in (0, 1)]
        for work in works:
            work.wait()


def test_two_messages_into_one_rank_queue_on_its_receive_lane():
    """The senders' egress lanes are free, but rank 2 has one ingress: the second message
    waits for the first, and the run takes two transfers, not one."""
    n = 64 * MiB
    run = sc.Cluster.preset("dgx-a100").run(_two_into_one, world_size=3, args=(n,))
    one = _transfer(NVLINK, n)
    assert run.elapsed == pytest.approx(2 * one, rel=REL)
    ends = sorted(e.end for e in run.clock(2).events if e.label.startswith("recv"))
    assert ends == pytest.approx([one, 2 * one], rel=REL)
    assert run.clock(2).comm == pytest.approx(2 * one, rel=REL)
