"""The workshop kit's generated parts: ``python -m workbook.instructor`` (``make workshop``).

Writes, from the lessons, labs and checks as they are now (so nothing drifts):

- ``workshop/agendas.md``: the half-day, one-day, three-day and one-hour agendas with
  their times (:data:`AGENDAS` says what goes where; the minutes are computed here);
- in each lesson's notes (``workshop/notes/`` + the notebook's stem + ``.md``), the
  blocks between ``<!-- BEGIN GENERATED: x -->`` and ``<!-- END GENERATED: x -->``:
  the lesson's objectives (its "By the end of this lesson" list), its timings, its
  lab's exercises, and the three mistakes its checks name most (their hints).
  Everything outside the blocks is the instructor's own text and is kept; a missing
  notes file is started from a skeleton.

How long things take:

- **run**: the lesson's measured "Run All" (``workshop/timings.json``, with where each
  number comes from): the kernel's CPU time plus :data:`KERNEL_START_S` where it was
  measured (on a shared machine wall time grows with other people's load, CPU time does
  not; a lesson runs on one core), else the wall time; rounded up to a minute;
- **read**: the lesson's markdown words at :data:`WORDS_PER_MINUTE` plus
  :data:`CODE_CELL_MINUTES` per code cell (reading the code and its output);
- **lab**: reading the lab at the same speed plus :data:`EXERCISE_MINUTES` per exercise.
  No newcomer run has timed lab attempts yet (the reviews time Run All and the checks),
  so this is an estimate: replace it with your first workshop's times.

    python -m workbook.instructor           # (re)write the agendas and the notes' blocks
    python -m workbook.instructor --check   # exit 1 if a file is out of date
"""

import argparse
import ast
import json
import math
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
WORKSHOP = ROOT / "workshop"
NOTES = WORKSHOP / "notes"
AGENDAS_FILE = WORKSHOP / "agendas.md"

WORDS_PER_MINUTE = 150        # technical prose with formulas, read to understand
CODE_CELL_MINUTES = 0.5       # read a code cell and look at its output
EXERCISE_MINUTES = 12         # one lab exercise, attempt and fix (an estimate, see above)
KERNEL_START_S = 5            # a kernel starting and importing torch (browser review: 2.9 s idle)
LESSONS = sorted(path.name[:2] for path in (ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))
OBJECTIVES = "By the end of this lesson"


@dataclass
class Lesson:
    """What the kit needs to know about one lesson and its lab."""
    number: str
    stem: str
    title: str
    objectives: list
    words: int
    code_cells: int
    run_s: float
    lab: str = ""
    exercises: list = field(default_factory=list)
    lab_words: int = 0
    mistakes: list = field(default_factory=list)   # (hint, what the check says) pairs

    @property
    def read_min(self):
        return self.words / WORDS_PER_MINUTE + self.code_cells * CODE_CELL_MINUTES

    @property
    def run_min(self):
        return math.ceil(self.run_s / 60)

    @property
    def lesson_min(self):
        """Read and run, rounded up to 5 minutes (a schedule's grain)."""
        return _round5(self.read_min + self.run_min)

    @property
    def lab_min(self):
        if not self.exercises:
            return 0
        return _round5(self.lab_words / WORDS_PER_MINUTE + EXERCISE_MINUTES * len(self.exercises))


def _round5(minutes):
    return 5 * math.ceil(minutes / 5)


def _words(nb):
    text = "\n".join(cell.source for cell in nb.cells if cell.cell_type == "markdown")
    return len(re.findall(r"\w+", text))


def objectives(nb):
    """The items of the lesson's "By the end of this lesson you will be able to" list."""
    for cell in nb.cells:
        if cell.cell_type != "markdown" or OBJECTIVES not in cell.source:
            continue
        after = cell.source.split(OBJECTIVES, 1)[1].split("\n", 1)[1]
        items = []
        for line in after.splitlines():
            start = re.match(r"\s*(?:\d+\.|[*-])\s+(.*)", line)
            if start:
                items.append(start.group(1).strip())
            elif items and line.startswith(" ") and line.strip():
                items[-1] += " " + line.strip()         # an item's continuation line
            elif items and not line.strip():
                continue
            elif items:
                break
        return items
    return []


