"""Progress files learners hand in (`progress --json`) and the instructor's tables
(`python -m workbook.handin FOLDER`)."""

import json
import os
import threading

import pytest

from workbook import handin, progress
from workbook.progress import FAILED, NOT_STARTED, PASSED, Exercise, LabReport


def _reports(*statuses):
    lab = LabReport("02_gradient_aggregation", [
        Exercise(i + 1, f"Step {i + 1}", status, "❌ wrong sum" if status == FAILED else "")
        for i, status in enumerate(statuses)])
    return [lab, LabReport("03_data_parallel", [Exercise(1, "DDP by hand", NOT_STARTED)])]


def test_progress_json_writes_a_file_to_hand_in(tmp_path, monkeypatch, capsys):
    lab = tmp_path / "02_gradient_aggregation.ipynb"
    lab.write_text("{}")
    monkeypatch.setattr(progress, "run_lab", lambda path, **kw: _reports(PASSED, FAILED)[0])
    out = tmp_path / "ada.json"
    assert progress.main([str(lab), "--json", str(out), "--name", "ada"]) == 0
    assert f"wrote {out}" in capsys.readouterr().out
    record = json.loads(out.read_text(encoding="utf-8"))
    assert record["format"] == handin.FORMAT and record["learner"] == "ada"
    exercises = record["labs"][0]["exercises"]
    assert [e["status"] for e in exercises] == [PASSED, FAILED]
    assert exercises[1]["detail"] == "❌ wrong sum"
    assert handin.load(out)["labs"][0]["name"] == "02_gradient_aggregation"


def test_a_folder_becomes_one_table_per_lab(tmp_path):
    handin.write(tmp_path / "ada.json", _reports(PASSED, PASSED, FAILED), "ada")
    handin.write(tmp_path / "bob.json", _reports(PASSED, NOT_STARTED, NOT_STARTED), "bob")
    (tmp_path / "notes.json").write_text('{"hello": 1}')       # someone's other file
    (tmp_path / "broken.json").write_text('{"format": ')
    skipped = []
    records = handin.collect(tmp_path, log=skipped.append)
    assert sorted(r["learner"] for r in records) == ["ada", "bob"]
    assert len(skipped) == 2 and any("not a progress file" in s for s in skipped)
    text = handin.format_tables(records)
    lab02 = text.split("03_data_parallel")[0]
    assert "02_gradient_aggregation  (2 learner(s))" in lab02
    ada = next(line for line in lab02.splitlines() if line.startswith("ada"))
    bob = next(line for line in lab02.splitlines() if line.startswith("bob"))
    assert ada.split()[1:] == ["✅", "✅", "❌", "2/3"]
    assert bob.split()[1:] == ["✅", "⬜", "⬜", "1/3"]
    passed_row = next(line for line in lab02.splitlines() if "passed" in line and "✅" in line)
    assert passed_row.split()[-3:] == ["2", "1", "0"]      # passes per exercise
    assert "03_data_parallel  (2 learner(s))" in text


def test_the_command_and_its_csv(tmp_path, capsys):
    handin.write(tmp_path / "ada.json", _reports(PASSED, FAILED), "ada")
    assert handin.main([str(tmp_path), "--csv"]) == 0
    rows = capsys.readouterr().out.strip().splitlines()
    learner_id = handin.load(tmp_path / "ada.json")["id"]
    assert rows[0] == "learner,id,file,lab,exercise,title,status,detail"
    assert f"ada,{learner_id},ada.json,02_gradient_aggregation,2,Step 2,failed,❌ wrong sum" \
        in rows
    assert len(rows) == 1 + 3


@pytest.mark.parametrize("content, message", [
    ("[]", "not a progress file"),
    ('{"format": "%s", "labs": {}}' % handin.FORMAT, "malformed"),
    ('{"format": "%s", "labs": [{"name": "x", "exercises": [{"number": 1, "status": "done"}]}]}'
     % handin.FORMAT, "valid status"),
    ("\xff\xfe", "not readable"),
])
def test_bad_files_are_named(tmp_path, content, message):
    path = tmp_path / "x.json"
    path.write_bytes(content.encode("latin-1"))
    with pytest.raises(ValueError, match=message):
        handin.load(path)


