"""Scale: 1,024 simulated ranks in one process (goal: docs/reference-numbers.md).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_scale.py             # 1,024 ranks
    PYTHONPATH=. .venv/bin/python benchmarks/bench_scale.py --ranks 256
    PYTHONPATH=. .venv/bin/python benchmarks/bench_scale.py --quick     # 16 ranks, smoke test

On a custom cluster of 128 nodes x 8 devices, ``--ranks`` ranks (one ``cluster.run``
each) run:

1. **all_reduce** — every rank all-reduces a small tensor (``[rank] * 4``); every rank
   must end with ``sum(range(ranks))``.
2. **hand DP step** — every rank builds the same ``Linear(16, 4)``, runs forward and
   backward on its own batch, all-reduces each gradient by hand, divides by the world
   size and takes one SGD step.
3. **DDP step** — the same step with the model wrapped in ``DistributedDataParallel``
   (its constructor also checks parameter shapes with an all_gather and broadcasts the
   parameters from rank 0). torch's C++ shape check makes O(ranks) aten ops per rank,
   O(ranks^2) in all: 3 per peer (an ``empty_like`` buffer, a ``select``, an
   ``.item()``), ~3.1 M at 1,024 ranks; the accounting's fast path runs it in bulk
   (docs/architecture.md, "The accounting fast path"), the reference path op by op.

Every phase runs with accounting on, at every size (``--no-accounting`` turns it off).
``--reference`` also runs each phase on the accounting's reference per-op path
(``SIMCLUSTER_FAST_PATH=0``) right after it and prints the ratio: the fast path's gain,
measured side by side.

For 2 and 3 the updated parameters must be identical on every rank and match a serial
reference (each rank's gradient computed one after another in this process, summed in
rank order, averaged, one SGD step) to within float32 rounding.

Printed per phase: wall and CPU time of the ``cluster.run`` call (median of ``--repeats``, after a
2-rank warm-up run of every phase, so torch's lazy first-call costs are excluded), time
per rank, correctness, and the process's peak RSS after the phase (``getrusage``
``ru_maxrss``: a high-water mark, so it only grows from phase to phase). The reference
for the per-rank time is the serial compute of all ranks' steps in this process.
"""

import argparse
import resource
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F

from benchmarks.bench_ddp import fast_path
from benchmarks.goals import ACCOUNTING_IN_CPP, Goal, report

IN, OUT, BATCH, LR = 16, 4, 8, 0.1
GOAL_RANKS = 1024
# Issue 29: a DDP step on 1,024 ranks with accounting on, CPU seconds of the cluster.run
DDP_GOAL = Goal(f"DDP step on {GOAL_RANKS:,} ranks with accounting on, CPU", 20.0, unit="s")


def big_cluster(nodes=128, per_node=8):
    import simcluster as sc
    return sc.Cluster(sc.ClusterSpec("big", tuple(sc.NodeSpec(f"node{i}", per_node)
                                                  for i in range(nodes))))


def peak_rss_mib():
    """The process's peak resident set size so far, in MiB (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


# --------------------------------------------------------------- rank functions
def allreduce_rank():
    t = torch.full((4,), float(dist.get_rank()))
    dist.all_reduce(t)
    return t


def rank_batch(rank):
    g = torch.Generator().manual_seed(1000 + rank)
    return torch.randn(BATCH, IN, generator=g), torch.randint(0, OUT, (BATCH,), generator=g)


def build_model():
    torch.manual_seed(0)
    return nn.Linear(IN, OUT)


def hand_dp_rank():
    rank, world = dist.get_rank(), dist.get_world_size()
    model = build_model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = rank_batch(rank)
    F.cross_entropy(model(x), y).backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad.div_(world)
    opt.step()
    return [p.detach().clone() for p in model.parameters()]


def ddp_rank():
    from torch.nn.parallel import DistributedDataParallel as DDP
    rank = dist.get_rank()
    model = DDP(build_model())
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    x, y = rank_batch(rank)
    F.cross_entropy(model(x), y).backward()
    opt.step()
    return [p.detach().clone() for p in model.module.parameters()]


# ------------------------------------------------------------------- references
def serial_reference(world):
    """Every rank's gradient, one after another here, averaged; one SGD step."""
    model = build_model()
    grads = None
    for rank in range(world):
        model.zero_grad(set_to_none=True)
        x, y = rank_batch(rank)
        F.cross_entropy(model(x), y).backward()
        g = [p.grad.clone() for p in model.parameters()]
        grads = g if grads is None else [a.add_(b) for a, b in zip(grads, g)]
    with torch.no_grad():
        return [p - LR * (g / world) for p, g in zip(model.parameters(), grads)]