def _text(node):
    """The text of a string expression; an f-string's fields become "…"."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "…" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _text(node.left), _text(node.right)
        return left + right if left is not None and right is not None else None
    return None


def check_hints(path):
    """The hints a lab's checks give (``Failure(what, hint)``), most used first.

    A hint is counted at each place that raises it: a ``Failure`` with a written hint
    (a string, a module constant, or a helper called with one), or a lookup ``NAME["key"]`` in a dict of hints (a name containing "hint"). Ties keep
    the order of the source. Returns ``[(hint, owner function), ...]``."""
    tree = ast.parse(Path(path).read_text(encoding="utf-8"))
    tables = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Dict) and \
                len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                "hint" in node.targets[0].id.lower():
            for key, value in zip(node.value.keys, node.value.values):
                if isinstance(key, ast.Constant) and _text(value):
                    tables.setdefault(key.value, _text(value))
    constants = {node.targets[0].id: _text(node.value) for node in tree.body
                 if isinstance(node, ast.Assign) and len(node.targets) == 1
                 and isinstance(node.targets[0], ast.Name) and _text(node.value)}

    def hint_text(node):
        # a written hint, a module constant holding one, or a wrapper's text argument
        # such as _more("exercise", "what to think about")
        if isinstance(node, ast.Name):
            return constants.get(node.id)
        if isinstance(node, ast.Call):
            return next((t for t in map(_text, node.args[1:] or node.args) if t), None)
        return _text(node)

    counts, first, owner = {}, {}, {}

    def add(hint, where, position):
        counts[hint] = counts.get(hint, 0) + 1
        first.setdefault(hint, position)
        owner.setdefault(hint, where)

    for function in tree.body:
        if not isinstance(function, ast.FunctionDef):
            continue
        for node in ast.walk(function):
            position = (node.lineno, node.col_offset) if hasattr(node, "lineno") else (0, 0)
            if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "Failure" \
                    and len(node.args) >= 2 and hint_text(node.args[1]):
                add(hint_text(node.args[1]), function.name, position)
            elif isinstance(node, ast.Subscript) and isinstance(node.value, ast.Name) and \
                    "hint" in node.value.id.lower() and isinstance(node.slice, ast.Constant) \
                    and node.slice.value in tables:
                add(tables[node.slice.value], function.name, position)
    ranked = sorted(counts, key=lambda hint: (-counts[hint], first[hint]))
    return [(hint, owner[hint]) for hint in ranked]


def top_mistakes(hints, n=3):
    """``n`` hints, most used first, from as many different check functions as can be."""
    chosen, owners = [], set()
    for hint, owner in hints:
        if owner not in owners:
            chosen.append(hint)
            owners.add(owner)
        if len(chosen) == n:
            return chosen
    return chosen + [hint for hint, _ in hints if hint not in chosen][:n - len(chosen)]


def load_timings():
    """``{"NN": run seconds}`` and the sources, from workshop/timings.json."""
    return json.loads((WORKSHOP / "timings.json").read_text(encoding="utf-8"))


def run_seconds(timing):
    """A lesson's Run All in seconds, from its entry in workshop/timings.json."""
    if timing.get("cpu_s") is not None:
        return timing["cpu_s"] + KERNEL_START_S
    return timing["wall_s"]


def lessons():
    """Every lesson 00-10 with its lab, objectives, counts and timings."""
    timings = load_timings()["lessons"]
    found = []
    for number in LESSONS:
        path, = sorted((ROOT / "notebooks").glob(f"{number}_*.ipynb"))
        nb = nbformat.read(path, as_version=4)
        title = re.sub(r"^#\s*", "", nb.cells[0].source.splitlines()[0]).strip()
        lesson = Lesson(number, path.stem, title, objectives(nb), _words(nb),
                        sum(cell.cell_type == "code" for cell in nb.cells),
                        run_seconds(timings[number]))
        lab = ROOT / "labs" / path.name
        if lab.exists():
            lab_nb = nbformat.read(lab, as_version=4)
            lesson.lab = f"labs/{path.name}"
            lesson.exercises = [item.get("title", f"Exercise {item['number']}") for item in
                                lab_nb.metadata.get("workbook", {}).get("exercises", [])]
            lesson.lab_words = _words(lab_nb)
            # workbook/lessonNN/ or workbook/lessonNN_topic/; where both exist (one an
            # alias of the other), the one that holds the checks' hints
            hints = max((check_hints(path) for path in
                         ROOT.glob(f"workbook/lesson{number}*/checks.py")), key=len, default=[])
            lesson.mistakes = top_mistakes(hints)
        found.append(lesson)
    return found


