"""What simcluster changes in torch, and when; its public records of a run.

* Importing simcluster changes nothing in torch and does not import ``torch._dynamo``;
  a run patches what it needs and puts everything back afterwards.
* A torch other than the tested one gets one clear warning.
* ``run.collectives`` and ``run.clock(r).events`` are named records.
* Clock and memory accounts answer through public methods (the backend uses them).
"""

import dataclasses
import json
import subprocess
import sys
import warnings

import pytest
import torch
import torch.distributed as dist

import simcluster as sc
from simcluster import _torch_internals, accounting, context
from simcluster.clock import ClockEvent, RankClock

# Runs in a fresh interpreter: what does `import simcluster` change?
_IMPORT_PROBE = """
import json, sys
import torch, torch.distributed as dist, torch.distributed.distributed_c10d as c10d
before = (dist.init_process_group, c10d.init_process_group, c10d._world,
          torch.UntypedStorage.resize_)
import simcluster
after = (dist.init_process_group, c10d.init_process_group, c10d._world,
         torch.UntypedStorage.resize_)
print(json.dumps({"changed": [a is not b for a, b in zip(before, after)],
                  "dynamo": "torch._dynamo" in sys.modules}))
"""


def test_importing_simcluster_patches_nothing_and_skips_dynamo():
    out = subprocess.run([sys.executable, "-c", _IMPORT_PROBE], check=True,
                         capture_output=True, text=True, timeout=300).stdout
    probe = json.loads(out.strip().splitlines()[-1])
    assert probe["changed"] == [False] * 4, (
        "import simcluster changed (init_process_group, c10d.init_process_group, "
        f"c10d._world, UntypedStorage.resize_): {probe['changed']}")
    assert not probe["dynamo"], "import simcluster imported torch._dynamo (1-4 s)"


# ------------------------------------------------------------------ the patch table
def _table_values():
    """The value now of every attribute in the patch table, and of every global hook dict
    of HOOKS whether it holds the run's callback."""
    from simcluster.cluster import _RUN_HOOKS

    values = [getattr(_torch_internals.resolve(p.owner), p.name)
              for p in _torch_internals.patches()]
    hooks = [getattr(_RUN_HOOKS, h.callback) in _torch_internals.resolve(h.table).values()
             for h in _torch_internals.HOOKS]
    return values, hooks


def _table_inside_a_rank():
    dist.barrier()
    return _table_values()


def _where(patch):
    owner = patch.owner if isinstance(patch.owner, str) else type(patch.owner).__name__
    return f"{owner}.{patch.name}"


def test_every_entry_of_the_patch_table_is_in_force_during_a_run_and_undone_after():
    # The entries that wait for a slow import apply at once when it is imported already.
    import torch.distributed.checkpoint  # noqa: F401
    import torch.distributed.pipelining.schedules  # noqa: F401

    table = _torch_internals.patches()
    before, hooks_before = _table_values()
    during, hooks_during = sc.Cluster.preset("dgx-a100").run(
        _table_inside_a_rank, world_size=2).results[0]
    after, hooks_after = _table_values()
    for patch, old, new, back in zip(table, before, during, after):
        assert back is old, f"{_where(patch)} is not restored after the run"
        if patch.make is not None:
            assert new is not old, f"{_where(patch)} is not patched during the run"
    assert hooks_before == hooks_after == [False] * len(_torch_internals.HOOKS)
    assert hooks_during == [True] * len(_torch_internals.HOOKS)


def test_the_patch_table_is_undone_when_the_run_fails():
    table = _torch_internals.patches()
    before, _ = _table_values()
    with pytest.raises(sc.RankError):
        sc.Cluster.preset("dgx-a100").run(_raise_on_rank_one, world_size=2)
    after, hooks = _table_values()
    for patch, old, back in zip(table, before, after):
        assert back is old, f"{_where(patch)} is not restored after a failed run"
    assert hooks == [False] * len(_torch_internals.HOOKS)


def _raise_on_rank_one():
    dist.barrier()
    if dist.get_rank() == 1:
        raise ValueError("boom")
    dist.barrier()


def test_every_rank_reads_its_own_context():
    run = sc.Cluster.preset("dgx-a100").run(_my_context, world_size=3)
    assert [r[0] for r in run.results] == [0, 1, 2]
    assert all(same_world and own_accounting for _, same_world, own_accounting, _ in run.results)
    registries = [registry for *_, registry in run.results]   # (kept alive by the results)
    assert len({id(r) for r in registries}) == 3   # one registry per rank
    assert context.current() is None   # the notebook's thread is no rank


def _my_context():
    from simcluster import backend

    me = context.current()
    return (me.rank, backend.current_world() is me.world,
            accounting.current() is me.accounting and me.accounting.rank == me.rank,
            me.registry)


def _init_again():
    # as a torchrun script would: the default group exists already, and that is fine
    dist.init_process_group("sim")
    return dist.get_world_size()


def test_a_run_patches_init_process_group_only_while_it_runs():
    original = dist.init_process_group
    run = sc.Cluster.preset("dgx-a100").run(_init_again, world_size=2)
    assert run.results == [2, 2]
    assert dist.init_process_group is original


def _accounting_mode_type():
    return type(accounting.current())


def test_accounting_mode_does_not_import_dynamo():
    """torch wraps a dispatch mode's every op in torch._dynamo.disable unless told not to."""
    mode = sc.Cluster.preset("dgx-a100").run(_accounting_mode_type, world_size=1).results[0]
    assert issubclass(mode, _torch_internals.TorchDispatchMode)
    assert mode._should_skip_dynamo() is False
    assert "__dynamo_disable" not in dir(mode.__torch_dispatch__)


