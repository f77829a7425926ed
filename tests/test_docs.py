"""The repository stands alone: its documents link only to files that exist in it, and
no file names a markdown document that is not in the repository."""

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")          # [text](target)
MARKDOWN_NAME = re.compile(r"\b[\w./-]+\.md\b")  # README.md, docs/architecture.md, ...
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".sh", ".ipynb", ".cfg", ".txt", ""}


def _tracked_text_files():
    listed = subprocess.run(["git", "ls-files"], cwd=ROOT, capture_output=True, text=True)
    if listed.returncode != 0:
        pytest.skip("not a git checkout: cannot list the repository's files")
    return [ROOT / name for name in listed.stdout.splitlines()
            if Path(name).suffix in TEXT_SUFFIXES and (ROOT / name).is_file()]


@pytest.mark.parametrize("document", DOCUMENTS, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_relative_link_points_into_the_repository(document):
    broken = []
    for target in LINK.findall(document.read_text()):
        if re.match(r"[a-z]+:", target):          # https:, mailto: — not a file
            continue
        path = target.split("#")[0]
        if path and not (document.parent / path).resolve().exists():
            broken.append(target)
    assert not broken, f"{document.relative_to(ROOT)} links to missing files: {broken}"


def test_no_file_names_a_document_outside_the_repository():
    names = {path.name for path in ROOT.rglob("*.md") if ".venv" not in path.parts}
    outside = []
    for path in _tracked_text_files():
        for name in MARKDOWN_NAME.findall(path.read_text(errors="replace")):
            if Path(name).name not in names:
                outside.append(f"{path.relative_to(ROOT)}: {name}")
    assert not outside, ("these files refer to documents that are not in the repository "
                         "(published numbers and goals belong in "
                         "docs/reference-numbers.md):\n" + "\n".join(outside))


def test_no_file_keeps_merge_conflict_markers():
    marker = re.compile(r"^(<{7} |>{7} |={7}$)", re.M)
    left = [str(path.relative_to(ROOT)) for path in _tracked_text_files()
            if marker.search(path.read_text(errors="replace"))]
    assert not left, f"unresolved merge conflicts in {left}"


# How the lessons once named their three source articles: words a learner was never told.
# They are "an article about ..." (introduced in START.ipynb and the README).
SEED_WORDS = re.compile(r"seed platform|seed material|seed claim|\bthe seeds\b|\bseed's\b|"
                        r"\bthe seed (says|proposes|claims|configures)", re.IGNORECASE)


def test_the_source_articles_are_never_called_the_seed():
    found = []
    for path in _tracked_text_files():
        if path.parts[-2] == "tests" and path.name == "test_docs.py":
            continue
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if SEED_WORDS.search(line):
                found.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:80]}")
    assert not found, "say which article, not 'the seed':\n" + "\n".join(found)
