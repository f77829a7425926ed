"""`python -m workbook.doctor`: passes on this machine, and with one item broken on
purpose prints ❌ with the fix and exits non-zero."""

import errno
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
    for name in ("python", "install", "torch", "kernel", "run", "disk", "files", "temp",
                 "memory", "port"):
        assert f"✅ {name}" in out, out
    assert "❌" not in out and "ready for the workshop" in out


def test_a_broken_torch_is_a_blocker_with_its_fix(monkeypatch):
    def broken_wheel(name, *args, **kwargs):
        raise ImportError("libtorch_cpu.so: cannot open shared object file")

    monkeypatch.setattr(doctor, "_torch_shadow", lambda: None)
    monkeypatch.setattr(doctor.importlib, "import_module", broken_wheel)
    result = doctor.check_torch()
    assert result.status == doctor.FAIL
    assert result.detail == "`import torch` failed: ImportError: libtorch_cpu.so: cannot " \
                            "open shared object file"
    assert result.fix.startswith("PIP_EXTRA_INDEX_URL=https://download.pytorch.org/whl/cpu "
                                 "make setup")


def test_a_torch_package_on_pythonpath_is_named(tmp_path):
    # A `torch` folder first on the path: the doctor names it instead of importing it.
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('not the real one')\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), str(ROOT)])}
    status, out = _doctor("--only", "python,torch,run", env=env)
    assert status == 1, out
    assert "✅ python" in out
    assert f"❌ torch    `import torch` finds {tmp_path / 'torch'}, not the installed torch" \
        in out
    assert f"fix: rename or move {tmp_path / 'torch'}" in out
    assert "❌ run" in out and "2 blocker(s): torch, run" in out
    assert "the check itself failed" not in out and "make setup" not in out


