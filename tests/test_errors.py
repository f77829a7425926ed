"""What a learner sees when their distributed program is wrong.

Every case checks four things: the type of the error, what its message and attributes say
(which rank, which op, which field), that it is that error and not a timeout (the
simulator knows when no rank can move; a run that hangs stops the test run with every
thread's traceback), and that the kernel is still usable: the
next ``cluster.run`` works, no rank thread is left behind and the notebook's thread has no
process group.
"""

import contextlib
import faulthandler
import re
import sys
import threading

import pytest
import torch
import torch.distributed as dist

import simcluster as sc
from simcluster import _torch_internals

# How fast a report comes is a benchmark question, not a test's: a test only stops a run
# that hangs (hang_guard), with a limit far above any machine's time for one case.
HANG_LIMIT_S = 120


@pytest.fixture(scope="module")
def cluster():
    _BASELINE.update(_process_wide_state())  # before this module's first run
    cluster = sc.Cluster.preset("dgx-a100", nodes=1)  # 8 devices
    # The first run of a process pays one-time imports (torch's dispatch-mode machinery);
    # the bounds below are about reporting errors, so pay it here.
    cluster.run(_sum_of_ranks, world_size=2)
    return cluster


# ---------------------------------------------------------------------------- helpers
def _sum_of_ranks():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()


def _process_wide_state():
    """What a run patches or installs process-wide, and must put back even when it fails."""
    from torch.distributed import distributed_c10d as c10d
    from torch.nn.modules import module as nn_module
    from torch.optim import optimizer
    return {
        "c10d world": c10d._world,
        "storage resize_": torch.UntypedStorage.resize_,
        "module hooks": (len(nn_module._global_forward_pre_hooks),
                         len(nn_module._global_forward_hooks)),
        "optimizer hooks": (len(optimizer._global_optimizer_pre_hooks),
                            len(optimizer._global_optimizer_post_hooks)),
        "dispatch modes": torch._C._len_torch_dispatch_stack(),
        "default dtype": torch.get_default_dtype(),
        "grad enabled": torch.is_grad_enabled(),
        # every attribute of the patch table (those that wait for a slow import aside)
        "patch table": [getattr(_torch_internals.resolve(p.owner), p.name)
                        for p in _torch_internals.patches() if p.imported_by is None],
    }


_BASELINE = {}


def assert_kernel_usable(cluster):
    """The run after a failure works and nothing of the failed run is left over."""
    assert _process_wide_state() == _BASELINE
    assert not dist.is_initialized(), "the notebook's thread must not see a process group"
    leftovers = [t.name for t in threading.enumerate() if t.name.startswith("sim-rank-")]
    assert leftovers == [], f"rank threads left running: {leftovers}"
    run = cluster.run(_sum_of_ranks, world_size=4)
    assert run.results == [6.0] * 4
    assert _process_wide_state() == _BASELINE


@contextlib.contextmanager
def hang_guard(seconds=HANG_LIMIT_S):
    """Turn a hung kernel into a crash with every thread's traceback, not a stuck test run."""
    faulthandler.dump_traceback_later(seconds, exit=True)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def expect_error(cluster, error_type, fn, world_size, **kwargs):
    """Run ``fn``, expect ``error_type`` (a hang stops the test run, see hang_guard),
    check the kernel after."""
    with hang_guard(), pytest.raises(error_type) as info:
        cluster.run(fn, world_size=world_size, **kwargs)
    assert isinstance(info.value, sc.SimulationError)
    assert_kernel_usable(cluster)
    return info.value


def not_called(ranks):
    """The phrase for ranks that have not joined a collective: "rank 1 has" / "ranks 1,3 have"."""
    return rf"ranks? {ranks} ha(s|ve) not called it"


def p2p(kind, peer, shape):
    """``waiting in recv from rank 1 (tag 0, shape (3,))``, with or without ``shape``."""
    where = "from" if kind == "recv" else "to"
    return rf"waiting in {kind} {where} rank {peer} \(tag 0, (shape )?{re.escape(str(shape))}\)"


