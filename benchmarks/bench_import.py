"""How long ``import simcluster`` takes, next to ``import torch``, in fresh processes.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_import.py            # 7 repeats (~1 min)
    PYTHONPATH=. .venv/bin/python benchmarks/bench_import.py --quick    # 1 repeat, smoke test

Every lesson starts with an import cell, so its cost is paid at every kernel start. Goal
(docs/reference-numbers.md): ``import simcluster`` takes at most 1.5 × ``import torch``
(simcluster imports torch itself, so the ratio is at least 1).

Each measurement starts a new interpreter that imports one module and prints, from
inside, the wall and CPU time the import took (interpreter start-up excluded). The two
imports are interleaved (torch, simcluster, torch, ...) so that a busy machine slows both
alike; the ratio is the median over repetitions of the paired ratio.

``--also`` adds further modules to time the same way (e.g.
``workbook.lesson03_data_parallel.checks``, what a lab's first cell imports).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys

GOAL = 1.5   # import simcluster / import torch, at most

# Runs in the fresh interpreter: time one import, print (wall, cpu) as JSON.
_PROBE = """
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
__import__(sys.argv[1])
print(json.dumps([time.perf_counter() - t0, time.process_time() - c0]))
"""


def time_import(module):
    """``(wall seconds, CPU seconds)`` of importing ``module`` in a fresh interpreter."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        p for p in (root, os.environ.get("PYTHONPATH")) if p))
    out = subprocess.run([sys.executable, "-c", _PROBE, module], env=env, check=True,
                         capture_output=True, text=True, timeout=600).stdout
    wall, cpu = json.loads(out.strip().splitlines()[-1])
    return wall, cpu


def main(repeats=7, quick=False, also=(), verbose=True):
    """Time the imports; print a table and the ratio; return the measurements as a dict."""
    out = print if verbose else (lambda *a, **k: None)
    if quick:
        repeats = 1
    modules = ["torch", "simcluster", *also]
    times = {m: {"wall": [], "cpu": []} for m in modules}
    time_import("torch")   # warm the file cache, so the first repetition is not an outlier
    for _ in range(repeats):
        for m in modules:   # interleaved
            wall, cpu = time_import(m)
            times[m]["wall"].append(wall)
            times[m]["cpu"].append(cpu)

    def paired(m, key):
        return statistics.median(a / b for a, b in zip(times[m][key], times["torch"][key]))

    result = {"repeats": repeats, "goal": GOAL, "modules": {}}
    out(f"bench_import: fresh interpreter per import, median of {repeats} interleaved runs\n")
    out(f"  {'import':<24}{'wall':>9}{'CPU':>9}{'/ torch':>9}{'CPU / torch':>13}")
    for m in modules:
        row = {"wall": statistics.median(times[m]["wall"]),
               "cpu": statistics.median(times[m]["cpu"]),
               "over_torch": paired(m, "wall"), "cpu_over_torch": paired(m, "cpu"),
               "all_wall": times[m]["wall"]}
        result["modules"][m] = row
        out(f"  {m:<24}{row['wall']:>8.2f}s{row['cpu']:>8.2f}s{row['over_torch']:>9.2f}"
            f"{row['cpu_over_torch']:>13.2f}")
    ratio = result["modules"]["simcluster"]["over_torch"]
    result["goal_met"] = ratio <= GOAL
    out(f"\n  import simcluster / import torch = {ratio:.2f}   goal <= {GOAL}: "
        f"{'met' if result['goal_met'] else 'NOT met'}")
    return result


def _parse(argv):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--quick", action="store_true", help="one repetition")
    p.add_argument("--also", nargs="*", default=[], help="more modules to time")
    return p.parse_args(argv)


if __name__ == "__main__":
    args = _parse(sys.argv[1:])
    main(repeats=args.repeats, quick=args.quick, also=args.also)
