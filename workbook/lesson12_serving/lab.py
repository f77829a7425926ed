"""What lab 12's cells use besides :mod:`simcluster.serving`: the model, the cluster and
the traffic of the fleet-sizing exercise. No answers here."""

import simcluster as sc
from simcluster import planner, serving

OPT_13B = planner.TransformerConfig(layers=40, hidden=5120, heads=40, seq_len=2048,
                                    vocab=50272)
LLAMA2_70B = planner.TransformerConfig(layers=80, hidden=8192, heads=64, kv_heads=8,
                                       ffn_hidden=28672, seq_len=4096, vocab=32000,
                                       swiglu=True, tied_embeddings=False)
# 20 heads: tp=8 does not divide them (the vocabulary padded to a multiple of 64)
GPT2_LARGE = planner.TransformerConfig(layers=36, hidden=1280, heads=20, seq_len=1024,
                                       vocab=50304)


def node():
    """One DGX A100: 8 A100-80GB on NVSwitch."""
    return sc.Cluster.preset("dgx-a100")


def traffic(rate, n=300, seed=0):
    """Poisson requests at ``rate`` per second: 512-token prompts, 32 to 128 output
    tokens."""
    return serving.poisson(rate=rate, n=n, prompt_tokens=512, output_tokens=[32, 64, 128],
                           seed=seed)