def unwrap(value):
    """A single tensor's field may be reported as ``(2,)`` or as ``[(2,)]``."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def hint_of(error):
    lines = [line for line in str(error).splitlines() if line.startswith("Hint:")]
    assert len(lines) == 1, str(error)
    return lines[0]


# ======================================================= an exception on one rank
def _raise_on_rank_2():
    t = torch.ones(1)
    if dist.get_rank() == 2:
        raise ZeroDivisionError("learner bug on purpose")
    dist.all_reduce(t)  # the other ranks wait here for rank 2


def test_exception_on_one_rank_while_others_wait_in_a_collective(cluster):
    err = expect_error(cluster, sc.RankError, _raise_on_rank_2, 4)
    assert err.rank == 2
    assert type(err.original) is ZeroDivisionError
    assert str(err.original) == "learner bug on purpose"
    assert "_raise_on_rank_2" in err.traceback_text
    assert "ZeroDivisionError: learner bug on purpose" in err.traceback_text
    message = str(err)
    assert message.startswith("rank 2 raised ZeroDivisionError: learner bug on purpose")
    assert "_raise_on_rank_2" in message  # the traceback is part of the message


def _helper_that_fails(step):
    return {"step": step}["missing key"]


def _raise_deep_after_some_collectives():
    t = torch.ones(1)
    for step in range(3):
        dist.all_reduce(t)
    if dist.get_rank() == 3:
        _helper_that_fails(step)
    dist.all_reduce(t)
    return t.item()


def test_exception_traceback_names_the_learner_functions(cluster):
    err = expect_error(cluster, sc.RankError, _raise_deep_after_some_collectives, 4)
    assert err.rank == 3
    assert isinstance(err.original, KeyError)
    assert "_raise_deep_after_some_collectives" in err.traceback_text
    assert "_helper_that_fails" in err.traceback_text
    # the learner's frames come in calling order, innermost last
    assert (err.traceback_text.index("_raise_deep_after_some_collectives")
            < err.traceback_text.index("_helper_that_fails"))


def _every_rank_raises():
    raise ValueError(f"failure on rank {dist.get_rank()}")


def test_when_every_rank_raises_the_report_is_deterministic(cluster):
    ranks = {expect_error(cluster, sc.RankError, _every_rank_raises, 4).rank for _ in range(3)}
    assert ranks == {0}


def _exit_on_rank_1():
    if dist.get_rank() == 1:
        sys.exit(3)
    dist.barrier()


def test_sys_exit_on_a_rank_is_reported_not_raised_in_the_kernel(cluster):
    err = expect_error(cluster, sc.RankError, _exit_on_rank_1, 2)
    assert err.rank == 1
    assert isinstance(err.original, SystemExit)


# ================================================================== deadlocks
def _recv_without_send():
    t = torch.zeros(2)
    dist.barrier()
    dist.all_reduce(t)
    if dist.get_rank() == 0:
        dist.recv(t, src=1)  # rank 1 never sends; it returns


def test_recv_with_no_matching_send(cluster):
    err = expect_error(cluster, sc.DeadlockError, _recv_without_send, 2)
    assert set(err.pending) == {0, 1}
    assert "recv from rank 1" in err.pending[0]
    assert err.pending[1] == "returned from its function"
    assert err.recent[0] == ["barrier #0 (WORLD)", "all_reduce #1 (WORLD)"]
    assert err.recent[1] == ["barrier #0 (WORLD)", "all_reduce #1 (WORLD)"]
    message = str(err)
    assert "rank 0: waiting in recv from rank 1" in message
    assert "rank 1: returned from its function" in message
    assert "last collectives: barrier #0 (WORLD); all_reduce #1 (WORLD)" in message


def test_recv_with_no_matching_send_hint_names_the_returned_partner(cluster):
    err = expect_error(cluster, sc.DeadlockError, _recv_without_send, 2)
    hint = hint_of(err)
    assert "returned" in hint and "1" in hint, hint
    assert "sends first" not in hint, hint


def _both_recv_first():
    peer = 1 - dist.get_rank()
    t = torch.zeros(3)
    dist.all_reduce(t)
    dist.recv(t, src=peer)
    dist.send(t, dst=peer)


def test_two_ranks_both_recv_first(cluster):
    err = expect_error(cluster, sc.DeadlockError, _both_recv_first, 2)
    assert "recv from rank 1" in err.pending[0]
    assert "recv from rank 0" in err.pending[1]
    assert err.recent == {0: ["all_reduce #0 (WORLD)"], 1: ["all_reduce #0 (WORLD)"]}
    message = str(err)
    assert re.search("rank 0: " + p2p("recv", 1, (3,)), message)
    assert re.search("rank 1: " + p2p("recv", 0, (3,)), message)
    assert message.count("last collectives: all_reduce #0 (WORLD)") == 2


def _waiting_in_different_places():
    t = torch.zeros(2)
    dist.barrier()
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.recv(t, src=0)


def test_ranks_waiting_in_different_places(cluster):
    err = expect_error(cluster, sc.DeadlockError, _waiting_in_different_places, 2)
    assert "all_reduce #1 on group WORLD" in err.pending[0]
    assert re.search(not_called(1), err.pending[0])
    assert "recv from rank 0" in err.pending[1]
    assert err.recent[0] == ["barrier #0 (WORLD)", "all_reduce #1 (WORLD)"]
    assert err.recent[1] == ["barrier #0 (WORLD)"]
    message = str(err)
    assert "rank 0: waiting in all_reduce #1 on group WORLD" in message
    assert "rank 1: waiting in recv from rank 0" in message
    assert "different places" in hint_of(err)


def _rank_1_skips_the_all_reduce():
    t = torch.ones(1)
    dist.barrier()
    if dist.get_rank() != 1:
        dist.all_reduce(t)
    return t.item()


def test_rank_skipping_a_collective_and_returning(cluster):
    err = expect_error(cluster, sc.DeadlockError, _rank_1_skips_the_all_reduce, 3)
    assert err.pending[1] == "returned from its function"
    for rank in (0, 2):
        assert "all_reduce #1 on group WORLD" in err.pending[rank]
        assert re.search(not_called(1), err.pending[rank])
        assert err.recent[rank] == ["barrier #0 (WORLD)", "all_reduce #1 (WORLD)"]
    assert err.recent[1] == ["barrier #0 (WORLD)"]
    assert re.search(r"rank(\(s\))? 1 returned while others wait in a collective",
                     hint_of(err))


def _both_send_first():
    me, peer = dist.get_rank(), 1 - dist.get_rank()
    t = torch.full((4,), float(me))
    dist.barrier()
    dist.send(t, dst=peer)
    dist.recv(t, src=peer)


def test_blocking_send_to_each_other(cluster):
    err = expect_error(cluster, sc.DeadlockError, _both_send_first, 2)
    assert "send to rank 1" in err.pending[0]
    assert "send to rank 0" in err.pending[1]
    assert err.recent == {0: ["barrier #0 (WORLD)"], 1: ["barrier #0 (WORLD)"]}
    message = str(err)
    assert re.search("rank 0: " + p2p("send", 1, (4,)), message)
    assert re.search("rank 1: " + p2p("send", 0, (4,)), message)
    hint = hint_of(err)
    assert "isend" in hint and "batch_isend_irecv" in hint


def _ring_of_recvs():
    r, n = dist.get_rank(), dist.get_world_size()
    t = torch.zeros(1)
    dist.recv(t, src=(r - 1) % n)
    dist.send(t, dst=(r + 1) % n)


def test_deadlock_lists_every_rank(cluster):
    err = expect_error(cluster, sc.DeadlockError, _ring_of_recvs, 8)
    assert set(err.pending) == set(range(8))
    message = str(err)
    for r in range(8):
        assert f"recv from rank {(r - 1) % 8}" in err.pending[r]
        assert f"  rank {r}: waiting in recv from rank {(r - 1) % 8}" in message


def _many_collectives_then_deadlock():
    t = torch.ones(1)
    for _ in range(4):
        dist.all_reduce(t)
    dist.broadcast(t, src=0)
    dist.barrier()
    dist.all_reduce(t)  # #6
    if dist.get_rank() == 0:
        dist.recv(t, src=1)


def test_flight_recorder_keeps_the_last_collectives_with_sequence_numbers(cluster):
    err = expect_error(cluster, sc.DeadlockError, _many_collectives_then_deadlock, 2)
    expected = ["all_reduce #2 (WORLD)", "all_reduce #3 (WORLD)", "broadcast #4 (WORLD)",
                "barrier #5 (WORLD)", "all_reduce #6 (WORLD)"]
    assert err.recent == {0: expected, 1: expected}
    assert "last collectives: " + "; ".join(expected) in str(err)


def _disjoint_groups_a_rank_skips():
    a, b = dist.new_group([0, 1]), dist.new_group([2, 3])
    t = torch.ones(1)
    r = dist.get_rank()
    # ranks 1 and 3 "forget" their group's all_reduce; 0 and 2 legitimately use different
    # groups (as two tensor-parallel groups of a 2-D mesh do).
    if r == 0:
        dist.all_reduce(t, group=a)
    if r == 2:
        dist.all_reduce(t, group=b)


def test_disjoint_groups_are_not_a_group_mismatch(cluster):
    err = expect_error(cluster, sc.DeadlockError, _disjoint_groups_a_rank_skips, 4)
    assert err.pending[1] == err.pending[3] == "returned from its function"
    assert "returned" in hint_of(err)


# ===================================================== mismatched collectives
def _op_mismatch():
    t = torch.ones(2)
    dist.barrier()
    if dist.get_rank() == 0:
        dist.all_reduce(t)
    else:
        dist.broadcast(t, src=0)


def _shape_mismatch():
    dist.barrier()
    dist.all_reduce(torch.ones(2 + dist.get_rank()))


def _dtype_mismatch():
    dist.barrier()
    dist.all_reduce(torch.ones(2, dtype=torch.float32 if dist.get_rank() == 0 else torch.float64))


def _root_mismatch():
    dist.barrier()
    dist.broadcast(torch.ones(2), src=dist.get_rank())


def _reduce_op_mismatch():
    dist.barrier()
    op = dist.ReduceOp.SUM if dist.get_rank() == 0 else dist.ReduceOp.MAX
    dist.all_reduce(torch.ones(2), op=op)


def _group_mismatch():
    a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
    dist.barrier()
    dist.all_reduce(torch.ones(2), group=a if dist.get_rank() == 0 else b)


MISMATCHES = {
    # name: (fn, field, value on rank 0, value on rank 1, op, seq, group label)
    "op": (_op_mismatch, "op", "all_reduce", "broadcast", "all_reduce", 1, "WORLD"),
    "shape": (_shape_mismatch, "shape", [(2,)], [(3,)], "all_reduce", 1, "WORLD"),
    "dtype": (_dtype_mismatch, "dtype", [torch.float32], [torch.float64], "all_reduce", 1,
              "WORLD"),
    "root": (_root_mismatch, "root", 0, 1, "broadcast", 1, "WORLD"),
    "reduce_op": (_reduce_op_mismatch, "reduce_op", "SUM", "MAX", "all_reduce", 1, "WORLD"),
    "group": (_group_mismatch, "group", "1 (ranks 0,1)", "2 (ranks 0,1)", "all_reduce", 0,
              "1 (ranks 0,1)"),
}


@pytest.mark.parametrize("case", list(MISMATCHES))
def test_mismatched_collectives(cluster, case):
    fn, field, value0, value1, op, seq, group = MISMATCHES[case]
    err = expect_error(cluster, sc.CollectiveMismatchError, fn, 2)
    assert err.field == field
    assert set(err.values) == {0, 1}
    assert unwrap(err.values[0]) == unwrap(value0)
    assert unwrap(err.values[1]) == unwrap(value1)
    assert err.seq == seq
    message = str(err)
    # the op named first is the one the first-arriving rank called
    assert any(message.startswith(f"collective mismatch in {name} #{seq} on group {group}: ")
               for name in (op, value0, value1)), message
    assert (f"the {field} differs (rank 0: {err.values[0]}, rank 1: {err.values[1]})"
            in message)
    assert "Hint:" in message


def _rank_3_of_4_has_another_shape():
    n = 5 if dist.get_rank() == 3 else 4
    dist.all_reduce(torch.ones(n))


def test_mismatch_names_the_odd_rank_out(cluster):
    err = expect_error(cluster, sc.CollectiveMismatchError, _rank_3_of_4_has_another_shape, 4)
    assert err.field == "shape"
    assert 3 in err.values and unwrap(err.values[3]) == (5,)
    assert (4,) in [unwrap(v) for r, v in err.values.items() if r != 3]
    assert f"rank 3: {err.values[3]}" in str(err)


def _send_recv_into(received):
    """Rank 0 sends four float32s (16 bytes); rank 1 receives them into ``received``."""
    if dist.get_rank() == 0:
        dist.send(torch.arange(4.0), dst=1)
    else:
        dist.recv(received, src=0)
        return received


def test_a_receive_buffer_too_small_for_the_message_stops_the_run(cluster):
    # gloo aborts the receiving process ("Received data size doesn't match expected size")
    err = expect_error(cluster, sc.CollectiveMismatchError,
                       lambda: _send_recv_into(torch.zeros(3)), 2)
    assert err.field == "shape/dtype"
    assert err.values == {0: "sends (4,) torch.float32", 1: "receives (3,) torch.float32"}
    assert "send/recv" in str(err)


def test_a_receive_buffer_with_room_gets_the_bytes_as_gloo_gives_them(cluster):
    # checked against gloo in tests/test_differential_gloo.py (send_recv-other-buffer-*)
    got = cluster.run(lambda: _send_recv_into(torch.full((5,), 7.0)), world_size=2).results[1]
    assert got.tolist() == [0.0, 1.0, 2.0, 3.0, 7.0]
    got = cluster.run(lambda: _send_recv_into(torch.zeros(2, 2)), world_size=2).results[1]
    assert got.tolist() == [[0.0, 1.0], [2.0, 3.0]]
    got = cluster.run(lambda: _send_recv_into(torch.zeros(2, dtype=torch.float64)),
                      world_size=2).results[1]
    assert got.view(torch.float32).tolist() == [0.0, 1.0, 2.0, 3.0]


# =============================================================== bad arguments
def _noop(*args, **kwargs):
    return None


@pytest.mark.parametrize("world_size", [0, -1, 9, 1000])
def test_world_size_out_of_range(cluster, world_size):
    with pytest.raises(ValueError, match=rf"world_size must be between 1 and 8 .*got {world_size}"):
        cluster.run(_noop, world_size=world_size)
    assert_kernel_usable(cluster)


@pytest.mark.parametrize("world_size", [True, 2.0, "2"])
def test_world_size_of_the_wrong_type(cluster, world_size):
    with pytest.raises(TypeError, match=rf"world_size must be an int, got {type(world_size).__name__}"):
        cluster.run(_noop, world_size=world_size)
    assert_kernel_usable(cluster)


def test_unknown_preset():
    with pytest.raises(ValueError, match=r"unknown cluster preset 'dgx-a1000'; choose one of "
                                         r"dgx-a100, dgx-h100, hetero-11"):
        sc.Cluster.preset("dgx-a1000")


@pytest.mark.parametrize("nodes", [0, -1, 1.5, True])
def test_bad_node_count(nodes):
    with pytest.raises(ValueError, match=r"nodes must be a positive integer"):
        sc.Cluster.preset("dgx-a100", nodes=nodes)


def test_non_callable_fn(cluster):
    with pytest.raises(TypeError, match=r"cluster.run needs a function .* got int 42"):
        cluster.run(42, world_size=2)
    assert_kernel_usable(cluster)


@pytest.mark.parametrize("args", [5, "ab", {"x": 1}])
def test_args_not_a_tuple(cluster, args):
    with pytest.raises(TypeError, match=r"args must be a tuple.*args=\(x,\)"):
        cluster.run(_noop, world_size=2, args=args)
    assert_kernel_usable(cluster)


def test_kwargs_not_a_dict(cluster):
    with pytest.raises(TypeError, match=r"kwargs must be a dict, got list"):
        cluster.run(_noop, world_size=2, kwargs=[1])


@pytest.mark.parametrize("timeout", [0, -1])
def test_non_positive_timeout(cluster, timeout):
    with pytest.raises(ValueError, match=r"timeout must be a positive number of seconds"):
        cluster.run(_noop, world_size=2, timeout=timeout)


@pytest.mark.parametrize("timeout", ["1", True])
def test_timeout_of_the_wrong_type(cluster, timeout):
    with pytest.raises(TypeError, match=r"timeout must be a (positive )?number"):
        cluster.run(_noop, world_size=2, timeout=timeout)


def _broadcast_from(src):
    dist.broadcast(torch.ones(2), src=src)


def _send_to(dst):
    dist.send(torch.ones(2), dst=dst)


def _recv_from(src):
    dist.recv(torch.ones(2), src=src)


def _send_to_self():
    dist.send(torch.ones(2), dst=dist.get_rank())


@pytest.mark.parametrize("fn, args, message", [
    (_broadcast_from, (5,), "rank 0: source rank 5 is out of range for a group of size 2"),
    (_broadcast_from, (-1,), "rank 0: source rank -1 is out of range for a group of size 2"),
    (_send_to, (7,), "rank 0: send rank 7 is out of range for a group of size 2"),
    (_recv_from, (7,), "rank 0: receive rank 7 is out of range for a group of size 2"),
    (_send_to_self, (), "destination rank should not be the same"),
], ids=["broadcast-src-5", "broadcast-src-neg", "send-dst-7", "recv-src-7", "send-to-self"])
def test_bad_ranks_in_calls(cluster, fn, args, message):
    err = expect_error(cluster, sc.RankError, fn, 2, args=args)
    assert err.rank == 0
    assert isinstance(err.original, ValueError)
    assert message in str(err.original)
    assert fn.__name__ in err.traceback_text


def _reduce_with(op_name, dtype):
    dist.all_reduce(torch.ones(2, dtype=dtype), op=getattr(dist.ReduceOp, op_name))


@pytest.mark.parametrize("op_name, dtype, message", [
    ("AVG", torch.int64, "ReduceOp.AVG needs a floating-point tensor, got torch.int64"),
    ("BAND", torch.float32, "ReduceOp.BAND is a bitwise op and needs an integer or bool"),
])
def test_reduce_op_that_does_not_fit_the_dtype(cluster, op_name, dtype, message):
    err = expect_error(cluster, sc.RankError, _reduce_with, 2, args=(op_name, dtype))
    assert err.rank == 0
    assert isinstance(err.original, ValueError)
    assert message in str(err.original)


def _train_directly():
    # Outside a run dist.init_process_group is torch's own (simcluster patches nothing
    # until a run starts), so give it what torchrun would, to reach the backend.
    dist.init_process_group("sim", rank=0, world_size=1, store=dist.HashStore())


def test_init_process_group_sim_outside_a_run_says_use_cluster_run(cluster):
    with pytest.raises(Exception, match=r"cluster\.run"):
        _train_directly()  # the learner forgot cluster.run
    assert not dist.is_initialized()
    assert_kernel_usable(cluster)


# ================================================================== timeouts
def _infinite_loop_on_rank_1():
    if dist.get_rank() == 1:
        x = 0
        while True:
            x += 1
    dist.barrier()


def test_infinite_loop_times_out(cluster):
    err = expect_error(cluster, sc.SimulationTimeout, _infinite_loop_on_rank_1, 4, timeout=1)
    message = str(err)
    assert message.startswith("rank 1 was still running after 1 s of wall-clock time")
    assert "infinite loop" in message


def _infinite_loop_that_catches_exceptions():
    if dist.get_rank() == 0:
        while True:
            try:
                sum(range(100))
            except Exception:  # noqa: BLE001 — the learner's code
                pass
    dist.barrier()


def test_infinite_loop_with_except_exception_still_times_out(cluster):
    err = expect_error(cluster, sc.SimulationTimeout, _infinite_loop_that_catches_exceptions,
                       2, timeout=1)
    assert str(err).startswith("rank 0 was still running")


def _torch_ops_forever():
    x = torch.ones(16, 16)
    if dist.get_rank() == 2:
        while True:
            x = (x @ x).clamp(-1, 1) + 1
    dist.barrier()


# a stop that lands in accounting's weakref callback is dropped there ("Exception ignored")
# and delivered again: expected, so not worth a warning
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
@pytest.mark.parametrize("accounting", [True, False])
def test_infinite_loop_of_torch_ops_times_out(cluster, accounting):
    # with accounting on, every op runs through the simulator's dispatch mode and every
    # freed storage through a weakref finalizer, where a single stop can get lost
    err = expect_error(cluster, sc.SimulationTimeout, _torch_ops_forever, 4,
                       timeout=1, accounting=accounting)
    assert str(err).startswith("rank 2 was still running")


_LOST_TIMEOUT_SCRIPT = """
import torch.distributed as dist, simcluster as sc

