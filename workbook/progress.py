"""Your progress through the labs: ``python -m workbook.progress`` (or ``make progress``).

Runs each ``labs/*.ipynb`` from top to bottom in a fresh kernel (errors do not stop it;
the notebook file is not modified) and reports, for each exercise:

- **passed** — its check cell printed a line starting with ✅ and none starting with ❌;
- **failed** — a ❌ line, an error, a timeout, or no verdict at all;
- **not started** — it still raises ``NotImplementedError`` (the lab's placeholder), and
  its check cell says so with a ⬜ line, as here.

Exercises and their check cells are found from the metadata that the lab builder
(:mod:`workbook.labs`) puts on them, so a check cell must keep its metadata (moving or
editing cells is fine; deleting and re-typing a check cell is not).

    python -m workbook.progress                   # every lab in labs/
    python -m workbook.progress labs/02_*.ipynb   # some of them
    python -m workbook.progress --timeout 300     # seconds per cell (default 120)
    python -m workbook.progress --json progress.json   # also a file to hand in
                                                       # (see workbook.handin)
"""

import argparse
import sys
from dataclasses import dataclass, field
from pathlib import Path

import nbformat

from workbook.labs import unreadable

PASSED, FAILED, NOT_STARTED = "passed", "failed", "not started"
STATUSES = (PASSED, FAILED, NOT_STARTED)
MARKS = {PASSED: "✅", FAILED: "❌", NOT_STARTED: "⬜"}
UNSOLVED = "NotImplementedError"


@dataclass
class Exercise:
    number: int
    title: str
    status: str
    detail: str = ""     # for a failure: the first ❌ line or the error


@dataclass
class LabReport:
    name: str
    exercises: list = field(default_factory=list)
    error: str = ""      # the lab could not be run to the end
    broken: str = ""     # the lab could not be read or graded at all (why)
    strays: list = field(default_factory=list)   # cells of exercises not the lab's own

    def count(self, status):
        return sum(exercise.status == status for exercise in self.exercises)


def _text(cell):
    """Everything a cell printed or displayed as text."""
    parts = []
    for output in cell.get("outputs", []):
        if output.output_type == "stream":
            parts.append(output.text)
        elif output.output_type in ("display_data", "execute_result"):
            parts.append(output.get("data", {}).get("text/plain", ""))
    return "\n".join(parts)


def _errors(cell):
    return [output for output in cell.get("outputs", []) if output.output_type == "error"]


def _verdict(cells, checks):
    """``(status, detail)`` of one exercise from its executed cells."""
    errors = [error for cell in cells for error in _errors(cell)]
    lines = [line.strip() for cell in checks for line in _text(cell).splitlines()]
    failures = [line for line in lines if line.startswith(MARKS[FAILED])]
    if any(error.ename == UNSOLVED for error in errors) or \
            any(line.startswith(MARKS[NOT_STARTED]) for line in lines) or \
            any(UNSOLVED in line for line in failures):
        return NOT_STARTED, ""
    if errors:
        error = errors[0]
        if error.ename == "KeyboardInterrupt":
            return FAILED, "timed out (an endless loop?)"
        return FAILED, f"{error.ename}: {error.evalue}".strip()
    if failures:
        return FAILED, failures[0]
    if not checks:
        return FAILED, "its check cell is missing (was it deleted?)"
    if any(cell.get("execution_count") is None for cell in checks):
        return FAILED, "its check cell did not run"
    if any(line.startswith("✅") for line in lines):
        return PASSED, ""
    return FAILED, "its check cell printed no ✅ / ❌ line"


class BrokenLab(ValueError):
    """A lab whose file or exercise metadata cannot be used; the others are still run."""


def _number(value, where):
    """An exercise number from the lab's metadata: an int, or a string of digits (edited
    by hand); anything else is a :class:`BrokenLab` naming ``where``."""
    if isinstance(value, int) and not isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().isdigit():
        return int(value)
    raise BrokenLab(f"{where} has exercise number {value!r}, not a number")


def _exercise_cells(nb):
    """``(titles, cells, checks, strays)`` of a lab: its exercises' titles by number, the
    cells and the check cells of each, and a line for each exercise cell that is not one of
    the lab's own (a check cell pasted from another lab would otherwise count as passed).

    The lab's own exercises are its metadata's list; a lab without one (edited by hand)
    is described by its cells alone."""
    info = nb.metadata.get("workbook", {})
    info = info if isinstance(info, dict) else {}
    titles = {}
    for item in info.get("exercises", []):
        if isinstance(item, dict) and item.get("number") is not None:  # else: the cells say
            titles[_number(item["number"], "the lab's list of exercises")] = \
                item.get("title", "")
    own = dict(titles)
    cells, checks, strays = {}, {}, []
    for index, cell in enumerate(nb.cells):
        meta = cell.get("metadata", {}).get("workbook")
        if cell.cell_type != "code" or not isinstance(meta, dict) or "exercise" not in meta:
            continue
        number = _number(meta["exercise"], f"cell {index}")
        title = meta.get("title", "")
        if own and (number not in own or title and own[number] and title != own[number]):
            strays.append(f"cell {index} belongs to exercise {number} "
                          f"{title or '(no title)'!r}, which is not one of this lab's: "
                          "not counted (pasted from another lab?)")
            continue
        titles.setdefault(number, title)
        cells.setdefault(number, []).append(cell)
        if meta.get("role") == "check":
            checks.setdefault(number, []).append(cell)
    return titles, cells, checks, strays


