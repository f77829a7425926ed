"""`python -m workbook.doctor`: passes on this machine, and with one item broken on
purpose prints ❌ with the fix and exits non-zero."""

import os
import subprocess
import sys
from collections import namedtuple
from pathlib import Path

import pytest

from workbook import doctor

ROOT = Path(__file__).resolve().parents[1]


def _doctor(*args, env=None):
    """Run the doctor as a participant does; return (exit status, output)."""
    done = subprocess.run([sys.executable, "-m", "workbook.doctor", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=120, env=env)
    return done.returncode, done.stdout + done.stderr


@pytest.mark.slow
def test_every_check_passes_here():
    status, out = _doctor()
    assert status == 0, out
    for name in ("python", "install", "torch", "kernel", "run", "disk", "memory", "port"):
        assert f"✅ {name}" in out, out
    assert "❌" not in out and "ready for the workshop" in out


def test_a_broken_torch_is_a_blocker_with_its_fix(tmp_path):
    # A `torch` package that cannot be imported, first on the path: as after a failed wheel.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text(
        "raise ImportError('libtorch_cpu.so: cannot open shared object file')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    status, out = _doctor("--only", "python,torch,run", env=env)
    assert status == 1, out
    assert "✅ python" in out
    assert "❌ torch    `import torch` failed: ImportError: libtorch_cpu.so" in out
    assert "fix: PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu make setup" in out
    assert "❌ run" in out and "2 blocker(s): torch, run" in out


def test_low_disk_is_a_blocker(monkeypatch, capsys):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(doctor.shutil, "disk_usage",
                        lambda path: usage(100 * doctor.GIB, 99.7 * doctor.GIB, 0.3 * doctor.GIB))
    assert doctor.main(["--only", "disk,port"]) == 1
    out = capsys.readouterr().out
    assert "❌ disk     0.3 GiB free" in out
    assert "fix: free some disk (`make clean`" in out
    assert "1 blocker(s): disk" in out


def test_tight_disk_is_only_a_warning(monkeypatch, capsys):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(doctor.shutil, "disk_usage",
                        lambda path: usage(100 * doctor.GIB, 98 * doctor.GIB, 2 * doctor.GIB))
    assert doctor.main(["--only", "disk"]) == 0
    out = capsys.readouterr().out
    assert "⚠️  disk" in out and "ready for the workshop (1 warning(s): disk)" in out


def test_an_old_python_is_a_blocker(monkeypatch):
    project = doctor._project()
    monkeypatch.setattr(doctor, "_project", lambda: {**project, "requires-python": ">=99.1"})
    result = doctor.check_python()
    assert result.status == doctor.FAIL and "needs 99.1 or newer" in result.detail
    assert "make distclean && make setup PYTHON=python99.1" in result.fix


def test_a_torch_of_another_version_is_a_blocker(monkeypatch):
    project = doctor._project()
    deps = [d for d in project["dependencies"] if not d.startswith("torch")] + ["torch==1.0.*"]
    monkeypatch.setattr(doctor, "_project", lambda: {**project, "dependencies": deps})
    result = doctor.check_torch()
    assert result.status == doctor.FAIL and "tested with 1.0.*" in result.detail
    assert result.fix.startswith("pip install 'torch==1.0.*'")


def test_ports_8888_and_on(monkeypatch):
    monkeypatch.setattr(doctor, "_port_free", lambda port: port == doctor.PORT + 2)
    result = doctor.check_port()
    assert result.status == doctor.OK and "JupyterLab will use 8890" in result.detail
    monkeypatch.setattr(doctor, "_port_free", lambda port: False)
    result = doctor.check_port()
    assert result.status == doctor.FAIL and "jupyter server stop" in result.fix


def test_a_check_that_crashes_is_reported_not_raised(monkeypatch, capsys):
    def broken():
        raise RuntimeError("boom")

    monkeypatch.setitem(doctor.CHECKS, "memory", broken)
    assert doctor.main(["--only", "memory"]) == 1
    assert "❌ memory   the check itself failed: RuntimeError: boom" in capsys.readouterr().out


def test_versions_match_the_pin():
    assert doctor._version_matches("2.13.0+cpu", "2.13.*")
    assert doctor._version_matches("2.13.1", "2.13.*")
    assert not doctor._version_matches("2.130.0", "2.13.*")
    assert not doctor._version_matches("2.12.0", "2.13.*")
    assert doctor._requirement("torch==2.13.*") == ("torch", "2.13.*")
    assert doctor._requirement("numpy") == ("numpy", None)


def test_unknown_check_names_are_refused():
    status, out = _doctor("--only", "disk,gpu")
    assert status == 2 and "no such check: gpu" in out
