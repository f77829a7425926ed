"""A learner works in labs 02 to 13, as `make progress`, `make labs` and `make test`
see it.

1. One exercise filled in, in a freshly generated lab (never the learner's own labs/
   file): its check turns green, the others are "not started". The exercise is one that
   needs no other (lab 06's layers all build on exercise 1's operators, lab 07's ZeRO-2
   on its ZeRO-1).
2. The whole lab solved in place, in a git checkout with the unsolved lab committed:
   every exercise passes, `make labs` keeps the file, the staleness check is content, and
   nbval-lax (what `make test` runs on labs/) would pass.

Each lab is executed twice, as the learner's `make progress` runs it (once with the one
exercise, once solved). nbval-lax's verdict is read from the solved run rather than from
running the lab a third time under nbval: in a lab nbval-lax fails exactly when a code
cell without the ``raises-exception`` tag stores an error (the labs carry no other nbval
tag or marker, asserted below; tests/test_labs.py runs nbval-lax itself on a generated lab,
so the tag's meaning is checked there), which the executed notebook shows.
"""

import shutil
import subprocess
from pathlib import Path

import nbformat
import pytest

from workbook import labs, progress

ROOT = Path(__file__).resolve().parents[1]
# Each lab, with an exercise a learner can solve on its own.
ALONE = {"02_gradient_aggregation.ipynb": 2, "03_data_parallel.ipynb": 2,
         "04_model_parallel.ipynb": 2, "05_pipeline_parallel.ipynb": 2,
         "06_tensor_parallel.ipynb": 1, "07_zero_fsdp.ipynb": 4,
         "08_memory_and_precision.ipynb": 2, "09_3d_parallelism.ipynb": 4,
         "10_failure_handling.ipynb": 3, "11_scheduling.ipynb": 3, "12_serving.ipynb": 2,
         "13_interview_prep.ipynb": 3}
NAMES = list(ALONE)

pytestmark = pytest.mark.slow


def _answer(source):
    """The solution cell as a learner would have written it: without the marker lines."""
    markers = ("### BEGIN SOLUTION", "### END SOLUTION")
    return "\n".join(line for line in source.split("\n") if line.strip() not in markers)


def fill_in(lab, solution, exercises):
    """Give the exercise cells of ``exercises`` the solution's answers (markers removed)."""
    answers = {cell.id: cell.source for cell in solution.cells}
    for cell in lab.cells:
        meta = cell.metadata.get("workbook", {})
        if meta.get("role") == "exercise" and meta["exercise"] in exercises:
            cell.source = _answer(answers[cell.id])
    return lab


def fresh_lab(name):
    return nbformat.reads(labs.lab_text(ROOT / "solutions" / name), as_version=4)


@pytest.fixture(scope="module", params=NAMES)
def name(request):
    """Each lab in turn: the same learner's steps apply to all of them."""
    return request.param


@pytest.fixture(scope="module")
def report(tmp_path_factory, name):
    folder = tmp_path_factory.mktemp("learner")
    solution = nbformat.read(ROOT / "solutions" / name, as_version=4)
    nbformat.write(fill_in(fresh_lab(name), solution, {ALONE[name]}), folder / name)
    return progress.run_lab(folder / name, timeout=300)


def test_the_filled_in_exercise_passes(report, name):
    by_number = {e.number: e for e in report.exercises}
    assert by_number[ALONE[name]].status == "passed", by_number[ALONE[name]]


def test_the_other_exercises_are_not_started(report, name):
    others = [e.status for e in report.exercises if e.number != ALONE[name]]
    assert others and set(others) == {"not started"}


