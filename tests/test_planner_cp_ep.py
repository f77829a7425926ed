"""The planner's context and expert parallelism (simcluster.planner, docs/planner.md):
every new formula against a hand computation on a small case, the published parameter
counts of Mixtral 8x7B and DeepSeek-V3, the Ultra-Scale Playbook's activation memory under
TP 2 x CP 4, the published layouts of Llama 3 405B and DeepSeek-V3, and a ValueError
naming the value for every degree that does not divide what it shards."""

import dataclasses
from fractions import Fraction

import pytest

from simcluster import Cluster, planner
from simcluster.costmodel import OVERLAP_SLOWDOWN, CostModel

MIXTRAL, DEEPSEEK_V3, LLAMA3_405B = (planner.MIXTRAL_8X7B, planner.DEEPSEEK_V3,
                                     planner.LLAMA3_405B)
LLAMA3_8B = planner.TransformerConfig(
    layers=32, hidden=4096, heads=32, kv_heads=8, seq_len=131072, vocab=128256,
    ffn_hidden=14336, swiglu=True, tied_embeddings=False)
# a small MoE and its dense twin for hand computations
SMALL_MOE = planner.TransformerConfig(
    layers=4, hidden=512, heads=8, seq_len=1024, vocab=8192, swiglu=True,
    tied_embeddings=False, experts=8, experts_per_token=2, expert_ffn_hidden=1024)
SMALL = planner.TransformerConfig(layers=4, hidden=512, heads=8, seq_len=1024, vocab=8192,
                                  swiglu=True, tied_embeddings=False)


def _a100(nodes):
    return Cluster.preset("dgx-a100", nodes=nodes)


# ------------------------------------------------------------ parameter counts
def test_mixtral_total_and_active_parameters_are_published_46_7_and_12_9_billion():
    # Mistral: "46.7B total parameters but only uses 12.9B parameters per token"
    assert round(planner.parameter_count(MIXTRAL) / 1e9, 1) == 46.7
    assert round(planner.active_parameter_count(MIXTRAL) / 1e9, 1) == 12.9


def test_mixtral_count_by_hand():
    h, kv, f, E, V, L = 4096, 1024, 14336, 8, 32000, 32
    attention = h * (h + 2 * kv) + h * h
    expert = 3 * h * f
    layer = attention + h * E + E * expert + 2 * h   # router, experts, two RMSNorms
    assert planner.parameter_count(MIXTRAL) == L * layer + 2 * V * h + h
    active = attention + h * E + 2 * expert + 2 * h
    assert planner.active_parameter_count(MIXTRAL) == L * active + 2 * V * h + h


def test_deepseek_v3_total_is_671_billion_and_active_about_37():
    # technical report: "671B total parameters with 37B activated for each token"
    assert round(planner.parameter_count(DEEPSEEK_V3) / 1e9) == 671
    active = planner.active_parameter_count(DEEPSEEK_V3)
    # 37.55 B with both embedding matrices (as Mixtral's 12.9 B counts them); 36.6 B
    # without the input embedding, a lookup that does no arithmetic
    assert 37e9 < active < 37.6e9
    assert round((active - 129280 * 7168) / 1e9) == 37


def test_mla_attention_parameters_by_hand():
    h, a = 7168, 128
    mla = (h * 1536 + 1536 * a * 192        # query down, query up (128 + 64 per head)
           + h * (512 + 64) + 512 * a * 256  # key-value down (+ shared rotary key), up
           + a * 128 * h)                    # output projection
    norms = 2 * h + 1536 + 512
    dense_layer = mla + 3 * h * 18432 + norms
    assert DEEPSEEK_V3.layer_parameters() == dense_layer
    assert sum(i * o for i, o in DEEPSEEK_V3.attention_matrices()) == mla


def test_dense_model_is_all_active():
    assert planner.active_parameter_count(LLAMA3_405B) == planner.parameter_count(LLAMA3_405B)