def grade(nb):
    """The exercises of an executed lab notebook, as a list of :class:`Exercise`; only the
    lab's own exercises count (see :func:`_exercise_cells`)."""
    titles, cells, checks, _ = _exercise_cells(nb)
    return [Exercise(number, titles[number], *_verdict(cells.get(number, []),
                                                       checks.get(number, [])))
            for number in sorted(titles)]


def stray_cells(nb):
    """A line for each exercise or check cell that is not one of the lab's own exercises."""
    return _exercise_cells(nb)[3]


def run_lab(path, timeout=120, kernel_name=None):
    """Execute a lab (in memory; the file is untouched) and grade its exercises."""
    from nbconvert.preprocessors import ExecutePreprocessor
    path = Path(path)
    report = LabReport(path.stem)
    try:
        nb = nbformat.read(path, as_version=4)
    except Exception as error:  # noqa: BLE001 — not JSON, not a notebook, unreadable
        report.broken = unreadable(path, error)
        return report
    try:
        grade(nb)             # broken metadata: say so before running anything
    except Exception as error:  # noqa: BLE001 — BrokenLab, or metadata edited oddly
        why = error if isinstance(error, BrokenLab) else _first_line(error)
        report.broken = f"cannot be graded: {why}"
        return report
    options = dict(timeout=timeout, allow_errors=True, interrupt_on_timeout=True,
                   # quiet the kernel's own log ("running over TCP without encryption")
                   extra_arguments=["--IPKernelApp.log_level=ERROR"])
    if kernel_name:
        options["kernel_name"] = kernel_name
    try:
        ExecutePreprocessor(**options).preprocess(nb, {"metadata": {"path": str(path.parent)}})
    except Exception as error:    # a dead kernel, a kernel that would not start, ...
        report.error = _first_line(error)
    report.exercises, report.strays = grade(nb), stray_cells(nb)
    return report


def _first_line(error):
    return (f"{type(error).__name__}: {error}".splitlines() or [""])[0]


def format_report(reports):
    """The per-exercise lines and the summary table, as text."""
    lines = []
    for report in reports:
        total = len(report.exercises)
        if report.broken:
            lines += [f"{report.name}: {report.broken}", ""]
            continue
        lines.append(f"{report.name}: {report.count(PASSED)}/{total} passed")
        if report.error:
            lines.append(f"  (the lab stopped early: {report.error})")
        if not report.exercises:
            lines.append("  no exercises found (is it a lab generated by workbook.labs?)")
        lines += [f"  ⚠️  {stray}" for stray in report.strays]
        for exercise in report.exercises:
            name = exercise.title or f"Exercise {exercise.number}"
            line = f"  {MARKS[exercise.status]} {exercise.number}. {name}"
            if exercise.status == NOT_STARTED:
                line += " (not started)"
            elif exercise.detail:
                line += f" — {exercise.detail}"
            lines.append(line)
        lines.append("")
    width = max([len("total")] + [len(report.name) for report in reports])
    header = f"{'lab':<{width}}  {'passed':>6}  {'failed':>6}  {'not started':>11}  {'total':>5}"
    lines += [header, "-" * len(header)]

    def row(name, counts):
        return f"{name:<{width}}  {counts[0]:>6}  {counts[1]:>6}  {counts[2]:>11}  " \
               f"{sum(counts):>5}"

    totals = [0, 0, 0]
    for report in reports:
        counts = [report.count(status) for status in STATUSES]
        totals = [a + b for a, b in zip(totals, counts)]
        lines.append(row(report.name, counts))
    lines += ["-" * len(header), row("total", totals)]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(
        prog="python -m workbook.progress",
        description="Run your labs and show which exercises pass.")
    parser.add_argument("labs", nargs="*", help="lab notebooks (default: labs/*.ipynb)")
    parser.add_argument("--timeout", type=int, default=120,
                        help="seconds a cell may run (default: %(default)s)")
    parser.add_argument("--kernel", default=None, help="kernel name (default: the lab's)")
    parser.add_argument("--json", metavar="FILE", default=None,
                        help="also write the results to FILE, to hand in to an instructor")
    parser.add_argument("--name", default=None,
                        help="your name in the --json file (default: your login name)")
    args = parser.parse_args(argv)
    paths = [Path(path) for path in args.labs] or sorted(Path("labs").glob("*.ipynb"))
    if not paths:
        print("no labs found: run this from the workbook's folder (it looks in labs/)",
              file=sys.stderr)
        return 2
    missing = [path for path in paths if not path.exists()]
    if missing:
        print(f"no such lab: {', '.join(map(str, missing))}", file=sys.stderr)
        return 2
    if hasattr(sys.stdout, "reconfigure"):   # ✅ on a console that is not UTF-8
        sys.stdout.reconfigure(errors="replace")
    reports = []
    for path in paths:
        print(f"running {path} ...", flush=True)
        reports.append(run_lab(path, timeout=args.timeout, kernel_name=args.kernel))
    print()
    print(format_report(reports))
    if args.json:
        from workbook import handin
        record = handin.write(args.json, reports, args.name)
        print(f"\nwrote {args.json} as {record['learner']!r} (learner id {record['id']}): "
              "hand it in to your instructor")
        if not args.name:
            print("  (to show another name: make progress JSON=... NAME=yourname)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
