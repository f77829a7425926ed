"""Lab 13's design check and the lesson's design grader: the reference design passes,
the reference itself is refused, and wrong designs — one that never returns, one that
raises, one that is not a dict, one with a layout that does not fit, one that checkpoints
too rarely on the slowest tier, one that leaves no node for failures — each get one ❌
line naming what is wrong. Also: the worked numbers the lesson prints are the planner's
and the scheduler's, and ``checks`` re-exports the parameter server's and the drills'
checks (tested in test_lesson13_ps.py and test_lesson13_drills.py)."""

import pytest

from _check_helpers import fails, learner_namespace, line, not_started
from simcluster import goodput, planner, scheduling
from workbook import checking
from workbook.lesson13_interview_prep import _reference as R
from workbook.lesson13_interview_prep import checks, demos, design, drills, lab
from workbook.lesson13_interview_prep import parameter_server

MINE = learner_namespace(R, R.my_design)["my_design"]


@pytest.fixture(scope="module")
def good():
    return R.my_design()



def test_the_reference_design_passes(capsys):
    result, text = line(capsys, checks.check_design, MINE)
    assert result and "scheduling 30/30" in text


def test_the_reference_itself_is_refused(capsys):
    fails(capsys, checks.check_design, R.my_design, "the workbook's own reference")


def test_a_design_that_never_returns(capsys, short_timeout):
    def my_design():
        while True:
            pass
    fails(capsys, checks.check_design, my_design, "still running after 2 s")


def test_a_design_that_raises_and_one_not_started(capsys):
    def my_design():
        return {"nodes_per_run": 8}["tp"]
    fails(capsys, checks.check_design, my_design, "KeyError")

    def unwritten():
        raise NotImplementedError("fill the dict")
    not_started(capsys, checks.check_design, unwritten, "system design", "fill the dict")


def test_a_design_that_is_not_a_dict_or_misses_a_key(capsys, good):
    fails(capsys, checks.check_design, lambda: None, "returned NoneType, not a dict")
    partial = {k: v for k, v in good.items() if k != "spare_nodes"}
    fails(capsys, checks.check_design, lambda: partial, "no 'spare_nodes'")
    fails(capsys, checks.check_design, lambda: dict(good, placement="random"),
          "placement must be one of")


def test_a_layout_that_does_not_fit(capsys, good):
    text = fails(capsys, checks.check_design, lambda: dict(good, pp=1, zero=0),
                 "topology lost the most", "does not fit")
    assert "topology 15/40" in text


def test_a_layout_without_memory_headroom_does_not_fit(capsys, good):
    # tp 2, pp 2, dp 16, ZeRO-2 needs 78.6 GiB of the 80 the planner counts; an H100 80GB
    # shows 79.65 GiB before the CUDA context, NCCL's buffers and fragmentation
    oom = dict(good, tp=2, pp=2, zero=2)
    assert design.layout_of(oom, lab.LAB_SCENARIO).fits          # the planner's own test
    fails(capsys, checks.check_design, lambda: oom, "topology lost the most",
          "78.6 GiB per GPU, more than 90% of 80 GiB")
    for nodes in (8, 10):
        best = design.best_layout(nodes)
        assert best.memory_per_gpu <= 0.9 * best.device_memory


@pytest.mark.parametrize("placement", ["first_fit", "best_fit", "spread"])
def test_a_placement_that_is_not_topology_aware(capsys, good, placement):
    fails(capsys, checks.check_design, lambda: dict(good, placement=placement),
          "topology lost the most", f"placement {placement} is not topology-aware",
          "across units 0, 1")
    assert design.keeps_units("topology") == (True, "")


def test_a_run_across_units_runs_slower(good):
    est = design.layout_of(good, lab.LAB_SCENARIO)
    assert design.crossing_slowdown(est, lab.LAB_SCENARIO) > 1.01


