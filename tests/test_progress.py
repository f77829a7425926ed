"""The progress report (workbook/progress.py) on a tiny synthetic lab."""

import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from workbook import checking, labs, progress

REPO = Path(__file__).resolve().parents[1]

# A stand-in for a lesson's checks: one line, ✅ or ❌, and a learner's error is reported.
FAKE_CHECK = '''\
def check(name, test):
    try:
        ok = test()
    except Exception as error:
        print(f"❌ {name}: {type(error).__name__}: {error}")
        return
    print(f"✅ {name}" if ok else f"❌ {name}: wrong answer")
'''


def exercise(number, title, solution, test):
    return [new_markdown_cell(f"## Exercise {number}: {title}"),
            new_code_cell(solution), new_code_cell(test)]


def solution_notebook():
    return new_notebook(cells=[
        new_code_cell("from fakecheck import check"),
        *exercise(1, "double", "def double(x):\n    ### BEGIN SOLUTION\n    return 2 * x\n"
                  "    ### END SOLUTION", "check('double', lambda: double(3) == 6)"),
        *exercise(2, "triple", "def triple(x):\n    ### BEGIN SOLUTION\n    return 3 * x\n"
                  "    ### END SOLUTION", "check('triple', lambda: triple(3) == 9)"),
        *exercise(3, "square", "def square(x):\n    ### BEGIN SOLUTION\n    return x * x\n"
                  "    ### END SOLUTION", "check('square', lambda: square(3) == 9)"),
        *exercise(4, "the answer", "### BEGIN SOLUTION\nanswer = 42\n### END SOLUTION",
                  "check('answer', lambda: answer == 42)"),
        *exercise(5, "cube", "def cube(x):\n    ### BEGIN SOLUTION\n    return x ** 3\n"
                  "    ### END SOLUTION", "check('cube', lambda: cube(2) == 8)"),
    ], metadata={"kernelspec": {"name": "python3", "display_name": "Python 3",
                                "language": "python"}})


def set_source(lab, title, source):
    """Write a learner's answer into the exercise cell under the heading ``title``."""
    index = next(i for i, cell in enumerate(lab.cells) if title in cell.source)
    lab.cells[index + 1].source = source


@pytest.fixture(scope="module")
def lab_path(tmp_path_factory):
    """The generated lab, worked on: 1 right, 2 wrong (one by an error), 2 untouched."""
    root = tmp_path_factory.mktemp("progress")
    (root / "solutions").mkdir()
    nbformat.write(solution_notebook(), root / "solutions" / "99_tiny.ipynb")
    labs.build(root / "solutions", root / "labs", log=lambda _: None)
    path = root / "labs" / "99_tiny.ipynb"
    (root / "labs" / "fakecheck.py").write_text(FAKE_CHECK, encoding="utf-8")
    lab = nbformat.read(path, as_version=4)
    set_source(lab, "double", "def double(x):\n    return x + x")           # passes
    set_source(lab, "triple", "def triple(x):\n    return x + 3")           # wrong answer
    set_source(lab, "cube", "def cube(x):\n    return x ** 3\n1 / 0")       # an error
    nbformat.write(lab, path)                 # square and answer: not started
    return path


@pytest.fixture(scope="module")
def report(lab_path):
    return progress.run_lab(lab_path, timeout=60)


@pytest.mark.slow
def test_counts_of_passed_failed_and_not_started(report):
    assert (report.count("passed"), report.count("failed"), report.count("not started")) \
        == (1, 2, 2)
    assert report.error == ""
    assert [(e.number, e.title, e.status) for e in report.exercises] == [
        (1, "Exercise 1: double", "passed"),
        (2, "Exercise 2: triple", "failed"),
        (3, "Exercise 3: square", "not started"),    # the check reports its NotImplementedError
        (4, "Exercise 4: the answer", "not started"),  # the exercise cell itself raises
        (5, "Exercise 5: cube", "failed"),
    ]
    details = {e.number: e.detail for e in report.exercises}
    assert details[2] == "❌ triple: wrong answer"
    assert details[5] == "ZeroDivisionError: division by zero"


