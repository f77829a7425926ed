"""Lesson 07's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("07", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def fsdp_bytes_per_step():
    """In the lesson."""
    return quiz.number(
        "A 1.3B-parameter model trains with FSDP2 (ZeRO-3, bf16 all-gathers and bf16 reduce-scatter) on a very "
        "large number of GPUs. About how many GB does each GPU send per step (take (N-1)/N = 1)?",
        answer=3 * 1.3e9 * 2 / 1e9, unit="GB", rel_tol=0.05,
        hint="ZeRO-3 moves 3Ψ values per GPU per step: forward all-gather, backward all-gather, reduce-scatter.",
        explain="3 · 1.3e9 values · 2 bytes = 7.8 GB per GPU per step, whatever N_d. Stages 0-2 would send 2Ψ: 5.2 GB.")


def reshard_after_forward():
    """In the lesson."""
    return quiz.choice(
        "Switching FSDP2 from reshard_after_forward=True to False: what changes?",
        [("optimizer state per GPU doubles", "The optimizer state stays sharded in both."),
         "the backward skips one all-gather per layer, and the whole gathered model stays in memory from forward to backward",
         ("gradients are all-reduced instead of reduce-scattered", "Both reduce-scatter."),
         ("nothing: it only affects checkpoints", "Section 4 measured the difference in memory and collectives.")],
        answer="the backward skips one all-gather per layer, and the whole gathered model stays in memory from forward to backward",
        explain="It is ZeRO-2's trade: 2Ψ instead of 3Ψ communication for 2Ψ bytes of gathered parameters.")


def zero2_model_states():
    """In the lab."""
    return quiz.number(
        "Ψ = 1.5B parameters, N_d = 8 GPUs, K = 12, ZeRO stage 2 (optimizer state and gradients "
        "sharded): how many GB of model states does each GPU hold?",
        answer=5.625, unit="GB", rel_tol=0.01,
        explain="2Ψ + (2 + 12)Ψ/8 = 3 GB + 21/8 GB = 3 + 2.625 = 5.625 GB: the fp16 parameters, "
                "kept whole on every GPU, are more than half of it. Stage 3 shards them too: "
                "16 × 1.5/8 = 3 GB.",
        hint="Which of the three terms are divided by 8 at stage 2? 1 GB = 1e9 bytes.")
