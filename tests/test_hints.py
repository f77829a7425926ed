"""workbook.hints: progressive help, one more step per call."""

import pytest

from workbook.hints import Hints


def test_each_call_reveals_one_more_step_and_says_how_to_see_the_next(capsys):
    hint = Hints({"buckets": ["think about A", "then B", "then C"]})
    assert hint("buckets") is None and hint.shown["buckets"] == 1   # no "Out: 1" in a cell
    out = capsys.readouterr().out
    assert "think about A" in out and "then B" not in out
    assert "checks.hint('buckets') again for step 2" in out
    hint("buckets")
    assert hint.shown["buckets"] == 2
    out = capsys.readouterr().out
    assert "then B" in out and "then C" not in out
    hint("buckets"), hint("buckets")
    assert hint.shown["buckets"] == 3   # stays at the last step
    out = capsys.readouterr().out
    assert "then C" in out and "again" not in out


def test_all_shows_every_step_and_reset_starts_over(capsys):
    hint = Hints({"x": ["one", "two"]})
    hint("x", all=True)
    assert hint.shown["x"] == 2
    hint.reset()
    hint("x")
    assert hint.shown["x"] == 1


def test_an_unknown_exercise_names_the_known_ones_and_empty_steps_are_refused():
    hint = Hints({"x": ["one"]})
    with pytest.raises(KeyError, match="'x'"):
        hint("y")
    with pytest.raises(ValueError):
        Hints({"x": []})
    with pytest.raises(ValueError):
        Hints({"x": ["  "]})


def test_pointer_names_the_call_a_failure_line_sends_the_learner_to():
    assert Hints({"x": ["one"]}).pointer("x") == "more help: checks.hint('x')"


@pytest.mark.parametrize("lab, package", [
    ("labs/03_data_parallel.ipynb", "workbook.lesson03_data_parallel"),
    ("labs/04_model_parallel.ipynb", "workbook.lesson04_model_parallel"),
    ("labs/05_pipeline_parallel.ipynb", "workbook.lesson05_pipeline_parallel"),
    ("labs/06_tensor_parallel.ipynb", "workbook.lesson06_tensor_parallel"),
    ("labs/07_zero_fsdp.ipynb", "workbook.lesson07_zero_fsdp"),
])
def test_every_unwritten_exercise_is_a_nudge_pointing_to_its_progressive_hints(lab, package):
    # The lab's NotImplementedError messages are one nudge each, not the code: each names
    # the checks.hint(...) that reveals more, and that exercise has steps to reveal.
    import importlib
    import re
    from pathlib import Path

    import nbformat

    checks = importlib.import_module(f"{package}.checks")
    root = Path(__file__).resolve().parent.parent
    notebook = nbformat.read(root / lab, as_version=4)
    sources = [c.source for c in notebook.cells if "raise NotImplementedError" in c.source]
    assert sources
    for source in sources:
        for message in re.findall(r'raise NotImplementedError\((.*?)\)\n', source, re.S):
            named = re.findall(r'checks\.hint\(\\?"(\w+)\\?"\)', message)
            assert named, message
            assert all(len(checks.hint.steps[name]) >= 2 for name in named)
            for code in ("torch.cat", "dist.all_reduce(", "new_empty", "slice(", ".clone()",
                         "F.linear("):
                assert code not in message, message
