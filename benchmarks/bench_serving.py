"""How fast simcluster.serving simulates requests (issue 26's goal: 100,000 requests in
under 10 s).

    PYTHONPATH=. .venv/bin/python benchmarks/bench_serving.py [--quick]

Serves Poisson traffic to OPT-13B on a DGX A100 (4 replicas, vLLM-style continuous
batching, outputs of 16, 64 or 256 tokens, about 75 % of the fleet's capacity), then the
same trace with least-outstanding load balancing and an autoscaler, and prints requests
simulated per second of CPU time (``time.process_time``: what the simulator costs, not
what the machine's other load costs) and the ratio to the goal. Speed is reported, never
asserted.
"""

import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

import simcluster as sc  # noqa: E402
from simcluster import planner, serving  # noqa: E402

GOAL_REQUESTS, GOAL_SECONDS = 100_000, 10.0


def _timed(requests, dep):
    start = time.process_time()
    res = serving.simulate(requests, dep)
    return res, time.process_time() - start


def main(quick=False, verbose=True):
    """Run both cases; return ``{case: {"requests", "cpu_s", "per_second"}, "goal_met"}``."""
    n = 5_000 if quick else GOAL_REQUESTS
    cfg = planner.TransformerConfig(layers=40, hidden=5120, heads=40, seq_len=2048,
                                    vocab=50272)
    cluster = sc.Cluster.preset("dgx-a100")
    requests = serving.poisson(rate=24.0, n=n, output_tokens=[16, 64, 256], seed=0)
    cases = {
        "round robin, 4 replicas": serving.Deployment(cluster, cfg, replicas=4),
        "least outstanding + autoscaler": serving.Deployment(
            cluster, cfg, replicas=4, load_balancer="least_outstanding",
            autoscaler=serving.Autoscaler(target=16)),
    }
    out = {}
    for name, dep in cases.items():
        res, cpu = _timed(requests, dep)
        out[name] = {"requests": n, "cpu_s": cpu, "per_second": n / cpu,
                     "ttft_p99": res.percentile("ttft", 99)}
        if verbose:
            print(f"{name:32s} {n:>7,} requests in {cpu:6.2f} s CPU: "
                  f"{n / cpu:>9,.0f} requests/s  (TTFT p99 {res.percentile('ttft', 99):.3f} s)")
    worst = min(v["per_second"] for v in out.values())
    out["goal_met"] = worst * GOAL_SECONDS >= GOAL_REQUESTS
    if verbose:
        print(f"goal: {GOAL_REQUESTS:,} requests in < {GOAL_SECONDS:.0f} s = "
              f"{GOAL_REQUESTS / GOAL_SECONDS:,.0f} requests/s; slowest case is "
              f"{worst / (GOAL_REQUESTS / GOAL_SECONDS):.1f}x the goal "
              f"({'met' if out['goal_met'] else 'NOT met'})")
    return out


if __name__ == "__main__":
    main(quick="--quick" in sys.argv)