@pytest.fixture(scope="module")
def solved_in_place(tmp_path_factory, name):
    """A checkout with the generated lab committed, then solved in place."""
    if shutil.which("git") is None:
        pytest.skip("needs git")
    root = tmp_path_factory.mktemp("checkout")
    (root / "solutions").mkdir()
    shutil.copy(ROOT / "solutions" / name, root / "solutions" / name)
    labs.build(root / "solutions", root / "labs", log=lambda _: None)
    for args in (["init", "-q"], ["add", "."],
                 ["-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "labs"]):
        subprocess.run(["git", *args], cwd=root, check=True, capture_output=True)
    solution = nbformat.read(root / "solutions" / name, as_version=4)
    lab = nbformat.read(root / "labs" / name, as_version=4)
    numbers = {e["number"] for e in lab.metadata["workbook"]["exercises"]}
    nbformat.write(fill_in(lab, solution, numbers), root / "labs" / name)
    return root


def run_lab_keeping_the_notebook(path):
    """``progress.run_lab(path)`` and the notebook it executed (the last one it grades)."""
    graded = []

    def grade(nb):
        graded.append(nb)
        return original(nb)

    original = progress.grade
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(progress, "grade", grade)
        report = progress.run_lab(path, timeout=300)
    return report, graded[-1]


@pytest.fixture(scope="module")
def solved_run(solved_in_place, name):
    """The solved lab run once, as `make progress` runs it: ``(report, executed notebook)``."""
    return run_lab_keeping_the_notebook(solved_in_place / "labs" / name)


def test_a_lab_solved_in_place_shows_every_exercise_passed(solved_run):
    report, _ = solved_run
    assert report.exercises and all(e.status == "passed" for e in report.exercises), \
        progress.format_report([report])


def test_make_labs_keeps_it_and_the_staleness_check_is_content(solved_in_place, name):
    path = solved_in_place / "labs" / name
    before = path.read_bytes()
    messages, notes = [], []
    assert labs.build(solved_in_place / "solutions", solved_in_place / "labs",
                      log=messages.append) == []
    assert path.read_bytes() == before
    assert "holds your work (edited: exercise 1, exercise 2" in messages[0], messages
    assert labs.stale(solved_in_place / "solutions", solved_in_place / "labs",
                      log=notes.append) == []
    assert notes == []


def nbval_lax_failures(nb):
    """What ``pytest --nbval-lax`` would fail on in an executed notebook without nbval
    markers: the errors stored by code cells not tagged ``raises-exception``."""
    return [f"cell {index}: {output.ename}: {output.evalue}"
            for index, cell in enumerate(nb.cells)
            if cell.cell_type == "code" and labs.RAISES_TAG not in cell.metadata.get("tags", [])
            for output in cell.get("outputs", []) if output.output_type == "error"]


def test_nbval_lax_would_pass_on_the_solved_lab(solved_run):
    report, nb = solved_run
    assert report.error == "", report.error             # the kernel ran to the end
    code = [cell for cell in nb.cells if cell.cell_type == "code" and cell.source.strip()]
    assert code and all(cell.execution_count is not None for cell in code)
    # nbval-lax would check nothing else: no output comparison or skip asked for
    assert not [cell.source for cell in code if "NBVAL_" in cell.source]
    assert not [tag for cell in nb.cells for tag in cell.metadata.get("tags", [])
                if tag.startswith("nbval")]
    assert nbval_lax_failures(nb) == []


def test_nbval_lax_failures_are_the_errors_outside_tagged_cells():
    """The reading above against nbval-lax's rule: an error counts unless its cell is
    tagged ``raises-exception``."""
    nb = nbformat.v4.new_notebook(cells=[
        nbformat.v4.new_code_cell("1 / 0", outputs=[nbformat.v4.new_output(
            "error", ename="ZeroDivisionError", evalue="division by zero", traceback=[])]),
        nbformat.v4.new_code_cell("raise NotImplementedError", outputs=[
            nbformat.v4.new_output("error", ename="NotImplementedError", evalue="",
                                   traceback=[])],
            metadata={"tags": [labs.RAISES_TAG]}),
        nbformat.v4.new_code_cell("print(1)", outputs=[
            nbformat.v4.new_output("stream", name="stdout", text="1\n")])])
    assert nbval_lax_failures(nb) == ["cell 0: ZeroDivisionError: division by zero"]
