"""Lab 10's checks (failure handling): every check passes the reference answer, refuses the
reference itself (and lesson 10's demos), and reports each mistake the lab is about —
including ones that deadlock or raise — as one exact ❌ line."""

import copy
import functools
import os

import pytest
import torch
import torch.distributed as dist

from _check_helpers import learner_namespace, line, not_started
from workbook.lesson10_failure_handling import _reference as R
from workbook.lesson10_failure_handling import checks
from workbook.lesson10_failure_handling import checks as C
from workbook.lesson10_failure_handling import lab as job

NAMES = {checks.check_resume: "checkpoint and resume",
         checks.check_find_straggler: "find the straggler",
         checks.check_checkpoint_interval: "checkpoint interval",
         checks.check_recovery: "parameter-server recovery"}   # as each check prints it
RESUME, STRAGGLER, INTERVAL, RECOVERY = (f"❌ {name}: " for name in NAMES.values())

MINE = learner_namespace(R, R.train, R.find_straggler, R.checkpoint_interval, R.recover)


def expect(capsys, check, answer, message):
    assert line(capsys, check, answer)[1] == message


def starts(capsys, check, answer, prefix):
    _, text = line(capsys, check, answer)
    assert text.startswith(prefix), text
    return text


# ------------------------------------------------------------ the reference passes


@pytest.mark.parametrize("check, answer, text", [
    pytest.param(checks.check_resume, MINE["train"],
                 "bit-identical to the fault-free run after 5 crash scenarios (ranks 0-3, "
                 "before, between and after checkpoints, two crashes in one run, one during a "
                 "checkpoint write), resuming from the latest checkpoint",
                 marks=pytest.mark.slow),
    (checks.check_find_straggler, MINE["find_straggler"],
     "found 9 stragglers and raised no false alarm on 18 traces of noise, pauses and "
     "whole-job slowdowns"),
    (checks.check_checkpoint_interval, MINE["checkpoint_interval"],
     "Daly's interval on 10 cases, incl. his examples (δ = 5 min: 116.7 min for MTBF 24 h) "
     "and δ ≥ 2M"),
    (checks.check_recovery, MINE["recover"],
     "no update lost or applied twice, bit-identical to the fault-free runs, in 8 cases of "
     "worker and server failures"),
])
def test_reference_passes(capsys, check, answer, text):
    expect(capsys, check, answer, f"✅ {NAMES[check]}: {text}")


@pytest.mark.parametrize("check, reference", [
    (checks.check_resume, R.train),
    (checks.check_find_straggler, R.find_straggler),
    (checks.check_checkpoint_interval, R.checkpoint_interval),
    (checks.check_recovery, R.recover),
])
def test_the_reference_itself_is_refused(capsys, check, reference):
    expect(capsys, check, reference,
           f"❌ {NAMES[check]}: this function is the workbook's own reference answer, not "
           "yours — Hint: the exercise is to write it yourself, in the cell above.")


def test_lesson_demos_are_refused(capsys):
    from workbook.lesson10_failure_handling import demos as failures

    for demo in (failures.daly_interval, lambda d, m: failures.daly_interval(d, m)):
        starts(capsys, checks.check_checkpoint_interval, demo,
               f"{INTERVAL}this function is the workbook's own reference answer")
    starts(capsys, checks.check_recovery, failures.sharded_ps_train,
           f"{RECOVERY}this function is the workbook's own reference answer")


def test_an_unwritten_exercise_says_so(capsys):
    def find_straggler(step_times):
        raise NotImplementedError("use the median")

    not_started(capsys, checks.check_find_straggler, find_straggler,
                NAMES[checks.check_find_straggler], "use the median")


# ------------------------------------------------------------ 1. checkpoint and resume


