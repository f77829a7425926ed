"""How `make test` spreads the tests over its pytest-xdist workers.

`make test` runs ``pytest -n JOBS --dist loadgroup tests``. Every test gets an
``xdist_group`` here, so that:

- a test module runs whole in one worker, as in a serial run: its module-scoped fixtures
  (a trained model, a planner sweep, a JupyterLab server) are built once, not once per
  worker, and its tests run in file order;
- the browser tests (tests/browser) all share one group, so one worker runs them one
  module after the other: two JupyterLab servers and two Chromiums never compete for the
  cores while their UI waits count down.

A test that sets its own ``xdist_group`` keeps it. Without xdist (a plain ``pytest``) the
marks do nothing.
"""

from pathlib import Path

import pytest

BROWSER = Path(__file__).resolve().parent / "browser"


def xdist_group(path):
    """The xdist group of a test in the file ``path``: "browser", or the module's path."""
    path = Path(path).resolve()
    if BROWSER in path.parents:
        return "browser"
    return path.relative_to(Path(__file__).resolve().parents[1]).as_posix()


@pytest.hookimpl(tryfirst=True)   # before xdist reads the marks
def pytest_collection_modifyitems(items):
    for item in items:
        if item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(xdist_group(item.path)))
