"""The lab builder: solutions/ → labs/ (workbook/labs.py)."""

import shutil
import subprocess
import sys
from pathlib import Path

import nbformat
import pytest
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook, new_output

from workbook import labs

REPO = Path(__file__).resolve().parents[1]

FUNCTION_CELL = '''\
def double(x):
    y = x
    ### BEGIN SOLUTION
    # HINT: multiply by two
    y = 2 * x
    ### END SOLUTION
    return y'''

TOP_LEVEL_CELL = '''\
answer = None
### BEGIN SOLUTION
answer = 42
### END SOLUTION
print(answer)'''

TWO_BLOCKS_CELL = '''\
class Ring:
    def send(self):
        ### BEGIN SOLUTION
        # HINT: return "sent",
        # HINT:   not 'received'
        return "sent"
        ### END SOLUTION

    def recv(self):
        ### BEGIN SOLUTION
        return "received"
        ### END SOLUTION'''

WRITTEN_ANSWER = '''\
**Why does a ring all-reduce send 2(p-1)/p of the data?**

<!-- BEGIN SOLUTION -->
Reduce-scatter, then all-gather: each moves (p-1)/p of it.
<!-- END SOLUTION -->

Then move on.'''


def solution_notebook():
    """A solution with each exercise shape, outputs and volatile metadata."""
    def ran(source, text, count, **metadata):
        cell = new_code_cell(source, execution_count=count, metadata=metadata)
        cell.outputs = [new_output("stream", name="stdout", text=text)]
        return cell

    nb = new_notebook(cells=[
        new_markdown_cell("# Lab 99: shapes"),
        ran("import math\nprint(math.pi)", "3.141592653589793\n", 1,
            execution={"iopub.status.busy": "2025-01-01T00:00:00"}, collapsed=False,
            tags=["setup"]),
        new_markdown_cell("## Exercise 1: double\nWrite it."),
        ran(FUNCTION_CELL, "", 2),
        ran("print('✅ double' if double(2) == 4 else '❌ double')", "✅ double\n", 3),
        new_markdown_cell("## Exercise 2: the answer"),
        ran(TOP_LEVEL_CELL, "42\n", 4),
        ran("print('✅ answer' if answer == 42 else '❌ answer')", "✅ answer\n", 5),
        new_markdown_cell("## Exercise 3: a ring"),
        new_code_cell("import itertools"),   # the setup of an exercise: not its check
        ran(TWO_BLOCKS_CELL, "", 6),
        ran("r = Ring()\nprint('✅ ring' if (r.send(), r.recv()) == ('sent', 'received')"
            " else '❌ ring')", "✅ ring\n", 7),
        new_markdown_cell(WRITTEN_ANSWER),
        ran("print('done')", "done\n", 8),
    ])
    nb.metadata.update(
        kernelspec={"name": "python3", "display_name": "Python 3", "language": "python"},
        language_info={"name": "python", "version": "3.11.7"},
        widgets={"application/vnd.jupyter.widget-state+json": {"state": {}}})
    return nb


def write(nb, path):
    path.parent.mkdir(parents=True, exist_ok=True)
    nbformat.write(nb, path)
    return path


@pytest.fixture
def tree(tmp_path):
    """A tmp repo with solutions/99_shapes.ipynb; returns (solutions, labs) dirs."""
    write(solution_notebook(), tmp_path / "solutions" / "99_shapes.ipynb")
    return tmp_path / "solutions", tmp_path / "labs"


# --- replacing solution blocks ---------------------------------------------------------

def test_block_inside_a_function_keeps_the_code_around_it_and_uses_the_hint():
    source, blocks = labs.strip_code(FUNCTION_CELL)
    assert blocks == 1
    assert source == ('def double(x):\n    y = x\n'
                      '    raise NotImplementedError("multiply by two")\n    return y')


def test_block_at_top_level_gets_the_default_message():
    source, blocks = labs.strip_code(TOP_LEVEL_CELL)
    assert blocks == 1
    assert source == ('answer = None\nraise NotImplementedError("Write your solution here")\n'
                      'print(answer)')


