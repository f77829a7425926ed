"""How long things take on the simulated hardware.

Compute follows a roofline: an op takes ``max(FLOPs / peak FLOP/s for its dtype,
bytes moved / HBM bandwidth)``. Communication follows latency-bandwidth (alpha-beta)
models of each algorithm (Thakur, Rabenseifner & Gropp 2005), with

    alpha  latency of one message on the link (s)
    beta   seconds per byte on the slowest link the algorithm uses (1 / bandwidth)
    gamma  seconds per byte to reduce, at the device's HBM speed (1 / HBM bandwidth)

For ``p`` ranks and a buffer of ``n`` bytes, e.g. ring all-reduce costs
``2(p-1)·alpha + 2(p-1)/p·n·beta + (p-1)/p·n·gamma``.

Links: ranks inside one node talk over its NVLink fabric; a group that spans nodes is
limited by the network (one NIC per ring). ``hierarchical`` runs ring inside each node
and ring across nodes on 1/g of the data, ``g`` ranks per node, each on its own NIC.

``ALGORITHMS`` lists what ``algorithms=`` can force. Unless one is forced, a collective is
charged the fastest of ``DEFAULT_ALGORITHMS``, as NCCL's tuner picks the fastest of NCCL's own
algorithms; NCCL has no halving-doubling, so that one runs only when forced.
"""

import math

ALGORITHMS = {
    "all_reduce": ("ring", "tree", "halving_doubling", "hierarchical"),
    "reduce_scatter": ("ring", "halving_doubling"),
    "all_gather": ("ring", "halving_doubling"),
    "broadcast": ("tree", "ring"),
    "reduce": ("tree", "ring"),
    "all_to_all": ("direct",),
    "gather": ("direct",),
    "scatter": ("direct",),
    "barrier": ("tree",),
}

# what the default chooses from: NCCL's algorithms, i.e. all of them but halving-doubling
DEFAULT_ALGORITHMS = {family: tuple(a for a in algorithms if a != "halving_doubling")
                      for family, algorithms in ALGORITHMS.items()}

# torch op names -> the cost family above
OP_FAMILY = {
    "all_reduce": "all_reduce", "reduce": "reduce", "broadcast": "broadcast",
    "all_gather": "all_gather", "all_gather_into_tensor": "all_gather",
    "reduce_scatter": "reduce_scatter", "reduce_scatter_tensor": "reduce_scatter",
    "all_to_all": "all_to_all", "all_to_all_single": "all_to_all",
    "gather": "gather", "scatter": "scatter", "barrier": "barrier",
}


def _lg(p):
    return math.ceil(math.log2(p)) if p > 1 else 0


class LinkCost:
    """alpha, beta, gamma of one link class."""

    def __init__(self, link, factor, hbm_bandwidth):
        self.alpha = link.latency
        self.beta = 1.0 / (link.effective_bandwidth * factor)
        self.gamma = 1.0 / hbm_bandwidth


def flat_time(family, algorithm, p, n, c):
    """Seconds for ``family`` with ``algorithm`` on ``p`` ranks, ``n`` bytes, link cost ``c``."""
    a, b, g = c.alpha, c.beta, c.gamma
    if p <= 1:
        return 0.0
    f = (p - 1) / p
    lg = _lg(p)
    # Halving-doubling runs on the largest power of two q <= p (Thakur, Rabenseifner & Gropp
    # 2005). If p > q, the p - q extra ranks first hand their buffer to a partner (all of it
    # for a reduction, their 1/p shard for all-gather) and get their result back at the end
    # (all of it, or their 1/p shard for reduce-scatter): one more step each way.
    q = 1 << (p.bit_length() - 1)
    lq, fq, extra = q.bit_length() - 1, (q - 1) / q, int(p > q)
    table = {
        ("all_reduce", "ring"): lambda: 2 * (p - 1) * a + 2 * f * n * b + f * n * g,
        ("all_reduce", "tree"): lambda: 2 * lg * (a + n * b) + lg * n * g,
        ("all_reduce", "halving_doubling"): lambda: (extra * (2 * a + 2 * n * b + n * g)
                                                     + 2 * lq * a + 2 * fq * n * b + fq * n * g),
        ("reduce_scatter", "ring"): lambda: (p - 1) * a + f * n * (b + g),
        ("reduce_scatter", "halving_doubling"): lambda: (
            extra * (2 * a + n * b + n * g + n / p * b) + lq * a + fq * n * (b + g)),
        ("all_gather", "ring"): lambda: (p - 1) * a + f * n * b,
        ("all_gather", "halving_doubling"): lambda: (extra * (2 * a + n / p * b + n * b)
                                                     + lq * a + fq * n * b),
        ("broadcast", "tree"): lambda: lg * (a + n * b),
        ("broadcast", "ring"): lambda: (p - 1) * a + n * b,
        ("reduce", "tree"): lambda: lg * (a + n * (b + g)),
        ("reduce", "ring"): lambda: (p - 1) * a + n * (b + g),
        ("all_to_all", "direct"): lambda: (p - 1) * a + f * n * b,
        ("gather", "direct"): lambda: (p - 1) * a + f * n * b,
        ("scatter", "direct"): lambda: (p - 1) * a + f * n * b,
        ("barrier", "tree"): lambda: lg * a,
    }
    return table[(family, algorithm)]()


