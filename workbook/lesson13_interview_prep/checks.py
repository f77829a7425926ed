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
from workbook.hints import Hints
from workbook.lesson13_interview_prep import design, lab
# the parameter server's and the drills' checks live beside their code
from workbook.lesson13_interview_prep.drills import check_drill_set, check_estimate  # noqa: F401
from workbook.lesson13_interview_prep.parameter_server import check_parameter_server  # noqa: F401

_reference = answers(__name__)

# Progressive help, one step per call of checks.hint("ps") in the lab: a question, the
# idea, then the shape of the code; never the lines themselves.
hint = Hints({
    "ps": [
        "The server cannot know what arrives next or from whom. What must a worker send "
        "first, so that a server receiving from any rank knows what follows and who sent it?",
        "The workers are simple: a header, then what goes with it (a gradient to the server, "
        "or the parameters back from it). The server is the hard part: what must it "
        "remember between two messages to decide whether a worker may get the parameters?",
        "Keep, per worker, how many gradients it has pushed; a pull or sync the bound does "
        "not allow yet waits in a list. A push can unblock several waiting requests, not "
        "only the oldest: after each message, answer every one the bound now allows. "
        "Stop when every worker has pushed `steps` gradients.",
    ],
    "drills": [
        "Which lesson does each question come from, and which of its formulas answers it? "
        "Write the formula before the numbers.",
        "A ring all-reduce is latency per step times its steps plus its bytes over the "
        "bandwidth (lesson 01); ZeRO-3 splits the 16 bytes of mixed-precision Adam per "
        "parameter (lesson 07); the bubble counts idle stage-slots (lesson 05); Young "
        "balances checkpoint cost against lost work (lesson 10); the KV cache keeps a key "
        "and a value per layer, KV head and token (lesson 12).",
        "Answer in the unit each question asks: GB is 10^9 bytes, not 2^30; a fraction may "
        "be written '12 %'.",
    ],
    "design": [
        "Start from the requirement: all the runs at once, with nodes left for failures. "
        "How many nodes can a run have? Then use lab.best_layout, lab.failure_rates and "
        "lab.checkpoint_tiers on that size.",
        "The grader reads four things: the layout's MFU against the best that keeps the "
        "memory headroom, a placement that keeps a run inside one 32-node unit, the "
        "goodput of your checkpoint tier and interval against the best, and every run "
        "finished within the day. lab.check_design(my_design()) prints what each costs.",
        "Lesson 10's formulas give the interval from the write time and the run's MTBF; "
        "spares matter only when the runs fill the pool.",
    ],
    "estimate": [
        "Take the terms one at a time and write each as a formula before any number: "
        "what is counted, how many times per step, at which bandwidth?",
        "Training FLOPs come from the parameters and the tokens of a step; the bubble "
        "from stages and micro-batches per pipeline; each communication term is an "
        "all-reduce on its own link (NVLink inside a node, InfiniBand across), charged as "
        "lesson 01's ring.",
        "Micro-batches per pipeline are the sequences of a data-parallel replica divided "
        "by the micro-batch. The TP term repeats per layer of a stage, per micro-batch, "
        "four times; the DP term is one all-reduce of the GPU's 16-bit shard.",
    ],
})


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
                      "lab.check_design(my_design()) prints the whole table; change the "
                      "choice that costs the most, then run this again (more help: "
                      "checks.hint('design'))")
    return f"{grade.total}/100 ({summary})"
