"""Lesson 08's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("08", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz
from workbook.lesson08_memory_and_precision import demos as P


def activation_bytes():
    """In the lesson."""
    return quiz.number(
        "A GPT layer with s = 2048, b = 4, h = 4096 and a = 32 heads keeps 16-bit activations. "
        "How many GiB does it keep for its backward without recomputation (Korthikanti et al.)?",
        answer=P.korthikanti_bytes(2048, 4, 4096, 32) / 2**30, unit="GiB", rel_tol=0.03,
        hint="sbh(34 + 5as/h) bytes; s·b·h = 2048·4·4096.",
        explain="sbh = 33.5 M; 34 + 5·32·2048/4096 = 34 + 80 = 114 bytes per element: 3.56 GiB. "
                "With selective recomputation 34·sbh = 1.06 GiB, with full recomputation 2·sbh = 0.06 GiB.")


def accumulation_shrinks():
    """In the lesson."""
    return quiz.choice(
        "Gradient accumulation over N micro-batches, same global batch. What shrinks about N-fold?",
        [("the optimizer state", "Adam's state belongs to the parameters; the micro-batch does not change it."),
         "the activations kept for the backward",
         ("the time per optimizer step", "The same samples are computed; section 4 measured the time."),
         ("the gradients", "One gradient per parameter, accumulated over the micro-batches.")],
        answer="the activations kept for the backward",
        explain="Activations scale with the micro-batch; parameters, gradients and optimizer state do not, "
                "and the compute per optimizer step stays the same.")


def bytes_per_parameter():
    """In the lab."""
    return quiz.number(
        "bfloat16 weights and gradients, fp32 master weights, SGD with momentum (its momentum "
        "in fp32, as the master weights): how many bytes per parameter does the GPU hold "
        "between steps?",
        answer=12, unit="bytes", rel_tol=0.01,
        explain="2 (bf16 weight) + 2 (bf16 gradient) + 4 (fp32 master) + 4 (fp32 momentum) = "
                "12 bytes: exactly what plain fp32 with momentum holds (4 + 4 + 4). Mixed "
                "precision saves activation memory and time, not model state.",
        hint="Count four tensors per parameter, each in its own dtype.")
