"""workbook.outputs, and the guard against outputs that move with the CPU: `make test`
checks the notebooks on other CPU kernels than the ones that stored them."""

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from workbook.outputs import below, fixed

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("value, bound, text", [
    (3.6e-07, 1e-5, "below 1e-05"),
    (3.9e-07, 1e-5, "below 1e-05"),          # two machines' noise: the same words
    (0.0, 1e-6, "below 1e-06"),
    (2.5e-05, 1e-5, "2.5e-05, not below 1e-05"),
    (float("nan"), 1e-6, "nan (not below 1e-06)"),
])
def test_below_reports_a_bound_or_the_value_that_broke_it(value, bound, text):
    assert below(value, bound) == text


@pytest.mark.parametrize("value, decimals, text", [
    (4.440228, 3, "4.440"), (4.440227, 3, "4.440"), (6.953612, 4, "6.9536"),
    (0.973890, 4, "0.9739"), (-2.5, 1, "-2.5"),
])
def test_fixed_prints_the_stable_digits(value, decimals, text):
    assert fixed(value, decimals) == text


@pytest.mark.parametrize("value, decimals", [
    (4.324452, 4),      # 4.3245 here, 4.3244 for 4.324449: noise could flip it
    (4.440228, 6),      # the digit the issue saw move (4.440228 vs 4.440227)
    (0.12500001, 2),
])
def test_fixed_refuses_digits_that_noise_could_move(value, decimals):
    with pytest.raises(ValueError, match="print fewer decimals"):
        fixed(value, decimals)


def _nbval_env():
    """The variables the Makefile sets for the notebook checks."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(r"^NBVAL_ENV\s*:?=\s*(.+)$", text, re.M)
    assert match, "the Makefile sets no NBVAL_ENV for the notebook checks"
    assert "$(NBVAL_ENV) $(PYTEST) $$mode --nbval-current-env" in text, \
        "the nbval runs in `make test` do not use NBVAL_ENV"
    return dict(item.split("=", 1) for item in match.group(1).split())


def _capability(env):
    code = "import torch; print(torch.backends.cpu.get_cpu_capability())"
    return subprocess.run([sys.executable, "-c", code], env=env, capture_output=True,
                          text=True, check=True).stdout.strip()


def test_make_test_checks_the_notebooks_on_other_cpu_kernels():
    variables = _nbval_env()
    assert variables.get("ATEN_CPU_CAPABILITY") == "default"
    assert variables.get("MKL_ENABLE_INSTRUCTIONS") == "SSE4_2"
    plain = {k: v for k, v in os.environ.items()
             if k not in ("ATEN_CPU_CAPABILITY", "MKL_ENABLE_INSTRUCTIONS")}
    # On x86 (AVX2 or AVX-512) the kernels differ from the default; on ARM "default" is
    # already what runs, and the check is as strict as it can be there.
    assert _capability({**plain, **variables}) == "DEFAULT"


@pytest.mark.slow
def test_a_stored_progress_bar_reads_as_finished_and_has_no_times():
    """In a kernel the bar is a widget; what a saved notebook keeps (and nbval compares)
    is its plain-text stand-in, written when the bar first appears: it must read as the
    bar's last frame, without the elapsed time."""
    import nbformat
    from nbclient import NotebookClient
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(
        "from workbook.outputs import progress\n"
        "total = sum(i for i in progress(range(3), desc='steps'))\nprint(total)")])
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(ROOT)}}).execute()
    outputs = nb.cells[0].outputs
    bars = [o for o in outputs if o.output_type == "display_data"]
    assert len(bars) == 1, outputs
    assert "application/vnd.jupyter.widget-view+json" in bars[0].data   # live: a widget
    assert bars[0].data["text/plain"] == "steps: 100%|██████████| 3/3"
    assert outputs[-1].text == "3\n"


def _stored_texts(path):
    """Every stream and plain-text output stored in the notebook at ``path``."""
    import json

    for cell in json.loads(path.read_text(encoding="utf-8"))["cells"]:
        for output in cell.get("outputs", []):
            text = output.get("text") if output["output_type"] == "stream" else \
                output.get("data", {}).get("text/plain")
            if text:
                yield "".join(text) if isinstance(text, list) else text


def test_every_stored_progress_bar_in_the_notebooks_reads_finished():
    bars = [(path.name, line) for folder in ("notebooks", "solutions")
            for path in sorted((ROOT / folder).glob("*.ipynb"))
            for text in _stored_texts(path) for line in text.splitlines() if "%|" in line]
    assert bars, "no stored progress bar found: the test reads the wrong outputs"
    unfinished = [(name, line) for name, line in bars
                  if not re.search(r" 100%\|█+\| (\d+)/\1$", line)]
    assert not unfinished, f"a stored bar that is not finished or shows times: {unfinished}"
