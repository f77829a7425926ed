"""What lesson 11 measures on :mod:`simcluster.scheduling`: side-by-side tables of
scheduler configurations, a tensor-parallel job whose speed depends on its placement
(from :func:`simcluster.planner.estimate`), and the utilisation/wait trade-off."""

import dataclasses

from simcluster import planner, spec
from simcluster import scheduling as sched

# A GPT of 1.3 B parameters trained with 8-way tensor parallelism: the kind of job whose
# speed depends on where its 8 GPUs are (docs/reference-numbers.md, Megatron-LM).
GPT_1_3B = planner.TransformerConfig(layers=24, hidden=2048, heads=16, seq_len=2048,
                                     vocab=51200)
SPINE_OVERSUBSCRIPTION = 2.0   # an assumption: traffic between leaf switches gets half


def tp8_step_times(cluster, cfg=GPT_1_3B, global_batch=64):
    """Step time (s) of ``cfg`` with tp=8, ZeRO-1, predicted by the planner for the 8 GPUs
    on: one node (the 8-GPU NVSwitch node), two 4-GPU nodes under one leaf switch, two
    under different switches (the spine oversubscribed), and eight nodes (one GPU each)."""
    nodes = cluster.spec.nodes if hasattr(cluster, "spec") else cluster.nodes
    network = (cluster.spec if hasattr(cluster, "spec") else cluster).network
    big = next(n for n in nodes if n.devices >= 8)
    small = next(n for n in nodes if n.devices == 4)
    spine = dataclasses.replace(network, oversubscription=SPINE_OVERSUBSCRIPTION)
    one_gpu = dataclasses.replace(small, devices=1, nics=1)
    layouts = {"1 node": ((big,), network), "2 nodes, 1 switch": ((small, small), network),
               "2 nodes, 2 switches": ((small, small), spine),
               "8 nodes": ((one_gpu,) * 8, spine)}
    return {name: planner.estimate(cfg, spec.ClusterSpec(name, layout, net), tp=8,
                                   global_batch=global_batch, zero=1).step_time
            for name, (layout, net) in layouts.items()}


def slowdown_of(steps, switches):
    """A function of a placement: how many times slower than on one node a tp=8 job
    runs there (rounded to 0.01, so that durations stay whole seconds on every CPU)."""
    base = steps["1 node"]
    factor = {key: round(value / base, 2) for key, value in steps.items()}

    def slowdown(placement):
        nodes, leaves = sched.spans(placement, switches)
        if nodes == 1:
            return factor["1 node"]
        if nodes > 2:
            return factor["8 nodes"]
        return factor["2 nodes, 1 switch" if leaves == 1 else "2 nodes, 2 switches"]

    return slowdown


def with_tp_jobs(jobs, slowdown):
    """The trace with every 8-GPU job turned into a tp=8 job that may be split over nodes
    and whose run time is its one-node time times ``slowdown(placement)``."""
    out = []
    for job in jobs:
        if job.gpus == 8:
            base = job.duration
            job = dataclasses.replace(job, gpus_per_node=None,
                                      duration=lambda p, base=base: round(base * slowdown(p)))
        out.append(job)
    return out


def run_all(jobs, cluster, configs):
    """``{label: Result}`` for ``{label: simulate keyword arguments}``."""
    return {label: sched.simulate(jobs, cluster, **kwargs) for label, kwargs in configs.items()}


def table(results, extra=None):
    """Print the metrics side by side, one row per configuration. ``extra``: {column:
    function of a Result -> text}."""
    extra = extra or {}
    head = (f"{'':<24}{'util.':>7}{'mean JCT':>10}{'p99 JCT':>10}{'p99.9':>9}"
            f"{'mean wait':>11}{'makespan':>10}{'frag.':>7}"
            + "".join(f"{name:>{max(len(name) + 2, 10)}}" for name in extra))
    print(head)
    for label, r in results.items():
        print(f"{label:<24}{r.utilization:>7.1%}{r.mean_jct / 3600:>9.1f}h"
              f"{r.p99_jct / 3600:>9.1f}h{r.p999_jct / 3600:>8.1f}h{r.mean_wait / 3600:>10.2f}h"
              f"{r.makespan / 3600:>9.0f}h{r.mean_fragmentation:>7.1%}"
              + "".join(f"{fn(r):>{max(len(name) + 2, 10)}}" for name, fn in extra.items()))


def mean_jct_of(result, names, hours=True):
    """Mean JCT of the jobs called ``names``."""
    jcts = [result.by_name[n].jct for n in names]
    return sum(jcts) / len(jcts) / (3600 if hours else 1)


def load_sweep(cluster, loads, n=1500, seed=0, **kwargs):
    """For each offered load: (load, utilisation while jobs arrive, mean wait in hours,
    p99 wait in hours), on a synthetic trace of ``n`` jobs."""
    rows = []
    for load in loads:
        jobs = sched.synthetic_trace(n, cluster, seed=seed, load=load)
        r = sched.simulate(jobs, cluster, **kwargs)
        t0, t1 = jobs[n // 10].submit, jobs[-1].submit
        rows.append((load, r.utilization_over(t0, t1), r.mean_wait / 3600,
                     r.p99_wait / 3600))
    return rows


def pipeline_speedup_bound(stage_times):
    """The most that overlapping the stages of a pipeline can gain over running them one
    after another on the same nodes: total time / the slowest stage's time."""
    return sum(stage_times) / max(stage_times)
