"""Labs 08, 09 and 10 follow the progressive-hint rule of tests/test_hints.py: every
NotImplementedError is a nudge that names its checks.hint(...), which has steps to reveal."""

import pytest

from test_hints import (
    test_every_unwritten_exercise_is_a_nudge_pointing_to_its_progressive_hints as nudges)


@pytest.mark.parametrize("lab, package", [
    ("labs/08_memory_and_precision.ipynb", "workbook.lesson08_memory_and_precision"),
    ("labs/09_3d_parallelism.ipynb", "workbook.lesson09_3d_parallelism"),
    ("labs/10_failure_handling.ipynb", "workbook.lesson10_failure_handling"),
])
def test_labs_08_to_10_give_nudges_and_progressive_hints(lab, package):
    nudges(lab, package)
