"""Lab 09's checks (3D process groups, FLOPs per iteration, choosing a layout, the 3D
pipeline bubble): every check passes the reference answer, refuses the reference itself
and the planner function it compares with, and reports each mistake the lab is about —
including ones that raise or deadlock — as one ❌ line naming the case and the hint."""

import pytest
import torch
import torch.distributed as dist

from _check_helpers import fails, learner_namespace, line, not_started
from simcluster import planner
from workbook.lesson09_3d_parallelism import checks
from workbook.lesson09_3d_parallelism import _reference as R
from workbook.lesson09_3d_parallelism.checks import _fastest, eq3
from workbook.lesson09_3d_parallelism.lab import (LAYOUT_CAPS_GIB, LLAMA_7B, GiB, describe_layout,
                                                  layout_cluster)

SEED = 1    # the layout check draws its caps afresh each run; the tests fix the draw


def _seeded_caps():
    checks.LAYOUT_DRAW.seed(SEED)
    caps = checks.layout_caps()
    checks.LAYOUT_DRAW.seed(SEED)
    return caps


CAPS = _seeded_caps()
FIRST = f"LLaMA-7B, B = 256, {CAPS[0]:.2f} GiB per GPU"


@pytest.fixture(autouse=True)
def seeded_layout_caps():
    checks.LAYOUT_DRAW.seed(SEED)

MINE = learner_namespace(R, R.build_groups, R.model_flops, R.choose_layout,
                         R.pipeline_bubble)


# ------------------------------------------------------------ the reference passes


def test_build_groups_reference_passes(capsys):
    result, text = line(capsys, checks.check_build_groups, MINE["build_groups"])
    assert result and "meshes 2×2×2, 1×4×2, 4×1×2, 3×2×1, 2×2×4" in text, text


def test_model_flops_reference_passes(capsys):
    result, text = line(capsys, checks.check_model_flops, MINE["model_flops"])
    assert result and "Eq. 3 and the planner on 8 runs" in text, text


def test_choose_layout_reference_passes_at_the_fastest(capsys):
    result, text = line(capsys, checks.check_choose_layout, MINE["choose_layout"])
    assert result and "fits 4 memory caps drawn between" in text, text
    assert "within 10% of planner.search's fastest under the same cap" in text, text


def test_pipeline_bubble_reference_passes(capsys):
    result, text = line(capsys, checks.check_pipeline_bubble, MINE["pipeline_bubble"])
    assert result and "right on 10 layouts" in text, text


@pytest.mark.parametrize("check, reference", [
    (checks.check_build_groups, R.build_groups), (checks.check_model_flops, R.model_flops),
    (checks.check_choose_layout, R.choose_layout),
    (checks.check_pipeline_bubble, R.pipeline_bubble),
])
def test_the_reference_itself_is_refused(capsys, check, reference):
    fails(capsys, check, reference, "the workbook's own reference answer")


def test_calling_the_planner_is_refused(capsys):
    fails(capsys, checks.check_model_flops,
          lambda cfg, batch, recompute="none": planner.flops_per_iteration(cfg, batch,
                                                                           recompute),
          "calls planner.flops_per_iteration")
    fails(capsys, checks.check_choose_layout,
          lambda cfg, cluster, batch, cap: vars(planner.search(cfg, cluster, batch)[0]),
          "calls planner.search")
    fails(capsys, checks.check_choose_layout,
          lambda cfg, cluster, batch, cap: vars(_fastest(round(cap / GiB))),
          "calls planner.search")


# ------------------------------------------------------------ exercise 1: groups


def _groups_from(mesh, order):
    """Every group along each dimension of ``mesh`` (named by ``order``), all created on
    every rank; the calling rank's."""
    mine = {}
    for dim, name in enumerate(order):
        for ranks in mesh.movedim(dim, -1).reshape(-1, mesh.shape[dim]).tolist():
            group = dist.new_group(ranks)
            if dist.get_rank() in ranks:
                mine[name] = group
    return mine