@pytest.fixture
def fresh_warning(monkeypatch):
    monkeypatch.setattr(_torch_internals, "_warned_version", False)


def test_untested_torch_is_warned_about_once(fresh_warning):
    with pytest.warns(RuntimeWarning, match=r"tested with torch 2\.13, but torch 2\.12\.1"):
        assert _torch_internals.warn_if_untested("2.12.1")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _torch_internals.warn_if_untested("2.12.1")   # once is enough
        assert not _torch_internals.warn_if_untested("3.0.0")


@pytest.mark.parametrize("version", ["2.13.0", "2.13.0+cpu", "2.13.1", "2.13.0a0+git1234"])
def test_the_tested_torch_is_not_warned_about(fresh_warning, version):
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert not _torch_internals.warn_if_untested(version)


def test_the_installed_torch_is_the_tested_one():
    assert torch.__version__.split("+")[0].startswith(_torch_internals.TESTED_TORCH + ".")


# ------------------------------------------------------------------ records
def _two_collectives():
    t = torch.ones(1024)
    dist.all_reduce(t)
    dist.broadcast(t, src=1)


def test_run_collectives_are_named_records():
    run = sc.Cluster.preset("dgx-a100").run(_two_collectives, world_size=4)
    first, second = run.collectives
    assert isinstance(first, sc.CollectiveRecord)
    assert (first.op, first.ranks, first.nbytes) == ("all_reduce", (0, 1, 2, 3), 4096)
    assert (second.op, second.nbytes) == ("broadcast", 4096)
    assert first.algorithm in sc.costmodel.ALGORITHMS["all_reduce"]
    assert first.protocol in sc.costmodel.PROTOCOLS   # NCCL's algorithms carry a protocol
    assert 0 < first.start < first.end <= second.start < second.end
    assert first.duration == first.end - first.start
    with pytest.raises(dataclasses.FrozenInstanceError):
        first.op = "changed"
    # a copy: changing the list changes nothing in the run
    run.collectives.clear()
    assert len(run.collectives) == 2


def test_collective_record_fields_are_named_not_positional():
    fields = [f.name for f in dataclasses.fields(sc.CollectiveRecord)]
    assert fields == ["op", "algorithm", "protocol", "ranks", "nbytes", "start", "end"]
    with pytest.raises(TypeError):
        sc.CollectiveRecord("all_reduce", "ring", None, (0, 1), 8, 0.0, 1.0)
    record = sc.CollectiveRecord(op="all_reduce", algorithm="ring", ranks=(0, 1), nbytes=8,
                                 start=1.0, end=3.5)
    assert record.protocol is None and record.duration == 2.5


def test_clock_events_are_named_records():
    run = sc.Cluster.preset("dgx-a100").run(_two_collectives, world_size=4)
    events = run.clock(0).events
    assert all(isinstance(e, sc.ClockEvent) for e in events)
    comm = [e for e in events if e.lane == "comm"]
    assert [e.label for e in comm] == ["all_reduce #0", "broadcast #1"]
    assert [(e.start, e.end) for e in comm] == [(c.start, c.end) for c in run.collectives]
    assert comm[0].duration == run.collectives[0].duration


def test_clock_merges_compute_of_one_module_and_waits_for_pending_reads():
    clock = RankClock()
    clock.run_compute(1.0, "layer")
    clock.run_compute(2.0, "layer")       # the same module, right after: one event
    clock.run_compute(1.0, "head")
    assert clock.events == [ClockEvent("compute", 0.0, 3.0, "layer"),
                            ClockEvent("compute", 3.0, 4.0, "head")]
    clock.ready_when_read("buffer", 10.0)
    assert clock.has_pending_reads
    clock.wait_for_read("other storage")  # not written by communication: no wait
    assert clock.now == 4.0
    clock.wait_for_read("buffer")
    assert clock.now == 10.0 and not clock.has_pending_reads
    assert clock.events[-1] == ClockEvent("idle", 4.0, 10.0, "wait for communication")
    assert clock.idle == 6.0


def _buffer_categories():
    memory = accounting.current().memory
    t = torch.ones(256)
    key = _torch_internals.storage_key(t)
    before = memory.category_of(key)
    dist.all_reduce(t)                    # handed to a collective: a communication buffer
    return before, memory.category_of(key), memory.holds(key), memory.category_of(-1)


def test_memory_account_answers_what_a_storage_is_counted_as():
    (before, after, held, unknown), = sc.Cluster.preset("dgx-a100").run(
        _buffer_categories, world_size=1).results
    assert (before, after, held, unknown) == ("other", "communication buffers", True, None)


def _recv_any():
    if dist.get_rank() == 0:
        t = torch.zeros(1)
        sender = dist.recv(t)              # from any source: torch asks the Work who sent
        return sender, t.item()
    if dist.get_rank() == 2:
        dist.send(torch.tensor([2.0]), dst=0)
    return None


def test_a_receive_from_any_source_names_its_sender():
    results = sc.Cluster.preset("dgx-a100").run(_recv_any, world_size=3).results
    assert results[0] == (2, 2.0)


def _three_calls():
    dist.barrier()
    dist.all_reduce(torch.ones(1))
    dist.barrier()
    return sc.collectives_called()


def test_collectives_called_lists_every_call_by_name():
    results = sc.Cluster.preset("dgx-a100").run(_three_calls, world_size=2).results
    assert results == [["barrier", "all_reduce", "barrier"]] * 2
