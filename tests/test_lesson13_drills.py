"""Lesson 13's drills (workbook/lesson13_interview_prep/drills.py): every registered drill
draws finite answers that its own worked answer grades right and that a factor of 2 or 10
grades wrong; units and tolerances parse as documented; the timed session hides answers
until answered; the lab's drill-set and estimate checks pass the reference and fail wrong
answers (a wrong unit, 10× off, one that raises, one that never returns) and say ⬜ for an
untouched exercise."""

import json
import math
import re
import subprocess
import sys

import nbformat
import pytest

from workbook import progress
from workbook.lesson13_interview_prep import _reference_drills as reference
from workbook.lesson13_interview_prep import drills

SEEDS = (0, 1, 2)
NAMES = list(drills.DRILLS)


# ------------------------------------------------------------------ the registry


def test_at_least_sixty_drills_over_three_levels_and_every_lesson():
    assert len(drills.DRILLS) >= 60
    levels = {d.level for d in drills.DRILLS.values()}
    assert levels == set(drills.LEVELS)
    assert all(len(drills.names(level)) >= 10 for level in drills.LEVELS)
    lessons = {d.lesson for d in drills.DRILLS.values()}
    assert lessons == {f"{i:02d}" for i in range(13)}


def test_a_drill_name_cannot_be_registered_twice():
    with pytest.raises(ValueError, match="exists already"):
        drills.drill("warm-up", "01")(drills.DRILLS["gpipe_bubble"].make)


@pytest.mark.parametrize("name", NAMES)
def test_each_drill_grades_its_own_answer_right_and_factors_wrong(name):
    for seed in SEEDS:
        q = drills.make(name, seed)
        assert math.isfinite(q.answer) and q.answer > 0, (name, seed, q.answer)
        assert q.text.strip() and q.takeaway.strip() and "\n" not in q.takeaway
        assert q.level in drills.LEVELS and re.fullmatch(r"(0\d|1[0-2])", q.lesson)
        assert drills.unit_kind(q.unit) is not None, q.unit
        assert q.rel_tol < 0.5            # so that 2× and ½× are always wrong
        worked = re.search(r"\*\*Answer: (.+)\*\*$", q.worked).group(1)
        assert worked == q.answer_text
        assert drills.grade(q, worked).correct, (name, seed, worked)
        kind, factor = drills.unit_kind(q.unit)
        bare = q.answer if kind == "fraction" else q.answer / factor
        assert drills.grade(q, bare).correct               # a bare number: the unit asked
        for factor in (2, 10, 0.5, 0.1):
            wrong = drills.show(q.answer * factor, q.unit)
            assert drills.grade(q, wrong).status == "wrong", (name, seed, factor, wrong)
        assert q.answer_text not in repr(q)                # a repr never shows it


@pytest.mark.parametrize("name", NAMES)
def test_each_byte_drill_refuses_the_answer_counted_in_the_other_unit(name):
    # 1 GiB = 1.074 GB: inside a ±10 % tolerance, so the unit is checked, not the tolerance
    for seed in SEEDS:
        q = drills.make(name, seed)
        kind, factor = drills.unit_kind(q.unit)
        if kind not in ("bytes", "bandwidth") or factor < 1e3:
            continue
        binary = 2 ** (10 * round(math.log10(factor) / 3))
        decimal = 10 ** (3 * round(math.log10(factor) / 3))
        ratio = decimal / binary if factor % 1000 == 0 else binary / decimal
        confused = q.answer / factor * ratio
        result = drills.grade(q, confused)
        assert result.status == "wrong" and "counted in" in result.message, (name, seed,
                                                                             result.message)


def test_a_gib_answer_to_a_gb_drill_is_wrong_and_says_why():
    q = drills.drill_set()["zero3_per_gpu"]
    assert q.unit == "GB" and q.answer == 175e9
    for response in (163, "163 GB", "about 163"):
        result = drills.grade(q, response)
        assert result.status == "wrong", response
        assert result.message == ("❌ 163 GB is the answer counted in GiB, not in GB "
                                  "(1 GiB = 1.074 GB).")
    assert drills.grade(q, "163 GiB").correct          # the right size, in GiB
    assert drills.grade(q, 170).correct                 # within ±10 %, nearer GB