def test_a_transposed_mesh_is_caught(capsys):
    """tp varies slowest: tp groups stride across the nodes."""
    def build_groups(pp, dp, tp):
        return _groups_from(torch.arange(pp * dp * tp).view(tp, dp, pp), ("tp", "dp", "pp"))

    fails(capsys, checks.check_build_groups, build_groups,
          "❌ 3D process groups: (pp, dp, tp) = (2, 2, 2): rank 1: your pp group is [0, 1], "
          "init_device_mesh's is [1, 5], so you put it at (pp, dp, tp) = (1, 0, 0), the "
          "mesh at (0, 0, 1)", "Hint: init_device_mesh lays the ranks out row-major")


def test_groups_missing_a_rank_are_caught(capsys):
    def build_groups(pp, dp, tp):
        mine = {}
        mesh = torch.arange(pp * dp * tp).view(pp, dp, tp)
        for dim, name in enumerate(("pp", "dp", "tp")):
            for ranks in mesh.movedim(dim, -1).reshape(-1, mesh.shape[dim]).tolist():
                # off by one: the last rank of each group left out, and alone
                for part in (ranks[:-1], ranks[-1:]) if len(ranks) > 1 else (ranks,):
                    group = dist.new_group(part)
                    if dist.get_rank() in part:
                        mine[name] = group
        return mine

    fails(capsys, checks.check_build_groups, build_groups,
          "(pp, dp, tp) = (2, 2, 2): rank 1: your tp group is [1], init_device_mesh's is "
          "[0, 1], so you put it at (pp, dp, tp) = (0, 0, 0), the mesh at (0, 0, 1)",
          "Hint: a tp group has 2 ranks, one per coordinate along tp")


def test_creating_only_ones_own_groups_is_a_mismatch(capsys):
    """new_group is collective over the world: each rank must create every group."""
    def build_groups(pp, dp, tp):
        r = dist.get_rank()
        i_pp, i_dp, i_tp = r // (dp * tp), r // tp % dp, r % tp
        return {"tp": dist.new_group([(i_pp * dp + i_dp) * tp + k for k in range(tp)]),
                "dp": dist.new_group([(i_pp * dp + k) * tp + i_tp for k in range(dp)]),
                "pp": dist.new_group([(k * dp + i_dp) * tp + i_tp for k in range(pp)])}

    fails(capsys, checks.check_build_groups, build_groups,
          "(pp, dp, tp) = (2, 2, 2): mismatch in new_group #1", "the rank list differs",
          "every rank must call dist.new_group for every group")


def test_a_rank_waiting_alone_deadlocks(capsys):
    def build_groups(pp, dp, tp):
        groups = MINE["build_groups"](pp, dp, tp)
        if dist.get_rank() == 0:
            dist.barrier(group=groups["tp"])
        return groups

    fails(capsys, checks.check_build_groups, build_groups,
          "(pp, dp, tp) = (2, 2, 2): deadlock (rank 0: barrier", "Hint: the members of a "
          "group wait for each other in dist.new_group")


def test_keeping_the_last_group_created_is_caught(capsys):
    def build_groups(pp, dp, tp):
        mesh, mine = torch.arange(pp * dp * tp).view(pp, dp, tp), {}
        for dim, name in enumerate(("pp", "dp", "tp")):
            for ranks in mesh.movedim(dim, -1).reshape(-1, mesh.shape[dim]).tolist():
                mine[name] = dist.new_group(ranks)
        return mine

    fails(capsys, checks.check_build_groups, build_groups, "its 'dp' group is "
          "GroupMember.NON_GROUP_MEMBER", "you created this rank's group but kept another")


def test_groups_that_raise_are_reported(capsys):
    def build_groups(pp, dp, tp):
        raise NotImplementedError("build the groups")

    not_started(capsys, checks.check_build_groups, build_groups, "3D process groups",
                "build the groups")


def test_groups_in_a_list_are_refused(capsys):
    fails(capsys, checks.check_build_groups,
          lambda pp, dp, tp: list(MINE["build_groups"](pp, dp, tp).values()),
          "returned [", "Hint: return a dict {'pp': ..., 'dp': ..., 'tp': ...}")


# ------------------------------------------------------------ exercise 2: FLOPs


