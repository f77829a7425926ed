"""Lesson 02's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("02", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def server_bytes():
    """In the lab."""
    return quiz.number(
        "The model has 2,632 float32 parameters. In one synchronous round with 7 workers, how many "
        "bytes of gradients does the server receive?",
        answer=7 * 4 * 2632, unit="bytes", rel_tol=0.01,
        explain="Each worker pushes 4 × 2,632 = 10,528 bytes per round, whatever the number of "
                "workers. The server receives all 7 pushes: 73,696 bytes, 7× a worker's traffic, "
                "and it sends as much again when the workers pull. Its link is the bottleneck.",
        hint="One push is one whole gradient.")


def ring_bytes_at_scale():
    """In the lab."""
    return quiz.choice(
        "On 8 ranks, your ring sends 2(p-1)/p·n = 1.75n bytes per rank. How much would it send on "
        "1,024 ranks?",
        ["about 1.75n", "about 2n", ("about 256n", "Count the chunks: 2(p-1) of n/p each."),
         ("about 1,023n", "That's what rank 0 of the naive all-reduce sends.")],
        answer="about 2n",
        explain="2·1,023/1,024·n ≈ 1.998n. The bytes per rank hardly grow with p, which is why ring "
                "is bandwidth-optimal. What grows is the number of steps, 2(p-1) = 2,046 "
                "latencies.")
