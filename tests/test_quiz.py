"""Quizzes (workbook/quiz.py): grading, widgets, and stable stored outputs."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient
from nbformat.v4 import new_code_cell, new_notebook

from workbook import quiz

REPO = Path(__file__).resolve().parents[1]
WIDGET = "application/vnd.jupyter.widget-view+json"


def ring_choice():
    return quiz.choice(
        "How many steps does a ring all-reduce over $p$ ranks take?",
        ["$p$", ("$p - 1$", "That is only the reduce-scatter half."), "$2(p - 1)$",
         "$\\log_2 p$"],
        answer="$2(p - 1)$",
        explain="Reduce-scatter, then all-gather: $p - 1$ steps each.",
        hint="It has two phases.")


def zero_number():
    return quiz.number("Memory per GPU for 7.5B parameters under ZeRO stage 1, 64 GPUs?",
                       answer=31.4, unit="GB", rel_tol=0.05,
                       explain="$4Ψ + 12Ψ/64$ bytes.")


# --- multiple choice -------------------------------------------------------------------

@pytest.mark.parametrize("response", [2, "$2(p - 1)$"])
def test_the_right_option_is_correct_and_explained(response):
    feedback = ring_choice().check(response)
    assert feedback.correct and feedback.status == "correct"
    assert feedback.message.startswith("✅")
    assert "Reduce-scatter, then all-gather" in str(feedback)


def test_a_wrong_option_gets_its_own_reason_and_the_hint_but_not_the_explanation():
    feedback = ring_choice().check(1)
    assert feedback.status == "wrong" and not feedback.correct
    assert feedback.message.startswith("❌")
    assert "only the reduce-scatter half" in feedback.message and "two phases" in feedback.message
    assert "Reduce-scatter, then all-gather" not in feedback.message
    assert "reduce-scatter half" not in ring_choice().check(0).message


@pytest.mark.parametrize("response, words", [
    (None, "Pick an option"), (7, "not one of the options"), ("$q$", "not one of the options"),
    (True, "not one of the options"), (-1, "not one of the options")])
def test_no_option_or_an_unknown_one_gets_a_message(response, words):
    feedback = ring_choice().check(response)
    assert feedback.status == "invalid" and feedback.message.startswith("⚠️")
    assert words in feedback.message


@pytest.mark.parametrize("kwargs, words", [
    (dict(options=["a", "b"], answer="c"), "not one of the options"),
    (dict(options=["a", "b"], answer=2), "not one of the options"),
    (dict(options=["a"], answer=0), "2 to 26 options"),
    (dict(options=["a", "a"], answer=0), "options must differ"),
])
def test_a_badly_written_choice_is_refused(kwargs, words):
    with pytest.raises(ValueError, match=words):
        quiz.choice("Q?", **kwargs)


# --- numbers ---------------------------------------------------------------------------

@pytest.mark.parametrize("response", [31.4, "31.4", "30", "32.9", "31.4 GB", "31.4GB",
                                      " 3.14e1 ", "+31.4", 30])
def test_a_number_within_the_tolerance_is_correct(response):
    assert quiz.number("Q?", 31.4, unit="GB").check(response).correct


def test_a_correct_but_inexact_number_is_told_the_exact_value():
    assert "The exact value is 31.4 GB" in zero_number().check("31").message
    assert "exact value" not in zero_number().check("31.4").message


@pytest.mark.parametrize("response, direction", [
    ("29.8", "too low"), ("33", "too high"), ("-31.4", "too low"), ("1,200", "too high")])
def test_a_number_outside_the_tolerance_is_wrong_and_says_which_way(response, direction):
    feedback = zero_number().check(response)
    assert feedback.status == "wrong" and feedback.message.startswith("❌")
    assert direction in feedback.message
    assert "31.4" not in feedback.message.replace(response, ""), "it must not give it away"


def test_the_tolerance_is_relative_to_the_answer_with_an_absolute_floor():
    q = quiz.number("Q?", 1000, rel_tol=0.01)
    assert q.check(990).correct and q.check(1010).correct
    assert not q.check(989.9).correct and not q.check(1010.1).correct
    exact = quiz.number("Q?", 7, rel_tol=0)
    assert exact.check("7").correct and not exact.check("7.001").correct
    zero = quiz.number("Bubble with one stage?", 0, abs_tol=1e-9)
    assert zero.check("0").correct and not zero.check("0.1").correct
    assert quiz.number("Q?", 5, rel_tol=0, abs_tol=0.5).check("5.5").correct


@pytest.mark.parametrize("response, words", [
    ("", "Type a number first"), ("   ", "Type a number first"), (None, "Type a number first"),
    ("abc", "not a number"), ("thirty", "not a number"), ("31.4.1", "not a number"),
    ("1,5", "use a dot for decimals"), ("31.4 MB", "give the number in GB"),
    ("31.4 GB/s", "give the number in GB"), ("31.4 GB!", "not a number"),
    ("nan", "not a number"), ("inf", "not a number"), ("2**5", "not a number"),
    (float("nan"), "not a finite number"), (True, "not a number"), ([31.4], "not a number"),
])
def test_text_that_is_not_a_number_gets_a_message_not_an_exception(response, words):
    feedback = zero_number().check(response)
    assert feedback.status == "invalid" and feedback.message.startswith("⚠️")
    assert words in feedback.message


@pytest.mark.parametrize("kwargs", [
    dict(answer="31.4"), dict(answer=float("inf")), dict(answer=1, rel_tol=-0.1),
    dict(answer=0), dict(answer=True)])
def test_a_badly_written_number_question_is_refused(kwargs):
    with pytest.raises(ValueError):
        quiz.number("Q?", **kwargs)


# --- the widget ------------------------------------------------------------------------

def descendants(widget):
    yield widget
    for child in getattr(widget, "children", ()):
        yield from descendants(child)


def find(widget, kind, **traits):
    return next(w for w in descendants(widget) if type(w).__name__ == kind
                and all(getattr(w, key) == value for key, value in traits.items()))


def shown(output_widget):
    return [output["data"]["text/markdown"] for output in output_widget.outputs]


def test_pressing_check_in_the_widget_gives_instant_feedback():
    q = zero_number()
    box = q.widget()
    find(box, "Button", description="Check").click()
    assert q.feedback.status == "invalid" and "Type a number first" in shown(q._feedback_view)[0]
    find(box, "Text").value = "abc"
    find(box, "Button", description="Check").click()
    assert "not a number" in shown(q._feedback_view)[0]
    find(box, "Text").value = "31"
    find(box, "Button", description="Check").click()
    assert q.solved and shown(q._feedback_view)[0].startswith("✅")


def test_a_choice_widget_shows_each_option_once():
    """The prompt lists the options (as markdown, so math renders); the buttons that pick
    one carry only its letter, so no option is listed twice."""
    q = ring_choice()
    box = q.widget()
    prompt = shown(find(box, "Output"))[0]
    buttons = find(box, "ToggleButtons")
    listed = [line for line in prompt.splitlines() if line.startswith("- ")]
    assert listed == [f"- **{letter}.** {option}" for letter, option in zip("ABCD", q.options)]
    assert [label for label, _ in buttons.options] == ["A", "B", "C", "D"]
    assert list(buttons.tooltips) == q.options


def test_choosing_an_option_and_revealing_the_answer():
    q = ring_choice()
    box = q.widget()
    radio = find(box, "ToggleButtons")
    assert radio.value is None
    radio.value = 0
    find(box, "Button", description="Check").click()
    assert shown(q._feedback_view)[0].startswith("❌") and not q.solved
    find(box, "Button", description="Show answer").click()
    assert q.feedback.status == "revealed" and not q.solved
    assert "**C.** $2(p - 1)$" in shown(q._feedback_view)[0]
    assert "Reduce-scatter, then all-gather" in shown(q._feedback_view)[0]


def test_a_quiz_numbers_its_questions_and_keeps_score():
    questions = [ring_choice(), zero_number()]
    q = quiz.Quiz(questions, title="Check yourself")
    box = q.widget()
    assert shown(q._score_view) == ["**Score: 0 / 2**"]
    questions[1].submit("31.4")
    questions[0].submit(0)
    assert q.score == 1 and shown(q._score_view) == ["**Score: 1 / 2**"]
    assert [question.number for question in questions] == [1, 2]
    assert "**Question 2.** Memory per GPU" in q.markdown()
    assert q.text().startswith("Check yourself\n\nQuestion 1. How many steps")
    assert len([w for w in descendants(box) if type(w).__name__ == "Button"]) == 4
    with pytest.raises(ValueError):
        quiz.Quiz([])


# --- static rendering ------------------------------------------------------------------

def static(bundle):
    return {key: value for key, value in bundle.items() if key != WIDGET}


def test_the_static_rendering_is_deterministic_and_independent_of_clicks():
    first, second = ring_choice(), ring_choice()
    assert first._repr_mimebundle_()[WIDGET] != second._repr_mimebundle_()[WIDGET]  # new ids
    assert static(first._repr_mimebundle_()) == static(second._repr_mimebundle_())
    before = static(first._repr_mimebundle_())
    first.submit(1)
    first.reveal()
    assert static(first._repr_mimebundle_()) == before
    assert first._repr_markdown_() == before["text/markdown"]
    quizzes = [quiz.Quiz([ring_choice(), zero_number()], title="T") for _ in range(2)]
    assert static(quizzes[0]._repr_mimebundle_()) == static(quizzes[1]._repr_mimebundle_())


def test_the_static_rendering_shows_the_question_and_none_of_the_answer():
    markdown = ring_choice().markdown()
    assert "**Question.** How many steps" in markdown and "- **D.** $\\log_2 p$" in markdown
    assert "Run this cell to answer" in markdown
    number = zero_number().markdown()
    assert "*(answer in GB)*" in number and "31.4" not in number
    together = quiz.Quiz([ring_choice(), zero_number()], title="T")
    for text in (markdown, number, ring_choice().text(), zero_number().text(),
                 together.markdown(), together.text()):
        for secret in ("Reduce-scatter, then all-gather", "two phases", "reduce-scatter half",
                       "Answer", "4Ψ + 12Ψ/64", "31.4 GB"):
            assert secret not in text
        assert "model_id" not in text and "0x" not in text


@pytest.mark.slow
def test_a_notebook_with_quizzes_passes_strict_nbval(tmp_path, monkeypatch):
    """Run it once to store outputs, then nbval runs it again (new widget ids) and compares."""
    nb = new_notebook(cells=[
        new_code_cell("from workbook import quiz"),
        new_code_cell("quiz.choice('Which collective sums gradients?', "
                      "['broadcast', 'all-reduce'], answer=1, explain='It sums.')"),
        new_code_cell("q = quiz.number('Bytes in 1 GiB?', 2**30, unit='B')\nq.submit('1e9')\nq"),
        new_code_cell("quiz.Quiz([quiz.choice('A or B?', ['A', 'B'], 'A'),\n"
                      "           quiz.number('Pi?', 3.14159, rel_tol=0.01)], title='Quiz')"),
    ])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3",
                                 "language": "python"}
    # the kernels must import this checkout's workbook, installed or not
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(
        [str(REPO)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else [])))
    NotebookClient(nb, timeout=60, resources={"metadata": {"path": str(tmp_path)}}).execute()
    for cell in nb.cells[1:]:
        (output,) = cell.outputs
        assert set(output.data) == {WIDGET, "text/markdown", "text/plain"}
    nbformat.write(nb, tmp_path / "quiz.ipynb")

    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval", "--nbval-current-env", "-q",
         "-p", "no:cacheprovider", "quiz.ipynb"],
        capture_output=True, text=True, cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "4 passed" in result.stdout


# --- the workbook's own quizzes: workbook/lessonNN_<topic>/quizzes.py --------------------

NOTEBOOK_DIRS = ("notebooks", "solutions", "labs")
ASK = re.compile(r'quiz\.ask\("(\d\d)", "(\w+)"\)')


def every_quiz():
    """``[(lesson, name, function)]`` for every quiz the lessons define."""
    return [(lesson, name, make) for lesson, module in quiz.quiz_modules().items()
            for name, make in quiz.quizzes(module).items()]


def questions(made):
    return made.questions if isinstance(made, quiz.Quiz) else [made]


def secrets(question):
    """What a learner must not see before answering: explanation, hint, options' reasons."""
    texts = [question.explain, question.hint] + list(getattr(question, "why", []))
    return [text for text in texts if text]