@pytest.mark.parametrize("freq, moe", [(1, 4), (2, 2), (3, 2), (4, 1), ((0, 1, 1, 0), 2)])
def test_moe_layer_freq_counts_megatron_layers(freq, moe):
    # Megatron-LM's --moe-layer-freq N: layers 0, N, 2N, ... are MoE; or a 0/1 pattern
    cfg = dataclasses.replace(SMALL_MOE, moe_layer_freq=freq)
    assert cfg.moe_layers == moe
    dense, sparse = cfg.layer_parameters(), cfg.layer_parameters(cfg.experts)
    assert planner.parameter_count(cfg) == ((4 - moe) * dense + moe * sparse
                                            + planner.embedding_parameters(cfg))


def test_gpt_style_experts_have_biases():
    gpt = planner.TransformerConfig(layers=2, hidden=64, heads=4, seq_len=16, vocab=32,
                                    experts=4, experts_per_token=1)
    per_expert = 2 * 64 * 256 + 256 + 64  # two matrices, two biases
    assert gpt.layer_parameters(4) - gpt.layer_parameters(0) == 4 * per_expert


# ------------------------------------------------------------------- FLOPs
def test_moe_flops_are_the_active_weights_plus_the_router():
    # a dense twin whose MLP is as wide as the k experts a token uses
    twin = dataclasses.replace(SMALL, ffn_hidden=2 * 1024)
    B, tokens = 8, 8 * 1024
    router = 3 * 2 * tokens * 512 * 8 * 4  # fwd + bwd of a hidden x experts GEMM, 4 layers
    assert (planner.flops_per_iteration(SMALL_MOE, B)
            == planner.flops_per_iteration(twin, B) + router)


def test_causal_attention_flops_are_half():
    B, s, h, L = 2, 1024, 512, 4
    full = planner.flops_per_iteration(SMALL, B)
    causal = planner.flops_per_iteration(SMALL, B, causal=True)
    assert full - causal == 3 * L * 2 * B * s * s * h  # half of 4 B s^2 h, fwd + bwd


def test_mla_attention_flops_use_its_head_dims():
    B, s = 1, 4096
    dense = dataclasses.replace(DEEPSEEK_V3, experts=0, experts_per_token=None,
                                shared_experts=0, expert_ffn_hidden=None, moe_layer_freq=1)
    gemm = 2 * B * s * dense.layer_matmul_parameters()
    scores = 2 * B * s * s * 128 * (192 + 128)
    logits = 2 * B * s * 7168 * 129280
    assert planner.flops_per_iteration(dense, B) == 3 * (61 * (gemm + scores) + logits)


# ------------------------------------------------------------ activation memory
def test_playbook_8b_activations_under_tp2_cp4_are_34sbh_over_t_cp():
    # the Ultra-Scale Playbook's 8B with flash attention (no s^2 term) and sequence
    # parallelism: 34 s b h per layer / (t cp); flash attention also keeps its fp32
    # log-sum-exp, 4 a s b / (t cp)
    s, h, a = 131072, 4096, 32
    per_layer = planner.activation_memory_per_layer(
        LLAMA3_8B, 1, tp=2, sequence_parallel=True, recompute="selective", cp=4,
        flash_attention=True)
    assert per_layer == 34 * s * h // 8 + 4 * a * s // 8
    # 68 GiB for the 32 layers at 128K: fits 80 GB only with both TP 2 and CP 4
    assert 67 < per_layer * 32 / 2 ** 30 < 69
    no_cp = planner.activation_memory_per_layer(LLAMA3_8B, 1, tp=2, sequence_parallel=True,
                                                recompute="selective", flash_attention=True)
    assert no_cp == 4 * per_layer


