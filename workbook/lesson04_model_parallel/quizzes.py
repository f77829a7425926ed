"""Lesson 04's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("04", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def naive_split_step():
    """In the lesson."""
    return quiz.choice(
        "A model is split by layers into 4 equal stages on 4 GPUs, one batch per step (no micro-batches). "
        "Compared with one (big enough) GPU, the step time is about…",
        [("a quarter", "Only one stage computes at a time: each waits for the previous one's activation, "
                       "and in backward for the next one's gradient."),
         "the same, plus the transfers",
         ("half", "There is no overlap at all between stages in the naive split."),
         ("four times longer", "Every stage does a quarter of the work; it just does it alone.")],
        answer="the same, plus the transfers",
        explain="The stages run one after another, so the step is the sum of their compute plus the activation "
                "and gradient transfers: the utilization of each GPU is about 1/4.")


def boundary_bytes():
    """In the lesson."""
    return quiz.number(
        "Two stages exchange activations of a batch of 1,024 rows × 8,192 features in bf16. "
        "How many MiB cross the boundary per training step, both directions together?",
        answer=32, unit="MiB", rel_tol=0.02,
        explain="1024 × 8192 × 2 bytes = 16 MiB forward, and its gradient, the same shape, back: 32 MiB.")
