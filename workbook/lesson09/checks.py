"""The checks of lab 09 (3D parallelism and the planner), on the protocol of
:mod:`workbook.checking`.

* :func:`check_build_groups` runs the learner's ``build_groups(pp, dp, tp)`` on every rank
  of (pp, dp, tp) meshes of 6 to 16 simulated GPUs, then ``init_device_mesh`` with the same
  shape, and compares each rank's coordinate (its index in each of its three groups) and
  the ranks of its groups with the mesh's.
* :func:`check_pipeline_bubble` compares the learner's bubble of a 3D layout with
  (p − 1)/(v·m), m = B/(b·d), on layouts of Narayanan et al. 2021 Table 1 and smaller ones,
  and names the usual slips (m without d, the wall-time fraction, v left out, a percentage).

The reference answers (:mod:`._reference`) are imported inside the checks only.
"""

import math

import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

import simcluster as sc
from workbook.checking import (Failure, check, listed, num, on_a_rank, refuse_reference,
                               short, simulate)

DIMS = ("pp", "dp", "tp")


def _reference():
    """The answers, imported only while a check runs."""
    from workbook.lesson09 import _reference
    return _reference


# ------------------------------------------------------ exercise 1: the mesh by hand

# (pp, dp, tp): every dimension of size 1 once, one of 3 (not a power of two), 16 GPUs
MESH_CASES = ((2, 2, 2), (1, 4, 2), (4, 1, 2), (3, 2, 1), (2, 2, 4))
GROUPS_HINT = ("return a dict {'pp': ..., 'dp': ..., 'tp': ...} of the three groups this "
               "rank is a member of, each made by dist.new_group.")
LAYOUT_HINT = ("init_device_mesh lays the ranks out row-major over (pp, dp, tp): tp varies "
               "fastest, so a tp group is tp consecutive ranks (one node's NVLink), a dp "
               "group steps by tp, and a pp group by dp·tp.")


def _mesh_body(fn, pp, dp, tp):
    """On each rank: the learner's groups, then torch's mesh of the same shape; the ranks
    of each group and the rank's coordinate in both."""
    rank = dist.get_rank()
    where = f"(pp, dp, tp) = ({pp}, {dp}, {tp}): rank {rank}"
    groups = fn(pp, dp, tp)
    if not isinstance(groups, dict) or set(groups) != set(DIMS):
        raise Failure(f"{where} returned {short(repr(groups), 80)}", GROUPS_HINT)
    mine = {}
    for name in DIMS:
        group = groups[name]
        if not isinstance(group, dist.ProcessGroup):
            shown = ("GroupMember.NON_GROUP_MEMBER"
                     if group is dist.GroupMember.NON_GROUP_MEMBER else short(repr(group), 60))
            raise Failure(f"{where}: its {name!r} group is {shown}, not a "
                          "group it is a member of",
                          "new_group returns a usable group only on the ranks in it (and "
                          "GroupMember.NON_GROUP_MEMBER on the others): keep the group "
                          "whose ranks include this rank.")
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
    axis, name = next((a, n) for a, n in enumerate(DIMS)
                      if result["mine"][n] != result["expected"][n])
    mine, expected = result["mine"][name], result["expected"][name]
    if rank not in mine:
        raise Failure(f"{where}: its {name} group {mine} does not contain it",
                      "keep the group whose ranks include this rank.")
    text = f"{where}: your {name} group is {mine}, init_device_mesh's is {expected}"
    if moved:
        text += (f", so you put it at (pp, dp, tp) = {_coordinate(rank, result['mine'])}, "
                 f"the mesh at {result['coordinate']}")
    if set(mine) < set(expected):
        raise Failure(text, f"a {name} group has {case[axis]} ranks, one per coordinate "
                            f"along {name}: check your range bounds.")
    raise Failure(text, LAYOUT_HINT)


@check("3D process groups")
def check_build_groups(fn):
    """``fn(pp, dp, tp)`` on every rank returns its three groups; each rank's groups and
    coordinate equal ``init_device_mesh``'s on (pp, dp, tp) meshes of 6 to 16 GPUs."""
    refuse_reference(fn, _reference().build_groups)
    cluster = sc.Cluster.preset("dgx-a100", nodes=2)
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
BUBBLE_HINT = ("the d = gpus/(t·p) pipelines share the global batch: each runs "
               "m = B/(b·d) micro-batches, and its bubble is (p − 1)/(v·m) of the ideal "
               "step.")


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
    for value, hint in slips:
        if math.isclose(got, value, rel_tol=1e-9) and not math.isclose(
                got, (p - 1) / (v * m), rel_tol=1e-9):
            return hint
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
        if isinstance(got, bool) or not isinstance(got, (int, float)):
            raise Failure(f"{where}: returned {short(repr(got), 60)}, not a number",
                          "return the bubble as a float (0.05 for 5 %).")
        if not math.isclose(got, want, rel_tol=1e-9, abs_tol=1e-12):
            raise Failure(f"{where}: returned {num(got)}, expected {num(want)}",
                          _bubble_hint(case, got))
    return (f"right on {len(BUBBLE_CASES)} layouts, 24 to 3,072 GPUs, with and without "
            "interleaving")