@pytest.mark.parametrize("name", NAMES)
def test_each_drill_is_deterministic_per_seed(name):
    for seed in SEEDS:
        assert drills.make(name, seed) == drills.make(name, seed)


def test_different_seeds_draw_different_numbers_for_most_drills():
    varied = [name for name in NAMES
              if len({(q.text, q.answer) for q in (drills.make(name, s) for s in range(5))}) > 1]
    assert len(varied) >= 0.9 * len(NAMES), set(NAMES) - set(varied)


def test_known_answers_pin_the_numbers_on_every_machine():
    # random.Random(str) is the same everywhere; these pin the lab's questions too
    assert drills.make("gpipe_bubble", 13).answer == pytest.approx(7 / 71)
    assert drills.make("zero3_per_gpu", 13).answer == pytest.approx(16 * 175e9 / 16)
    assert drills.make("young_checkpoint_interval", 13).answer == \
        pytest.approx(math.sqrt(2 * 30 * 7200))


def test_draw_is_deterministic_and_distinct():
    a = drills.draw(level="interview", n=6, seed=4)
    assert a == drills.draw(level="interview", n=6, seed=4)
    assert len({q.name for q in a}) == 6 and all(q.level == "interview" for q in a)
    assert a != drills.draw(level="interview", n=6, seed=5)
    with pytest.raises(ValueError, match="level"):
        drills.draw(level="easy")
    with pytest.raises(ValueError, match="n must be"):
        drills.draw(level="hard", n=1000)
    with pytest.raises(ValueError, match="no drill"):
        drills.make("no_such_drill")


# ------------------------------------------------------------------ parsing


@pytest.mark.parametrize("text, unit, value", [
    ("1.5 GB", "GB", 1.5e9), ("1500 MB", "GB", 1.5e9), ("1.4 GiB", "GB", 1.4 * 2**30),
    ("1.5", "GB", 1.5e9), ("1,500,000,000 B", "GB", 1.5e9), ("1.5gb", "GB", 1.5e9),
    ("12%", "%", 0.12), ("0.12", "%", 0.12), ("12", "%", 0.12), ("12 percent", "%", 0.12),
    ("about 3e9", "", 3e9), ("3 × 10^9", "", 3e9), ("3x10^9", "", 3e9), ("3·10⁹", "", 3e9),
    ("~3 billion", "parameters", 3e9), ("≈ 3e9 parameters", "parameters", 3e9),
    ("250 µs", "ms", 250e-6), ("250 us", "ms", 250e-6), ("0.25", "ms", 250e-6),
    ("2.5 ms", "s", 2.5e-3), ("1.5 h", "min", 5400), ("3 days", "h", 3 * 86400),
    ("400 TFLOP/s", "TFLOP/s", 400e12), ("0.4 PFLOP/s", "TFLOP/s", 400e12),
    ("50 GB/s", "GB/s", 50e9), ("1.7e18 FLOP", "PFLOP", 1.7e18), ("8 GPUs", "GPUs", 8),
    ("\u22121.5 GB", "GB", -1.5e9), (42, "GB", 42e9), (0.5, "%", 0.5),
])
def test_parse_converts_units(text, unit, value):
    assert drills.parse(text, unit) == pytest.approx(value)


@pytest.mark.parametrize("text, unit, words", [
    ("abc", "GB", "not a number"), ("", "ms", "type an answer"), (None, "ms", "type an"),
    ("1.5 ms", "GB", "is a time, but this answer is a size in bytes"),
    ("3 GB", "%", "size in bytes, but this answer is a fraction"),
    ("12 furlongs", "s", "unknown unit"), ("GB 12", "GB", "not a number"),
    (float("nan"), "GB", "not a finite number"), (True, "", "not a number"),
])
def test_parse_errors_say_what_is_wrong(text, unit, words):
    with pytest.raises(drills.ParseError, match=re.escape(words)):
        drills.parse(text, unit)