def learner_train(ckpt_dir, steps, every, forget=None, save_every_step=False,
                  gather_on_rank_0=False, load_missing_key=False, in_place=False,
                  step_shift=0):
    """The reference loop as a learner writes it, with one mistake chosen by keyword."""
    rank = dist.get_rank()
    model, ddp, optimizer, scheduler = job.build()
    path = os.path.join(ckpt_dir, "latest.pt")
    step = 0
    if os.path.exists(path) and forget != "to load":
        ckpt = torch.load(path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        if forget != "optimizer":
            optimizer.load_state_dict(ckpt["optimizer"])
        if forget != "scheduler":
            scheduler.load_state_dict(ckpt["scheduler"])
        if forget != "RNG":
            torch.set_rng_state(ckpt["rng"][0 if forget == "own RNG" else rank])
        if forget != "data position":
            step = ckpt["step"] + step_shift
        if load_missing_key:
            step = ckpt["epoch"]
    while step < steps:
        job.train_step(ddp, optimizer, scheduler, *job.batch(step))
        step += 1
        if (step % every == 0 or save_every_step) and forget != "to save":
            rngs = [None] * dist.get_world_size()
            if forget == "saved RNG":      # rank 0's own state, for every rank
                rngs = [torch.get_rng_state()] * dist.get_world_size()
            elif rank == 0 or not gather_on_rank_0:
                dist.all_gather_object(rngs, torch.get_rng_state())
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "step": step, "rng": rngs},
                           path if in_place else path + ".tmp")
                if not in_place:
                    os.replace(path + ".tmp", path)
            dist.barrier()
    return job.params(model)


HALF = "rank 0 crashed at 50 % of the run"


@pytest.mark.slow
@pytest.mark.parametrize("piece", ["optimizer", "scheduler", "RNG", "data position"])
def test_resume_finds_the_forgotten_piece(capsys, piece):
    expect(capsys, checks.check_resume, functools.partial(learner_train, forget=piece),
           f"{RESUME}{HALF}: the final parameters after the restart differ from the "
           f"fault-free run: the same parameters as a restart that does not restore the "
           f"{piece} — Hint: {C.RESUME_HINTS[piece]} more help: checks.hint('resume')")


@pytest.mark.slow
def test_resume_with_rank_0s_rng_on_every_rank(capsys):
    expect(capsys, checks.check_resume, functools.partial(learner_train, forget="own RNG"),
           f"{RESUME}{HALF}: the final parameters after the restart differ from the "
           "fault-free run: the same parameters as a restart that gives every rank rank 0's "
           "RNG state — Hint: the RNG states are per rank: each rank must get back its own, "
           "not rank 0's. more help: checks.hint('resume')")


@pytest.mark.slow
def test_resume_saving_rank_0s_rng_for_every_rank(capsys):
    """[torch.get_rng_state()] * world_size (trial nc2) got the generic hint: with no
    gather the crash at 50 % falls elsewhere than in the restore-side replay."""
    expect(capsys, checks.check_resume, functools.partial(learner_train, forget="saved RNG"),
           f"{RESUME}{HALF}: the final parameters after the restart differ from the "
           "fault-free run: the same parameters as a checkpoint that saves rank 0's RNG "
           "state for every rank — Hint: the RNG states are per rank: "
           "[torch.get_rng_state()] * world_size on rank 0 saves rank 0's state for "
           "everyone. Gather every rank's own (dist.all_gather_object) before rank 0 saves. "
           "more help: checks.hint('resume')")


@pytest.mark.slow
def test_resume_that_writes_the_checkpoint_in_place(capsys):
    """A crash during the write tears the only checkpoint; the restart cannot load it."""
    text = starts(capsys, checks.check_resume, functools.partial(learner_train, in_place=True),
                  f"{RESUME}rank 0 crashed in the middle of writing the 2nd checkpoint: rank ")
    assert text.endswith("(after the restart, reading a torn checkpoint?) — Hint: "
                         f"{C.TORN_HINT}"), text


@pytest.mark.slow
def test_resume_that_starts_over(capsys):
    text = starts(capsys, checks.check_resume, functools.partial(learner_train, forget="to load"),
                  f"{RESUME}rank 3 crashed at 97 % of the run: the restarted run took ")
    assert "it started over instead of resuming — Hint: when a checkpoint exists" in text


@pytest.mark.slow
def test_resume_without_checkpoints(capsys):
    expect(capsys, checks.check_resume, functools.partial(learner_train, forget="to save"),
           f"{RESUME}without a failure: no rank wrote a checkpoint (torch.save or dcp.save to "
           "a file in ckpt_dir) — Hint: every 3 steps, save what a restart needs into "
           "ckpt_dir.")