class Noisy:
    def __del__(self):  # a finalizer that takes a while, as torch's own ones can
        sum(range(20000))

def loop():
    if dist.get_rank() == 1:
        while True:
            Noisy()
    dist.barrier()

cluster = sc.Cluster.preset("dgx-a100", nodes=1)
print("STARTED", flush=True)
try:
    cluster.run(loop, world_size=2, timeout=0.5, accounting=False)
except sc.SimulationTimeout:
    print("TIMED OUT", flush=True)
"""


@pytest.mark.slow
def test_timeout_is_not_lost_in_a_finalizer():
    # Python drops an asynchronous exception that lands inside __del__, and this rank
    # spends nearly all its time there: the scheduler re-delivers the stop every 10 ms,
    # and if every delivery is dropped it abandons the thread after 5 s of patience.
    # Either way the run must come back (timeout 0.5 s + patience 5 s, with room to spare
    # for a loaded machine).
    assert "TIMED OUT" in _run_script_expecting_timeout(_LOST_TIMEOUT_SCRIPT, 60.0), (
        "the run did not come back in time")


_SLOW_WAKE_UP_SCRIPT = """
import time
import torch.distributed as dist, simcluster as sc
from simcluster import scheduler

_take_over = scheduler.RankScheduler._take_over

def slow_take_over(self, rank):  # a rank that wakes up slowly, as on a loaded machine
    _take_over(self, rank)
    if self.aborting:
        time.sleep(0.05)