def test_an_empty_folder_says_so(tmp_path, capsys):
    assert handin.main([str(tmp_path)]) == 1
    assert "no progress files found" in capsys.readouterr().out


def _lab02_rows(text):
    """The learner rows of lab 02's table."""
    table = text.split("03_data_parallel")[0].splitlines()
    start = next(i for i, line in enumerate(table) if line.startswith("---"))
    end = next(i for i, line in enumerate(table) if i > start and line.startswith("---"))
    return table[start + 1:end]


def test_learners_who_share_a_name_are_never_merged(tmp_path):
    # Everyone in the Docker image is "learner": four files once gave "3 learner(s)".
    for name, statuses in [("a", (PASSED, PASSED)), ("b", (FAILED, PASSED)),
                           ("c", (NOT_STARTED, FAILED)), ("d", (FAILED, FAILED))]:
        handin.write(tmp_path / f"{name}.json", _reports(*statuses), "learner")
    records = handin.collect(tmp_path)
    assert len({record["id"] for record in records}) == 4
    text = handin.format_tables(records)
    assert "02_gradient_aggregation  (4 learner(s))" in text
    rows = _lab02_rows(text)
    assert [row.split()[:2] for row in rows] == [["learner", f"[{n}.json]"] for n in "abcd"]
    assert rows[3].split()[2:] == ["❌", "❌", "0/2"]     # d's ❌ is not turned ✅ by a's ✅


def test_a_name_that_mimics_another_label_gets_its_own_row(tmp_path):
    handin.write(tmp_path / "a.json", _reports(PASSED, PASSED), "learner")
    handin.write(tmp_path / "b.json", _reports(FAILED, FAILED), "learner")
    handin.write(tmp_path / "c.json", _reports(FAILED, NOT_STARTED), "learner [a.json]")
    text = handin.format_tables(handin.collect(tmp_path))
    assert "02_gradient_aggregation  (3 learner(s))" in text
    assert sorted(row.split()[-1] for row in _lab02_rows(text)) == ["0/2", "0/2", "2/2"]


def test_handing_in_again_keeps_the_learner_id(tmp_path):
    first = handin.write(tmp_path / "ada.json", _reports(FAILED), "ada")
    again = handin.write(tmp_path / "ada.json", _reports(PASSED), "ada")
    other = handin.write(tmp_path / "bob.json", _reports(PASSED), "ada")
    assert first["id"] == again["id"] != other["id"]


def test_two_files_with_one_id_are_named_and_kept_apart(tmp_path):
    handin.write(tmp_path / "ada.json", _reports(PASSED), "ada")
    (tmp_path / "copy.json").write_text((tmp_path / "ada.json").read_text())
    skipped = []
    records = handin.collect(tmp_path, log=skipped.append)
    assert len(records) == 2 and len(skipped) == 1
    assert "ada.json, copy.json carry the same learner id" in skipped[0]
    assert "(2 learner(s))" in handin.format_tables(records)


def test_a_newline_in_a_name_forges_no_row(tmp_path, capsys):
    handin.write(tmp_path / "eve.json", _reports(FAILED, FAILED),
                 "eve\nmallory   ✅  ✅  2/2")
    record = json.loads((tmp_path / "eve.json").read_text())
    record["learner"] = "eve\r\nbob      ✅  ✅  2/2\x1b[2K"     # as written by hand
    (tmp_path / "eve.json").write_text(json.dumps(record))
    handin.write(tmp_path / "bob.json", _reports(FAILED, FAILED), "bob")
    assert handin.main([str(tmp_path)]) == 0
    rows = _lab02_rows(capsys.readouterr().out)
    assert len(rows) == 2 and all(row.endswith("0/2") for row in rows)
    assert not any("\x1b" in row for row in rows)