def test_several_blocks_in_one_cell_keep_their_own_indentation_and_hints():
    source, blocks = labs.strip_code(TWO_BLOCKS_CELL)
    assert blocks == 2
    assert source == (
        'class Ring:\n    def send(self):\n'
        '        raise NotImplementedError("return \\"sent\\", not \'received\'")\n\n'
        '    def recv(self):\n'
        '        raise NotImplementedError("Write your solution here")')
    namespace = {}
    exec(source, namespace)
    with pytest.raises(NotImplementedError, match="return \"sent\", not 'received'"):
        namespace["Ring"]().send()


def test_markdown_answer_is_replaced_and_the_text_around_it_kept():
    source, blocks = labs.strip_markdown(WRITTEN_ANSWER)
    assert blocks == 1
    assert source == ("**Why does a ring all-reduce send 2(p-1)/p of the data?**\n\n"
                      "*Your answer here.*\n\nThen move on.")


def test_cells_without_markers_are_unchanged():
    assert labs.strip_code("x = 1\n# ### not a marker") == ("x = 1\n# ### not a marker", 0)


@pytest.mark.parametrize("source, message", [
    ("### BEGIN SOLUTION\nx = 1", "never closed"),
    ("x = 1\n### END SOLUTION", "without"),
    ("### BEGIN SOLUTION\n### BEGIN SOLUTION\n### END SOLUTION", "inside another"),
    ("### BEGIN SOLUTION:\nx = 1\n### END SOLUTION", "looks like a solution marker"),
    ("# BEGIN SOLUTION\nx = 1\n# END SOLUTION", "looks like a solution marker"),
])
def test_broken_markers_are_refused_rather_than_leaking_the_answer(source, message):
    with pytest.raises(labs.LabError, match=message):
        labs.strip_code(source, "99_x.ipynb, cell 3")


# --- the lab notebook ------------------------------------------------------------------

def test_the_lab_has_the_right_sources_no_outputs_and_tags():
    solution = solution_notebook()
    original = nbformat.writes(solution)
    lab = labs.make_lab(solution, "99_shapes.ipynb")
    assert nbformat.writes(solution) == original, "the solution must not be modified"
    sources = [cell.source for cell in lab.cells]
    assert sources[3] == labs.strip_code(FUNCTION_CELL)[0]
    assert sources[6] == labs.strip_code(TOP_LEVEL_CELL)[0]
    assert sources[10] == labs.strip_code(TWO_BLOCKS_CELL)[0]
    assert sources[12] == labs.strip_markdown(WRITTEN_ANSWER)[0]
    for index in (0, 1, 2, 4, 5, 7, 8, 9, 11, 13):
        assert sources[index] == solution.cells[index].source
    assert "BEGIN SOLUTION" not in nbformat.writes(lab)
    assert [cell.id for cell in lab.cells] == [cell.id for cell in solution.cells]

    for cell in lab.cells:
        if cell.cell_type == "code":
            assert cell.outputs == [] and cell.execution_count is None

    roles = {index: cell.metadata.get("workbook") for index, cell in enumerate(lab.cells)
             if "workbook" in cell.metadata}
    assert roles == {
        3: {"role": "exercise", "exercise": 1, "title": "Exercise 1: double"},
        4: {"role": "check", "exercise": 1, "title": "Exercise 1: double"},
        6: {"role": "exercise", "exercise": 2, "title": "Exercise 2: the answer"},
        7: {"role": "check", "exercise": 2, "title": "Exercise 2: the answer"},
        10: {"role": "exercise", "exercise": 3, "title": "Exercise 3: a ring"},
        11: {"role": "check", "exercise": 3, "title": "Exercise 3: a ring"},
    }
    for index, cell in enumerate(lab.cells):
        tags = cell.metadata.get("tags", [])
        assert ("raises-exception" in tags) == (index in roles), index
        assert "nbval-check-output" not in tags
    assert lab.cells[1].metadata == {"tags": ["setup"]}   # timings etc. are gone

    assert lab.metadata["workbook"]["exercises"] == [
        {"number": 1, "title": "Exercise 1: double"},
        {"number": 2, "title": "Exercise 2: the answer"},
        {"number": 3, "title": "Exercise 3: a ring"}]
    assert lab.metadata["workbook"]["generated_from"] == "solutions/99_shapes.ipynb"
    assert set(lab.metadata) == {"kernelspec", "language_info", "workbook"}
    assert lab.metadata["language_info"] == {"name": "python"}


