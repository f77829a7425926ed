"""Published formulas that several lessons use (each lesson's ``demos`` re-exports its own,
and lesson 13's drills draw on all of them): one copy, here. docs/reference-numbers.md has
their sources."""

from workbook.models import activation_bytes

K = 12            # bytes of optimizer state per parameter, mixed-precision Adam


def p2p_formula(cluster, src, dst, nbytes):
    """α + n·β of one ``nbytes`` message from rank ``src`` to ``dst``: inside a node the
    fabric's latency and the bandwidth one pair of GPUs gets (after efficiency), between
    nodes the network's latency and one NIC's bandwidth. Returns ``(alpha, beta, seconds)``."""
    spec = cluster.spec
    a, b = spec.node_of(src), spec.node_of(dst)
    if a == b:
        link = spec.nodes[a].fabric
        alpha, bandwidth = link.latency, link.effective_bandwidth_among(2)
    else:
        link = spec.inter_node_link
        alpha, bandwidth = link.latency, link.effective_bandwidth
    return alpha, 1 / bandwidth, alpha + nbytes / bandwidth


def tp_comm_elements(b, s, h, t):
    """Elements each rank sends per layer and micro-batch, forward + backward, in
    Megatron tensor parallelism: 8·b·s·h·(t−1)/t (Narayanan et al. 2021; four ring
    all-reduces of b·s·h elements; docs/reference-numbers.md)."""
    return 8 * b * s * h * (t - 1) / t


def model_state_bytes(psi, n, stage, k=K):
    """Bytes of model states per GPU in ZeRO ``stage`` (Rajbhandari et al. 2020, Figure 1;
    docs/reference-numbers.md, "ZeRO"): 2Ψ of fp16 parameters, 2Ψ of fp16 gradients and
    KΨ of optimizer state, of which stage 1 shards the optimizer state over the ``n``
    data-parallel GPUs, stage 2 the gradients too, stage 3 the parameters too."""
    params, grads, optimizer = 2 * psi, 2 * psi, k * psi
    return (params / (n if stage >= 3 else 1) + grads / (n if stage >= 2 else 1)
            + optimizer / (n if stage >= 1 else 1))


def korthikanti_bytes(s, b, h, a, recompute="none"):
    """Activation bytes one transformer layer keeps for its backward with 16-bit
    activations (Korthikanti et al. 2022; docs/reference-numbers.md, "Activation
    memory"): ``"none"`` sbh(34 + 5as/h), ``"selective"`` 34sbh (the a·s² attention
    tensors recomputed), ``"full"`` 2sbh (only the layer's input)."""
    if recompute == "full":
        return 2 * s * b * h
    if recompute == "selective":
        return 34 * s * b * h
    if recompute != "none":
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', not {recompute!r}")
    return activation_bytes(s, b, h, a)