def check_allreduce(results, world):
    expected = float(sum(range(world)))
    bad = [r for r, t in enumerate(results) if not torch.equal(t, torch.full((4,), expected))]
    return not bad, f"every rank has {expected:.0f}" if not bad else f"ranks {bad[:5]} wrong"


def check_step(results, reference):
    first = results[0]
    same = all(all(torch.equal(a, b) for a, b in zip(first, r)) for r in results[1:])
    err = max(float((a - b).abs().max()) for a, b in zip(first, reference))
    ok = same and err < 1e-5
    return ok, (f"identical on all ranks: {same}; max |diff| vs serial reference "
                f"{err:.1e}")


# ------------------------------------------------------------------------ driver
PHASES = (("all_reduce (4 floats)", allreduce_rank),
          ("hand DP step, Linear(16,4)", hand_dp_rank),
          ("DDP step, Linear(16,4)", ddp_rank))


def _run(cluster, fn, ranks, accounting):
    options = {}
    import inspect
    if "accounting" in inspect.signature(cluster.run).parameters:
        options["accounting"] = accounting
    start, cpu = time.perf_counter(), time.process_time()
    run = cluster.run(fn, world_size=ranks, **options)
    # accounting really was on: the run kept simulated clocks (Run.recorder)
    charged = getattr(run, "recorder", None) is not None
    return time.perf_counter() - start, time.process_time() - cpu, run.results, charged


def main(ranks=1024, repeats=3, quick=False, accounting=True, phases=None, compare=False,
         verbose=True):
    """Run the phases on ``ranks`` simulated ranks; print and return the measurements.

    ``compare``: also run each phase on the accounting's reference per-op path.
    """
    out = print if verbose else (lambda *a, **k: None)
    if quick:
        ranks, repeats = 16, 1
    cluster = big_cluster()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        return _measure(cluster, ranks, repeats, accounting, phases, compare, out)
    finally:
        torch.set_num_threads(threads)


