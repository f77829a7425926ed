"""Quizzes with instant feedback: multiple choice and numeric answers.

A lesson's quizzes live in its package, ``workbook/lessonNN_<topic>/quizzes.py``, one
function per question, so that a learner sees neither the answer nor the explanation
before answering: not in the cell, not in its stored output. A notebook cell asks one::

    from workbook import quiz
    quiz.ask("03", "no_sync")        # lesson 03's quiz no_sync()

and a quizzes.py builds it with :func:`choice`, :func:`number` or :class:`Quiz`::

    def collective():
        return quiz.choice("Which collective does DDP run on gradients?",
                           ["broadcast", "all-reduce",
                            ("all-to-all", "That one moves tokens to experts.")],
                           answer="all-reduce",
                           explain="Every rank needs the sum of all gradients.")

    quiz.number("Memory per GPU for 7.5B parameters with ZeRO stage 1 on 64 GPUs?",
                answer=31.4, unit="GB", rel_tol=0.05,
                explain="(2 + 2)Ψ + 12Ψ/64 = 31.4 GB.")

    quiz.Quiz([q1, q2, q3], title="Check yourself")

The last expression of a cell shows the question. In Jupyter it is a widget: pick an
option's letter or type a number, press **Check**, and get ✅ and the explanation, or ❌
and a hint (the explanation stays hidden until the answer is right or **Show answer** is
pressed).
A typed answer that is not a number gets a message, never an exception.

**Stored outputs and nbval.** A question is displayed as *one* output with three
representations: ``application/vnd.jupyter.widget-view+json`` (the live widget),
``text/markdown`` (the question and its options, and a line saying to run the cell: what
GitHub, nbconvert and any viewer without a live kernel show) and ``text/plain``. Neither
holds the answer, the explanation, the hint or an option's reason: those exist only in the
kernel, and reach the widget only after a Check or Show answer (widget state saved in a
notebook's metadata is taken when the cell ran, before any click). The widget view holds a
``model_id`` that is new on every run, but nbval leaves that mimetype out of its comparison
(it knows model ids are random), and the markdown and plain-text renderings depend only on
the question, never on ids or on what a learner clicked. So notebooks with quizzes pass
strict ``pytest --nbval`` with no tags and no sanitising. (JupyterLab shows "model not
found" instead of a stored widget until its cell is run again: widgets live in the kernel.)

Programmatic use, and what the tests do::

    q = quiz.number("...", answer=120, unit="GB")
    q.check("118 GB")      # Feedback(status='correct', message='✅ ...')
    q.submit("abc")        # like typing it and pressing Check: updates q.feedback
"""

import importlib
import math
import re
from dataclasses import dataclass
from pathlib import Path

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# What a stored output says in place of the answer.
RUN_TO_ANSWER = "*Run this cell to answer: the answer and why appear once you press Check.*"


@dataclass(frozen=True)
class Feedback:
    """The result of checking one response.

    ``status`` is ``"correct"``, ``"wrong"``, ``"invalid"`` (not an answer: nothing
    picked, not a number, ...) or ``"revealed"`` (the learner asked for the answer);
    ``message`` is one short markdown text starting with ✅, ❌, ⚠️ or 💡.
    """

    status: str
    message: str

    @property
    def correct(self):
        return self.status == "correct"

    def __str__(self):
        return self.message


class _Displayed:
    """How a question or quiz shows itself: the live widget, plus markdown and plain-text
    versions that depend only on the question (so stored notebook outputs stay stable)."""

    def _repr_markdown_(self):
        return self.markdown()

    def _repr_mimebundle_(self, include=None, exclude=None):
        bundle = {}
        widget = self.widget()
        if widget is not None:
            bundle.update(widget._repr_mimebundle_())
        bundle["text/plain"] = self.text()
        bundle["text/markdown"] = self.markdown()
        return bundle


