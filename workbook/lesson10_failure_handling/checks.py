"""The checks of lab 10 (failure handling), on the protocol of :mod:`workbook.checking`.

* :func:`check_resume` crashes ranks of the learner's checkpointing training loop at
  several simulated times (``faults.Crash``, restarts as torchrun's) and compares the final
  parameters bit for bit with the run that never failed; when they differ it finds which
  piece of state the restart forgot by replaying the reference without each piece.
* :func:`check_find_straggler` runs a straggler detector on hidden per-rank step-time
  traces: stragglers to find, and noise, spikes and whole-job slowdowns to leave alone.
* :func:`check_checkpoint_interval` compares Daly's interval numerically.
* :func:`check_recovery` drives a sharded parameter server on the simulated cluster with
  the learner's recovery plan after worker and server failures, and checks that every
  slice applied every round's update exactly once.

The reference answers (:mod:`._reference`) are imported inside the checks only; the
lesson's own demos (:mod:`.demos`) are refused, never imported here.
"""

import bisect
import copy
import functools
import numbers
import os
import sys
import tempfile

import torch
import torch.distributed as dist

import simcluster as sc
from simcluster import faults
from workbook.models import TinyMLP, chunk_bounds
from workbook.checking import (Failure, answers, check, listed, num, on_a_rank,
                               refuse_reference, short, simulate)
from workbook.hints import Hints
from workbook.lesson10_failure_handling import lab as job


_reference = answers(__name__)   # the answers, imported only while a check runs


# Progressive help, one step per call of checks.hint("resume") in the lab: a question, the
# idea, then the shape of the code (workbook.hints).
hint = Hints({
    "resume": [
        "A restart is a new process: it starts from job.build() again. List what the next "
        "step depends on that build() does not give back as it was, and where each one "
        "lives (lesson 10, section 2).",
        "Model, optimizer and scheduler each have a state_dict(); the data position is the "
        "step; the dropout RNG is per rank (torch.get_rng_state()). One rank can write "
        "them all if it first collects every rank's RNG state. A file written in place "
        "and torn by a crash is worse than none: write elsewhere, then rename.",
        "At the start: if the file exists, load it and put each piece back (this rank's "
        "own RNG state), step = the saved step. Every `every` steps: all ranks gather "
        "their RNG states, rank 0 saves a dict to a temporary name and os.replace()s it "
        "onto the real one.",
    ],
    "straggler": [
        "A straggler is slow most of the time, a pause is slow once, a congested network "
        "slows everyone. Which statistic of a rank's step times ignores a few outliers, "
        "and what do you compare it with so that a job-wide slowdown blames nobody?",
        "The median of each rank's row, compared with the median of those medians: more "
        "than 1.2× is a straggler (exactly the lab's threshold). Return a Python int.",
        "Medians over dim=1, the argmax of them, one comparison, int(...) or None.",
    ],
    "interval": [
        "Daly's formula has two cases. Which one does δ = 2M belong to, exactly?",
        "Write the case split first, with the boundary where the lab puts it ('δ < 2M' "
        "and 'otherwise'), then the formula with x = δ/(2M).",
    ],
    "recovery": [
        "What does a worker hold that survives it? And a server? After each kind of "
        "failure, which slices are at which round?",
        "A worker holds nothing: give its tasks to live workers (all of them, including "
        "tasks it took over earlier) and go on. A server's slices come back only as they "
        "were at the checkpoint; the next gradients need every slice at the same round.",
        "After a server failure: its slices to live servers, every slice in 'reload', and "
        "'round' back to plan['checkpoint'].",
    ],
})


def _refuse_lesson_demos(fn, *names):
    """Fail if ``fn`` is (or calls) one of lesson 10's demo functions ``names``. The demos
    module is only looked at if something has imported it already."""
    demos = sys.modules.get("workbook.lesson10_failure_handling.demos")
    for name in names if demos is not None else ():
        refuse_reference(fn, getattr(demos, name))


# ------------------------------------------------------------ 1. checkpoint, resume

RESUME_STEPS, RESUME_EVERY = 10, 3

RESUME_HINTS = {
    "model": "the model's weights must come back from the checkpoint.",
    "optimizer": "AdamW's moments and step count are state too: a restart without them "
                 "takes different steps.",
    "scheduler": "the learning-rate schedule has state too: without it the schedule "
                 "starts again.",
    "data position": "the step is the data position (job.batch(step)) and the number of "
                     "steps left: a restart must go on from the step it saved.",
    "RNG": "dropout draws from each rank's own torch RNG, whose state the restart does "
           "not bring back.",
    "own RNG": "the RNG states are per rank: each rank must get back its own, not rank "
               "0's.",
    "saved RNG": "the RNG states are per rank: [torch.get_rng_state()] * world_size on rank "
                 "0 saves rank 0's state for everyone. Gather every rank's own "
                 "(dist.all_gather_object) before rank 0 saves.",
}
# How the slip a replay matched reads in the ❌ line ("the same parameters as ...").
RESUME_SLIPS = {"own RNG": "a restart that gives every rank rank 0's RNG state",
                "saved RNG": "a checkpoint that saves rank 0's RNG state for every rank"}


