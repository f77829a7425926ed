"""Faults: the wall time each kind of fault costs (goal: under 2 s per fault).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_faults.py
    PYTHONPATH=. .venv/bin/python benchmarks/bench_faults.py --quick    # fewer steps

The same 8-rank training (a small MLP under DDP, on a cluster of two nodes of 4 A100s)
runs fault-free and with one fault of each kind, timed from half-way through the run. Printed
per case: the wall time of ``cluster.run`` (median of ``--repeats``), the extra wall time
over the fault-free run (what the fault costs: the watchdog, the restart, the shrink),
the simulated time, and whether the extra stays under the goal. A crash without restarts
is timed up to the ``RankCrashedError`` it raises.
"""

import argparse
import statistics
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

GOAL_S = 2.0   # wall seconds a fault may add (issue 14)


def cluster():
    import simcluster as sc

    return sc.Cluster(sc.ClusterSpec("2x4", (sc.NodeSpec("node0", 4), sc.NodeSpec("node1", 4))))


def train(steps):
    """A DDP training loop: the rank function every case runs."""
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(
        nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 64)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    torch.manual_seed(dist.get_rank())
    for _ in range(steps):
        loss = model(torch.randn(32, 64)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return loss.item()


def cases(half):
    """``{name: cluster.run keyword arguments}``; ``half``: half the fault-free run."""
    from simcluster import faults

    return {
        "fault-free": {},
        "Crash, no restart": {"faults": [faults.Crash(rank=3, at=half)]},
        "Crash, 1 restart": {"faults": [faults.Crash(rank=3, at=half)], "max_restarts": 1},
        "NodeCrash, shrink to 4": {"faults": [faults.NodeCrash(node=1, at=half)],
                                   "max_restarts": 1, "min_world_size": 4},
        "Straggler x3": {"faults": [faults.Straggler(rank=3, factor=3.0, start=half)]},
        "LinkDegraded x0.25": {"faults": [faults.LinkDegraded("network", 0.25, start=half)]},
        "PacketLoss 20%": {"faults": [faults.PacketLoss(node=1, rate=0.2)]},
    }


def timed(run_case):
    """``(wall seconds, CPU seconds, simulated seconds)`` of one ``cluster.run``."""
    import simcluster as sc

    start, cpu = time.perf_counter(), time.process_time()
    try:
        elapsed = run_case().elapsed
    except sc.RankCrashedError as error:
        elapsed = error.run.elapsed
    return time.perf_counter() - start, time.process_time() - cpu, elapsed


def main(quick=False, repeats=3, verbose=True):
    """Run every case; return ``{name: {"wall": s, "extra": s, "simulated": s}}``."""
    steps = 3 if quick else 10
    repeats = 1 if quick else repeats
    c = cluster()
    clean = c.run(train, world_size=8, args=(steps,))   # also warms torch up
    out = {}
    for name, kwargs in cases(clean.elapsed / 2).items():
        walls, cpus, simulated = [], [], None
        for _ in range(repeats):
            wall, cpu, simulated = timed(lambda: c.run(train, world_size=8, args=(steps,),
                                                       **kwargs))
            walls.append(wall)
            cpus.append(cpu)
        out[name] = {"wall": statistics.median(walls), "cpu": statistics.median(cpus),
                     "simulated": simulated}
    base = out["fault-free"]
    for result in out.values():
        result["extra"] = result["wall"] - base["wall"]
        result["extra_cpu"] = result["cpu"] - base["cpu"]
        result["goal_met"] = result["extra"] < GOAL_S
    if verbose:
        print(f"8 ranks, {steps} DDP steps, median of {repeats}")
        print(f"{'case':<24}{'wall s':>8}{'extra':>8}{'CPU s':>8}{'extra':>8}"
              f"{'simulated s':>13}  extra wall < {GOAL_S:g} s")
        for name, r in out.items():
            print(f"{name:<24}{r['wall']:>8.3f}{r['extra']:>8.3f}{r['cpu']:>8.3f}"
                  f"{r['extra_cpu']:>8.3f}{r['simulated']:>13.6g}  "
                  f"{'met' if r['goal_met'] else 'MISSED'}")
    return out


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    options = parser.parse_args()
    results = main(options.quick, options.repeats)
    sys.exit(0 if all(r["goal_met"] for r in results.values()) else 1)