def strings(node):
    """Every string in a notebook's JSON; a list of strings (a cell's lines) as one string."""
    if isinstance(node, str):
        yield node
    elif isinstance(node, list) and node and all(isinstance(item, str) for item in node):
        yield "".join(node)
    elif isinstance(node, list):
        for item in node:
            yield from strings(item)
    elif isinstance(node, dict):
        for value in node.values():
            yield from strings(value)


def notebooks():
    return sorted(path for folder in NOTEBOOK_DIRS for path in (REPO / folder).glob("*.ipynb"))


def test_the_workbook_has_its_quizzes_and_each_grades_right_and_wrong_answers():
    found = every_quiz()
    assert len(found) >= 20
    for lesson, name, make in found:
        for question in questions(make()):
            assert question.explain, f"{lesson} {name}: no explanation"
            if isinstance(question, quiz.Choice):
                wrong = (question.answer + 1) % len(question.options)
                assert question.check(question.answer).correct, (lesson, name)
                assert question.check(question.options[question.answer]).correct
            else:
                wrong = 2 * question.answer + 1
                assert question.check(question.answer).correct, (lesson, name)
                assert question.check(f"{question.answer} {question.unit}").correct
            feedback = question.check(wrong)
            assert feedback.status == "wrong" and question.explain not in feedback.message