MALFORMED = {
    "labs_not_a_list": {"labs": {}},
    "lab_not_an_object": {"labs": [7]},
    "lab_without_exercises": {"labs": [{"name": "02"}]},
    "lab_name_not_a_string": {"labs": [{"name": ["02"], "exercises": []}]},
    "exercise_not_an_object": {"labs": [{"name": "02", "exercises": ["passed"]}]},
    "exercise_without_number": {"labs": [{"name": "02", "exercises": [{"status": PASSED}]}]},
    "number_of_wrong_type": {"labs": [{"name": "02", "exercises": [
        {"number": [1], "status": PASSED}]}]},
    "number_a_bool": {"labs": [{"name": "02", "exercises": [{"number": True,
                                                             "status": PASSED}]}]},
    "number_huge": {"labs": [{"name": "02", "exercises": [{"number": 10 ** 30,
                                                           "status": PASSED}]}]},
    "status_unhashable": {"labs": [{"name": "02", "exercises": [{"number": 1,
                                                                 "status": [PASSED]}]}]},
    "title_not_a_string": {"labs": [{"name": "02", "exercises": [
        {"number": 1, "status": PASSED, "title": {"a": 1}}]}]},
    "learner_not_a_string": {"learner": ["ada"], "labs": []},
    "id_not_a_string": {"id": 5, "labs": []},
}


@pytest.mark.parametrize("name", MALFORMED)
def test_a_malformed_field_is_named_and_skipped(tmp_path, name):
    (tmp_path / "bad.json").write_text(json.dumps({"format": handin.FORMAT,
                                                   **MALFORMED[name]}))
    handin.write(tmp_path / "ada.json", _reports(PASSED), "ada")
    skipped = []
    records = handin.collect(tmp_path, log=skipped.append)
    assert [record["learner"] for record in records] == ["ada"]
    assert len(skipped) == 1 and "bad.json" in skipped[0], skipped
    handin.format_tables(records)


@pytest.mark.parametrize("content, message", [
    ('[' * 100_000 + ']' * 100_000, "nested too deeply"),         # RecursionError
    ('{"format": "%s", "labs": [{"name": "x", "exercises": [{"number": %s, '
     '"status": "passed"}]}]}' % (handin.FORMAT, "9" * 5000), "not readable as JSON"),
    ('{"format": "%s", "labs": [{"name": "x", "exercises": [{"number": 1e999, '
     '"status": "passed"}]}]}' % handin.FORMAT, "is float, not int"),
    ('"%s"' % handin.FORMAT, "not a progress file"),               # not a dict at the top
    ("{}", "not a progress file"),                                   # no keys at all
])
def test_hostile_json_is_named_and_skipped(tmp_path, content, message):
    (tmp_path / "bad.json").write_text(content)
    skipped = []
    assert handin.collect(tmp_path, log=skipped.append) == []
    assert len(skipped) == 1 and message in skipped[0], skipped


def test_non_utf8_bytes_are_named(tmp_path):
    (tmp_path / "bad.json").write_bytes(b'{"format": "\xff\xfe"}')
    with pytest.raises(ValueError, match="not readable as JSON"):
        handin.load(tmp_path / "bad.json")


def test_a_huge_file_is_refused_unread(tmp_path):
    (tmp_path / "big.json").write_bytes(b" " * (handin.MAX_BYTES + 1))
    with pytest.raises(ValueError, match="larger than"):
        handin.load(tmp_path / "big.json")


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_a_fifo_or_a_folder_named_json_does_not_block(tmp_path):
    os.mkfifo(tmp_path / "pipe.json")
    (tmp_path / "folder.json").mkdir()
    handin.write(tmp_path / "ada.json", _reports(PASSED), "ada")
    skipped, result = [], []
    worker = threading.Thread(target=lambda: result.append(
        handin.collect(tmp_path, log=skipped.append)), daemon=True)
    worker.start()
    worker.join(10)
    if worker.is_alive():                  # unblock the reader so the test run can end
        with open(tmp_path / "pipe.json", "w"):
            pass
        pytest.fail("collect() blocked on a FIFO")
    assert [record["learner"] for record in result[0]] == ["ada"]
    assert sorted(skipped) == sorted([f"skipped {tmp_path / 'folder.json'}: not a regular file",
                                      f"skipped {tmp_path / 'pipe.json'}: not a regular file"])
