"""What the tests of every lesson's checks share: reading a check's one printed line, and
a learner's own copy of a reference answer."""

import inspect


def line(capsys, check, *args):
    """Run ``check(*args)``; return (result, the one line it printed)."""
    result = check(*args)
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert len(lines) == 1, out
    assert result is lines[0].startswith("✅")
    return result, lines[0]


def learner_namespace(reference_module, *references):
    """The reference answers as a learner would type them: the same source, compiled as
    their own code (so that the checks do not refuse them as the workbook's)."""
    namespace = dict(vars(reference_module))
    for reference in references:
        exec(compile(inspect.getsource(reference), "<learner>", "exec"), namespace)
    return namespace