# ---------------------------------------------------------------------------- agendas

BREAK, LUNCH = ("Break", 15), ("Lunch", 60)

AGENDAS = [
    {"title": "Half a day",
     "intro": "The core of data parallelism: what a cluster is, what communication costs, "
              "and DDP by hand. Learners arrive with `make doctor` green.",
     "blocks": [("welcome", 10), ("lesson", "00"), ("lesson", "01"), BREAK,
                ("lesson", "03"), ("lab", "03", [1, 2]), ("wrap-up", 10)],
     "skip": "In lesson 01 show only §1-2 (the collectives, alpha-beta) and let the rest "
             "run; lab 03 exercise 2 (buckets) becomes homework."},
    {"title": "One day",
     "intro": "From one rank to a 3D layout: data and pipeline parallelism by hand, ZeRO "
              "and the planner shown.",
     "blocks": [("welcome", 15), ("lesson", "00"), ("lesson", "01"), BREAK,
                ("lesson", "03"), ("lab", "03", [1, 2, 3]), LUNCH,
                ("lesson", "05"), ("lab", "05", [1]), BREAK,
                ("lesson", "07"), ("lesson", "09"), ("wrap-up", 15)],
     "skip": "Lessons 02, 04, 06, 08 and 10 are the reading list for the week after. "
             "Running late: cut lesson 09 to §1 and §4 (the mesh, the planner), then lab "
             "05; keep the lab after lesson 03, it is where DDP clicks."},
    {"title": "Three days",
     "intro": "Every lesson and every lab in order; each lab's last exercise is homework "
              "(it is the longest). Day 3 ends with lesson 11 (sharing a cluster); a team "
              "that serves models takes lesson 12 (serving) in its place.",
     "days": [
         [("welcome", 15), ("lesson", "00"), ("lesson", "01"), BREAK, ("lesson", "02"),
          LUNCH, ("lab", "02", [1, 2, 3, 4, 5]), BREAK, ("lesson", "03"),
          ("lab", "03", [1, 2, 3, 4])],
         [("lesson", "04"), ("lab", "04", [1, 2]), ("lesson", "05"), BREAK,
          ("lab", "05", [1, 2, 3]), LUNCH, ("lesson", "06"), ("lab", "06", [1, 2, 3]),
          BREAK, ("lesson", "07"), ("lab", "07", [1, 2, 3, 4])],
         [("lesson", "08"), ("lab", "08", [1, 2, 3]), BREAK, ("lesson", "09"),
          ("lab", "09", [1, 2, 3]), LUNCH, ("lesson", "10"), ("lab", "10", [1, 2, 3]),
          BREAK, ("lesson", "11"), ("lab", "11", [1, 2]), ("wrap-up", 15)],
     ],
     "skip": "Read lessons 02 and 04 at home (keep their labs); make lesson 11 and its "
             "lab homework; then the labs' third exercises."},
    {"title": "Interview sprint",
     "intro": "For people preparing ML-systems interviews: the numbers and trade-offs "
              "asked most, run and discussed, not read in full.",
     "blocks": [("lesson-part", "01", 15, "§2 the alpha-beta model, bus bandwidth"),
                ("lesson-part", "05", 15, "§2 the bubble (p-1)/(m+p-1), GPipe vs 1F1B memory"),
                ("lesson-part", "07", 15, "§1-2 16 bytes per parameter, ZeRO-1/2/3"),
                ("lesson-part", "09", 15, "§4 the planner: choose a layout under a cap")],
     "skip": "Drop lesson 01's part and open with the bubble. Then lesson 13 (interview "
             "prep) as homework: its timed drills, the design question and its lab."},
]