class Question(_Displayed):
    """What :func:`choice` and :func:`number` return; displays itself as a widget."""

    def __init__(self, question, explain="", hint=""):
        if not isinstance(question, str) or not question.strip():
            raise ValueError("a question needs its text")
        self.question, self.explain, self.hint = question, explain, hint
        self.feedback = None      # the last Feedback, once the learner has pressed a button
        self.solved = False       # answered correctly at least once
        self.number = None        # its number inside a Quiz
        self._widget = self._feedback_view = None
        self._listeners = []

    # -- grading ------------------------------------------------------------------------

    def check(self, response):
        """Grade ``response`` and return a :class:`Feedback` (never raises for bad input)."""
        raise NotImplementedError

    def answer_markdown(self):
        """The right answer, as markdown."""
        raise NotImplementedError

    def submit(self, response):
        """Check ``response`` as the Check button does: record and show the feedback."""
        return self._record(self.check(response))

    def reveal(self):
        """Show the answer and the explanation, as the Show answer button does."""
        message = f"💡 **Answer:** {self.answer_markdown()}"
        return self._record(Feedback("revealed", _paragraphs(message, self.explain)))

    def _right(self, detail=""):
        return Feedback("correct", _paragraphs(f"✅ **Correct.**{detail}", self.explain))

    def _wrong(self, detail="", why=""):
        hint = f"*Hint:* {self.hint}" if self.hint else ""
        return Feedback("wrong", _paragraphs(f"❌ **Not quite.**{detail}", why, hint))

    def _record(self, feedback):
        self.feedback = feedback
        self.solved = self.solved or feedback.correct
        if self._feedback_view is not None:
            self._feedback_view.outputs = (_markdown_output(feedback.message),)
        for listener in self._listeners:
            listener(self)
        return feedback

    # -- static rendering ---------------------------------------------------------------

    def _title(self):
        return "Question" if self.number is None else f"Question {self.number}"

    def markdown(self):
        """The question, without its answer: what shows where widgets cannot."""
        return _paragraphs(self._question_markdown(), RUN_TO_ANSWER)

    def text(self):
        """The question alone, as plain text."""
        raise NotImplementedError

    def _question_markdown(self):
        raise NotImplementedError

    def __repr__(self):
        return f"<{type(self).__name__} {self.question[:60]!r}>"

    # -- widget -------------------------------------------------------------------------

    def widget(self):
        """The interactive widget (built once), or None without ipywidgets."""
        if self._widget is None:
            try:
                import ipywidgets as widgets
            except ImportError:
                return None
            prompt = widgets.Output()
            prompt.outputs = (_markdown_output(self._question_markdown()),)
            self._feedback_view = widgets.Output()
            if self.feedback is not None:
                self._feedback_view.outputs = (_markdown_output(self.feedback.message),)
            check = widgets.Button(description="Check", button_style="primary",
                                   tooltip="Check your answer")
            reveal = widgets.Button(description="Show answer", tooltip="Give up and see it")
            entry, read = self._entry(widgets)
            check.on_click(lambda _: self.submit(read()))
            reveal.on_click(lambda _: self.reveal())
            self._widget = widgets.VBox(
                [prompt, entry, widgets.HBox([check, reveal]), self._feedback_view],
                layout=widgets.Layout(margin="0 0 1em 0"))
        return self._widget

    def _entry(self, widgets):
        """``(input widget, function reading its value)``."""
        raise NotImplementedError


class Choice(Question):
    """A multiple-choice question with one right option; see :func:`choice`."""

    def __init__(self, question, options, answer, explain="", hint=""):
        super().__init__(question, explain, hint)
        self.options, self.why = [], []
        for option in options:
            text, why = (option, "") if isinstance(option, str) else tuple(option)
            self.options.append(str(text))
            self.why.append(why)
        if not 2 <= len(self.options) <= len(LETTERS):
            raise ValueError(f"a choice needs 2 to {len(LETTERS)} options, "
                             f"got {len(self.options)}")
        if len(set(self.options)) != len(self.options):
            raise ValueError(f"options must differ: {self.options}")
        index = self._index(answer)
        if index is None:
            raise ValueError(f"answer {answer!r} is not one of the options {self.options} "
                             "(give the option's text or its index)")
        self.answer = index

    def _index(self, response):
        if isinstance(response, bool):
            return None
        if isinstance(response, int):
            return response if 0 <= response < len(self.options) else None
        if isinstance(response, str) and response in self.options:
            return self.options.index(response)
        return None

    def check(self, response):
        """``response``: the index of the chosen option, or its text; None if nothing."""
        if response is None:
            return Feedback("invalid", "⚠️ Pick an option first.")
        index = self._index(response)
        if index is None:
            return Feedback("invalid", f"⚠️ {response!r} is not one of the options.")
        if index == self.answer:
            return self._right()
        return self._wrong(why=self.why[index])

    def _label(self, index):
        return f"{LETTERS[index]}. {self.options[index]}"

    def answer_markdown(self):
        return f"**{LETTERS[self.answer]}.** {self.options[self.answer]}"

    def _question_markdown(self):
        lines = [f"**{self._title()}.** {self.question}", ""]
        lines += [f"- **{LETTERS[i]}.** {option}" for i, option in enumerate(self.options)]
        return "\n".join(lines)

    def text(self):
        return "\n".join([f"{self._title()}. {self.question}"] +
                         [f"  {self._label(i)}" for i in range(len(self.options))])

    def _entry(self, widgets):
        # The prompt above lists the options, rendered as markdown (math, code): here
        # the learner picks a letter, so each option is shown once and rendered right.
        buttons = widgets.ToggleButtons(
            options=[(LETTERS[i], i) for i in range(len(self.options))], value=None,
            tooltips=self.options, style={"button_width": "3em"})
        return buttons, lambda: buttons.value


