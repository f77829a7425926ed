"""The workshop kit's generated parts (workbook/instructor.py): every lesson 00-10 has
instructor notes naming its objectives, and the agendas and notes match the lessons."""

import re

import nbformat
import pytest

from workbook import instructor


@pytest.fixture(scope="module")
def lessons():
    return instructor.lessons()


def test_every_lesson_has_notes_naming_its_objectives(lessons):
    every_lesson = sorted(path.name[:2] for path in (instructor.ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
    assert [lesson.number for lesson in lessons] == every_lesson   # a new lesson needs notes
    for lesson in lessons:
        path = instructor.NOTES / f"{lesson.stem}.md"
        assert path.is_file(), f"no instructor notes for lesson {lesson.number}"
        text = path.read_text(encoding="utf-8")
        assert len(lesson.objectives) >= 4, lesson.number
        for objective in lesson.objectives:
            assert objective in text, f"{path.name} lacks the objective {objective!r}"
        for section in ("## The picture to draw", "## The three most common mistakes",
                        "## Discussion questions", "## Timings"):
            body = text.split(section, 1)[1].split("\n## ", 1)[0]
            assert section in text and len(body.strip()) > 40, f"{path.name}: {section}"
        assert "TODO" not in text
        if lesson.exercises:
            assert len(lesson.mistakes) == 3
            for hint in lesson.mistakes:
                assert hint in text


def test_the_generated_files_are_up_to_date():
    stale = [path for path, text in instructor.outputs().items()
             if not path.exists() or path.read_text(encoding="utf-8") != text]
    assert not stale, f"out of date: {stale}; run `python -m workbook.instructor`"


def test_the_agendas_fit_their_slots(lessons):
    text = instructor.AGENDAS_FILE.read_text(encoding="utf-8")
    totals = {title: int(h) * 60 + int(m) for title, h, m in
              re.findall(r"^## (.+?) \((\d+) h (\d+) in all\)", text, re.M)}
    assert 180 <= totals["Half a day"] <= 240
    assert 360 <= totals["One day"] <= 480
    assert totals["Interview sprint"] == 60
    days = [int(m) for m in re.findall(r"\| \*\*(\d+)\*\* \| end", text)]
    assert all(minutes <= 8 * 60 for minutes in days), days
    assert "Lesson 11 · Sharing a cluster" in text and "Lab 11" in text   # day 3 ends with it
    for lesson in lessons:
        assert lesson.title in text


def test_objectives_are_read_from_the_list():
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_markdown_cell(
        "# 99 · Test\n\n**By the end of this lesson you will be able to:**\n\n"
        "1. do one thing;\n2. do a second thing\n   over two lines;\n\n"
        "* a bullet too.\n\nThe lab comes next.")])
    assert instructor.objectives(nb) == ["do one thing;", "do a second thing over two lines;",
                                         "a bullet too."]
    assert instructor.objectives(nbformat.v4.new_notebook()) == []


def test_hints_are_ranked_by_how_often_the_checks_raise_them(tmp_path):
    checks = tmp_path / "checks.py"
    checks.write_text('''
HINTS = {"sum": "divide by the world size.", "none": "loop over every parameter."}

def check_a(fn):
    if fn is None:
        raise Failure("no function", HINTS["none"])
    if fn(1) == 2:
        raise Failure("twice", HINTS["sum"])
    raise Failure(f"got {fn(1)}", HINTS["sum"])

def check_b(fn):
    raise Failure("bad", f"return {fn.__name__} as a float.")
''')
    hints = instructor.check_hints(checks)
    assert hints == [("divide by the world size.", "check_a"),
                     ("loop over every parameter.", "check_a"),
                     ("return … as a float.", "check_b")]
    # one per check function first, then the most used of the rest
    assert instructor.top_mistakes(hints) == ["divide by the world size.",
                                              "return … as a float.",
                                              "loop over every parameter."]


def test_notes_keep_the_instructors_text(lessons):
    lesson = lessons[3]
    fresh = instructor.render_notes(lesson)
    edited = fresh.replace("## The picture to draw\n\nTODO", "## The picture to draw\n\nMINE")
    edited = edited.replace(lesson.objectives[0], "a stale objective")
    again = instructor.render_notes(lesson, edited)
    assert "MINE" in again and lesson.objectives[0] in again
    assert "a stale objective" not in again
    broken = edited.replace("<!-- END GENERATED: lab -->", "")
    with pytest.raises(ValueError, match="'lab' is missing"):
        instructor.render_notes(lesson, broken)