@pytest.mark.parametrize("recompute", planner.RECOMPUTE)
@pytest.mark.parametrize("cp", [2, 4, 8])
def test_context_parallel_divides_every_activation_by_cp(recompute, cp):
    for cfg in (SMALL, SMALL_MOE):
        for moe in ((False, True) if cfg.experts else (False,)):
            one = planner.activation_memory_per_layer(cfg, 2, 2, True, recompute, moe=moe)
            assert planner.activation_memory_per_layer(
                cfg, 2, 2, True, recompute, cp=cp, moe=moe) == one / cp


def test_moe_layer_activations_by_hand():
    s, b, h, f, k, E = 1024, 2, 512, 1024, 2, 8
    sbh = s * b * h
    attention = sbh * 4 + 4 * Fraction(sbh, 1)       # Q, output input; K and V (MHA)
    experts = s * b * k * f * 6 + 2 * k * sbh         # SwiGLU inner x k copies, their inputs
    replicated = 8 * sbh + 4 * s * b * E              # norms, QKV/MLP inputs; router probs
    expected = attention + experts + replicated + 2 * 8 * s * s * b  # softmax output
    assert planner.activation_memory_per_layer(SMALL_MOE, b, moe=True) == expected
    # a capacity factor of 1.5 pads every expert to 1.5x its balanced share
    padded = dataclasses.replace(SMALL_MOE, capacity_factor=1.5)
    assert (planner.activation_memory_per_layer(padded, b, moe=True)
            == expected + Fraction(1, 2) * (s * b * k * f * 6 + 2 * k * sbh))


# ---------------------------------------------------------- context parallelism
def _compute_ratio(cfg, cp, **kw):
    args = dict(tp=1, pp=1, dp=1, global_batch=8, micro_batch=1, recompute="none",
                efficiency=planner.ROOFLINE, flash_attention=True)
    args.update(kw)
    one = planner.estimate(cfg, _a100(1), **args)
    sharded = planner.estimate(cfg, _a100(1), cp=cp, **args)
    return sharded.breakdown["compute"] / one.breakdown["compute"]


def test_context_parallel_divides_compute_by_cp():
    # 4 ranks share each sequence: a quarter of the tokens, of the attention products
    long = dataclasses.replace(LLAMA3_8B, layers=2, seq_len=16384)
    assert _compute_ratio(long, 4) == pytest.approx(1 / 4, rel=0.03)


def _cp_expected(cfg, cluster, tp, cp, b, value_bytes, recompute, m, layers):
    """The ring's exposed seconds per step, by hand: per layer and ring step the K/V
    message (and in backward K, V, dK, dV) against one block of attention."""
    spec = cluster.spec
    dev = planner._Device(spec.device_of(0), "bf16", planner.MEGATRON_A100)
    s = cfg.seq_len // cp
    attention = planner._layer_times(cfg, dev, b, tp, False, value_bytes, cp, True)[1]
    block = attention / cp
    kv = b * s * 2 * cfg.kv * cfg.head_dim // tp * value_bytes
    peer = tp if tp * cp <= 8 else 8
    model = CostModel(spec)
    kv_hop, kv_dkv_hop = model.p2p_time(0, peer, kv), model.p2p_time(0, peer, 2 * kv)
    # docs/planner.md: per ring step, what the block does not cover, and the covered part
    # at OVERLAP_SLOWDOWN - 1
    forward = max(kv_hop - block, 0) + min(kv_hop, block) * (OVERLAP_SLOWDOWN - 1)
    backward = (max(kv_dkv_hop - 2 * block, 0)
                + min(kv_dkv_hop, 2 * block) * (OVERLAP_SLOWDOWN - 1))
    forwards = 2 if recompute == "full" else 1
    return m * layers * (cp - 1) * (forwards * forward + backward)


