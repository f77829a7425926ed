"""`make lab` really starts a JupyterLab that answers on 127.0.0.1 and asks for a token.

The test runs scripts/lab.sh, the command `make lab` runs, with a free port and
--no-browser, and a known token passed the way jupyter reads it (JUPYTER_TOKEN).
"""

import json
import os
import secrets
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
START_TIMEOUT = 60      # seconds; the server is usually up in a few
STOP_TIMEOUT = 10


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _get(url, token=None):
    """(status, body) of a GET; never raises for an HTTP error status."""
    request = urllib.request.Request(url)
    if token:
        request.add_header("Authorization", f"token {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as err:
        return err.code, err.read()


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


def test_lab_starts_on_localhost_and_requires_the_token(tmp_path):
    port, token = _free_port(), secrets.token_hex(16)
    env = dict(os.environ, JUPYTER=_jupyter(), JUPYTER_TOKEN=token,
               JUPYTER_RUNTIME_DIR=str(tmp_path / "runtime"))
    log = open(tmp_path / "lab.log", "w+")
    proc = subprocess.Popen(
        [str(ROOT / "scripts" / "lab.sh"), f"--port={port}", "--no-browser",
         "--ServerApp.port_retries=0"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
        start_new_session=True)

    def server_log():
        log.flush()
        log.seek(0)
        return log.read()[-3000:]

    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            assert proc.poll() is None, f"jupyter lab exited early:\n{server_log()}"
            try:
                if _get(f"{base}/api")[0] == 200:       # /api (the version) needs no token
                    break
            except OSError:
                pass
            assert time.monotonic() < deadline, (
                f"jupyter lab did not answer within {START_TIMEOUT} s:\n{server_log()}")
            time.sleep(0.2)

        status, _ = _get(f"{base}/api/contents")
        assert status == 403, f"an unauthenticated request got {status}, not 403"

        status, body = _get(f"{base}/api/contents", token)
        assert status == 200, f"with the token, /api/contents got {status}"
        names = {item["name"] for item in json.loads(body)["content"]}
        assert "simcluster" in names, f"the server does not serve the repository: {names}"

        status, body = _get(f"{base}/api/contents/notebooks", token)
        if (ROOT / "notebooks").is_dir():
            assert status == 200, f"with the token, /api/contents/notebooks got {status}"
            assert json.loads(body)["type"] == "directory"
        else:                                   # a checkout before the first lesson
            assert status == 404, status
    finally:
        _stop(proc)
        log.close()
