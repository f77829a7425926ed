"""`make slides` in a real browser with the network cut off: reveal.js runs, MathJax
typesets the formulas, and the deck asks for nothing outside its folder."""

import pytest

from workbook import slides

ROOT = slides.ROOT


@pytest.mark.slow
def test_a_deck_runs_offline(browser, tmp_path):
    deck, = slides.build([ROOT / "notebooks" / "01_collectives_and_cost.ipynb"], tmp_path,
                         log=lambda *a: None)
    page = browser.new_page()
    outside, errors = [], []

    def only_files(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            outside.append(route.request.url)
            route.abort()

    page.route("**/*", only_files)
    page.on("pageerror", lambda error: errors.append(str(error)))
    try:
        page.goto(deck.as_uri() + "#/2")
        page.wait_for_function("document.querySelectorAll('.MathJax_CHTML').length > 20",
                               timeout=30_000)
        assert page.evaluate("document.querySelectorAll('.slides > section').length") >= 5
        assert page.evaluate("document.querySelector('.reveal.ready') !== null")
        current = page.inner_text(".slides section.present")
        assert "alpha" in current.lower() and "$" not in current   # formulas typeset
    finally:
        page.close()
    assert not outside, f"the deck asked the network for {outside}"
    assert not errors, errors
