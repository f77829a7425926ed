"""The lesson's worked answer to the 1,000-node design question, as printed tables.

Each function prints one step of the answer from :mod:`.design`'s numbers; the notebook
calls them in order. :data:`WORKED` is the design the lesson arrives at (the lab asks for
one on another scenario, :data:`.lab.LAB_SCENARIO`).
"""

from simcluster import goodput, planner
from workbook.lesson13_interview_prep import design

NODES_PER_RUN = 8
# The worked design: 8-node runs (9 has no layout that divides the batch of 1,024; 10
# would leave no node idle), the planner's layout with pp=4 for memory headroom (68 GiB
# instead of 79, for 1 % of MFU), in-memory checkpoints with a peer copy every 5 minutes
# (Daly's interval), 50 hot spares, placement inside one scalable unit.
WORKED = {"nodes_per_run": NODES_PER_RUN, "tp": 2, "pp": 4, "zero": 2,
          "recompute": "selective", "checkpoint_tier": "memory", "checkpoint_minutes": 5,
          "spare_nodes": 50, "placement": "topology"}
GiB = 2**30


def show_budget(scenario=design.QUESTION):
    """What "100 runs a day" can mean."""
    b = design.budget(scenario)
    params = planner.parameter_count(design.MODEL)
    print(f"model: {params / 1e9:.1f} B parameters; cluster: {scenario.nodes} nodes x "
          f"{scenario.gpus_per_node} GPUs = {b['gpu_hours_per_day']:,} GPU-hours a day")
    print(f"one run's share of the day: {b['gpu_hours_per_run']:,.0f} GPU-hours "
          f"= {b['tokens_per_run_at_share'] / 1e9:.1f} B tokens at the planner's "
          f"{b['tokens_per_gpu_second']:,.0f} tokens/s per GPU")
    print(f"Chinchilla-optimal training of this model: {b['chinchilla_tokens'] / 1e12:.1f} T "
          f"tokens, {b['chinchilla_tokens'] / b['tokens_per_run_at_share']:.0f}x more")
    print(f"assumed here: {scenario.tokens_per_run / 1e9:g} B tokens per run "
          "(fine-tuning, ablations, continued pre-training)")


def show_layouts(nodes_options=(8, 9, 10), scenario=design.QUESTION):
    """The fastest layout per run size, and the worked one."""
    print(f"{'nodes':>5} {'GPUs':>5} {'layout':<30} {'MFU':>6} {'GiB/GPU':>8} {'run':>7}")
    for nodes in nodes_options:
        best = design.best_layout(nodes, scenario)
        if best is None:
            print(f"{nodes:>5} {nodes * 8:>5} no layout fits (dp must divide the batch "
                  f"of {design.GLOBAL_BATCH}, pp the {design.MODEL.layers} layers)")
            continue
        hours = scenario.tokens_per_run / design.tokens_per_second(best) / 3600
        print(f"{nodes:>5} {best.gpus:>5} {_layout(best):<30} {best.mfu:>6.1%} "
              f"{best.memory_per_gpu / GiB:>8.0f} {hours:>5.1f} h")
    est = design.layout_of(WORKED, scenario)
    hours = scenario.tokens_per_run / design.tokens_per_second(est) / 3600
    print(f"worked: {_layout(est)}, MFU {est.mfu:.1%}, {est.memory_per_gpu / GiB:.0f} GiB "
          f"per GPU, step {est.step_time:.0f} s, {hours:.1f} h and "
          f"{hours * est.gpus:,.0f} GPU-hours per run")
    return est


def _layout(est):
    return f"tp={est.tp} pp={est.pp} dp={est.dp} zero={est.zero} {est.recompute}"


def show_traffic(est):
    """Bytes per GPU per step, by parallelism and tier."""
    print(f"{'':9} {'GB/GPU/step':>12} {'NVLink':>8} {'InfiniBand':>11} {'nodes':>6} "
          f"{'exposed s':>10}")
    for name, row in design.traffic(est).items():
        print(f"{name:9} {row['bytes'] / 1e9:>12.1f} {row['nvlink_bytes'] / 1e9:>8.1f} "
              f"{row['ib_bytes'] / 1e9:>11.1f} {row['nodes']:>6} {row['seconds']:>10.2f}")
    print(f"step {est.step_time:.1f} s, of which compute and recomputation "
          f"{(est.breakdown['compute'] + est.breakdown['recompute']) / est.step_time:.0%}")


def show_failures(nodes=NODES_PER_RUN, scenario=design.QUESTION):
    """The question's failure rate against Llama 3's."""
    r = design.failure_rates(nodes, scenario)
    print(f"question: {scenario.failures_per_node_per_day:.0%} of nodes a day = "
          f"{r['question_per_day']:.0f} failures a day on {scenario.nodes} nodes")
    print(f"Llama 3: {design.LLAMA3_INTERRUPTIONS} unexpected interruptions / "
          f"{design.LLAMA3_DAYS} days / {design.LLAMA3_NODES:,} nodes = "
          f"{r['llama3_rate']:.2%} of nodes a day = {r['llama3_per_day']:.1f} a day here "
          f"({r['ratio']:.0f}x fewer)")
    print(f"MTBF of one {nodes}-node run: {r['job_mtbf'] / 3600:.0f} h at the question's "
          f"rate, {r['job_mtbf_llama3'] / 86400:.0f} days at Llama 3's")


def show_checkpoints(nodes=NODES_PER_RUN, scenario=design.QUESTION):
    """Each tier's write time, restart, Daly interval and goodput."""
    mtbf = design.failure_rates(nodes, scenario)["job_mtbf"]
    tiers = design.checkpoint_tiers(nodes, scenario)
    total = tiers["memory"]["bytes"]
    print(f"checkpoint: {total / 1e9:.0f} GB per run ({design.CHECKPOINT_BYTES_PER_PARAMETER} "
          f"bytes per parameter), {total / nodes / 1e9:.0f} GB per node; job MTBF "
          f"{mtbf / 3600:.0f} h")
    print(f"{'tier':<7} {'write':>8} {'restart':>8} {'Young':>8} {'Daly':>8} {'goodput':>8}")
    for name, t in tiers.items():
        young = goodput.young_interval(t["delta"], mtbf)
        daly = goodput.daly_interval(t["delta"], mtbf)
        g = goodput.expected_goodput(daly, t["delta"], mtbf, t["restore"])
        print(f"{name:<7} {t['delta']:>6.1f} s {t['restore']:>6.0f} s {young / 60:>5.1f} min "
              f"{daly / 60:>4.1f} min {g:>8.2%}")