@pytest.mark.slow
def test_resume_with_a_gather_only_rank_0_calls(capsys):
    """On a real cluster this hangs until the watchdog; the simulator names the mismatch."""
    expect(capsys, checks.check_resume, functools.partial(learner_train, gather_on_rank_0=True),
           f"{RESUME}without a failure: mismatch in all_gather #8 on group WORLD: the op "
           "differs (rank 0: all_gather, rank 1: barrier) — Hint: every rank must call the "
           "same collectives, in the same order, with matching arguments.")


@pytest.mark.slow
def test_resume_that_raises_after_the_restart(capsys):
    text = starts(capsys, checks.check_resume,
                  functools.partial(learner_train, load_missing_key=True), f"{RESUME}{HALF}: rank ")
    assert " raised KeyError: 'epoch' — Hint: read the message above" in text


@pytest.mark.slow
def test_resume_that_checkpoints_every_step(capsys):
    text = starts(capsys, checks.check_resume,
                  functools.partial(learner_train, save_every_step=True),
                  f"{RESUME}without a failure: your run wrote ")
    assert "3.3× what one checkpoint every 3 steps" in text


def test_resume_with_a_training_mistake(capsys):
    def train(ckpt_dir, steps, every):
        return learner_train(ckpt_dir, steps + 1, every)

    expect(capsys, checks.check_resume, train,
           f"{RESUME}without a failure: the final parameters differ from 10 steps of the "
           "job — Hint: without a failure your loop must train exactly as the job does: "
           "build it once, then one train step per step, in order, each with that step's "
           "batch; saving a checkpoint must not change the training.")


# ---------------------------------------------------------- 2. find the straggler


def argmax_of_means(step_times):
    return int(step_times.mean(dim=1).argmax())


def mean_against_threshold(step_times):
    means = step_times.mean(dim=1)
    slowest = int(means.argmax())
    return slowest if means[slowest] > 1.2 * means.median() else None


def over_the_wrong_axis(step_times):
    typical = step_times.median(dim=0).values
    slowest = int(typical.argmax())
    return slowest if typical[slowest] > 1.2 * typical.median() else None


def drops_the_warmup_in_place(step_times):
    step_times[:, 0] = 0          # "ignore the first step", written into the caller's tensor
    return MINE["find_straggler"](step_times)


def against_the_fastest(step_times):
    typical = step_times.median(dim=1).values
    slowest = int(typical.argmax())
    return slowest if typical[slowest] > 1.2 * typical.min() else None


def against_a_threshold_in_seconds(step_times):
    typical = step_times.median(dim=1).values
    slowest = int(typical.argmax())
    return slowest if typical[slowest] - typical.median() > 0.02 else None


def returns_a_float(step_times):
    rank = MINE["find_straggler"](step_times)
    return None if rank is None else float(rank)


@pytest.mark.parametrize("answer, message", [
    (argmax_of_means, "4 ranks × 20 steps, noise only: false alarm, rank 1 reported as a "
                      "straggler"),
    (mean_against_threshold, "4 ranks × 20 steps, a few slow steps (pauses) on ranks 2 and "
                             "3: false alarm, rank 2 reported as a straggler"),
    (over_the_wrong_axis, "4 ranks × 20 steps, rank 2 1.5× slower from step 0: no "
                          "straggler found"),
    (against_the_fastest, "4 ranks × 20 steps, noise only, rank 3 at 0.75× the step "
                          "time (a lighter shard): false alarm, rank 1 reported as a straggler"),
    (against_a_threshold_in_seconds, "16 ranks × 24 steps, rank 0 1.5× slower from step 0: "
                                     "no straggler found"),
    (drops_the_warmup_in_place, "4 ranks × 20 steps, noise only: find_straggler changed the step "
                     "times it was given"),
    (returns_a_float, "4 ranks × 20 steps, rank 2 1.5× slower from step 0: "
                      "find_straggler returned 2.0, not a rank (an int) or None"),
])
def test_find_straggler_mistakes(capsys, answer, message):
    starts(capsys, checks.check_find_straggler, answer, f"{STRAGGLER}{message} — Hint: ")


