"""Lesson 10's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("10", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def young_interval():
    """In the lesson."""
    return quiz.number(
        "A checkpoint takes 2 minutes to write and the job fails on average every 8 hours. "
        "What checkpoint interval does Young's formula give, in minutes?",
        answer=(2 * 2 * 8 * 60) ** 0.5, unit="min", rel_tol=0.05,
        hint="τ = √(2 δ M), with both in minutes.",
        explain="√(2 · 2 · 480) = 43.8 min. Daly's correction makes it a little shorter (about 43 min).")


def missing_state():
    """In the lesson."""
    return quiz.choice(
        "A run restarted from its checkpoint ends with parameters that differ from the fault-free run in the "
        "fourth decimal. Model, optimizer and scheduler were all saved. What is the most likely missing piece?",
        [("the gradients", "Gradients are recomputed from scratch every step; they need no saving."),
         "the data position or the RNG states",
         ("the learning rate", "It is in the scheduler's and optimizer's state, which were saved."),
         ("nothing: floating point is never reproducible", "Section 2 restarted bit-identically.")],
        answer="the data position or the RNG states",
        explain="Section 2: leaving out the data position or the RNG state (dropout masks) changes the result.")


def interval_when_mtbf_halves():
    """In the lab."""
    return quiz.choice(
        "The MTBF of a job halves (twice as many nodes). By how much does the best checkpoint "
        "interval change, when δ is much smaller than the MTBF?",
        [("it halves", "τ grows with the square root of M, not linearly."),
         "it shrinks by a factor √2 (about 0.71×)",
         ("it stays the same", "τ depends on M: rarer failures, rarer checkpoints."),
         ("it doubles", "More failures mean more frequent checkpoints, not fewer.")],
        answer="it shrinks by a factor √2 (about 0.71×)",
        explain="τ ≈ √(2δM): M/2 gives τ/√2. The waste per unit time, about √(2δ/M), grows by √2.")
