"""How `make test` spreads the tests over its pytest-xdist workers.

`make test` runs ``pytest -n JOBS --dist loadfile tests``: a test module runs whole in one
worker, as in a serial run, so its module-scoped fixtures (a trained model, a planner
sweep, a JupyterLab server) are built once, not once per worker, and its tests run in
file order. Two additions here:

- The browser tests (tests/browser) count as one file: one worker runs them one module
  after the other, so two JupyterLab servers and two Chromiums never compete for the
  cores while their UI waits count down. (xdist's own ``--dist loadgroup`` would do this
  with ``xdist_group`` marks, but pytest-xdist 3.8 cannot tag the node ids of pytest 9,
  and the marks are silently ignored.)
- Under xdist, the browser tests and then the modules with a test marked ``slow`` are
  handed out first (largest first), so that a long module does not start last while the
  other workers sit idle. A module's own tests keep their order.

Without xdist (a plain ``pytest``) neither does anything.
"""

from pathlib import Path

import pytest

BROWSER = "tests/browser/"


def scope(nodeid):
    """The unit of work that one worker runs whole: the test's file, or the browser tests."""
    path = nodeid.split("::", 1)[0]
    return BROWSER if path.startswith(BROWSER) else path


def pytest_xdist_make_scheduler(config, log):
    if config.getvalue("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    config.option.loadscopereorder = False      # keep the order set below

    class BrowserAsOneFile(LoadFileScheduling):
        def _split_scope(self, nodeid):
            return scope(nodeid)

    return BrowserAsOneFile(config, log)


def pytest_collection_modifyitems(config, items):
    if not hasattr(config, "workerinput"):       # not an xdist worker
        return
    scopes = [scope(item.nodeid) for item in items]
    slow = {scopes[index] for index, item in enumerate(items) if item.get_closest_marker("slow")}
    size = {name: scopes.count(name) for name in set(scopes)}

    def key(index):
        """Browser tests, then modules with a slow test, then the others; within each, the
        modules with the most tests first (xdist's own order), then collection order."""
        name = scopes[index]
        return (0 if name == BROWSER else 1 if name in slow else 2), -size[name], index

    order = sorted(range(len(items)), key=key)
    items[:] = [items[index] for index in order]


@pytest.fixture
def short_timeout(monkeypatch):
    """The checks' loop guards, short: a learner's endless loop in a test is stopped after
    2 CPU seconds (5 with accounting, where a correct answer of lab 08 needs a few),
    not after the 15 a learner gets. CPU seconds: a busy machine does not stretch them."""
    from workbook import checking

    monkeypatch.setattr(checking, "TIMEOUT", 2.0)
    monkeypatch.setattr(checking, "ACCOUNTING_TIMEOUT", 5.0)
