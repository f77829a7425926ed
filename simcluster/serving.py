"""Serving a model: prefill and decode costs, batching, replicas and autoscaling.

    from simcluster import serving, planner
    cfg = planner.TransformerConfig(layers=40, hidden=5120, heads=40, seq_len=2048,
                                    vocab=50272)                        # OPT-13B-like
    serving.kv_bytes_per_token(cfg, dtype="fp16")      # 2 * layers * kv_heads * head_dim * 2
    serving.prefill_time(cfg, cluster, tokens=512)     # seconds
    serving.decode_time(cfg, cluster, batch=8, context=512)
    requests = serving.poisson(rate=5.0, n=2000, prompt_tokens=512, output_tokens=64)
    dep = serving.Deployment(cluster, cfg, replicas=2, batching="continuous")
    res = serving.simulate(requests, dep)
    res.ttft, res.tpot, res.latency, res.percentile("ttft", 99), res.goodput(ttft=0.5)

**Costs.** One forward pass over ``n`` new tokens costs, per layer, the four weight GEMMs
(QKV, output projection, the MLP's two or three), the attention, the memory-bound
kernels and, with tensor parallelism, two all-reduces of the activations -- each GEMM a
roofline on the device of ``spec.py`` with the planner's efficiencies
(:class:`simcluster.planner.Efficiency`, the same ``_Device`` the planner uses) and each
all-reduce NCCL's model in ``costmodel.py``: one source of truth for training, planning
and serving. Prefill runs the prompt's tokens at once (compute-bound: every weight is
used by hundreds of tokens); a decode step runs one token per sequence, so at small
batches it reads every weight once per token and waits on HBM; its attention reads each
sequence's KV cache (``2 * layers * kv_heads * head_dim`` values per token). Attention is
FlashAttention's: causal, no score matrix written to memory. Not modelled: kernel launch
gaps (CUDA graphs remove most of them in decode), sampling, the host.

**The engine** is a discrete-event simulation, deterministic, in pure Python. Requests
reach a load balancer (round robin, or the replica with the fewest outstanding requests)
and queue at a replica, which batches them:

* ``"none"``: one request at a time, prefill then every decode step;
* ``"dynamic"``: Triton's dynamic batcher in front of a static-batching engine: up to
  ``max_batch`` requests, waiting at most ``max_queue_delay`` for the batch to fill;
  the batch runs to its longest request (finished sequences keep their slot) and
  reserves KV cache for every prompt and output token at once;
* ``"continuous"``: vLLM's scheduler (V0, no chunked prefill): at every iteration,
  admit waiting requests while the sequences stay within ``max_num_seqs``, the prompt
  tokens within ``max_num_batched_tokens`` and the free KV blocks (``block_size``
  tokens each) above a 1 % watermark, and run their prefill; otherwise one decode step
  of every running sequence, allocating blocks as they fill and, when none is left,
  preempting the latest admitted sequence (freed, recomputed later: vLLM's default).

A decode run between two events (an arrival, a sequence finishing, the cache filling)
is charged in closed form, so 100,000 requests take seconds (``benchmarks/
bench_serving.py``). An :class:`Autoscaler` follows Knative's KPA; a replica it adds
serves after a cold start: the weights read from the node's NVMe and copied over PCIe.
Also a CNN (:class:`Model`, FLOPs and bytes per sample) can be served, without
continuous batching. Reference numbers: ``docs/reference-numbers.md#serving``;
``docs/serving.md`` explains the model and its validation.
"""

import bisect
import heapq
import math
import random
from collections import deque
from dataclasses import dataclass, field

from . import planner as _planner
from . import spec as _spec

BATCHING = ("none", "dynamic", "continuous")
LOAD_BALANCERS = ("round_robin", "least_outstanding")
# vLLM's defaults (vllm/config.py, V0): a block holds 16 tokens; the scheduler keeps 1 %
# of the blocks free when it admits a prompt; 90 % of the GPU memory is vLLM's.
BLOCK_SIZE = 16
WATERMARK = 0.01
GPU_MEMORY_UTILIZATION = 0.90
# Activation memory a forward of max_num_batched_tokens tokens holds at its peak (the
# margin vLLM's profiling run finds): the residual stream and one MLP activation, in and
# out, per token -- 2 * (hidden + ffn / tp) values. A stated margin, not a measurement.
ACTIVATION_VALUES_PER_TOKEN = 2


# ------------------------------------------------------------------ models
@dataclass(frozen=True)
class Model:
    """A model served one forward per request (a CNN: the ResNet-50 of an article):
    ``flops`` and ``bytes`` (activations read and written) per sample, ``weight_bytes``
    (read once per batch). No decode, no KV cache: ``"none"`` and ``"dynamic"`` batching.
    """

    name: str
    flops: float
    bytes: float
    weight_bytes: float

    def __post_init__(self):
        for what in ("flops", "bytes", "weight_bytes"):
            value = getattr(self, what)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or value < 0 \
                    or not math.isfinite(value):
                raise ValueError(f"Model.{what} must be a non-negative number, got {value!r}")
        # a forward that costs nothing would finish every request at its arrival (and
        # every rate over a zero duration would divide by zero)
        if not self.flops > 0:
            raise ValueError(f"Model.flops must be positive: a forward pass computes "
                             f"something, got {self.flops!r}")


# ResNet-50 at 224 x 224: 4.1 G multiply-adds (He et al. 2016, Table 1) = 8.2 GFLOPs;
# 25.6 M parameters; ~11 M activation values written by its 53 convolutions, batch norms
# and ReLUs (fused by TensorRT), read once and written once in 16 bits: ~45 MB.
RESNET50 = Model("ResNet-50", flops=8.2e9, bytes=45e6, weight_bytes=25.6e6 * 2)


def _check_model(model):
    if isinstance(model, (_planner.TransformerConfig, Model)):
        return model
    raise ValueError(f"model must be a planner.TransformerConfig or a serving.Model, "
                     f"got {model!r}")


def _dtype_bytes(dtype):
    return _planner.DTYPES[_planner._check_choice(dtype, tuple(_planner.DTYPES), "dtype")][1]