def test_eq3_is_the_planners_count_on_table_1():
    for row in planner.MEGATRON_TABLE1:
        for recompute in ("none", "full"):
            assert eq3(row.config(), row.batch, recompute) == pytest.approx(
                planner.flops_per_iteration(row.config(), row.batch, recompute), rel=1e-12)


def learner_flops(**changes):
    """The reference count with one term changed, as a learner might slip."""
    def model_flops(cfg, batch, recompute="none"):
        s, h, tokens = cfg.seq_len, cfg.hidden, batch * cfg.seq_len
        kv = cfg.kv * cfg.head_dim
        mlp = changes.get("mlp", 3 if cfg.swiglu else 2)
        weights = 2 * h * h + 2 * h * kv + mlp * h * cfg.ffn
        attention = changes.get("attention", 4) * batch * s * s * h
        layer = 2 * tokens * weights + attention
        output = changes.get("output", 2) * tokens * h * cfg.vocab
        again = {"none": 0, "selective": attention, "full": layer}[
            changes.get("recompute", {}).get(recompute, recompute)]
        rerun_output = output if changes.get("rerun_output") and recompute == "full" else 0
        return (changes.get("passes", 3) * (cfg.layers * layer + output)
                + cfg.layers * again + rerun_output)
    return model_flops


def test_six_n_d_is_named(capsys):
    fails(capsys, checks.check_model_flops,
          lambda cfg, batch, recompute="none": 6 * planner.parameter_count(cfg) * batch
          * cfg.seq_len,
          "❌ FLOPs per iteration: 1.7B GPT of Table 1, B = 512, recompute='full': you count",
          "Eq. 3 and the planner give", "6 × parameters × tokens is the rule of thumb")


def test_forgetting_the_output_layer_is_named(capsys):
    fails(capsys, checks.check_model_flops, learner_flops(output=0),
          "recompute='full'", "the output layer (h × V")


def test_recomputing_the_output_layer_is_named(capsys):
    fails(capsys, checks.check_model_flops, learner_flops(rerun_output=True),
          "recompute='full'", "not the output layer")


def test_forgetting_the_backward_is_named(capsys):
    fails(capsys, checks.check_model_flops, learner_flops(passes=1),
          "recompute='full'", "backward costs twice the forward")


def test_forgetting_attention_is_named(capsys):
    fails(capsys, checks.check_model_flops, learner_flops(attention=0),
          "recompute='full'", "attention multiplies Q by Kᵀ")


def test_ignoring_recomputation_is_named(capsys):
    fails(capsys, checks.check_model_flops,
          learner_flops(recompute={"full": "none", "selective": "none"}),
          "1.7B GPT of Table 1, B = 512, recompute='full'",
          "recomputation runs forward again")


def test_selective_as_full_is_named(capsys):
    fails(capsys, checks.check_model_flops, learner_flops(recompute={"selective": "full"}),
          "recompute='selective'", "selective recomputation repeats only the attention")


def test_two_mlp_matrices_for_swiglu_are_caught(capsys):
    fails(capsys, checks.check_model_flops, learner_flops(mlp=2),
          "LLaMA-7B, B = 256, recompute='none'", "three with SwiGLU")


def test_an_unrecognised_flops_slip_gets_the_general_hint(capsys):
    # attention's products counted once (2·B·s²·h), a slip with no hint of its own: the
    # check used to crash on the general hint (a loop variable shadowed `hint`)
    fails(capsys, checks.check_model_flops, learner_flops(attention=2),
          "❌ FLOPs per iteration", "count forward first")


def test_flops_that_raise_or_loop_are_reported(capsys, short_timeout):
    def raises(cfg, batch, recompute="none"):
        return cfg.kv_heads * 2              # None for multi-head attention

    text = fails(capsys, checks.check_model_flops, raises, "raised TypeError",
                 "call your function yourself")
    assert "cluster.run" not in text, text     # it is not run on a cluster by the learner

    def loops(cfg, batch, recompute="none"):
        while True:
            pass

    fails(capsys, checks.check_model_flops, loops, "still running after 2 s")


# ------------------------------------------------------------ exercise 3: layout


