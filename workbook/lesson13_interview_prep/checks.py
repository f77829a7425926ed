"""The checks of lab 13 (interview preparation), on the protocol of
:mod:`workbook.checking`.

* :func:`check_parameter_server` (from :mod:`.parameter_server`): push/pull/sync and the
  server's loop, explored over 61 interleavings (``schedule_seed``);
* :func:`check_drill_set` (from :mod:`.drills`): five drills answered in your own units;
* :func:`check_design`: your design for the lab's scenario (:data:`.lab.LAB_SCENARIO`),
  graded 40/30/30 by :func:`.design.evaluate` (planner, failure model, scheduler); it
  passes at :data:`.design.PASS_SCORE` of 100, and a failing line names the rubric item
  that lost the most points and what it cost.

The parameter server's and the drills' checks live beside their code
(:mod:`.parameter_server`, :mod:`.drills`) and are re-exported here, so the lab reaches
every check as ``checks.check_<what>``. The reference answers (:mod:`._reference`) are
imported inside the checks only.
"""

from workbook.checking import Failure, answers, check, on_a_rank, refuse_reference
from workbook.lesson13_interview_prep import design, lab
# the parameter server's and the drills' checks live beside their code
from workbook.lesson13_interview_prep.drills import check_drill_set, check_estimate  # noqa: F401
from workbook.lesson13_interview_prep.parameter_server import check_parameter_server  # noqa: F401

_reference = answers(__name__)


@check("system design")
def check_design(my_design):
    """``my_design``: a function returning the design dict (or the dict itself)."""
    ref = _reference()
    if callable(my_design):
        refuse_reference(my_design, ref.my_design)
        value = on_a_rank(my_design, (), "my_design()")
    else:
        value = my_design
    if not isinstance(value, dict):
        raise Failure(f"my_design() returned {type(value).__name__}, not a dict",
                      "end my_design() with return {\"nodes_per_run\": ..., ...}")
    try:
        grade = design.evaluate(value, lab.LAB_SCENARIO)
    except ValueError as error:
        raise Failure(f"the design is not complete: {error}",
                      f"a design is a dict with the keys {', '.join(design.KEYS)}") from None
    summary = ", ".join(f"{item} {grade.points[item]}/{most}"
                        for item, most in design.RUBRIC.items())
    if grade.total < design.PASS_SCORE:
        worst = max(design.RUBRIC, key=lambda k: design.RUBRIC[k] - grade.points[k])
        why = "; ".join(grade.notes[worst])
        raise Failure(f"{grade.total}/100 ({summary}); {worst} lost the most: {why}",
                      "print design.check_design(my_design(), lab.LAB_SCENARIO) for the whole "
                      "table; change the choice that costs the most, then run this again")
    return f"{grade.total}/100 ({summary})"