def test_find_straggler_that_raises(capsys):
    def transposed_index(step_times):
        return step_times[:, 100].argmax()

    starts(capsys, checks.check_find_straggler, transposed_index,
           f"{STRAGGLER}4 ranks × 20 steps, noise only: find_straggler raised IndexError: ")


# ---------------------------------------------------------- 3. checkpoint interval


def young(delta, mtbf):
    return (2 * delta * mtbf) ** 0.5


def daly_without_the_cap(delta, mtbf):
    x = delta / (2 * mtbf)
    return (2 * delta * mtbf) ** 0.5 * (1 + x ** 0.5 / 3 + x / 9) - delta


def daly_without_minus_delta(delta, mtbf):
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return (2 * delta * mtbf) ** 0.5 * (1 + x ** 0.5 / 3 + x / 9)


def daly_capped_at_m(delta, mtbf):
    return mtbf if delta >= mtbf else daly_without_the_cap(delta, mtbf)


DALY_HINT = ("Daly: τ = √(2δM)·[1 + ⅓·√(δ/2M) + (δ/2M)/9] − δ when δ < 2M, else τ = M "
             "(the same unit as delta and mtbf).")


@pytest.mark.parametrize("answer, message", [
    (young, f"checkpoint_interval(delta=5, mtbf=1440): expected 116.7, got 120 — Hint: "
            f"{DALY_HINT}"),
    (daly_without_minus_delta, f"checkpoint_interval(delta=5, mtbf=1440): expected 116.7, "
                               f"got 121.7 — Hint: {DALY_HINT}"),
    (daly_without_the_cap, "checkpoint_interval(delta=30, mtbf=10): expected 10, got 8.577 "
                           "— Hint: when δ ≥ 2M Daly's interval is M itself: checkpoint "
                           "once per MTBF."),
    (daly_capped_at_m, "checkpoint_interval(delta=15, mtbf=10): expected 8.764, got 10 — "
                       "Hint: τ = M only when δ ≥ 2M; for δ < 2M use Daly's formula, "
                       "even when δ > M."),
    (lambda delta, mtbf: f"{young(delta, mtbf):.1f} min",
     "checkpoint_interval(delta=5, mtbf=1440) returned '120.0 min', not a number — Hint: "
     "return the interval, a float."),
    (lambda delta, mtbf: math_domain_error(delta - mtbf),
     "checkpoint_interval(delta=5, mtbf=1440) raised ValueError: math domain error — Hint: "),
])
def test_checkpoint_interval_mistakes(capsys, answer, message):
    starts(capsys, checks.check_checkpoint_interval, answer, f"{INTERVAL}{message}")


def math_domain_error(x):
    import math
    return math.sqrt(x)


# ------------------------------------------------------- 4. parameter-server recovery


def seed_flow(plan, failure):
    """The protocol article's handle_node_failure: only the failed server's slices are reloaded."""
    kind, dead = failure
    new = copy.deepcopy(plan)
    if kind == "worker":
        return MINE["recover"](plan, failure)
    new["servers"] = [s for s in plan["servers"] if s != dead]
    new["reload"] = [j for j, s in plan["owner"].items() if s == dead]
    for j in new["reload"]:
        new["owner"][j] = new["servers"][0]
    return new


def rolls_back_without_reloading(plan, failure):
    """Back to the checkpoint's round on every failure, reloading only for servers."""
    new = MINE["recover"](plan, failure)
    new["round"] = plan["checkpoint"]
    return new


def forgets_the_workers_tasks(plan, failure):
    kind, dead = failure
    new = MINE["recover"](plan, failure)
    if kind == "worker":
        new["tasks"] = dict(plan["tasks"])
    return new


def reloads_only_the_dead_slice_but_rolls_back(plan, failure):
    new = MINE["recover"](plan, failure)
    if failure[0] == "server":
        new["reload"] = [j for j, s in plan["owner"].items() if s == failure[1]]
    return new