@pytest.mark.parametrize("tp, cp, nodes", [(1, 4, 1), (2, 4, 1), (2, 8, 2), (8, 4, 4)])
@pytest.mark.parametrize("recompute", ["none", "full"])
def test_ring_attention_exchange_by_hand(tp, cp, nodes, recompute):
    cfg = dataclasses.replace(LLAMA3_8B, layers=4, seq_len=32768)
    cluster = _a100(nodes)
    est = planner.estimate(cfg, cluster, tp=tp, cp=cp, dp=1, global_batch=4, micro_batch=1,
                           recompute=recompute, flash_attention=True)
    expected = _cp_expected(cfg, cluster, tp, cp, 1, 2, recompute, 4, 4)
    assert est.breakdown["cp_communication"] == pytest.approx(expected, rel=1e-12)
    assert est.step_time == pytest.approx(sum(est.breakdown.values()))


def test_ring_across_nodes_is_exposed_inside_a_node_hidden():
    cfg = dataclasses.replace(LLAMA3_8B, layers=4, seq_len=32768)
    kw = dict(dp=1, global_batch=4, micro_batch=1, recompute="none", flash_attention=True)
    inside = planner.estimate(cfg, _a100(2), tp=2, cp=4, **kw)     # 8 GPUs: one node
    across = planner.estimate(cfg, _a100(2), tp=4, cp=4, **kw)     # 16 GPUs: two nodes
    # NVLink hides the K/V behind the attention blocks: only the overlap slowdown shows
    attention_blocks = inside.breakdown["compute"] / 3  # at most the forward of it all
    assert inside.breakdown["cp_communication"] < (OVERLAP_SLOWDOWN - 1) * attention_blocks
    assert across.breakdown["cp_communication"] > 2 * inside.breakdown["cp_communication"]


def test_context_parallel_gradients_reduce_over_dp_times_cp():
    kw = dict(tp=2, pp=1, global_batch=8, micro_batch=1, recompute="none", zero=0)
    est = planner.estimate(SMALL, _a100(2), dp=2, cp=2, **kw)
    params = max(planner._stage_parameters(SMALL, 1, 2))
    ranks = [0, 2, 4, 6]  # the dp x cp ranks of tensor-parallel rank 0
    reduce = CostModel(_a100(2).spec).collective_time("all_reduce", ranks, params * 2).seconds
    assert est.dp_traffic == pytest.approx(reduce, rel=1e-12)


def test_context_parallel_shards_model_states_over_dp_times_cp():
    kw = dict(tp=1, pp=1, global_batch=8, micro_batch=1, recompute="none", zero=1)
    params = planner.parameter_count(SMALL)
    est = planner.estimate(SMALL, _a100(1), dp=2, cp=4, **kw)
    assert est.memory["optimizer"] == int(params * 12 / 8)
    assert est.gpus == 8


