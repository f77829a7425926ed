"""Is this machine ready for the workshop? ``python -m workbook.doctor`` (or ``make doctor``).

Each participant runs it before the day. It checks, in under a minute:

- the Python version (``requires-python`` in pyproject.toml);
- the virtual environment and the installed workbook and its dependencies;
- ``import torch``: the pinned version, and which build (the CPU build is all it needs);
- that a Jupyter kernel starts and imports the workbook;
- a 4-rank run on the simulated cluster, in a fresh interpreter;
- free disk and memory;
- that the labs and notebooks can be saved, and a writable temp folder;
- the port JupyterLab will listen on (8888, or the next free one);
- (optional) a web browser.

It prints ✅ (fine), ⚠️ (works, but read the advice) or ❌ (a blocker) for each, with the
exact command that fixes it, and exits with status 1 when anything is a blocker.

    python -m workbook.doctor                    # everything
    python -m workbook.doctor --only disk,port   # some checks (names: --list)
"""

import argparse
import importlib
import importlib.metadata
import importlib.util
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OK, WARN, FAIL = "ok", "warn", "fail"
MARKS = {OK: "✅", WARN: "⚠️ ", FAIL: "❌"}

GIB = 2 ** 30
# One learner's kernel peaks at about 0.4 GiB running lesson 09 (workshop/server.md);
# JupyterLab, a lesson and its lab open at once want about 2 GiB.
MIN_DISK_GIB, WANT_DISK_GIB = 1.0, 3.0
MIN_MEMORY_GIB, WANT_MEMORY_GIB = 1.0, 2.0
PORT, PORT_RETRIES = 8888, 50          # JupyterLab's default port and how far it looks
# Guards against a hang, not goals: the first `import torch` of a fresh install on a
# slow disk took 70 s on a busy machine, and a false blocker costs more than waiting.
KERNEL_TIMEOUT_S = 120
RUN_TIMEOUT_S = 120
CPU_INDEX = "https://download.pytorch.org/whl/cpu"
SETUP_FIX = "make setup   (or, in your virtual environment: pip install -e .)"


@dataclass
class Result:
    """One line of the report: ``status`` is OK, WARN or FAIL; ``fix`` says what to do."""
    name: str
    status: str
    detail: str
    fix: str = ""


def _project():
    """pyproject.toml's ``[project]`` table."""
    import tomllib    # Python 3.11+: check_python reports an older one before this runs

    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["project"]


def _requirement(spec):
    """``(name, version pattern or None)`` of a requirement such as ``torch==2.13.*``."""
    match = re.match(r"\s*([A-Za-z0-9_.\-]+)\s*(?:==\s*([^\s;,]+))?", spec)
    return match.group(1), match.group(2)


def _version_matches(version, pattern):
    """Does ``version`` (``2.13.0+cpu``) match ``pattern`` (``2.13.*`` or ``2.13.0``)?"""
    version = version.split("+")[0]
    if pattern.endswith(".*"):
        return version == pattern[:-2] or version.startswith(pattern[:-1])
    return version == pattern


def check_python():
    """The interpreter is at least ``requires-python``."""
    try:
        need = _project()["requires-python"].lstrip(">= ")
    except ImportError:    # no tomllib: older than 3.11, the oldest we support anyway
        need = "3.11"
    need_tuple = tuple(int(part) for part in need.split("."))
    have = ".".join(map(str, sys.version_info[:3]))
    if sys.version_info[:len(need_tuple)] >= need_tuple:
        return Result("python", OK, f"Python {have} ({sys.executable})")
    return Result("python", FAIL, f"Python {have} is too old: the workbook needs {need} or "
                  "newer", f"install Python {need}+ (python.org, or `brew install "
                  f"python@{need}` / `sudo apt-get install python{need}`), then "
                  f"`make distclean && make setup PYTHON=python{need}`")