def _measure(cluster, ranks, repeats, accounting, phases, compare, out):
    out(f"bench_scale: {ranks} simulated ranks on {cluster!r}; torch.set_num_threads(1); "
        f"median of {repeats}")
    out(f"  peak RSS before: {peak_rss_mib():.0f} MiB\n")
    serial_reference(2)             # warm-up
    t = time.perf_counter()
    reference = serial_reference(ranks)
    serial = time.perf_counter() - t
    out(f"  serial reference (all {ranks} ranks' forward/backward, one process): "
        f"{serial * 1e3:.1f} ms = {serial / ranks * 1e6:.0f} us per rank\n")
    for _, fn in PHASES:            # warm-up: torch's and DDP's lazy first-call costs
        _run(cluster, fn, 2, accounting)
    out(f"  {'phase':<28}{'acct':>5}{'wall (median)':>14}{'best':>9}{'CPU':>9}"
        f"{'per rank':>11}{'CPU/rank':>10}{'peak RSS':>10}  correct")
    rows = {}
    for label, fn in PHASES:
        if phases is not None and fn.__name__ not in phases:
            continue
        acct = accounting
        times, cpus, ref_times, ref_cpus, charged = [], [], [], [], []
        for _ in range(repeats):
            seconds, cpu, results, was_charged = _run(cluster, fn, ranks, acct)
            times.append(seconds)
            cpus.append(cpu)
            charged.append(was_charged)
            if compare and acct:   # interleaved with the fast path's repetitions
                with fast_path(False):
                    seconds, cpu, _, _ = _run(cluster, fn, ranks, acct)
                ref_times.append(seconds)
                ref_cpus.append(cpu)
        if fn is allreduce_rank:
            ok, detail = check_allreduce(results, ranks)
        else:
            ok, detail = check_step(results, reference)
        del results
        wall, cpu = statistics.median(times), statistics.median(cpus)
        rss = peak_rss_mib()
        rows[fn.__name__] = {"accounting": acct, "charged": all(charged), "wall": wall,
                             "best": min(times), "all": times, "cpu": cpu,
                             "per_rank": wall / ranks, "cpu_per_rank": cpu / ranks,
                             "peak_rss_mib": rss, "ok": ok, "detail": detail}
        if ref_times:
            rows[fn.__name__]["reference"] = {"wall": statistics.median(ref_times),
                                              "cpu": statistics.median(ref_cpus)}
        out(f"  {label:<28}{'on' if acct else 'off':>5}{wall:>12.2f} s{min(times):>7.2f} s"
            f"{cpu:>7.2f} s"
            f"{wall / ranks * 1e3:>8.2f} ms{cpu / ranks * 1e3:>7.2f} ms{rss:>6.0f} MiB  "
            f"{'yes' if ok else 'NO'}: {detail}")
        if ref_times:
            ref_wall, ref_cpu = statistics.median(ref_times), statistics.median(ref_cpus)
            out(f"  {'  reference per-op path':<28}{'on':>5}{ref_wall:>12.2f} s"
                f"{min(ref_times):>7.2f} s{ref_cpu:>7.2f} s   before / after: wall "
                f"{ref_wall / wall:.2f}, CPU {ref_cpu / cpu:.2f}")
    out("\n  acct = cluster.run(accounting=...): simulated time and memory charged per aten op."
        "\n  CPU = process CPU time of the cluster.run call (all threads): less sensitive "
        "than wall\n  time to other load on the machine.")
    every = all(row["charged"] for row in rows.values())
    out(f"  accounting on in every phase at {ranks} ranks (each run kept simulated clocks): "
        f"{'yes' if every else 'no'}")
    return {"ranks": ranks, "serial_reference_s": serial, "phases": rows,
            "peak_rss_mib": peak_rss_mib(), "accounting_everywhere": every,
            "goal_met": _goal(rows, ranks, out)}


def _goal(rows, ranks, out):
    """Print the 1,024-rank DDP goal's verdict; return it (None when not judged: another
    size, accounting off or the DDP phase not run)."""
    ddp = rows.get("ddp_rank")
    out("\nGoal (issue 29)")
    if ddp is None or ranks != GOAL_RANKS or not ddp["charged"]:
        why = ("the DDP phase did not run" if ddp is None else
               f"this run had {ranks} ranks" if ranks != GOAL_RANKS else "accounting was off")
        out(f"  GOAL {DDP_GOAL.describe()}: not judged ({why})")
        return None
    hand = rows.get("hand_dp_rank")
    wall = (f"each of the {ranks:,} ranks runs its step's aten ops through the accounting "
            f"in Python ({ddp['cpu_per_rank'] * 1e3:.1f} ms CPU per rank)")
    if hand is not None:
        wall += (f"; the same step by hand takes {hand['cpu']:.1f} s, so DDP's construction "
                 f"costs {ddp['cpu'] - hand['cpu']:.1f} s: its shape check's all-gather "
                 f"makes one output tensor per peer on every rank ({ranks ** 2:,} in all), "
                 f"then its parameter broadcast")
    would_pass = (ACCOUNTING_IN_CPP + " The shape check's per-peer tensors are torch's "
                  "(reducer.cpp asks the process group for one output per rank).")
    return report(DDP_GOAL, ddp["cpu"], out, wall + ".", would_pass)


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--ranks", type=int, default=1024)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-accounting", action="store_true",
                   help="cluster.run(accounting=False): no simulated time or memory")
    p.add_argument("--reference", action="store_true",
                   help="also run each phase on the reference per-op accounting path "
                        "(SIMCLUSTER_FAST_PATH=0): before / after the fast path")
    p.add_argument("--quick", action="store_true", help="16 ranks, one repetition")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = _parse(sys.argv[1:])
    result = main(ranks=args.ranks, repeats=args.repeats, quick=args.quick,
                  accounting=not args.no_accounting, compare=args.reference)
    sys.exit(0 if all(p["ok"] for p in result["phases"].values()) else 1)