def _train_run(cluster, fn, where, crashes=(), max_restarts=0, **kwargs):
    """Run ``fn(ckpt_dir, RESUME_STEPS, RESUME_EVERY, **kwargs)`` on every rank in a
    fresh directory, with ``crashes`` injected."""
    with tempfile.TemporaryDirectory() as ckpt_dir:
        return simulate(cluster, fn, job.WORLD_SIZE, where, accounting=True,
                        args=(ckpt_dir, RESUME_STEPS, RESUME_EVERY), kwargs=kwargs,
                        faults=list(crashes), max_restarts=max_restarts)


def _same_params(run, expected, where):
    """Fail if a rank returned something other than a tensor like ``expected``; return
    whether every rank's tensor equals ``expected`` bit for bit."""
    for rank, got in enumerate(run.results):
        if not isinstance(got, torch.Tensor):
            raise Failure(f"{where}: rank {rank} returned {type(got).__name__}, not the "
                          "parameters", "return job.params(model) on every rank.")
        if got.shape != expected.shape or got.dtype != expected.dtype:
            raise Failure(f"{where}: rank {rank} returned a tensor of shape "
                          f"{tuple(got.shape)} ({got.dtype}), expected {tuple(expected.shape)}"
                          f" ({expected.dtype})", "return job.params(model) on every rank.")
    return all(torch.equal(got, expected) for got in run.results)


# A restart that goes on one step after (or before) the step it saved: what it amounts
# to, and the hint. Checked after the forgotten pieces.
STEP_SLIPS = {
    1: ("a restart that goes on one step after the step it saved (one step's batch "
        "skipped)", "the step you save is the number of steps done, the next one to "
                    "run: go on from it as it is, and save it after step += 1."),
    -1: ("a restart that goes on one step before the step it saved (one step done twice)",
         "the step you save is the number of steps done, the next one to run: go on from "
         "it as it is, and save it after step += 1."),
}


def _forgotten_piece(cluster, ref, crashes, got):
    """The slip whose replay with the reference gives ``got``: a piece of state the
    restart does not restore (a name of ``ref.PIECES``), a step off by one (1 or -1 of
    :data:`STEP_SLIPS`), or None."""
    slips = [dict(leave_out=piece) for piece in (*ref.PIECES, "own RNG", "saved RNG")]
    slips += [dict(step_shift=shift) for shift in STEP_SLIPS]
    for slip in slips:
        run = _train_run(cluster, ref.train, lambda rank: "", crashes, len(crashes), **slip)
        if torch.equal(run.results[0], got):
            return slip.get("leave_out", slip.get("step_shift"))
    return None


@functools.lru_cache(maxsize=1)
def _reference_runs():
    """The cluster and the reference's fault-free run (the same every time: cached)."""
    cluster = sc.Cluster.preset("dgx-a100", nodes=1)
    return cluster, _train_run(cluster, _reference().train, str)


# (rank, share of the fault-free run's time): before the first checkpoint, between two, and
# after the last; then a second crash in the attempt restarted after the middle one.
CRASHES = ((1, 0.12), (0, 0.5), (3, 0.97))
SECOND_CRASH = (2, 0.3)


def _crash_cases(t):
    """``[(description, crashes, whether the restart must be short)]`` for a run whose
    fault-free time is ``t``: the last checkpoint of a crash at 97 % leaves little to do
    again; a restart that takes as long as the whole run started over."""
    cases = [(f"rank {rank} crashed at {num(share * 100)} % of the run",
              [faults.Crash(rank=rank, at=share * t)], share > 0.9)
             for rank, share in CRASHES]
    first = cases[1][1][0]
    rank, share = SECOND_CRASH
    second = faults.Crash(rank=rank, at=first.at + faults.DEFAULT_RESTART_DELAY_S + share * t)
    cases.append((f"rank {first.rank} crashed at 50 % of the run, then rank {rank} in the "
                  "restarted run", [first, second], False))
    return cases


def _torn_write_case(run):
    """``[(description, crashes, False)]``: a crash in the middle of the second checkpoint
    write of the first rank that writes two (in ``run``, the learner's fault-free run),
    which leaves a file written in place torn; ``[]`` if no rank writes twice."""
    for rank in range(job.WORLD_SIZE):
        writes = [e for e in run.clock(rank).events
                  if e.lane == "io" and e.label.startswith("write")]
        if len(writes) >= 2:
            middle = (writes[1].start + writes[1].end) / 2
            return [(f"rank {rank} crashed in the middle of writing the 2nd checkpoint",
                     [faults.Crash(rank=rank, at=middle)], False)]
    return []


