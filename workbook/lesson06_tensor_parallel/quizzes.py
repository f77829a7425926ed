"""Lesson 06's quizzes, kept out of the notebooks so that a learner sees neither the
answer nor its explanation before answering.

A notebook cell asks one with ``quiz.ask("06", "<name>")``; each function here builds a
fresh question (see :mod:`workbook.quiz`).
"""

from workbook import quiz


def column_then_row():
    """In the lesson."""
    return quiz.choice(
        "In the Megatron MLP, the first linear layer is split by columns and the second by rows. "
        "Why not split the first one by rows too?",
        [("it would need more memory", "Either split stores 1/t of the weight."),
         "GeLU is not linear: a row split leaves partial sums that must be all-reduced before GeLU",
         ("column splits are faster to compute", "Both do 1/t of the FLOPs."),
         ("row-parallel layers cannot have a bias", "They can: add it once, after the all-reduce.")],
        answer="GeLU is not linear: a row split leaves partial sums that must be all-reduced before GeLU",
        explain="GeLU(x₀A₀ + x₁A₁) ≠ GeLU(x₀A₀) + GeLU(x₁A₁). A column split gives each rank whole output "
                "features, so GeLU runs locally; the row split of the second layer then needs one all-reduce, "
                "the only one of the forward (section 2 counted it).")


def tp_bytes_per_layer():
    """In the lesson."""
    return quiz.number(
        "A GPT-3 layer (b=1, s=2048, h=12288) runs with t=8 tensor parallelism and bf16 activations. "
        "How many MiB does each GPU send per layer, forward and backward together?",
        answer=8 * 1 * 2048 * 12288 * 7 / 8 * 2 / 2**20, unit="MiB", rel_tol=0.02,
        hint="8·b·s·h·(t−1)/t elements, 2 bytes each.",
        explain="8 · 2048 · 12288 · 7/8 · 2 bytes = 336 MiB: four ring all-reduces of 48 MiB, "
                "each sending 2·(7/8)·48 MiB from every GPU. Sequence parallelism sends the same.")


def activation_memory():
    """In the lab."""
    s, b, h, a, t = 2048, 4, 6144, 64, 8
    attention = 5 * a * s / (h * t)      # the attention scores' share, 13.3 here
    return quiz.Quiz([
        quiz.number(
            "Activation memory of one layer of the 22B GPT per GPU, with tensor parallelism "
            "alone (t = 8), in MB?", answer=s * b * h * (10 + 24 / t + attention) / 1e6,
            unit="MB", rel_tol=0.02,
            explain="sbh = 2048 × 4 × 6144 = 50.3 M; 10 + 24/8 + 13.33 = 26.33 bytes per "
                    "element: 1,325 MB. The 10·sbh of LayerNorm and dropout (503 MB) are 38 % of "
                    "it, and t does not touch them.",
            hint="5as/(ht) = 5 × 64 × 2048 / (6144 × 8) = 13.33."),
        quiz.number(
            "And with sequence parallelism added, in MB?",
            answer=s * b * h * (34 / t + attention) / 1e6, unit="MB", rel_tol=0.02,
            explain="34/8 + 13.33 = 17.58 bytes per element: 885 MB, a third less. Over the "
                    "model's 48 layers that is 21 GB per GPU, for no more communication than the "
                    "all-reduces it replaces.",
            hint="Every term is now divided by t: 34/8 + 13.33."),
    ], title="Activation memory per layer")
