"""`make test` itself (issue 29): every step runs even when an earlier one fails, the tests
and the notebooks are spread over JOBS pytest-xdist workers, the notebook checks get
NBVAL_ENV, and the time of each step is printed at the end.

Run on a copy of the Makefile whose .venv/bin/python is a stub that only records how it
was called (nothing is installed, no test runs)."""

import os
import shutil
import re
import stat
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Records its arguments and ATEN_CPU_CAPABILITY; "fails" on the solutions.
STUB = """#!/bin/sh
echo "$ATEN_CPU_CAPABILITY $*" >> "$(dirname "$0")/../calls.log"
case "$*" in *solutions*) exit 1;; esac
"""


@pytest.fixture
def project(tmp_path):
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    for folder in ("notebooks", "solutions", "labs"):
        (tmp_path / folder).mkdir()
        (tmp_path / folder / "00_x.ipynb").write_text("{}")
    python = tmp_path / ".venv" / "bin" / "python"
    python.parent.mkdir(parents=True)
    python.write_text(STUB)
    python.chmod(python.stat().st_mode | stat.S_IEXEC)
    stamp = tmp_path / ".venv" / ".installed"
    stamp.touch()
    later = (tmp_path / "pyproject.toml").stat().st_mtime + 10
    os.utime(stamp, (later, later))             # installed: make runs no pip
    return tmp_path


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_runs_every_step_in_parallel_and_prints_their_times(project):
    done = subprocess.run(["make", "--no-print-directory", "test", "JOBS=3"], cwd=project,
                          capture_output=True, text=True, timeout=60)
    assert done.returncode != 0, "a failed step must fail make test"
    calls = (project / ".venv" / "calls.log").read_text().splitlines()
    # Each step ran once, the ones after the failing solutions too; the unit tests on the
    # machine's own CPU kernels, the notebooks on NBVAL_ENV's.
    assert calls == [
        " -m pytest -n 3 --dist loadfile tests",
        "default -m pytest --nbval --nbval-current-env -n 3 --dist loadfile notebooks",
        "default -m pytest --nbval --nbval-current-env -n 3 --dist loadfile solutions",
        "default -m pytest --nbval-lax --nbval-current-env -n 3 --dist loadfile labs",
    ]
    summary = done.stdout.split("make test: the time of each step (3 workers; load average")[1]
    rows = [line.split() for line in summary.splitlines()[1:]]
    assert [(" ".join(row[:-3]), row[-2], row[-1]) for row in rows] == [
        ("setup (venv and install)", "s", "done"),
        ("unit tests (tests/)", "s", "passed"),
        ("nbval notebooks/ (--nbval)", "s", "passed"),
        ("nbval solutions/ (--nbval)", "s", "FAILED"),
        ("nbval labs/ (--nbval-lax)", "s", "passed"),
        ("total", "s", "FAILED")]
    assert all(row[-3].isdigit() for row in rows), summary


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_make_test_uses_one_worker_per_core_by_default(project):
    done = subprocess.run(["make", "-n", "test"], cwd=project, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert not (project / ".venv" / "calls.log").exists(), "make -n must run nothing"
    cores = min(8, len(os.sched_getaffinity(0))) if hasattr(os, "sched_getaffinity") \
        else min(8, os.cpu_count())
    assert f"-m pytest -n {cores} --dist loadfile tests" in done.stdout


def test_the_browser_tests_run_in_one_worker_and_slow_modules_start_first(tmp_path):
    """tests/conftest.py under xdist: the browser modules share one worker, one after the
    other; they and the modules with a slow test are handed out before the others."""
    tests = tmp_path / "tests"
    (tests / "browser").mkdir(parents=True)
    shutil.copy(ROOT / "tests" / "conftest.py", tests / "conftest.py")
    for name in ("a", "b", "c"):
        (tests / "browser" / f"test_{name}.py").write_text(
            "def test_one(): pass\ndef test_two(): pass\n")
    for name in ("plain1", "plain2", "plain3"):     # more tests than the slow module
        (tests / f"test_{name}.py").write_text("def test_1(): pass\ndef test_2(): pass\n"
                                               "def test_3(): pass\n")
    (tests / "test_zz_slow.py").write_text(
        "import pytest\ndef test_fast(): pass\n@pytest.mark.slow\ndef test_slow(): pass\n")
    (tmp_path / "pyproject.toml").write_text("[tool.pytest.ini_options]\nmarkers = ['slow: x']\n")
    # Only xdist among the installed plugins: the others cost seconds in each interpreter.
    env = dict(os.environ, PYTEST_DISABLE_PLUGIN_AUTOLOAD="1")
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "xdist.plugin", "-n", "2",
                           "--dist", "loadfile", "-v", "-p", "no:cacheprovider", "tests"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    ran = re.findall(r"\[(gw\d)\] \[ *\d+%\] PASSED (\S+)", done.stdout)
    assert len(ran) == 6 + 9 + 2, done.stdout
    browser_workers = {worker for worker, test in ran if test.startswith("tests/browser/")}
    assert len(browser_workers) == 1, ran
    worker, = browser_workers
    mine = [test for w, test in ran if w == worker]
    browser = [test for test in mine if test.startswith("tests/browser/")]
    assert mine[:6] == browser == sorted(browser)      # first, whole, in file order
    other = [test for w, test in ran if w != worker]
    assert other and other[0].startswith("tests/test_zz_slow.py"), ran
