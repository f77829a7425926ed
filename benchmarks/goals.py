"""The goals of issue 29, printed alike by every benchmark: goal, measured figure, verdict,
and for a goal not met the wall that stops it and what would pass it.

    from benchmarks.goals import Goal, report, summary
    GOAL = Goal("sim / serial floor, accounting on (CPU)", 1.5, unit="x")
    met = report(GOAL, 2.61, out, wall="...", would_pass="...")

The verdict is computed from the measured figure, never written by hand: ``met`` when it
meets the limit, ``not met`` otherwise. The wall and what would pass are printed only for a
goal not met.
"""

import textwrap
from dataclasses import dataclass

MET, NOT_MET = "met", "not met"
WIDTH = 96      # where printed explanations wrap
INDENT = "      "


@dataclass(frozen=True)
class Goal:
    """One goal: ``name`` is what is measured, ``limit`` the figure it must reach.

    ``at_least``: the figure must be at least ``limit`` (a speed-up); otherwise at most
    (a time, a ratio to a floor). ``unit`` is ``"x"`` (a ratio) or ``"s"`` (seconds).
    """

    name: str
    limit: float
    unit: str = "x"
    at_least: bool = False

    def met(self, measured):
        """Whether ``measured`` meets the goal (a figure equal to the limit meets it)."""
        return measured >= self.limit if self.at_least else measured <= self.limit

    def figure(self, value):
        """``value`` written in the goal's unit: ``1.52x`` or ``19.3 s``."""
        return f"{value:.2f}x" if self.unit == "x" else f"{value:.1f} s"

    def describe(self):
        """The goal as text: ``sim / serial floor <= 1.50x``."""
        return f"{self.name} {'>=' if self.at_least else '<='} {self.figure(self.limit)}"


def verdict(goal, measured):
    """``"met"`` or ``"not met"`` for ``measured`` against ``goal``."""
    return MET if goal.met(measured) else NOT_MET


def _wrapped(label, text):
    return textwrap.fill(f"{label}: {text}", WIDTH, initial_indent=INDENT,
                         subsequent_indent=INDENT + "  ")


def report(goal, measured, out=print, wall=None, would_pass=None, note=None):
    """Print one goal's line: the goal, the measured figure and the verdict; for a goal not
    met, then ``wall`` (what stops it) and ``would_pass`` (what would pass it), when given.
    ``note`` is printed after the verdict either way (e.g. how the figure was judged).
    Returns whether the goal is met."""
    met = goal.met(measured)
    out(f"  GOAL {goal.describe()}: measured {goal.figure(measured)}: "
        f"{MET if met else NOT_MET}" + (f" ({note})" if note else ""))
    if not met:
        if wall:
            out(_wrapped("wall", wall))
        if would_pass:
            out(_wrapped("what would pass it", would_pass))
    return met


def summary(verdicts, out=print):
    """Print one closing line from ``{goal description: met}``; return the goals not met."""
    missed = [name for name, met in verdicts.items() if not met]
    if not missed:
        out(f"  goals: all {len(verdicts)} met")
    else:
        out(f"  goals: {len(verdicts) - len(missed)} of {len(verdicts)} met; not met: "
            + "; ".join(missed))
    return missed


# What would pass the per-op wall, for every benchmark that hits it (docs/architecture.md,
# "The accounting fast path").
ACCOUNTING_IN_CPP = (
    "accounting in C++: a boxed fallback kernel on a dispatch key of its own that charges "
    "each op's time from a per-op table (the roofline), plus a counting CPU allocator "
    "(c10::SetCPUAllocator) reporting each storage's bytes and free to the rank's account, "
    "so that no op calls into Python; it needs a compiled extension shipped as wheels for "
    "every platform learners use (Linux and macOS on Intel, AMD and Apple CPUs) and every "
    "torch version supported.")