def test_checkpoints_every_hour_on_the_memory_tier(capsys, good):
    # Daly's interval is about 3.6 minutes: an hour is about 17 times too rare
    assert good["checkpoint_minutes"] < 5
    fails(capsys, checks.check_design, lambda: dict(good, checkpoint_minutes=60),
          "checkpoint lost the most", "every 60 min")
    # 1.5 points of goodput below the best: most of the 30 points, not a third of them
    assert design.evaluate(dict(good, checkpoint_minutes=60),
                           lab.LAB_SCENARIO).points["checkpoint"] <= 10


def test_an_interval_too_long_to_simulate_is_a_failure_line(capsys, good):
    fails(capsys, checks.check_design, lambda: dict(good, checkpoint_minutes=1e8),
          "the design is not complete", "checkpoint_minutes must be at most 4,320")


def test_the_lab_helpers_default_to_the_lab_scenario():
    assert lab.failure_rates(8) == design.failure_rates(8, lab.LAB_SCENARIO)
    assert lab.checkpoint_tiers(8) == design.checkpoint_tiers(8, lab.LAB_SCENARIO)
    assert lab.failure_rates(8) != design.failure_rates(8)
    assert lab.best_layout(8).step_time == design.best_layout(8, lab.LAB_SCENARIO).step_time


def test_data_parallel_traffic_is_two_bytes_per_parameter_of_the_shard():
    # reduce-scatter of 16-bit gradients + all-gather of 16-bit weights: 2(d-1)/d x 2 bytes
    est = design.layout_of(demos.WORKED)
    shard = max(planner._stage_parameters(design.MODEL, est.pp, est.tp))
    row = design.traffic(est)["data"]
    assert row["bytes"] == pytest.approx(2 * (est.dp - 1) / est.dp * 2 * shard)
    assert 23.0e9 < row["bytes"] < 23.2e9


def test_a_restart_costs_the_scenarios_minutes_as_in_lessons_10_and_11():
    assert 1 <= design.QUESTION.restart_minutes <= 10
    tiers = design.checkpoint_tiers(8)
    assert all(t["restore"] > design.QUESTION.restart_minutes * 60 for t in tiers.values())


def test_checkpoints_too_rare_on_the_remote_tier(capsys, good):
    fails(capsys, checks.check_design,
          lambda: dict(good, checkpoint_tier="remote", checkpoint_minutes=600),
          "checkpoint lost the most", "checkpoint 0/30")


def test_runs_that_fill_the_cluster_without_spares_miss_the_day(good):
    grade = design.evaluate(dict(good, nodes_per_run=10, pp=5, zero=1),
                            design.QUESTION)
    assert grade.numbers["finished_in_day"] < design.QUESTION.runs
    assert grade.points["scheduling"] <= 15
    assert any("not met" in note for note in grade.notes["scheduling"])


def test_the_design_graded_is_the_planners():
    grade = design.evaluate(demos.WORKED)
    est = planner.estimate(design.MODEL, design.QUESTION.spec(8), tp=2, pp=4, dp=8,
                           global_batch=design.GLOBAL_BATCH, recompute="selective", zero=2)
    assert grade.numbers["layout"].step_time == est.step_time
    assert grade.total >= design.PASS_SCORE and grade.numbers["finished_in_day"] == 100
    # nine nodes have no layout at all (dp must divide 1,024, pp the 60 layers)
    assert design.best_layout(9) is None


def test_the_checkpoint_numbers_are_daly_and_the_specs():
    tiers = design.checkpoint_tiers(8)
    node = design.QUESTION.spec(1).nodes[0]
    per_node = design.CHECKPOINT_BYTES_PER_PARAMETER * planner.parameter_count(design.MODEL) / 8
    assert tiers["nvme"]["delta"] == node.storage.write_seconds(per_node)
    assert tiers["memory"]["delta"] < tiers["nvme"]["delta"] < tiers["remote"]["delta"]
    mtbf = design.failure_rates(8)["job_mtbf"]
    assert mtbf == 86400 / (8 * 0.05)
    best = goodput.daly_interval(tiers["memory"]["delta"], mtbf)
    g = goodput.expected_goodput
    assert g(best, tiers["memory"]["delta"], mtbf, 30) > g(4 * best, tiers["memory"]["delta"],
                                                         mtbf, 30)


