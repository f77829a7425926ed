"""Lesson 11's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("11", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def check_yourself():
    """In the lesson."""
    return quiz.Quiz([
        quiz.choice("Which placement rule leaves the most whole nodes free for big gangs?",
                    [("first fit", "It takes the lowest-numbered nodes, full or not."),
                     "best fit",
                     ("spread", "It does the opposite: every job on the emptiest node."),
                     ("random", "Random fragments as much as spread.")],
                    answer="best fit",
                    explain="Best fit puts a job where the fewest free GPUs are left, so small "
                            "jobs fill partial nodes and empty nodes stay empty (Kubernetes' "
                            "MostAllocated, once nvidia.com/gpu is among its scored resources: "
                            "by default it scores only CPU and memory)."),
        quiz.choice("EASY backfill starts a later job early only if ...",
                    ["it does not delay the reservation of the job at the head of the queue",
                     ("it is shorter than the head", "Length alone is not the rule: a long job "
                      "may start if it leaves the head room at its reserved time."),
                     ("it has a higher priority", "That is a priority queue, not backfill.")],
                    answer="it does not delay the reservation of the job at the head of the queue",
                    explain="It must end before the head's reserved start, or leave the head enough "
                            "GPUs at that time."),
        quiz.number("A pipeline of 3 stages taking 2, 5 and 3 days one after another is overlapped on "
                    "the same nodes. At most how many times faster can it get?",
                    answer=10 / 5, unit="x", rel_tol=0.02,
                    explain="(2 + 5 + 3) / 5 = 2: the slowest stage sets the pace."),
    ], title="Check yourself")
