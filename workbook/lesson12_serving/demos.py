"""What lesson 12 measures: a decode step executed on the simulated cluster, and the
small tables and plots the lesson prints from :mod:`simcluster.serving`.

:func:`decode_step` is one decode iteration of a GPT as a serving engine runs it: every
layer reads its KV cache (``context`` tokens per sequence, already there, as vLLM's
paged cache holds it) and adds one token per sequence; tensor parallelism with
DTensor's ``parallelize_module`` (Megatron's column/row split, one all-reduce after the
attention and one after the MLP). On fake tensors a 13-billion-parameter model runs on a
laptop; :func:`measure_decode` returns the simulated seconds of one step, which
``tests/test_serving.py`` compares with :func:`simcluster.serving.decode_time`.
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate
from torch.distributed.tensor.parallel import (ColwiseParallel, RowwiseParallel,
                                               parallelize_module)

import simcluster as sc
from simcluster import planner, serving


class DecodeLayer(nn.Module):
    """One GPT layer (pre-LayerNorm, GeLU MLP) for decode: attention of each new token
    over the cached keys and values it is given."""

    def __init__(self, hidden, heads, ffn, dtype):
        super().__init__()
        self.head_dim = hidden // heads
        self.norm1 = nn.LayerNorm(hidden, dtype=dtype)
        self.qkv = nn.Linear(hidden, 3 * hidden, dtype=dtype)
        self.out = nn.Linear(hidden, hidden, dtype=dtype)
        self.norm2 = nn.LayerNorm(hidden, dtype=dtype)
        self.up = nn.Linear(hidden, ffn, dtype=dtype)
        self.down = nn.Linear(ffn, hidden, dtype=dtype)

    def forward(self, x, k_cache, v_cache):
        b = x.shape[0]
        # on a tensor-parallel rank qkv holds its own heads: 3 * heads/t * head_dim columns
        q = self.qkv(self.norm1(x)).view(b, 3, -1, self.head_dim)[:, 0].unsqueeze(2)
        scores = torch.matmul(q, k_cache.transpose(-1, -2)) / self.head_dim ** 0.5
        context = torch.matmul(torch.softmax(scores, dim=-1), v_cache)   # (b, h/t, 1, d)
        x = x + self.out(context.reshape(b, -1))
        return x + self.down(F.gelu(self.up(self.norm2(x))))


def _plan():
    return {"qkv": ColwiseParallel(), "out": RowwiseParallel(),
            "up": ColwiseParallel(), "down": RowwiseParallel()}


def decode_step(cfg, batch, context, tp, dtype=torch.float16):
    """Run on every rank of a ``cluster.run``: build ``cfg`` (a GPT
    :class:`~simcluster.planner.TransformerConfig`) on fake tensors, split over the
    ``tp`` ranks, and run one decode step of ``batch`` sequences with ``context`` cached
    tokens each. Returns the simulated seconds of the step on this rank."""
    mesh = init_device_mesh("cpu", (tp,))
    heads = cfg.heads // tp
    with sc.fake_tensors():
        layers = [DecodeLayer(cfg.hidden, cfg.heads, cfg.ffn, dtype)
                  for _ in range(cfg.layers)]
        for layer in layers:
            parallelize_module(layer, mesh, _plan())
        embedding = nn.Embedding(cfg.vocab, cfg.hidden, dtype=dtype)
        head = nn.Linear(cfg.hidden, cfg.vocab, bias=False, dtype=dtype)
        parallelize_module(head, mesh, ColwiseParallel(output_layouts=Replicate()))
        caches = [(torch.empty(batch, heads, context, cfg.head_dim, dtype=dtype),
                   torch.empty(batch, heads, context, cfg.head_dim, dtype=dtype))
                  for _ in range(cfg.layers)]
        # the embedding lookup reads `batch` rows of the table; the simulator charges an
        # op for all its inputs (the whole table), so it stays outside the timed step
        x = embedding(torch.zeros(batch, dtype=torch.long))
        dist.barrier()
        start = sc.now()
        for layer, (k, v) in zip(layers, caches):
            x = layer(x, k, v)
        torch.argmax(head(x), dim=-1)    # greedy sampling reads the gathered logits
        dist.barrier()
        return sc.now() - start


def measure_decode(cluster, cfg, batch, context, tp):
    """Simulated seconds of one decode step (:func:`decode_step`) on ``tp`` GPUs of
    ``cluster``: the slowest rank's."""
    run = cluster.run(decode_step, world_size=tp, args=(cfg, batch, context, tp))
    return max(run.results)