def test_a_torch_py_in_the_current_folder_is_named(tmp_path):
    (tmp_path / "torch.py").write_text("print('my notes on torch')\n")
    done = subprocess.run([sys.executable, "-m", "workbook.doctor", "--only", "torch"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    out = done.stdout + done.stderr
    assert done.returncode == 1, out
    assert f"`import torch` finds {tmp_path / 'torch.py'}, not the installed torch" in out
    assert "my notes on torch" not in out and "AttributeError" not in out


@pytest.mark.slow
def test_kernel_warnings_are_their_own_finding_not_its_path():
    # libgomp complains on stderr; the interpreter's path is on stdout. (ipykernel does
    # not forward the kernel's file-descriptor output while PYTEST_CURRENT_TEST is set.)
    env = {name: value for name, value in os.environ.items() if name != "PYTEST_CURRENT_TEST"}
    status, out = _doctor("--only", "kernel", env={**env, "OMP_NUM_THREADS": "abc"})
    assert status == 0, out
    assert "⚠️  kernel   a python3 kernel started, but its Python printed warnings: " \
           "libgomp: Invalid value for environment variable OMP_NUM_THREADS" in out
    assert "`unset OMP_NUM_THREADS`" in out
    assert "kernel runs" not in out and "ipykernel install" not in out


def _linux_without_browsers(monkeypatch, display=None, installed=()):
    """This process as on a Linux machine with ``display`` and the browsers ``installed``."""
    monkeypatch.setattr(doctor.sys, "platform", "linux")
    monkeypatch.delenv("WAYLAND_DISPLAY", raising=False)
    if display:
        monkeypatch.setenv("DISPLAY", display)
    else:
        monkeypatch.delenv("DISPLAY", raising=False)
    monkeypatch.setattr(doctor.shutil, "which",
                        lambda name: f"/usr/bin/{name}" if name in installed else None)
    import webbrowser

    def no_browser(*args):
        raise webbrowser.Error("could not locate runnable browser")

    monkeypatch.setattr(webbrowser, "get", no_browser)


def test_chromium_without_a_display_is_told_apart(monkeypatch):
    _linux_without_browsers(monkeypatch, installed=("chromium",))
    result = doctor.check_browser()
    assert result.status == doctor.WARN
    assert result.detail.startswith("/usr/bin/chromium is installed, but there is no display")
    assert "ssh -L 8888" in result.fix and "install" not in result.fix


def test_no_display_and_no_browser(monkeypatch):
    _linux_without_browsers(monkeypatch)
    result = doctor.check_browser()
    assert result.status == doctor.WARN
    assert result.detail.startswith("no display and no browser found")


def test_a_display_without_a_browser(monkeypatch):
    _linux_without_browsers(monkeypatch, display=":0")
    result = doctor.check_browser()
    assert result.status == doctor.WARN and result.detail.startswith("a display, but no browser")
    assert result.fix.startswith("install Chrome")
    _linux_without_browsers(monkeypatch, display=":0", installed=("firefox",))
    assert doctor.check_browser().status == doctor.OK


def _workbook(tmp_path, monkeypatch):
    """A workbook folder with labs/ and notebooks/, as the doctor's ROOT."""
    for folder in doctor.SAVED:
        (tmp_path / folder).mkdir()
    monkeypatch.setattr(doctor, "ROOT", tmp_path)
    return tmp_path


def test_a_read_only_workbook_is_a_blocker(tmp_path, monkeypatch, capsys):
    root = _workbook(tmp_path, monkeypatch)
    assert doctor.check_files().status == doctor.OK
    real_open = os.open

    def read_only_labs(path, *args, **kwargs):
        # labs/ on a read-only file system (root ignores permission bits, not this)
        if str(path).startswith(str(root / "labs")) and args and args[0] & os.O_CREAT:
            raise OSError(errno.EROFS, os.strerror(errno.EROFS), path)
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(os, "open", read_only_labs)
    assert doctor.main(["--only", "disk,files"]) == 1
    out = capsys.readouterr().out
    assert "❌ files    cannot save into labs/ (Read-only file system)" in out
    assert "notebooks/" not in out.split("fix:")[0]
    assert f"cp -r {root} ~/simcluster-workbook" in out
    assert "ready for the workshop" not in out and "1 blocker(s): files" in out


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() == 0,
                    reason="root writes into read-only folders")
def test_folders_without_write_permission_are_a_blocker(tmp_path, monkeypatch):
    root = _workbook(tmp_path, monkeypatch)
    (root / "notebooks").chmod(0o555)
    try:
        result = doctor.check_files()
    finally:
        (root / "notebooks").chmod(0o755)
    assert result.status == doctor.FAIL and "notebooks/ (Permission denied)" in result.detail


def test_a_missing_labs_folder_is_a_blocker(tmp_path, monkeypatch):
    root = _workbook(tmp_path, monkeypatch)
    (root / "labs").rmdir()
    result = doctor.check_files()
    assert result.status == doctor.FAIL and "labs/ (missing)" in result.detail


def test_a_missing_tmpdir_is_named(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path / "gone")}
    status, out = _doctor("--only", "temp", env=env)
    assert status == 0, out
    assert f"⚠️  temp     TMPDIR={tmp_path / 'gone'} is not a writable folder (missing)" in out
    assert "export TMPDIR" in out


def test_no_writable_temp_folder_is_named_not_a_kernel_reinstall(monkeypatch):
    def no_temp():
        raise FileNotFoundError("No usable temporary directory found in ['/ro', '/tmp']")

    def kernel_that_cannot_start(**kwargs):
        raise RuntimeError("Kernel died before replying to kernel_info")

    monkeypatch.setattr(doctor.tempfile, "gettempdir", no_temp)
    result = doctor.check_temp()
    assert result.status == doctor.FAIL
    assert result.detail.startswith("no writable temp folder (No usable temporary directory")
    import jupyter_client.manager
    monkeypatch.setattr(jupyter_client.manager, "start_new_kernel", kernel_that_cannot_start)
    result = doctor.check_kernel()
    assert result.status == doctor.FAIL and "no writable temp folder" in result.detail
    assert "export TMPDIR" in result.fix and "ipykernel" not in result.fix


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
