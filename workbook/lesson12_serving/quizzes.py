"""Lesson 12's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("12", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def kv_bytes_per_token():
    """In the lesson."""
    return quiz.number(
        "A model has 32 layers, 8 KV heads of dimension 128, and keeps its KV cache in bf16. "
        "How many KiB does one token of context take?",
        answer=2 * 32 * 8 * 128 * 2 / 1024, unit="KiB", rel_tol=0.01,
        hint="2 · layers · kv_heads · head_dim · bytes.",
        explain="2 · 32 · 8 · 128 · 2 = 131,072 bytes = 128 KiB (LLaMA-3-8B's shape).")


def decode_batch_step():
    """In the lesson."""
    return quiz.choice(
        "A decode step of a 13B model at batch 1 takes 17 ms on an A100. Roughly how long does the same step take at batch 16?",
        [("16 × 17 ms = 272 ms", "That would be true if the step were compute-bound; it is not."),
         "a little more than 17 ms",
         ("17 / 16 ms", "The weights must still be read once per step.")],
        answer="a little more than 17 ms",
        explain="The step reads every weight once whatever the batch (≈ 26 GB); 16 tokens add "
                "little compute and a little KV-cache reading. Section 1.1 measured it.")


def littles_law():
    """In the lesson."""
    return quiz.number(
        "A service handles 40 requests/s with a mean latency of 2.5 s. How many requests are in it on average?",
        answer=100, rel_tol=0.01, hint="Little's law.", explain="L = λW = 40 × 2.5 = 100.")


def replicas_needed():
    """In the lab."""
    return quiz.number(
        "One replica at tp=1 meets your TPOT SLO only up to 6 requests/s; the load is 20 requests/s. "
        "At least how many replicas do you need, before any headroom?",
        answer=4, rel_tol=0.0, abs_tol=0.0, hint="ceil(load / per-replica capacity).",
        explain="ceil(20 / 6) = 4 replicas — then check p99 with the simulator: queues at 83 % "
                "load may still break a TTFT SLO, and bursts need headroom.")
