"""An analytical planner: memory, step time and MFU of a GPT trained with DP x TP x PP,
context parallelism (CP) and, for a mixture of experts, expert parallelism (EP).

    from simcluster import planner
    cfg = planner.TransformerConfig(layers=24, hidden=2304, heads=24, seq_len=2048,
                                    vocab=51200)
    est = planner.estimate(cfg, cluster, tp=1, pp=1, dp=32, global_batch=512)
    est.step_time, est.hardware_tflops_per_gpu, est.memory_per_gpu, est.breakdown

The executing simulator runs every op of a model; at the scale of published runs (a
trillion parameters on 3,072 GPUs) that is out of reach, so the planner adds up the same
costs on paper: the device peaks and HBM bandwidth of ``spec.py``, the collective times of
``costmodel.py`` (NCCL's model, the same call the simulator makes for a collective), and a
few constants the simulator does not need at small scale -- each named below with its
source and explained in ``docs/planner.md``.

Time of one step, for ``m`` micro-batches on ``p`` pipeline stages of ``v`` chunks each::

    step = m * t_mb + (p - 1) / v * t_mb + exposed DP communication + optimizer step

where ``t_mb`` is the forward, recomputation and backward of one micro-batch on the
slowest stage, with its exposed tensor- and pipeline-parallel communication. Every op's
time is a roofline, ``max(FLOPs / (peak x efficiency), bytes / (HBM x efficiency))``.

The published runs this reproduces are in :data:`MEGATRON_TABLE1` (Narayanan et al. 2021,
Table 1, mean error 1.7 %; one row calibrates :data:`SOFTWARE_EFFICIENCY`) and
:data:`KORTHIKANTI_TABLE5` (Korthikanti et al. 2022, Table 5, 6.1 %, nothing fitted);
:data:`PUBLISHED_RUNS` holds Llama 3 405B (CP) and DeepSeek-V3 (EP) as published;
``benchmarks/bench_planner.py`` prints the three comparisons.
"""

import itertools
import math
import numbers
from dataclasses import dataclass, fields, replace
from fractions import Fraction

from . import spec as _spec
from .costmodel import OVERLAP_SLOWDOWN, CostModel

# ---------------------------------------------------------------- constants
# What the executing simulator does not model at scale: how close real kernels come to the
# roofline. docs/planner.md explains each constant and its source.
#
# Best achieved fraction of the dense 16-bit peak of a GEMM on A100 SXM: 267.9 of 312
# TFLOP/s, the "maximum achievable matmul FLOPS" measured by Bekman's mamf-finder
# (ml-engineering, compute/accelerator, CUDA 12.1).
GEMM_EFFICIENCY = 0.859
# The dimension at which a GEMM reaches half of that: a GEMM of m x k by k x n runs at
# GEMM_EFFICIENCY x d / (d + GEMM_HALF_DIM) for each of m, n, k (A100's tensor cores work
# on 128 x 128 output tiles with k-steps of 32-64; a thin dimension leaves them idle).
GEMM_HALF_DIM = 64
# Achieved fraction of HBM bandwidth of large memory-bound kernels (LayerNorm, softmax,
# dropout, GeLU, Adam): 0.9 for transfers of 100 MB or more (Calculon's A100 system
# file, systems/a100_80g.json, "mem1"; Isaev et al., SC 2023).
HBM_EFFICIENCY = 0.90
# What a 2021 Megatron-LM step achieves of the kernels' roofline above, everything
# unmodelled together (kernel launch gaps, fp16 loss-scaling checks, unfused copies and
# transposes, allocator): calibrated on one row of Narayanan et al. 2021, Table 1 -- the
# 1.7 B model on 32 GPUs, which has no model parallelism and < 1 % exposed communication,
# so its time is single-GPU compute -- and validated on the other nine rows.
SOFTWARE_EFFICIENCY = 0.851
# Bytes read and written per parameter by a mixed-precision Adam step with Megatron-LM's
# fp32 main gradients: read gradient, master weight, momentum, variance (4 x 4 bytes),
# write master weight, momentum, variance (3 x 4) and the 16-bit weight (2); read the
# gradient once more for the norm of gradient clipping (4).
ADAM_BYTES_PER_PARAMETER = 34
# Memory per parameter under mixed-precision Adam (Rajbhandari et al. 2020, ZeRO):
# 16-bit weights and gradients, K = 12 bytes of fp32 master weights, momentum, variance.
# Training in fp32 keeps 4-byte weights and gradients and needs no master copy (K = 8):
# see model_state_bytes.
WEIGHT_BYTES, GRADIENT_BYTES, OPTIMIZER_BYTES = 2, 2, 12
# Bytes per logit the vocabulary-parallel cross-entropy moves, forward and backward
# (Megatron-LM's vocab_parallel_cross_entropy: fp32 cast, max-subtract, exp, sum, divide,
# then the gradient softmax - one-hot): ~6 passes over fp32 logits.
CROSS_ENTROPY_BYTES_PER_LOGIT = 24


def model_state_bytes(dtype):
    """``(weight, gradient, optimizer)`` bytes per parameter when training in ``dtype``
    with Adam: weights and gradients in ``dtype``; fp32 momentum and variance, plus an
    fp32 master copy of the weights when they are 16-bit (2 + 2 + 12, Rajbhandari et al.
    2020); in fp32 the weights are their own master (4 + 4 + 8)."""
    value_bytes = DTYPES[_check_choice(dtype, tuple(DTYPES), "dtype")][1]
    if value_bytes == 4:
        return 4, 4, 8
    return WEIGHT_BYTES, GRADIENT_BYTES, OPTIMIZER_BYTES


