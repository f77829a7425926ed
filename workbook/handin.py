"""Progress a learner hands in, and the instructor's table of everyone's.

A learner runs ``python -m workbook.progress --json progress.json`` (``make progress
JSON=progress.json``) and hands in the file; it holds, per lab and exercise, passed /
failed / not started and the first ❌ line, and nothing of the learner's code. The
instructor collects the files in a folder and runs

    python -m workbook.handin FOLDER          # one table per lab: learners × exercises
    python -m workbook.handin FOLDER --csv    # the same as CSV, one row per learner and exercise

Each file carries a learner id, generated when the learner first writes it and kept when
they write it again, besides the name they give (``make progress JSON=progress.json
NAME=ada``; their login name otherwise, which in a container is the same for everyone).
Learners are never merged: every file is its own row; learners who share a name are told
apart by their file names, and files that share an id (handed in twice?) are named.

A file that is not a progress file (wrong types, missing fields, not UTF-8 JSON, too
large or too deeply nested, not a regular file at all) is named and skipped, never a crash.
"""

import argparse
import csv
import getpass
import json
import os
import secrets
import stat
import sys
from datetime import datetime, timezone
from pathlib import Path

from workbook.progress import MARKS, PASSED, STATUSES

FORMAT = "simcluster-workbook-progress/1"
MAX_BYTES = 4 * 2 ** 20        # a progress file of all 13 labs is about 10 KiB
MAX_NAME = 40                  # characters of a learner's name shown in the tables
MAX_EXERCISE = 1000            # exercise numbers are small; anything above is forged


def new_id():
    """A learner id two people will not share (64 random bits, as hex)."""
    return secrets.token_hex(8)


def _previous_id(path):
    """The learner id in the progress file already at ``path``, if there is a good one."""
    try:
        return load(path)["id"] or None
    except ValueError:
        return None


