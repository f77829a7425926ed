"""Lesson 09's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("09", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def node_crossing():
    """In the lesson."""
    return quiz.choice(
        "On DGX nodes of 8 GPUs, a 3D layout has tp=8, pp=4, dp=16. Which groups cross "
        "node boundaries?",
        [("the TP groups", "tp=8 fills a node: its 4 all-reduces per layer stay on NVLink."),
         "the DP and PP groups, never the TP groups",
         ("all three", "Only if the mesh puts TP outermost, the placement section 4 measured."),
         ("none", "512 GPUs are 64 nodes: something must cross.")],
        answer="the DP and PP groups, never the TP groups",
        explain="Megatron's rule: TP inside the node (its communication is on the critical path "
                "and large), PP across nodes (small point-to-point messages), DP across the rest "
                "(one reduction per step, overlapped or after the flush).")


def bubble_fraction():
    """In the lesson."""
    return quiz.number(
        "The 39.1 B model runs with tp=8, pp=2, dp=32 and 1,536 sequences per step, micro-batch 4. "
        "What fraction of the ideal time does the 1F1B bubble add, (p-1)/m?",
        answer=(2 - 1) / (1536 / 32 / 4), unit="", rel_tol=0.02,
        hint="m = sequences per replica / micro-batch size.",
        explain="m = 1536/32/4 = 12 micro-batches, (2-1)/12 = 0.083: 8 % on top of the compute.")


def bubble_when_scaling_out():
    """In the lab."""
    return quiz.number(
        "1,024 GPUs run (t, p, d) = (8, 16, 8) with B = 1,024 sequences and micro-batches of "
        "b = 1: each pipeline runs m = 1,024/8 = 128 micro-batches, and its bubble is 15/128 = "
        "11.7 % of the ideal step. The same job is scaled out to 2,048 GPUs by doubling d, with "
        "the same global batch. What is the bubble now, in % of the ideal step (no interleaving)?",
        answer=23.4375, unit="%", rel_tol=0.02,
        explain="d = 16 replicas share B = 1,024: m = 1,024/16 = 64 micro-batches per pipeline, "
                "and (p − 1)/m = 15/64 = 23.4 %. Twice the GPUs do not halve the step: the "
                "compute per GPU halves, the bubble per GPU does not. Larger batches, "
                "interleaving (v chunks divide it by v) or a shorter pipeline win it back.",
        hint="How many micro-batches does each pipeline get when 16 replicas share the batch?")
