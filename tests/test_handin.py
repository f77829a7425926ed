"""Progress files learners hand in (`progress --json`) and the instructor's tables
(`python -m workbook.handin FOLDER`)."""

import json

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
    assert rows[0] == "learner,lab,exercise,title,status,detail"
    assert "ada,02_gradient_aggregation,2,Step 2,failed,❌ wrong sum" in rows
    assert len(rows) == 1 + 3


@pytest.mark.parametrize("content, message", [
    ("[]", "not a progress file"),
    ('{"format": "%s", "labs": {}}' % handin.FORMAT, "malformed"),
    ('{"format": "%s", "labs": [{"name": "x", "exercises": [{"status": "done"}]}]}'
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
