"""The checks of lab 09 (3D parallelism and the planner), on the protocol of
:mod:`workbook.checking`.

* :func:`check_build_groups` runs the learner's ``build_groups(pp, dp, tp)`` on every rank
  of (pp, dp, tp) meshes of 6 to 16 simulated GPUs, then ``init_device_mesh`` with the same
  shape, and compares each rank's coordinate (its index in each of its three groups) and
  the ranks of its groups with the mesh's.
* :func:`check_model_flops` compares the learner's FLOPs per iteration with
  :func:`simcluster.planner.flops_per_iteration` on the GPT models of Narayanan et al. 2021
  Table 1 (and with their Eq. 3, which is exact for these), LLaMA-7B (SwiGLU) and a
  grouped-query model, without, with selective and with full recomputation.
* :func:`check_choose_layout` asks for LLaMA-7B's layout on 32 simulated A100s under
  four memory caps drawn afresh on every run (one met exactly); the layout must fit the cap in the planner's estimate and its step
  must be within 10 % of the fastest layout :func:`simcluster.planner.search` finds.
* :func:`check_pipeline_bubble` compares the learner's bubble of a 3D layout with
  (p − 1)/(v·m), m = B/(b·d), on layouts of Narayanan et al. 2021 Table 1 and smaller ones,
  and names the usual slips (m without d, the wall-time fraction, v left out, a percentage).

The reference answers (:mod:`._reference`) are imported inside the checks only.
"""

import contextlib
import dataclasses
import math
import random
import threading

import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

import simcluster as sc
from simcluster import planner
from workbook.checking import (Failure, answers, check, listed, num, number, on_a_rank,
                               refuse_reference, short, simulate, within_best)
from workbook.hints import Hints
from workbook.lesson09_3d_parallelism.lab import (DIMS, GiB, LAYOUT_BATCH, LAYOUT_GPUS,
                                                  LLAMA_7B, describe_layout, layout_cluster)
from workbook.lesson09_3d_parallelism.lab import LAYOUT_CAPS_GIB  # noqa: F401 (release 0.1 imported it from here)


_reference = answers(__name__)   # the answers, imported only while a check runs


# Progressive help, one step per call of checks.hint("groups") in the lab: a question, the
# idea, then the shape of the code (workbook.hints).
hint = Hints({
    "groups": [
        "Write down the coordinate (i_pp, i_dp, i_tp) of a few ranks of a 2 × 2 × 2 mesh "
        "from rank = (i_pp·dp + i_dp)·tp + i_tp. Which ranks share the calling rank's "
        "(i_pp, i_dp)? And who has to call dist.new_group for that group?",
        "A group along one dimension fixes the other two coordinates and runs the third "
        "over its whole range. dist.new_group is collective over the world: every rank "
        "creates every group of every dimension, in the same order, and keeps the three "
        "whose ranks include it.",
        "A small function at(i_pp, i_dp, i_tp) for the rank; for each dimension, the list "
        "of all its groups (nested loops over the two fixed coordinates, a comprehension "
        "over the free one); one loop that calls new_group on each list and keeps it in "
        "a dict when the calling rank is in it.",
    ],
    "flops": [
        "Follow one token through one layer, forward: every weight it meets costs a "
        "multiply and an add. Which products are not with weights at all, and grow with "
        "the sequence length? What happens once, after the last layer?",
        "Forward: 2 FLOPs per weight per token for each layer's matrices (count Q, K, V, "
        "the projection and the MLP from cfg: kv heads, SwiGLU's third matrix), attention's "
        "two s × s products, and the output layer. Backward is twice the forward. "
        "Recomputation adds forward work again: which part, for full and for selective?",
        "Three numbers: the layer's weight FLOPs, its attention FLOPs, the output layer's; "
        "forward = layers × (weights + attention) + output; the total is 3 × forward plus "
        "layers × what recomputation repeats (nothing, attention, or the whole layer).",
    ],
    "layout": [
        "How many layouts of 32 GPUs are there at all? Count the choices of tp, pp, "
        "micro-batch, recomputation and ZeRO stage: few enough to ask the planner about "
        "each.",
        "Try every combination that planner.estimate accepts (catch its ValueError for "
        "those that do not divide), keep those whose memory_per_gpu is at most the cap, and "
        "of those the one with the shortest step_time. dp follows from tp and pp.",
        "Nested loops over tp (divisors of the heads, inside a node), pp (divisors of the "
        "layers), micro_batch, recompute and zero; estimate each; remember the best "
        "(estimate, layout dict) pair; return the dict.",
    ],
    "bubble": [
        "On a fixed number of GPUs, what does data parallelism do to the sequences each "
        "pipeline gets, and so to its micro-batches?",
        "There are d = gpus/(t·p) pipelines; each gets B/d of the global batch, in "
        "micro-batches of b. The bubble, as lesson 05 measured it, is (p − 1)/v "
        "micro-batch times over the m of useful work.",
        "Three lines: d, m, and the bubble as a fraction of the ideal step (0.05, not 5).",
    ],
})