def moves_a_slice_without_reloading(plan, failure):
    new = MINE["recover"](plan, failure)
    new["reload"] = []
    return new


def drops_a_task(plan, failure):
    new = MINE["recover"](plan, failure)
    if failure[0] == "worker":
        del new["tasks"][failure[1]]
    return new


def keeps_the_dead_in_the_plan(plan, failure):
    """Reschedules and rebuilds the shard map, but still lists the failed node as alive."""
    new = MINE["recover"](plan, failure)
    new["workers"], new["servers"] = list(plan["workers"]), list(plan["servers"])
    return new


def assumes_a_list(plan, failure):
    return plan["workers"].index(failure[1]) + plan["tasks"][None]


@pytest.mark.parametrize("answer, message", [
    (seed_flow, "2 servers, 4 workers, server 1 failing: updates lost: slice 1 never "
                "applied round(s) 4-5: it was reloaded as it was at round 4 (the "
                "checkpoint), and the job went on at round 6 — Hint: a slice loaded from "
                "the checkpoint has lost the rounds since then"),
    (rolls_back_without_reloading, "2 servers, 4 workers: worker 3 failed at round 5: the "
                                   "plan goes back to round 4, so round(s) 4 are computed "
                                   "again, though no update was lost"),
    (reloads_only_the_dead_slice_but_rolls_back,
     "2 servers, 4 workers, server 1 failing: updates applied twice: slice 0 applied "
     "round(s) 4-5 twice: the job went back from round 6 to 4, and slice 0 was not "
     "reloaded, so it had applied those rounds already — Hint: a slice that is not "
     "reloaded keeps every round it applied"),
    (forgets_the_workers_tasks, "2 servers, 4 workers: worker 3 failed at round 5: task 3 "
                                "is given to worker 3, which is not alive (alive: 0, 1, 2)"),
    (moves_a_slice_without_reloading, "2 servers, 4 workers: server 1 failed at round 6: "
                                      "slice 1 moved to server 0, which does not hold it, "
                                      "and it is not reloaded"),
    (drops_a_task, "2 servers, 4 workers: worker 3 failed at round 5: the plan has tasks "
                   "0, 1, 2, the job has 0, 1, 2, 3"),
    (keeps_the_dead_in_the_plan, "2 servers, 4 workers: worker 3 failed at round 5: "
                                 "plan['workers'] is [0, 1, 2, 3], the live workers are 0, "
                                 "1, 2 — Hint: plan['workers'] says who is alive: drop the "
                                 "failed worker from it"),
    (assumes_a_list, "2 servers, 4 workers: worker 3 failed at round 5: recover raised "
                     "KeyError: None"),
    (lambda plan, failure: None, "2 servers, 4 workers: worker 3 failed at round 5: recover "
                                 "returned None, without round, checkpoint, workers"),
])
def test_recovery_mistakes(capsys, answer, message):
    starts(capsys, checks.check_recovery, answer, f"{RECOVERY}{message}")


def test_a_plan_that_deadlocks_is_reported(capsys, monkeypatch):
    """Without the structural checks a forgotten task leaves the servers waiting for a dead
    worker: the simulator's deadlock report comes through."""
    monkeypatch.setattr(C, "_check_plan", lambda *args: None)
    text = starts(capsys, checks.check_recovery, forgets_the_workers_tasks,
                  f"{RECOVERY}2 servers, 4 workers, worker 3 failing: deadlock (rank 0: recv")
    assert "— Hint: " in text


def rng_file_per_rank(ckpt_dir, steps, every):
    """Another right answer: each rank saves its own RNG state in its own file, written
    before rank 0's checkpoint, which commits the step (a restart reads the RNG file of
    the step the checkpoint names)."""
    rank = dist.get_rank()
    model, ddp, optimizer, scheduler = job.build()
    path = os.path.join(ckpt_dir, "latest.pt")
    step = 0
    if os.path.exists(path):
        ckpt = torch.load(path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        step = ckpt["step"]
        torch.set_rng_state(torch.load(os.path.join(ckpt_dir, f"rng{rank}-{step}.pt")))
    while step < steps:
        job.train_step(ddp, optimizer, scheduler, *job.batch(step))
        step += 1
        if step % every == 0:
            torch.save(torch.get_rng_state(), os.path.join(ckpt_dir, f"rng{rank}-{step}.pt"))
            dist.barrier()
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "step": step}, path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()
    return job.params(model)