def test_the_lab_scenario_is_not_the_lessons():
    assert lab.LAB_SCENARIO.runs != design.QUESTION.runs
    assert lab.LAB_SCENARIO.failures_per_node_per_day != design.QUESTION.failures_per_node_per_day
    # the lesson's worked design, unchanged, is not the lab's answer: its spares do not
    # leave room for 120 runs of 8 nodes
    grade = design.evaluate(demos.WORKED, lab.LAB_SCENARIO)
    assert grade.numbers["finished_in_day"] < lab.LAB_SCENARIO.runs


def test_checks_re_exports_the_other_checks():
    assert checks.check_parameter_server is parameter_server.check_parameter_server
    assert checks.check_drill_set is drills.check_drill_set
    assert checks.check_estimate is drills.check_estimate


# ------------------------------------------------ the scheduler's node failures


def test_a_failed_node_stops_its_job_which_restarts_from_its_checkpoint():
    spec = design.QUESTION.spec(2)
    job = scheduling.Job("a", 8, 1000, gpus_per_node=8, checkpoint_every=300,
                         restart_cost=50)
    result = scheduling.simulate([job], spec, failures=[(700, 0, 100)])
    attempts = result.by_name["a"].attempts
    assert [a["outcome"] for a in attempts] == ["failed", "finished"]
    # it saved 600 s of work; restarts at 700 on node 1, 50 s to restart, 400 s left
    assert attempts[1]["start"] == 700 and result.by_name["a"].end == 700 + 50 + 400
    assert result.failures == 1 and result.preemptions == 0
    assert "1 node failures stopped 1 job attempt(s)" in result.summary()


def test_a_job_waits_for_the_repair_when_no_node_is_free():
    spec = design.QUESTION.spec(1)
    job = scheduling.Job("a", 8, 1000, gpus_per_node=8)      # no checkpoint: starts over
    result = scheduling.simulate([job], spec, failures=[(100, 0, 500), (200, 0, 10)])
    assert result.by_name["a"].attempts[1]["start"] == 600   # the second failure is ignored
    assert result.by_name["a"].end == 1600


def test_without_failures_nothing_changes():
    spec = design.QUESTION.spec(4)
    jobs = scheduling.synthetic_trace(50, spec, seed=3, sizes=((8, 8, 1.0),))
    a = scheduling.simulate(jobs, spec, backfill=True)
    b = scheduling.simulate(jobs, spec, backfill=True, failures=[])
    assert [j.end for j in a.jobs] == [j.end for j in b.jobs]
    assert "node failures" not in a.summary()


def test_node_failures_use_spares_and_are_deterministic():
    one = scheduling.node_failures(100, 0.05, 10 * 86400, 3600.0, spares=2, swap=60, seed=4)
    assert one == scheduling.node_failures(100, 0.05, 10 * 86400, 3600.0, spares=2, swap=60,
                                           seed=4)
    assert 30 <= len(one) <= 70                               # 50 expected
    assert {down for _, _, down in one} <= {60.0, 3600.0}
    assert any(down == 60.0 for _, _, down in one)
    with pytest.raises(ValueError, match="failures\\[0\\]"):
        scheduling.simulate([], design.QUESTION.spec(1), failures=[(0, 5, 10)])


def test_the_lab_gives_nudges_and_progressive_hints():
    from test_hints import (
        test_every_unwritten_exercise_is_a_nudge_pointing_to_its_progressive_hints as nudges)
    nudges("labs/13_interview_prep.ipynb", "workbook.lesson13_interview_prep")
    import nbformat
    lab_nb = nbformat.read("labs/13_interview_prep.ipynb", as_version=4)
    unsolved = "\n".join(c.source for c in lab_nb.cells if "NotImplementedError" in c.source)
    # none of the formulas or the server's rule the old cells gave away
    for given_away in ("2(p−1)", "16Ψ", "√(2δM)", "6·N", "clock[w]", "min(clock)"):
        assert given_away not in unsolved, given_away