def opt_13b(layers=40):
    """OPT-13B's shape (Zhang et al. 2022): 40 layers, hidden 5,120, 40 heads, vocabulary
    50,272, 2,048 positions; ``layers`` fewer for a quicker measurement."""
    return planner.TransformerConfig(layers=layers, hidden=5120, heads=40, seq_len=2048,
                                     vocab=50272)


# ------------------------------------------------------------------ the lesson's tables
def roofline_rows(cluster, cfg, batches=(1, 64, 4096), context=16):
    """One decode step of ``batch`` sequences (``batch`` new tokens) executed on
    ``cluster`` (one GPU, fake tensors) beside :func:`simcluster.serving.decode_time` at
    the device's peaks: ``[{"tokens", "measured", "predicted", "intensity", "bound"}]``.
    Arithmetic intensity is the weight GEMMs' FLOPs per byte they move."""
    device = cluster.spec.device_of(0)
    ridge = device.flops_for(torch.float16) / device.hbm_bandwidth
    rows = []
    for batch in batches:
        measured = measure_decode(cluster, cfg, batch, context, 1)
        predicted = serving.decode_time(cfg, cluster, batch, context,
                                        efficiency=planner.ROOFLINE)
        weights = cfg.layer_matmul_parameters()
        intensity = 2 * batch * weights / (2 * weights + 2 * 2 * batch * (cfg.hidden * 4
                                                                          + cfg.ffn * 2))
        rows.append({"tokens": batch, "measured": measured, "predicted": predicted,
                     "intensity": intensity,
                     "bound": "HBM" if intensity < ridge else "FLOP/s"})
    return rows, ridge


def load_sweep(cluster, cfg, rates, batching, n=600, seed=0, **deployment):
    """p50 and p99 of TTFT and latency at each Poisson rate, for one batching policy:
    ``{rate: {"ttft50", "ttft99", "lat50", "lat99", "throughput", "in_system", "little"}}``
    (``in_system``: the time-average number of requests in the system, sampled;
    ``little``: throughput x mean latency)."""
    out = {}
    for rate in rates:
        requests = serving.poisson(rate=rate, n=n, output_tokens=[32, 64, 128], seed=seed)
        res = serving.simulate(requests, serving.Deployment(cluster, cfg, batching=batching,
                                                            **deployment))
        start, end = requests[0].arrival, max(res.finish)
        grid = [start + (end - start) * (i + 0.5) / 4000 for i in range(4000)]
        out[rate] = {"ttft50": res.percentile("ttft", 50), "ttft99": res.percentile("ttft", 99),
                     "lat50": res.percentile("latency", 50),
                     "lat99": res.percentile("latency", 99),
                     "throughput": res.throughput,
                     "in_system": sum(res.in_system(grid)) / len(grid),
                     "little": res.throughput * res.mean("latency")}
    return out


def disaggregated(requests, cluster, cfg, prefill=1, decode=1, tp=1):
    """Serve ``requests`` DistServe-style: ``prefill`` replicas only prefill (each request
    asks them for one token), then each request's KV cache crosses NVLink to one of
    ``decode`` replicas, which only decode. Returns ``(ttft, tpot)`` per request."""
    first = serving.simulate([serving.Request(r.arrival, r.prompt_tokens, 1)
                              for r in requests],
                             serving.Deployment(cluster, cfg, replicas=prefill, tp=tp))
    link = cluster.spec.nodes[0].fabric
    handed = []
    for i, r in enumerate(requests):
        kv = serving.kv_bytes_per_token(cfg) * r.prompt_tokens
        at = first.finish[i] + link.latency + kv / link.effective_bandwidth
        handed.append((at, i))
    handed.sort()
    second = serving.simulate(
        [serving.Request(at, requests[i].prompt_tokens, requests[i].output_tokens,
                         prefilled=True) for at, i in handed],
        serving.Deployment(cluster, cfg, replicas=decode, tp=tp,
                           load_balancer="least_outstanding"))
    tpot = [0.0] * len(requests)
    for j, (at, i) in enumerate(handed):
        tpot[i] = (second.finish[j] - at) / max(requests[i].output_tokens - 1, 1)
    return first.ttft, tpot


def percentile(values, q):
    """The ``q``-th percentile of ``values`` (linear interpolation, numpy's default)."""
    values = sorted(values)
    pos = (len(values) - 1) * q / 100
    low = int(pos)
    high = min(low + 1, len(values) - 1)
    return values[low] + (values[high] - values[low]) * (pos - low)


def cost_per_million_tokens(result, gpus, dollars_per_gpu_hour):
    """Dollars per million output tokens: the GPUs' hours over the run's duration,
    divided by the output tokens served."""
    return gpus * dollars_per_gpu_hour * result.duration / 3600 / (
        sum(r.output_tokens for r in result.requests) / 1e6)