def check_install():
    """A virtual environment, the workbook installed from this folder, every dependency."""
    missing = []
    for spec in _project()["dependencies"]:
        name, _ = _requirement(spec)
        try:
            importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            missing.append(name)
    if missing:
        return Result("install", FAIL, f"not installed: {', '.join(missing)}", SETUP_FIX)
    for module in ("simcluster", "workbook"):
        spec = importlib.util.find_spec(module)
        origin = Path(spec.origin).resolve() if spec and spec.origin else None
        if origin is None or ROOT not in origin.parents:
            return Result("install", FAIL, f"`import {module}` finds {origin}, not this "
                          f"folder ({ROOT})", f"run from {ROOT}, then {SETUP_FIX}")
    in_venv = sys.prefix != sys.base_prefix or "CONDA_PREFIX" in os.environ
    if not in_venv:
        return Result("install", WARN, "installed, but not in a virtual environment "
                      f"({sys.prefix})", "use the project's own: `make setup`, then "
                      "`.venv/bin/python -m workbook.doctor`")
    return Result("install", OK, f"workbook and its {len(_project()['dependencies'])} "
                  f"dependencies installed in {sys.prefix}")


def _torch_shadow():
    """The ``torch.py`` or ``torch/`` that ``import torch`` finds instead of the installed
    torch (in the current folder or on PYTHONPATH), or None. Nothing is imported."""
    try:
        installed = Path(importlib.metadata.distribution("torch").locate_file("torch"))
    except importlib.metadata.PackageNotFoundError:
        return None
    spec = importlib.util.find_spec("torch")
    if spec is None:
        return None
    locations = list(spec.submodule_search_locations or [])
    found = Path(locations[0] if locations else spec.origin)
    return None if found.resolve() == installed.resolve() else found


def _shadow_result(name, shadow):
    """The report of ``shadow`` (see :func:`_torch_shadow`) for check ``name``."""
    return Result(name, FAIL, f"`import torch` finds {shadow}, not the installed torch: a "
                  "file or folder named torch hides it",
                  f"rename or move {shadow} (or take its folder off PYTHONPATH)")


def check_torch():
    """``import torch`` works, has the pinned version, and say which build it is."""
    pins = [_requirement(spec) for spec in _project()["dependencies"]]
    pin = dict(pins).get("torch")
    shadow = _torch_shadow()
    if shadow:
        return _shadow_result("torch", shadow)
    start = time.perf_counter()
    try:
        torch = importlib.import_module("torch")
    except Exception as error:    # ImportError, or a broken wheel's OSError
        return Result("torch", FAIL, f"`import torch` failed: {type(error).__name__}: "
                      f"{error}".splitlines()[0],
                      f"PIP_EXTRA_INDEX_URL={CPU_INDEX} make setup   (or: pip install "
                      f"'torch=={pin}' --extra-index-url {CPU_INDEX})")
    seconds = time.perf_counter() - start
    version = torch.__version__
    if pin and not _version_matches(version, pin):
        return Result("torch", FAIL, f"torch {version}, but the workbook is tested with "
                      f"{pin} (stored outputs may differ)",
                      f"pip install 'torch=={pin}' --extra-index-url {CPU_INDEX}")
    cuda = getattr(torch.version, "cuda", None)
    if cuda:
        return Result("torch", WARN, f"torch {version}, a CUDA {cuda} build: it works, but "
                      "weighs gigabytes and the simulator needs no GPU",
                      f"to save disk: pip uninstall -y torch && pip install 'torch=={pin}' "
                      f"--index-url {CPU_INDEX}")
    return Result("torch", OK, f"torch {version}, CPU build, imported in {seconds:.1f} s")


# Run in the kernel and in the 4-rank check: what every lesson's first cell does.
_KERNEL_CODE = "import sys, simcluster, workbook; print(sys.executable)"
_RUN_CODE = """
import torch, torch.distributed as dist, simcluster as sc
def train():
    t = torch.tensor([float(dist.get_rank())])
    dist.all_reduce(t)
    return t.item()
run = sc.Cluster.preset("dgx-a100", nodes=1).run(train, world_size=4, timeout=30)
assert run.results == [6.0] * 4, run.results
print("ok", dist.is_available())
"""


