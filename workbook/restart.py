"""After a kernel restart, a lab's check cell says to run the setup cell, not ``NameError``.

A learner who restarts the kernel (or reopens a lab) and runs a check cell first,
``checks.check_best_fit(best_fit)``, would get a raw ``NameError: name 'checks' is not
defined`` and a traceback. Nothing of the workbook is imported at that point, so no check
can catch it: this IPython extension, loaded by every kernel of the project's
environment, replaces that traceback with one ❌ line::

    ❌ name 'checks' is not defined: run the setup cell first (Kernel › Restart & Run All,
    or run the cells from the top)

It does so only while no lesson's package has been imported in the kernel (no setup cell
has run) and the name is missing in a cell's own code; every other ``NameError`` keeps
its usual traceback. The cell still ends in an error, so "Run All" stops there (and
``make progress`` counts it as not passed).

``python -m workbook.restart`` (run by ``make setup`` and ``make lab``) writes the
environment's IPython kernel configuration (``<venv>/etc/ipython``, which IPython reads
for every kernel started from this environment) so that kernels load the extension; labs
learners already have need no change. This module imports nothing heavy: it is loaded
at every kernel start.
"""

import sys
from pathlib import Path

MESSAGE = ("❌ name {name!r} is not defined: run the setup cell first (Kernel › Restart & "
           "Run All, or run the cells from the top)")
CONFIG = ("# Written by `python -m workbook.restart` (make setup): every kernel of this\n"
          "# environment loads the workbook's restart extension (workbook/restart.py).\n"
          "c.InteractiveShellApp.extensions.append('workbook.restart')\n")


def setup_has_run():
    """Whether a setup cell (any lesson's imports) has run in this kernel."""
    return any(name.startswith("workbook.lesson") for name in list(sys.modules))


def _in_a_cell(shell, tb):
    """Whether the innermost frame of ``tb`` is a cell's own code (the user namespace)."""
    while tb.tb_next is not None:
        tb = tb.tb_next
    return tb.tb_frame.f_globals is shell.user_ns


def _on_name_error(shell, etype, value, tb, tb_offset=None):
    """IPython's custom exception handler (it shows what it prints; the cell still ends
    in an error): the ❌ line, or the usual traceback."""
    name = getattr(value, "name", None)
    if name and not setup_has_run() and _in_a_cell(shell, tb):
        print(MESSAGE.format(name=name))
    else:
        shell.showtraceback((etype, value, tb), tb_offset=tb_offset)


def load_ipython_extension(shell):
    """Called by IPython when a kernel loads the extension."""
    shell.set_custom_exc((NameError,), _on_name_error)


def install(prefix=sys.prefix):
    """Write ``<prefix>/etc/ipython/ipython_kernel_config.py`` so that every kernel of the
    environment at ``prefix`` loads this extension; returns the file's path."""
    path = Path(prefix) / "etc" / "ipython" / "ipython_kernel_config.py"
    path.parent.mkdir(parents=True, exist_ok=True)
    if not path.exists() or path.read_text(encoding="utf-8") != CONFIG:
        path.write_text(CONFIG, encoding="utf-8")
    return path


if __name__ == "__main__":
    install()