def test_grade_never_raises_and_reads_percentages_both_ways():
    q = drills.make("gpipe_bubble", 13)                      # 7/71 = 9.86 %
    for right in ("9.86%", "0.0986", "9.9", "about 10%", 0.0986):
        assert drills.grade(q, right).correct, right
    for wrong in ("19.7%", "0.5", "98.6%"):
        assert drills.grade(q, wrong).status == "wrong", wrong
    bad = drills.grade(q, "9.86 ms")
    assert bad.status == "invalid" and "time" in bad.message
    small = drills.Question("x", "hard", "05", 0, "x", 0.005, "%", 0.1, "", "")
    assert drills.grade(small, "0.5").correct               # 0.5 read as 0.5 %
    assert drills.grade(small, "0.5%").correct


def test_wrong_answers_say_how_far_off_and_explain_only_after_an_answer():
    q = drills.make("zero1_per_gpu", 2)
    wrong = drills.grade(q, q.answer * 10 / 1e9)                 # in GB, the unit asked
    assert "10× the answer" in wrong.message and q.answer_text not in wrong.message
    assert q.worked in str(wrong) and q.takeaway in wrong._repr_markdown_()
    invalid = drills.grade(q, "ten")
    assert invalid.explanation == "" and q.answer_text not in str(invalid)


def test_sig_prints_only_digits_noise_cannot_move():
    assert drills.sig(2.7e24) == "2.7e24"
    assert drills.sig(1530.4) == "1,530"
    assert drills.sig(0.08234) == "0.0823"
    assert drills.sig(16.0) == "16"
    assert drills.sig(999.7) == "1,000"
    assert drills.sig(123.5) == "120"      # 123.5 sits on a rounding boundary: fewer digits


# ------------------------------------------------------------------ the timed session


def test_session_asks_for_the_approach_first_and_hides_the_worked_answer():
    questions = drills.draw(level="warm-up", n=3, seed=1)
    s = drills.Session(questions, seconds=60)
    with pytest.raises(ValueError, match="answer the question first"):
        s.worked()
    assert s.answer(questions[0].answer_text).status == "invalid"   # no approach yet
    with pytest.raises(ValueError, match="approach"):
        s.approach("  ")
    s.approach("the formula for it")
    assert s.answer("not a number").status == "invalid" and not s.answered
    assert s.answer(questions[0].answer_text).correct
    assert questions[0].worked in s.worked() and "the formula for it" in s.worked()
    s.next()
    s.approach("guess")
    s.tick(61)                                                       # time is up
    assert s.remaining == 0
    assert s.answer(questions[1].answer_text).correct
    assert "no point" in s.worked()
    s.next()
    s.approach("guess again")
    assert s.answer(drills.show(questions[2].answer * 10, questions[2].unit)).status == "wrong"
    s.next()
    assert s.done and s.score == 1
    assert s.summary() == "Score: 1 / 3 right in time (2 right in all)."


def test_a_set_clock_runs_across_questions():
    questions = drills.draw(level="warm-up", n=2, seed=2)
    s = drills.Session(questions, seconds=100, per="set")
    s.approach("formula")
    s.tick(60)
    s.answer(questions[0].answer_text)
    s.next()
    assert s.remaining == 40                     # not reset for the next question
    s.approach("formula")
    s.tick(50)
    s.answer(questions[1].answer_text)
    assert s.score == 1
    assert drills.Session(questions, per="set").remaining == 2 * drills.SECONDS["warm-up"]
    with pytest.raises(ValueError, match="per must be"):
        drills.Session(questions, per="day")
    with pytest.raises(ValueError, match="seconds must be"):
        drills.Session(questions, seconds=-5)


def _widget_state(widget):
    states, todo = [], [widget]
    while todo:
        w = todo.pop()
        states.append(json.dumps(w.get_state(), default=str))
        todo += list(getattr(w, "children", ()))
    return " ".join(states)