def test_consecutive_exercise_cells_form_one_exercise():
    nb = new_notebook(cells=[
        new_code_cell("def a():\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION"),
        new_code_cell("def b():\n    ### BEGIN SOLUTION\n    pass\n    ### END SOLUTION"),
        new_code_cell("check(a, b)"),
    ])
    lab = labs.make_lab(nb)
    assert [cell.metadata["workbook"]["role"] for cell in lab.cells] == [
        "exercise", "exercise", "check"]
    assert {cell.metadata["workbook"]["exercise"] for cell in lab.cells} == {1}


def test_an_exercise_without_a_check_cell_is_refused():
    nb = new_notebook(cells=[
        new_code_cell("x = 1\n### BEGIN SOLUTION\nx = 2\n### END SOLUTION"),
        new_markdown_cell("The end."),
    ])
    with pytest.raises(labs.LabError, match="exercise 1 has no check cell"):
        labs.make_lab(nb, "99_x.ipynb")


def test_a_marker_at_the_wrong_indentation_is_refused():
    nb = new_notebook(cells=[
        new_code_cell("def f():\n### BEGIN SOLUTION\n    return 1\n### END SOLUTION"),
        new_code_cell("check(f)"),
    ])
    with pytest.raises(labs.LabError, match="not valid Python"):
        labs.make_lab(nb, "99_x.ipynb")


def test_magics_and_top_level_await_are_valid_lab_code():
    nb = new_notebook(cells=[
        new_code_cell("%matplotlib inline\n!echo hi\n### BEGIN SOLUTION\nawait f()\n"
                      "### END SOLUTION\nx = await g()"),
        new_code_cell("check(x)"),
    ])
    assert labs.make_lab(nb).cells[0].source == (
        '%matplotlib inline\n!echo hi\nraise NotImplementedError("Write your solution here")'
        '\nx = await g()')


# --- files: determinism, idempotence, staleness ----------------------------------------

def test_generation_is_deterministic_and_idempotent(tree):
    solutions, lab_dir = tree
    assert labs.build(solutions, lab_dir, log=lambda _: None) == [lab_dir / "99_shapes.ipynb"]
    first = (lab_dir / "99_shapes.ipynb").read_bytes()
    assert labs.build(solutions, lab_dir, log=lambda _: None) == []   # nothing to rewrite
    (lab_dir / "99_shapes.ipynb").unlink()
    labs.build(solutions, lab_dir, log=lambda _: None)
    assert (lab_dir / "99_shapes.ipynb").read_bytes() == first
    nbformat.validate(nbformat.read(lab_dir / "99_shapes.ipynb", as_version=4))


def test_notebooks_without_cell_ids_still_give_the_same_bytes(tmp_path):
    nb = solution_notebook()
    nb.nbformat_minor = 4
    for cell in nb.cells:
        del cell["id"]
    path = tmp_path / "99_old.ipynb"
    path.write_text(nbformat.writes(nb, version=nbformat.NO_CONVERT), encoding="utf-8")
    assert labs.lab_text(path) == labs.lab_text(path)
    assert '"id": "cell-0-' in labs.lab_text(path)


def test_check_detects_missing_stale_and_orphaned_labs(tree, capsys):
    solutions, lab_dir = tree
    args = ["--solutions", str(solutions), "--labs", str(lab_dir)]
    assert labs.main(["--check", *args]) == 1
    assert "99_shapes.ipynb: missing" in capsys.readouterr().out

    assert labs.main(args) == 0
    assert labs.main(["--check", *args]) == 0
    assert "up to date" in capsys.readouterr().out

    solution = nbformat.read(solutions / "99_shapes.ipynb", as_version=4)
    solution.cells[6].source = solution.cells[6].source.replace("answer = 42", "answer = 6 * 7")
    nbformat.write(solution, solutions / "99_shapes.ipynb")
    assert labs.main(["--check", *args]) == 0, "a change inside a solution block is invisible"
    solution.cells[2].source += "\nA new sentence."
    nbformat.write(solution, solutions / "99_shapes.ipynb")
    assert labs.main(["--check", *args]) == 1
    out = capsys.readouterr().out
    assert f"{lab_dir / '99_shapes.ipynb'}: out of date" in out and "make labs" in out

    assert labs.main(args) == 0
    write(new_notebook(), lab_dir / "98_gone.ipynb")
    assert labs.main(["--check", *args]) == 1
    assert "98_gone.ipynb: has no solution" in capsys.readouterr().out


