"""``examples/llama_memory.py`` timed: LLaMA-7B's training step on fake tensors, DDP then FSDP2
on 8 simulated A100s, and the aten ops it sends through the accounting.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_llama_memory.py            # full 7B (~1 min)
    PYTHONPATH=. .venv/bin/python benchmarks/bench_llama_memory.py --layers 4
    PYTHONPATH=. .venv/bin/python benchmarks/bench_llama_memory.py --quick    # 1 layer, smoke test

Goal (issue 29): the full 7B example (32 layers) in at most 8 s of CPU time, its
``main()`` in a process where ``simcluster`` is imported (``bench_import`` times the
import). Printed: CPU and wall time of ``main()``, the number of aten ops that went
through the accounting's dispatch mode and the CPU per op (the run's CPU over its ops),
and, measured in the same run, what an op costs before any accounting: a small op bare
and under an empty Python dispatch mode, and an op on fake tensors answered from the
simulator's cache (``fake_dispatch``, as in ``bench_fake_dispatch``). The wall is then
visible as ops x per-op cost. The goal's verdict is printed for the full model only.
"""

import argparse
import contextlib
import io
import statistics
import sys
import time
from pathlib import Path

from benchmarks import bench_ddp, bench_fake_dispatch
from benchmarks.goals import ACCOUNTING_IN_CPP, Goal, report
from benchmarks.profile_sim import counting

ROOT = Path(__file__).resolve().parents[1]
FULL_LAYERS, QUICK_LAYERS = 32, 1
GOAL = Goal(f"examples/llama_memory.py, full 7B ({FULL_LAYERS} layers), CPU", 8.0, unit="s")


def _example():
    """The example module (examples/ is not a package)."""
    if str(ROOT / "examples") not in sys.path:
        sys.path.insert(0, str(ROOT / "examples"))
    import llama_memory
    return llama_memory


def unit_costs(quick=False):
    """CPU seconds per op before any accounting: ``{"bare", "empty mode", "fake"}``; "fake" is
    the cheapest of ``bench_fake_dispatch``'s ops answered from the fake-tensor cache."""
    costs = bench_ddp.per_op_costs(calls=200 if quick else 2000)
    fake = bench_fake_dispatch.main(calls=50 if quick else 500, repeats=1 if quick else 3,
                                    verbose=False)
    costs["fake"] = min(row["sim"] for row in fake.values())
    return costs


def main(layers=FULL_LAYERS, quick=False, verbose=True):
    """Run the example's ``main(layers)`` once, counting its ops; print the figures and the
    goal's verdict; return them as a dict."""
    out = print if verbose else (lambda *a, **k: None)
    if quick:
        layers = QUICK_LAYERS
    example = _example()
    printed = io.StringIO()
    with counting() as counts, contextlib.redirect_stdout(printed):
        start, cpu = time.perf_counter(), time.process_time()
        outcomes = example.main(layers=layers)
        cpu, wall = time.process_time() - cpu, time.perf_counter() - start
    costs = unit_costs(quick)
    ops = counts["dispatched_ops"]
    out(f"bench_llama_memory: examples/llama_memory.py main(layers={layers}), one run "
        "(DDP, then FSDP2, 8 ranks, fake tensors); its output:")
    out("\n".join("  | " + line for line in printed.getvalue().splitlines()))
    out(f"\n  main(): CPU {cpu:.1f} s, wall {wall:.1f} s")
    per_op = cpu / ops if ops else float("nan")
    out(f"  aten ops through the accounting's dispatch mode: {ops:,}; CPU per op (all of "
        f"main's CPU / ops): {per_op * 1e6:.0f} us; rank hand-overs: {counts['hand_over']:,}")
    out(f"  one op before any accounting (CPU): {costs['bare'] * 1e6:.1f} us bare, "
        f"{costs['empty mode'] * 1e6:.1f} us under an empty Python dispatch mode, "
        f"{costs['fake'] * 1e6:.1f} us on fake tensors from the cache (fake_dispatch)")
    result = {"layers": layers, "cpu": cpu, "wall": wall, "ops": ops, "cpu_per_op": per_op,
              "hand_overs": counts["hand_over"], "unit_costs": costs,
              "outcomes": {k: "out of memory" if isinstance(v, Exception) else "fits"
                           for k, v in outcomes.items()},
              "goal_met": _goal(layers, cpu, ops, costs, out)}
    return result


def _goal(layers, cpu, ops, costs, out):
    """Print the goal's verdict, the wall (ops x per-op cost) and what would pass; return
    the verdict (None when not judged: fewer layers than the full model)."""
    out("\nGoal (issue 29)")
    if layers != FULL_LAYERS or not ops:
        why = f"layers={layers}, not {FULL_LAYERS}" if ops else "no ops counted"
        out(f"  GOAL {GOAL.describe()}: not judged ({why})")
        return None
    # What every op pays before any accounting: reaching a Python mode, and its answer on
    # fake tensors (the cheapest op in the cache).
    floor = costs["empty mode"] - costs["bare"] + costs["fake"]
    wall = (f"{ops:,} aten ops reach the accounting from Python, at {cpu / ops * 1e6:.0f} us "
            f"CPU each; the goal leaves {GOAL.limit / ops * 1e6:.1f} us per op, and before "
            f"any accounting an op costs {floor * 1e6:.1f} us (reaching a Python dispatch "
            f"mode {(costs['empty mode'] - costs['bare']) * 1e6:.1f} us, its result on fake "
            f"tensors from the cache {costs['fake'] * 1e6:.1f} us): {ops:,} x "
            f"{floor * 1e6:.1f} us = {ops * floor:.1f} s")
    wall += (", over the goal before any accounting." if ops * floor > GOAL.limit else
             f"; the accounting's own Python per op is the other "
             f"{cpu - ops * floor:.1f} s.")
    would_pass = (ACCOUNTING_IN_CPP + " On fake tensors the shapes must come from torch's "
                  "C++ meta kernels too, not a fake mode in Python.")
    return report(GOAL, cpu, out, wall, would_pass)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--layers", type=int, default=FULL_LAYERS)
    parser.add_argument("--quick", action="store_true",
                        help=f"{QUICK_LAYERS} layer: proves the benchmark runs")
    args = parser.parse_args()
    main(layers=args.layers, quick=args.quick)
