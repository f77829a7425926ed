"""Progressive help for a lab's exercises: a nudge first, more only when asked.

A lab's exercise text and its ``# HINT:`` line (the ``NotImplementedError``'s message) say
what to think about, never the lines to write. The fuller help lives here, in steps that
go from a question to the idea to the shape of the code, and a learner reveals one more
step per call::

    hint = Hints({"buckets": ["What decides when a bucket is full? Re-read ...",
                              "Walk the parameters in the order backward ...",
                              "A running byte count, reset when a bucket closes ..."]})

    hint("buckets")   # prints step 1 of 3, and how to see the next
    hint("buckets")   # prints steps 1-2 of 3
    hint("buckets", all=True)   # every step

A lesson's checks module holds its ``hint`` (``checks.hint``), and a ❌ line may end
with :func:`Hints.pointer` (``more help: checks.hint("buckets")``) so the learner knows
where the next step is. Other labs use the same class: one mechanism, one look.
"""

import textwrap

WIDTH = 88   # the width of a notebook's output cell, as workbook.checking wraps


class Hints:
    """The progressive hints of one lab: ``{exercise: [step, step, ...]}``, shown one more
    step per call of ``hint(exercise)``."""

    def __init__(self, steps, owner="checks"):
        for exercise, texts in steps.items():
            if not texts or not all(isinstance(t, str) and t.strip() for t in texts):
                raise ValueError(f"hints for {exercise!r}: give one or more non-empty steps")
        self.steps = {exercise: list(texts) for exercise, texts in steps.items()}
        self.owner = owner
        self.shown = {}

    def pointer(self, exercise):
        """``more help: checks.hint("buckets")``: where a ❌ line sends the learner."""
        self._known(exercise)
        return f"more help: {self.owner}.hint({exercise!r})"

    def text(self, exercise, level):
        """Steps 1..``level`` of ``exercise``'s help, numbered and wrapped, as printed."""
        texts = self._known(exercise)
        level = max(1, min(level, len(texts)))
        lines = []
        for i, step in enumerate(texts[:level], 1):
            lines += textwrap.wrap(f"{i}/{len(texts)}  {step}", WIDTH,
                                   subsequent_indent="     ", break_on_hyphens=False)
        if level < len(texts):
            lines.append(f"(call {self.owner}.hint({exercise!r}) again for step "
                         f"{level + 1}; try it yourself first)")
        return "\n".join(lines)

    def __call__(self, exercise, all=False):   # noqa: A002  (reads well in a notebook)
        """Print one more step of ``exercise``'s help than last time (``all``: every step).
        Returns None, so a notebook cell shows only the help (``shown[exercise]`` counts
        the steps shown)."""
        texts = self._known(exercise)
        level = len(texts) if all else min(self.shown.get(exercise, 0) + 1, len(texts))
        self.shown[exercise] = level
        print(self.text(exercise, level))

    def reset(self):
        """Forget what was shown: the next call starts at step 1 again."""
        self.shown.clear()

    def _known(self, exercise):
        if exercise not in self.steps:
            raise KeyError(f"no hints for {exercise!r}; this lab has hints for: "
                           + ", ".join(repr(e) for e in self.steps))
        return self.steps[exercise]
