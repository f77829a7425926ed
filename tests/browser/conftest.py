"""Fixtures for the tests in this folder: a JupyterLab server and a headless Chromium.

See _jupyter_lab.py for how each is started, and why nothing they do reaches the
repository or the learner's own JupyterLab settings.
"""

from pathlib import Path

import pytest

from _jupyter_lab import CHROMIUM, CHROMIUM_FLAGS, ENABLE, start_lab


@pytest.fixture(scope="module")
def lab_server(tmp_path_factory):
    """JupyterLab started by scripts/lab.sh, as `make lab` starts it; one per test module."""
    with start_lab(tmp_path_factory.mktemp("lab")) as server:
        yield server


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    """A headless Chromium with a fresh profile, as a Playwright browser context.

    Skipped, saying how to enable it, when Chromium or Playwright is missing.
    """
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no Chromium at {CHROMIUM}: to run the browser tests, {ENABLE}")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip(f"Playwright is not installed: to run the browser tests, {ENABLE}")
    with sync_playwright() as playwright:
        context = playwright.chromium.launch_persistent_context(
            str(tmp_path_factory.mktemp("chromium-profile")), executable_path=CHROMIUM,
            headless=True, args=CHROMIUM_FLAGS, viewport={"width": 1400, "height": 1000})
        try:
            yield context
        finally:
            context.close()