def test_ask_builds_a_fresh_quiz_and_refuses_unknown_ones_clearly():
    first, second = quiz.ask("03", "no_sync"), quiz.ask("03", "no_sync")
    assert first is not second and first.question == second.question
    first.submit(first.answer)
    assert first.solved and not second.solved
    with pytest.raises(ValueError, match="lesson 03 has no quiz 'nope'; its quizzes: .*no_sync"):
        quiz.ask("03", "nope")
    for lesson in ("3", "99", 3, "../03"):
        with pytest.raises(ValueError, match="no quizzes for lesson"):
            quiz.ask(lesson, "no_sync")


def test_no_notebook_shows_a_quiz_answer_or_explanation():
    """Not in a cell's source, not in a stored output, not in saved widget state."""
    hidden = {text: (lesson, name) for lesson, name, make in every_quiz()
              for question in questions(make()) for text in secrets(question)}
    asked = set()
    for path in notebooks():
        nb = json.loads(path.read_text(encoding="utf-8"))
        for text in strings(nb):
            for secret, where in hidden.items():
                assert secret not in text, f"{path.name} shows quiz {where}'s {secret[:40]!r}"
        for cell in nb["cells"]:
            source = "".join(cell["source"])
            if cell["cell_type"] != "code" or "quiz." not in source:
                continue
            # a quiz is asked by name, never written out in the cell
            assert ASK.fullmatch(source.strip()), f"{path.name}: quiz cell {source[:60]!r}"
            lesson, name = ASK.fullmatch(source.strip()).groups()
            asked.add((lesson, name))
            made = quiz.ask(lesson, name)
            for output in cell.get("outputs", []):
                if "data" in output:
                    assert "".join(output["data"]["text/markdown"]) == made.markdown()
    assert asked == {(lesson, name) for lesson, name, _ in every_quiz()}, \
        "every quiz is asked in some notebook, and every asked quiz exists"