class Number(Question):
    """A question whose answer is a number, right within a tolerance; see :func:`number`."""

    def __init__(self, question, answer, rel_tol=0.05, unit="", explain="", hint="",
                 abs_tol=0.0):
        super().__init__(question, explain, hint)
        if isinstance(answer, bool) or not isinstance(answer, (int, float)) \
                or not math.isfinite(answer):
            raise ValueError(f"the answer must be a finite number, got {answer!r}")
        if not rel_tol >= 0 or not abs_tol >= 0 or (answer == 0 and abs_tol == 0):
            raise ValueError("tolerances must be >= 0, and an answer of 0 needs abs_tol > 0")
        self.answer, self.rel_tol, self.abs_tol = answer, rel_tol, abs_tol
        self.unit = unit.strip()

    def _with_unit(self, value):
        return f"{_format_number(value)} {self.unit}".strip()

    def parse(self, response):
        """``(value, None)``, or ``(None, message)`` when the response is not a number."""
        if isinstance(response, bool):
            return None, f"⚠️ {response!r} is not a number."
        if isinstance(response, (int, float)):
            if math.isfinite(response):
                return float(response), None
            return None, f"⚠️ {response!r} is not a finite number."
        if response is None or not str(response).strip():
            return None, "⚠️ Type a number first."
        raw = str(response).strip()
        text = raw.replace("\u2212", "-").replace(" ", "")   # a typographic minus
        if self.unit and text.endswith(self.unit.replace(" ", "")):
            text = text[:-len(self.unit.replace(" ", ""))]
        if _THOUSANDS.fullmatch(text):
            text = text.replace(",", "")
        example = f" (in {self.unit})" if self.unit else ""
        if _NUMBER.fullmatch(text):
            return float(text), None
        if "," in text:
            return None, f"⚠️ {raw!r}: use a dot for decimals, like 2.5{example}."
        prefix = _NUMBER.match(text)
        if prefix and self.unit and _UNIT.fullmatch(text[prefix.end():]):
            return None, f"⚠️ {raw!r}: give the number in {self.unit}, like 42 or 1.5e3."
        return None, f"⚠️ {raw!r} is not a number: type just the number{example}, like 42 " \
                     "or 1.5e3."

    def check(self, response):
        """``response``: a number, or text such as ``"120"``, ``"1.2e2"``, ``"120 GB"``."""
        value, problem = self.parse(response)
        if problem:
            return Feedback("invalid", problem)
        error = value - self.answer
        if abs(error) <= max(self.rel_tol * abs(self.answer), self.abs_tol):
            exact = "" if value == self.answer else \
                f" The exact value is {self._with_unit(self.answer)}."
            return self._right(exact)
        return self._wrong(f" {self._with_unit(value)} is too {'high' if error > 0 else 'low'}.")

    def _tolerance(self):
        parts = []
        if self.rel_tol:
            parts.append(f"±{_format_number(100 * self.rel_tol)}%")
        if self.abs_tol:
            parts.append(f"±{self._with_unit(self.abs_tol)}")
        return " or ".join(parts)

    def answer_markdown(self):
        tolerance = self._tolerance()
        return f"**{self._with_unit(self.answer)}**" + \
            (f" (answers within {tolerance} count)" if tolerance else "")

    def _question_markdown(self):
        unit = f" *(answer in {self.unit})*" if self.unit else ""
        return f"**{self._title()}.** {self.question}{unit}"

    def text(self):
        unit = f" [answer in {self.unit}]" if self.unit else ""
        return f"{self._title()}. {self.question}{unit}"

    def _entry(self, widgets):
        box = widgets.Text(placeholder="a number", layout=widgets.Layout(width="14em"))
        return widgets.HBox([box, widgets.Label(self.unit)]), lambda: box.value


