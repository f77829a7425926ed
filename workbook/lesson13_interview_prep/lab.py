"""What lab 13's design exercise gives the learner: its scenario and the grader's
building blocks (no answers here).

The lab's scenario is not the lesson's: 120 runs a day of 4 B tokens each, on nodes that
fail twice as often (10 % a day). The lesson's worked design does not carry over as is.
"""

from workbook.lesson13_interview_prep import design

LAB_SCENARIO = design.with_scenario(runs=120, tokens_per_run=4e9,
                                    failures_per_node_per_day=0.10, seed=1)

# what a learner may call while designing (each prints or returns numbers, no verdict)
best_layout = design.best_layout
failure_rates = design.failure_rates
checkpoint_tiers = design.checkpoint_tiers
KEYS = design.KEYS