# ------------------------------------------------------ exercise 1: the mesh by hand

# (pp, dp, tp): every dimension of size 1 once, one of 3 (not a power of two), 16 GPUs
MESH_CASES = ((2, 2, 2), (1, 4, 2), (4, 1, 2), (3, 2, 1), (2, 2, 4))
GROUPS_HINT = ("return a dict {'pp': ..., 'dp': ..., 'tp': ...} of the three groups this "
               "rank is a member of, each made by dist.new_group.")
MESH_HINT = ("init_device_mesh lays the ranks out row-major over (pp, dp, tp): tp varies "
             "fastest, so a tp group is tp consecutive ranks (one node's NVLink), a dp "
             "group steps by tp, and a pp group by dp·tp. " + hint.pointer("groups"))


class _Watch(threading.local):
    """What the learner's function did on this rank's thread while it ran: the rank lists
    it passed to ``dist.new_group``, and whether it built a ``DeviceMesh`` (by any name or
    import path: ``init_device_mesh`` builds one)."""

    active = False
    built_mesh = False

    def reset(self):
        self.active, self.built_mesh, self.created = True, False, []


_WATCH = _Watch()


@contextlib.contextmanager
def _watching():
    """Patch ``DeviceMesh.__init__`` and ``dist.new_group`` for the length of the check, to
    record on each rank's thread what the learner's function builds (not what the check's
    own ``init_device_mesh`` builds after it)."""
    mesh_init, new_group = DeviceMesh.__init__, dist.new_group

    def watched_init(self, *args, **kwargs):
        if _WATCH.active:
            _WATCH.built_mesh = True
        return mesh_init(self, *args, **kwargs)

    def watched_new_group(ranks=None, *args, **kwargs):
        if _WATCH.active and ranks is not None:
            _WATCH.created.append(sorted(int(r) for r in ranks))
        return new_group(ranks, *args, **kwargs)

    DeviceMesh.__init__, dist.new_group = watched_init, watched_new_group
    try:
        yield
    finally:
        DeviceMesh.__init__, dist.new_group = mesh_init, new_group


MESH_REFUSED = ("build the groups by hand: dist.new_group for every pp, dp and tp group, "
                "on every rank.")


