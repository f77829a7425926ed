"""Progress a learner hands in, and the instructor's table of everyone's.

A learner runs ``python -m workbook.progress --json progress.json`` (``make progress
JSON=progress.json``) and hands in the file; it holds, per lab and exercise, passed /
failed / not started and the first ❌ line, and nothing of the learner's code. The
instructor collects the files in a folder and runs

    python -m workbook.handin FOLDER          # one table per lab: learners × exercises
    python -m workbook.handin FOLDER --csv    # the same as CSV, one row per learner and exercise

A file that is not a progress file is named and skipped, never a crash.
"""

import argparse
import csv
import getpass
import json
import sys
from datetime import datetime, timezone
from pathlib import Path

from workbook.progress import MARKS, PASSED, STATUSES

FORMAT = "simcluster-workbook-progress/1"


def to_dict(reports, learner):
    """The JSON-ready record of ``reports`` (:class:`workbook.progress.LabReport`)."""
    return {
        "format": FORMAT,
        "learner": learner,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "labs": [{"name": report.name, "error": report.error or report.broken,
                  "exercises": [{"number": e.number, "title": e.title, "status": e.status,
                                 "detail": e.detail} for e in report.exercises]}
                 for report in reports],
    }


def write(path, reports, learner=None):
    """Write the hand-in file for ``reports`` to ``path``; return the record."""
    record = to_dict(reports, learner or getpass.getuser())
    Path(path).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n",
                          encoding="utf-8")
    return record


def load(path):
    """A hand-in record read from ``path``; ValueError saying what is wrong otherwise."""
    try:
        record = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not readable as JSON ({error})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path}: not a progress file (no \"format\": \"{FORMAT}\")")
    labs = record.get("labs")
    if not isinstance(labs, list) or not all(
            isinstance(lab, dict) and isinstance(lab.get("exercises"), list) for lab in labs):
        raise ValueError(f"{path}: its \"labs\" are malformed")
    for lab in labs:
        for exercise in lab["exercises"]:
            if not isinstance(exercise, dict) or exercise.get("status") not in STATUSES:
                raise ValueError(f"{path}: lab {lab.get('name')}: an exercise without a "
                                 "valid status")
    record.setdefault("learner", Path(path).stem)
    return record


def collect(folder, log=print):
    """Every hand-in record in ``folder`` (``*.json``), by learner; bad files are logged."""
    records = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            records.append(load(path))
        except ValueError as error:
            log(f"skipped {error}")
    return records


def tables(records):
    """``{lab: (exercise columns, {learner: {exercise number: status}})}``."""
    result = {}
    for record in records:
        for lab in record["labs"]:
            columns, rows = result.setdefault(lab["name"], ({}, {}))
            row = rows.setdefault(str(record["learner"]), {})
            for exercise in lab["exercises"]:
                columns.setdefault(exercise["number"], exercise.get("title", ""))
                row[exercise["number"]] = exercise["status"]
    return result


def format_tables(records):
    """One table per lab: a row per learner, a column per exercise, ✅ ❌ ⬜; then counts."""
    lines = []
    for lab, (columns, rows) in sorted(tables(records).items()):
        numbers = sorted(columns)
        width = max([len("learner")] + [len(name) for name in rows])
        lines.append(f"{lab}  ({len(rows)} learner(s))")
        for number in numbers:
            lines.append(f"  {number}. {columns[number] or f'Exercise {number}'}")
        header = f"{'learner':<{width}}  " + "  ".join(f"{n:>2}" for n in numbers) + \
                 "  passed"
        lines += [header, "-" * len(header)]
        for learner in sorted(rows):
            marks = [MARKS.get(rows[learner].get(n), " ·") for n in numbers]
            passed = sum(rows[learner].get(n) == PASSED for n in numbers)
            lines.append(f"{learner:<{width}}  " + "  ".join(f"{m:>2}" for m in marks) +
                         f"  {passed:>3}/{len(numbers)}")
        lines.append("-" * len(header))
        for status in STATUSES:
            counts = [sum(row.get(n) == status for row in rows.values()) for n in numbers]
            label = f"{MARKS[status]} {status}"
            lines.append(f"{label:<{width}} " + "  ".join(f"{c:>2}" for c in counts))
        lines.append("")
    return "\n".join(lines) if lines else "no progress files found"


def write_csv(records, out):
    """One CSV row per learner, lab and exercise."""
    writer = csv.writer(out)
    writer.writerow(["learner", "lab", "exercise", "title", "status", "detail"])
    for record in records:
        for lab in record["labs"]:
            for exercise in lab["exercises"]:
                writer.writerow([record["learner"], lab["name"], exercise["number"],
                                 exercise.get("title", ""), exercise["status"],
                                 exercise.get("detail", "")])


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m workbook.handin",
                                     description="Tables of the progress files learners "
                                                 "handed in.")
    parser.add_argument("folder", help="a folder of progress files (*.json)")
    parser.add_argument("--csv", action="store_true", help="print CSV instead of tables")
    args = parser.parse_args(argv)
    if not Path(args.folder).is_dir():
        parser.error(f"{args.folder} is not a folder")
    if hasattr(sys.stdout, "reconfigure"):
        sys.stdout.reconfigure(errors="replace")
    records = collect(args.folder, log=lambda text: print(text, file=sys.stderr))
    if args.csv:
        write_csv(records, sys.stdout)
    else:
        print(format_tables(records))
    return 0 if records else 1


if __name__ == "__main__":
    sys.exit(main())