def _block_rows(blocks, by_number):
    """``[(minutes, what, notes)]`` of one day's blocks."""
    rows = []
    for block in blocks:
        kind = block[0]
        if kind in ("Break", "Lunch"):
            rows.append((block[1], f"*{kind}*", ""))
        elif kind in ("welcome", "wrap-up"):
            what = "Welcome, `make doctor` stragglers" if kind == "welcome" else \
                "Wrap-up: `make progress JSON=...`, questions"
            rows.append((block[1], what, ""))
        elif kind == "lesson":
            lesson = by_number[block[1]]
            rows.append((lesson.lesson_min, f"Lesson {lesson.title}",
                         f"read {lesson.read_min:.0f} + run {lesson.run_min} min"))
        elif kind == "lesson-part":
            lesson = by_number[block[1]]
            rows.append((block[2], f"Lesson {lesson.title}: {block[3]}", "run, don't read"))
        elif kind == "lab":
            lesson = by_number[block[1]]
            chosen = block[2] if len(block) > 2 else range(1, len(lesson.exercises) + 1)
            chosen = list(chosen)
            minutes = _round5(lesson.lab_words / WORDS_PER_MINUTE * len(chosen) /
                              len(lesson.exercises) + EXERCISE_MINUTES * len(chosen))
            names = ", ".join(str(n) for n in chosen)
            rows.append((minutes, f"Lab {lesson.number} (`{lesson.lab}`), exercise(s) {names}",
                         f"{EXERCISE_MINUTES} min per exercise (estimate)"))
    return rows


def _clock(start, minutes):
    total = start + minutes
    return f"{total // 60:02d}:{total % 60:02d}"


def _day_table(rows, start=9 * 60):
    lines = ["| start | min | block | how the time is made |", "|---|---:|---|---|"]
    t = start
    for minutes, what, how in rows:
        lines.append(f"| {_clock(t, 0)} | {minutes} | {what} | {how} |")
        t += minutes
    lines.append(f"| {_clock(t, 0)} | **{t - start}** | end | |")
    return lines


def agendas_markdown(found):
    """The text of workshop/agendas.md."""
    by_number = {lesson.number: lesson for lesson in found}
    timings = load_timings()
    out = ["# Workshop agendas", "",
           "<!-- Generated by `python -m workbook.instructor` from the lessons, labs and "
           "workshop/timings.json: edit AGENDAS in workbook/instructor.py, not this file. -->",
           "",
           "Times are computed, not guessed: a lesson's **run** time is its measured Run All "
           "(below); its **read** time is its words at "
           f"{WORDS_PER_MINUTE} words per minute plus {CODE_CELL_MINUTES} min per code "
           "cell; a lab is its words at the same speed plus "
           f"**{EXERCISE_MINUTES} min per exercise — an estimate**: no newcomer run has "
           "timed lab attempts yet (the reviews in this project timed Run All and the "
           "checks, 0.2-3.7 s each). Blocks are rounded up to 5 minutes. Everyone runs "
           "`make doctor` before the day (see [server.md](server.md) when laptops fail).",
           ""]
    for agenda in AGENDAS:
        days = agenda.get("days") or [agenda["blocks"]]
        minutes = sum(row[0] for day in days for row in _block_rows(day, by_number))
        out += [f"## {agenda['title']} ({minutes // 60} h {minutes % 60:02d} in all)", "",
                agenda["intro"], ""]
        for index, blocks in enumerate(days):
            if len(days) > 1:
                out += [f"### Day {index + 1}", ""]
            out += _day_table(_block_rows(blocks, by_number)) + [""]
        out += [f"**What to skip when short.** {agenda['skip']}", ""]
    out += ["## Every lesson, measured", "",
            "| lesson | words | code cells | run | read | lesson | lab exercises | lab |",
            "|---|---:|---:|---:|---:|---:|---:|---:|"]
    for lesson in found:
        out.append(f"| {lesson.title} | {lesson.words:,} | {lesson.code_cells} | "
                   f"{lesson.run_s:.0f} s | {lesson.read_min:.0f} min | "
                   f"{lesson.lesson_min} min | {len(lesson.exercises) or '—'} | "
                   f"{lesson.lab_min or '—'}{' min' if lesson.lab_min else ''} |")
    total = sum(lesson.lesson_min + lesson.lab_min for lesson in found)
    out += ["", f"All of lessons 00-10 with every lab: **{total // 60} h {total % 60:02d}** "
                "without breaks.", "", "Where the run times come from: " +
            timings["source"], ""]
    return "\n".join(out)