def _gradient_all_reduces(run, gradient_bytes):
    """When each training step's gradient all-reduce (DDP's, one per step) ended."""
    return sorted(c.end for c in run.collectives
                  if c.op == "all_reduce" and c.nbytes == gradient_bytes)


def _io_events(run, kind):
    """Every rank's ``kind`` ("read" or "write") storage events in ``run``."""
    return [e for rank in range(len(run.results)) for e in run.clock(rank).events
            if e.lane == "io" and e.label.startswith(kind)]


def _resumed_from_memory(run, gradient_bytes):
    """The step the last attempt of ``run`` went on from, if it took fewer than all the
    steps without reading storage (a "checkpoint" kept in the Python process, which a real
    restart does not have), else None."""
    if not run.restarts:
        return None
    since = run.restarts[-1].restarted
    steps = sum(t >= since for t in _gradient_all_reduces(run, gradient_bytes))
    if steps < RESUME_STEPS and not any(e.start >= since for e in _io_events(run, "read")):
        return RESUME_STEPS - steps
    return None


def _checkpoint_steps(run, gradient_bytes):
    """The steps after which a rank of ``run`` wrote to storage, counted by the gradient
    all-reduces (DDP's: one of ``gradient_bytes`` per step) that ended before each write."""
    ends = _gradient_all_reduces(run, gradient_bytes)
    return {bisect.bisect_right(ends, e.start) for e in _io_events(run, "write")}


TORN_HINT = ("a crash during the write left a half-written file where the checkpoint was: "
             "the previous checkpoint must stay whole until the new one is complete. "
             + hint.pointer("resume"))


@check("checkpoint and resume")
def check_resume(fn):
    """``fn(ckpt_dir, steps, every)`` on every rank: train :mod:`job` for ``steps`` steps,
    checkpoint every ``every`` steps into ``ckpt_dir``, resume from the latest checkpoint
    after a restart, return ``job.params(model)``. Crashed at several times, the final
    parameters must be bit-identical to the fault-free run's, and the restarted attempt
    must resume rather than start over."""
    ref = _reference()
    refuse_reference(fn, ref.train)
    cluster, clean_ref = _reference_runs()
    expected = clean_ref.results[0]
    where = "without a failure"
    clean = _train_run(cluster, fn, lambda rank: where)
    if not _same_params(clean, expected, where):
        raise Failure(f"{where}: the final parameters differ from {RESUME_STEPS} steps of "
                      "the job", "without a failure your loop must train exactly as the "
                      "job does: build it once, then one train step per step, in order, "
                      "each with that step's batch; saving a checkpoint must not change "
                      "the training.")
    written = sum(io["write"] for io in clean.storage_io)
    if written == 0:
        raise Failure(f"{where}: no rank wrote a checkpoint (torch.save or dcp.save to a "
                      "file in ckpt_dir)", f"every {RESUME_EVERY} steps, save what a "
                      "restart needs into ckpt_dir.")
    gradient_bytes = expected.numel() * expected.element_size()
    saved_after = _checkpoint_steps(clean, gradient_bytes)
    due = list(range(RESUME_EVERY, RESUME_STEPS + 1, RESUME_EVERY))
    if not set(due) <= saved_after:
        raise Failure(f"{where}: checkpoints were written after step(s) "
                      f"{listed(sorted(saved_after))} only; every {RESUME_EVERY} steps of "
                      f"{RESUME_STEPS} is after steps {listed(due)}",
                      f"save every {RESUME_EVERY} steps, each time, not only the first: a "
                      "crash redoes the work since the latest checkpoint.")
    torn = _torn_write_case(clean)
    cases = _crash_cases(clean.elapsed) + torn
    for what, crashes, short_restart in cases:
        try:
            run = _train_run(cluster, fn, lambda rank: what, crashes, len(crashes))
        except Failure as failure:
            if "middle of writing" in what:
                raise Failure(f"{failure.what} (after the restart, reading a torn "
                              "checkpoint?)", TORN_HINT) from None
            raise
        if "middle of writing" in what and not _same_params(run, expected, what):
            raise Failure(f"{what}: the final parameters after the restart differ from the "
                          "fault-free run", TORN_HINT)
        if not _same_params(run, expected, what):
            piece = _forgotten_piece(cluster, ref, crashes, run.results[0])
            if piece in STEP_SLIPS:
                raise Failure(f"{what}: the final parameters after the restart differ from "
                              f"the fault-free run: the same parameters as "
                              f"{STEP_SLIPS[piece][0]}", STEP_SLIPS[piece][1])
            slip = RESUME_SLIPS.get(piece, f"a restart that does not restore the {piece}")
            found = f": the same parameters as {slip}" if piece else ""
            raise Failure(f"{what}: the final parameters after the restart differ from the "
                          f"fault-free run{found}",
                          (RESUME_HINTS[piece] if piece else
                           "something the next steps depend on did not come back as it "
                           "was: model, optimizer, scheduler, the step, every rank's own "
                           "RNG state?") + " " + hint.pointer("resume"))
        resumed = _resumed_from_memory(run, gradient_bytes)
        if resumed is not None:
            raise Failure(f"{what}: the restarted run went on from step {resumed} but read "
                          "no checkpoint from storage",
                          "a real restart is a new process: nothing kept in Python memory (a "
                          "module-level dict, a global) survives it. Load the checkpoint "
                          "from its file in ckpt_dir (torch.load or dcp.load).")
        last = run.elapsed - run.restarts[-1].restarted if run.restarts else 0.0
        if short_restart and last > 0.8 * clean.elapsed:
            raise Failure(f"{what}: the restarted run took {num(last * 1e3)} ms, as long as "
                          f"the whole run ({num(clean.elapsed * 1e3)} ms): it started over "
                          "instead of resuming", "when a checkpoint exists in ckpt_dir, "
                          "load it and go on from its step (os.path.exists).")
    ref_written = sum(io["write"] for io in clean_ref.storage_io)
    if written > 1.5 * ref_written:
        raise Failure(f"without a failure: your run wrote {num(written)} bytes of "
                      f"checkpoints, {written / ref_written:.1f}× what one checkpoint every "
                      f"{RESUME_EVERY} steps, written once, needs ({num(ref_written)})",
                      "save every `every` steps, and only one rank (rank 0) writes the "
                      "state every rank holds the same.")
    return resume_passed(cases, torn=bool(torn))


