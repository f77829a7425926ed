"""A run as a Chrome trace (the ``traceEvents`` JSON that Perfetto and chrome://tracing open).

Layout of the trace:

* one process per node: ``pid`` = node index, named ``"node1 (A100-80GB)"``;
* two threads per rank on its node: ``tid = 2 * local_rank`` is the compute stream
  (``"rank 3 compute"``: compute, idle waits with category ``"idle"``, and reading and
  writing storage with category ``"io"``) and
  ``tid = 2 * local_rank + 1`` the communication stream (``"rank 3 comm"``: collectives
  and point-to-point sends);
* for a rank that received point-to-point messages, a third thread, ``"rank 3 recv"``
  (``tid = 2 * ranks on the node + local_rank``): its receive lane, which runs at the same
  time as its sends (links are full duplex) and so cannot share their thread, as events
  of one thread must nest;
* ``"X"`` (complete) events with ``ts`` and ``dur`` in microseconds of simulated time;
* a ``"C"`` (counter) track per rank, ``"rank 3 memory"``, with the bytes in use;
* an ``"i"`` (instant) event, category ``"fault"``, on the compute thread of each rank
  that died: ``"crash"`` (a fault) or ``"watchdog stop"``.

The output is deterministic — keys sorted, events in a fixed order, one event per line —
so two traces can be compared with ``diff``.
"""

import json

from .memory import CATEGORIES

US = 1e6   # microseconds per second


def _us(seconds):
    """Seconds -> microseconds, rounded to the nanosecond (stable, short numbers)."""
    return round(seconds * US, 3)


def _is_receive(event):
    """Whether ``event`` is on a receive lane: a point-to-point message arriving."""
    return event.lane == "comm" and event.label.startswith("recv ")


def _recv_tid(spec, rank):
    """The trace thread of ``rank``'s receive lane: after every rank's two threads."""
    node, local = spec.placement(rank)
    return 2 * spec.nodes[node].devices + local


def trace_events(recorder, spec):
    """The list of trace events (dicts) for a run recorded by ``recorder`` on ``spec``."""
    meta, work, counters = [], [], []
    ranks_by_node = {}
    for rank in range(recorder.world_size):
        node, local = spec.placement(rank)
        ranks_by_node.setdefault(node, []).append((rank, local))

    for node, ranks in sorted(ranks_by_node.items()):
        node_spec = spec.nodes[node]
        meta.append({"ph": "M", "name": "process_name", "pid": node, "tid": 0,
                     "args": {"name": f"{node_spec.name} ({node_spec.device.name})"}})
        meta.append({"ph": "M", "name": "process_sort_index", "pid": node, "tid": 0,
                     "args": {"sort_index": node}})
        for rank, local in ranks:
            threads = [(2 * local, "compute"), (2 * local + 1, "comm")]
            if any(_is_receive(e) for e in recorder.clocks[rank].events):
                threads.append((_recv_tid(spec, rank), "recv"))
            for i, (tid, lane) in enumerate(threads):
                meta.append({"ph": "M", "name": "thread_name", "pid": node, "tid": tid,
                             "args": {"name": f"rank {rank} {lane}"}})
                meta.append({"ph": "M", "name": "thread_sort_index", "pid": node, "tid": tid,
                             "args": {"sort_index": 3 * local + i}})

    details = {}      # (op, start, end) -> [CollectiveRecord]
    for record in recorder.collectives:
        details.setdefault((record.op, record.start, record.end), []).append(record)

    for rank in range(recorder.world_size):
        node, local = spec.placement(rank)
        events = sorted(recorder.clocks[rank].events,
                        key=lambda e: (e.lane == "comm", e.start, e.end, e.lane, e.label))
        for e in events:
            ts = _us(e.start)
            tid = _recv_tid(spec, rank) if _is_receive(e) else 2 * local + (e.lane == "comm")
            event = {"ph": "X", "name": e.label, "cat": e.lane, "pid": node, "tid": tid, "ts": ts,
                     "dur": round(_us(e.end) - ts, 3), "args": {"rank": rank}}
            if e.lane == "comm":
                op = e.label.split(" #")[0]
                for record in details.get((op, e.start, e.end), ()):
                    if rank in record.ranks:
                        event["args"].update(algorithm=record.algorithm, bytes=record.nbytes,
                                             ranks=list(record.ranks))
                        if record.protocol is not None:
                            event["args"]["protocol"] = record.protocol
                        break
            work.append(event)
        for dead, t, crash in recorder.deaths:
            if dead == rank:
                work.append({"ph": "i", "s": "t", "name": "crash" if crash else "watchdog stop",
                             "cat": "fault", "pid": node, "tid": 2 * local, "ts": _us(t),
                             "args": {"rank": rank}})
        memory = recorder.memories[rank]
        for t, nbytes in memory.history:
            counters.append({"ph": "C", "name": f"rank {rank} memory", "pid": node,
                             "tid": 2 * local, "ts": _us(t), "args": {"bytes": nbytes}})
    return meta + work + counters


def save_trace(recorder, spec, path):
    """Write the run's trace to ``path`` (JSON, one event per line); return ``path``."""
    events = trace_events(recorder, spec)
    peaks = {str(r): {**{c: recorder.memories[r].peak_by_category[c] for c in CATEGORIES},
                      "total": recorder.memories[r].peak}
             for r in range(recorder.world_size)}
    other = {"cluster": spec.name, "world_size": recorder.world_size,
             "time_unit": "microseconds of simulated time", "peak_memory_bytes": peaks}
    lines = ["{", '"displayTimeUnit": "ms",',
             f'"otherData": {json.dumps(other, sort_keys=True)},', '"traceEvents": [']
    body = [json.dumps(e, sort_keys=True, ensure_ascii=False) for e in events]
    lines.append(",\n".join(body))
    lines.append("]")
    lines.append("}")
    with open(path, "w", encoding="utf-8") as f:
        f.write("\n".join(lines) + "\n")
    return path