@pytest.mark.slow
def test_check_runs_as_a_module(tree):
    solutions, lab_dir = tree
    result = subprocess.run(
        [sys.executable, "-m", "workbook.labs", "--check", "--solutions", str(solutions),
         "--labs", str(lab_dir)], capture_output=True, text=True, cwd=REPO)
    assert result.returncode == 1 and "99_shapes.ipynb: missing" in result.stdout


def test_a_lab_with_outputs_is_a_learners_work_and_is_kept(tree):
    solutions, lab_dir = tree
    labs.build(solutions, lab_dir, log=lambda _: None)
    lab = nbformat.read(lab_dir / "99_shapes.ipynb", as_version=4)
    lab.cells[3].source = "def double(x):\n    return x + x"
    lab.cells[3].execution_count = 1
    nbformat.write(lab, lab_dir / "99_shapes.ipynb")
    messages = []
    assert labs.build(solutions, lab_dir, log=messages.append) == []
    assert messages == [
        f"kept {lab_dir / '99_shapes.ipynb'}: it holds your work (edited: exercise 1; 1 cell "
        f"with outputs). For a fresh lab, move yours aside (mv {lab_dir / '99_shapes.ipynb'} "
        f"{lab_dir / '99_shapes.mine.ipynb'}) and run `make labs` again, or replace it with "
        "`make labs FORCE=1`."]
    assert labs.build(solutions, lab_dir, force=True, log=messages.append) != []


def solve_in_place(lab_path, cell=3, source="def double(x):\n    return x + x"):
    """A learner's edit of an exercise cell, saved without running it."""
    lab = nbformat.read(lab_path, as_version=4)
    lab.cells[cell].source = source
    nbformat.write(lab, lab_path)


def test_an_edited_exercise_is_kept_even_without_outputs(tree, capsys):
    solutions, lab_dir = tree
    labs.build(solutions, lab_dir, log=lambda _: None)
    solve_in_place(lab_dir / "99_shapes.ipynb")
    before = (lab_dir / "99_shapes.ipynb").read_bytes()
    messages = []
    assert labs.build(solutions, lab_dir, log=messages.append) == []
    assert "holds your work (edited: exercise 1)" in messages[0]
    assert (lab_dir / "99_shapes.ipynb").read_bytes() == before
    # not in git: the learner's file is not judged, and --check says so
    args = ["--check", "--solutions", str(solutions), "--labs", str(lab_dir)]
    assert labs.main(args) == 0
    assert "not compared with" in capsys.readouterr().out


def test_without_git_a_changed_instruction_is_staleness_not_work(tree):
    solutions, lab_dir = tree
    labs.build(solutions, lab_dir, log=lambda _: None)
    solution = nbformat.read(solutions / "99_shapes.ipynb", as_version=4)
    solution.cells[2].source += "\nA new sentence."
    nbformat.write(solution, solutions / "99_shapes.ipynb")
    assert [reason for _, reason in labs.stale(solutions, lab_dir, log=print)] == [
        f"out of date with {solutions / '99_shapes.ipynb'}"]
    assert labs.build(solutions, lab_dir, log=lambda _: None) == [lab_dir / "99_shapes.ipynb"]


def git(repo, *args):
    subprocess.run(["git", *args], cwd=repo, check=True, capture_output=True)


