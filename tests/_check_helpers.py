"""What the tests of every lesson's checks share: reading a check's one printed line, and
a learner's own copy of a reference answer or a wrong answer written from source."""

import inspect


def line(capsys, check, *args):
    """Run ``check(*args)``; return (result, the one line it printed)."""
    result = check(*args)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1, out
    assert result is lines[0].startswith("✅")
    return result, lines[0]


def fails(capsys, check, answer, *parts):
    """The check prints one ❌ line containing every one of ``parts``."""
    result, text = line(capsys, check, answer)
    assert not result and text.startswith("❌"), text
    for part in parts:
        assert part in text, text
    return text


def not_started(capsys, check, answer, name, hint):
    """The check, on an exercise that still raises the lab's NotImplementedError(hint),
    says ⬜ not started (as `make progress` does), then the whole hint, wrapped."""
    from workbook.checking import not_started_text
    result = check(*answer) if isinstance(answer, tuple) else check(answer)
    out = capsys.readouterr().out
    assert result is False, out
    assert out == not_started_text(name, hint) + "\n", out
    first, *rest = out.splitlines()
    assert first.startswith(f"⬜ {name}: not started — "), out
    assert " ".join(line.strip() for line in rest) == f"Hint: {hint}", out
    return out


def write_learner(source, namespace):
    """A learner's classes or functions, written from ``source`` in a copy of
    ``namespace`` (the names a lab cell would see); returns that namespace."""
    namespace = dict(namespace)
    exec(compile(source, "<learner>", "exec"), namespace)
    return namespace


def learner_namespace(reference_module, *references):
    """The reference answers as a learner would type them: the same source, compiled as
    their own code (so that the checks do not refuse them as the workbook's)."""
    namespace = dict(vars(reference_module))
    for reference in references:
        exec(compile(inspect.getsource(reference), "<learner>", "exec"), namespace)
    return namespace
