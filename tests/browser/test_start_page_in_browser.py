"""What `make lab` shows first, in a real browser: the start page, rendered, without
JupyterLab's news prompt, and its links open the lessons and labs inside JupyterLab."""

import pytest

pytestmark = pytest.mark.slow

UI_TIMEOUT = 60_000   # ms for JupyterLab to show something


@pytest.fixture(scope="module")
def page(browser, lab_server, tmp_path_factory):
    page = browser.new_page()
    page.set_default_timeout(UI_TIMEOUT)
    errors = []
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.goto(f"{lab_server.url}/?token={lab_server.token}")   # where `make lab` sends you
    page.locator(".jp-RenderedMarkdown h1", has_text="Start here").first.wait_for()
    page.locator(".jp-StatusBar-TextItem", has_text="Idle").first.wait_for()
    page.wait_for_timeout(2000)   # the news prompt, if any, comes once the page has restored
    shots = tmp_path_factory.mktemp("screenshots")
    page.screenshot(path=str(shots / "start.png"))
    yield page
    page.screenshot(path=str(shots / "end.png"))
    page.close()
    assert not errors, errors


def test_the_start_page_opens_rendered_without_the_news_prompt(page):
    assert page.locator(".jp-RenderedMarkdown table a", has_text="Data parallelism").count() == 1
    assert page.locator(".jp-RenderedMarkdown table a", has_text="lab 05").count() == 1
    assert page.get_by_text("official Jupyter news").count() == 0
    # no raw markdown on the page: the heading's "#" and the table's "|---" are rendered
    assert "|---" not in page.locator(".jp-Notebook").inner_text()


def test_a_link_on_the_start_page_opens_the_lab_in_jupyterlab(page):
    page.locator(".jp-RenderedMarkdown a", has_text="lab 03").first.click()
    page.locator(".jp-RenderedMarkdown h1", has_text="03 · Data parallelism").first.wait_for()
    assert "03_data_parallel.ipynb" in page.locator(".lm-DockPanel-tabBar").inner_text()
