"""A lab's check cell run after a kernel restart, before the setup cell: one ❌ line that
says to run the setup cell, not a NameError's traceback (workbook/restart.py)."""

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from workbook import restart

ROOT = Path(__file__).resolve().parents[1]


def _run(cells, ipython_dir):
    """Execute code ``cells`` in a fresh kernel whose IPython configuration is what
    ``python -m workbook.restart`` installs; returns each cell's outputs."""
    profile = ipython_dir / "profile_default"
    profile.mkdir(parents=True)
    (profile / "ipython_kernel_config.py").write_text(restart.CONFIG, encoding="utf-8")
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    NotebookClient(nb, timeout=120, kernel_name="python3", allow_errors=True,
                   resources={"metadata": {"path": str(ROOT)}}).execute(
        env={**os.environ, "IPYTHONDIR": str(ipython_dir)})
    return [cell.outputs for cell in nb.cells]


def _check_cells(lab):
    nb = nbformat.read(ROOT / "labs" / lab, as_version=4)
    # a check cell is `checks.check_x(...)`, or `ok_x = checks.check_x(...)` (lab 11)
    return [c.source for c in nb.cells if c.cell_type == "code"
            and re.match(r"(\w+ = )?checks\.check_", c.source)]


def test_a_check_cell_before_the_setup_cell_says_to_run_the_setup_cell(tmp_path):
    first_check = _check_cells("11_scheduling.ipynb")[0]      # checks.check_best_fit(...)
    skipped, after_setup = _run([first_check, "import workbook.lesson11_scheduling\n"
                                 "not_defined_anywhere"], tmp_path)
    assert [(o["output_type"], o.get("text")) for o in skipped] == [("stream", (
        "❌ name 'checks' is not defined: run the setup cell first (Kernel › Restart & Run "
        "All, or run the cells from the top)\n"))]
    # once a setup cell has run, a NameError is the learner's own, with its traceback
    assert after_setup[0]["ename"] == "NameError" and len(after_setup[0]["traceback"]) > 1
    assert "not_defined_anywhere" in "".join(after_setup[0]["traceback"])


def test_a_name_error_inside_a_function_keeps_its_traceback(capsys):
    shown = []

    class Shell:
        user_ns = {}

        def showtraceback(self, exc_tuple, tb_offset=None):
            shown.append(exc_tuple[1])

    def workbook_code():
        return undefined_in_a_module  # noqa: F821

    try:
        workbook_code()
    except NameError as error:
        restart._on_name_error(Shell(), NameError, error, error.__traceback__)
        assert shown == [error] and capsys.readouterr().out == ""


def test_install_writes_the_kernel_configuration_once(tmp_path):
    from traitlets.config.loader import PyFileConfigLoader

    path = restart.install(tmp_path)
    assert path == tmp_path / "etc" / "ipython" / "ipython_kernel_config.py"
    mtime = path.stat().st_mtime_ns
    assert restart.install(tmp_path) == path and path.stat().st_mtime_ns == mtime
    config = PyFileConfigLoader(path.name, str(path.parent)).load_config()
    assert "workbook.restart" in config.InteractiveShellApp.extensions.get_value([])
