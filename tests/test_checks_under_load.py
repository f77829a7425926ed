"""Checks judge the code, not the machine's load (issue 43, item 1).

A workshop runs thirty learners' kernels on one server: correct code waits for a core far
longer than it computes. With busy processes beside them, each in its own session (Linux's
autogroup gives every session one share of the CPU, as each learner's kernel gets), every
lab's check cells pass the solution notebooks' own answers, and an endless loop is still
stopped once it has used its CPU budget, long before the wall-clock ceiling.
"""

import os
import subprocess
import sys
import time
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from workbook import checking, labs
from workbook.checking import Case, Failure

ROOT = Path(__file__).resolve().parents[1]
SOLUTIONS = sorted((ROOT / "solutions").glob("*.ipynb"))
BUSY_PROCESSES = 2           # both cores of a two-core machine
LOAD_LIMIT_S = 1800          # a busy process ends by itself after this, whatever happens
BUSY = ("import time\n"
        "end = time.monotonic() + {limit}\n"
        "while time.monotonic() < end:\n"
        "    pass\n")


@pytest.fixture(scope="module")
def busy_machine():
    """``BUSY_PROCESSES`` processes that compute without pause, each in its own session,
    until the module's tests end (at most ``LOAD_LIMIT_S`` seconds)."""
    busy = [subprocess.Popen([sys.executable, "-c", BUSY.format(limit=LOAD_LIMIT_S)],
                             start_new_session=True) for _ in range(BUSY_PROCESSES)]
    try:
        yield busy
    finally:
        for process in busy:
            process.terminate()
        for process in busy:
            process.wait(30)


def _graded_cells(path):
    """The setup cell, then the exercise and check cells of solution ``path`` (the lab's
    own roles, from workbook.labs): the solution's answers and what judges them; and the
    indices of the check cells among them."""
    solution = nbformat.read(path, as_version=4)
    made = labs.make_lab(solution)
    cells, checks = [], []
    code = [(c, m) for c, m in zip(solution.cells, made.cells) if c.cell_type == "code"]
    for index, (cell, lab_cell) in enumerate(code):
        role = lab_cell.metadata.get("workbook", {}).get("role")
        if index == 0 or role:
            cells.append(nbformat.v4.new_code_cell(cell.source))
            if role == "check":
                checks.append(len(cells) - 1)
    return cells, checks


def _verdicts(cell):
    """The ✅ / ❌ / ⬜ lines a check cell printed, and the names of the errors it raised."""
    text = "".join(o.get("text", "") for o in cell.outputs if o.output_type == "stream")
    lines = [line for line in text.splitlines() if line[:1] in "✅❌⬜"]
    return lines, [o.ename for o in cell.outputs if o.output_type == "error"]


@pytest.mark.slow
@pytest.mark.parametrize("solution", SOLUTIONS, ids=lambda p: p.stem)
def test_correct_answers_pass_every_check_on_a_busy_machine(busy_machine, solution):
    assert all(process.poll() is None for process in busy_machine), "the load has ended"
    cells, checks = _graded_cells(solution)
    assert checks, solution
    nb = nbformat.v4.new_notebook(cells=cells)
    NotebookClient(nb, timeout=900, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(solution.parent)}}).execute()
    for index in checks:
        lines, errors = _verdicts(nb.cells[index])
        assert lines and not errors, (cells[index].source, lines, errors)
        assert all(line.startswith("✅") for line in lines), lines


@pytest.mark.slow
def test_an_endless_loop_is_stopped_by_its_cpu_budget_on_a_busy_machine(busy_machine,
                                                                        monkeypatch):
    monkeypatch.setattr(checking, "TIMEOUT", 1.0)

    def forever():
        x = 0
        while True:
            x += 1

    for run in (lambda: checking.on_a_rank(forever, (), "f()"),
                lambda: checking.simulate(Case(2, 1).cluster(), forever, 2,
                                          lambda rank: "case")):
        wall, cpu = time.monotonic(), time.process_time()
        with pytest.raises(Failure) as info:
            run()
        # stopped for the CPU it used (this process had to wait for it: the machine is
        # busy), long before the wall-clock ceiling
        assert "after 1 s of work" in info.value.what and "1 s of CPU time" in info.value.what
        assert time.process_time() - cpu >= 1.0
        assert time.monotonic() - wall < checking.WALL_CEILING * 1.0


def test_the_load_is_bounded_and_each_busy_process_has_its_own_session():
    process = subprocess.Popen([sys.executable, "-c", BUSY.format(limit=2)],
                               start_new_session=True)
    try:
        assert os.getsid(process.pid) == process.pid != os.getsid(0)
    finally:
        assert process.wait(30) == 0     # it ended by itself