class CostModel:
    """Charges compute and communication for one cluster.

    ``speed_factor[rank]`` (default 1) divides a rank's compute speed: 2 means a straggler
    twice as slow. ``link_factor[key]`` (default 1) multiplies bandwidth: ``key`` is a node
    index for its NVLink fabric, or ``"network"`` for the links between nodes.
    ``algorithms`` forces an algorithm per collective family, e.g. ``{"all_reduce": "ring"}``.
    """

    def __init__(self, spec, algorithms=None):
        self.spec = spec
        self.speed_factor = {}
        self.link_factor = {}
        self._peak = {}  # (rank, dtype) -> (FLOP/s, HBM bytes/s, slowdown), filled lazily
        self.algorithms = dict(algorithms or {})
        for family, algorithm in self.algorithms.items():
            if family not in ALGORITHMS:
                raise ValueError(f"unknown collective {family!r} in algorithms=; choose from "
                                 f"{', '.join(ALGORITHMS)}")
            if algorithm not in ALGORITHMS[family]:
                raise ValueError(f"{family} has no algorithm {algorithm!r}; choose from "
                                 f"{', '.join(ALGORITHMS[family])}")

    # ------------------------------------------------------------------ compute
    def roofline(self, rank, flops, dtype, nbytes):
        """Seconds for an op of ``flops`` FLOPs moving ``nbytes`` bytes on ``rank``."""
        key = (rank, dtype)
        peak = self._peak.get(key)
        if peak is None:
            device = self.spec.device_of(rank)
            peak = self._peak[key] = (device.flops_for(dtype), device.hbm_bandwidth,
                                      self.speed_factor.get(rank, 1.0))
        flops_per_s, bytes_per_s, slowdown = peak
        return max(flops / flops_per_s if flops else 0.0, nbytes / bytes_per_s) * slowdown

    # ------------------------------------------------------------ communication
    def _link_cost(self, ranks, inter):
        spec = self.spec
        nodes = sorted({spec.node_of(r) for r in ranks})
        hbm = min(spec.nodes[i].device.hbm_bandwidth for i in nodes)
        if inter:
            return LinkCost(spec.inter_node_link, self.link_factor.get("network", 1.0), hbm)
        slowest = min(nodes, key=lambda i: spec.nodes[i].fabric.effective_bandwidth
                      * self.link_factor.get(i, 1.0))
        return LinkCost(spec.nodes[slowest].fabric, self.link_factor.get(slowest, 1.0), hbm)

    def _hierarchical(self, ranks, n):
        per_node = {}
        for r in ranks:
            per_node.setdefault(self.spec.node_of(r), []).append(r)
        g = max(len(v) for v in per_node.values())
        nodes = len(per_node)
        intra = self._link_cost(ranks, inter=False)
        inter = self._link_cost(ranks, inter=True)
        shard = n / min(len(v) for v in per_node.values())
        return (flat_time("reduce_scatter", "ring", g, n, intra)
                + flat_time("all_reduce", "ring", nodes, shard, inter)
                + flat_time("all_gather", "ring", g, n, intra))

    def collective_time(self, op, ranks, nbytes):
        """``(seconds, algorithm)`` for collective ``op`` over global ``ranks``."""
        family = OP_FAMILY[op]
        p = len(ranks)
        spans_nodes = len({self.spec.node_of(r) for r in ranks}) > 1
        candidates = DEFAULT_ALGORITHMS[family]
        if family in self.algorithms:
            candidates = (self.algorithms[family],)
        best = None
        for algorithm in candidates:
            if algorithm == "hierarchical":
                if not spans_nodes and family in self.algorithms:
                    seconds = flat_time(family, "ring", p, nbytes, self._link_cost(ranks, False))
                elif not spans_nodes:
                    continue
                else:
                    seconds = self._hierarchical(ranks, nbytes)
            else:
                seconds = flat_time(family, algorithm, p, nbytes,
                                    self._link_cost(ranks, spans_nodes))
            if best is None or seconds < best[0]:
                best = (seconds, algorithm)
        return best

    def traffic(self, op, algorithm, ranks, nbytes):
        """``[(src, dst, bytes), ...]`` the algorithm sends, for the communication matrix."""
        family = OP_FAMILY[op]
        if family == "barrier" or len(ranks) < 2:
            return []
        if algorithm == "hierarchical":
            return self._hierarchical_traffic(ranks, nbytes)
        return pattern(family, algorithm, list(ranks), nbytes)

    def _hierarchical_traffic(self, ranks, n):
        per_node = {}
        for r in ranks:
            per_node.setdefault(self.spec.node_of(r), []).append(r)
        nodes = list(per_node.values())
        out = []
        for members in nodes:
            out += pattern("reduce_scatter", "ring", members, n)
            out += pattern("all_gather", "ring", members, n)
        g = min(len(m) for m in nodes)
        for i in range(g):
            out += pattern("all_reduce", "ring", [m[i] for m in nodes], n / g)
        return out

    def p2p_time(self, src, dst, nbytes):
        """Seconds for one message of ``nbytes`` from ``src`` to ``dst``: alpha + n·beta."""
        same_node = self.spec.node_of(src) == self.spec.node_of(dst)
        c = self._link_cost([src, dst], inter=not same_node)
        return c.alpha + nbytes * c.beta


