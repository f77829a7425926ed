"""Every notebook opens unmodified in `make lab`.

On opening a notebook, JupyterLab starts its kernel and writes the kernel's kernelspec
(name, display_name, language) and its whole language_info (the kernel_info reply:
codemirror_mode, file_extension, mimetype, name, nbconvert_exporter, pygments_lexer,
version) into the notebook's metadata. Any difference marks the notebook modified, so
that closing a lesson one only read asks "Save changes?" and autosave rewrites the
committed file (checked in headless Chromium: docs/determinism.md). So every notebook
must carry exactly what the kernel of `make lab` (ipykernel's "python3") reports; the
labs get theirs from their solutions (workbook/labs.py keeps both).

The Python version is the one field that follows the learner's interpreter: it must be
the same in every notebook, and it is what the outputs were stored with.
"""

import json
from pathlib import Path

import pytest
from ipykernel.ipkernel import IPythonKernel
from jupyter_client.kernelspec import KernelSpecManager

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = sorted(p for d in ("notebooks", "solutions", "labs") for p in (ROOT / d).glob("*.ipynb"))


def _metadata(path):
    return json.loads(path.read_text(encoding="utf-8"))["metadata"]


def test_there_are_notebooks_to_check():
    assert {p.parent.name for p in NOTEBOOKS} == {"notebooks", "solutions", "labs"}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_kernelspec_is_the_one_make_lab_starts(path):
    spec = KernelSpecManager().get_kernel_spec("python3")
    assert _metadata(path).get("kernelspec") == {
        "name": "python3", "display_name": spec.display_name, "language": spec.language}


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: f"{p.parent.name}/{p.name}")
def test_language_info_is_what_the_kernel_reports(path):
    stored = dict(_metadata(path).get("language_info", {}))
    reported = dict(IPythonKernel.language_info)
    stored.pop("version", None)
    reported.pop("version")
    assert stored == reported


def test_every_notebook_names_the_same_python_version():
    versions = {_metadata(p).get("language_info", {}).get("version") for p in NOTEBOOKS}
    assert len(versions) == 1 and None not in versions, versions
