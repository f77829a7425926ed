"""A learner fills in one exercise of the real lab 02 and sees its check turn green.

The lab is copied, the two cells of exercise 2 (naive and ring all-reduce) get the
answers from solutions/, and the whole lab is run the way `make progress` runs it.
"""

import shutil
from pathlib import Path

import nbformat
import pytest

from workbook import progress

ROOT = Path(__file__).resolve().parents[1]
NAME = "02_gradient_aggregation.ipynb"

pytestmark = pytest.mark.slow


def _cells(nb, exercise, role):
    return [i for i, c in enumerate(nb.cells)
            if c.metadata.get("workbook", {}).get("exercise") == exercise
            and c.metadata["workbook"]["role"] == role]


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    folder = tmp_path_factory.mktemp("learner")
    lab = nbformat.read(ROOT / "labs" / NAME, as_version=4)
    solution = nbformat.read(ROOT / "solutions" / NAME, as_version=4)
    answer_cells = [c for c in solution.cells if "### BEGIN SOLUTION" in c.source]
    for index in _cells(lab, 2, "exercise"):
        # the learner's answer: the solution cell whose definition this cell holds
        first_line = lab.cells[index].source.splitlines()[0]
        answer = next(c for c in answer_cells if c.source.startswith(first_line))
        lab.cells[index].source = answer.source.replace("### BEGIN SOLUTION\n", "") \
                                               .replace("### END SOLUTION\n", "")
    nbformat.write(lab, folder / NAME)
    shutil.copytree(ROOT / "workbook", folder / "workbook")  # as the labs/ folder sees it
    return progress.run_lab(folder / NAME, timeout=300)


def test_the_filled_in_exercise_passes(report):
    by_number = {e.number: e for e in report.exercises}
    assert by_number[2].status == "passed", by_number[2]


def test_the_other_exercises_are_not_started(report):
    others = [e.status for e in report.exercises if e.number != 2]
    assert others and set(others) == {"not started"}