@pytest.mark.slow
def test_the_report_is_a_table_with_a_total(report):
    text = progress.format_report([report, report])
    assert "99_tiny: 1/5 passed" in text
    assert "  ✅ 1. Exercise 1: double" in text
    assert "  ❌ 2. Exercise 2: triple — ❌ triple: wrong answer" in text
    assert "  ⬜ 3. Exercise 3: square (not started)" in text
    lines = text.splitlines()
    assert lines[-1].split() == ["total", "2", "4", "4", "10"]
    assert lines[-3].split() == ["99_tiny", "1", "2", "2", "5"]
    assert lines[-6].split() == ["lab", "passed", "failed", "not", "started", "total"]


@pytest.mark.slow
def test_the_command_runs_the_labs_and_leaves_them_unchanged(lab_path):
    before = lab_path.read_bytes()
    result = subprocess.run([sys.executable, "-m", "workbook.progress", str(lab_path),
                             "--timeout", "60"], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines()[-1].split() == ["total", "1", "2", "2", "5"]
    assert lab_path.read_bytes() == before


# --- grading an executed notebook, without a kernel ------------------------------------

def executed(check_text=None, exercise_error=None, check_error=None, ran=True):
    """An executed one-exercise lab."""
    solution = new_notebook(cells=[
        new_markdown_cell("## Ring"),
        new_code_cell("def f():\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION"),
        new_code_cell("check(f)")])
    lab = labs.make_lab(solution, "t.ipynb")
    exercise_cell, check_cell = lab.cells[1], lab.cells[2]
    for cell, error in ((exercise_cell, exercise_error), (check_cell, check_error)):
        cell.execution_count = 1 if ran else None
        if error:
            cell.outputs.append(new_output("error", ename=error[0], evalue=error[1],
                                           traceback=[]))
    if check_text is not None:
        check_cell.outputs.insert(0, new_output("stream", name="stdout", text=check_text))
    return lab


@pytest.mark.parametrize("notebook, status, detail", [
    (executed("✅ ring: all ranks agree\n"), "passed", ""),
    (executed("✅ world size 2\n✅ world size 4\n"), "passed", ""),
    (executed("✅ world size 2\n❌ world size 4: rank 3 got 7, expected 6\n"), "failed",
     "❌ world size 4: rank 3 got 7, expected 6"),
    (executed("  ❌ f raised NotImplementedError: Write your solution here\n"),
     "not started", ""),
    (executed(checking.not_started_text("f", "Write your solution here") + "\n"),
     "not started", ""),
    (executed(exercise_error=("NotImplementedError", "Write your solution here"),
              check_error=("NameError", "name 'f' is not defined")), "not started", ""),
    (executed(check_error=("NameError", "name 'check' is not defined")), "failed",
     "NameError: name 'check' is not defined"),
    (executed(check_error=("KeyboardInterrupt", "")), "failed", "timed out (an endless loop?)"),
    (executed("hello\n"), "failed", "its check cell printed no ✅ / ❌ line"),
    (executed(ran=False), "failed", "its check cell did not run"),
])
def test_grading_an_executed_lab(notebook, status, detail):
    (exercise,) = progress.grade(notebook)
    assert (exercise.number, exercise.title) == (1, "Ring")
    assert (exercise.status, exercise.detail) == (status, detail)


def test_a_deleted_check_cell_is_a_failure_and_a_plain_notebook_has_no_exercises():
    lab = executed("✅ ok\n")
    del lab.cells[2]
    (exercise,) = progress.grade(lab)
    assert exercise.status == "failed" and "missing" in exercise.detail
    assert progress.grade(new_notebook(cells=[new_code_cell("1")])) == []
    text = progress.format_report([progress.LabReport("00_intro")])
    assert "no exercises found" in text and text.splitlines()[-1].split() == [
        "total", "0", "0", "0", "0"]


def test_the_command_without_labs_says_so(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert progress.main([]) == 2
    assert "no labs found" in capsys.readouterr().err
    assert progress.main(["labs/nope.ipynb"]) == 2


# --- a broken lab is reported by name, and the others still are (issue 24, item 12) -----

# git's markers, built here so that no file of the repository holds one
CONFLICT = """{
<<< HEAD
 "cells": [],
===
 "cells": [{"cell_type": "code", "source": "x = 1", "metadata": {}, "outputs": []}],
>>> theirs
 "metadata": {}, "nbformat": 4, "nbformat_minor": 5
}
""".replace("<<<", "<" * 7).replace(">>>", ">" * 7).replace(
    "\n===\n", "\n" + "=" * 7 + "\n")


def with_metadata(exercises=None, cell_number=1):
    """A one-exercise lab whose metadata someone edited by hand."""
    lab = executed("✅ ok\n")
    if exercises is not None:
        lab.metadata["workbook"]["exercises"] = exercises
    for cell in lab.cells[1:]:
        cell.metadata["workbook"]["exercise"] = cell_number
    return lab


def test_a_lab_with_a_merge_conflict_is_reported_by_name(tmp_path):
    path = tmp_path / "09_conflict.ipynb"
    path.write_text(CONFLICT, encoding="utf-8")
    report = progress.run_lab(path)
    assert report.name == "09_conflict" and report.exercises == []
    assert "cannot be read" in report.broken and "merge conflict" in report.broken
    text = progress.format_report([report, progress.run_lab(path)])
    assert "09_conflict: cannot be read" in text and "(the lab stopped early" not in text


@pytest.mark.parametrize("notebook", [
    with_metadata(exercises=[{"title": "no number"}]),
    with_metadata(cell_number="1"),
    with_metadata(exercises=[{"number": "1", "title": "Ring"}]),
])
def test_an_exercise_number_written_by_hand_still_grades(notebook):
    (exercise,) = progress.grade(notebook)
    assert (exercise.number, exercise.status) == (1, "passed")


def test_an_exercise_number_that_is_no_number_breaks_only_its_lab(tmp_path, capsys):
    bad = tmp_path / "08_bad.ipynb"
    nbformat.write(with_metadata(cell_number="one"), bad)
    conflict = tmp_path / "09_conflict.ipynb"
    conflict.write_text(CONFLICT, encoding="utf-8")
    assert progress.main([str(bad), str(conflict)]) == 0
    out = capsys.readouterr().out
    assert "08_bad: cannot be graded: cell 1 has exercise number 'one', not a number" in out
    assert "09_conflict: cannot be read" in out
    assert out.splitlines()[-1].split() == ["total", "0", "0", "0", "0"]


# --- only the lab's own exercises count (issue 43, item 6) -----------------------------

def pasted_check(number, title, text="✅ all good\n"):
    """A check cell copied from another lab, run: its metadata and its ✅."""
    cell = new_code_cell("check(g)", metadata={"workbook": {
        "role": "check", "exercise": number, "title": title}})
    cell.execution_count = 1
    cell.outputs.append(new_output("stream", name="stdout", text=text))
    return cell


def test_a_check_cell_pasted_from_another_lab_is_named_not_counted():
    lab = executed(exercise_error=("NotImplementedError", "Write your solution here"))
    lab.cells.append(pasted_check(7, "Exercise 7: elastic training"))
    (exercise,) = progress.grade(lab)
    assert (exercise.number, exercise.status) == (1, "not started")
    (stray,) = progress.stray_cells(lab)
    assert "cell 3 belongs to exercise 7 'Exercise 7: elastic training'" in stray
    report = progress.LabReport("02_pasted", progress.grade(lab), strays=[stray])
    text = progress.format_report([report])
    assert "02_pasted: 0/1 passed" in text and "⚠️  cell 3 belongs to exercise 7" in text


def test_a_pasted_check_cell_cannot_stand_in_for_a_deleted_one():
    # Its own check cell deleted, another lab's check of the same number pasted instead.
    lab = executed("❌ wrong\n")
    del lab.cells[2]
    lab.cells.append(pasted_check(1, "Exercise 1: a scheduler"))
    (exercise,) = progress.grade(lab)
    assert exercise.status == "failed" and "missing" in exercise.detail
    assert len(progress.stray_cells(lab)) == 1
