"""Lesson 13's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("13", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def job_mtbf():
    """In the lesson."""
    return quiz.number(
        "Nodes fail independently, each at 2 % a day. What is the mean time between failures, "
        "in hours, of a job that runs on 16 nodes?",
        answer=24 / (16 * 0.02), unit="h", rel_tol=0.02,
        hint="Any node stops the gang: the rates add up.",
        explain="16 × 0.02 = 0.32 failures a day, so one every 24 / 0.32 = 75 hours.")


def young_interval():
    """In the lesson."""
    return quiz.number(
        "A checkpoint takes 18 s to write and the job's MTBF is 25 hours. About how many "
        "minutes should it train between checkpoints (Young's formula)?",
        answer=(2 * 18 * 25 * 3600) ** 0.5 / 60, unit="min", rel_tol=0.05,
        hint="τ = √(2δM), in the same unit.",
        explain="√(2 × 18 s × 90,000 s) = 1,800 s = 30 minutes.")


def mcp_protocol():
    """In the lesson."""
    return quiz.choice(
        "An article names \"MCP\", a Google Brain communication protocol of 2019 with an "
        "OSDI'20 paper. What should you say in an interview?",
        [("Describe MCP's design", "There is nothing to describe: no such protocol or paper "
                                   "exists."),
         "Say you do not know it, and name the real systems: parameter servers (OSDI'14), "
         "Horovod, NCCL, BytePS (OSDI'20)",
         ("Say it is the Model Context Protocol", "That is Anthropic's 2024 protocol for "
                                                  "connecting LLM apps to tools, unrelated to "
                                                  "training.")],
        answer="Say you do not know it, and name the real systems: parameter servers (OSDI'14), "
               "Horovod, NCCL, BytePS (OSDI'20)",
        explain="Interviewers test for bluffing too. OSDI'20 did publish BytePS (a unified "
                "architecture for accelerating distributed DNN training), which is the closest "
                "real thing.")


def spares_or_idle():
    """In the lab."""
    return quiz.choice(
        "100 runs of 8 nodes share 1,000 nodes, and nodes fail at 5 % a day. What do 50 hot "
        "spares held outside the scheduler buy, compared with leaving those 50 nodes in the pool?",
        [("Nothing: idle nodes in the pool already replace failed ones", "Partly true: a "
         "failed run restarts on idle nodes too. But a spare also replaces the failed node "
         "itself within minutes, so the pool does not shrink while it is repaired."),
         "A failed node's place is filled in minutes, so the pool keeps its size during the "
         "hours of repair",
         ("Fewer failures", "Spares fail like any node; they change what a failure costs, "
                            "not how often it happens.")],
        answer="A failed node's place is filled in minutes, so the pool keeps its size during "
               "the hours of repair",
        explain="With 200 nodes idle anyway (800 busy) the day's result hardly changes: the "
                "idle nodes absorb the failures. Spares matter when the runs fill the pool — "
                "the lesson's 10-node runs with none missed the day.")