@pytest.fixture
def repo(tree):
    """``tree`` as a git repository with its lab committed."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    solutions, lab_dir = tree
    labs.build(solutions, lab_dir, log=lambda _: None)
    root = solutions.parent
    git(root, "init", "-q")
    git(root, "add", ".")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "lab")
    return solutions, lab_dir


def test_a_lab_solved_in_place_is_judged_by_its_committed_version(repo):
    solutions, lab_dir = repo
    solve_in_place(lab_dir / "99_shapes.ipynb")
    notes = []
    assert labs.stale(solutions, lab_dir, log=notes.append) == [] and notes == []
    messages = []
    assert labs.build(solutions, lab_dir, log=messages.append) == []
    assert "holds your work (edited: exercise 1)" in messages[0]
    # a contributor then changes the solution: the committed lab is out of date
    solution = nbformat.read(solutions / "99_shapes.ipynb", as_version=4)
    solution.cells[2].source += "\nA new sentence."
    nbformat.write(solution, solutions / "99_shapes.ipynb")
    [(path, reason)] = labs.stale(solutions, lab_dir, log=notes.append)
    assert reason.startswith("its committed version is out of date")


def test_a_contributor_changing_a_stub_gets_the_committed_lab_rewritten(repo):
    solutions, lab_dir = repo
    solution = nbformat.read(solutions / "99_shapes.ipynb", as_version=4)
    solution.cells[3].source = solution.cells[3].source.replace("multiply by two", "double it")
    nbformat.write(solution, solutions / "99_shapes.ipynb")
    assert len(labs.stale(solutions, lab_dir, log=print)) == 1
    assert labs.build(solutions, lab_dir, log=lambda _: None) == [lab_dir / "99_shapes.ipynb"]
    assert "double it" in (lab_dir / "99_shapes.ipynb").read_text(encoding="utf-8")


def test_a_broken_solution_is_reported_by_the_command(tree, capsys):
    solutions, lab_dir = tree
    write(new_notebook(cells=[new_code_cell("### BEGIN SOLUTION\nx = 1")]),
          solutions / "97_broken.ipynb")
    assert labs.main(["--solutions", str(solutions), "--labs", str(lab_dir)]) == 2
    assert "97_broken.ipynb, cell 0" in capsys.readouterr().err


@pytest.mark.slow
def test_the_generated_lab_passes_nbval_lax_with_the_exercises_unsolved(tree):
    solutions, lab_dir = tree
    labs.build(solutions, lab_dir, log=lambda _: None)
    # A copy without the tags shows that the exercises really are unsolved: there, the
    # cells that raise NotImplementedError fail (4 and 11 call unsolved functions, 6 is
    # top-level code) and nothing else does.
    lab = nbformat.read(lab_dir / "99_shapes.ipynb", as_version=4)
    for cell in lab.cells:
        cell.metadata.pop("tags", None)
    nbformat.write(lab, lab_dir / "99_untagged.ipynb")
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "--nbval-lax", "--nbval-current-env", "-p",
         "no:cacheprovider", "-rf", str(lab_dir)], capture_output=True, text=True, cwd=lab_dir)
    summary = result.stdout.strip().splitlines()
    failed = [" ".join(line.split()[1:3]) for line in summary if line.startswith("FAILED")]
    # nbval counts code cells only: notebook cells 4, 6 and 11
    assert failed == [f"99_untagged.ipynb::Cell {n}" for n in (2, 3, 7)], result.stdout
    assert "3 failed, 15 passed" in summary[-1], result.stdout


# --- the repository --------------------------------------------------------------------

def test_every_solution_in_the_repo_has_an_up_to_date_lab():
    """A lab a learner works in is judged by its committed version (see workbook.labs)."""
    if not list((REPO / "solutions").glob("*.ipynb")):
        pytest.skip("no solutions/*.ipynb yet")
    notes = []
    problems = labs.stale(REPO / "solutions", REPO / "labs", log=notes.append)
    assert not problems, "run `make labs` (python -m workbook.labs):\n" + "\n".join(
        f"{path.relative_to(REPO)}: {reason}" for path, reason in problems)
    if notes:
        pytest.skip("\n".join(notes))


# --- a learner's committed work (issue 24, item 11) -------------------------------------


def test_a_lab_the_learner_committed_is_never_overwritten(repo):
    """A learner who solves a lab, clears its outputs and commits it: the file equals HEAD,
    but HEAD holds the learner's work, not the builder's output."""
    solutions, lab_dir = repo
    path = lab_dir / "99_shapes.ipynb"
    solve_in_place(path)
    root = solutions.parent
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qam", "my solution")
    mine = path.read_bytes()
    messages = []
    assert labs.build(solutions, lab_dir, log=messages.append) == []
    assert path.read_bytes() == mine
    # ... also once the solution changed upstream (`make labs` after a pull)
    solution = nbformat.read(solutions / "99_shapes.ipynb", as_version=4)
    solution.cells[2].source += "\nA new sentence."
    nbformat.write(solution, solutions / "99_shapes.ipynb")
    assert labs.build(solutions, lab_dir, log=messages.append) == []
    assert path.read_bytes() == mine
    assert all("holds your work (edited: exercise 1)" in m for m in messages), messages


def test_the_builders_own_output_is_recognised_by_its_fingerprint(tree):
    solutions, lab_dir = tree
    labs.build(solutions, lab_dir, log=lambda _: None)
    path = lab_dir / "99_shapes.ipynb"
    nb = nbformat.read(path, as_version=4)
    recorded = nb.metadata["workbook"]["cells"]
    assert recorded == labs.fingerprint(nb) and len(recorded) == len(nb.cells)
    solve_in_place(path)
    changed = labs.fingerprint(nbformat.read(path, as_version=4))
    assert [i for i in recorded if recorded[i] != changed[i]] == [nb.cells[3].id]


# --- a broken lab file is named, and the others are built (issue 24, item 12) ------------

# git's markers, built here so that no file of the repository holds one
CONFLICTED = """{
<<< HEAD
 "cells": [],
===
 "cells": [{"cell_type": "markdown", "source": "mine", "metadata": {}}],
>>> theirs
 "metadata": {}, "nbformat": 4, "nbformat_minor": 5
}
""".replace("<<<", "<" * 7).replace(">>>", ">" * 7).replace(
    "\n===\n", "\n" + "=" * 7 + "\n")


def test_a_lab_with_a_merge_conflict_is_named_and_the_others_still_built(tree, capsys):
    solutions, lab_dir = tree
    write(solution_notebook(), solutions / "98_other.ipynb")
    lab_dir.mkdir(parents=True)
    broken = lab_dir / "99_shapes.ipynb"
    broken.write_text(CONFLICTED, encoding="utf-8")
    args = ["--solutions", str(solutions), "--labs", str(lab_dir)]
    assert labs.main(args) == 2
    captured = capsys.readouterr()
    assert (lab_dir / "98_other.ipynb").exists()
    assert broken.read_text(encoding="utf-8") == CONFLICTED      # never written over
    assert f"{broken}: cannot be read: a merge conflict" in captured.err
    assert labs.main(["--check", *args]) == 1
    out = capsys.readouterr().out
    assert f"{broken}: cannot be read: a merge conflict" in out
    assert "98_other" not in out


def test_a_broken_solution_does_not_stop_the_other_labs(tree, capsys):
    solutions, lab_dir = tree
    write(new_notebook(cells=[new_code_cell("### BEGIN SOLUTION\nx = 1")]),
          solutions / "97_broken.ipynb")
    assert labs.main(["--solutions", str(solutions), "--labs", str(lab_dir)]) == 2
    assert "97_broken.ipynb, cell 0" in capsys.readouterr().err
    assert (lab_dir / "99_shapes.ipynb").exists()


def test_a_cell_a_merge_brought_up_to_date_is_not_the_learners(tree):
    """git merges two branches' labs: a cell then equals the lab generated now, but not
    the digest recorded by either build. It is the builder's, and `make labs` rewrites."""
    solutions, lab_dir = tree
    labs.build(solutions, lab_dir, log=lambda _: None)
    solution = nbformat.read(solutions / "99_shapes.ipynb", as_version=4)
    solution.cells[2].source += "\nA new sentence."
    nbformat.write(solution, solutions / "99_shapes.ipynb")
    path = lab_dir / "99_shapes.ipynb"
    merged = nbformat.read(path, as_version=4)
    merged.cells[2].source = solution.cells[2].source        # what the merge brought
    nbformat.write(merged, path)
    assert labs.learner_changes(path, labs.lab_text(solutions / "99_shapes.ipynb")) == []
    assert labs.build(solutions, lab_dir, log=lambda _: None) == [path]