def resume_passed(cases, torn):
    """check_resume's ✅ text: the scenarios it ran, the torn write only if it ran one."""
    during = ", one during a checkpoint write" if torn else ""
    return (f"bit-identical to the fault-free run after {len(cases)} crash scenarios (ranks "
            f"0-3, before, between and after checkpoints, two crashes in one run{during}), "
            "resuming from the latest checkpoint")


# ---------------------------------------------------------- 2. find the straggler

STRAGGLER_THRESHOLD = 1.2


def _traces():
    """``[(description, step_times, expected)]``: hidden step-time traces
    (``[rank][step]``, seconds) with a straggler to find or only noise."""
    g = torch.Generator().manual_seed(1010)
    cases = []
    # step times from tens of µs to seconds: a threshold in seconds cannot fit them all
    for world, steps, slow, scale in ((4, 20, 2, 1), (8, 30, 5, 1), (16, 24, 0, 1e-3),
                                      (3, 15, 1, 20)):
        base = scale * (0.05 + 0.1 * torch.rand(1, generator=g, dtype=torch.float64).item())
        speed = 1 + 0.04 * (torch.rand(world, 1, generator=g, dtype=torch.float64) - 0.5)

        def noisy():
            jitter = 1 + 0.03 * torch.randn(world, steps, generator=g, dtype=torch.float64)
            return base * speed * jitter.clamp(min=0.9)

        size = f"{world} ranks × {steps} steps"
        cases.append((f"{size}, noise only", noisy(), None))
        light = noisy()
        light[(slow + 1) % world] *= 0.75     # less work (a smaller shard): faster, not a fault
        cases.append((f"{size}, noise only, rank {(slow + 1) % world} at 0.75× the step time "
                      "(a lighter shard)", light, None))
        spiky = noisy()
        spiky[slow, steps // 4] *= 6          # a GC pause, a checkpoint write, ...
        spiky[slow, steps // 2] *= 5
        spiky[(slow + 1) % world, steps - 1] *= 8
        cases.append((f"{size}, a few slow steps (pauses) on ranks {slow} and "
                      f"{(slow + 1) % world}", spiky, None))
        everyone = noisy()
        everyone[:, steps // 3:] *= 2.5      # the whole job slows down: not one rank
        cases.append((f"{size}, every rank 2.5× slower from step {steps // 3}", everyone, None))
        for factor, start in ((1.5, 0), (3.0, steps // 3)):
            trace = noisy()
            trace[slow, start:] *= factor
            cases.append((f"{size}, rank {slow} {num(factor)}× slower from step {start}",
                          trace, slow))
    # just above and just below the lab's 1.2×, on steady ranks with 1 % jitter: a
    # threshold other than 1.2 (1.1, 1.3) gets one of them wrong
    for factor, expected in ((1.23, 6), (1.17, None)):
        trace = 0.02 * (1 + 0.01 * torch.randn(8, 40, generator=g, dtype=torch.float64))
        trace[6] *= factor
        cases.append((f"8 ranks × 40 steps, rank 6 {num(factor)}× slower throughout",
                      trace, expected))
    # exactly 1.2×, with no jitter: "more than 1.2×" says no straggler, a ">=" says rank 6
    # (0.25 s is a power of two, so 1.2 × 0.25 / 0.25 is exactly 1.2 however it is computed)
    trace = torch.full((8, 40), 0.25, dtype=torch.float64)
    trace[6] *= STRAGGLER_THRESHOLD
    cases.append(("8 ranks × 40 steps, rank 6 exactly 1.2× slower throughout (not more)",
                  trace, None))
    return cases


def _as_rank(value):
    """An int or None from what a detector returned; Failure-worthy values give ``...``."""
    if value is None:
        return None
    if isinstance(value, numbers.Integral) and not isinstance(value, bool):
        return int(value)   # an int, or a numpy integer
    return ...              # a tensor too: the lab asks for an int


@check("find the straggler")
def check_find_straggler(fn):
    """``fn(step_times)`` (a float64 tensor, ``[rank][step]``, seconds): the straggler's
    rank, or None when no rank is consistently slow."""
    ref = _reference()
    refuse_reference(fn, ref.find_straggler)
    traces = _traces()
    for what, times, expected in traces:
        given = times.clone()
        got = on_a_rank(fn, (given,), f"{what}: find_straggler")
        if not torch.equal(given, times):
            raise Failure(f"{what}: find_straggler changed the step times it was given",
                          "work on a copy (or on values derived from step_times).")
        rank = _as_rank(got)
        if rank is ...:
            tensor = isinstance(got, torch.Tensor)
            raise Failure(f"{what}: find_straggler returned {short(repr(got), 60)}, not a "
                          "rank (an int) or None",
                          "a tensor is not a rank: callers compare it, index lists and "
                          "print it; convert it to a Python int." if tensor else
                          "return the rank as an int, or None.")
        if rank == expected:
            continue
        if expected is None:
            raise Failure(f"{what}: false alarm, rank {rank} reported as a straggler",
                          "judge each rank by a statistic a few slow steps do not move (the "
                          "median of its step times), and compare it with the other ranks' "
                          f"(more than {STRAGGLER_THRESHOLD}× their median).")
        if rank is None:
            raise Failure(f"{what}: no straggler found", "the median of each rank's "
                          f"step times, compared with the median over the ranks: more than "
                          f"{STRAGGLER_THRESHOLD}× is a straggler.")
        raise Failure(f"{what}: reported rank {rank}, the straggler is rank {expected}",
                      "step_times[rank][step]: one row per rank (reduce over dim=1).")
    stragglers = sum(1 for *_, e in traces if e is not None)
    return (f"found {stragglers} stragglers and raised no false alarm on "
            f"{len(traces) - stragglers} traces of noise, pauses and whole-job slowdowns")


# ---------------------------------------------------------- 3. checkpoint interval

# Daly's examples, large and small δ/M, and δ = 2M exactly, where τ = M (the formula would
# give 0.889·M there: "δ < 2M" and "otherwise" meet at that boundary)
INTERVAL_CASES = ((5, 24 * 60), (5, 6 * 60), (5, 15), (2, 480), (0.5, 1e5), (40, 60),
                  (15, 10), (30, 10), (20, 10), (300, 3600 * 24))


@check("checkpoint interval")
def check_checkpoint_interval(fn):
    """``fn(delta, mtbf)``: Daly's optimum interval, within 0.1 %."""
    ref = _reference()
    refuse_reference(fn, ref.checkpoint_interval)
    _refuse_lesson_demos(fn, "daly_interval", "young_interval")
    for delta, mtbf in INTERVAL_CASES:
        where = f"delta={num(delta)}, mtbf={num(mtbf)}"
        got = on_a_rank(fn, (delta, mtbf), f"checkpoint_interval({where})")
        expected = ref.checkpoint_interval(delta, mtbf)
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, numbers.Real):
            raise Failure(f"checkpoint_interval({where}) returned {short(repr(got), 60)}, "
                          "not a number", "return the interval, a float.")
        if abs(got - expected) <= 1e-3 * expected:
            continue
        hint = ("Daly: τ = √(2δM)·[1 + ⅓·√(δ/2M) + (δ/2M)/9] − δ when δ < 2M, else τ = M "
                "(the same unit as delta and mtbf).")
        if delta == 2 * mtbf:
            hint = ("δ = 2M is on the boundary: Daly's τ = M for δ ≥ 2M, so \"otherwise\" "
                    "includes δ = 2M itself.")
        elif delta > 2 * mtbf:
            hint = "when δ ≥ 2M Daly's interval is M itself: checkpoint once per MTBF."
        elif got == mtbf:
            hint = "τ = M only when δ ≥ 2M; for δ < 2M use Daly's formula, even when δ > M."
        raise Failure(f"checkpoint_interval({where}): expected {num(expected)}, got "
                      f"{num(got)}", hint)
    return (f"Daly's interval on {len(INTERVAL_CASES)} cases, incl. his examples "
            f"(δ = 5 min: {num(round(ref.checkpoint_interval(5, 1440), 1))} min for MTBF "
            "24 h) and δ ≥ 2M")


# ------------------------------------------------------- 4. parameter-server recovery

PS_ROUNDS, PS_EVERY, PS_BATCH, PS_LR = 12, 4, 32, 0.5
PLAN_KEYS = ("round", "checkpoint", "workers", "servers", "tasks", "owner", "reload")

# (servers, workers, [(iteration, failure)]): a failure strikes at the start of the
# iteration-th round the job runs (rounds done again after a roll-back count too).
# ("worker", HEIR) is the live worker holding the most tasks then (the lowest if tied).
HEIR = "heir"
RECOVERY_CASES = (
    (2, 4, [(5, ("worker", 3))]),
    (2, 4, [(6, ("server", 1))]),
    (3, 3, [(3, ("worker", 0)), (9, ("server", 0))]),
    (2, 4, [(4, ("server", 0)), (7, ("worker", 1)), (8, ("worker", 2))]),
    # the second failure strikes whichever worker took over the first one's task: a plan
    # that moves only task w of dead worker w leaves that task on a dead worker
    (2, 4, [(3, ("worker", 2)), (5, ("worker", HEIR))]),
    # the next worker up is already dead when worker 3 fails, and a job of 3 workers:
    # "give it to worker (dead + 1) % 4" picks a dead worker or one that does not exist
    (2, 4, [(3, ("worker", 0)), (5, ("worker", 3))]),
    (2, 3, [(4, ("worker", 2))]),
    # two neighbours fail: worker 1 after worker 2, whose task went up to worker 3; "give
    # them to worker (dead + 1) % len(plan['workers'])" picks worker 2, dead already
    (2, 4, [(3, ("worker", 2)), (5, ("worker", 1))]),
)


def _initial_plan(servers, workers):
    """Before any failure: task t on worker t, slice j on server j."""
    return {"round": 0, "checkpoint": 0, "workers": list(range(workers)),
            "servers": list(range(servers)), "tasks": {t: t for t in range(workers)},
            "owner": {j: j for j in range(servers)}, "reload": []}


def _failure_text(failure):
    if failure[1] == HEIR:
        return "then the worker that took over its task"
    return f"{failure[0]} {failure[1]}"


def _resolve(failure, plan):
    """``failure`` with :data:`HEIR` replaced by the worker it names in ``plan``."""
    if failure[1] != HEIR:
        return failure
    load = {w: sum(1 for t in plan["tasks"].values() if t == w) for w in plan["workers"]}
    return ("worker", max(sorted(load), key=lambda w: load[w]))


def _check_plan(before, failure, new, where):
    """Fail at the first thing in the plan ``new`` that the job cannot run."""
    if not isinstance(new, dict) or any(k not in new for k in PLAN_KEYS):
        missing = [k for k in PLAN_KEYS if not isinstance(new, dict) or k not in new]
        raise Failure(f"{where}: recover returned {short(repr(new), 60)}, without "
                      f"{listed(missing)}", "return a new plan: a dict with the keys "
                      f"{listed(PLAN_KEYS)}.")
    kind, dead = failure
    workers = before["workers"] if kind == "server" else [w for w in before["workers"]
                                                          if w != dead]
    servers = before["servers"] if kind == "worker" else [s for s in before["servers"]
                                                          if s != dead]
    for role, alive in (("workers", workers), ("servers", servers)):
        if not isinstance(new[role], list) or sorted(new[role]) != alive:
            raise Failure(f"{where}: plan['{role}'] is {short(repr(new[role]), 40)}, the live "
                          f"{role} are {listed(alive)}", f"plan['{role}'] says who is alive: "
                          f"drop the failed {kind} from it (the job would wait for it "
                          "forever).")
    for key, kinds, what in (("tasks", dict, "a dict {task: worker}"),
                             ("owner", dict, "a dict {slice: server}"),
                             ("reload", (list, tuple, set), "a list of slices")):
        if not isinstance(new[key], kinds):
            raise Failure(f"{where}: plan['{key}'] is {short(repr(new[key]), 40)}, not "
                          f"{what}", f"plan['{key}'] is {what}, like the plan you were "
                          "given: copy it and change what the failure changes.")
    if set(new["tasks"]) != set(before["tasks"]):
        raise Failure(f"{where}: the plan has tasks "
                      f"{listed(sorted(new['tasks'], key=repr))}, the job "
                      f"has {listed(sorted(before['tasks']))}", "every task of a round must "
                      "still be done, by exactly one worker: keep every key of plan['tasks'].")
    for task, worker in sorted(new["tasks"].items()):
        if worker not in workers:
            raise Failure(f"{where}: task {task} is given to worker {worker}, which is not "
                          f"alive (alive: {listed(workers)})", "every task the failed worker holds, "
                          "also one it took over after an earlier failure, goes to a live "
                          "worker. " + hint.pointer("recovery"))
    if set(new["owner"]) != set(before["owner"]):
        raise Failure(f"{where}: the shard map has slices "
                      f"{listed(sorted(new['owner'], key=repr))}, "
                      f"the job has {listed(sorted(before['owner']))}", "every slice needs "
                      "an owner: keep every key of plan['owner'].")
    for piece, server in sorted(new["owner"].items()):
        if server not in servers:
            raise Failure(f"{where}: slice {piece} is owned by server {server}, which is "
                          f"not alive (alive: {listed(servers)})", "rebuild the shard map: "
                          "the failed server's slices go to live servers.")
        if server != before["owner"][piece] and piece not in new["reload"]:
            raise Failure(f"{where}: slice {piece} moved to server {server}, which does not "
                          "hold it, and it is not reloaded", "a slice whose server died "
                          "exists only in the checkpoint: put it in plan['reload'].")
    if (not isinstance(new["round"], numbers.Integral) or isinstance(new["round"], bool)
            or not 0 <= new["round"] <= before["round"]):
        raise Failure(f"{where}: the job is at round {before['round']} and the plan goes on "
                      f"at round {new['round']!r}", "resume at the current round, or go "
                      "back to the checkpoint's round (plan['checkpoint']).")
    if kind == "worker" and new["round"] < before["round"]:
        raise Failure(f"{where}: the plan goes back to round {new['round']}, so round(s) "
                      f"{_ranges(list(range(new['round'], before['round'])))} are computed "
                      "again, though no update was lost", "a worker holds no state: the "
                      "servers already applied every round it took part in. Recovering a "
                      "worker is rescheduling its tasks and going on from plan['round'] "
                      "(reload nothing); rolling back is for a lost server. "
                      + hint.pointer("recovery"))


def _plans(fn, servers, workers, failures, events=None):
    """The plans the job follows: ``{iteration: (failure, new plan)}``, asking ``fn`` at
    each failure (outside the cluster: every rank would decide the same). ``events`` (a
    list) gets ``(round before, checkpoint, round after, slices reloaded)`` per failure."""
    plan, at, iteration, schedule = _initial_plan(servers, workers), dict(failures), 0, {}
    while plan["round"] < PS_ROUNDS and iteration < 4 * PS_ROUNDS:
        if iteration in at:
            failure = _resolve(at[iteration], plan)
            before = dict(copy.deepcopy(plan), reload=[])
            before["checkpoint"] = plan["round"] // PS_EVERY * PS_EVERY
            where = (f"{servers} servers, {workers} workers: {_failure_text(failure)} "
                     f"failed at round {plan['round']}")
            new = on_a_rank(fn, (copy.deepcopy(before), failure), f"{where}: recover")
            _check_plan(before, failure, new, where)
            plan = dict(copy.deepcopy(new), round=int(new["round"]))   # a numpy int too
            schedule[iteration] = (failure, copy.deepcopy(plan))
            if events is not None:
                events.append((before["round"], before["checkpoint"], plan["round"],
                               set(plan["reload"])))
        plan["round"] += 1
        iteration += 1
    return schedule


def _ps_job(problem, servers, workers, schedule, ckpt_dir):
    """A synchronous sharded parameter server (ranks ``0 .. servers-1``; worker ``w`` is
    rank ``servers + w``) that follows the plans of ``schedule``. Returns, on each server,
    ``{slice: (params, rounds applied)}`` for the slices it owns at the end."""
    rank = dist.get_rank()
    bounds = chunk_bounds(problem.num_params, servers)
    path = lambda piece: os.path.join(ckpt_dir, f"slice{piece}.pt")  # noqa: E731

    def save(piece):
        params, applied = state[piece]
        torch.save({"params": params, "applied": applied}, path(piece))

    plan = _initial_plan(servers, workers)
    state = {}
    if rank < servers:
        state[rank] = (problem.init_params()[slice(*bounds[rank])].clone(), [])
        save(rank)
    iteration = 0
    while plan["round"] < PS_ROUNDS:
        if iteration in schedule:
            (kind, dead), plan = schedule[iteration]
            if rank == (dead if kind == "server" else servers + dead):
                return None                       # this process is gone
            for piece in plan["reload"]:
                if plan["owner"][piece] == rank:
                    saved = torch.load(path(piece))
                    state[piece] = (saved["params"], list(saved["applied"]))
            state = {j: s for j, s in state.items() if plan["owner"][j] == rank}
        r = plan["round"]
        mine = sorted(j for j, s in plan["owner"].items() if s == rank)
        if rank < servers:                        # pull: every live worker, every slice
            sends = [dist.isend(state[j][0], servers + w) for w in plan["workers"]
                     for j in mine]
            for work in sends:
                work.wait()
            grads = {j: [] for j in mine}
            for task in sorted(plan["tasks"]):
                for j in mine:
                    grad = torch.empty(bounds[j][1] - bounds[j][0])
                    dist.recv(grad, servers + plan["tasks"][task])
                    grads[j].append(grad)
            for j in mine:                        # the mean, in task order: bit-exact
                params, applied = state[j]
                state[j] = (params - PS_LR * torch.stack(grads[j]).mean(dim=0), applied + [r])
        else:
            me = rank - servers
            params = torch.empty(problem.num_params)
            for j in range(servers):
                buf = torch.empty(bounds[j][1] - bounds[j][0])
                dist.recv(buf, plan["owner"][j])
                params[slice(*bounds[j])] = buf
            for task in sorted(t for t, w in plan["tasks"].items() if w == me):
                x, y = problem.batch(r, task, workers, PS_BATCH)
                _, grad = problem.loss_and_grad(params, x, y)
                for j in range(servers):
                    dist.send(grad[slice(*bounds[j])].contiguous(), plan["owner"][j])
        plan = dict(plan, round=r + 1)
        iteration += 1
        if (r + 1) % PS_EVERY == 0:
            for j in mine:
                save(j)
    return {j: (params.clone(), applied) for j, (params, applied) in state.items()} \
        if rank < servers else None


def _ranges(rounds):
    """``3-5, 9`` for [3, 4, 5, 9]."""
    rounds, parts = sorted(set(rounds)), []
    for r in rounds:
        if parts and parts[-1][1] == r - 1:
            parts[-1][1] = r
        else:
            parts.append([r, r])
    return ", ".join(f"{a}" if a == b else f"{a}-{b}" for a, b in parts)


def _slices(run):
    """``{slice: (params, rounds applied)}`` over every live server of ``run``."""
    found = {}
    for result in run.results:
        found.update(result or {})
    return found


def _lost_cause(piece, events):
    """``": it was reloaded ..."`` for a slice reloaded while the job went on past the
    checkpoint's round (what loses rounds), or ``""``."""
    for before, checkpoint, after, reload in events:
        if piece in reload and after > checkpoint:
            return (f": it was reloaded as it was at round {checkpoint} (the checkpoint), and "
                    f"the job went on at round {after}")
    return ""


def _twice_cause(piece, events):
    """``(what, hint)`` for a slice that applied rounds twice: the job went back while the
    slice kept its rounds, or went back before the checkpoint it was reloaded from."""
    for before, checkpoint, after, reload in events:
        if after < before and piece not in reload:
            return (f": the job went back from round {before} to {after}, and slice {piece} "
                    "was not reloaded, so it had applied those rounds already",
                    "a slice that is not reloaded keeps every round it applied; going back "
                    "makes it apply them again.")
        if piece in reload and after < checkpoint:
            return (f": it was reloaded as at round {checkpoint} and the job went back to "
                    f"round {after}", "the checkpoint already holds every round before "
                    "plan['checkpoint']: going back further redoes them.")
    return "", ("a round is applied again only if the job goes back to it; which slices "
                "still had it?")


@check("parameter-server recovery")
def check_recovery(fn):
    """``fn(plan, failure)``: the new plan after a worker or server failure. Driven through
    a sharded parameter server on the simulated cluster, every slice must apply every
    round's update exactly once and end bit-identical to the run without failure."""
    ref = _reference()
    refuse_reference(fn, ref.recover)
    _refuse_lesson_demos(fn, "sharded_ps_train")
    problem = TinyMLP()
    cluster = sc.Cluster.preset("dgx-a100", nodes=1)
    clean = {}
    for servers, workers, failures in RECOVERY_CASES:
        what = f"{servers} servers, {workers} workers, {listed(_failure_text(f) for _, f in failures)} failing"
        events = []
        schedule = _plans(fn, servers, workers, failures, events)
        if (servers, workers) not in clean:
            with tempfile.TemporaryDirectory() as d:
                clean[servers, workers] = _slices(cluster.run(
                    _ps_job, world_size=servers + workers, accounting=False,
                    args=(problem, servers, workers, {}, d)))
        with tempfile.TemporaryDirectory() as d:
            run = simulate(cluster, _ps_job, servers + workers, lambda rank: what,
                           args=(problem, servers, workers, schedule, d))
        got = _slices(run)
        for piece, (params, applied) in sorted(got.items()):
            lost = sorted(set(range(PS_ROUNDS)) - set(applied))
            twice = sorted({r for r in applied if applied.count(r) > 1})
            if lost:
                raise Failure(f"{what}: updates lost: slice {piece} never applied round(s) "
                              f"{_ranges(lost)}{_lost_cause(piece, events)}",
                              "a slice loaded from the checkpoint has lost the rounds since "
                              "then; the slices that were not reloaded still have them. No "
                              "round to go on from suits both: what would make every slice "
                              "agree? " + hint.pointer("recovery"))
            if twice:
                cause, why = _twice_cause(piece, events)
                raise Failure(f"{what}: updates applied twice: slice {piece} applied round(s)"
                              f" {_ranges(twice)} twice{cause}",
                              why + " " + hint.pointer("recovery"))
        for piece, (params, _) in sorted(clean[servers, workers].items()):
            if not torch.equal(got[piece][0], params):
                raise Failure(f"{what}: slice {piece} differs from the run without failure",
                              "each round must apply the gradients of all its tasks, each "
                              "computed once, on the parameters of that round.")
    return (f"no update lost or applied twice, bit-identical to the fault-free runs, in "
            f"{len(RECOVERY_CASES)} cases of worker and server failures")