def pattern(family, algorithm, ranks, n):
    """Who sends how many bytes to whom in a flat algorithm over ``ranks``."""
    p = len(ranks)
    if p < 2:
        return []
    ring_share = {"all_reduce": 2 * (p - 1) / p, "reduce_scatter": (p - 1) / p,
                  "all_gather": (p - 1) / p, "broadcast": 1.0, "reduce": 1.0}
    if algorithm == "ring":
        hops = range(p) if family not in ("broadcast", "reduce") else range(p - 1)
        return [(ranks[i], ranks[(i + 1) % p], ring_share[family] * n) for i in hops]
    if algorithm == "tree":
        edges = []
        step = 1
        while step < p:  # binomial tree rooted at ranks[0]
            edges += [(ranks[i], ranks[i + step]) for i in range(0, p - step, 2 * step)]
            step *= 2
        down = [(a, b, n) for a, b in edges]
        up = [(b, a, n) for a, b in edges]
        return {"broadcast": down, "reduce": up, "all_reduce": up + down, "barrier": []}[family]
    if algorithm == "halving_doubling":
        q = 1 << (p.bit_length() - 1)  # on ranks[:q]; rank q + i pairs with rank i
        out, size, step = [], n / 2, 1
        while step < q:
            out += [(ranks[i], ranks[i ^ step], size) for i in range(q)]
            size, step = size / 2, step * 2
        out *= 2 if family == "all_reduce" else 1
        pairs = list(zip(ranks[q:], ranks))
        before = [(x, y, n if family != "all_gather" else n / p) for x, y in pairs]
        after = [(y, x, n if family != "reduce_scatter" else n / p) for x, y in pairs]
        return before + out + after
    if family == "all_to_all":  # direct
        return [(a, b, n / p) for a in ranks for b in ranks if a != b]
    if family == "gather":
        return [(r, ranks[0], n / p) for r in ranks[1:]]
    return [(ranks[0], r, n / p) for r in ranks[1:]]  # scatter