# ------------------------------------------------------------------------------ notes

def _generated(name, body):
    return f"<!-- BEGIN GENERATED: {name} -->\n{body.rstrip()}\n<!-- END GENERATED: {name} -->"


def note_blocks(lesson):
    """``{block name: markdown}`` of the generated parts of a lesson's notes."""
    blocks = {"objectives": "\n".join(f"{i}. {item}" for i, item in
                                      enumerate(lesson.objectives, 1)),
              "timings": f"- lesson: **{lesson.lesson_min} min** (read "
                         f"{lesson.read_min:.0f} min at {WORDS_PER_MINUTE} words/min, run "
                         f"{lesson.run_s:.0f} s measured)\n"}
    if lesson.exercises:
        blocks["timings"] += f"- lab: **{lesson.lab_min} min** ({len(lesson.exercises)} " \
                             f"exercises at {EXERCISE_MINUTES} min, an estimate)"
        blocks["lab"] = f"`{lesson.lab}`:\n\n" + "\n".join(
            f"{i}. {title}" for i, title in enumerate(lesson.exercises, 1))
        blocks["mistakes"] = "\n".join(
            f"{i}. *The check's hint:* {hint}" for i, hint in enumerate(lesson.mistakes, 1))
    else:
        blocks["timings"] += "- no lab"
        blocks["lab"] = "This lesson has no lab."
        blocks["mistakes"] = "No lab, no checks: see the hand-written notes below."
    return blocks


SKELETON = """# Instructor notes: {title}

Lesson: `notebooks/{stem}.ipynb`. The blocks marked GENERATED are rewritten by
`python -m workbook.instructor`; write everywhere else.

## Objectives

{objectives}

## Timings

{timings}

## Lab

{lab}

## The picture to draw

TODO

## The three most common mistakes

The hints the lab's checks give most (ranked by how many places raise them; replace with
what you see in your room):

{mistakes}

What to say: TODO

## Discussion questions

1. TODO
"""


def render_notes(lesson, current=None):
    """The notes file's text: ``current`` with its generated blocks refreshed, or a
    skeleton with them filled in."""
    blocks = note_blocks(lesson)
    if current is None:
        return SKELETON.format(title=lesson.title, stem=lesson.stem,
                               **{name: _generated(name, body)
                                  for name, body in blocks.items()})
    for name, body in blocks.items():
        pattern = re.compile(rf"<!-- BEGIN GENERATED: {name} -->.*?"
                             rf"<!-- END GENERATED: {name} -->", re.S)
        if not pattern.search(current):
            raise ValueError(f"notes of lesson {lesson.number}: the generated block "
                             f"'{name}' is missing (restore its two marker lines)")
        current = pattern.sub(lambda _: _generated(name, body), current)
    return current


def outputs():
    """``{path: text}`` of every generated file as it should be now."""
    found = lessons()
    files = {AGENDAS_FILE: agendas_markdown(found)}
    for lesson in found:
        path = NOTES / f"{lesson.stem}.md"
        current = path.read_text(encoding="utf-8") if path.exists() else None
        files[path] = render_notes(lesson, current)
    return files


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m workbook.instructor",
                                     description="Write the workshop agendas and the "
                                                 "generated parts of the instructor notes.")
    parser.add_argument("--check", action="store_true",
                        help="change nothing; exit 1 listing the files that are out of date")
    args = parser.parse_args(argv)
    stale = []
    for path, text in outputs().items():
        old = path.read_text(encoding="utf-8") if path.exists() else None
        if old == text:
            continue
        stale.append(path.relative_to(ROOT))
        if not args.check:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    verb = "out of date" if args.check else "written"
    for path in stale:
        print(f"{verb}: {path}")
    if args.check and stale:
        print("run `python -m workbook.instructor` to bring them up to date")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