def kv_bytes_per_token(cfg, dtype="fp16", tp=1):
    """Bytes of KV cache one token of context takes: ``2 * layers * kv_heads * head_dim *
    bytes`` (a key and a value per layer and KV head), over ``tp`` GPUs (each holds
    ``kv_heads / tp`` heads; the value returned is one GPU's share)."""
    if not isinstance(cfg, _planner.TransformerConfig):
        raise ValueError(f"cfg must be a planner.TransformerConfig, got {cfg!r}")
    _planner._positive_int(tp, "tp")
    if cfg.kv % tp:
        raise ValueError(f"kv_heads={cfg.kv} is not divisible by tp={tp}")
    return 2 * cfg.layers * (cfg.kv // tp) * cfg.head_dim * _dtype_bytes(dtype)


def weight_bytes(model, dtype="fp16", tp=1):
    """Bytes of weights one GPU of a ``tp``-way tensor-parallel replica holds (the
    embedding and output layer vocabulary-parallel, as Megatron-LM and vLLM split them)."""
    if isinstance(model, Model):
        return model.weight_bytes / tp
    return _planner.parameter_count(model) * _dtype_bytes(dtype) / tp


# ------------------------------------------------------------------ costs
class _Costs:
    """Seconds of forward passes of one model on one replica (``tp`` GPUs of ``spec``),
    remembered by size: a simulation asks for the same batch sizes again and again."""

    def __init__(self, model, spec, tp, dtype, efficiency):
        self.model, self.spec, self.tp = model, spec, tp
        self.v = _dtype_bytes(dtype)
        self.dev = _planner._Device(spec.device_of(0), dtype, efficiency)
        self.collectives = _planner._costs_for(spec)
        self.ranks = tuple(range(tp))
        self._tokens = {}   # n -> seconds of everything but attention, for n tokens
        self._fixed = {}    # batch -> seconds of a decode step without its attention
        if isinstance(model, _planner.TransformerConfig):
            cfg, t, dev = model, tp, self.dev
            # decode attention: per context token and layer, read its K and V (memory)
            # and do 4 * hidden / t FLOPs (two products of one query row); both linear
            kv_read = 2 * cfg.kv * cfg.head_dim // t * self.v
            self.per_context_token = cfg.layers * max(4 * cfg.hidden / t / dev.flops,
                                                      kv_read / dev.hbm)

    def _all_reduce(self, nbytes):
        return self.collectives.collective("all_reduce", self.ranks, nbytes) \
            if self.tp > 1 else 0.0

    def tokens(self, n, logits):
        """Seconds of the layers' weight GEMMs, memory-bound kernels and TP all-reduces
        for ``n`` tokens, plus the output layer for ``logits`` of them."""
        key = (n, logits)
        seconds = self._tokens.get(key)
        if seconds is None:
            cfg, t, dev, v = self.model, self.tp, self.dev, self.v
            h, f, kv_dim = cfg.hidden, cfg.ffn, cfg.kv * cfg.head_dim
            gemms = (dev.gemm(n, (h + 2 * kv_dim) // t, h, value_bytes=v)
                     + dev.gemm(n, h, h // t, value_bytes=v)
                     + dev.gemm(n, (2 if cfg.swiglu else 1) * f // t, h, value_bytes=v)
                     + dev.gemm(n, h, f // t, value_bytes=v))
            # two norms (read, write), two residual adds (read 2, write 1), the MLP's
            # activation function (read, write; SwiGLU reads two)
            elementwise = dev.memory_bound(n * v * (10 * h + (3 if cfg.swiglu else 2) * f // t))
            layer = gemms + elementwise + 2 * self._all_reduce(n * h * v)
            head = 0.0
            if logits:
                head = dev.gemm(logits, cfg.vocab // t, h, value_bytes=v)
                if t > 1:  # each rank's slice of the vocabulary gathered for sampling
                    head += self.collectives.collective("all_gather", self.ranks,
                                                        logits * cfg.vocab * v)
            seconds = self._tokens[key] = cfg.layers * layer + head \
                + dev.memory_bound(2 * n * h * v)  # embedding lookup
        return seconds

    def prefill_attention(self, length):
        """Seconds of causal FlashAttention over a prompt of ``length`` tokens, all layers."""
        cfg, dev = self.model, self.dev
        heads = cfg.heads // self.tp
        flops = 2 * length * length * heads * cfg.head_dim  # half of 4 L^2 d: causal
        nbytes = length * self.v * (2 * heads + 2 * cfg.kv // self.tp) * cfg.head_dim
        return cfg.layers * max(flops / dev.flops, nbytes / dev.hbm)

    def prefill(self, lengths):
        """Seconds of one prefill iteration over prompts of ``lengths`` tokens."""
        return (self.tokens(sum(lengths), len(lengths))
                + sum(self.prefill_attention(n) for n in lengths))

    def decode_fixed(self, batch):
        """Seconds of a decode step of ``batch`` sequences, without reading their KV
        cache (add ``per_context_token`` per token of context)."""
        seconds = self._fixed.get(batch)
        if seconds is None:
            seconds = self._fixed[batch] = self.tokens(batch, batch)
        return seconds

    def cnn(self, batch):
        """Seconds of one forward of a :class:`Model` over ``batch`` samples."""
        m, dev = self.model, self.dev
        return max(batch * m.flops / dev.flops,
                   (m.weight_bytes / self.tp + batch * m.bytes) / dev.hbm)


def _spec_of(cluster):
    return _planner._cluster_spec(cluster)


def _check_tp(cfg, tp, spec):
    _planner._positive_int(tp, "tp")
    if isinstance(cfg, _planner.TransformerConfig):
        for what, value in (("heads", cfg.heads), ("kv_heads", cfg.kv),
                            ("ffn_hidden", cfg.ffn), ("vocab", cfg.vocab)):
            if value % tp:
                raise ValueError(f"{what}={value} is not divisible by tp={tp}")
    if tp > spec.world_size:
        raise ValueError(f"tp={tp} is more GPUs than the cluster's {spec.world_size}")


def _costs(model, cluster, tp, dtype, efficiency):
    spec = _spec_of(cluster)
    _check_tp(model, tp, spec)
    if not isinstance(efficiency, _planner.Efficiency):
        raise ValueError(f"efficiency must be a planner.Efficiency, got {efficiency!r}")
    return _Costs(model, spec, tp, dtype, efficiency)


def _need_transformer(cfg):
    if not isinstance(cfg, _planner.TransformerConfig):
        raise ValueError(f"cfg must be a planner.TransformerConfig, got {cfg!r}")


def prefill_time(cfg, cluster, tokens, tp=1, dtype="fp16", batch=1,
                 efficiency=_planner.MEGATRON_A100):
    """Seconds to prefill ``batch`` prompts of ``tokens`` tokens each on one replica of
    ``tp`` GPUs: the prompts' KV cache written and their first output token computed.
    ``efficiency=planner.ROOFLINE`` charges every kernel at the device's peak, as the
    executing simulator does."""
    _need_transformer(cfg)
    _planner._positive_int(tokens, "tokens")
    _planner._positive_int(batch, "batch")
    return _costs(cfg, cluster, tp, dtype, efficiency).prefill([tokens] * batch)


def decode_time(cfg, cluster, batch, context, tp=1, dtype="fp16",
                efficiency=_planner.MEGATRON_A100):
    """Seconds of one decode step: one new token for each of ``batch`` sequences, each
    with ``context`` tokens already in the KV cache, on one replica of ``tp`` GPUs."""
    _need_transformer(cfg)
    _planner._positive_int(batch, "batch")
    if not isinstance(context, int) or isinstance(context, bool) or context < 0:
        raise ValueError(f"context must be a non-negative integer, got {context!r}")
    costs = _costs(cfg, cluster, tp, dtype, efficiency)
    return costs.decode_fixed(batch) + costs.per_context_token * batch * context


def batch_time(model, cluster, batch, tp=1, dtype="fp16", efficiency=_planner.MEGATRON_A100):
    """Seconds of one forward of a :class:`Model` (a CNN) over ``batch`` samples."""
    if not isinstance(model, Model):
        raise ValueError(f"model must be a serving.Model, got {model!r}")
    _planner._positive_int(batch, "batch")
    return _costs(model, cluster, tp, dtype, efficiency).cnn(batch)


def cold_start_time(model, cluster, tp=1, dtype="fp16"):
    """Seconds to load a replica's weights: the whole model read from the node's NVMe
    array, each GPU's share copied over its PCIe link, the two pipelined (the slower
    one sets the pace). Container start and engine warm-up come on top
    (:class:`Autoscaler`'s ``startup``)."""
    spec = _spec_of(cluster)
    total = weight_bytes(_check_model(model), dtype, 1)
    storage = spec.storage_of(0).read_seconds(total)
    link = spec.host_of(0).link
    return max(storage, link.latency + total / tp / link.effective_bandwidth)


# ------------------------------------------------------------------ requests
@dataclass
class Request:
    """One request: arrives at ``arrival`` (s) with ``prompt_tokens`` and asks for
    ``output_tokens`` (the first comes from the prefill). ``prefilled``: its KV cache
    arrives from a prefill instance (disaggregated serving), so a decode instance only
    allocates it."""

    arrival: float
    prompt_tokens: int = 512
    output_tokens: int = 64
    prefilled: bool = False


def _token_sampler(value, what):
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 1:
            raise ValueError(f"{what} must be at least 1, got {value}")
        return lambda rng: value
    if isinstance(value, (list, tuple)) and value and all(
            isinstance(v, int) and not isinstance(v, bool) and v >= 1 for v in value):
        options = tuple(value)
        return lambda rng: options[rng.randrange(len(options))]
    raise ValueError(f"{what} must be a positive integer or a list of them to draw from, "
                     f"got {value!r}")


def poisson(rate, n, prompt_tokens=512, output_tokens=64, seed=0, start=0.0):
    """``n`` :class:`Request` with Poisson arrivals at ``rate`` per second from ``start``.
    ``prompt_tokens`` and ``output_tokens``: an int, or a list to draw each from
    uniformly. Python's own generator: the same list on every machine."""
    return piecewise_poisson([(None, rate)], n, prompt_tokens, output_tokens, seed, start)


def piecewise_poisson(phases, n=None, prompt_tokens=512, output_tokens=64, seed=0,
                      start=0.0):
    """Requests from a Poisson process whose rate changes: ``phases`` is a list of
    ``(seconds, rate)``; a bursty trace is ``[(60, 2), (20, 20), (60, 2)]``. Stops after
    the phases, or after ``n`` requests (the last phase may last for ever, ``seconds=None``
    or ``math.inf``, when ``n`` is given)."""
    if not isinstance(phases, (list, tuple)) or not phases:
        raise ValueError(f"phases must be a non-empty list of (seconds, rate), got {phases!r}")
    for i, phase in enumerate(phases):
        if not (isinstance(phase, (list, tuple)) and len(phase) == 2):
            raise ValueError(f"phase {i} must be (seconds, rate), got {phase!r}")
        seconds, rate = phase
        if not isinstance(rate, (int, float)) or not rate > 0 or not math.isfinite(rate):
            raise ValueError(f"rate must be a positive number, got {rate!r} in phase {i}")
        if seconds is None or seconds == math.inf:
            if i != len(phases) - 1:
                raise ValueError("only the last phase may last for ever (seconds=None)")
        elif not isinstance(seconds, (int, float)) or isinstance(seconds, bool) \
                or not 0 < seconds < math.inf:     # NaN too: the phase would never end
            raise ValueError(f"phase {i} seconds must be a positive number, got {seconds!r}")
    if n is not None:
        _planner._positive_int(n, "n")
    elif phases[-1][0] is None or phases[-1][0] == math.inf:
        raise ValueError("give n, or a duration to the last phase: it lasts for ever")
    prompt, output = (_token_sampler(prompt_tokens, "prompt_tokens"),
                      _token_sampler(output_tokens, "output_tokens"))
    rng = random.Random(seed)
    out, t, phase_start = [], float(start), float(start)
    for seconds, rate in phases:
        end = math.inf if seconds is None else phase_start + seconds
        while n is None or len(out) < n:
            t += rng.expovariate(rate)
            if t >= end:   # memoryless: restart the clock at the phase boundary
                t = end
                break
            out.append(Request(t, prompt(rng), output(rng)))
        phase_start = end
        if n is not None and len(out) >= n:
            break
    return out


def _check_requests(requests):
    if not isinstance(requests, (list, tuple)) or not requests:
        raise ValueError("requests must be a non-empty list of serving.Request")
    last = -math.inf
    for i, r in enumerate(requests):
        if not isinstance(r, Request):
            raise ValueError(f"requests[{i}] is not a serving.Request: {r!r}")
        if not isinstance(r.arrival, (int, float)) or not math.isfinite(r.arrival) \
                or r.arrival < 0:
            raise ValueError(f"requests[{i}].arrival must be a time >= 0, got {r.arrival!r}")
        for what in ("prompt_tokens", "output_tokens"):
            value = getattr(r, what)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"requests[{i}].{what} must be a positive integer, "
                                 f"got {value!r}")
        if r.arrival < last:
            raise ValueError(f"requests must be sorted by arrival: requests[{i}] arrives at "
                             f"{r.arrival} before requests[{i - 1}] ({last})")
        last = r.arrival


# ------------------------------------------------------------------ autoscaling
@dataclass
class Autoscaler:
    """Knative's Knative Pod Autoscaler (KPA) rules, on concurrent requests.

    Every ``tick`` seconds (2) it averages the requests in flight (sampled each second)
    over the ``stable_window`` (60 s) and the ``panic_window`` (6 s) and wants
    ``ceil(average / (target * utilization))`` replicas for each. It enters panic mode
    when the panic window's average asks for ``panic_threshold`` (2) times the ready
    replicas or more; in panic it follows the panic window and never scales down, and it
    leaves panic a stable window after the last time the threshold was crossed.
    Otherwise it follows the stable window. Scale-up is at most ``max_scale_up_rate``
    times the ready replicas per decision, scale-down at most to ``1 / max_scale_down_rate``
    of them. Defaults are Knative's (``config-autoscaler``: target 100 concurrent requests
    per pod, target utilization 70 %). A new replica serves after ``cold_start_time``
    (weights over NVMe and PCIe) plus ``startup`` seconds (container and engine start:
    an input, 0 by default); one taken away finishes what it holds.
    """

    target: float = 100.0
    utilization: float = 0.7
    stable_window: float = 60.0
    panic_window: float = 6.0
    panic_threshold: float = 2.0
    tick: float = 2.0
    min_replicas: int = 1
    max_replicas: int = None
    max_scale_up_rate: float = 1000.0
    max_scale_down_rate: float = 2.0
    startup: float = 0.0

    def __post_init__(self):
        for what in ("target", "utilization", "stable_window", "panic_window",
                     "panic_threshold", "tick", "max_scale_up_rate", "max_scale_down_rate"):
            value = getattr(self, what)
            if not isinstance(value, (int, float)) or isinstance(value, bool) \
                    or not value > 0 or not math.isfinite(value):
                raise ValueError(f"Autoscaler.{what} must be a positive number, got {value!r}")
        if not isinstance(self.startup, (int, float)) or isinstance(self.startup, bool) \
                or not 0 <= self.startup < math.inf:
            raise ValueError(f"Autoscaler.startup must be a finite number of seconds >= 0, "
                             f"got {self.startup!r}")
        _planner._positive_int(self.min_replicas, "min_replicas")
        if self.max_replicas is not None:
            _planner._positive_int(self.max_replicas, "max_replicas")
            if self.max_replicas < self.min_replicas:
                raise ValueError("max_replicas must be at least min_replicas")

    def desired(self, stable, panic, ready, panicking_since, now):
        """One KPA decision: ``(replicas wanted, panicking_since)`` from the average
        concurrency over the stable and the panic window, the ``ready`` replicas and when
        panic mode began (None: not panicking)."""
        per_replica = self.target * self.utilization
        want_stable = math.ceil(stable / per_replica - 1e-9)
        want_panic = math.ceil(panic / per_replica - 1e-9)
        up = math.ceil(self.max_scale_up_rate * ready)
        down = math.floor(ready / self.max_scale_down_rate)
        want_stable = min(max(want_stable, down), up)
        want_panic = min(max(want_panic, down), up)
        over = ready and panic / ready >= per_replica * self.panic_threshold
        if over:
            panicking_since = now
        elif panicking_since is not None and now >= panicking_since + self.stable_window:
            panicking_since = None
        want = want_stable
        if panicking_since is not None:
            want = max(want_panic, ready)  # never scale down while panicking
        return want, panicking_since


# ------------------------------------------------------------------ deployment
@dataclass
class Deployment:
    """``replicas`` copies of ``model`` on ``cluster``, each on ``tp`` GPUs of one node
    (replica ``r`` on GPUs ``r*tp .. r*tp+tp-1``), batching requests as ``batching``
    says (see the module docstring), behind a load balancer (``"round_robin"`` or
    ``"least_outstanding"``), optionally scaled by an :class:`Autoscaler`.

    ``max_batch`` and ``max_queue_delay`` (seconds) are Triton's dynamic-batching knobs;
    ``max_num_seqs``, ``max_num_batched_tokens`` and ``block_size`` vLLM's: 256 and 16
    are V0's defaults; 8,192 tokens is a set value (V0 without chunked prefill defaults to
    ``max(max_model_len, 2048)``, 2,048 for OPT-13B; 8,192 is a V1 default, and V1 always
    chunks prefill). ``gpu_memory_utilization`` the share of each GPU's memory the engine
    takes (vLLM's 0.9). The KV cache gets that share minus the weights and an activation
    margin (:attr:`kv_cache_tokens`). ``efficiency``: the planner's
    (:data:`simcluster.planner.MEGATRON_A100`).
    """

    cluster: object
    model: object
    replicas: int = 1
    tp: int = 1
    dtype: str = "fp16"
    batching: str = "continuous"
    max_batch: int = 32
    max_queue_delay: float = 0.0
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    block_size: int = BLOCK_SIZE
    autoscaler: Autoscaler = None
    load_balancer: str = "round_robin"
    gpu_memory_utilization: float = GPU_MEMORY_UTILIZATION
    efficiency: _planner.Efficiency = _planner.MEGATRON_A100

    def __post_init__(self):
        self.spec = _spec_of(self.cluster)
        _check_model(self.model)
        _planner._check_choice(self.batching, BATCHING, "batching")
        _planner._check_choice(self.load_balancer, LOAD_BALANCERS, "load_balancer")
        for what in ("replicas", "max_batch", "max_num_seqs", "max_num_batched_tokens",
                     "block_size"):
            _planner._positive_int(getattr(self, what), what)
        if not isinstance(self.max_queue_delay, (int, float)) or self.max_queue_delay < 0 \
                or not math.isfinite(self.max_queue_delay):
            raise ValueError(f"max_queue_delay must be >= 0 seconds, got {self.max_queue_delay!r}")
        if not isinstance(self.gpu_memory_utilization, (int, float)) \
                or not 0 < self.gpu_memory_utilization <= 1:
            raise ValueError("gpu_memory_utilization must be in (0, 1], got "
                             f"{self.gpu_memory_utilization!r}")
        if self.autoscaler is not None and not isinstance(self.autoscaler, Autoscaler):
            raise ValueError(f"autoscaler must be a serving.Autoscaler, got {self.autoscaler!r}")
        if isinstance(self.model, Model) and self.batching == "continuous":
            raise ValueError("continuous batching needs a transformer (planner."
                             "TransformerConfig); serve a serving.Model with 'none' or "
                             "'dynamic'")
        self.costs = _costs(self.model, self.spec, self.tp, self.dtype, self.efficiency)
        per_node = min(n.devices for n in self.spec.nodes)
        if self.tp > per_node:
            raise ValueError(f"tp={self.tp} is more than the {per_node} GPUs of a node: "
                             "a replica's tensor parallelism stays inside one node")
        if self.replicas > self.max_replicas:
            raise ValueError(f"{self.replicas} replicas x tp={self.tp} = "
                             f"{self.replicas * self.tp} GPUs, more than the cluster's "
                             f"{self.max_replicas * self.tp} usable ones")
        if self.kv_cache_tokens < 1 and isinstance(self.model, _planner.TransformerConfig):
            raise ValueError(
                f"the weights ({weight_bytes(self.model, self.dtype, self.tp) / _spec.GiB:.1f}"
                f" GiB per GPU) leave no room for a KV cache in "
                f"{self.gpu_memory_utilization:.0%} of {self.device.memory / _spec.GiB:.0f} GiB;"
                " use more tensor parallelism")

    @property
    def device(self):
        """The device every replica runs on."""
        return self.spec.device_of(0)

    @property
    def max_replicas(self):
        """Replicas of ``tp`` GPUs that fit in the cluster, each inside one node."""
        return sum(n.devices // self.tp for n in self.spec.nodes)

    @property
    def gpus(self):
        """GPUs the deployment uses at the start: ``replicas * tp``."""
        return self.replicas * self.tp

    @property
    def kv_cache_bytes(self):
        """Bytes of KV cache per GPU: ``gpu_memory_utilization`` of the memory, minus the
        weights, minus the activations of a forward of ``max_num_batched_tokens``."""
        if isinstance(self.model, Model):
            return 0
        cfg = self.model
        activations = (ACTIVATION_VALUES_PER_TOKEN * self.max_num_batched_tokens
                       * (cfg.hidden + cfg.ffn // self.tp) * _dtype_bytes(self.dtype))
        return max(0, int(self.device.memory * self.gpu_memory_utilization
                          - weight_bytes(cfg, self.dtype, self.tp) - activations))

    @property
    def kv_cache_tokens(self):
        """Tokens of context one replica's KV cache holds (whole blocks)."""
        if isinstance(self.model, Model):
            return 0
        per_token = kv_bytes_per_token(self.model, self.dtype, self.tp)
        return self.kv_cache_bytes // per_token // self.block_size * self.block_size

    def cold_start(self):
        """Seconds before a replica the autoscaler adds serves (see :class:`Autoscaler`)."""
        startup = self.autoscaler.startup if self.autoscaler else 0.0
        return cold_start_time(self.model, self.spec, self.tp, self.dtype) + startup


# ------------------------------------------------------------------ the engine
@dataclass
class Batch:
    """One iteration (or a run of decode steps) of one replica, for :meth:`Result.timeline`."""

    replica: int
    start: float
    end: float
    kind: str        # "prefill", "decode", "batch" (a static batch), "forward" (a CNN)
    size: int        # sequences (or samples)
    steps: int = 1   # decode steps in this run


class _Seq:
    """A request inside a replica."""

    __slots__ = ("i", "prompt", "output", "produced", "base", "finish", "version",
                 "arrival", "prefilled")

    def __init__(self, i, r):
        self.i, self.prompt, self.output = i, r.prompt_tokens, r.output_tokens
        self.arrival, self.prefilled = r.arrival, r.prefilled
        self.produced = 0      # output tokens produced so far
        self.base = 0          # KV tokens = base + the replica's decode step counter
        self.finish = 0        # decode step counter at which it has all its tokens
        self.version = 0       # bumped on preemption: stale heap entries are skipped


class _Replica:
    """One replica's queue, batch and KV cache, advanced in time by :meth:`advance`."""

    def __init__(self, index, dep, sim, ready_at=0.0):
        self.index, self.dep, self.sim = index, dep, sim
        self.costs = dep.costs
        self.free_at = ready_at   # when it can start its next iteration
        self.ready_at = ready_at
        self.draining = False
        self.queue = deque()
        self.dispatched = 0       # requests sent here
        self.finished = []        # heap of their finishing times (popped as time passes)
        self.retired = 0          # finished before the last in_flight() time
        # continuous batching
        self.running = {}         # _Seq -> None, in admission order (preempt the last)
        self.heap = []            # (finish step, admission number, version, _Seq)
        self.step = 0             # decode steps run so far
        self.admitted = 0
        self.context = 0          # sum of base over running: context = this + n * step
        bs = dep.block_size
        self.bs = bs
        self.blocks = dep.kv_cache_tokens // bs
        self.watermark = int(WATERMARK * self.blocks)
        self.block_q = 0          # sum of base // bs over running
        self.residues = [0] * bs  # running sequences by base % bs

    # -- blocks, in closed form: a sequence of base b holds ceil((b + step) / bs) blocks
    def _used(self, step):
        # with step = m * bs + x: ceil((q * bs + r + step) / bs) = q + m + ceil((r + x) / bs),
        # and ceil((r + x) / bs) is 0 (r + x = 0), 1, or 2 (r + x > bs)
        m, x = divmod(step, self.bs)
        n = len(self.running)
        total = self.block_q + n * (m + 1)
        if x == 0:
            return total - self.residues[0]
        return total + sum(self.residues[self.bs + 1 - x:])

    def _add(self, s):
        self.running[s] = None
        self.context += s.base
        self.block_q += s.base // self.bs
        self.residues[s.base % self.bs] += 1

    def _remove(self, s):
        del self.running[s]
        self.context -= s.base
        self.block_q -= s.base // self.bs
        self.residues[s.base % self.bs] -= 1

    def enqueue(self, s, now):
        self.queue.append(s)
        self.dispatched += 1
        if not self.running and self.free_at < now:
            self.free_at = now

    def idle(self):
        return not self.queue and not self.running

    def _finish(self, s, when):
        self.sim.done[s.i] = when
        heapq.heappush(self.finished, when)

    def in_flight(self, now):
        """Requests sent here that have not finished by ``now`` (after ``advance(now)``)."""
        while self.finished and self.finished[0] <= now:
            heapq.heappop(self.finished)
            self.retired += 1
        return self.dispatched - self.retired

    def advance(self, until):
        """Run iterations that start before ``until`` (every request arriving before
        ``until`` is already queued here)."""
        batching = self.dep.batching
        while self.free_at < until and (self.queue or self.running):
            if batching == "continuous":
                self._iterate(until)
            elif not self._static_batch(until):
                return

    # -- static batches: "none" and "dynamic"
    def _static_batch(self, until):
        dep, queue = self.dep, self.queue
        size = 1 if dep.batching == "none" else dep.max_batch
        if isinstance(dep.model, _planner.TransformerConfig):
            # a static batch reserves every token it may hold: the longest request's
            # prompt and output, for every slot
            room, take, longest = dep.kv_cache_tokens, 0, 0
            for s in queue:
                longest_next = max(longest, s.prompt + s.output)
                if take == size:
                    break
                if (take + 1) * longest_next > room:
                    size = take          # the cache is full: the batch is complete
                    break
                take, longest = take + 1, longest_next
            if size == 0:
                raise ValueError(f"request {queue[0].i} needs {queue[0].prompt + queue[0].output}"
                                 f" tokens of KV cache, more than a replica's "
                                 f"{dep.kv_cache_tokens}")
        if len(queue) >= size:
            start = max(self.free_at, queue[size - 1].arrival)
        else:
            start = max(self.free_at, queue[0].arrival + dep.max_queue_delay)
            if start >= until:      # more requests may still arrive to fill the batch
                return False
        batch = []        # what has arrived by the start, up to the batch size
        while queue and len(batch) < size and queue[0].arrival <= start:
            batch.append(queue.popleft())
        sim = self.sim
        if isinstance(dep.model, Model):
            end = start + self.costs.cnn(len(batch))
            for s in batch:
                sim.first[s.i] = end
                self._finish(s, end)
            sim.record(self, start, end, "forward", len(batch), 1)
            self.free_at = end
            return True
        costs, n = self.costs, len(batch)
        # a prefilled request's KV cache (and first token) came from a prefill instance
        prompts = [s.prompt for s in batch if not s.prefilled]
        first = start + (costs.prefill(prompts) if prompts else 0.0)
        fixed, per = costs.decode_fixed(n), costs.per_context_token
        context = sum(s.prompt for s in batch)

        def elapsed(j):   # seconds of j decode steps of all n slots
            return j * fixed + per * (j * context + n * j * (j - 1) / 2)

        for s in batch:   # each streams its tokens, and is done after output - 1 steps
            sim.first[s.i] = start if s.prefilled else first
            self._finish(s, first + elapsed(s.output - 1))
        longest = max(s.output for s in batch) - 1
        end = first + elapsed(longest)
        if prompts:
            sim.record(self, start, first, "prefill", len(prompts), 1)
        if longest:
            sim.record(self, first, end, "decode", n, longest)
        self.free_at = end
        return True

    # -- continuous batching
    def _iterate(self, until):
        dep, sim, now = self.dep, self.sim, self.free_at
        # admit: vLLM V0 runs new prompts' prefill before any decode step
        lengths, admitted = [], []
        tokens = 0
        used = self._used(self.step)
        while self.queue and len(self.running) + len(admitted) < dep.max_num_seqs:
            s = self.queue[0]
            if s.arrival > now:
                break
            if s.produced == 0:
                length, compute = s.prompt, not s.prefilled
            else:                   # recomputing a preempted sequence: prompt + output so far
                length, compute = s.prompt + s.produced, True
            need = -(-length // self.bs)
            if compute and tokens + length > dep.max_num_batched_tokens:
                break
            if self.blocks - used - need < self.watermark:
                break
            self.queue.popleft()
            used += need
            admitted.append((s, length, compute))
            if compute:
                tokens += length
                lengths.append(length)
        sim.kv_usage.append((now, self.index, used / self.blocks if self.blocks else 0.0))
        if admitted:
            end = now + (self.costs.prefill(lengths) if lengths else 0.0)
            for s, length, compute in admitted:
                if not s.produced:
                    # its first token: from this prefill, or with its KV cache
                    sim.first[s.i] = end if compute else now
                s.produced += 1
                s.base = length - self.step
                if s.produced >= s.output:
                    self._finish(s, end)
                    continue
                s.finish = self.step + s.output - s.produced
                self.admitted += 1
                heapq.heappush(self.heap, (s.finish, self.admitted, s.version, s))
                self._add(s)
            if lengths:
                sim.record(self, now, end, "prefill", len(lengths), 1)
            self.free_at = end
            return
        # decode: run k steps of the whole batch, up to the next event. First make room
        # for the next token of every sequence: preempt the latest admitted until it fits
        # (its blocks freed, its tokens so far kept, recomputed when it is admitted again)
        used_now = self._used(self.step)
        # each sequence needs at most one new block per step (and one per block_size steps)
        while used_now + len(self.running) > self.blocks \
                and self._used(self.step + 1) > self.blocks:
            victim = next(reversed(self.running))
            self._remove(victim)
            victim.produced = victim.output - (victim.finish - self.step)
            victim.version += 1                 # its heap entry is stale now
            self.queue.appendleft(victim)
            sim.preemptions += 1
            used_now = self._used(self.step)
        n = len(self.running)
        heap = self.heap
        while heap[0][3] not in self.running or heap[0][2] != heap[0][3].version:
            heapq.heappop(heap)
        k = heap[0][0] - self.step               # steps until the first one finishes
        if used_now + n * -(-k // self.bs) > self.blocks \
                and self._used(self.step + k) > self.blocks:
            lo, hi = 1, k        # the largest k whose steps all fit: used(step + lo) fits
            while hi - lo > 1:
                mid = (lo + hi) // 2
                if self._used(self.step + mid) <= self.blocks:
                    lo = mid
                else:
                    hi = mid
            k = lo
        fixed = self.costs.decode_fixed(n)
        per = self.costs.per_context_token
        context = self.context + n * self.step   # tokens in the cache before the first step

        def elapsed(j):   # seconds of j steps: context grows by n tokens per step
            return j * fixed + per * (j * context + n * j * (j - 1) / 2)

        if until < math.inf and now + elapsed(k) > until:
            # stop at the first step that ends at or after `until`: a request arriving
            # then may join at the next iteration
            # the root of elapsed(j) = until - now, then the exact first such step
            a, b = per * n / 2, fixed + per * (context - n / 2)
            left = until - now
            j = (-b + math.sqrt(b * b + 4 * a * left)) / (2 * a) if a > 0 else left / b
            j = min(max(1, math.ceil(j)), k)
            while j > 1 and now + elapsed(j - 1) >= until:
                j -= 1
            while j < k and now + elapsed(j) < until:
                j += 1
            k = j
        end = now + elapsed(k)
        self.step += k
        while self.heap and self.heap[0][0] <= self.step:
            finish, _, version, s = heapq.heappop(self.heap)
            if s not in self.running or version != s.version:
                continue
            s.produced = s.output
            self._remove(s)
            self._finish(s, end)
        sim.record(self, now, end, "decode", n, k)
        self.free_at = end

class _Sim:
    """Per-request results and records, filled by the replicas."""

    def __init__(self, n):
        self.first = [math.nan] * n
        self.done = [math.nan] * n
        self.kv_usage = []
        self.batches = []
        self.preemptions = 0

    def record(self, replica, start, end, kind, size, steps):
        self.batches.append((replica.index, start, end, kind, size, steps))


# Knative's autoscaler reads each pod's concurrency every second (the queue-proxy's
# reporting period), and decides every tick.
SAMPLE_INTERVAL = 1.0


def simulate(requests, deployment):
    """Serve ``requests`` (a list of :class:`Request`, sorted by arrival) with
    ``deployment``; return a :class:`Result`. Deterministic: the same inputs give the
    same result on every machine."""
    _check_requests(requests)
    dep = deployment
    if not isinstance(dep, Deployment):
        raise ValueError(f"deployment must be a serving.Deployment, got {dep!r}")
    if dep.batching == "continuous":
        room = (dep.kv_cache_tokens // dep.block_size
                - int(WATERMARK * (dep.kv_cache_tokens // dep.block_size))) * dep.block_size
        for i, r in enumerate(requests):
            if r.prompt_tokens + r.output_tokens > room:
                raise ValueError(
                    f"requests[{i}] needs {r.prompt_tokens + r.output_tokens} tokens of KV "
                    f"cache, more than a replica's {room} (less vLLM's 1 % watermark)")
            # refused up front, as vLLM V0 without chunked prefill ignores a prompt over
            # min(max_model_len, max_num_batched_tokens); a sequence whose KV cache came
            # prefilled is recomputed too when it is preempted
            if r.prompt_tokens + r.output_tokens > dep.max_num_batched_tokens:
                raise ValueError(
                    f"requests[{i}] has {r.prompt_tokens} prompt and {r.output_tokens} output "
                    f"tokens, more than max_num_batched_tokens={dep.max_num_batched_tokens}:"
                    " a preempted sequence (prefilled or not) could never be prefilled again")
    sim = _Sim(len(requests))
    seqs = [_Seq(i, r) for i, r in enumerate(requests)]
    replicas = [_Replica(i, dep, sim) for i in range(dep.replicas)]
    history = [(0.0, dep.replicas)]
    if dep.autoscaler is None and dep.load_balancer == "round_robin":
        # replicas never influence each other: each advances only to its own arrivals
        for s in seqs:
            replica = replicas[s.i % len(replicas)]
            replica.advance(s.arrival)
            replica.enqueue(s, s.arrival)
    else:
        replicas = _balance(seqs, dep, replicas, history)
    for replica in replicas:
        replica.advance(math.inf)
    return Result(list(requests), dep, sim, history)


def _balance(seqs, dep, replicas, history):
    """The general loop: a load balancer that looks at the replicas, and the autoscaler.
    Returns every replica that ever served."""
    auto = dep.autoscaler
    everyone = list(replicas)
    active = list(replicas)            # not draining: the load balancer's candidates
    turn = 0
    samples = deque()                  # (time, requests in flight)
    panicking_since = None
    taken = decided = 0                # samples taken (sample k at k * SAMPLE_INTERVAL)
    cold = dep.cold_start() if auto else 0.0
    limit = dep.max_replicas if auto is None or auto.max_replicas is None \
        else min(auto.max_replicas, dep.max_replicas)
    low = 1 if auto is None else min(auto.min_replicas, limit)

    def ready(now):
        return [r for r in active if r.ready_at <= now]

    def autoscale(now, decide):
        nonlocal panicking_since
        for r in everyone:
            r.advance(now)
        samples.append((now, sum(r.in_flight(now) for r in everyone)))
        while samples[0][0] <= now - auto.stable_window:
            samples.popleft()
        if not decide:
            return
        stable = sum(c for _, c in samples) / len(samples)
        recent = [c for t, c in samples if t > now - auto.panic_window]
        panic = sum(recent) / len(recent)
        n_ready = len(ready(now))
        want, panicking_since = auto.desired(stable, panic, n_ready, panicking_since, now)
        want = max(low, min(limit, want))
        while len(active) < want:                  # a cold replica on free GPUs
            used = {r.index for r in everyone if not (r.draining and r.idle())}
            index = next((i for i in range(dep.max_replicas) if i not in used), None)
            if index is None:   # draining replicas still hold the GPUs: pending till then
                break
            fresh = _Replica(index, dep, replicas[0].sim, ready_at=now + cold)
            everyone.append(fresh)
            active.append(fresh)
        while len(active) > want:                  # the newest goes, finishing its work
            gone = active.pop()
            gone.draining = True
        n_now = len(ready(now))
        if n_now != history[-1][1]:
            history.append((now, n_now))

    def at_rest(now):
        """Whether every decision from ``now`` on changes nothing while no request comes:
        nothing in flight or starting, no panic, and the fleet at its minimum."""
        return (panicking_since is None and len(active) == low == history[-1][1]
                and all(r.ready_at <= now for r in active)
                and all(r.idle() and r.free_at <= now for r in everyone)
                and not any(c for _, c in samples))

    def skip_to(k):
        """``(samples, decisions)`` once sample ``k - 1`` is taken, every sample since
        ``taken`` at rest: a decision at each sample a tick or more after the last."""
        if auto.tick <= SAMPLE_INTERVAL:
            return k, decided + k - taken
        last = (k - 1) * SAMPLE_INTERVAL
        d = max(decided, math.floor(last / auto.tick) + 1)
        while d * auto.tick <= last:                # the rounding of the division
            d += 1
        while d > decided and (d - 1) * auto.tick > last:
            d -= 1
        return k, d

    def sample_until(now):
        """Take the autoscaler's samples (and decisions) up to ``now``; an idle stretch
        is skipped to its last stable window, so idle time costs nothing."""
        nonlocal taken, decided
        rest = auto.stable_window + auto.tick + 2 * SAMPLE_INTERVAL
        while taken * SAMPLE_INTERVAL <= now:
            t = taken * SAMPLE_INTERVAL
            if now - t > rest and at_rest(t):
                taken, decided = skip_to(math.floor((now - rest) / SAMPLE_INTERVAL))
                t = taken * SAMPLE_INTERVAL
            decide = t >= decided * auto.tick
            autoscale(t, decide)
            decided += decide
            taken += 1

    for s in seqs:
        now = s.arrival
        if auto:
            sample_until(now)
            # replicas that finished cold starts since: record when they became ready
            n_now = len(ready(now))
            if n_now != history[-1][1]:
                first_ready = max(r.ready_at for r in ready(now))
                history.append((first_ready, n_now))
        candidates = ready(now) or active[:1]
        if dep.load_balancer == "least_outstanding":
            for r in candidates:
                r.advance(now)
            replica = min(candidates, key=lambda r: (r.in_flight(now), r.index))
        else:
            replica = candidates[turn % len(candidates)]
            turn += 1
            replica.advance(now)
        replica.enqueue(s, now)
    if auto:   # keep deciding until the last request is served, so the fleet shrinks
        while any(not r.idle() for r in everyone):
            sample_until(taken * SAMPLE_INTERVAL)
    return everyone


class Result:
    """What :func:`simulate` measured. Per request, in the order of the requests:
    :attr:`ttft` (arrival to first token), :attr:`tpot` (time per output token after the
    first), :attr:`latency` (arrival to last token), in seconds."""

    def __init__(self, requests, deployment, sim, history):
        self.requests = requests
        self.deployment = deployment
        arrivals = [r.arrival for r in requests]
        self.ttft = [f - a for f, a in zip(sim.first, arrivals)]
        self.latency = [d - a for d, a in zip(sim.done, arrivals)]
        self.tpot = [(d - f) / (r.output_tokens - 1) if r.output_tokens > 1 else 0.0
                     for d, f, r in zip(sim.done, sim.first, requests)]
        self.finish = list(sim.done)
        #: ``[(time, replicas ready)]``, a step function (the autoscaler's work)
        self.replicas = history
        #: ``[(time, replica, fraction of its KV blocks in use)]`` at each iteration
        self.kv_cache_usage = sim.kv_usage
        #: sequences preempted (KV cache freed, recomputed later)
        self.preemptions = sim.preemptions
        self._batches = sim.batches

    @property
    def duration(self):
        """Seconds from the first arrival to the last request's last token."""
        return max(self.finish) - min(r.arrival for r in self.requests)

    @property
    def throughput(self):
        """Requests served per second over :attr:`duration`."""
        return len(self.requests) / self.duration

    @property
    def token_throughput(self):
        """Output tokens per second over :attr:`duration`."""
        return sum(r.output_tokens for r in self.requests) / self.duration

    def _metric(self, metric):
        if metric not in ("ttft", "tpot", "latency"):
            raise ValueError(f"metric must be 'ttft', 'tpot' or 'latency', got {metric!r}")
        return getattr(self, metric)

    def percentile(self, metric, q):
        """The ``q``-th percentile (0-100, linear interpolation as numpy's default) of
        ``"ttft"``, ``"tpot"`` or ``"latency"``."""
        if not isinstance(q, (int, float)) or not 0 <= q <= 100:
            raise ValueError(f"q must be a percentile between 0 and 100, got {q!r}")
        values = sorted(self._metric(metric))
        pos = (len(values) - 1) * q / 100
        low = math.floor(pos)
        high = min(low + 1, len(values) - 1)
        return values[low] + (values[high] - values[low]) * (pos - low)

    def mean(self, metric):
        """The mean of ``"ttft"``, ``"tpot"`` or ``"latency"``."""
        values = self._metric(metric)
        return sum(values) / len(values)

    def goodput(self, ttft=math.inf, tpot=math.inf, latency=math.inf):
        """Requests per second (over :attr:`duration`) that met every given limit (s)."""
        good = sum(1 for a, b, c in zip(self.ttft, self.tpot, self.latency)
                   if a <= ttft and b <= tpot and c <= latency)
        return good / self.duration

    def in_system(self, times):
        """Requests arrived and not finished at each of ``times`` (for Little's law:
        their time average is ``throughput * mean latency``)."""
        arrivals = [r.arrival for r in self.requests]
        done = sorted(self.finish)
        return [bisect.bisect_right(arrivals, t) - bisect.bisect_right(done, t)
                for t in times]

    def timeline(self):
        """Every iteration as a :class:`Batch` (a run of decode steps between two events
        is one), by start time."""
        return sorted((Batch(*b) for b in self._batches), key=lambda b: (b.start, b.replica))

    def __repr__(self):
        return (f"<serving.Result: {len(self.requests)} requests, "
                f"{self.throughput:.2f} req/s, TTFT p50 {self.percentile('ttft', 50) * 1e3:.1f}"
                f" ms p99 {self.percentile('ttft', 99) * 1e3:.1f} ms, TPOT p50 "
                f"{self.percentile('tpot', 50) * 1e3:.1f} ms, {self.preemptions} preemptions>")
