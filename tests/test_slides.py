"""`make slides`: a lesson's deck builds offline and loads only files next to it."""

from html.parser import HTMLParser
from pathlib import Path
from urllib.parse import urlsplit

import nbformat
import pytest

from workbook import slides

ROOT = Path(__file__).resolve().parents[1]
CDNS = ("unpkg.com", "cdnjs.cloudflare.com", "cdn.jsdelivr.net", "code.jquery.com",
        "googleapis.com")


class _Assets(HTMLParser):
    """Every URL a page loads by itself: scripts, style sheets, images, frames."""

    def __init__(self):
        super().__init__()
        self.urls = []

    def handle_starttag(self, tag, attrs):
        attrs = dict(attrs)
        if tag in ("script", "img", "iframe", "source", "video", "audio") and attrs.get("src"):
            self.urls.append(attrs["src"])
        if tag == "link" and attrs.get("href"):
            self.urls.append(attrs["href"])


def _loaded(html):
    parser = _Assets()
    parser.feed(html)
    return parser.urls


@pytest.mark.slow
def test_a_lesson_deck_references_only_local_assets(tmp_path):
    lesson = ROOT / "notebooks" / "00_simulated_cluster.ipynb"
    deck, = slides.build([lesson], tmp_path, log=lambda *a: None)
    html = deck.read_text(encoding="utf-8")
    urls = _loaded(html)
    local = [url for url in urls if not url.startswith("data:")]
    # reveal.js, its theme, jQuery, require.js and MathJax, each from vendor/
    assert len(local) >= 5, urls
    for url in local:
        parts = urlsplit(url)
        assert not parts.scheme and not parts.netloc, f"{url} is not local"
        assert (tmp_path / parts.path).is_file(), f"{url} is not in the output folder"
    # require.js loads reveal.js and its notes plugin by path: those must be there too
    for script in ("vendor/reveal.js/dist/reveal.js", "vendor/reveal.js/plugin/notes/notes.js"):
        assert f'"{script}"' in html and (tmp_path / script).is_file()
    for cdn in CDNS:
        assert cdn not in html, f"the deck still names {cdn}"
    # one slide per #/## heading of the lesson
    nb = nbformat.read(lesson, as_version=4)
    headings = sum(slides.slide_type(cell) == "slide" for cell in nb.cells)
    assert headings >= 5 and html.count("<section") >= headings


def test_headings_start_slides_and_authors_win():
    cells = [nbformat.v4.new_markdown_cell("# 00 · Title"),
             nbformat.v4.new_markdown_cell("## 1. A section"),
             nbformat.v4.new_markdown_cell("### A detail"),
             nbformat.v4.new_markdown_cell("Plain prose with a # in it"),
             nbformat.v4.new_code_cell("# a comment, not a heading"),
             nbformat.v4.new_markdown_cell("#hashtag is not a heading")]
    authored = nbformat.v4.new_markdown_cell("Speaker only")
    authored.metadata["slideshow"] = {"slide_type": "notes"}
    nb = nbformat.v4.new_notebook(cells=cells + [authored])
    marked = slides.mark_slides(nb)
    assert [c.metadata["slideshow"]["slide_type"] for c in marked.cells] == \
        ["slide", "slide", "subslide", "-", "-", "-", "notes"]
    assert "slideshow" not in nb.cells[0].metadata     # the notebook itself is untouched


def test_vendored_assets_exist():
    for url in slides.ASSETS.values():
        path = url.split("?")[0]
        if path.endswith("/reveal.js"):
            path += "/dist/reveal.js"
        assert (slides.VENDOR.parent / path).is_file(), path
    assert (slides.VENDOR / "reveal.js" / "dist" / "theme" / "white.css").is_file()