scheduler.RankScheduler._take_over = slow_take_over

def loop():
    if dist.get_rank() == 0:  # rank 1 has not started when rank 0 is stopped
        while True:
            pass
    dist.barrier()

cluster = sc.Cluster.preset("dgx-a100", nodes=1)
print("STARTED", flush=True)
try:
    cluster.run(loop, world_size=2, timeout=0.2)
except sc.SimulationTimeout as error:
    print("TIMED OUT:", str(error).splitlines()[0], flush=True)
"""


def _run_script_expecting_timeout(script, budget_s):
    """Run ``script`` in a fresh interpreter; what it printed after STARTED within budget."""
    import os
    import subprocess
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(
        __file__))))
    proc = subprocess.Popen([sys.executable, "-c", script], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        first = proc.stdout.readline().strip()  # after the imports
        if first != "STARTED":  # a broken script is an error, not an expected failure
            raise RuntimeError(f"the script did not start: {first!r}")
        timer = threading.Timer(budget_s, proc.kill)
        timer.start()
        rest = proc.stdout.read()
        timer.cancel()
    finally:
        proc.kill()
        proc.wait()
    return rest


@pytest.mark.slow
def test_timeout_while_a_rank_wakes_up_slowly():
    # the diagnosis tells a timely stop ("still running") from a stop that ran out of
    # patience, so the bound only needs to catch a hang
    out = _run_script_expecting_timeout(_SLOW_WAKE_UP_SCRIPT, 60.0)
    assert "TIMED OUT: rank 0 was still running" in out, (
        f"the run did not come back in time with the right diagnosis: {out!r}")


def _collectives_forever():
    t = torch.zeros(1)
    while True:
        dist.all_reduce(t)


def test_ranks_that_never_stop_communicating_time_out(cluster):
    # not a deadlock (every collective completes), so only the timeout can stop it
    expect_error(cluster, sc.SimulationTimeout, _collectives_forever, 4,
                 timeout=1)


# ====================================== `except Exception` does not stop the stop
def _swallow_after_rank_3_fails(log):
    t = torch.ones(1)
    if dist.get_rank() == 3:  # ranks 0-2 are already waiting in the all_reduce
        raise RuntimeError("rank 3 fails")
    for _ in range(3):
        try:
            dist.all_reduce(t)
        except Exception as exc:  # noqa: BLE001 — the learner's code
            log.append(("swallowed", dist.get_rank(), repr(exc)))
    log.append(("finished", dist.get_rank()))


def test_except_exception_does_not_swallow_a_rank_failure(cluster):
    log = []
    err = expect_error(cluster, sc.RankError, _swallow_after_rank_3_fails, 4, args=(log,))
    assert err.rank == 3 and str(err.original) == "rank 3 fails"
    assert log == []


def _swallow_a_deadlock(log):
    t = torch.zeros(1)
    try:
        dist.recv(t, src=1 - dist.get_rank())
    except Exception as exc:  # noqa: BLE001
        log.append(("swallowed", dist.get_rank(), repr(exc)))
    log.append(("after", dist.get_rank()))


def test_except_exception_does_not_swallow_a_deadlock(cluster):
    log = []
    expect_error(cluster, sc.DeadlockError, _swallow_a_deadlock, 2, args=(log,))
    assert log == []


def _swallow_a_mismatch(log):
    try:
        dist.all_reduce(torch.ones(1 + dist.get_rank()))
    except Exception as exc:  # noqa: BLE001
        log.append(("swallowed", dist.get_rank(), repr(exc)))
    log.append(("after", dist.get_rank()))


def test_except_exception_does_not_swallow_a_mismatch(cluster):
    log = []
    expect_error(cluster, sc.CollectiveMismatchError, _swallow_a_mismatch, 2, args=(log,))
    assert log == []


def _loop_swallowing_everything_but_abort(log):
    t = torch.ones(1)
    if dist.get_rank() == 1:
        raise RuntimeError("rank 1 fails")
    for _ in range(5):
        try:
            dist.all_reduce(t)
        except Exception:  # noqa: BLE001
            log.append("swallowed")
        finally:
            log.append("finally")


def test_finally_blocks_run_but_the_rank_stops(cluster):
    log = []
    expect_error(cluster, sc.RankError, _loop_swallowing_everything_but_abort, 2, args=(log,))
    # rank 0 was unwound out of its first all_reduce: its finally ran once, nothing else
    assert log == ["finally"]


def _raise_a_huge_message():
    raise RuntimeError("the start " + "x" * 100_000)


def test_a_huge_message_is_shortened_and_kept_whole_in_original(cluster):
    with pytest.raises(sc.RankError) as info:
        cluster.run(_raise_a_huge_message, world_size=2)
    err = info.value
    assert len(str(err)) < 10_000
    assert "RuntimeError: the start xxx" in str(err)
    assert "100,010 characters in all" in str(err)
    assert "_raise_a_huge_message" in str(err)          # the frames are still shown
    assert len(str(err.original)) == 100_010


def _oom_wrapped_by_a_library():
    try:
        torch.empty(2**40, dtype=torch.uint8, device="meta")   # 1 TiB: more than the GPU
    except sc.OutOfMemoryError as oom:
        raise RuntimeError(f"{oom}\n\nsome library's context") from oom


def test_an_out_of_memory_error_rewrapped_by_a_library_is_reported_as_itself(cluster):
    with pytest.raises(sc.OutOfMemoryError, match="Tried to allocate 1024.00 GiB"):
        cluster.run(_oom_wrapped_by_a_library, world_size=2)