def _expected_group(rank, name, pp, dp, tp):
    """The ranks of ``rank``'s ``name`` group in init_device_mesh's row-major layout."""
    sizes = dict(zip(DIMS, (pp, dp, tp)))
    stride = {"pp": dp * tp, "dp": tp, "tp": 1}[name]
    start = rank - (rank // stride % sizes[name]) * stride
    return [start + k * stride for k in range(sizes[name])]


def _no_group_hint(name, expected, created):
    """Why a rank has no usable ``name`` group: it created that group and kept another, or
    it never created it."""
    if expected in created:
        return ("you created this rank's group but kept another: new_group returns a "
                "usable group only on its members (GroupMember.NON_GROUP_MEMBER on the "
                "others), so keep the group whose ranks include this rank.")
    return (f"no group this rank created is its {name} group of {len(expected)} ranks: "
            f"every rank belongs to one, one rank per coordinate along {name}. Check that "
            "your loops reach every coordinate (range bounds).")


def _mesh_body(fn, pp, dp, tp):
    """On each rank: the learner's groups, then torch's mesh of the same shape; the ranks
    of each group and the rank's coordinate in both."""
    rank = dist.get_rank()
    where = f"(pp, dp, tp) = ({pp}, {dp}, {tp}): rank {rank}"
    _WATCH.reset()
    try:
        groups = fn(pp, dp, tp)
    finally:
        _WATCH.active = False
    if _WATCH.built_mesh:
        raise Failure(f"{where}: your function built a DeviceMesh (init_device_mesh), "
                      "which the check compares with", MESH_REFUSED)
    if not isinstance(groups, dict) or not set(groups) <= set(DIMS) or not groups:
        raise Failure(f"{where} returned {short(repr(groups), 80)}", GROUPS_HINT)
    mine = {}
    for name in DIMS:
        group = groups.get(name, dist.GroupMember.NON_GROUP_MEMBER)
        if isinstance(group, (list, tuple, range)) or hasattr(group, "tolist"):
            raise Failure(f"{where}: its {name!r} group is the rank list "
                          f"{short(repr(group), 60)}, not a process group",
                          "return the group dist.new_group gave you for those ranks, not "
                          "the ranks themselves.")
        if not isinstance(group, dist.ProcessGroup):
            shown = ("missing" if name not in groups else
                     "GroupMember.NON_GROUP_MEMBER"
                     if group is dist.GroupMember.NON_GROUP_MEMBER else
                     short(repr(group), 60))
            if name in groups and group is not dist.GroupMember.NON_GROUP_MEMBER:
                raise Failure(f"{where}: its {name!r} group is {shown}, not a process "
                              "group", GROUPS_HINT)
            raise Failure(f"{where}: its {name!r} group is {shown}",
                          _no_group_hint(name, _expected_group(rank, name, pp, dp, tp),
                                         _WATCH.created))
        mine[name] = dist.get_process_group_ranks(group)
    mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=DIMS)
    return {"mine": mine, "coordinate": tuple(mesh.get_coordinate()),
            "expected": {name: dist.get_process_group_ranks(mesh.get_group(name))
                         for name in DIMS}}


def _coordinate(rank, groups):
    """``rank``'s index in each of its groups (None where it is not in one)."""
    return tuple(groups[n].index(rank) if rank in groups[n] else None for n in DIMS)


def _compare_mesh(case, results):
    """Fail at the first rank whose coordinate, or else whose groups, differ from
    ``init_device_mesh``'s."""
    moved = [r for r, res in enumerate(results)
             if _coordinate(r, res["mine"]) != res["coordinate"]]
    wrong = [r for r, res in enumerate(results) if res["mine"] != res["expected"]]
    if not wrong:
        return
    rank = (moved or wrong)[0]
    result, where = results[rank], f"(pp, dp, tp) = {case}: rank {rank}"
    mine_at = _coordinate(rank, result["mine"])
    axis, name = next((a, n) for a, n in enumerate(DIMS)  # where the coordinate moved
                      if result["mine"][n] != result["expected"][n]
                      and (not moved or mine_at[a] != result["coordinate"][a]))
    mine, expected = result["mine"][name], result["expected"][name]
    if rank not in mine:
        raise Failure(f"{where}: its {name} group {mine} does not contain it",
                      "keep the group whose ranks include this rank.")
    text = f"{where}: your {name} group is {mine}, init_device_mesh's is {expected}"
    if moved:
        text += (f", so you put it at (pp, dp, tp) = {mine_at}, "
                 f"the mesh at {result['coordinate']}")
    if set(mine) < set(expected):
        raise Failure(text, f"a {name} group has {case[axis]} ranks, one per coordinate "
                            f"along {name}: check your range bounds.")
    raise Failure(text, MESH_HINT)


@check("3D process groups")
def check_build_groups(fn):
    """``fn(pp, dp, tp)`` on every rank returns its three groups; each rank's groups and
    coordinate equal ``init_device_mesh``'s on (pp, dp, tp) meshes of 6 to 16 GPUs."""
    refuse_reference(fn, _reference().build_groups)
    for name, mesh_api in (("init_device_mesh", init_device_mesh), ("DeviceMesh", DeviceMesh)):
        try:
            refuse_reference(fn, mesh_api)
        except Failure:
            raise Failure(f"this function calls {name}, which the check compares with",
                          MESH_REFUSED) from None
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
    with _watching():   # and any DeviceMesh it builds while it runs, by whatever name
        for case in MESH_CASES:
            run = simulate(cluster, _mesh_body, math.prod(case),
                           lambda rank, case=case: f"(pp, dp, tp) = {case}",
                           args=(fn, *case))
            _compare_mesh(case, run.results)
    shapes = listed("×".join(map(str, case)) for case in MESH_CASES)
    return (f"every rank's (pp, dp, tp) groups and coordinate equal init_device_mesh's on "
            f"meshes {shapes}")


