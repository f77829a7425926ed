"""The start page (START.ipynb, what `make lab` opens) and the links that lead a learner
from lesson to lab to the next lesson."""

import json
import re
from pathlib import Path

import nbformat
import pytest

ROOT = Path(__file__).resolve().parents[1]
START = ROOT / "START.ipynb"
LESSONS = sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
LINK = re.compile(r"\]\(([^)\s]+)\)")          # [text](target)


def links(markdown, base):
    """The relative links of ``markdown``, resolved from the folder ``base``."""
    return [(base / target.split("#")[0]).resolve() for target in LINK.findall(markdown)
            if not re.match(r"[a-z]+:", target)]


def lab_of(lesson):
    lab = ROOT / "labs" / lesson.name
    return lab if lab.exists() else None


def test_make_lab_opens_the_start_page_without_the_news_prompt():
    script = (ROOT / "scripts" / "lab.sh").read_text()
    default = re.search(r"--LabApp\.default_url=/lab/tree/(\S+)", script)
    assert default and (ROOT / default.group(1)) == START, "lab.sh must open START.ipynb"
    settings = re.search(r'--LabApp\.app_settings_dir="\$PWD/(\S+)"', script)
    overrides = json.loads((ROOT / settings.group(1) / "overrides.json").read_text())
    assert overrides["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"


def test_the_start_page_is_markdown_that_jupyterlab_renders():
    nb = nbformat.read(START, as_version=4)
    nbformat.validate(nb)
    assert nb.cells and all(cell.cell_type == "markdown" for cell in nb.cells)
    text = "\n".join(cell.source for cell in nb.cells)
    for words in ("make progress", "Self-study", "workshop day", "interview sprint",
                  "Starting a lab again", "an article about an 11-node GPU platform",
                  "an article about model-compute parallelism with DeepSpeed and Megatron",
                  'an article about a training "protocol"'):
        assert words in text, f"the start page does not say {words!r}"


def test_the_start_page_lists_every_lesson_in_order_beside_its_lab_with_a_time():
    text = "\n".join(cell.source for cell in nbformat.read(START, as_version=4).cells)
    targets = links(text, ROOT)
    assert all(target.exists() for target in targets), \
        [str(t) for t in targets if not t.exists()]
    assert "`labs/` folder, in the file browser" in text, "labs/ is one click away"
    rows = [line for line in text.splitlines() if re.match(r"\| \d\d \|", line)]
    listed = [target for target in targets if target.parent.name == "notebooks"]
    assert listed == LESSONS, "every lesson, in order"
    for lesson in LESSONS:
        (row,) = [line for line in rows if line.startswith(f"| {lesson.name[:2]} |")]
        assert re.search(r"\| \d+ (min|h)", row), f"no time for lesson {lesson.name}"
        if lab_of(lesson):
            assert f"(labs/{lesson.name})" in row, f"lab {lesson.name} is not beside its lesson"


@pytest.mark.parametrize("lesson", LESSONS, ids=lambda path: path.name[:2])
def test_every_lesson_ends_with_links_to_its_lab_and_the_next_lesson(lesson):
    last = nbformat.read(lesson, as_version=4).cells[-1]
    assert last.cell_type == "markdown"
    targets = links(last.source, lesson.parent)
    assert all(target.exists() for target in targets), last.source
    assert START in targets
    if lab_of(lesson):
        assert lab_of(lesson) in targets, f"{lesson.name} does not link its lab"
    following = LESSONS[LESSONS.index(lesson) + 1:]
    if following:
        assert following[0] in targets, f"{lesson.name} does not link {following[0].name}"
