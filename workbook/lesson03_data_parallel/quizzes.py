"""Lesson 03's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("03", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def no_sync():
    """In the lesson."""
    return quiz.choice(
        "A DDP job accumulates 4 micro-batches per optimizer step, the first 3 under model.no_sync(). "
        "Compared with running all 4 outside no_sync, what does no_sync save?",
        [("the memory of the gradients", "The gradients are accumulated in .grad, full size, either way (section 5)."),
         "the all-reduces of the first 3 micro-batches",
         ("the activation memory", "That's micro-batching, with or without no_sync."),
         ("forward and backward compute", "Every micro-batch still runs forward and backward.")],
        answer="the all-reduces of the first 3 micro-batches",
        explain="Inside no_sync DDP's reducer does nothing: gradients add up locally and the last backward "
                "all-reduces the sum. Section 5 measured 16 all-reduces without it and 4 with it, the same memory.")


def allreduce_time():
    """In the lab."""
    return quiz.number(
        "ResNet-50's float32 gradients, 102.2 MB, are all-reduced as one bucket on one DGX A100 "
        "node (8 GPUs, bus bandwidth 235 GB/s). How long does that all-reduce take, in ms?",
        answer=2 * 7 / 8 * 102.2e6 / 235e9 * 1e3, unit="ms", rel_tol=0.1,
        explain="T ≈ 2(p-1)/p · n / busbw = 1.75 × 102.2 MB / 235 GB/s = 0.76 ms. At this size the "
                "latency terms hardly count: the bytes do. The cell below measures it.",
        hint="Bytes through each GPU's link: 2(p-1)/p · n; divide by the bus bandwidth.")