@pytest.mark.slow
def test_resume_accepts_another_right_answer(capsys):
    assert line(capsys, checks.check_resume, rng_file_per_rank)[0]


def test_a_detector_that_never_returns_is_stopped(capsys, short_timeout):
    def waits_for_a_spike(step_times):
        while True:
            pass

    starts(capsys, checks.check_find_straggler, waits_for_a_spike,
           f"{STRAGGLER}4 ranks × 20 steps, noise only: find_straggler: your function was "
           "still running after 2 s of work: it used 2 s of CPU time (an endless loop?) — Hint: ")


# ------------------------------------------- malformed plans are a ❌ (issue 24, item 9)


def replaced(key, value):
    """The reference's plan with ``key`` set to ``value``."""

    def recover(plan, failure):
        return dict(MINE["recover"](plan, failure), **{key: value})

    return recover


WORKER_3 = f"{RECOVERY}2 servers, 4 workers: worker 3 failed at round 5: "


@pytest.mark.parametrize("key, value, said", [
    ("reload", None, "plan['reload'] is None, not a list of slices"),
    ("owner", [0, 1], "plan['owner'] is [0, 1], not a dict {slice: server}"),
    ("owner", None, "plan['owner'] is None, not a dict {slice: server}"),
    ("tasks", None, "plan['tasks'] is None, not a dict {task: worker}"),
    ("tasks", {0: 0, "1": 1, 2: 2, 3: 0}, "the plan has tasks "),
])
def test_malformed_plans_are_a_failure(capsys, key, value, said):
    starts(capsys, checks.check_recovery, replaced(key, value), WORKER_3 + said)


def test_a_round_given_as_a_numpy_integer_is_accepted(capsys):
    import numpy as np

    def recover(plan, failure):
        new = MINE["recover"](plan, failure)
        return dict(new, round=np.int64(new["round"]))

    assert line(capsys, checks.check_recovery, recover)[0]


# ------------------------------ a checkpoint must be real and regular (issue 24, item 10)

_IN_MEMORY = {}     # what a learner might keep "across a restart": it survives only here


def keeps_the_checkpoint_in_a_dict(ckpt_dir, steps, every):
    """Writes a real checkpoint file, but restores from a module-level dict: on a real
    cluster the restart is a new process and the dict is empty."""
    rank = dist.get_rank()
    model, ddp, optimizer, scheduler = job.build()
    saved = _IN_MEMORY.get((ckpt_dir, rank))
    step = 0
    if saved is not None:
        model.load_state_dict(saved["model"])
        optimizer.load_state_dict(saved["optimizer"])
        scheduler.load_state_dict(saved["scheduler"])
        torch.set_rng_state(saved["rng"])
        step = saved["step"]
    while step < steps:
        job.train_step(ddp, optimizer, scheduler, *job.batch(step))
        step += 1
        if step % every == 0:
            state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                     "scheduler": scheduler.state_dict(), "step": step,
                     "rng": torch.get_rng_state()}
            _IN_MEMORY[(ckpt_dir, rank)] = copy.deepcopy(state)
            torch.save(state, os.path.join(ckpt_dir, f"rank{rank}.pt.tmp"))
            os.replace(os.path.join(ckpt_dir, f"rank{rank}.pt.tmp"),
                       os.path.join(ckpt_dir, f"rank{rank}.pt"))
            dist.barrier()
    return job.params(model)


@pytest.mark.slow
def test_resume_from_a_checkpoint_kept_in_memory_is_refused(capsys):
    text = starts(capsys, checks.check_resume, keeps_the_checkpoint_in_a_dict,
                  f"{RESUME}rank 0 crashed at 50 % of the run: the restarted run went on "
                  "from step 3 but read no checkpoint from storage")
    assert "a real restart is a new process" in text, text


