"""One server for everyone (workshop/server.md): the Docker image installs exactly what
the Makefile installs, and repo2docker/Binder find environment.yml and postBuild.

Docker itself is not run here (no daemon in CI); these tests keep the recipe's steps
the same commands as the Makefile's and the README's."""

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from workbook import doctor

ROOT = Path(__file__).resolve().parents[1]
DOCKERFILE = ROOT / "workshop" / "Dockerfile"


def _instructions(path):
    """The Dockerfile's instructions, continuation lines joined, comments dropped."""
    text = re.sub(r"\\\n", " ", path.read_text())
    return [line.strip() for line in text.splitlines()
            if line.strip() and not line.lstrip().startswith("#")]


def _cpu_index_in_readme():
    match = re.search(r"PIP_EXTRA_INDEX_URL=(\S+) make lab", (ROOT / "README.md").read_text())
    return match.group(1)


@pytest.mark.skipif(shutil.which("make") is None, reason="needs make")
def test_the_image_runs_the_makefiles_own_setup(tmp_path):
    runs = [line for line in _instructions(DOCKERFILE) if line.startswith("RUN ")]
    setup = [line for line in runs if "make setup" in line]
    assert setup == ["RUN make setup PYTHON=python3"]
    # What `make setup` runs on a fresh checkout (dry run: nothing is installed)
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, tmp_path / name)
    # --no-print-directory: under `make test` this make is a sub-make, which would print
    # "Entering directory" first
    done = subprocess.run(["make", "--no-print-directory", "-n", "setup", "PYTHON=python3"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[:2] == ["python3 -m venv .venv",
                                            ".venv/bin/python -m pip install -e ."]


def test_the_image_uses_the_cpu_wheels_and_the_tested_python():
    instructions = _instructions(DOCKERFILE)
    env = " ".join(line for line in instructions if line.startswith("ENV "))
    index = re.search(r"PIP_EXTRA_INDEX_URL=(\S+)", env).group(1)
    assert index == _cpu_index_in_readme() == doctor.CPU_INDEX
    conda = yaml.safe_load((ROOT / "environment.yml").read_text())
    assert f"--extra-index-url {index}" in conda["dependencies"][-1]["pip"]
    base = re.match(r"FROM python:(\d+\.\d+)-slim$", instructions[0]).group(1)
    assert f"python={base}" in conda["dependencies"]
    need = doctor._project()["requires-python"].lstrip(">=")
    assert tuple(map(int, base.split("."))) >= tuple(map(int, need.split(".")))


def test_the_image_installs_the_start_up_hook_and_serves_the_home():
    text = " ".join(_instructions(DOCKERFILE))
    assert "cp workshop/jupyter_server_config.py .venv/etc/jupyter/jupyter_server_config.py" \
        in text
    assert (ROOT / "workshop" / "jupyter_server_config.py").is_file()
    assert "ENV PATH=/srv/simcluster-workbook/.venv/bin:$PATH" in text
    assert '"--ServerApp.root_dir=/home/learner"' in text and "USER learner" in text
    ignored = (ROOT / "workshop" / "Dockerfile.dockerignore").read_text().split()
    assert ".venv" in ignored and "build" in ignored   # a laptop's venv stays out


def test_repo2docker_finds_environment_yml_and_post_build():
    # repo2docker prefers binder/ and a root Dockerfile over environment.yml
    assert not (ROOT / "Dockerfile").exists() and not (ROOT / "binder").exists()
    assert not (ROOT / ".binder").exists()
    post_build = ROOT / "postBuild"
    assert post_build.stat().st_mode & 0o111, "postBuild must be executable"
    assert "pip install --no-deps -e ." in post_build.read_text()
    # the README's conda route installs the package the same way
    assert "pip install -e . --no-deps" in (ROOT / "README.md").read_text()


@pytest.mark.slow
def test_kernel_memory_sees_what_a_notebook_allocates(tmp_path):
    import importlib.util

    import nbformat

    spec = importlib.util.spec_from_file_location("kernel_memory",
                                                  ROOT / "scripts" / "kernel_memory.py")
    kernel_memory = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(kernel_memory)
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "block = bytearray(300 * 2**20)\nblock[::4096] = b'x' * len(block[::4096])\n"
        "import time; time.sleep(0.6)")])
    path = tmp_path / "big.ipynb"
    nbformat.write(nb, path)
    result = kernel_memory.measure(path)
    assert result["peak_rss"] - result["idle_rss"] >= 250 * 2**20, result
    assert result["cpu"] > 0 and result["wall"] > 0.6