def test_timed_widget_keeps_answers_out_until_answered():
    pytest.importorskip("ipywidgets")
    timed = drills.timed(level="hard", n=2, seed=3)
    q = timed.session.question
    bundle = timed._repr_mimebundle_()
    for text in (bundle["text/plain"], bundle["text/markdown"]):
        assert q.answer_text not in text and q.text not in text
    state = _widget_state(timed.widget())
    assert q.text[:40] in state
    assert q.answer_text not in state and q.takeaway not in state
    timed._approach.value = "start from the formula"
    timed._submit_approach()
    timed._number.value = drills.show(q.answer * 2, q.unit)
    timed._submit_answer()
    assert q.answer_text in _widget_state(timed.widget())     # revealed after answering
    timed._advance()
    timed._approach.value = "again"
    timed._submit_approach()
    timed._number.value = timed.session.question.answer_text
    timed._submit_answer()
    timed._advance()
    assert "Score: 1 / 2" in timed._prompt.outputs[0]["data"]["text/markdown"]


# ------------------------------------------------------------------ the lab's checks


REF = reference.drill_answers()
ESTIMATE = reference.estimate()


def _verdict(capsys, check, fn):
    ok = check(fn)
    line = capsys.readouterr().out
    return ok, line


def test_drill_set_passes_the_reference_answers(capsys):
    ok, line = _verdict(capsys, drills.check_drill_set, lambda: dict(REF))
    assert ok and line.startswith("✅ drill set")
    ok, _ = _verdict(capsys, drills.check_drill_set, dict(REF))   # a dict works as well
    assert ok


@pytest.mark.parametrize("answers, words", [
    (lambda: {**REF, "ring_allreduce_time": "0.36 GB"},
     "is a size in bytes, but this answer is a time"),
    (lambda: {**REF, "zero3_per_gpu": 1750}, "10× the answer"),
    (lambda: {**REF, "young_checkpoint_interval": "22 min"}, "too high"),
    (lambda: {k: v for k, v in REF.items() if k != "kv_cache_size"},
     "no answer for kv_cache_size"),
    (lambda: 1 / 0, "raised ZeroDivisionError"),
    (lambda: None, "returned None"),
    (lambda: [1, 2], "not a dict"),
    (lambda: {n: q.answer_text for n, q in drills.drill_set().items()},
     "reads a drill's computed"),
    (lambda: {**REF, "gpipe_bubble": [0.1]}, "is not a number"),
    (lambda: {**REF, "zero3_per_gpu": 163}, "counted in GiB, not in GB"),
    (lambda: {**REF, "kv_cache_size": f"{5.37e9 / 2**30:.3g} GB"}, "counted in GiB"),
    (reference.drill_answers, "reference answer"),
])
def test_drill_set_fails_wrong_answers(capsys, answers, words):
    ok, line = _verdict(capsys, drills.check_drill_set, answers)
    assert not ok and line.startswith("❌ drill set") and words in line, line


def test_drill_set_stops_an_endless_loop(capsys, short_timeout):
    def forever():
        while True:
            pass
    ok, line = _verdict(capsys, drills.check_drill_set, forever)
    assert not ok and line.startswith("❌") and "still running" in line


def test_drill_set_untouched_is_not_started(capsys):
    def untouched():
        raise NotImplementedError("answer the five drills")
    ok, line = _verdict(capsys, drills.check_drill_set, untouched)
    assert not ok and line.startswith("⬜ drill set: not started")


def test_estimate_passes_the_reference_and_names_the_planner(capsys):
    ok, line = _verdict(capsys, drills.check_estimate, lambda: dict(ESTIMATE))
    assert ok and line.startswith("✅ step-time estimate") and "planner predicts" in line
    expected, est = drills._estimate_expected()
    assert expected["dominant"] == "tp"
    assert expected["compute_s"] < est.step_time      # a lower bound is below the planner