def saves_only_once(ckpt_dir, steps, every):
    """`if step == every` for `if step % every == 0`: one checkpoint, at step 3."""
    rank = dist.get_rank()
    model, ddp, optimizer, scheduler = job.build()
    path = os.path.join(ckpt_dir, "latest.pt")
    step = 0
    if os.path.exists(path):
        ckpt = torch.load(path, weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        torch.set_rng_state(ckpt["rng"][rank])
        step = ckpt["step"]
    while step < steps:
        job.train_step(ddp, optimizer, scheduler, *job.batch(step))
        step += 1
        if step == every:
            rngs = [None] * dist.get_world_size()
            dist.all_gather_object(rngs, torch.get_rng_state())
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "step": step, "rng": rngs},
                           path + ".tmp")
                os.replace(path + ".tmp", path)
            dist.barrier()
    return job.params(model)


@pytest.mark.slow
def test_a_loop_that_saves_only_once_is_refused(capsys):
    expect(capsys, checks.check_resume, saves_only_once,
           f"{RESUME}without a failure: checkpoints were written after step(s) 3 only; every "
           "3 steps of 10 is after steps 3, 6, 9 — Hint: save every 3 steps, each time, not "
           "only the first: a crash redoes the work since the latest checkpoint.")


def test_the_resume_pass_line_names_only_the_scenarios_it_ran():
    """Without a rank that writes twice there is no torn-write scenario, and the ✅ line
    must not claim one."""
    cases = [("a", [], False), ("b", [], False)]
    assert "checkpoint write" not in C.resume_passed(cases, torn=False)
    assert "one during a checkpoint write" in C.resume_passed(cases, torn=True)
    assert C.resume_passed(cases, torn=True).startswith(
        "bit-identical to the fault-free run after 2 crash scenarios")


# ------------------------------- issue 30: wrong answers that used to pass, and their hints


def daly_strict(delta, mtbf):
    """'when δ < 2M ... otherwise M' read with > for the cap: at δ = 2M it gives 0.889·M."""
    if delta > 2 * mtbf:
        return mtbf
    return daly_without_the_cap(delta, mtbf)


def test_daly_with_strict_greater_fails_on_the_boundary(capsys):
    starts(capsys, checks.check_checkpoint_interval, daly_strict,
           f"{INTERVAL}checkpoint_interval(delta=20, mtbf=10): expected 10, got 8.889 — "
           "Hint: δ = 2M is on the boundary")


@pytest.mark.parametrize("threshold, message", [
    (1.1, "8 ranks × 40 steps, rank 6 1.17× slower throughout: false alarm, rank 6"),
    (1.3, "8 ranks × 40 steps, rank 6 1.23× slower throughout: no straggler found"),
    (1.05, "false alarm"), (1.45, "no straggler found"),
])
def test_a_threshold_other_than_1_2_fails(capsys, threshold, message):
    def find_straggler(step_times):
        typical = step_times.median(dim=1).values
        slowest = int(typical.argmax())
        return slowest if typical[slowest] > threshold * typical.median() else None

    text = starts(capsys, checks.check_find_straggler, find_straggler, STRAGGLER)
    assert message in text, text


def test_at_least_instead_of_more_than_fails_on_the_boundary(capsys):
    def find_straggler(step_times):
        typical = step_times.median(dim=1).values
        slowest = int(typical.argmax())
        return slowest if typical[slowest] >= 1.2 * typical.median() else None

    text = starts(capsys, checks.check_find_straggler, find_straggler, STRAGGLER)
    assert "rank 6 exactly 1.2× slower throughout (not more): false alarm, rank 6" in text, text


def test_recovery_rolling_back_after_a_worker_failure_is_wasted_work(capsys):
    """Newcomer trial nc2: a worker failure also rolled back to the checkpoint (every slice
    reloaded): bit-identical, so it passed, though the lab says recovering a worker is
    rescheduling and no work may be thrown away."""
    def rolls_back(plan, failure):
        new = MINE["recover"](plan, failure)
        if failure[0] == "worker":
            new["reload"] = sorted(new["owner"])
            new["round"] = plan["checkpoint"]
        return new

    text = starts(capsys, checks.check_recovery, rolls_back,
                  f"{RECOVERY}2 servers, 4 workers: worker 3 failed at round 5: the plan goes "
                  "back to round 4, so round(s) 4 are computed again, though no update was "
                  "lost")
    assert "a worker holds no state" in text and "rescheduling" in text, text


