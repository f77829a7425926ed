"""Opening a lesson or a lab in JupyterLab does not mark it modified.

JupyterLab writes the kernel's kernelspec and language_info into a notebook when its
kernel starts, and marks the notebook modified (●, "Save changes?", autosave rewriting the
committed file) when they differ from what the file has. tests/test_notebook_metadata.py
checks the files; this checks what a learner sees, in headless Chromium.
"""

import pytest

pytestmark = pytest.mark.slow

KERNEL_TIMEOUT = 180_000   # ms: the first kernel start is slow on a busy machine

# One of each kind: a lesson, a solution, a generated lab.
NOTEBOOKS = ["notebooks/00_simulated_cluster.ipynb", "solutions/03_data_parallel.ipynb",
             "labs/05_pipeline_parallel.ipynb"]


@pytest.mark.parametrize("path", NOTEBOOKS)
def test_a_notebook_is_not_modified_by_opening_it(lab_server, browser, path):
    page = browser.new_page()
    page.set_default_timeout(60_000)
    try:
        # A workspace of its own, so that JupyterLab does not restore other tabs.
        name = path.replace("/", "_").replace(".", "_")
        page.goto(f"{lab_server.url}/lab/workspaces/{name}/tree/{path}?reset"
                  f"&token={lab_server.token}")
        tab = page.locator(".lm-TabBar-tab.jp-mod-current", has_text=path.split("/")[-1])
        tab.wait_for()
        page.locator(".jp-StatusBar-TextItem", has_text="Idle").first.wait_for(
            timeout=KERNEL_TIMEOUT)
        page.wait_for_timeout(2_000)      # the kernel's metadata arrives just after Idle
        assert "jp-mod-dirty" not in (tab.get_attribute("class") or ""), \
            f"JupyterLab marks {path} modified as soon as it opens"
    finally:
        page.close()