@pytest.mark.parametrize("seed", range(20))
def test_the_caps_have_different_fastest_layouts(seed):
    """So no single layout passes: each cap's fastest is too slow or too big elsewhere;
    and the last cap is exactly a layout's memory ("at most" includes it)."""
    checks.LAYOUT_DRAW.seed(seed)
    caps = checks.layout_caps()
    layouts = {(e.tp, e.pp, e.dp, e.micro_batch, e.recompute, e.zero)
               for e in map(_fastest, caps)}
    assert len(layouts) == len(caps) == 4
    assert _fastest(caps[-1]).memory_per_gpu == caps[-1] * GiB
    assert all(c <= checks.LAYOUT_MAX_CAP_GIB for c in caps)


def test_a_table_of_answers_for_the_labs_own_caps_fails(capsys):
    """The recap used to state exercise 3's answers, and a table for exactly those caps
    passed; the caps are drawn afresh now."""
    table = {cap: _layout(_fastest(cap)) for cap in LAYOUT_CAPS_GIB}

    def choose_layout(cfg, cluster, global_batch, memory_cap):
        fitting = [c for c in table if c * GiB <= memory_cap] or [min(table)]
        return table[max(fitting)]

    fails(capsys, checks.check_choose_layout, choose_layout, "GiB per GPU")


def test_strict_less_than_the_cap_fails_where_a_layout_meets_it(capsys):
    """"At most": the layout whose memory equals the cap fits it."""
    checks.LAYOUT_DRAW.seed(1)    # the last cap, 3.91 GiB, fits one layout exactly
    fails(capsys, checks.check_choose_layout,
          lambda cfg, cluster, batch, cap: MINE["choose_layout"](cfg, cluster, batch,
                                                                 cap - 1),
          "GiB per GPU")


def test_the_planner_prices_tp_beyond_a_node_and_search_keeps_tp_inside():
    """The lab says tp above 8 crosses nodes and search does not try it; estimate takes it."""
    cluster = layout_cluster()
    for tp in (16, 32):
        est = planner.estimate(LLAMA_7B, cluster, tp=tp, pp=1, dp=32 // tp,
                               global_batch=256, micro_batch=1, recompute="full", zero=0)
        assert est.step_time > _fastest(4.5).step_time
    assert max(e.tp for e in checks._layouts()) == 8


def _layout(est):
    return {"tp": est.tp, "pp": est.pp, "dp": est.dp, "micro_batch": est.micro_batch,
            "recompute": est.recompute, "zero": est.zero}


def test_ignoring_the_cap_does_not_fit(capsys):
    fastest = planner.search(LLAMA_7B, layout_cluster(), 256)[0]
    fails(capsys, checks.check_choose_layout, lambda *args: _layout(fastest),
          f"{FIRST}: tp 1 × pp 1 × dp 32", "GiB per GPU (parameters",
          "Hint: shard what dominates")


def test_the_tightest_layout_everywhere_is_too_slow(capsys):
    tight = _fastest(LAYOUT_CAPS_GIB[-1])
    fails(capsys, checks.check_choose_layout, lambda *args: _layout(tight),
          f"{FIRST}: {describe_layout(tight)} "
          "fits, and its step takes",
          "of the fastest layout that fits", "Hint: every memory saving costs time")


def test_an_invalid_layout_passes_the_planners_error_through(capsys):
    fails(capsys, checks.check_choose_layout,
          lambda *args: {"tp": 1, "pp": 32, "dp": 1, "micro_batch": 3, "recompute": "full",
                         "zero": 0},
          "planner.estimate refuses", "micro_batch=3 does not divide the 256 sequences")


def test_a_layout_not_using_every_gpu_is_refused(capsys):
    fails(capsys, checks.check_choose_layout,
          lambda *args: {"tp": 8, "pp": 1, "dp": 2, "micro_batch": 1, "zero": 0,
                         "recompute": "none"},
          "tp × pp × dp = 16, not the 32 GPUs")