# --------------------------------------------------- exercise 4: the bubble in 3D

# (gpus, t, p, B, b, v): small layouts first, then rows of Narayanan et al. 2021 Table 1
# (docs/reference-numbers.md) with and without interleaving
BUBBLE_CASES = ((32, 2, 4, 512, 1, 1), (32, 2, 4, 512, 2, 1), (32, 4, 8, 512, 1, 1),
                (32, 2, 4, 512, 1, 2), (64, 8, 1, 512, 2, 1), (24, 1, 3, 96, 2, 1),
                (2520, 8, 35, 2520, 1, 1), (3072, 8, 64, 3072, 1, 1),
                (3072, 8, 64, 3072, 1, 2), (512, 8, 8, 1024, 1, 4))
BUBBLE_HINT = ("the d = gpus/(t·p) pipelines share the global batch: how many "
               "micro-batches does each run, and what is the bubble relative to? "
               + hint.pointer("bubble"))


def _bubble_hint(case, got):
    """The hint for a wrong bubble ``got``: the slip it matches, if any."""
    gpus, t, p, batch, b, v = case
    m = batch / (b * gpus // (t * p))
    slips = [((p - 1) / (v * batch / b), "m is per pipeline: divide the batch by d too "
                                          "(m = B/(b·d), not B/b)."),
             ((p - 1) / (v * m + p - 1), "that is the bubble's share of the wall time; "
                                         "the paper's (p − 1)/(v·m) is relative to the "
                                         "ideal time (no bubble)."),
             ((p - 1) / m, "interleaving v chunks per GPU makes each slot v times "
                           "shorter: divide by v."),
             (100 * (p - 1) / (v * m), "return a fraction (0.05), not a percentage (5).")]
    for value, slip in slips:
        if math.isclose(got, value, rel_tol=1e-9) and not math.isclose(
                got, (p - 1) / (v * m), rel_tol=1e-9):
            return slip
    return BUBBLE_HINT


@check("3D pipeline bubble")
def check_pipeline_bubble(fn):
    """``fn(gpus, tp, pp, global_batch, micro_batch, virtual_stages)``: (p − 1)/(v·m) with
    m = B/(b·d), on small layouts and on rows of Narayanan et al. 2021 Table 1."""
    ref = _reference()
    refuse_reference(fn, ref.pipeline_bubble)
    for case in BUBBLE_CASES:
        gpus, t, p, batch, b, v = case
        where = f"{gpus} GPUs, t = {t}, p = {p}, B = {batch}, b = {b}, v = {v}"
        got = on_a_rank(fn, case, where)
        want = ref.pipeline_bubble(*case)
        if number(got) is None:
            raise Failure(f"{where}: returned {short(repr(got), 60)}, not a number",
                          "return the bubble as a float (0.05 for 5 %).")
        got = number(got)
        if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
            raise Failure(f"{where}: returned {num(got)}, expected {num(want)}",
                          _bubble_hint(case, got))
    return (f"right on {len(BUBBLE_CASES)} layouts, 24 to 3,072 GPUs, with and without "
            "interleaving")


# ------------------------------------------------ exercise 2: FLOPs per iteration


def _refuse_planner(fn, name, hint, target=None):
    """Fail if ``fn`` is or calls ``planner.<name>`` (or ``target``, which calls it): what
    the check compares with."""
    try:
        refuse_reference(fn, target or getattr(planner, name))
    except Failure:
        raise Failure(f"this function calls planner.{name}, which the check compares "
                      "with", hint) from None


GQA_70B = planner.TransformerConfig(layers=80, hidden=8192, heads=64, kv_heads=8,
                                    seq_len=4096, vocab=32000, ffn_hidden=28672,
                                    swiglu=True, tied_embeddings=False)


def eq3(cfg, global_batch, recompute):
    """Narayanan et al. 2021 Eq. 3 for the standard GPT: 96·B·s·l·h²(1 + s/(6h) +
    V/(16·l·h)) with full recomputation; without it the layers' share is 3/4 of that."""
    b, s, l, h, v = global_batch, cfg.seq_len, cfg.layers, cfg.hidden, cfg.vocab
    layers = 72 * b * s * l * h * h * (1 + s / (6 * h))
    return layers * (4 / 3 if recompute == "full" else 1) + 6 * b * s * h * v


def _flops_cases():
    """``(name, cfg, batch, recompute, uses_eq3)``: Table 1's models first (full
    recomputation, as the paper ran them, then none), then selective, then LLaMAs."""
    rows = [(f"{row.params_billion:g}B GPT of Table 1", row.config(), row.batch)
            for row in planner.MEGATRON_TABLE1[::3]]
    cases = [(n, c, b, r, True) for r in ("full", "none") for n, c, b in rows]
    cases += [(n, c, b, "selective", False) for n, c, b in rows[:2]]
    cases += [(name, cfg, 256, r, False) for name, cfg in (("LLaMA-7B", LLAMA_7B),
                                                          ("GQA 70B", GQA_70B))
              for r in planner.RECOMPUTE]
    return cases


def _flops_hint(cfg, batch, recompute, got):
    """The hint for a wrong count ``got``: the slip it matches, if any."""
    exact = planner.flops_per_iteration
    tokens = batch * cfg.seq_len
    attention = 4 * batch * cfg.seq_len ** 2 * cfg.hidden * cfg.layers
    logits = 2 * tokens * cfg.hidden * cfg.vocab
    slips = [
        (6 * planner.parameter_count(cfg) * tokens,
         "6 × parameters × tokens is the rule of thumb: it counts the embedding table as "
         "a matrix multiply and leaves out attention's s² products. Count the multiplies."),
        (exact(cfg, batch, recompute) - 3 * logits,
         "the output layer (h × V, 2·B·s·h·V forward) is a matrix multiply too."),
        (exact(cfg, batch, recompute) - 3 * attention
         - (attention if recompute != "none" else 0),
         "attention multiplies Q by Kᵀ and the scores by V: 4·B·s²·h per layer forward."),
        (exact(cfg, batch, "none"),
         "recomputation runs forward again: every layer's forward with full, the attention "
         "products only with selective."),
        (exact(cfg, batch, "full"),
         "selective recomputation repeats only the attention products (4·B·s²·h per "
         "layer), not the whole forward."),
        (exact(cfg, batch, recompute) / 2,
         "a multiply-add is 2 FLOPs."),
        (exact(cfg, batch, "none") / 3 + exact(cfg, batch, recompute)
         - exact(cfg, batch, "none"),
         "that is the forward (and its recomputation) only: backward costs twice the "
         "forward, gradients of inputs and of weights."),
    ]
    if recompute == "full":
        slips.append((exact(cfg, batch, "full") + logits,
                      "full recomputation runs every layer's forward again, not the output "
                      "layer (the lesson and Eq. 3 count it once per pass)."))
    for value, slip in slips:
        if math.isclose(got, value, rel_tol=1e-6):
            return slip
    if cfg.swiglu or cfg.kv != cfg.heads:
        return ("count each matrix: Q and the output projection h × h, K and V h × "
                "(kv_heads · head_dim), and the MLP's h × ffn_hidden matrices: three with "
                "SwiGLU (gate, up, down), two without.")
    return ("count forward first: each weight with each token, attention's products, the "
            "output layer; then what backward and recomputation add. "
            + hint.pointer("flops"))


@check("FLOPs per iteration")
def check_model_flops(fn):
    """``fn(cfg, global_batch, recompute)``: equal to the planner's count (and to Eq. 3
    on Table 1's models) within 1e-6, on GPT, LLaMA-7B and grouped-query models."""
    refuse_reference(fn, _reference().model_flops)
    _refuse_planner(fn, "flops_per_iteration", "count the multiplies of each matrix "
                    "yourself.")
    cases = _flops_cases()
    for name, cfg, batch, recompute, uses_eq3 in cases:
        where = f"{name}, B = {batch}, recompute={recompute!r}"
        got = on_a_rank(fn, (cfg, batch, recompute), where)
        if number(got) is None:
            raise Failure(f"{where}: returned {short(repr(got), 60)}, not a number",
                          "return the FLOPs as a number (int or float).")
        got = number(got)
        # Eq. 3 where it applies (tests/test_lesson09_checks.py: the planner agrees there)
        want = (eq3(cfg, batch, recompute) if uses_eq3
                else planner.flops_per_iteration(cfg, batch, recompute))
        if not math.isclose(got, want, rel_tol=1e-6):
            source = "Eq. 3 and the planner give" if uses_eq3 else "the planner counts"
            raise Failure(f"{where}: you count {got:.4g} FLOPs, {source} {want:.4g}",
                          _flops_hint(cfg, batch, recompute, got))
    return (f"equal to Eq. 3 and the planner on {sum(c[4] for c in cases)} runs of Table 1's "
            f"models, and to the planner on {sum(not c[4] for c in cases)} more (selective "
            "recomputation, SwiGLU, grouped-query attention)")


# ------------------------------------------------- exercise 3: choose a layout

LAYOUT_TOLERANCE = 1.10     # within 10 % of the fastest layout planner.search finds
LAYOUT_KEYS = {"tp", "pp", "dp", "micro_batch", "recompute", "zero", "sequence_parallel",
               "virtual_stages", "schedule"}
LAYOUT_REQUIRED = ("tp", "pp", "dp", "micro_batch", "recompute", "zero")
LAYOUT_HINT = ("return a dict of planner.estimate's arguments: 'tp', 'pp', 'dp' and "
               "'micro_batch' (numbers), 'recompute' and 'zero', optionally "
               "'sequence_parallel', 'virtual_stages', 'schedule'.")


_LAYOUTS = []   # every layout planner.search considers, fastest first, searched once


def _layouts():
    """Every layout of LLaMA-7B on the lab's 32 GPUs that ``planner.search`` considers
    (each micro-batch size that divides the batch), fastest first, whatever its memory."""
    if not _LAYOUTS:
        sizes = [b for b in range(1, LAYOUT_BATCH + 1) if LAYOUT_BATCH % b == 0]
        _LAYOUTS.extend(planner.search(LLAMA_7B, layout_cluster(2**60), LAYOUT_BATCH,
                                       micro_batch=sizes))
    return _LAYOUTS


def _fastest(cap_gib):
    """The fastest layout of LLaMA-7B that fits ``cap_gib`` GiB per GPU: what
    ``planner.search`` returns first on GPUs of that memory."""
    return next(e for e in _layouts() if e.memory_per_gpu <= cap_gib * GiB)


def _frontier():
    """The layouts some cap makes the fastest, with the caps that do: ``[(layout, low,
    high)]``, from the fastest (most memory) down; ``layout`` is the fastest under every
    cap from ``low`` (its own memory) up to, not including, ``high`` GiB."""
    points, high = [], math.inf
    for est in _layouts():
        if est.memory_per_gpu < high * GiB:
            points.append((est, est.memory_per_gpu / GiB, high))
            high = est.memory_per_gpu / GiB
    return points


# Fresh caps on every run, so that no table of answers for some caps passes: four whose
# fastest layouts differ, one from each quarter of the caps below 48 GiB, and one of them
# exactly a layout's memory ("at most" includes it). Tests seed it.
LAYOUT_DRAW = random.Random()
LAYOUT_MAX_CAP_GIB = 48.0


def layout_caps():
    """Four memory caps in GiB for :func:`check_choose_layout`, each with another fastest
    layout: drawn from the quarters of :func:`_frontier` below :data:`LAYOUT_MAX_CAP_GIB`;
    the last is exactly its layout's memory."""
    bands = [(low, min(high, LAYOUT_MAX_CAP_GIB)) for _, low, high in _frontier()
             if low < LAYOUT_MAX_CAP_GIB and high - low > 0.01]
    quarter = len(bands) / 4
    caps = []
    for k in range(4):
        low, high = LAYOUT_DRAW.choice(bands[round(k * quarter):round((k + 1) * quarter)])
        caps.append(low if k == 3 else low + (high - low) * LAYOUT_DRAW.uniform(0.0, 0.9))
    return caps


@check("choose a layout")
def check_choose_layout(fn):
    """``fn(cfg, cluster, global_batch, memory_cap)`` for LLaMA-7B on 32 A100s under four
    caps drawn afresh each run (:func:`layout_caps`): the planner's estimate of the layout
    fits the cap, and its step is within 10 % of planner.search's fastest under it."""
    refuse_reference(fn, _reference().choose_layout)
    yourself = "choose the candidates yourself and compare them with planner.estimate."
    _refuse_planner(fn, "search", yourself)
    _refuse_planner(fn, "search", yourself, target=_fastest)
    cluster, worst = layout_cluster(), 0.0
    caps = layout_caps()
    for cap_gib in caps:
        where = f"LLaMA-7B, B = {LAYOUT_BATCH}, {cap_gib:.2f} GiB per GPU"
        layout = on_a_rank(fn, (LLAMA_7B, cluster, LAYOUT_BATCH, cap_gib * GiB), where)
        if not isinstance(layout, dict) or not set(layout) <= LAYOUT_KEYS:
            raise Failure(f"{where}: returned {short(repr(layout), 80)}", LAYOUT_HINT)
        missing = [key for key in LAYOUT_REQUIRED if key not in layout]
        if missing:     # planner.estimate's defaults would choose them silently
            raise Failure(f"{where}: your layout has no {listed(repr(k) for k in missing)}",
                          LAYOUT_HINT)
        if layout["micro_batch"] is None:
            raise Failure(f"{where}: micro_batch=None lets the planner pick the fastest "
                          "that fits 80 GiB, not your cap", "choose the micro-batch too.")
        layout = dict(layout)
        for key in ("tp", "pp", "dp", "micro_batch", "virtual_stages"):
            if key not in layout:
                continue
            value = number(layout[key])
            if value is None or not math.isfinite(value) or value != int(value):
                raise Failure(f"{where}: your layout's {key!r} is "
                              f"{short(repr(layout[key]), 40)}, not a whole number",
                              LAYOUT_HINT)
            layout[key] = int(value)    # a numpy integer is fine too
        gpus = layout["tp"] * layout["pp"] * layout["dp"]
        if gpus != LAYOUT_GPUS:
            raise Failure(f"{where}: tp × pp × dp = {gpus}, not the {LAYOUT_GPUS} GPUs",
                          "use every GPU: dp = 32 / (tp · pp).")
        try:
            est = planner.estimate(LLAMA_7B, cluster, global_batch=LAYOUT_BATCH, **layout)
        except ValueError as error:
            raise Failure(f"{where}: planner.estimate refuses {layout}: {short(error)}",
                          "tp must divide the heads, pp the layers, dp·micro_batch the "
                          "global batch.") from None
        if est.memory_per_gpu > cap_gib * GiB:
            parts = ", ".join(f"{k} {v / GiB:.1f}" for k, v in est.memory.items())
            raise Failure(f"{where}: {describe_layout(est)} needs "
                          f"{est.memory_per_gpu / GiB:.1f} GiB per GPU ({parts})",
                          "shard what dominates: ZeRO shards optimizer state, gradients "
                          "and weights over dp; tp and pp divide weights and activations; "
                          "recomputation and a smaller micro-batch cut activations.")
        best = _fastest(cap_gib)
        worst = max(worst, within_best(
            where, est.step_time, best.step_time, LAYOUT_TOLERANCE,
            f"{describe_layout(est)} fits, and its step takes",
            f"the {best.step_time:.2f} s of the fastest layout that fits",
            "every memory saving costs time, some much more than others: did you compare "
            "every candidate that fits? " + hint.pointer("layout"),
            show=lambda s: f"{s:.2f} s"))
    smallest = math.floor(_frontier()[-1][1])
    return (f"fits {len(caps)} memory caps drawn between {smallest} and "
            f"{LAYOUT_MAX_CAP_GIB:g} GiB (new ones each run), each step within "
            f"{LAYOUT_TOLERANCE - 1:.0%} of planner.search's fastest under the same cap")