def _real(value):
    """A real number that is not a bool (NaN included: callers compare it)."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Efficiency:
    """How close compute comes to the device's roofline (see the constants above).

    :data:`MEGATRON_A100` (the default) is what Megatron-LM achieved on A100 in 2021;
    :data:`ROOFLINE` charges every op at the device's peaks, as the executing simulator
    does (``costmodel.CostModel.roofline``), for comparing the two. ``fused``: the
    memory-bound kernels are Megatron-LM's fused ones (scale-mask-softmax, bias-GeLU,
    bias-dropout-add); else PyTorch's eager ops, one pass over memory each, as a plain
    ``nn.Module`` GPT runs them (and the simulator charges them).
    """

    gemm: float = GEMM_EFFICIENCY
    gemm_half_dim: float = GEMM_HALF_DIM
    hbm: float = HBM_EFFICIENCY
    software: float = SOFTWARE_EFFICIENCY
    fused: bool = True       # Megatron-LM's fused kernels, or PyTorch's eager ops

    def __post_init__(self):
        # A NaN or a negative efficiency would give a NaN or a plausible-looking step
        # time, and 0 a ZeroDivisionError deep inside the estimate: refuse them here.
        for name in ("gemm", "hbm", "software"):
            value = getattr(self, name)
            if not _real(value) or not 0 < value <= 1:
                raise ValueError(f"Efficiency: {name} must be a fraction of the roofline in "
                                 f"(0, 1], got {value!r}")
        if not _real(self.gemm_half_dim) or not 0 <= self.gemm_half_dim < math.inf:
            raise ValueError("Efficiency: gemm_half_dim must be a finite number >= 0, got "
                             f"{self.gemm_half_dim!r}")
        if not isinstance(self.fused, bool):
            raise ValueError(f"Efficiency: fused must be True or False, got {self.fused!r}")


MEGATRON_A100 = Efficiency()
ROOFLINE = Efficiency(gemm=1.0, gemm_half_dim=0, hbm=1.0, software=1.0, fused=False)

RECOMPUTE = ("none", "selective", "full")
SCHEDULES = ("1f1b", "gpipe", "interleaved")
DTYPES = {"bf16": ("bfloat16", 2), "fp16": ("float16", 2), "fp32": ("float32", 4)}


# ------------------------------------------------------------- the model
@dataclass(frozen=True)
class MLA:
    """Multi-head latent attention (DeepSeek-V2/V3): queries and keys/values go through
    low-rank projections, ``q_rank`` (0: no query compression) and ``kv_rank``; each head
    has a ``nope_dim`` part and a ``rope_dim`` rotary part for queries and keys (the
    rotary key shared by all heads) and ``v_dim`` for values. DeepSeek-V3:
    ``MLA(1536, 512, 128, 64, 128)`` (its ``config.json``)."""

    q_rank: int
    kv_rank: int
    nope_dim: int
    rope_dim: int
    v_dim: int

    def __post_init__(self):
        if not isinstance(self.q_rank, int) or self.q_rank < 0:
            raise ValueError(f"MLA: q_rank must be an integer >= 0, got {self.q_rank!r}")
        for name in ("kv_rank", "nope_dim", "rope_dim", "v_dim"):
            _positive_int(getattr(self, name), f"MLA: {name}")


@dataclass(frozen=True)
class TransformerConfig:
    """A decoder-only transformer.

    The defaults are GPT's (Megatron-LM): ``ffn_hidden = 4 * hidden``, multi-head
    attention (``kv_heads = heads``), GeLU MLP, biases, LayerNorm and learned position
    embeddings. ``swiglu=True`` is a LLaMA-style block: SwiGLU MLP (three matrices), no
    biases, RMSNorm, rotary positions (no position-embedding table). ``kv_heads`` below
    ``heads`` is grouped-query attention. ``tied_embeddings``: the output layer reuses the
    input embedding matrix (GPT), else it has its own (LLaMA). ``dropout`` (default: GPT
    yes, ``swiglu`` no): dropout after attention, after the MLP and on the attention
    probabilities, whose masks and outputs are kept for backward.

    Mixture of experts (``experts > 0``): the MLP of every ``moe_layer_freq``-th layer (or
    of the layers a 0/1 pattern marks) is a router (``hidden x experts``) choosing
    ``experts_per_token`` of ``experts`` routed experts, plus ``shared_experts`` every
    token uses, each an MLP of ``expert_ffn_hidden`` (default ``ffn``).
    ``capacity_factor``: each expert takes at most ``capacity_factor x tokens x k / E``
    tokens and is padded up to that (Switch Transformer, GShard); ``None`` is dropless.
    ``mla``: DeepSeek's multi-head latent attention (:class:`MLA`) instead of GQA.
    """

    layers: int
    hidden: int
    heads: int
    seq_len: int
    vocab: int
    ffn_hidden: int = None
    kv_heads: int = None
    swiglu: bool = False
    tied_embeddings: bool = True
    dropout: bool = None
    experts: int = 0
    experts_per_token: int = None
    shared_experts: int = 0
    expert_ffn_hidden: int = None
    moe_layer_freq: object = 1
    capacity_factor: float = None
    mla: MLA = None

    def __post_init__(self):
        if self.dropout is None:  # GPT trains with dropout, LLaMA-style models without
            object.__setattr__(self, "dropout", not self.swiglu)
        for name in ("layers", "hidden", "heads", "seq_len", "vocab"):
            _positive_int(getattr(self, name), name)
        for name in ("ffn_hidden", "kv_heads"):
            if getattr(self, name) is not None:
                _positive_int(getattr(self, name), name)
        if self.hidden % self.heads:
            raise ValueError(f"hidden={self.hidden} is not a multiple of heads={self.heads}")
        if self.heads % self.kv:
            raise ValueError(f"heads={self.heads} is not a multiple of kv_heads={self.kv}")
        if self.mla is not None and not (isinstance(self.mla, MLA) and self.swiglu):
            raise ValueError(f"mla must be a planner.MLA in a swiglu=True model, got "
                             f"{self.mla!r}")
        self._check_moe()

    def __repr__(self):
        """The dataclass's repr without the mixture-of-experts and MLA fields while they
        hold their defaults: a dense model prints as it did before they existed (lesson
        12 prints one)."""
        shown = [f"{f.name}={getattr(self, f.name)!r}" for f in fields(self)
                 if f.name not in _MOE_FIELDS or getattr(self, f.name) != f.default]
        return f"TransformerConfig({', '.join(shown)})"

    def _check_moe(self):
        if self.experts == 0:
            if (self.experts_per_token, self.shared_experts, self.expert_ffn_hidden,
                    self.moe_layer_freq, self.capacity_factor) != (None, 0, None, 1, None):
                raise ValueError("experts_per_token, shared_experts, expert_ffn_hidden, "
                                 "moe_layer_freq and capacity_factor need experts > 0")
            return
        _positive_int(self.experts, "experts")
        _positive_int(self.experts_per_token, "experts_per_token")
        if self.experts_per_token > self.experts:
            raise ValueError(f"experts_per_token={self.experts_per_token} is more than "
                             f"experts={self.experts}")
        if not isinstance(self.shared_experts, int) or self.shared_experts < 0:
            raise ValueError(f"shared_experts must be an integer >= 0, got "
                             f"{self.shared_experts!r}")
        if self.expert_ffn_hidden is not None:
            _positive_int(self.expert_ffn_hidden, "expert_ffn_hidden")
        cf = self.capacity_factor
        if cf is not None and (not _real(cf) or not 0 < cf < math.inf):
            raise ValueError(f"capacity_factor must be a positive number or None "
                             f"(dropless), got {cf!r}")
        freq = self.moe_layer_freq
        if isinstance(freq, (list, tuple)):
            if len(freq) != self.layers or set(freq) - {0, 1} or not any(freq):
                raise ValueError(f"moe_layer_freq as a pattern needs {self.layers} entries "
                                 f"of 0 (dense) or 1 (MoE) with at least one 1, got {freq!r}")
            object.__setattr__(self, "moe_layer_freq", tuple(freq))
        elif not isinstance(freq, int) or isinstance(freq, bool) or not 1 <= freq <= self.layers:
            raise ValueError(f"moe_layer_freq must be an integer in [1, layers={self.layers}] "
                             f"or a 0/1 pattern per layer, got {freq!r}")

    @property
    def moe_layers(self):
        """Layers whose MLP is a mixture of experts: every ``moe_layer_freq``-th layer
        (layers 0, N, 2N, ... as Megatron-LM's ``--moe-layer-freq N``), or the 1s of a
        0/1 pattern; none for a dense model."""
        if not self.experts:
            return 0
        if isinstance(self.moe_layer_freq, tuple):
            return sum(self.moe_layer_freq)
        return len(range(0, self.layers, self.moe_layer_freq))

    @property
    def expert_ffn(self):
        """One expert's inner size: ``expert_ffn_hidden``, or the dense ``ffn``."""
        return self.expert_ffn_hidden or self.ffn

    @property
    def qk_head_dim(self):
        """Size of one head's query and key (MLA: no-position plus rotary part)."""
        return self.mla.nope_dim + self.mla.rope_dim if self.mla else self.head_dim

    @property
    def v_head_dim(self):
        """Size of one head's value and attention output."""
        return self.mla.v_dim if self.mla else self.head_dim

    @property
    def ffn(self):
        """The MLP's inner size: ``ffn_hidden``, or ``4 * hidden``."""
        return self.ffn_hidden or 4 * self.hidden

    @property
    def kv(self):
        """Key/value heads: ``kv_heads``, or ``heads``."""
        return self.kv_heads or self.heads

    @property
    def head_dim(self):
        """Hidden size of one attention head."""
        return self.hidden // self.heads

    def attention_matrices(self):
        """``(inputs, outputs)`` of each weight matrix of one layer's attention, unsharded:
        QKV (or, with MLA, the query and key-value down- and up-projections) and the
        output projection."""
        h, a = self.hidden, self.heads
        if self.mla:
            m = self.mla
            query = ([(h, m.q_rank), (m.q_rank, a * self.qk_head_dim)] if m.q_rank
                     else [(h, a * self.qk_head_dim)])
            return query + [(h, m.kv_rank + m.rope_dim),
                            (m.kv_rank, a * (m.nope_dim + m.v_dim)),
                            (a * m.v_dim, h)]
        return [(h, h + 2 * self.kv * self.head_dim), (h, h)]

    def expert_matmul_parameters(self):
        """Weights of one expert's MLP (SwiGLU: three matrices, else two)."""
        return (3 if self.swiglu else 2) * self.hidden * self.expert_ffn

    def layer_matmul_parameters(self, experts=None):
        """Weights of one layer's matrix multiplies (QKV, output projection, MLP); with
        ``experts`` (a number) an MoE layer's: the router, that many routed experts and
        the shared ones."""
        h = self.hidden
        if self.mla:
            attention = sum(i * o for i, o in self.attention_matrices())
        else:
            kv_dim = self.kv * self.head_dim
            attention = h * (h + 2 * kv_dim) + h * h
        if experts is None:
            mlp = (3 if self.swiglu else 2) * h * self.ffn
        else:
            mlp = (h * self.experts
                   + (experts + self.shared_experts) * self.expert_matmul_parameters())
        return attention + mlp

    def layer_parameters(self, experts=None):
        """All parameters of one layer: matrices, biases and the two norms (MLA: also the
        norms of its compressed query and key-value); ``experts`` as in
        :meth:`layer_matmul_parameters`."""
        h, kv_dim = self.hidden, self.kv * self.head_dim
        if self.swiglu:  # no biases; RMSNorm has a scale only
            norms = 2 * h + (self.mla.q_rank + self.mla.kv_rank if self.mla else 0)
            return self.layer_matmul_parameters(experts) + norms
        if experts is None:
            mlp_biases = self.ffn + h
        else:
            mlp_biases = (experts + self.shared_experts) * (self.expert_ffn + h)
        biases = (h + 2 * kv_dim) + h + mlp_biases
        return self.layer_matmul_parameters(experts) + biases + 4 * h  # LayerNorm: scale and bias


_MOE_FIELDS = ("experts", "experts_per_token", "shared_experts", "expert_ffn_hidden",
               "moe_layer_freq", "capacity_factor", "mla")


def _divisors(n):
    """The divisors of ``n``, ascending, found in pairs up to its square root (a linear
    scan would take hours for a batch of 10¹² sequences)."""
    small = [d for d in range(1, math.isqrt(n) + 1) if n % d == 0]
    return small + [n // d for d in reversed(small) if d * d != n]


def _positive_int(value, name):
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")
    return value


def embedding_parameters(cfg):
    """Parameters outside the layers: token (and position) embeddings, output layer,
    final norm."""
    h = cfg.hidden
    positions = 0 if cfg.swiglu else cfg.seq_len * h
    output = 0 if cfg.tied_embeddings else cfg.vocab * h
    final_norm = h if cfg.swiglu else 2 * h
    return cfg.vocab * h + positions + output + final_norm


def parameter_count(cfg):
    """Parameters of the model. For the standard GPT this is Narayanan et al. 2021's
    ``12 l h^2 (1 + 13/(12h) + (V + s)/(12 l h))`` plus the final LayerNorm's ``2h``, which
    the formula leaves out; for any other config the exact count of its tensors, every
    expert of a mixture of experts included."""
    if not cfg.experts:
        return cfg.layers * cfg.layer_parameters() + embedding_parameters(cfg)
    return _moe_parameters(cfg, cfg.experts)


def active_parameter_count(cfg):
    """Parameters one token uses: all of a dense model; of a mixture of experts the
    router, the ``experts_per_token`` routed experts and the shared ones of each MoE
    layer, and everything outside the experts (embeddings included, as Mistral counts
    Mixtral's 12.9 B)."""
    if not cfg.experts:
        return parameter_count(cfg)
    return _moe_parameters(cfg, cfg.experts_per_token)


def _moe_parameters(cfg, experts):
    """Parameters of a mixture of experts with ``experts`` routed experts per MoE layer."""
    moe = cfg.moe_layers
    return ((cfg.layers - moe) * cfg.layer_parameters() + moe * cfg.layer_parameters(experts)
            + embedding_parameters(cfg))


def _routed_copies(cfg):
    """Token copies the routed experts process per token: ``experts_per_token``, times
    the capacity factor when one pads or drops to a fixed capacity."""
    k = cfg.experts_per_token
    return k if cfg.capacity_factor is None else k * Fraction(cfg.capacity_factor)


def dropped_fraction(cfg):
    """Fraction of the routed token copies an MoE layer drops with a capacity factor
    below 1, when routing is balanced: ``1 - capacity_factor`` (0 when dropless or
    padded)."""
    cf = cfg.capacity_factor
    return 0.0 if cf is None else max(0.0, 1.0 - cf)


def flops_per_iteration(cfg, global_batch, recompute="none", causal=False):
    """Training FLOPs of one iteration of ``global_batch`` sequences.

    Counts matrix multiplies only, as Narayanan et al. 2021 (Eq. 3) do: a layer's forward
    is ``2 x tokens x weights`` plus ``4 b s^2 h`` for attention scores and their use; the
    backward is twice the forward; the output layer is ``2 b s h V`` forward. Full
    recomputation repeats every layer's forward (for the standard GPT:
    ``96 B s l h^2 (1 + s/(6h) + V/(16 l h))``, and 72 instead of 96 without); selective
    recomputation repeats the attention-score products only (Korthikanti et al. 2022).

    A mixture of experts counts the weights a token uses (:func:`active_parameter_count`:
    router, ``experts_per_token`` routed and the shared experts). MLA's score products
    have ``qk_head_dim`` and ``v_head_dim`` per head. ``causal``: the attention products
    count the lower triangle only (half), as FlashAttention's causal kernels skip the
    masked blocks.
    """
    _check_choice(recompute, RECOMPUTE, "recompute")
    _positive_int(global_batch, "global_batch")
    tokens = global_batch * cfg.seq_len
    layer_gemm = 2 * tokens * cfg.layer_matmul_parameters()
    if cfg.mla:
        attention = 2 * global_batch * cfg.seq_len ** 2 * cfg.heads * (cfg.qk_head_dim
                                                                         + cfg.v_head_dim)
    else:
        attention = 4 * global_batch * cfg.seq_len ** 2 * cfg.hidden
    if causal:
        attention //= 2  # always even
    logits = 2 * tokens * cfg.hidden * cfg.vocab
    forward = cfg.layers * (layer_gemm + attention)
    if cfg.experts:  # the MoE layers' MLPs: the router and the experts a token uses
        moe_gemm = 2 * tokens * cfg.layer_matmul_parameters(cfg.experts_per_token)
        forward += cfg.moe_layers * (moe_gemm - layer_gemm)
    extra = {"none": 0, "selective": cfg.layers * attention, "full": forward}[recompute]
    return 3 * (forward + logits) + extra


def activation_memory_per_layer(cfg, micro_batch, tp=1, sequence_parallel=False,
                                recompute="none", cp=1, flash_attention=False, moe=False):
    """Bytes of activations one transformer layer keeps for its backward pass, per GPU,
    with 16-bit activations and 1-byte dropout masks (Korthikanti et al. 2022, Table 2):

    =============================  ==============================
    none, ``t = 1``                ``s b h (34 + 5 a s / h)``
    tensor parallel                ``s b h (10 + 24/t + 5 a s/(h t))``
    tensor + sequence parallel     ``s b h (34/t + 5 a s/(h t))``
    selective recomputation        the same without the ``5 a s/(h t)`` term
    full recomputation             ``2 s b h`` (the layer's input; ``/t`` with sequence
                                   parallelism, which shards it)
    =============================  ==============================

    Other configs count the same tensors with their sizes: GQA's smaller K and V,
    SwiGLU's three MLP activations of ``ffn_hidden``; without dropout there are no masks
    (``2 s b h`` and ``a s^2 b``) and no dropout output (``2 a s^2 b``: the softmax output
    feeds the product with V directly), ``s b h (32 + 2 a s/h)`` for ``t = 1``.

    Context parallelism (``cp``) keeps ``s/cp`` tokens per GPU, so every term is divided
    by ``cp``, the scores' too (``s/cp`` queries against all ``s`` keys).
    ``flash_attention``: no ``a s^2`` scores are kept, only the softmax's fp32
    log-sum-exp per query and head (``4 a s b`` bytes) -- the 8 B model of the
    Ultra-Scale Playbook has ``34 s b h / (t cp)`` with sequence parallelism. ``moe``:
    the layer's MLP is a mixture of experts, which keeps each routed copy's input
    (``2 h`` bytes) and its expert's inner activations, the shared experts' and the
    router's fp32 probabilities (``4 E`` bytes per token).
    """
    _check_choice(recompute, RECOMPUTE, "recompute")
    _positive_int(micro_batch, "micro_batch")
    _positive_int(tp, "tp")
    _positive_int(cp, "cp")
    b, h, a, t = micro_batch, cfg.hidden, cfg.heads, tp
    s = Fraction(cfg.seq_len, cp)  # tokens per GPU
    sbh = s * b * h
    # sequence parallelism splits the otherwise replicated part along the sequence
    replicated = t if sequence_parallel else 1
    if recompute == "full":
        return round(Fraction(2 * sbh, replicated))
    if cfg.mla:
        # Q, K (qk_head_dim), V and the output projection's input (v_head_dim) per head;
        # the compressed query and key-value (the up-projections' inputs) unsharded
        m = cfg.mla
        attention_sharded = 2 * s * b * a * (2 * cfg.qk_head_dim + 2 * cfg.v_head_dim)
        extra_replicated = 2 * s * b * (m.q_rank + m.kv_rank)
    else:
        kv_share = Fraction(cfg.kv, cfg.heads)
        # attention: Q 2, K and V 2 each (x kv share), output projection input 2
        attention_sharded = sbh * (2 + 4 * kv_share + 2)
        extra_replicated = 0
    # MLP: GeLU input and second linear input, 2 bytes each of ffn_hidden per token;
    # SwiGLU: gate, up and their product
    per_inner = 6 if cfg.swiglu else 4
    if moe:
        copies = _routed_copies(cfg)
        mlp_sharded = (s * b * (copies + cfg.shared_experts) * cfg.expert_ffn * per_inner
                       + 2 * copies * sbh)
        extra_replicated += 4 * s * b * cfg.experts
    else:
        mlp_sharded = s * b * cfg.ffn * per_inner
    # LayerNorm inputs 4, QKV and MLP inputs 4, dropout masks after attention and MLP 2
    replicated_bytes = (10 if cfg.dropout else 8) * sbh + extra_replicated
    # softmax output 2, with dropout its mask 1 and the dropout output 2
    scores = (5 if cfg.dropout else 2) * a * s * cfg.seq_len * b
    if flash_attention:  # the log-sum-exp only, kept whatever the recomputation
        scores = 4 * a * s * b
    total = Fraction(attention_sharded + mlp_sharded, t) + Fraction(replicated_bytes,
                                                                      replicated)
    if recompute == "none" or flash_attention:
        total += Fraction(scores, t)
    return round(total)


# ------------------------------------------------------- Table 1 of the paper
@dataclass(frozen=True)
class MegatronRow:
    """One row of Narayanan et al. 2021, Table 1, with the run's micro-batch size and
    interleaving from the paper's launch script (Megatron-LM, examples/sc21/run_table_1.sh).
    """

    params_billion: float
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    dp: int
    gpus: int
    batch: int
    tflops_per_gpu: float      # achieved, counting recomputation (Eq. 3)
    percent_of_peak: float
    micro_batch: int
    virtual_stages: int

    def config(self):
        """The row's model: s = 2048, V = 51,200 as in the paper."""
        return TransformerConfig(layers=self.layers, hidden=self.hidden, heads=self.heads,
                                 seq_len=2048, vocab=51200)


MEGATRON_TABLE1 = (
    MegatronRow(1.7, 24, 2304, 24, 1, 1, 32, 32, 512, 137, 44, 16, 1),
    MegatronRow(3.6, 32, 3072, 30, 2, 1, 32, 64, 512, 138, 44, 16, 1),
    MegatronRow(7.5, 32, 4096, 36, 4, 1, 32, 128, 512, 142, 46, 16, 1),
    MegatronRow(18.4, 48, 6144, 40, 8, 1, 32, 256, 1024, 135, 43, 8, 1),
    MegatronRow(39.1, 64, 8192, 48, 8, 2, 32, 512, 1536, 138, 44, 4, 1),
    MegatronRow(76.1, 80, 10240, 60, 8, 4, 32, 1024, 1792, 140, 45, 2, 3),
    MegatronRow(145.6, 96, 12288, 80, 8, 8, 24, 1536, 2304, 148, 47, 2, 2),
    MegatronRow(310.1, 128, 16384, 96, 8, 16, 15, 1920, 2160, 155, 50, 1, 2),
    MegatronRow(529.6, 128, 20480, 105, 8, 35, 9, 2520, 2520, 163, 52, 1, 3),
    MegatronRow(1008.0, 160, 25600, 128, 8, 64, 6, 3072, 3072, 163, 52, 1, 1),
)



@dataclass(frozen=True)
class KorthikantiRow:
    """One row of Korthikanti et al. 2022, Tables 3 and 5: a GPT trained without data
    parallelism on A100s, its iteration time with full recomputation and with the
    paper's sequence parallelism plus selective recomputation ("present work")."""

    name: str
    heads: int
    hidden: int
    layers: int
    tp: int
    pp: int
    gpus: int
    batch: int
    micro_batch: int
    virtual_stages: int        # "three interleaving stages for the 175B and 530B models"
    full_recompute_seconds: float
    present_work_seconds: float
    mfu: float                 # of the present work
    hfu: float

    def config(self):
        """The row's model: s = 2048, V = 51,200 as in the paper."""
        return TransformerConfig(layers=self.layers, hidden=self.hidden, heads=self.heads,
                                 seq_len=2048, vocab=51200)


KORTHIKANTI_TABLE5 = (
    KorthikantiRow("22B", 64, 6144, 48, 8, 1, 8, 4, 4, 1, 1.42, 1.10, 0.415, 0.437),
    KorthikantiRow("175B", 96, 12288, 96, 8, 8, 64, 64, 1, 3, 18.13, 13.75, 0.514, 0.528),
    KorthikantiRow("530B", 128, 20480, 105, 8, 35, 280, 280, 1, 3, 49.05, 37.83, 0.560, 0.570),
    KorthikantiRow("1T", 160, 25600, 128, 8, 64, 512, 512, 1, 1, 94.42, 71.49, 0.563, 0.570),
)

# ------------------------------------------ long context and mixtures of experts
# Published models (each from its config.json) for the frontier comparison below
MIXTRAL_8X7B = TransformerConfig(
    layers=32, hidden=4096, heads=32, kv_heads=8, seq_len=4096, vocab=32000,
    ffn_hidden=14336, swiglu=True, tied_embeddings=False, experts=8, experts_per_token=2)
# 61 layers, the first 3 dense, then 1 shared and 256 routed experts (top 8) per layer
DEEPSEEK_V3 = TransformerConfig(
    layers=61, hidden=7168, heads=128, seq_len=4096, vocab=129280, ffn_hidden=18432,
    swiglu=True, tied_embeddings=False, experts=256, experts_per_token=8, shared_experts=1,
    expert_ffn_hidden=2048, moe_layer_freq=(0,) * 3 + (1,) * 58,
    mla=MLA(1536, 512, 128, 64, 128))
LLAMA3_405B = TransformerConfig(
    layers=126, hidden=16384, heads=128, kv_heads=8, seq_len=8192, vocab=128256,
    ffn_hidden=53248, swiglu=True, tied_embeddings=False)


def h800_cluster(nodes):
    """DeepSeek-V3's cluster (no preset): nodes of 8 H800s -- an H100 SXM's compute and
    HBM, NVLink at 160 GB/s achieved ("NVLink offers a bandwidth of 160 GB/s", the
    technical report; 200 GB/s x 0.8 as NCCL counts NVLink) -- and a 400 Gb/s InfiniBand
    NIC per GPU, built with ``spec.from_dict``."""
    return _spec.from_dict({"name": "h800", "nodes": [{
        "devices": 8, "count": nodes, "nics": 8,
        "device": {"name": "H800", "memory_gb": 80, "hbm_gbps": 3350,
                   "peak_tflops": {"float32": 67, "bfloat16": 989},
                   "compute_capability": 9.0},
        "fabric": {"name": "NVLink (H800)", "bandwidth_gbps": 200, "latency_us": 3.4,
                   "efficiency": 0.8}}], "network": {"nic": "ndr-ib"}})


@dataclass(frozen=True)
class PublishedRun:
    """A published layout and its throughput: Llama 3 405B (Llama 3 paper, Table 4, as
    Balaji's SC'24 slide reproduces it: TFLOP/s per GPU; 38-43 % BF16 MFU) and
    DeepSeek-V3 (its technical report: 2.664 M H800-hours for 14.8 T tokens, i.e.
    tokens per second per GPU). ``layout``: the arguments of :func:`estimate`."""

    name: str
    cfg: TransformerConfig
    cluster: tuple            # (preset name or "h800", nodes)
    layout: tuple             # sorted (name, value) pairs for estimate()
    tflops_per_gpu: float = None
    tokens_per_gpu_second: float = None

    def estimate(self):
        """The planner's estimate of the run's layout."""
        name, nodes = self.cluster
        spec = h800_cluster(nodes) if name == "h800" else _spec.preset(name, nodes)
        return estimate(self.cfg, spec, **dict(self.layout))


def _llama3(seq_len, gpus, cp, dp, tflops):
    cfg = replace(LLAMA3_405B, seq_len=seq_len)
    layout = dict(tp=8, cp=cp, pp=16, dp=dp, global_batch=16 * 2**20 // seq_len,
                  micro_batch=1, recompute="none", sequence_parallel=True, zero=2,
                  flash_attention=True, stage_layers=8, virtual_stages=8)
    return PublishedRun(f"Llama 3 405B {seq_len // 1024}K, {gpus:,} H100", cfg,
                        ("dgx-h100", gpus // 8), tuple(sorted(layout.items())),
                        tflops_per_gpu=tflops)


# Llama 3's 126 layers: stages of 8 with one fewer on the first and the last; FSDP
# sharding optimizer state and gradients, not the weights (ZeRO-2; the paper); the
# interleaving (v = 8) is the planner's choice, the paper does not give it. DeepSeek-V3:
# EP 64 over 8 nodes, PP 16, ZeRO-1; 61 layers, stages of at most 4; 15,360 sequences of
# 4,096 tokens; full recomputation (the planner's activations do not fit without it).
PUBLISHED_RUNS = (
    _llama3(8192, 8192, 1, 64, 430),
    _llama3(8192, 16384, 1, 128, 400),
    _llama3(131072, 16384, 16, 8, 380),
    PublishedRun("DeepSeek-V3 4K, 2,048 H800", DEEPSEEK_V3, ("h800", 256), tuple(sorted(dict(
        tp=1, pp=16, dp=128, ep=64, global_batch=15360, micro_batch=1, recompute="full",
        zero=1, flash_attention=True, stage_layers=4).items())),
        tokens_per_gpu_second=14.8e12 / (2.664e6 * 3600)),
)


def frontier_comparison():
    """Text table: the published runs of :data:`PUBLISHED_RUNS` against the planner --
    memory per GPU, step time, model TFLOP/s per GPU and MFU, tokens per second per GPU
    -- and the parameter counts of Mixtral 8x7B and DeepSeek-V3 against the published
    ones. ``benchmarks/bench_planner.py`` prints it."""
    lines = [f"{'run':<30} {'GiB/GPU':>7} {'step s':>7} {'TFLOP/s':>8} {'published':>9} "
             f"{'MFU':>6} {'tok/s/GPU':>9} {'published':>9}"]
    for run in PUBLISHED_RUNS:
        est = run.estimate()
        tokens = est.global_batch * run.cfg.seq_len / est.step_time / est.gpus
        lines.append(
            f"{run.name:<30} {est.memory_per_gpu / _spec.GiB:>7.1f} {est.step_time:>7.2f} "
            f"{est.model_tflops_per_gpu:>8.0f} "
            f"{'-' if run.tflops_per_gpu is None else f'{run.tflops_per_gpu:.0f}':>9} "
            f"{est.mfu:>6.1%} {tokens:>9.0f} "
            f"{'-' if run.tokens_per_gpu_second is None else f'{run.tokens_per_gpu_second:.0f}':>9}")
    lines.append("")
    for name, cfg, total, active in (("Mixtral 8x7B", MIXTRAL_8X7B, 46.7, 12.9),
                                     ("DeepSeek-V3", DEEPSEEK_V3, 671, 37)):
        lines.append(f"{name}: {parameter_count(cfg) / 1e9:.2f} B parameters "
                     f"(published {total} B), {active_parameter_count(cfg) / 1e9:.2f} B "
                     f"active per token (published {active} B)")
    return "\n".join(lines)


# ------------------------------------------------------------ the estimate
@dataclass
class Estimate:
    """What :func:`estimate` predicts for one layout (times in seconds, memory in bytes)."""

    tp: int
    pp: int
    dp: int
    global_batch: int
    micro_batch: int
    recompute: str
    sequence_parallel: bool
    zero: int
    schedule: str
    virtual_stages: int
    dtype: str
    step_time: float
    model_flops: float          # per iteration, no recomputation
    hardware_flops: float       # per iteration, recomputation included
    peak_flops: float           # the device's dense peak for dtype, FLOP/s
    memory: dict
    device_memory: int
    breakdown: dict
    dp_traffic: float = 0.0     # seconds of DP communication before any overlap
    cp: int = 1
    ep: int = 1
    flash_attention: bool = False
    dropped_fraction: float = 0.0  # of the routed token copies (capacity factor < 1)

    @property
    def gpus(self):
        """GPUs the layout uses: ``tp * cp * pp * dp`` (``ep`` is carved out of
        ``dp * cp``)."""
        return self.tp * self.pp * self.dp * self.cp

    @property
    def micro_batches(self):
        """Micro-batches per pipeline and step: ``global_batch / (dp * micro_batch)``."""
        return self.global_batch // (self.dp * self.micro_batch)

    @property
    def model_tflops_per_gpu(self):
        """Model FLOPs (no recomputation) per second per GPU, in TFLOP/s."""
        return self.model_flops / self.step_time / self.gpus / 1e12

    @property
    def hardware_tflops_per_gpu(self):
        """FLOPs executed (recomputation included) per second per GPU, in TFLOP/s: what
        Narayanan et al. 2021 report."""
        return self.hardware_flops / self.step_time / self.gpus / 1e12

    @property
    def mfu(self):
        """Model FLOPs utilisation: model FLOP/s per GPU over the dense peak."""
        return self.model_tflops_per_gpu * 1e12 / self.peak_flops

    @property
    def hfu(self):
        """Hardware FLOPs utilisation: executed FLOP/s per GPU over the dense peak."""
        return self.hardware_tflops_per_gpu * 1e12 / self.peak_flops

    @property
    def memory_per_gpu(self):
        """Bytes in use on the worst GPU (the sum of :attr:`memory`)."""
        return sum(self.memory.values())

    @property
    def fits(self):
        """Whether :attr:`memory_per_gpu` fits the device."""
        return self.memory_per_gpu <= self.device_memory

    def __repr__(self):
        layout = (f"tp={self.tp} pp={self.pp} dp={self.dp} mb={self.micro_batch} "
                  f"recompute={self.recompute} zero={self.zero}")
        if self.virtual_stages > 1:
            layout += f" v={self.virtual_stages}"
        if self.sequence_parallel:
            layout += " sp"
        if self.cp > 1:
            layout += f" cp={self.cp}"
        if self.ep > 1:
            layout += f" ep={self.ep}"
        return (f"<Estimate {layout}: step {self.step_time:.3f} s, "
                f"{self.model_tflops_per_gpu:.0f} TFLOP/s/GPU model, MFU {self.mfu:.1%} "
                f"(HFU {self.hfu:.1%}), "
                f"{self.memory_per_gpu / _spec.GiB:.1f} GiB/GPU"
                f"{'' if self.fits else ' (does not fit)'}>")


def _check_choice(value, choices, what):
    if value not in choices:
        raise ValueError(f"{what} must be one of {', '.join(map(repr, choices))}, "
                         f"got {value!r}")
    return value


def _cluster_spec(cluster):
    spec = getattr(cluster, "spec", cluster)
    if isinstance(spec, str):
        spec = _spec.preset(spec)
    if not isinstance(spec, _spec.ClusterSpec):
        raise ValueError(f"cluster must be a simcluster.Cluster or ClusterSpec, got {cluster!r}")
    return spec


class _Costs:
    """Collective and point-to-point times on one cluster, from its
    :class:`~simcluster.costmodel.CostModel`, remembered by shape (a search asks for the
    same ones many times)."""

    def __init__(self, spec):
        self.model = CostModel(spec)
        self.seen = {}

    def collective(self, op, ranks, nbytes):
        """Seconds of collective ``op`` on global ``ranks`` (a tuple) with ``nbytes``."""
        key = (op, ranks, nbytes)
        if key not in self.seen:
            self.seen[key] = (self.model.collective_time(op, list(ranks), nbytes).seconds
                              if nbytes else 0.0)
        return self.seen[key]

    def p2p(self, src, dst, nbytes):
        """Seconds of one message of ``nbytes`` from ``src`` to ``dst``."""
        key = ("p2p", src, dst, nbytes)
        if key not in self.seen:
            self.seen[key] = self.model.p2p_time(src, dst, nbytes)
        return self.seen[key]


_COSTS = {}  # id(spec) -> (spec, _Costs): specs hold dicts, so they are not hashable


def _costs_for(spec):
    entry = _COSTS.get(id(spec))
    if entry is None or entry[0] is not spec:
        if len(_COSTS) > 32:
            _COSTS.clear()
        entry = _COSTS[id(spec)] = (spec, _Costs(spec))
    return entry[1]


class _Device:
    """The roofline of one device, with an :class:`Efficiency`."""

    def __init__(self, device, dtype, efficiency):
        # a custom device without a 16-bit peak computes at its fp32 one (as flops_for does)
        self.peak = device.peak_flops.get(DTYPES[dtype][0]) or device.peak_flops["float32"]
        self.efficiency = efficiency
        self.flops = self.peak * efficiency.gemm * efficiency.software
        self.hbm = device.hbm_bandwidth * efficiency.hbm * efficiency.software

    def gemm(self, m, n, k, batch=1, value_bytes=2):
        """Seconds of ``batch`` GEMMs of ``m x k`` by ``k x n`` (reads both, writes C)."""
        flops = 2 * batch * m * n * k
        nbytes = batch * value_bytes * (m * k + k * n + m * n)
        size = 1.0
        half = self.efficiency.gemm_half_dim
        for d in (m, n, k):
            size *= d / (d + half)
        return max(flops / (self.flops * size), nbytes / self.hbm)

    def memory_bound(self, nbytes):
        """Seconds of an elementwise kernel moving ``nbytes``."""
        return nbytes / self.hbm


def _layer_times(cfg, dev, b, t, sp, value_bytes, cp=1, flash=False, moe=False, ep=1):
    """Seconds of one layer's forward on one tensor-parallel rank, for a micro-batch of
    ``b`` sequences: ``(weight GEMMs, attention scores, other memory-bound kernels)``;
    the attention scores are the two batched products with the softmax and dropout
    between them (what selective recomputation repeats).

    With ``cp`` the rank holds ``s/cp`` tokens and computes its queries against every
    key in ``cp`` blocks of ``s/cp x s/cp`` (ring attention; the load-balanced split
    gives every rank the same work). ``flash``: the products skip the masked half
    (causal) and no scores go through memory. ``moe``: the MLP is the router, the
    rank's ``experts/ep`` experts on the token copies routed to them (as many as the
    rank sends when routing is balanced, times the capacity factor) and the shared
    experts, plus the dispatch and combine permutations (read and write each copy)."""
    s, h, f = cfg.seq_len // cp, cfg.hidden, cfg.ffn
    tokens = b * s
    kv_dim = cfg.kv * cfg.head_dim
    heads = cfg.heads // t
    if cfg.mla:
        # the down-projections (to the compressed query and key-value) in one GEMM,
        # unsharded; the per-head up-projections and the output projection over t
        m, a = cfg.mla, cfg.heads
        gemms = dev.gemm(tokens, m.q_rank + m.kv_rank + m.rope_dim, h,
                         value_bytes=value_bytes)
        gemms += dev.gemm(tokens, a * cfg.qk_head_dim // t, m.q_rank or h,
                          value_bytes=value_bytes)
        gemms += dev.gemm(tokens, a * (m.nope_dim + m.v_dim) // t, m.kv_rank,
                          value_bytes=value_bytes)
        gemms += dev.gemm(tokens, h, a * m.v_dim // t, value_bytes=value_bytes)
    else:
        gemms = (dev.gemm(tokens, (h + 2 * kv_dim) // t, h, value_bytes=value_bytes)
                 + dev.gemm(tokens, h, h // t, value_bytes=value_bytes))
    gate = 2 if cfg.swiglu else 1
    if moe:
        fe, copies = cfg.expert_ffn, tokens * float(_routed_copies(cfg))
        local = cfg.experts // ep
        per_expert = copies / local  # balanced routing: as many as the rank sent
        gemms += dev.gemm(tokens, cfg.experts, h, value_bytes=value_bytes)  # router
        gemms += dev.gemm(per_expert, gate * fe // t, h, batch=local,
                          value_bytes=value_bytes)
        gemms += dev.gemm(per_expert, h, fe // t, batch=local, value_bytes=value_bytes)
        if cfg.shared_experts:
            fs = cfg.shared_experts * fe
            gemms += dev.gemm(tokens, gate * fs // t, h, value_bytes=value_bytes)
            gemms += dev.gemm(tokens, h, fs // t, value_bytes=value_bytes)
        inner = (copies + cfg.shared_experts * tokens) * (fe // t)
    else:
        gemms += dev.gemm(tokens, gate * f // t, h, value_bytes=value_bytes)
        gemms += dev.gemm(tokens, h, f // t, value_bytes=value_bytes)
        inner = tokens * (f // t)
    # scores Q K^T and probabilities x V: one s x s product per head and sequence
    attention = (dev.gemm(s, s, cfg.qk_head_dim, batch=b * heads * cp, value_bytes=value_bytes)
                 + dev.gemm(s, cfg.v_head_dim, s, batch=b * heads * cp,
                            value_bytes=value_bytes))
    if flash:  # causal: the blocks above the diagonal are skipped
        attention /= 2
    # softmax (read 2, write 2) and dropout (read 2, write 2, mask 1): fused with the
    # scaling and mask, or eager, where scaling the scores is one more pass (read 2, write 2)
    dropout = 5 if cfg.dropout else 0
    per_score = 4 + dropout + (0 if dev.efficiency.fused else 4)
    if not flash:
        attention += dev.memory_bound(per_score * b * heads * s * s * cp)
    rows = tokens / t if sp else tokens  # LayerNorm, dropout run on 1/t with SP
    # two LayerNorms (read 2, write 2 each); two adds into the residual (read 4, write 2),
    # each after a dropout (fused: + mask 1; eager: a pass of its own, read 2 write 2 mask 1);
    # bias-GeLU on the MLP's inner activations (read 2, write 2) or SwiGLU (read 4, write 2)
    residual_add = 6 + (dropout if not dev.efficiency.fused else 1 if cfg.dropout else 0)
    elementwise = dev.memory_bound(rows * h * (2 * 4 + 2 * residual_add)
                                   + inner * (6 if cfg.swiglu else 4))
    if moe:  # permute the copies to their experts and back (read 2, write 2 each way)
        elementwise += dev.memory_bound(8 * copies * h / t)
    if not dev.efficiency.fused:
        # eager attention copies Q, K, V into (batch x heads) order and the context back
        elementwise += dev.memory_bound(4 * 4 * tokens * h / t)
    return gemms, attention, elementwise


def _check_stages(cfg, pp, v, stage_layers=None):
    """The layers of the fullest pipeline stage: ``layers / pp``, or ``stage_layers``
    when the stages are uneven (Llama 3 405B: 126 layers on 16 stages, the first and the
    last holding one fewer; DeepSeek-V3: 61 on 16)."""
    if stage_layers is None:
        if cfg.layers % (pp * v):
            raise ValueError(f"layers={cfg.layers} is not a multiple of pp * virtual_stages "
                             f"= {pp} * {v}; every pipeline chunk needs the same layers "
                             "(or give stage_layers for uneven stages)")
        return cfg.layers // pp
    _positive_int(stage_layers, "stage_layers")
    if not -(-cfg.layers // pp) <= stage_layers <= cfg.layers or stage_layers % v:
        raise ValueError(f"stage_layers={stage_layers} must be at least layers / pp = "
                         f"{cfg.layers} / {pp} (rounded up), at most layers, and a multiple "
                         f"of virtual_stages={v}")
    return stage_layers


def _check_cp_ep(cfg, cp, ep, dp):
    """Refuse a context- or expert-parallel degree that does not divide what it shards."""
    _positive_int(cp, "cp")
    _positive_int(ep, "ep")
    if cp > 1 and (cp > cfg.seq_len or cfg.seq_len % (2 * cp)):
        raise ValueError(f"cp={cp} must divide the sequence: the load-balanced causal split "
                         f"cuts seq_len={cfg.seq_len} into 2 * cp = {2 * cp} equal chunks")
    if ep > 1:
        if not cfg.experts:
            raise ValueError(f"ep={ep} needs a mixture of experts (experts > 0)")
        if ep > cfg.experts or cfg.experts % ep:
            raise ValueError(f"ep={ep} must divide experts={cfg.experts}")
        if (dp * cp) % ep:
            raise ValueError(f"ep={ep} must divide dp * cp = {dp} * {cp} = {dp * cp}: the "
                             "expert-parallel ranks are carved out of the data- and "
                             "context-parallel ones")


def estimate(cfg, cluster, tp=1, pp=1, dp=1, global_batch=None, micro_batch=None,
             recompute="full", sequence_parallel=False, zero=0, schedule="1f1b",
             virtual_stages=1, dtype="bf16", efficiency=MEGATRON_A100, cp=1, ep=1,
             flash_attention=False, stage_layers=None):
    """Predict one training step of ``cfg`` on ``cluster`` with ``tp x cp x pp x dp``
    GPUs.

    Ranks are laid out as Megatron-LM does: tensor-parallel ranks adjacent (inside a node
    when ``tp`` <= GPUs per node), then context-parallel, then data-parallel, then
    pipeline stages. ``cp`` shards every sequence into ``cp`` parts (ring attention,
    load-balanced causal split); ``ep`` shards the experts of a mixture of experts over
    ``ep`` of the ``dp * cp`` ranks (docs/planner.md). ``flash_attention``: attention as
    FlashAttention computes it (causal, no scores in memory). ``stage_layers``: the
    layers of the fullest pipeline stage when ``layers`` does not split evenly.
    ``micro_batch=None`` tries every micro-batch size that divides the per-replica batch
    and returns the fastest that fits (the fastest overall if none fits).
    ``virtual_stages > 1`` is the interleaved 1F1B schedule (``schedule`` "1f1b" or
    "interleaved"). ``zero`` shards optimizer state (1), gradients (2) and weights (3)
    over the data-parallel ranks. ``efficiency`` is how close compute comes to the
    roofline (:data:`MEGATRON_A100`; :data:`ROOFLINE` charges ops as the executing
    simulator does). Raises ``ValueError`` naming an invalid value.
    """
    spec = _cluster_spec(cluster)
    if not isinstance(cfg, TransformerConfig):
        raise ValueError(f"cfg must be a planner.TransformerConfig, got {cfg!r}")
    if not isinstance(efficiency, Efficiency):
        raise ValueError(f"efficiency must be a planner.Efficiency (MEGATRON_A100, "
                         f"ROOFLINE), got {efficiency!r}")
    if global_batch is None:
        raise ValueError("global_batch is required: sequences per iteration")
    for name, value in (("tp", tp), ("pp", pp), ("dp", dp), ("global_batch", global_batch),
                        ("virtual_stages", virtual_stages)):
        _positive_int(value, name)
    _check_cp_ep(cfg, cp, ep, dp)
    if not isinstance(flash_attention, bool):
        raise ValueError(f"flash_attention must be True or False, got {flash_attention!r}")
    _check_choice(recompute, RECOMPUTE, "recompute")
    _check_choice(schedule, SCHEDULES, "schedule")
    _check_choice(dtype, tuple(DTYPES), "dtype")
    _check_choice(zero, (0, 1, 2, 3), "zero")
    if cfg.heads % tp:
        raise ValueError(f"heads={cfg.heads} is not divisible by tp={tp}")
    if cfg.kv % tp:
        raise ValueError(f"kv_heads={cfg.kv} is not divisible by tp={tp}")
    if cfg.ffn % tp or cfg.vocab % tp or cfg.expert_ffn % tp:
        raise ValueError(f"ffn_hidden={cfg.ffn}, expert_ffn_hidden={cfg.expert_ffn} and "
                         f"vocab={cfg.vocab} must be divisible by tp={tp}")
    if cp == 1 and tp * pp * dp > spec.world_size:
        raise ValueError(f"tp * pp * dp = {tp} * {pp} * {dp} = {tp * pp * dp} GPUs, more "
                         f"than the cluster's {spec.world_size}")
    if tp * cp * pp * dp > spec.world_size:
        raise ValueError(f"tp * cp * pp * dp = {tp} * {cp} * {pp} * {dp} = "
                         f"{tp * cp * pp * dp} GPUs, more than the cluster's "
                         f"{spec.world_size}")
    if schedule == "gpipe" and virtual_stages > 1:
        raise ValueError(f"virtual_stages={virtual_stages} needs the interleaved 1F1B "
                         "schedule, not gpipe")
    if schedule == "interleaved" and virtual_stages < 2:
        raise ValueError("schedule='interleaved' needs virtual_stages >= 2")
    if virtual_stages > 1 and pp == 1:
        raise ValueError(f"virtual_stages={virtual_stages} needs pp > 1")
    _check_stages(cfg, pp, virtual_stages, stage_layers)
    if global_batch % dp:
        raise ValueError(f"global_batch={global_batch} is not divisible by dp={dp}")
    per_replica = global_batch // dp
    if micro_batch is None:
        options = [b for b in _divisors(per_replica)
                   if (virtual_stages == 1 or (per_replica // b) % pp == 0)]
        if not options:
            raise ValueError(f"no micro-batch size gives a multiple of pp={pp} micro-batches "
                             f"from {per_replica} sequences per replica")
        estimates = [estimate(cfg, spec, tp, pp, dp, global_batch, b, recompute,
                              sequence_parallel, zero, schedule, virtual_stages, dtype,
                              efficiency, cp, ep, flash_attention, stage_layers)
                     for b in options]
        fitting = [e for e in estimates if e.fits] or estimates
        return min(fitting, key=lambda e: (e.step_time, -e.micro_batch))
    _positive_int(micro_batch, "micro_batch")
    if per_replica % micro_batch:
        raise ValueError(f"micro_batch={micro_batch} does not divide the {per_replica} "
                         f"sequences per data-parallel replica (global_batch / dp)")
    m = per_replica // micro_batch
    if virtual_stages > 1 and m % pp:
        raise ValueError(f"the interleaved schedule needs the micro-batches ({m}) to be a "
                         f"multiple of pp={pp}")
    return _estimate(cfg, spec, tp, pp, dp, global_batch, micro_batch, recompute,
                     bool(sequence_parallel), zero, schedule, virtual_stages, dtype,
                     efficiency, cp, ep, flash_attention,
                     _check_stages(cfg, pp, virtual_stages, stage_layers))


def _estimate(cfg, spec, tp, pp, dp, global_batch, b, recompute, sp, zero, schedule, v,
              dtype, efficiency, cp, ep, flash, layers):
    costs = _costs_for(spec)
    device = spec.device_of(0)
    dev = _Device(device, dtype, efficiency)
    value_bytes = DTYPES[dtype][1]
    s, h, V = cfg.seq_len // cp, cfg.hidden, cfg.vocab  # s: tokens of a sequence per GPU
    m = global_batch // (dp * b)
    # the fullest stage holds as many MoE layers as it can (the slowest)
    moe_layers = min(layers, cfg.moe_layers)

    # --- one micro-batch on one stage: forward, recomputation, backward
    gemms, attention, kernels = _layer_times(cfg, dev, b, tp, sp, value_bytes, cp, flash)
    forward = gemms + attention + kernels
    # selective: the attention-score products with their softmax and dropout only
    recompute_time = {"none": 0.0, "selective": attention, "full": forward}[recompute]
    layer_compute = 3 * forward  # backward: twice the forward
    # tensor-parallel communication: 2 all-reduces forward, 2 backward (each a
    # reduce-scatter plus an all-gather with sequence parallelism), 2 more to recompute
    tp_ranks = tuple(range(tp))
    act_bytes = b * s * h * value_bytes
    if sp:
        one = (costs.collective("reduce_scatter", tp_ranks, act_bytes)
               + costs.collective("all_gather", tp_ranks, act_bytes))
    else:
        one = costs.collective("all_reduce", tp_ranks, act_bytes)
    tp_per_layer = one * (4 + (2 if recompute == "full" else 0))
    # output layer and loss on the last stage (vocabulary-parallel)
    logits = (3 * dev.gemm(b * s, V // tp, h, value_bytes=value_bytes)
              + dev.memory_bound(CROSS_ENTROPY_BYTES_PER_LOGIT * b * s * V / tp))
    logits_tp = 2 * one  # the output layer's input gathered forward, reduced backward
    if moe_layers:
        moe_gemms, moe_attention, moe_kernels = _layer_times(
            cfg, dev, b, tp, sp, value_bytes, cp, flash, moe=True, ep=ep)
        moe_forward = moe_gemms + moe_attention + moe_kernels
        moe_recompute = {"none": 0.0, "selective": moe_attention,
                         "full": moe_forward}[recompute]
        compute_mb = (layers - moe_layers) * layer_compute + moe_layers * 3 * moe_forward + logits
        recompute_mb = (layers - moe_layers) * recompute_time + moe_layers * moe_recompute
    else:
        compute_mb = layers * layer_compute + logits
        recompute_mb = layers * recompute_time
    tp_mb = layers * tp_per_layer + logits_tp
    # pipeline: a send forward and one backward per chunk boundary; each tensor-parallel
    # rank sends 1/t of the activations across nodes, then all-gathers over its fabric
    # (Megatron-LM's scatter/gather optimisation)
    pp_mb = 0.0
    if pp > 1:
        stride = tp * cp * dp
        chunk = act_bytes // tp if tp > 1 else act_bytes
        hop = costs.p2p(0, stride, chunk)
        if tp > 1:
            hop += costs.collective("all_gather", tp_ranks, act_bytes)
        pp_mb = 2 * v * hop
    t_mb = compute_mb + recompute_mb + tp_mb + pp_mb
    per_node = spec.nodes[0].devices
    more = {}  # the terms of context and expert parallelism, when they are used
    if cp > 1:
        cp_mb = layers * _cp_exposed(cfg, costs, b, s, tp, cp, per_node, value_bytes,
                                     attention / cp, recompute)
        more["cp_communication"] = m * cp_mb
        t_mb += cp_mb
    if moe_layers and ep > 1:
        # dispatch and combine forward, their two gradients backward, two more to recompute
        exchanges = 4 + (2 if recompute == "full" else 0)
        copies = b * s * float(_routed_copies(cfg)) * h * value_bytes / tp
        ep_mb = moe_layers * exchanges * _all_to_all(costs, copies, tp, ep, per_node)
        more["ep_communication"] = m * ep_mb
        t_mb += ep_mb
    bubble = (pp - 1) / v * t_mb

    # --- data parallel: the dense parameters over the dp * cp ranks of one stage, the
    # experts over the dp * cp / ep ranks holding the same experts
    stage_params = max(_stage_parameters(cfg, pp, tp, layers))
    dp_ranks = tuple(i * tp for i in range(dp * cp))
    groups = [(dp_ranks, stage_params)]
    experts = _stage_expert_parameters(cfg, layers, tp, ep)
    if experts:
        groups.append((tuple(i * tp * ep for i in range(dp * cp // ep)), experts))
    state = model_state_bytes(dtype)
    dp_exposed = _dp_exposed(costs, groups, layers, m, pp, zero, compute_mb + recompute_mb,
                             state) if dp * cp > 1 else 0.0
    # the same collectives with no compute to hide behind: what overlap has to hide
    dp_traffic = _dp_exposed(costs, groups, layers, m, pp, zero, 0.0,
                             state) if dp * cp > 1 else 0.0

    shard = dp * cp if zero >= 1 else 1
    optimizer = dev.memory_bound(ADAM_BYTES_PER_PARAMETER * stage_params / shard)
    if experts:
        optimizer += dev.memory_bound(ADAM_BYTES_PER_PARAMETER * experts
                                      / (dp * cp // ep if zero >= 1 else 1))

    breakdown = {
        "compute": m * compute_mb,
        "recompute": m * recompute_mb,
        "tp_communication": m * tp_mb,
        "pp_communication": m * pp_mb,
        **more,
        "bubble": bubble,
        "dp_communication": dp_exposed,
        "optimizer": optimizer,
    }
    step = sum(breakdown.values())
    memory = _memory(cfg, tp, pp, dp, b, m, recompute, sp, zero, schedule, v, value_bytes,
                     efficiency.fused, state, cp, ep, flash, layers)
    return Estimate(tp=tp, pp=pp, dp=dp, global_batch=global_batch, micro_batch=b,
                    recompute=recompute, sequence_parallel=sp, zero=zero,
                    schedule="interleaved" if v > 1 else schedule, virtual_stages=v,
                    dtype=dtype, step_time=step,
                    model_flops=flops_per_iteration(cfg, global_batch, "none", flash),
                    hardware_flops=flops_per_iteration(cfg, global_batch, recompute, flash),
                    peak_flops=dev.peak, memory=memory, device_memory=device.memory,
                    breakdown=breakdown, dp_traffic=dp_traffic, cp=cp, ep=ep,
                    flash_attention=flash, dropped_fraction=dropped_fraction(cfg))


def _cp_exposed(cfg, costs, b, s, t, cp, per_node, value_bytes, block, recompute):
    """Seconds of one layer's ring-attention exchange not hidden behind its attention.

    Each of ``cp - 1`` ring steps sends the rank's K and V (``s`` tokens, its ``1/t`` of
    the heads) to the next rank while the current block is computed (``block``: one
    step's forward attention); backward sends K, V and their gradients while computing
    twice as much; full recomputation repeats the forward. The ring of ``cp`` ranks
    stride ``t`` stays inside a node when ``t * cp`` fits, else every step waits for the
    hop between nodes. Only what exceeds the block is exposed; the hidden part slows the
    compute by ``OVERLAP_SLOWDOWN`` (:func:`_exposed`)."""
    per_token = (cfg.heads * (cfg.qk_head_dim + cfg.v_head_dim) if cfg.mla
                 else 2 * cfg.kv * cfg.head_dim)
    kv_bytes = b * s * per_token // t * value_bytes
    peer = t if t * cp <= per_node else per_node
    forward = _exposed(costs.p2p(0, peer, kv_bytes), block)
    backward = _exposed(costs.p2p(0, peer, 2 * kv_bytes), 2 * block)
    return (cp - 1) * ((2 if recompute == "full" else 1) * forward + backward)


def _exposed(seconds, window):
    """What of ``seconds`` of communication a ``window`` of compute does not hide, plus
    the slowdown of the compute that runs beside the hidden part (``OVERLAP_SLOWDOWN``)."""
    hidden = min(seconds, window)
    return seconds - hidden + hidden * (OVERLAP_SLOWDOWN - 1)


def _all_to_all(costs, nbytes, t, ep, per_node):
    """Seconds of one balanced all-to-all on ``ep`` ranks (stride ``t``) in which every
    rank sends ``nbytes`` in all (``1/ep`` of it to itself). Per link, as lanes working
    at once: the bytes for peers in the rank's node over its NVLink, those for other
    nodes over its own NIC; it ends when the slower lane does. Every rank's lanes carry
    the same, so this is also the slowest rank's time."""
    together = max(1, min(ep, per_node // t))  # the group's ranks in one node
    intra = nbytes * (together - 1) / ep
    inter = nbytes * (ep - together) / ep
    seconds = costs.p2p(0, t, intra) if intra else 0.0
    if inter:
        seconds = max(seconds, costs.p2p(0, per_node, inter))
    return seconds


def _dp_exposed(costs, groups, layers, m, pp, zero, busy_mb, state):
    """Seconds of data-parallel communication not hidden behind compute.

    ``groups``: ``(ranks, parameters)`` pairs reduced one after the other (the dense
    parameters over the data-parallel ranks, the experts over theirs). ZeRO 0: one
    all-reduce of the gradients; 1 and 2: a reduce-scatter of the gradients
    and, after the optimizer step, an all-gather of the updated weights; 3: per layer (and
    one more unit for embeddings and head, as FSDP wraps them), an all-gather of the
    weights before each forward and backward -- every micro-batch's with ``pp == 1``, once
    per step with ``pp > 1`` (torch's pipelining keeps them gathered across micro-batches)
    -- and a reduce-scatter of the gradients. With ``pp == 1`` the gradient reduction
    overlaps the last micro-batch's backward (DDP's buckets, FSDP's per-layer hooks) and
    ZeRO-3's gathers the rest of the compute (prefetch); overlapped compute runs
    ``OVERLAP_SLOWDOWN`` times slower. With ``pp > 1`` they are exposed, as Megatron-LM
    reduces gradients after the pipeline flush. ``state``: :func:`model_state_bytes`.
    """
    reduce = gathers = after = 0.0
    for ranks, params in groups:
        if len(ranks) < 2:
            continue
        weights, grads = params * state[0], params * state[1]
        if zero == 0:
            reduce += costs.collective("all_reduce", ranks, grads)
        elif zero in (1, 2):
            reduce += costs.collective("reduce_scatter", ranks, grads)
            after += costs.collective("all_gather", ranks, weights)
        else:
            units = layers + 1
            reduce += units * costs.collective("reduce_scatter", ranks, grads / units)
            gathers += ((2 * m if pp == 1 else 2) * units
                        * costs.collective("all_gather", ranks, weights / units))
    if pp > 1:
        return reduce + gathers + after
    reduce_window = 2 / 3 * busy_mb  # the last micro-batch's backward
    gather_window = m * busy_mb - reduce_window
    return after + _exposed(reduce, reduce_window) + _exposed(gathers, gather_window)


def _stage_parameters(cfg, pp, tp, layers=None):
    """Parameters one GPU of the first and of the last pipeline stage holds, the
    experts of a mixture of experts left out (:func:`_stage_expert_parameters`): the
    embeddings on the first, the final norm and output layer on the last (with tied
    embeddings and ``pp > 1`` the last stage keeps its own copy of the embedding matrix,
    as Megatron-LM does). With ``pp == 1`` both are the whole model over ``tp``.
    ``layers``: those of the fullest stage (default ``layers / pp``), as many MoE layers
    among them as there are."""
    layers = cfg.layers // pp if layers is None else layers
    if cfg.experts:
        moe = min(layers, cfg.moe_layers)
        layers = ((layers - moe) * cfg.layer_parameters() + moe * cfg.layer_parameters(0)) / tp
    else:
        layers = layers * cfg.layer_parameters() / tp
    h = cfg.hidden
    positions = 0 if cfg.swiglu else cfg.seq_len * h
    embedding = cfg.vocab * h / tp + positions
    final_norm = h if cfg.swiglu else 2 * h
    output = cfg.vocab * h / tp if (pp > 1 or not cfg.tied_embeddings) else 0
    if pp == 1:
        return layers + embedding + output + final_norm, layers + embedding + output + final_norm
    return layers + embedding, layers + output + final_norm


def _stage_expert_parameters(cfg, layers, tp, ep):
    """Routed-expert parameters one GPU of the fullest stage holds: its MoE layers'
    experts over ``ep`` ranks, each expert's matrices over ``tp`` (Megatron-LM's
    default expert tensor parallelism)."""
    if not cfg.experts:
        return 0
    per_expert = cfg.layer_parameters(1) - cfg.layer_parameters(0)
    return min(layers, cfg.moe_layers) * cfg.experts * per_expert / (tp * ep)


def _in_flight(pp, m, schedule, v):
    """Micro-batches whose activations the first stage holds at its peak (the last stage
    holds ``pp - 1`` fewer)."""
    if pp == 1:
        return 1
    if schedule == "gpipe":
        return m
    if v > 1:  # interleaved 1F1B: p + (p - 1)/v micro-batches' worth (Korthikanti et al.)
        return min(m, pp + (pp - 1) / v)
    return min(m, pp)


def _zero3_unsharded(params, weights, grads, layers, pp, state):
    """ZeRO-3's shards plus what is unsharded at the peak, as FSDP2 does it (one unit per
    layer and one for the rest): with ``pp == 1`` two units' weights (the one running and
    the one prefetched) and one unit's gradients before its reduce-scatter; with ``pp > 1``
    the whole stage's weights and gradients, which torch's pipelining keeps unsharded
    across micro-batches (the gradients are reduced after the last one). ``state``:
    :func:`model_state_bytes`."""
    weight_bytes, grad_bytes = state[0], state[1]
    unit = params / (layers + 1)
    if pp > 1:
        return weights + params * weight_bytes, grads + params * grad_bytes
    return weights + 2 * unit * weight_bytes, grads + unit * grad_bytes


def _memory(cfg, tp, pp, dp, b, m, recompute, sp, zero, schedule, v, value_bytes, fused,
            state, cp=1, ep=1, flash=False, layers=None):
    """Bytes per GPU by category on the worse of the first and the last stage, booked as
    the executing simulator books them (``simcluster.memory.CATEGORIES``; its "optimizer
    state" is "optimizer" here, and its "activations" are "activations" + "workspace").

    "parameters", "gradients", "optimizer" are the model states, ``state`` =
    :func:`model_state_bytes` per parameter, sharded by the ZeRO stage; "gradients" are
    the parameter gradients only. "activations" is what the layers store for their
    backward, as Korthikanti et al. 2022 count it (Table 2 per layer, times the layers and
    micro-batches in flight; their Figure 1); "workspace" is what comes on top at the
    peak: the activations of the layer being recomputed and back-propagated, and the
    output layer's fp32 logits. "other" is the backward's activation gradients: the
    gradient of the attention probabilities (and, eager, of the scores), the largest.

    Context parallelism divides the activations, logits and score gradients by ``cp``
    (``s/cp`` tokens per GPU) and shards the model states over ``dp * cp`` ranks; the
    experts of a mixture of experts are sharded over ``ep`` ranks and their states over
    the ``dp * cp / ep`` that hold the same experts. ``flash``: no score gradients."""
    scale = value_bytes / 2  # the formulas count 16-bit activations
    layers = cfg.layers // pp if layers is None else layers
    moe_layers = min(layers, cfg.moe_layers)

    def per_layer(how, moe=False):
        return activation_memory_per_layer(cfg, b, tp, sp, how, cp, flash, moe) * scale

    # the layer being recomputed and back-propagated holds its activations (an MoE
    # layer's, the larger, when the stage has one)
    working = 0.0
    if recompute == "full":
        working = per_layer("none", bool(moe_layers))
    elif recompute == "selective":  # the attention scores it recomputes
        working = per_layer("none") - per_layer("selective")
    # fp32 logits of one micro-batch on the last stage (vocabulary-parallel)
    logits = 4 * b * (cfg.seq_len // cp) * cfg.vocab / tp
    # the backward of attention holds the gradient of the probabilities and, eager, also
    # that of the scores (the fused softmax backward writes it in place); flash
    # attention recomputes them block by block
    score_grads = 0.0 if flash else (
        (1 if fused else 2) * 2 * cfg.heads * (cfg.seq_len // cp * cfg.seq_len) * b / tp
        * scale)
    weight_bytes, grad_bytes, optimizer_bytes = state
    first_params, last_params = _stage_parameters(cfg, pp, tp, layers)
    experts = _stage_expert_parameters(cfg, layers, tp, ep)
    shard, expert_shard = dp * cp, dp * cp // ep
    in_flight = _in_flight(pp, m, schedule, v)
    stored = (per_layer(recompute) * layers if not moe_layers else
              per_layer(recompute) * (layers - moe_layers)
              + per_layer(recompute, True) * moe_layers)
    stages = []
    for params, held, extra in ((first_params, in_flight, 0.0),
                                (last_params, max(1, in_flight - (pp - 1)), logits)):
        activations = stored * held
        workspace = working + (logits if pp == 1 else extra)
        weights = params * weight_bytes / (shard if zero >= 3 else 1)
        grads = params * grad_bytes / (shard if zero >= 2 else 1)
        optimizer = params * optimizer_bytes / (shard if zero >= 1 else 1)
        if experts:
            weights += experts * weight_bytes / (expert_shard if zero >= 3 else 1)
            grads += experts * grad_bytes / (expert_shard if zero >= 2 else 1)
            optimizer += experts * optimizer_bytes / (expert_shard if zero >= 1 else 1)
        if zero == 3 and shard > 1:
            weights, grads = _zero3_unsharded(params + experts, weights, grads, layers, pp,
                                              state)
        stages.append({
            "parameters": int(weights),
            "gradients": int(grads),
            "optimizer": int(optimizer),
            "activations": int(activations),
            "workspace": int(workspace),
            "other": int(score_grads)})
        if pp == 1:
            break
    return max(stages, key=lambda d: sum(d.values()))


def search(cfg, cluster, global_batch, gpus=None, **constraints):
    """Every layout of ``gpus`` GPUs (default: the whole cluster) that fits, fastest first.

    ``constraints`` fix or restrict any argument of :func:`estimate`: a value
    (``tp=8``, ``recompute="full"``) or a list of values to try (``zero=[0, 1]``).
    Unfixed: ``tp`` and ``pp`` range over the divisors that divide heads and layers
    (``tp`` at most the GPUs of a node), ``recompute`` over all three, ``zero`` over 0-3,
    ``micro_batch`` over the best size; no interleaving, no sequence parallelism, no
    context parallelism (``cp=[1, 2, 4]`` tries it); for a mixture of experts ``ep``
    over every degree that divides the experts and ``dp * cp``.
    """
    spec = _cluster_spec(cluster)
    gpus = spec.world_size if gpus is None else _positive_int(gpus, "gpus")
    if gpus > spec.world_size:  # as estimate() refuses it, rather than "nothing fits"
        raise ValueError(f"gpus={gpus} is more than the cluster's {spec.world_size}")
    allowed = {"tp", "pp", "dp", "micro_batch", "recompute", "sequence_parallel", "zero",
               "schedule", "virtual_stages", "dtype", "efficiency", "cp", "ep",
               "flash_attention", "stage_layers"}
    unknown = set(constraints) - allowed
    if unknown:
        raise ValueError(f"unknown constraint(s) {', '.join(sorted(unknown))}; allowed: "
                         f"{', '.join(sorted(allowed))}")

    def values(name, default):
        value = constraints.get(name, default)
        return list(value) if isinstance(value, (list, tuple, range)) else [value]

    per_node = max(n.devices for n in spec.nodes)
    divisors = _divisors(gpus)
    tps = values("tp", [d for d in divisors if d <= per_node and cfg.heads % d == 0
                        and cfg.kv % d == 0])
    pps = values("pp", [d for d in divisors if cfg.layers % d == 0])
    results = []
    for tp, pp, cp, recompute, zero, sp, schedule, v, dtype in itertools.product(
            tps, pps, values("cp", [1]), values("recompute", list(RECOMPUTE)),
            values("zero", [0, 1, 2, 3]), values("sequence_parallel", [False]),
            values("schedule", ["1f1b"]), values("virtual_stages", [1]),
            values("dtype", ["bf16"])):
        if gpus % (tp * pp * cp):
            continue
        dp = gpus // (tp * pp * cp)
        if "dp" in constraints and dp not in values("dp", []):
            continue
        if zero and dp * cp == 1:
            continue
        eps = values("ep", [e for e in _divisors(cfg.experts or 1)
                            if (dp * cp) % e == 0])
        for b, ep in itertools.product(values("micro_batch", [None]), eps):
            try:
                est = estimate(cfg, spec, tp=tp, pp=pp, dp=dp, global_batch=global_batch,
                               micro_batch=b, recompute=recompute, sequence_parallel=sp,
                               zero=zero, schedule=schedule, virtual_stages=v, dtype=dtype,
                               efficiency=constraints.get("efficiency", MEGATRON_A100),
                               cp=cp, ep=ep,
                               flash_attention=constraints.get("flash_attention", False),
                               stage_layers=constraints.get("stage_layers"))
            except ValueError:
                continue
            if est.fits:
                results.append(est)
    return sorted(results, key=lambda e: (e.step_time, e.gpus, e.tp, e.pp, e.zero, e.cp,
                                          e.ep))


def table1_estimates():
    """``[(row, Estimate)]`` for every row of :data:`MEGATRON_TABLE1` on ``dgx-a100``
    nodes, with the paper's layout, micro-batch size, interleaving, fp16 and full
    recomputation."""
    out = []
    for row in MEGATRON_TABLE1:
        cluster = _spec.preset("dgx-a100", nodes=row.gpus // 8)
        est = estimate(row.config(), cluster, tp=row.tp, pp=row.pp, dp=row.dp,
                       global_batch=row.batch, micro_batch=row.micro_batch,
                       recompute="full", virtual_stages=row.virtual_stages,
                       dtype="fp16")
        out.append((row, est))
    return out


def table1_comparison():
    """Text table: Narayanan et al. 2021, Table 1 against the planner -- per row the
    layout, the paper's TFLOP/s per GPU, the prediction and the error -- and the mean
    absolute error. The lesson and ``benchmarks/bench_planner.py`` print it."""
    lines = [f"{'params':>8} {'t':>2} {'p':>3} {'v':>2} {'d':>3} {'GPUs':>5} {'batch':>5} "
             f"{'mb':>3} {'paper':>6} {'planner':>8} {'error':>7}"]
    errors = []
    for row, est in table1_estimates():
        predicted = est.hardware_tflops_per_gpu
        error = predicted / row.tflops_per_gpu - 1
        errors.append(abs(error))
        lines.append(f"{row.params_billion:>7.1f}B {row.tp:>2} {row.pp:>3} "
                     f"{row.virtual_stages:>2} {row.dp:>3} {row.gpus:>5} {row.batch:>5} "
                     f"{row.micro_batch:>3} {row.tflops_per_gpu:>6.0f} {predicted:>8.1f} "
                     f"{error:>+7.1%}")
    lines.append(f"TFLOP/s per GPU (recomputation counted, Eq. 3); mean absolute error "
                 f"{sum(errors) / len(errors):.1%}, largest {max(errors):.1%}")
    return "\n".join(lines)


def korthikanti_estimates():
    """``[(row, full, present)]`` for every row of :data:`KORTHIKANTI_TABLE5` on
    ``dgx-a100`` nodes, fp16: ``full`` with full recomputation, ``present`` with sequence
    parallelism and selective recomputation -- the planner's efficiencies unchanged (they
    were calibrated on Narayanan et al. 2021 only)."""
    out = []
    for row in KORTHIKANTI_TABLE5:
        cluster = _spec.preset("dgx-a100", nodes=row.gpus // 8)
        common = dict(tp=row.tp, pp=row.pp, dp=1, global_batch=row.batch,
                      micro_batch=row.micro_batch, virtual_stages=row.virtual_stages,
                      dtype="fp16")
        out.append((row, estimate(row.config(), cluster, recompute="full", **common),
                    estimate(row.config(), cluster, recompute="selective",
                             sequence_parallel=True, **common)))
    return out


def korthikanti_comparison():
    """Text table: Korthikanti et al. 2022, Table 5 (iteration seconds with full
    recomputation, and with sequence parallelism + selective recomputation) against the
    planner, with the error per value and the mean absolute error."""
    lines = [f"{'model':>5} {'t':>2} {'p':>3} {'v':>2} {'GPUs':>5} {'batch':>5} "
             f"{'full: paper':>11} {'planner':>8} {'error':>7}   "
             f"{'sel+SP: paper':>13} {'planner':>8} {'error':>7}"]
    errors = []
    for row, full, present in korthikanti_estimates():
        e_full = full.step_time / row.full_recompute_seconds - 1
        e_present = present.step_time / row.present_work_seconds - 1
        errors += [abs(e_full), abs(e_present)]
        lines.append(f"{row.name:>5} {row.tp:>2} {row.pp:>3} {row.virtual_stages:>2} "
                     f"{row.gpus:>5} {row.batch:>5} {row.full_recompute_seconds:>11.2f} "
                     f"{full.step_time:>8.2f} {e_full:>+7.1%}   "
                     f"{row.present_work_seconds:>13.2f} {present.step_time:>8.2f} "
                     f"{e_present:>+7.1%}")
    lines.append(f"iteration seconds; mean absolute error {sum(errors) / len(errors):.1%}, "
                 f"largest {max(errors):.1%}")
    return "\n".join(lines)