def test_a_layout_without_micro_batch_is_refused(capsys):
    fails(capsys, checks.check_choose_layout,
          lambda *args: {"tp": 8, "pp": 1, "dp": 4, "micro_batch": None,
                         "recompute": "none", "zero": 0},
          "micro_batch=None lets the planner pick")
    fails(capsys, checks.check_choose_layout, lambda *args: (2, 4, 4),
          "returned (2, 4, 4)", "Hint: return a dict of planner.estimate's arguments")


def test_a_layout_that_raises_is_reported(capsys):
    def choose_layout(cfg, cluster, global_batch, memory_cap):
        return {"tp": cfg.heads // cluster.gpus_per_node}

    fails(capsys, checks.check_choose_layout, choose_layout, "raised AttributeError")


def test_the_check_compares_with_the_cap_applied():
    """The fastest under a cap fits it, and is slower than without the cap."""
    free = planner.search(LLAMA_7B, layout_cluster(), 256)[0]
    for cap in LAYOUT_CAPS_GIB + tuple(CAPS):
        assert _fastest(cap).memory_per_gpu <= cap * GiB
        assert _fastest(cap).step_time > free.step_time


# ------------------------------------------------------------ exercise 4: bubble


def test_the_bubble_without_dp_is_named(capsys):
    fails(capsys, checks.check_pipeline_bubble,
          lambda gpus, t, p, batch, b, v=1: (p - 1) / (v * batch / b),
          "❌ 3D pipeline bubble: 32 GPUs, t = 2, p = 4, B = 512, b = 1, v = 1: returned "
          "0.005859, expected 0.02344", "m = B/(b·d), not B/b")


def test_the_wall_time_fraction_is_named(capsys):
    def bubble(gpus, t, p, batch, b, v=1):
        m = batch / (b * gpus // (t * p))
        return (p - 1) / (v * m + p - 1)

    fails(capsys, checks.check_pipeline_bubble, bubble, "share of the wall time")


def test_ignoring_interleaving_is_named(capsys):
    def bubble(gpus, t, p, batch, b, v=1):
        return (p - 1) / (batch / (b * gpus // (t * p)))

    fails(capsys, checks.check_pipeline_bubble, bubble, "v = 2: returned 0.02344, expected "
          "0.01172", "divide by v")


def test_a_percentage_is_named(capsys):
    fails(capsys, checks.check_pipeline_bubble,
          lambda *case: 100 * MINE["pipeline_bubble"](*case), "not a percentage")


def test_a_bubble_that_raises_or_returns_none_is_reported(capsys):
    def bubble(gpus, t, p, batch, b, v=1):
        raise NotImplementedError("m = B/(b·d)")

    not_started(capsys, checks.check_pipeline_bubble, bubble, "3D pipeline bubble", "m = B/(b·d)")
    fails(capsys, checks.check_pipeline_bubble, lambda *case: None,
          "returned None, not a number")


def test_a_layout_without_zero_is_named(capsys):
    def choose_layout(cfg, cluster, batch, cap):
        layout = MINE["choose_layout"](cfg, cluster, batch, cap)
        del layout["zero"]          # estimate would take ZeRO-0 and report it too large
        return layout

    fails(capsys, checks.check_choose_layout, choose_layout, FIRST,
          "your layout has no 'zero'", "'recompute' and 'zero'")


def test_build_groups_with_init_device_mesh_is_refused(capsys):
    from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

    def build_groups(pp, dp, tp):        # what the check compares with, not by hand
        mesh = init_device_mesh("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        return {dim: mesh.get_group(dim) for dim in ("pp", "dp", "tp")}

    fails(capsys, checks.check_build_groups, build_groups, "calls init_device_mesh",
          "dist.new_group")

    def build_groups_from_a_device_mesh(pp, dp, tp):
        ranks = torch.arange(pp * dp * tp).view(pp, dp, tp)
        mesh = DeviceMesh("cpu", ranks, mesh_dim_names=("pp", "dp", "tp"))
        return {dim: mesh.get_group(dim) for dim in ("pp", "dp", "tp")}

    fails(capsys, checks.check_build_groups, build_groups_from_a_device_mesh,
          "calls DeviceMesh", "dist.new_group")


# ------------------------- malformed returns, numpy numbers (issue 24, item 9)


@pytest.mark.parametrize("key, value, said", [
    ("tp", None, "your layout's 'tp' is None, not a whole number"),
    ("dp", "4", "your layout's 'dp' is '4', not a whole number"),
    ("pp", 1.5, "your layout's 'pp' is 1.5, not a whole number"),
    ("micro_batch", float("nan"), "your layout's 'micro_batch' is nan, not a whole number"),
    ("zero", None, "planner.estimate refuses"),
    ("recompute", None, "planner.estimate refuses"),
])
def test_a_layout_with_a_malformed_value_is_a_failure(capsys, key, value, said):
    layout = {"tp": 8, "pp": 1, "dp": 4, "micro_batch": 1, "recompute": "none", "zero": 0}
    fails(capsys, checks.check_choose_layout, lambda *args: dict(layout, **{key: value}),
          f"{FIRST}: {said}")


def test_right_answers_as_numpy_numbers_or_fractions_are_accepted(capsys):
    import numpy as np
    from fractions import Fraction

    def numpy_layout(*args):
        return {k: np.int64(v) if isinstance(v, int) and not isinstance(v, bool) else v
                for k, v in MINE["choose_layout"](*args).items()}

    assert line(capsys, checks.check_choose_layout, numpy_layout)[0]
    assert line(capsys, checks.check_model_flops,
                lambda *args: np.float64(MINE["model_flops"](*args)))[0]
    assert line(capsys, checks.check_pipeline_bubble,
                lambda *args: Fraction(MINE["pipeline_bubble"](*args)))[0]


# ---------------------------------------- exercise 1: the ban on init_device_mesh, and hints


def test_init_device_mesh_imported_inside_the_function_is_refused(capsys):
    """The ban worked on the name only: an import inside the function passed."""
    def build_groups(pp, dp, tp):
        from torch.distributed.device_mesh import init_device_mesh as make
        mesh = make("cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        return {name: mesh.get_group(name) for name in ("pp", "dp", "tp")}

    fails(capsys, checks.check_build_groups, build_groups,
          "your function built a DeviceMesh (init_device_mesh)", "Hint: build the groups by hand")


def test_init_device_mesh_by_its_module_path_is_refused(capsys):
    def build_groups(pp, dp, tp):
        mesh = torch.distributed.device_mesh.init_device_mesh(
            "cpu", (pp, dp, tp), mesh_dim_names=("pp", "dp", "tp"))
        return {name: mesh.get_group(name) for name in ("pp", "dp", "tp")}

    fails(capsys, checks.check_build_groups, build_groups,
          "your function built a DeviceMesh (init_device_mesh)")


def test_a_tp_group_without_its_last_rank_names_the_range_not_the_group_kept(capsys):
    """range(tp - 1): the last rank of every tp group is in none; the hint used to say
    'keep the group whose ranks include this rank', which the learner did."""
    def build_groups(pp, dp, tp):
        mesh, mine = torch.arange(pp * dp * tp).view(pp, dp, tp), {}
        for dim, name in enumerate(("pp", "dp", "tp")):
            for ranks in mesh.movedim(dim, -1).reshape(-1, mesh.shape[dim]).tolist():
                if name == "tp":
                    ranks = ranks[:-1]
                group = dist.new_group(ranks)
                if dist.get_rank() in ranks:
                    mine[name] = group
        return mine

    text = fails(capsys, checks.check_build_groups, build_groups,
                 "(pp, dp, tp) = (2, 2, 2): rank ", "its 'tp' group is missing",
                 "no group this rank created is its tp group of 2 ranks",
                 "range bounds")
    assert "keep the group" not in text


def test_a_list_of_ranks_is_not_called_a_group_the_rank_is_not_in(capsys):
    """Rank 0 returning [0, 4] was told '[0, 4], not a group it is a member of'."""
    def build_groups(pp, dp, tp):
        groups = MINE["build_groups"](pp, dp, tp)
        groups["pp"] = dist.get_process_group_ranks(groups["pp"])
        return groups

    text = fails(capsys, checks.check_build_groups, build_groups,
                 "its 'pp' group is the rank list [", "], not a process group",
                 "return the group dist.new_group gave you")
    assert "member of" not in text
