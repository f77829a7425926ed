"""Slides from the lessons, built offline: ``python -m workbook.slides`` (or ``make slides``).

Each lesson notebook becomes a reveal.js deck, ``build/slides/NN_name.slides.html``, with
its stored outputs (nothing is executed). Everything the decks load — reveal.js,
require.js, jQuery and MathJax — is copied from ``workshop/slides/vendor/`` (MIT- and
Apache-licensed files from npm, see its README) into ``build/slides/vendor/``, so the
folder works without a network and can be copied to a USB stick as a whole.

Which cells become slides is decided here, not in the notebooks (they stay as authors
write them): a markdown cell that starts with a ``#`` or ``##`` heading starts a new
slide, a ``###`` heading a sub-slide (reveal.js's "down"), and every other cell continues
the slide before it; slides taller than the screen scroll. A cell whose author set a
``slideshow.slide_type`` keeps it.

    python -m workbook.slides                                # every lesson
    python -m workbook.slides notebooks/03_data_parallel.ipynb --out /tmp/slides
"""

import argparse
import copy
import re
import shutil
import sys
from pathlib import Path

import nbformat

ROOT = Path(__file__).resolve().parents[1]
SLIDES = ROOT / "workshop" / "slides"
VENDOR = SLIDES / "vendor"
TEMPLATE = "slides_offline"      # workshop/slides/template/slides_offline: no CDN scripts
OUT = ROOT / "build" / "slides"

# Where the exporter finds each asset, relative to the deck (vendor/ sits next to it).
ASSETS = {
    "reveal_url_prefix": "vendor/reveal.js",
    "jquery_url": "vendor/jquery/jquery.min.js",
    "require_js_url": "vendor/requirejs/require.js",
    "mathjax_url": "vendor/mathjax/MathJax.js?config=TeX-AMS_CHTML-full,Safe",
}


def slide_type(cell):
    """The reveal.js slide type of ``cell`` under the rule in the module docstring."""
    own = cell.get("metadata", {}).get("slideshow", {}).get("slide_type")
    if own:
        return own
    if cell.cell_type == "markdown":
        heading = re.match(r"\s*(#{1,6})\s", cell.source)
        if heading:
            return "slide" if len(heading.group(1)) <= 2 else "subslide"
    return "-"


def mark_slides(nb):
    """A copy of ``nb`` with every cell's ``slideshow.slide_type`` set by :func:`slide_type`."""
    nb = copy.deepcopy(nb)
    for cell in nb.cells:
        cell.metadata.setdefault("slideshow", {})["slide_type"] = slide_type(cell)
    return nb


def exporter():
    """nbconvert's SlidesExporter on the offline template and the vendored assets."""
    from nbconvert import SlidesExporter

    return SlidesExporter(template_name=TEMPLATE,
                          extra_template_basedirs=[str(SLIDES / "template")],
                          reveal_theme="white", reveal_scroll=True, **ASSETS)


def build(notebooks, out=OUT, log=print):
    """Write a deck for each notebook into ``out`` (with ``out/vendor``); return the paths."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    shutil.copytree(VENDOR, out / "vendor", dirs_exist_ok=True)
    slides = exporter()
    written = []
    for path in map(Path, notebooks):
        nb = mark_slides(nbformat.read(path, as_version=4))
        html, _ = slides.from_notebook_node(nb, resources={"metadata": {"name": path.stem}})
        target = out / f"{path.stem}.slides.html"
        target.write_text(html, encoding="utf-8")
        log(f"{path} -> {target}")
        written.append(target)
    return written


def main(argv=None):
    parser = argparse.ArgumentParser(prog="python -m workbook.slides",
                                     description="Build reveal.js slides from the lessons, "
                                                 "offline.")
    parser.add_argument("notebooks", nargs="*",
                        help="lesson notebooks (default: notebooks/*.ipynb)")
    parser.add_argument("--out", default=str(OUT), help="output folder (default: %(default)s)")
    args = parser.parse_args(argv)
    paths = [Path(p) for p in args.notebooks] or sorted((ROOT / "notebooks").glob("*.ipynb"))
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        parser.error(f"no such notebook: {', '.join(missing)}")
    written = build(paths, args.out)
    print(f"{len(written)} deck(s) in {args.out}: open one in a browser (no network needed); "
          "press S for speaker notes, Esc for an overview")
    return 0


if __name__ == "__main__":
    sys.exit(main())