@pytest.mark.parametrize("answers, words", [
    (lambda: {**ESTIMATE, "dominant": "bubble"}, "dominant"),
    (lambda: {**ESTIMATE, "dominant": "memory"}, "not one of"),
    (lambda: {**ESTIMATE, "tp_comm_s": ESTIMATE["tp_comm_s"] * 2}, "tp_comm_s"),
    (lambda: {**ESTIMATE, "flops": ESTIMATE["flops"] / 10}, "flops"),
    (lambda: {**ESTIMATE, "compute_s": "1.8 GB"}, "compute_s"),
    (lambda: {**ESTIMATE, "bubble": 7}, "bubble"),
    (lambda: 1 / 0, "raised ZeroDivisionError"),
    (lambda: {"flops": 1e18}, "no answer for"),
])
def test_estimate_fails_wrong_answers(capsys, answers, words):
    ok, line = _verdict(capsys, drills.check_estimate, answers)
    assert not ok and line.startswith("❌ step-time estimate") and words in line, line


class _Looping:
    """A returned value whose __str__ never ends (a check must not call it)."""

    def __str__(self):
        while True:
            pass


class _LoopingText(str):
    """A text whose own __str__ and strip never end."""

    def __str__(self):
        while True:
            pass

    def strip(self, chars=None):
        while True:
            pass


def test_estimate_never_calls_a_returned_objects_str(capsys):
    ok, line = _verdict(capsys, drills.check_estimate,
                        lambda: {**ESTIMATE, "dominant": _Looping()})
    assert not ok and "dominant: a _Looping is not a text" in line, line
    ok, line = _verdict(capsys, drills.check_estimate,
                        lambda: {**ESTIMATE, "dominant": _LoopingText("tp")})
    assert ok, line
    ok, line = _verdict(capsys, drills.check_drill_set,
                        lambda: {**REF, "zero3_per_gpu": _LoopingText("175 GB")})
    assert ok, line


def test_estimate_stops_an_endless_loop_and_knows_untouched(capsys, short_timeout):
    def forever():
        while True:
            pass

    def untouched():
        raise NotImplementedError("estimate the step")
    ok, line = _verdict(capsys, drills.check_estimate, forever)
    assert not ok and "still running" in line
    ok, line = _verdict(capsys, drills.check_estimate, untouched)
    assert not ok and line.startswith("⬜")


@pytest.mark.slow                     # a fresh interpreter imports torch
def test_importing_the_drills_does_not_load_the_answers():
    # In a fresh interpreter: reloading drills here would give it new functions that the
    # modules re-exporting them (lesson 13's checks) no longer are, for every later test.
    code = ("import sys\n"
            "from workbook.lesson13_interview_prep import drills\n"
            "name = 'workbook.lesson13_interview_prep._reference_drills'\n"
            "assert name not in sys.modules, 'loaded on import'\n"
            "drills.show_drill_set()\n"
            "assert name not in sys.modules, 'loaded by show_drill_set'\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]


def test_make_progress_counts_the_drill_set(capsys):
    """`make progress` reads the check cell's ✅/❌/⬜ line: the drill set's lines are
    counted like every other lab exercise (progress.grade on a one-exercise lab)."""
    def lab(fn):
        ok = drills.check_drill_set(fn)
        out = capsys.readouterr().out
        cell = nbformat.v4.new_code_cell("check_drill_set(my_answers)", execution_count=1,
                                         outputs=[nbformat.v4.new_output("stream", text=out)])
        cell.metadata["workbook"] = {"exercise": 2, "role": "check"}
        nb = nbformat.v4.new_notebook(cells=[cell])
        nb.metadata["workbook"] = {"exercises": [{"number": 2, "title": "A drill set"}]}
        return ok, progress.grade(nb)[0].status

    def untouched():
        raise NotImplementedError("answer the five drills")
    assert lab(lambda: dict(REF)) == (True, progress.PASSED)
    assert lab(lambda: {**REF, "zero3_per_gpu": 1750}) == (False, progress.FAILED)
    assert lab(untouched) == (False, progress.NOT_STARTED)