def check_kernel():
    """A Jupyter kernel (the ``python3`` kernel the lessons use) starts and imports us."""
    fix = f"{sys.executable} -m ipykernel install --user --name python3 " \
          "--display-name 'Python 3 (ipykernel)'"
    try:
        from jupyter_client.manager import start_new_kernel
    except ImportError as error:
        return Result("kernel", FAIL, f"jupyter_client is missing: {error}", SETUP_FIX)
    start = time.perf_counter()
    manager = client = None
    try:
        manager, client = start_new_kernel(kernel_name="python3",
                                           startup_timeout=KERNEL_TIMEOUT_S,
                                           extra_arguments=["--IPKernelApp.log_level=ERROR"])
        streams = {"stdout": [], "stderr": []}
        reply = client.execute_interactive(
            _KERNEL_CODE, timeout=KERNEL_TIMEOUT_S, output_hook=lambda msg: streams.get(
                msg["content"].get("name"), []).append(msg["content"].get("text", "")))
    except Exception as error:
        return _environment_result("kernel") or Result(
            "kernel", FAIL, f"the python3 kernel did not start: "
            f"{type(error).__name__}: {error}".splitlines()[0], fix)
    finally:
        if client is not None:
            client.stop_channels()
        if manager is not None:
            manager.shutdown_kernel(now=True)
    seconds = time.perf_counter() - start
    if reply["content"]["status"] != "ok":
        content = reply["content"]
        return _environment_result("kernel") or Result(
            "kernel", FAIL, f"the kernel started but `import simcluster` failed: "
            f"{content.get('ename')}: {content.get('evalue')}",
            f"{fix}   (the kernel must run this environment's Python)")
    # The interpreter's path is the last line it printed; warnings go to stderr.
    executable = ("".join(streams["stdout"]).strip().splitlines() or [""])[-1]
    if executable and Path(executable).resolve() != Path(sys.executable).resolve():
        return Result("kernel", WARN, f"the python3 kernel runs {executable}, not "
                      f"{sys.executable}", fix)
    warnings = [line.strip() for line in "".join(streams["stderr"]).splitlines()
                if line.strip()]
    if warnings:
        return Result("kernel", WARN, f"a python3 kernel started, but its Python printed "
                      f"warnings: {warnings[0]}" + (f" (and {len(warnings) - 1} more line(s))"
                                                    if len(warnings) > 1 else ""),
                      _warning_fix(warnings[0]))
    return Result("kernel", OK, f"a python3 kernel started and imported the workbook "
                  f"in {seconds:.1f} s")


def _warning_fix(warning):
    """What to do about a warning the kernel's Python printed."""
    variable = re.search(r"environment variable (\w+)", warning)
    if variable:
        name = variable.group(1)
        return (f"give {name} a valid value, or remove it (`unset {name}`, and from your "
                "shell's startup file); then run the doctor again")
    return "read the warning: it names its cause (an environment variable, a package)"


def _environment_result(name):
    """A blocker of this machine that makes a Python started by check ``name`` fail (a
    shadowed torch, no temp folder), or None: then the failure is the check's own."""
    shadow = _torch_shadow()
    if shadow:
        return _shadow_result(name, shadow)
    problem = _temp_problem()
    if problem and problem[0] == FAIL:
        return Result(name, FAIL, f"could not run: {problem[1]}", problem[2])
    return None


def check_run():
    """Four simulated ranks all-reduce, in a fresh interpreter (so a hang cannot stop us)."""
    start = time.perf_counter()
    try:
        done = subprocess.run([sys.executable, "-c", _RUN_CODE], capture_output=True,
                              text=True, timeout=RUN_TIMEOUT_S, cwd=ROOT)
    except subprocess.TimeoutExpired:
        return Result("run", FAIL, f"a 4-rank run did not finish in {RUN_TIMEOUT_S} s "
                      "(it takes a few seconds on a laptop)",
                      "close other programs and run the doctor again; if it repeats, "
                      "report it with the output of `python -m workbook.doctor`")
    seconds = time.perf_counter() - start
    if done.returncode != 0 or "ok" not in done.stdout:
        last = (done.stderr.strip().splitlines() or ["no output"])[-1]
        return _environment_result("run") or Result(
            "run", FAIL, f"a 4-rank all_reduce failed: {last}",
            f"{SETUP_FIX}; then `python -c 'import simcluster'` shows the error")
    return Result("run", OK, f"4 simulated ranks all-reduced correctly ({seconds:.1f} s, "
                  "torch import included)")


def check_disk():
    """Free disk where the workbook lives (checkpoints, traces, a second venv)."""
    free = shutil.disk_usage(ROOT).free / GIB
    fix = "free some disk (`make clean`; empty the trash; `pip cache purge`)"
    if free < MIN_DISK_GIB:
        return Result("disk", FAIL, f"{free:.1f} GiB free in {ROOT}, need "
                      f"{MIN_DISK_GIB:.0f} GiB", fix)
    if free < WANT_DISK_GIB:
        return Result("disk", WARN, f"{free:.1f} GiB free: enough, but tight", fix)
    return Result("disk", OK, f"{free:.0f} GiB free")


