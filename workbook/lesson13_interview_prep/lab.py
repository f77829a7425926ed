"""What lab 13's design exercise gives the learner: its scenario and the grader's
building blocks (no answers here).

The lab's scenario is not the lesson's: 120 runs a day of 4 B tokens each, on nodes that
fail twice as often (10 % a day). The lesson's worked design does not carry over as is.
The helpers here work on the lab's scenario unless given another.
"""

from workbook.lesson13_interview_prep import design

LAB_SCENARIO = design.with_scenario(runs=120, tokens_per_run=4e9,
                                    failures_per_node_per_day=0.10, seed=1)
KEYS = design.KEYS


# what a learner may call while designing (each prints or returns numbers, no verdict)
def best_layout(nodes, scenario=LAB_SCENARIO, **constraints):
    """The fastest layout of one run on ``nodes`` nodes that keeps the memory headroom
    (:func:`.design.best_layout`), or None."""
    return design.best_layout(nodes, scenario, **constraints)


def failure_rates(nodes_per_run, scenario=LAB_SCENARIO):
    """Failures a day and one run's MTBF (:func:`.design.failure_rates`)."""
    return design.failure_rates(nodes_per_run, scenario)


def checkpoint_tiers(nodes_per_run, scenario=LAB_SCENARIO):
    """Each checkpoint tier's write and restart seconds (:func:`.design.checkpoint_tiers`)."""
    return design.checkpoint_tiers(nodes_per_run, scenario)


def check_design(my_design, scenario=LAB_SCENARIO):
    """Print the whole score table of a design dict (:func:`.design.check_design`)."""
    return design.check_design(my_design, scenario)