def to_dict(reports, learner, learner_id=None):
    """The JSON-ready record of ``reports`` (:class:`workbook.progress.LabReport`)."""
    return {
        "format": FORMAT,
        "learner": learner,
        "id": learner_id or new_id(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "labs": [{"name": report.name, "error": report.error or report.broken,
                  "exercises": [{"number": e.number, "title": e.title, "status": e.status,
                                 "detail": e.detail} for e in report.exercises]}
                 for report in reports],
    }


def write(path, reports, learner=None):
    """Write the hand-in file for ``reports`` to ``path``, keeping the learner id of the
    file already there (so handing in again is the same learner); return the record."""
    record = to_dict(reports, clean(learner or getpass.getuser()), _previous_id(path))
    Path(path).write_text(json.dumps(record, indent=1, ensure_ascii=False) + "\n",
                          encoding="utf-8")
    return record


def clean(text, limit=None):
    """``text`` with control characters (a newline would forge a row) shown as ``?``,
    cut to ``limit`` characters."""
    text = "".join(char if char.isprintable() else "?" for char in text)
    return text if limit is None or len(text) <= limit else text[:limit - 1] + "…"


def _read(path):
    """The bytes of ``path``, opened without blocking (a FIFO would wait for a writer);
    ValueError unless it is a regular file of at most MAX_BYTES."""
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    except OSError as error:
        raise ValueError(f"{path}: not readable ({error.strerror})") from None
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{path}: not a regular file")
    with os.fdopen(fd, "rb") as file:
        data = file.read(MAX_BYTES + 1)
    if len(data) > MAX_BYTES:
        raise ValueError(f"{path}: larger than {MAX_BYTES // 2 ** 20} MiB, not a progress "
                         "file")
    return data


def _get(mapping, key, kind, where, default=None):
    """``mapping[key]`` if it is a ``kind`` (an int is never a bool), ``default`` when it
    is absent and a default is given; ValueError naming ``where`` and ``key`` otherwise."""
    if key not in mapping and default is not None:
        return default
    value = mapping.get(key)
    if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
        problem = "missing" if key not in mapping else \
            f"{type(value).__name__}, not {kind.__name__}"
        raise ValueError(f"{where}: \"{key}\" is {problem}")
    return value


def _exercise(item, where):
    """A clean exercise record from one of a file's exercises."""
    if not isinstance(item, dict):
        raise ValueError(f"{where}: an exercise is not an object")
    number = _get(item, "number", int, where)
    if not 0 <= number <= MAX_EXERCISE:
        raise ValueError(f"{where}: exercise number {number} is out of range")
    status = item.get("status")
    if status not in STATUSES:
        raise ValueError(f"{where}: exercise {number} has no valid status")
    return {"number": number, "title": clean(_get(item, "title", str, where, ""), 80),
            "status": status, "detail": clean(_get(item, "detail", str, where, ""), 200)}


def _lab(item, where):
    """A clean lab record from one of a file's labs."""
    if not isinstance(item, dict):
        raise ValueError(f"{where}: a lab is not an object")
    name = clean(_get(item, "name", str, where), 80)
    exercises = _get(item, "exercises", list, f"{where}: lab {name}")
    return {"name": name, "error": clean(_get(item, "error", str, where, ""), 200),
            "exercises": [_exercise(e, f"{where}: lab {name}") for e in exercises]}


def load(path):
    """A clean hand-in record read from ``path``; ValueError saying what is wrong otherwise.

    The record is rebuilt field by field with the types checked, so nothing a hand-written
    file holds can crash the tables or forge a row; it also gets ``file``, the file's name."""
    path = Path(path)
    data = _read(path)
    try:
        record = json.loads(data.decode("utf-8"))
    except (ValueError, RecursionError) as error:  # UnicodeDecodeError is a ValueError too
        reason = "nested too deeply" if isinstance(error, RecursionError) else error
        raise ValueError(f"{path}: not readable as JSON ({reason})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT:
        raise ValueError(f"{path}: not a progress file (no \"format\": \"{FORMAT}\")")
    labs = record.get("labs")
    if not isinstance(labs, list):
        raise ValueError(f"{path}: its \"labs\" are malformed")
    return {"format": FORMAT, "file": path.name,
            "learner": clean(_get(record, "learner", str, path, ""), MAX_NAME) or path.stem,
            "id": clean(_get(record, "id", str, path, ""), 32),
            "labs": [_lab(lab, str(path)) for lab in labs]}


def collect(folder, log=print):
    """Every hand-in record in ``folder`` (``*.json``); bad files and learner ids found in
    more than one file are logged."""
    records = []
    for path in sorted(Path(folder).glob("*.json")):
        try:
            records.append(load(path))
        except ValueError as error:
            log(f"skipped {error}")
    files = {}
    for record in records:
        if record["id"]:
            files.setdefault(record["id"], []).append(record["file"])
    for learner_id, names in files.items():
        if len(names) > 1:
            log(f"{', '.join(names)} carry the same learner id {learner_id} (handed in "
                "twice, or a copied file?): shown as separate rows")
    return records


def labels(records):
    """The row label of each record: its learner's name, and its file's name too when
    another record has the same name (everyone in the Docker image is "learner")."""
    counts = {}
    for record in records:
        counts[record["learner"]] = counts.get(record["learner"], 0) + 1
    return [record["learner"] if counts[record["learner"]] == 1
            else f"{record['learner']} [{record['file']}]" for record in records]


def tables(records):
    """``{lab: (exercise columns, {(row label, record index): {exercise number: status}})}``:
    a row per record (see :func:`labels`), never two records in one row, even when a name
    is written to look like another row's label."""
    result = {}
    for index, (record, label) in enumerate(zip(records, labels(records))):
        for lab in record["labs"]:
            columns, rows = result.setdefault(lab["name"], ({}, {}))
            row = rows.setdefault((label, index), {})
            for exercise in lab["exercises"]:
                columns.setdefault(exercise["number"], exercise["title"])
                row[exercise["number"]] = exercise["status"]
    return result


def format_tables(records):
    """One table per lab: a row per learner, a column per exercise, ✅ ❌ ⬜; then counts."""
    lines = []
    for lab, (columns, rows) in sorted(tables(records).items()):
        numbers = sorted(columns)
        width = max([len("learner")] + [len(name) for name, _ in rows])
        lines.append(f"{lab}  ({len(rows)} learner(s))")
        for number in numbers:
            lines.append(f"  {number}. {columns[number] or f'Exercise {number}'}")
        header = f"{'learner':<{width}}  " + "  ".join(f"{n:>2}" for n in numbers) + \
                 "  passed"
        lines += [header, "-" * len(header)]
        for key in sorted(rows):
            marks = [MARKS.get(rows[key].get(n), " ·") for n in numbers]
            passed = sum(rows[key].get(n) == PASSED for n in numbers)
            lines.append(f"{key[0]:<{width}}  " + "  ".join(f"{m:>2}" for m in marks) +
                         f"  {passed:>3}/{len(numbers)}")
        lines.append("-" * len(header))
        for status in STATUSES:
            counts = [sum(row.get(n) == status for row in rows.values()) for n in numbers]
            label = f"{MARKS[status]} {status}"
            lines.append(f"{label:<{width}} " + "  ".join(f"{c:>2}" for c in counts))
        lines.append("")
    return "\n".join(lines) if lines else "no progress files found"


def write_csv(records, out):
    """One CSV row per learner, lab and exercise; the learner id and the file tell
    learners who share a name apart."""
    writer = csv.writer(out)
    writer.writerow(["learner", "id", "file", "lab", "exercise", "title", "status", "detail"])
    for record in records:
        for lab in record["labs"]:
            for exercise in lab["exercises"]:
                writer.writerow([record["learner"], record["id"], record["file"], lab["name"],
                                 exercise["number"], exercise["title"], exercise["status"],
                                 exercise["detail"]])


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