def _unwritable(folder):
    """Why no file can be created in ``folder`` (by creating and removing one: permission
    bits do not stop root, a read-only file system does), or None when one can."""
    try:
        fd, name = tempfile.mkstemp(dir=folder, prefix=".doctor-")
    except OSError as error:
        return error.strerror or str(error)
    os.close(fd)
    os.unlink(name)
    return None


# The folders a learner saves into: their labs, and the lessons they run and annotate.
SAVED = ("labs", "notebooks")


def check_files():
    """The labs and notebooks can be saved (a read-only copy loses the learner's work)."""
    problems = []
    for folder in SAVED:
        path = ROOT / folder
        why = "missing" if not path.is_dir() else _unwritable(path)
        if why:
            problems.append(f"{folder}/ ({why})")
    if problems:
        return Result("files", FAIL, f"cannot save into {', '.join(problems)}: your work in "
                      "the labs would be lost",
                      f"work in a copy you own (`cp -r {ROOT} ~/simcluster-workbook`), or "
                      f"make it writable (`chmod -R u+w {ROOT}`); a missing folder: "
                      "`git checkout -- labs notebooks`")
    return Result("files", OK, f"{' and '.join(f'{f}/' for f in SAVED)} can be saved")


def _temp_problem():
    """``(status, what is wrong, fix)`` of the temp folder, or None when it is fine.

    Python falls back from an unusable TMPDIR to /tmp and others (a warning: other
    programs do not); with none usable, kernels and the simulator cannot start."""
    fix = "`mkdir -p ~/tmp && export TMPDIR=~/tmp` (or unset TMPDIR), then run the doctor again"
    try:
        fallback = tempfile.gettempdir()
    except OSError as error:     # FileNotFoundError: "No usable temporary directory found"
        return FAIL, f"no writable temp folder ({error})", fix
    for variable in ("TMPDIR", "TEMP", "TMP"):
        folder = os.environ.get(variable)
        if folder:
            why = "missing" if not Path(folder).is_dir() else _unwritable(folder)
            if why:
                return WARN, f"{variable}={folder} is not a writable folder ({why}); Python " \
                             f"uses {fallback} instead, other programs may fail", fix
            break           # the first one set is the one programs use
    return None


def check_temp():
    """A writable temp folder (kernels, pip and the simulator create files there)."""
    problem = _temp_problem()
    if problem:
        return Result("temp", *problem)
    return Result("temp", OK, f"temp folder {tempfile.gettempdir()} is writable")


def check_memory():
    """Available memory: one kernel peaks at ~0.4 GiB, JupyterLab and a browser add more."""
    import psutil

    available = psutil.virtual_memory().available / GIB
    fix = "close other programs (browsers with many tabs, IDEs, containers), then rerun"
    if available < MIN_MEMORY_GIB:
        return Result("memory", FAIL, f"{available:.1f} GiB available, need "
                      f"{MIN_MEMORY_GIB:.0f} GiB", fix)
    if available < WANT_MEMORY_GIB:
        return Result("memory", WARN, f"{available:.1f} GiB available: tight", fix)
    return Result("memory", OK, f"{available:.1f} GiB available")


def _port_free(port):
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def check_port():
    """JupyterLab listens on 8888, or on the next free port of the 50 after it."""
    for port in range(PORT, PORT + PORT_RETRIES + 1):
        if _port_free(port):
            if port == PORT:
                return Result("port", OK, f"port {PORT} is free")
            return Result("port", OK, f"port {PORT} is taken; JupyterLab will use {port} "
                          "(open the link it prints)")
    return Result("port", FAIL, f"ports {PORT}-{PORT + PORT_RETRIES} are all taken",
                  "stop other Jupyter servers (`jupyter server list`, then "
                  "`jupyter server stop PORT`), or `make lab LAB_ARGS=--port=9999`")


# Browsers looked for by name: on Linux, Python's webbrowser module only lists the ones
# it can open in a window, so without a display it finds none even where one is installed.
BROWSERS = ("chromium", "chromium-browser", "google-chrome", "google-chrome-stable",
            "firefox", "microsoft-edge")
TUNNEL_FIX = ("on a server: `ssh -L 8888:127.0.0.1:8888 server`, then open the link "
              "JupyterLab prints in your laptop's browser")


