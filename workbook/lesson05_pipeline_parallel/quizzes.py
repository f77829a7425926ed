"""Lesson 05's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("05", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def gpipe_to_1f1b():
    """In the lesson."""
    return quiz.choice(
        "Same model, same p = 8 stages, same m = 32 micro-batches: you switch from GPipe to 1F1B. What changes?",
        [("the bubble gets smaller", "Both fill and drain the pipe once per step: section 5 measured the same bubble."),
         "the activations a stage holds: at most p micro-batches instead of m",
         ("fewer messages between stages", "Every micro-batch still crosses every boundary twice."),
         ("the gradients", "Both compute exactly the gradient of the whole batch.")],
        answer="the activations a stage holds: at most p micro-batches instead of m",
        explain="1F1B starts each micro-batch's backward as soon as its forward has left the last stage, "
                "so stage s holds at most p - s of them; GPipe holds all m until the backward phase.")


def unequal_stage_bubble():
    """In the lesson."""
    return quiz.number(
        "4 stages with GPipe and m = 8 micro-batches; one stage takes 1.5 times as long as each of the "
        "other three. What fraction of the wall time is bubble (averaged over the stages)?",
        answer=40, unit="%", rel_tol=0.03,
        explain="The step takes Σt + (m − 1)·max t = 4.5 + 7 × 1.5 = 15 units per phase; the stages compute "
                "8 × 4.5 / 4 = 9 on average: 1 − 9/15 = 40 %, against 27 % for equal stages.")


def interleaved_bubble():
    """In the lab."""
    return quiz.number(
        "Interleaved 1F1B with p = 8 GPUs, m = 16 micro-batches and v = 4 chunks per GPU: "
        "what percentage of the wall time is bubble?",
        answer=100 * 7 / (4 * 16 + 7), unit="%", rel_tol=0.03,
        explain="Each GPU computes v·m = 64 chunk slots and waits 7 chunk slots while the "
                "pipeline fills and drains: 7 of 71 slots, 9.9 % of the wall time (without "
                "interleaving, 7 of 23 slots: 30 %).",
        hint="Count chunk slots: how many does each GPU compute, and how many does it wait?")
