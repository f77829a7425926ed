"""JupyterLab, started the way `make lab` starts it, and the browser that drives it.

:func:`start_lab` runs scripts/lab.sh (the Makefile's own command) with a free port,
--no-browser and a known token (JUPYTER_TOKEN, which jupyter reads). Its settings and
workspaces go to a temporary folder, so the tests neither read nor change a learner's
JupyterLab settings. So do the notebooks' checkpoints, and autosave is off, so nothing a
test does in a notebook is written into the repository.

The browser is the system's Chromium (Debian's `chromium` package), driven by Playwright.
Playwright never downloads a browser here. Without Chromium or Playwright the browser
tests are skipped, with a message saying how to enable them.
"""

import json
import os
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
START_TIMEOUT = 60      # seconds; the server is usually up in a few
STOP_TIMEOUT = 10

# The browser: SIMCLUSTER_CHROMIUM, else Debian's chromium.
CHROMIUM = (os.environ.get("SIMCLUSTER_CHROMIUM") or shutil.which("chromium")
            or "/usr/bin/chromium")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic",
                  "--no-first-run", "--disable-background-networking",
                  "--disable-component-update", "--disable-sync"]
ENABLE = ("install Chromium and Playwright (on Debian/Ubuntu: `sudo apt-get install -y "
          "chromium fonts-noto-color-emoji`, then `make setup`; .ci/run does both), or "
          "point SIMCLUSTER_CHROMIUM at a Chromium binary")

# JupyterLab settings for the test server: no autosave (the lab file must stay as it
# is). The "Would you like to get notified about Jupyter news?" prompt is off in lab.sh
# itself (scripts/lab-settings/overrides.json), as for a learner: test_start_page checks it.
LAB_SETTINGS = {
    "@jupyterlab/docmanager-extension/plugin.jupyterlab-settings": {"autosave": False},
}


@dataclass
class LabServer:
    """A running JupyterLab: its address, token and output so far."""

    url: str
    token: str
    log_path: Path

    def log(self):
        """The end of the server's output, for failure messages."""
        return self.log_path.read_text(errors="replace")[-3000:]


def get(url, token=None):
    """``(status, body)`` of a GET; never raises for an HTTP error status."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _jupyter():
    """The jupyter next to this Python (the .venv's), as `make lab` uses."""
    here = Path(sys.executable).parent / "jupyter"
    return str(here) if here.exists() else "jupyter"


def _stop(proc):
    """Stop the server and everything it started (kernels), whatever state it is in."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)     # kernels left behind, or a hung server
    except ProcessLookupError:
        pass
    proc.wait(STOP_TIMEOUT)




@contextmanager
def start_lab(folder):
    """JupyterLab started by scripts/lab.sh on a free port, as a :class:`LabServer`.

    ``folder`` (empty) receives its settings, workspaces, runtime files and log. The
    server and its kernels are stopped when the ``with`` block ends.
    """
    folder = Path(folder)
    for name, values in LAB_SETTINGS.items():
        path = folder / "settings" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(values))
    # Checkpoints ("Revert to checkpoint", made when a notebook is opened) go to the
    # folder too, not to .ipynb_checkpoints/ beside the repository's notebooks.
    checkpoints = folder / "checkpoints"
    for notebook in ROOT.glob("*/*.ipynb"):
        (checkpoints / notebook.parent.name).mkdir(parents=True, exist_ok=True)
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER=_jupyter(), JUPYTER_TOKEN=token,
               JUPYTER_RUNTIME_DIR=str(folder / "runtime"))
    log_path = folder / "lab.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(ROOT / "scripts" / "lab.sh"), f"--port={port}", "--no-browser",
             "--ServerApp.port_retries=0",
             f"--LabApp.user_settings_dir={folder / 'settings'}",
             f"--LabApp.workspaces_dir={folder / 'workspaces'}",
             f"--FileCheckpoints.root_dir={checkpoints}"],
            cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log,
            stderr=subprocess.STDOUT, start_new_session=True)
    server = LabServer(f"http://127.0.0.1:{port}", token, log_path)
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None, f"jupyter lab exited early:\n{server.log()}"
            try:
                if get(f"{server.url}/api")[0] == 200:   # /api (the version) needs no token
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (
                f"jupyter lab did not answer within {START_TIMEOUT} s:\n{server.log()}")
            time.sleep(0.2)
        yield server
    finally:
        _stop(proc)