def _has_display():
    """Can a browser window open here? macOS and Windows always; elsewhere an X11 or
    Wayland display must be set."""
    return sys.platform in ("darwin", "win32") or any(
        os.environ.get(name) for name in ("DISPLAY", "WAYLAND_DISPLAY"))


def check_browser():
    """(Optional) a browser to open JupyterLab in; without one, copy the link by hand."""
    import webbrowser

    installed = next(filter(None, map(shutil.which, BROWSERS)), None)
    if not _has_display():
        if installed:
            return Result("browser", WARN, f"{installed} is installed, but there is no "
                          "display (DISPLAY and WAYLAND_DISPLAY are unset), so JupyterLab "
                          "cannot open a window; headless use (the browser tests) works",
                          TUNNEL_FIX)
        return Result("browser", WARN, "no display and no browser found (optional: open "
                      "the printed link elsewhere)", TUNNEL_FIX)
    try:
        browser = webbrowser.get()
        name = getattr(browser, "name", None) or type(browser).__name__
        return Result("browser", OK, f"a browser is available ({name})")
    except webbrowser.Error:
        if installed:
            return Result("browser", OK, f"a browser is installed ({installed})")
        return Result("browser", WARN, "a display, but no browser found (optional: open "
                      "the printed link in any browser)", "install Chrome, Chromium or "
                      f"Firefox; or {TUNNEL_FIX}")


BACKGROUND = ("kernel", "run")     # checks main() starts first, in threads
CHECKS = {"python": check_python, "install": check_install, "torch": check_torch,
          "kernel": check_kernel, "run": check_run, "disk": check_disk,
          "files": check_files, "temp": check_temp, "memory": check_memory,
          "port": check_port, "browser": check_browser}


def run_checks(names=None):
    """Run the checks called ``names`` (default: all, in order) and return their results.
    A check that raises is reported as a blocker with its error, never as a crash."""
    results = []
    for name in names or CHECKS:
        try:
            results.append(CHECKS[name]())
        except Exception as error:
            results.append(Result(name, FAIL, f"the check itself failed: "
                                  f"{type(error).__name__}: {error}", SETUP_FIX))
    return results


def format_result(result):
    """One or two lines: the mark, the check and what it found; then the fix."""
    line = f"{MARKS[result.status]} {result.name:<8} {result.detail}"
    if result.status != OK and result.fix:
        line += f"\n   fix: {result.fix}"
    return line


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m workbook.doctor",
                                     description="Check this machine for the workshop.")
    parser.add_argument("--only", default="",
                        help="comma-separated checks to run (default: all)")
    parser.add_argument("--list", action="store_true", help="list the checks and exit")
    args = parser.parse_args(argv)
    if args.list:
        for name, function in CHECKS.items():
            print(f"{name:<8} {function.__doc__.splitlines()[0]}")
        return 0
    names = [name.strip() for name in args.only.split(",") if name.strip()]
    unknown = [name for name in names if name not in CHECKS]
    if unknown:
        parser.error(f"no such check: {', '.join(unknown)} (choose from {', '.join(CHECKS)})")
    if hasattr(sys.stdout, "reconfigure"):   # ✅ on a console that is not UTF-8
        sys.stdout.reconfigure(errors="replace")
    print(f"workbook doctor: checking {ROOT}", flush=True)
    names = names or list(CHECKS)
    results = []
    # The kernel and the 4-rank run mostly wait for other processes to import torch:
    # start them at once, beside the other checks, and print every result in order.
    with ThreadPoolExecutor(max_workers=2) as pool:
        early = {name: pool.submit(run_checks, [name])
                 for name in BACKGROUND if name in names}
        for name in names:
            result, = early[name].result() if name in early else run_checks([name])
            results.append(result)
            print(format_result(result), flush=True)
    blockers = [result.name for result in results if result.status == FAIL]
    warnings = [result.name for result in results if result.status == WARN]
    if blockers:
        print(f"\n❌ {len(blockers)} blocker(s): {', '.join(blockers)}. Apply the fixes "
              "above, then run `make doctor` again.")
        return 1
    print(f"\n✅ ready for the workshop" + (f" ({len(warnings)} warning(s): "
                                           f"{', '.join(warnings)})" if warnings else ""))
    return 0


if __name__ == "__main__":
    sys.exit(main())