class Quiz(_Displayed):
    """Several questions shown together, numbered, with a running score."""

    def __init__(self, questions, title=""):
        self.questions = list(questions)
        if not self.questions or not all(isinstance(q, Question) for q in self.questions):
            raise ValueError("a Quiz needs a list of questions from quiz.choice / quiz.number")
        self.title = title
        for number, question in enumerate(self.questions, 1):
            question.number = number
        self._widget = self._score_view = None

    @property
    def score(self):
        """How many questions have been answered correctly."""
        return sum(question.solved for question in self.questions)

    def _score_markdown(self):
        return f"**Score: {self.score} / {len(self.questions)}**"

    def markdown(self):
        parts = [f"### {self.title}"] if self.title else []
        parts += [question._question_markdown() for question in self.questions]
        return "\n\n".join(parts + [RUN_TO_ANSWER])

    def text(self):
        parts = [self.title] if self.title else []
        parts += [question.text() for question in self.questions]
        return "\n\n".join(parts)

    def widget(self):
        """All the questions' widgets and the score, in one box (None without ipywidgets)."""
        if self._widget is None:
            try:
                import ipywidgets as widgets
            except ImportError:
                return None
            children = []
            if self.title:
                heading = widgets.Output()
                heading.outputs = (_markdown_output(f"### {self.title}"),)
                children.append(heading)
            children += [question.widget() for question in self.questions]
            self._score_view = widgets.Output()
            self._update_score()
            children.append(self._score_view)
            for question in self.questions:
                question._listeners.append(lambda _: self._update_score())
            self._widget = widgets.VBox(children)
        return self._widget

    def _update_score(self, *_):
        if self._score_view is not None:
            self._score_view.outputs = (_markdown_output(self._score_markdown()),)

    def __repr__(self):
        return f"<Quiz of {len(self.questions)} questions>"


def choice(question, options, answer, explain="", hint=""):
    """A multiple-choice question.

    Args:
        question: the question, markdown.
        options: the options' texts; an option may be ``(text, why)``, where ``why``
            is shown when a learner picks that wrong option.
        answer: the right option, as its text or its index.
        explain: why the answer is right; shown once it is found (or revealed).
        hint: shown after a wrong answer.
    """
    return Choice(question, options, answer, explain=explain, hint=hint)


def number(question, answer, rel_tol=0.05, unit="", explain="", hint="", abs_tol=0.0):
    """A question answered with a number.

    A response is right when it is within ``rel_tol`` (a fraction: 0.05 is ±5%) of
    ``answer``, or within ``abs_tol``. ``unit`` is shown next to the box, and a learner
    may type it after the number ("120 GB"); any other text is refused with a message.
    """
    return Number(question, answer, rel_tol=rel_tol, unit=unit, explain=explain, hint=hint,
                  abs_tol=abs_tol)


def ask(lesson, name):
    """Lesson ``lesson``'s quiz ``name``, freshly built: ``ask("03", "no_sync")`` calls
    ``no_sync()`` in ``workbook/lesson03_<topic>/quizzes.py``."""
    module = _quizzes_module(lesson)
    make = quizzes(module).get(name)
    if make is None:
        raise ValueError(f"lesson {lesson} has no quiz {name!r}; "
                         f"its quizzes: {', '.join(quizzes(module)) or 'none'}")
    return make()


def quizzes(module):
    """``{name: function}`` of the quizzes a quizzes.py module defines."""
    return {name: value for name, value in vars(module).items()
            if callable(value) and not name.startswith("_")
            and getattr(value, "__module__", None) == module.__name__}


def quiz_modules():
    """``{lesson: module}`` of every lesson's quizzes.py, e.g. ``{"03": ...}``."""
    return {path.parent.name[len("lesson"):][:2]: _import(path)
            for path in sorted(Path(__file__).parent.glob("lesson*_*/quizzes.py"))}


def _quizzes_module(lesson):
    lesson = str(lesson)
    found = sorted(Path(__file__).parent.glob(f"lesson{lesson}_*/quizzes.py"))
    if len(lesson) != 2 or not lesson.isdigit() or not found:
        raise ValueError(f"no quizzes for lesson {lesson!r}: give its two-digit number, "
                         "like \"03\", of a lesson with a workbook/lessonNN_<topic>/quizzes.py")
    return _import(found[0])


def _import(path):
    return importlib.import_module(f"{__package__}.{path.parent.name}.quizzes")


_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?")
_UNIT = re.compile(r"[^\W\d_]+(/[^\W\d_]+)?|%")   # GB, MiB, GB/s, µs, %
_THOUSANDS = re.compile(r"[+-]?\d{1,3}(,\d{3})+(\.\d*)?")


def _format_number(value):
    if float(value).is_integer() and abs(value) < 1e15:
        return f"{int(value):,}"
    return f"{value:.6g}"


def _paragraphs(*parts):
    return "\n\n".join(part for part in parts if part)


def _markdown_output(markdown):
    """An output of an Output widget, built directly (no IPython shell needed)."""
    return {"output_type": "display_data", "metadata": {},
            "data": {"text/markdown": markdown, "text/plain": markdown}}
