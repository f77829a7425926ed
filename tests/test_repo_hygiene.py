"""No file under version control is a secret or something a run leaves behind: a Jupyter
cookie secret signs login cookies, so one shared by every clone lets anyone forge them,
and a learner's file browser would show the rest."""

import fnmatch
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Glob patterns matched against every part of a tracked path (its folders and its name);
# one that starts with "/" only against the first (vendored code has its own dist/).
ARTEFACTS = {
    "*cookie_secret*": "a Jupyter cookie secret",
    "*.log": "a log",
    "runtime": "a Jupyter runtime folder",
    "kernel-*.json": "a kernel connection file (holds its HMAC key)",
    "jpserver-*": "a Jupyter server's runtime file",
    "nbserver-*": "a notebook server's runtime file",
    ".ipynb_checkpoints": "notebook checkpoints",
    "*.jupyterlab-workspace": "a JupyterLab workspace",
    "*.jupyterlab-settings": "JupyterLab user settings",
    "*.trace.json": "a trace a lesson wrote",
    "traces": "traces a lesson wrote",
    "/build": "build output",
    "/dist": "build output",
    "__pycache__": "compiled Python",
    "*.pyc": "compiled Python",
    ".pytest_cache": "pytest's cache",
    "*.egg-info": "install metadata",
    ".venv": "a virtual environment",
}


def _tracked():
    try:
        done = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True,
                              check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    return [path for path in done.stdout.decode().split("\0") if path]


def artefacts(paths):
    """``[(path, what it is)]`` for the paths that are secrets or run artefacts."""
    found = []
    for path in paths:
        parts = Path(path).parts
        for pattern, what in ARTEFACTS.items():
            names = parts[:1] if pattern.startswith("/") else parts
            if any(fnmatch.fnmatch(part, pattern.lstrip("/")) for part in names):
                found.append((path, what))
                break
    return found


def test_no_secret_or_run_artefact_is_tracked():
    assert artefacts(_tracked()) == []


@pytest.mark.parametrize("path", [
    "runtime/jupyter_cookie_secret", "lab.log", "settings/@jupyterlab/x/plugin.jupyterlab-settings",
    "notebooks/.ipynb_checkpoints/01-checkpoint.ipynb", "runtime/kernel-1234.json",
    "notebooks/traces/step.trace.json", "build/slides/index.html", "workspaces/default.jupyterlab-workspace",
])
def test_the_rule_sees_each_kind(path):
    assert artefacts([path]), path


def test_the_rule_leaves_sources_alone():
    assert artefacts(["simcluster/trace.py", "scripts/lab-settings/overrides.json",
                      "workshop/slides/vendor/reveal.js/dist/reveal.css",
                      "workbook/workspace.py", "docs/architecture.md"]) == []


def test_git_ignores_what_a_lab_server_writes_into_the_repository():
    paths = ["runtime/jupyter_cookie_secret", "lab.log", "settings/@jupyterlab/a.json",
             "notebooks/.ipynb_checkpoints/x.ipynb", "workspaces/default.jupyterlab-workspace"]
    done = subprocess.run(["git", "check-ignore", "--no-index", *paths], cwd=ROOT,
                          capture_output=True, text=True)
    assert sorted(done.stdout.split()) == sorted(paths)
