"""Lab 02 in a real browser: what a learner sees in JupyterLab, in headless Chromium.

JupyterLab is started with the Makefile's own command (the `lab_server` fixture) and
driven through its user interface only: clicks and keys, the way a learner works. The
test opens labs/02_gradient_aggregation.ipynb, runs the import cell, answers a quiz
wrongly and then rightly, runs a cell that plots a simulated run, and runs a check cell
on the unsolved exercise. At the end, the page must have logged no JavaScript error, and
the lab's folder must be as it was (autosave is off, checkpoints go elsewhere).

Screenshots of each step are saved in the test's temporary folder, to look at when a
step fails.
"""

import hashlib
import re

import pytest

from _jupyter_lab import ROOT

pytestmark = pytest.mark.slow

LAB = "labs/02_gradient_aggregation.ipynb"
KERNEL_TIMEOUT = 180_000   # ms for a cell to finish: the first import of torch is slow
UI_TIMEOUT = 60_000        # ms for JupyterLab to show something

# The cell a learner might type to look at a run: a timeline of one all-reduce.
PLOT_CELL = """\
run = cluster.run(lambda: dist.all_reduce(torch.ones(1 << 16)), world_size=8)
run.timeline()
plt.show()"""


def _snapshot(folder):
    """``{path: sha256}`` of every file under ``folder``: what a test must not change."""
    return {path.relative_to(folder): hashlib.sha256(path.read_bytes()).hexdigest()
            for path in sorted(folder.rglob("*")) if path.is_file()}


class Notebook:
    """The notebook open in a JupyterLab page, driven by clicks and keys."""

    def __init__(self, page, shots):
        self.page, self.shots, self.step = page, shots, 0
        self.errors = []   # JavaScript errors the page logged or raised

    def on_console(self, message):
        """Keep the errors among the page's console messages."""
        if message.type == "error":
            self.errors.append(f"console: {message.text}")

    def screenshot(self, name):
        """Save what the page shows now, numbered in order."""
        self.step += 1
        self.page.screenshot(path=str(self.shots / f"{self.step:02d}_{name}.png"))

    def cell(self, starting_with):
        """The code cell whose source starts with ``starting_with``."""
        cells = self.page.locator(".jp-Notebook .jp-CodeCell").filter(
            has=self.page.locator(".cm-content", has_text=starting_with))
        cells.first.wait_for(timeout=UI_TIMEOUT)
        return cells.first

    def run(self, cell):
        """Select ``cell``, press Shift+Enter, and wait until it has run."""
        cell.locator(".jp-InputPrompt").click()
        self.page.keyboard.press("Shift+Enter")
        # The prompt shows [*] while the cell runs and [n] once it has run.
        cell.locator(".jp-InputPrompt", has_text=re.compile(r"\[\d+\]")).wait_for(
            timeout=KERNEL_TIMEOUT)
        return cell

    def insert_below(self, cell, source):
        """Add a code cell below ``cell`` with ``source`` typed in; return it."""
        cell.locator(".jp-InputPrompt").click()
        self.page.keyboard.press("Escape")
        self.page.keyboard.press("b")                # command mode: insert below
        self.page.keyboard.press("Enter")            # edit the new cell
        self.page.keyboard.insert_text(source)       # as pasted: no auto-closed brackets
        self.page.keyboard.press("Escape")
        return self.cell(source.splitlines()[0])

    def outputs(self, cell):
        """The text of ``cell``'s outputs."""
        return cell.locator(".jp-OutputArea-output").all_inner_texts()


@pytest.fixture(scope="module")
def notebook(browser, lab_server, tmp_path_factory):
    lab_folder = (ROOT / LAB).parent
    before = _snapshot(lab_folder)
    page = browser.new_page()
    page.set_default_timeout(UI_TIMEOUT)
    nb = Notebook(page, tmp_path_factory.mktemp("screenshots"))
    page.on("console", nb.on_console)
    page.on("pageerror", lambda error: nb.errors.append(f"uncaught: {error}"))
    page.goto(f"{lab_server.url}/lab/tree/{LAB}?token={lab_server.token}")
    try:
        page.locator(".jp-Notebook .jp-Cell").first.wait_for()
        # The kernel is ready when the status bar says Idle.
        page.locator(".jp-StatusBar-TextItem", has_text="Idle").first.wait_for(
            timeout=KERNEL_TIMEOUT)
        nb.screenshot("opened")
        nb.run(nb.cell("import threading"))
        yield nb
        nb.screenshot("end")
    finally:
        page.close()
    assert _snapshot(lab_folder) == before, f"the browser test changed {lab_folder}/"
    assert not nb.errors, "JupyterLab logged errors:\n" + "\n".join(nb.errors)


def test_a_choice_quiz_gives_feedback_on_a_wrong_then_the_right_answer(notebook):
    page = notebook.page
    quiz = notebook.run(notebook.cell('quiz.ask("02", "ring_bytes_at_scale")'))
    widget = quiz.locator(".jp-OutputArea-output .widget-vbox").first
    widget.wait_for()
    text = widget.inner_text()
    for option in ["about 1.75n", "about 2n", "about 256n", "about 1,023n"]:
        assert text.count(option) == 1, f"{option!r} is not shown exactly once:\n{text}"
    notebook.screenshot("quiz")

    widget.get_by_role("button", name="C", exact=True).click()
    widget.get_by_role("button", name="Check").click()
    wrong = widget.locator(".jp-RenderedMarkdown", has_text="Not quite")
    wrong.wait_for()
    assert "❌" in wrong.inner_text()
    assert "Count the chunks: 2(p-1) of n/p each." in wrong.inner_text()
    assert "1.998n" not in widget.inner_text(), "the explanation shows before the answer"
    notebook.screenshot("quiz_wrong")

    widget.get_by_role("button", name="B", exact=True).click()
    widget.get_by_role("button", name="Check").click()
    right = widget.locator(".jp-RenderedMarkdown", has_text="Correct")
    right.wait_for()
    assert "✅" in right.inner_text()
    assert "1.998n" in right.inner_text()
    assert page.locator(".jp-RenderedMarkdown", has_text="Not quite").count() == 0
    notebook.screenshot("quiz_right")


def test_a_plotting_cell_shows_an_image(notebook):
    plot = notebook.run(notebook.insert_below(notebook.cell("import threading"), PLOT_CELL))
    image = plot.locator(".jp-OutputArea-output img").first
    image.wait_for()
    size = image.evaluate("img => [img.naturalWidth, img.naturalHeight]")
    assert size[0] > 200 and size[1] > 100, f"the plot is {size[0]} x {size[1]} pixels"
    assert image.get_attribute("src").startswith("data:image/png")
    assert not any("Error" in text for text in notebook.outputs(plot)), notebook.outputs(plot)
    notebook.screenshot("plot")


def test_a_check_cell_prints_its_verdict_on_the_unsolved_exercise(notebook):
    notebook.run(notebook.cell("def naive_allreduce(tensor):"))
    notebook.run(notebook.cell("def ring_allreduce(tensor):"))
    check = notebook.run(notebook.cell("ok_naive = checks.check_naive_allreduce"))
    text = "\n".join(notebook.outputs(check))
    notebook.screenshot("check")
    # an unwritten exercise is "not started" (⬜), as `make progress` says, not a ❌
    verdicts = [line for line in text.splitlines() if line[:1] in ("✅", "❌", "⬜")]
    assert verdicts, f"no ✅/❌/⬜ line in the check cell's output:\n{text}"
    assert verdicts[0].startswith("⬜ naive all-reduce: not started"), text
    assert "NotImplementedError" in text or "not started" in text.lower(), text