# ----------------------------------------------------------- expert parallelism
def _a2a_expected(cluster, nbytes, tp, ep):
    model = CostModel(cluster.spec)
    together = max(1, min(ep, 8 // tp))
    intra, inter = nbytes * (together - 1) / ep, nbytes * (ep - together) / ep
    seconds = model.p2p_time(0, tp, intra) if intra else 0.0
    return max(seconds, model.p2p_time(0, 8, inter)) if inter else seconds


@pytest.mark.parametrize("ep, nodes", [(2, 1), (8, 1), (8, 2), (16, 2)])
@pytest.mark.parametrize("cf", [None, 1.25])
def test_expert_all_to_alls_by_hand(ep, nodes, cf):
    cfg = dataclasses.replace(SMALL_MOE, experts=16, capacity_factor=cf)
    dp = 8 * nodes
    est = planner.estimate(cfg, _a100(nodes), dp=dp, ep=ep, global_batch=dp, micro_batch=1,
                           recompute="none")
    copies = 1024 * 2 * (cf or 1) * 512 * 2  # tokens x k (x capacity) x hidden x 2 bytes
    expected = 4 * 4 * _a2a_expected(_a100(nodes), copies, 1, ep)  # 4 per layer, 4 layers
    assert est.breakdown["ep_communication"] == pytest.approx(expected, rel=1e-12)
    # the rank's share of the 16 experts, over the same ep
    per_expert = cfg.layer_parameters(1) - cfg.layer_parameters(0)
    assert est.memory["parameters"] == int(
        max(planner._stage_parameters(cfg, 1, 1)) * 2 + 4 * 16 * per_expert / ep * 2)


def test_all_to_all_across_nodes_is_bound_by_the_nic():
    kw = dict(global_batch=16, micro_batch=1, recompute="none")
    cfg = dataclasses.replace(SMALL_MOE, experts=16)
    inside = planner.estimate(cfg, _a100(2), dp=16, ep=8, **kw)
    across = planner.estimate(cfg, _a100(2), dp=16, ep=16, **kw)
    # NVLink 240 GB/s vs one 23.75 GB/s NIC for half the bytes: several times slower
    assert across.breakdown["ep_communication"] > 4 * inside.breakdown["ep_communication"]
    assert "ep_communication" not in planner.estimate(cfg, _a100(2), dp=16, **kw).breakdown


def test_full_recompute_repeats_the_forward_all_to_alls():
    kw = dict(dp=8, ep=8, global_batch=8, micro_batch=1)
    none = planner.estimate(SMALL_MOE, _a100(1), recompute="none", **kw)
    full = planner.estimate(SMALL_MOE, _a100(1), recompute="full", **kw)
    assert full.breakdown["ep_communication"] == pytest.approx(
        1.5 * none.breakdown["ep_communication"], rel=1e-12)


def test_capacity_factor_drops_or_pads_tokens():
    kw = dict(dp=8, ep=8, global_batch=8, micro_batch=1, recompute="none",
              efficiency=planner.ROOFLINE)
    drop = dataclasses.replace(SMALL_MOE, capacity_factor=0.75)
    pad = dataclasses.replace(SMALL_MOE, capacity_factor=1.5)
    assert planner.estimate(drop, _a100(1), **kw).dropped_fraction == 0.25
    assert planner.estimate(pad, _a100(1), **kw).dropped_fraction == 0.0
    assert planner.estimate(SMALL_MOE, _a100(1), **kw).dropped_fraction == 0.0
    comm = [planner.estimate(c, _a100(1), **kw).breakdown["ep_communication"]
            for c in (drop, SMALL_MOE, pad)]
    assert comm[0] < comm[1] < comm[2]


def test_expert_gradients_reduce_over_dp_cp_over_ep_dense_over_dp_cp():
    kw = dict(tp=1, pp=1, global_batch=16, micro_batch=1, recompute="none", zero=0)
    est = planner.estimate(SMALL_MOE, _a100(2), dp=16, ep=4, **kw)
    dense = max(planner._stage_parameters(SMALL_MOE, 1, 1))
    experts = planner._stage_expert_parameters(SMALL_MOE, 4, 1, 4)
    model = CostModel(_a100(2).spec)
    expected = (model.collective_time("all_reduce", list(range(16)), dense * 2).seconds
                + model.collective_time("all_reduce", [0, 4, 8, 12], experts * 2).seconds)
    assert est.dp_traffic == pytest.approx(expected, rel=1e-12)
    # ZeRO-1: the dense states over 16 ranks, the experts' over the 4 holding the same
    z1 = planner.estimate(SMALL_MOE, _a100(2), dp=16, ep=4, **dict(kw, zero=1))
    assert z1.memory["optimizer"] == int(dense * 12 / 16 + experts * 12 / 4)


def test_ep_equal_to_dp_leaves_no_expert_gradient_reduction():
    kw = dict(global_batch=8, micro_batch=1, recompute="none", zero=0)
    est = planner.estimate(SMALL_MOE, _a100(1), dp=8, ep=8, **kw)
    dense = max(planner._stage_parameters(SMALL_MOE, 1, 1))
    reduce = CostModel(_a100(1).spec).collective_time("all_reduce", list(range(8)),
                                                      dense * 2).seconds
    assert est.dp_traffic == pytest.approx(reduce, rel=1e-12)


# ------------------------------------------------------------------- search
def test_search_tries_expert_and_context_parallel_degrees():
    found = planner.search(SMALL_MOE, _a100(1), global_batch=8, recompute="none", zero=0,
                           tp=1, pp=1, cp=[1, 2])
    assert {e.ep for e in found} == {1, 2, 4, 8}
    assert {e.cp for e in found} == {1, 2}
    assert all(e.gpus == 8 and e.fits for e in found)
    assert [e.step_time for e in found] == sorted(e.step_time for e in found)


def test_search_of_a_dense_model_keeps_cp_and_ep_at_one():
    found = planner.search(SMALL, _a100(1), global_batch=8, recompute="none", zero=0)
    assert {(e.cp, e.ep) for e in found} == {(1, 1)}


# ------------------------------------------------------------ published layouts
@pytest.fixture(scope="module")
def published():
    return {run.name: (run, run.estimate()) for run in planner.PUBLISHED_RUNS}


@pytest.mark.parametrize("name", ["Llama 3 405B 8K, 8,192 H100", "Llama 3 405B 8K, 16,384 H100",
                                  "Llama 3 405B 128K, 16,384 H100"])
def test_llama3_405b_layouts_fit_with_tflops_near_published(published, name):
    # Llama 3 paper, Table 4: 430 / 400 / 380 TFLOP/s per GPU, 43 / 41 / 38 % BF16 MFU
    run, est = published[name]
    assert est.fits and est.gpus == run.cluster[1] * 8
    assert est.model_tflops_per_gpu == pytest.approx(run.tflops_per_gpu, rel=0.12)
    assert 0.33 < est.mfu < 0.46


def test_llama3_405b_at_128k_needs_context_parallelism(published):
    run, est = published["Llama 3 405B 128K, 16,384 H100"]
    assert est.cp == 16 and "cp_communication" in est.breakdown
    layout = dict(run.layout, cp=1)
    assert not planner.estimate(run.cfg, Cluster.preset("dgx-h100", nodes=2048),
                                **layout).fits


def test_deepseek_v3_layout_on_2048_h800s_fits_and_is_slower_than_published(published):
    # report: EP 64 over 8 nodes, PP 16, ZeRO-1 DP; 15,360 sequences of 4,096 tokens;
    # 2.664 M H800-hours for 14.8 T tokens = 1,543 tokens/s per GPU
    run, est = published["DeepSeek-V3 4K, 2,048 H800"]
    assert est.fits and est.gpus == 2048 and est.ep == 64
    tokens_per_gpu = 15360 * 4096 / est.step_time / 2048
    assert run.tokens_per_gpu_second == pytest.approx(1543, abs=1)
    # bf16 GEMMs, every all-to-all exposed, all eight copies over the NICs: the planner
    # is slower than DeepSeek's FP8 + DualPipe + node-limited routing, but of the order
    assert 0.25 * run.tokens_per_gpu_second < tokens_per_gpu < run.tokens_per_gpu_second
    assert est.breakdown["ep_communication"] > 0.3 * est.step_time


def test_frontier_comparison_prints_every_run_and_count():
    text = planner.frontier_comparison()
    for run in planner.PUBLISHED_RUNS:
        assert run.name in text
    assert "46.70 B parameters (published 46.7 B), 12.88 B active" in text
    assert "671.03 B parameters (published 671 B)" in text


# -------------------------------------------------------------- validation
@pytest.mark.parametrize("kwargs, words", [
    (dict(cp=3), "cp=3 must divide the sequence"),
    (dict(cp=1024), "cp=1024"),
    (dict(cp=0), "cp must be a positive integer"),
    (dict(ep=2), "ep=2 needs a mixture of experts"),
    (dict(cp=2, dp=8), r"tp \* cp \* pp \* dp"),
    (dict(stage_layers=2), "stage_layers=2"),
    (dict(flash_attention=1), "flash_attention must be True or False"),
])
def test_invalid_cp_raises_naming_the_value(kwargs, words):
    args = dict(global_batch=8, dp=1)
    args.update(kwargs)
    with pytest.raises(ValueError, match=words):
        planner.estimate(SMALL, _a100(1), **args)


@pytest.mark.parametrize("kwargs, words", [
    (dict(ep=3, dp=6), "ep=3 must divide experts=8"),
    (dict(ep=16, dp=8), "ep=16 must divide experts=8"),
    (dict(ep=4, dp=2), r"ep=4 must divide dp \* cp = 2 \* 1"),
    (dict(ep=4, dp=2, cp=2), None),  # 4 divides dp * cp: carved out of both
])
def test_invalid_ep_raises_naming_the_value(kwargs, words):
    args = dict(global_batch=12 if kwargs.get("dp") == 6 else 8)
    args.update(kwargs)
    if words is None:
        assert planner.estimate(SMALL_MOE, _a100(1), **args).ep == 4
        return
    with pytest.raises(ValueError, match=words):
        planner.estimate(SMALL_MOE, _a100(1), **args)


@pytest.mark.parametrize("kwargs, words", [
    (dict(experts=4, experts_per_token=5), "experts_per_token=5 is more than experts=4"),
    (dict(experts=4), "experts_per_token must be a positive integer"),
    (dict(experts_per_token=2), "need experts > 0"),
    (dict(experts=4, experts_per_token=1, capacity_factor=0), "capacity_factor"),
    (dict(experts=4, experts_per_token=1, moe_layer_freq=5), "moe_layer_freq"),
    (dict(experts=4, experts_per_token=1, moe_layer_freq=(1, 2, 0, 0)), "moe_layer_freq"),
    (dict(experts=4, experts_per_token=1, shared_experts=-1), "shared_experts"),
    (dict(swiglu=False, mla=planner.MLA(0, 64, 16, 8, 16)), "swiglu=True"),
])
def test_invalid_moe_configs_raise(kwargs, words):
    base = dict(layers=4, hidden=64, heads=4, seq_len=16, vocab=32, swiglu=True)
    base.update(kwargs)
    with pytest.raises(ValueError, match=words):
        planner.TransformerConfig(**base)


def test_invalid_mla_raises():
    with pytest.raises(ValueError, match="MLA: kv_rank must be a positive integer"):
        planner.MLA(0, 0, 16, 8, 16)


def test_defaults_are_one_and_add_no_terms():
    kw = dict(tp=2, pp=2, dp=2, global_batch=8, micro_batch=1, recompute="selective")
    default = planner.estimate(SMALL, _a100(1), **kw)
    explicit = planner.estimate(SMALL, _a100(1), cp=1, ep=1, flash_attention=False, **kw)
    assert default.breakdown == explicit.breakdown and default.memory == explicit.memory
    assert list(default.breakdown) == ["compute", "recompute", "tp_communication",
                                       "pp_communication", "bubble", "dp_communication",
                                       "optimizer"]
    assert (default.cp, default.ep, default.gpus) == (1, 1, 8)


def test_a_dense_config_prints_as_before_and_a_moe_config_shows_its_experts():
    # lesson 12 stores the repr of a dense config
    dense = repr(SMALL)
    assert dense.startswith("TransformerConfig(layers=4, hidden=512") and "experts" not in dense
    assert dense.endswith("tied_embeddings=False, dropout=False)")
    assert "experts=8, experts_per_token=2" in repr(SMALL_MOE)
    assert eval(repr(SMALL_MOE), {"TransformerConfig": planner.TransformerConfig}) == SMALL_MOE
