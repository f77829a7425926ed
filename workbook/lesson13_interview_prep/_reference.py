"""Reference answers of lab 13's design exercise (the parameter server's and the drills'
references live beside their modules). Imported by the checks only, inside a check."""

from simcluster import goodput
from workbook.lesson13_interview_prep import design, lab


def my_design():
    """The lab's scenario: the fewest whole-node runs that all fit at once (8 nodes: 120 x 8
    = 960 of 1,000; 9 and 7 nodes have no layout that divides the batch), the planner's
    fastest layout on them, checkpoints in host memory with a peer copy at Daly's interval
    for the 8-node job's MTBF, the 40 idle nodes as spares in the pool, and placement that
    keeps each run in one scalable unit."""
    s = lab.LAB_SCENARIO
    nodes = 8
    best = design.best_layout(nodes, s)
    tier = design.checkpoint_tiers(nodes, s)["memory"]
    mtbf = design.failure_rates(nodes, s)["job_mtbf"]
    minutes = goodput.daly_interval(tier["delta"], mtbf) / 60
    return {"nodes_per_run": nodes, "tp": best.tp, "pp": best.pp, "zero": best.zero,
            "recompute": best.recompute, "checkpoint_tier": "memory",
            "checkpoint_minutes": round(minutes, 1), "spare_nodes": 0,
            "placement": "topology"}