def test_recovery_that_hands_tasks_to_the_next_worker_up_fails(capsys):
    def next_worker_up(plan, failure):
        new = MINE["recover"](plan, failure)
        kind, dead = failure
        if kind == "worker":
            for task, worker in plan["tasks"].items():
                if worker == dead:
                    new["tasks"][task] = (dead + 1) % 4
        return new

    text = starts(capsys, checks.check_recovery, next_worker_up, RECOVERY)
    assert "which is not alive" in text, text


def test_recovery_to_the_next_of_the_live_count_fails_when_neighbours_die(capsys):
    # (dead + 1) % len(plan["workers"]): right while the worker above is alive; two
    # neighbouring failures (2, then 1) give worker 1's task to worker 2, dead already
    def next_of_the_live_count(plan, failure):
        new = MINE["recover"](plan, failure)
        kind, dead = failure
        if kind == "worker":
            for task, worker in plan["tasks"].items():
                if worker == dead:
                    new["tasks"][task] = (dead + 1) % len(plan["workers"])
        return new

    text = starts(capsys, checks.check_recovery, next_of_the_live_count, RECOVERY)
    assert "worker 1 failed at round 5: task 1 is given to worker 2, which is not alive" \
        in text, text


def test_a_0_d_tensor_is_not_a_rank(capsys):
    def find_straggler(step_times):
        typical = step_times.median(dim=1).values
        slowest = typical.argmax()
        return slowest if typical[slowest] > 1.2 * typical.median() else None

    text = starts(capsys, checks.check_find_straggler, find_straggler, STRAGGLER)
    assert "returned tensor(2), not a rank (an int) or None" in text, text
    assert "convert it to a Python int" in text, text


def moves_only_the_task_numbered_like_the_dead_worker(plan, failure):
    """Task w of dead worker w to the first live worker: a task it took over earlier stays
    with it when it dies."""
    kind, dead = failure
    if kind != "worker":
        return MINE["recover"](plan, failure)
    new = copy.deepcopy(plan)
    new["reload"] = []
    new["workers"] = [w for w in plan["workers"] if w != dead]
    new["tasks"][dead] = new["workers"][0]
    return new


def test_a_task_left_on_a_worker_that_died_second_fails(capsys):
    text = starts(capsys, checks.check_recovery,
                  moves_only_the_task_numbered_like_the_dead_worker, RECOVERY)
    assert "which is not alive" in text, text


@pytest.mark.slow
@pytest.mark.parametrize("shift, said", [(1, "one step after"), (-1, "one step before")])
def test_resume_off_by_one_names_the_step(capsys, shift, said):
    text = starts(capsys, checks.check_resume,
                  functools.partial(learner_train, step_shift=shift), f"{RESUME}")
    assert f"the same parameters as a restart that goes on {said} the step it saved" in text
    assert "save it after step += 1" in text


def test_resume_without_a_barrier_passes(capsys):
    """The lab no longer asks for dist.barrier(): the gather before the save and the next
    step's all-reduce already hold every rank at the checkpoint, and the atomic replace
    makes a crash during the write harmless; the reference has none."""
    import inspect
    assert "barrier" not in inspect.getsource(R.train)


@pytest.mark.parametrize("answer", [seed_flow, reloads_only_the_dead_slice_but_rolls_back,
                                    rolls_back_without_reloading])
def test_recovery_failures_name_the_cause_without_handing_over_the_plan(capsys, answer):
    """The newcomer trial: the first recovery ❌ (the article's flow, which reloads only the
    dead server's slice) stated the whole plan ("reload every slice and go back to the
    checkpoint's round (plan['checkpoint'])"). It names what happened to the slice and
    points to checks.hint('recovery') instead."""
    text = starts(capsys, checks.check_recovery, answer, RECOVERY)
    assert "checks.hint('recovery')" in text, text
    for answer_part in ("reload every slice", "plan['checkpoint']", "checkpoint's round"):
        assert answer_part not in text, text
