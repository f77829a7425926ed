"""Lesson 13's race-free parameter server: the check passes the reference written as a
learner would, refuses the reference itself, and reports each wrong answer (a lost update,
a broken staleness bound, a deadlock that only some interleavings reach, a server that never
returns, an unwritten exercise) as one line that names the cause and the schedule seed to replay."""

import _wrong_ps as W
from _check_helpers import fails, line, learner_namespace, not_started
from workbook.lesson13_interview_prep import _reference_ps as R
from workbook.lesson13_interview_prep import parameter_server as ps

check = ps.check_parameter_server
NAME = "race-free parameter server"


def learner(serve):
    """``serve`` with the reference's worker side, as the check takes them."""
    return (serve, W.push, W.pull, W.sync)


def test_the_reference_typed_by_a_learner_passes(capsys):
    mine = learner_namespace(R, R.serve, R.push, R.pull, R.sync)
    ok, text = line(capsys, check, *(mine[n] for n in ("serve", "push", "pull", "sync")))
    assert ok, text
    assert text == (f"✅ {NAME}: no lost update, staleness violation or deadlock in 61 "
                    "interleavings (3 workers, 4 steps, bound 1, sync at step 3)")


def test_the_reference_itself_is_refused(capsys):
    text = fails(capsys, lambda args: check(*args), (R.serve, R.push, R.pull, R.sync),
                 "reference answer")
    assert text.startswith(f"❌ {NAME}: this function is the workbook's own")


def test_a_lost_update_that_only_other_interleavings_show(capsys):
    answer = (W.serve_snapshot_per_step, W.push_parameters, W.pull_remembering,
              W.sync_remembering)
    program = ps.Program(*answer)
    assert ps.run_once(program, None) is None          # round-robin order: all is well
    verdicts = {seed: ps.run_once(program, seed) for seed in range(8)}
    lost = [seed for seed, v in verdicts.items() if v is not None]
    assert lost and len(lost) < len(verdicts), verdicts
    assert {verdicts[s].kind for s in lost} == {"lost update"}
    text = ps.verdict(ps.run_once(program, lost[0]), [lost[0]])
    assert "was lost (its place in the final parameters is still 0)" in text
    assert f"seeds=[{lost[0]}], round_robin=False" in text
    # the schedule seed named replays it: the same finding, word for word
    assert str(ps.run_once(program, lost[0])) in text
    # the check runs the workers with the reference server first: they push parameters
    fails(capsys, lambda args: check(*args), answer,
          f"❌ {NAME}: your push/pull/sync with the reference server: round-robin order: "
          "worker 1's update of step 0 moved its parameter by",
          "push sends the gradient it was given, unchanged")


def test_a_server_without_bound_breaks_the_staleness_bound(capsys):
    fails(capsys, lambda args: check(*args), learner(W.serve_without_bound),
          "got parameters without worker", "must see every update of steps <",
          "clock[worker] - min(clock) <= bound")


def test_answering_before_applying_breaks_the_staleness_bound(capsys):
    fails(capsys, lambda args: check(*args), learner(W.serve_answers_before_applying),
          "got parameters without worker")


def test_a_server_that_never_rechecks_deadlocks(capsys):
    fails(capsys, lambda args: check(*args), learner(W.serve_never_rechecks),
          "round-robin order: deadlock (rank 0: recv from any rank",
          "after every push, look at all the waiting ones")


def test_head_of_line_deadlocks_under_some_interleavings_only(capsys):
    program = ps.Program(*learner(W.serve_head_of_line))
    verdicts = {seed: ps.run_once(program, seed) for seed in range(12)}
    passing = [seed for seed, v in verdicts.items() if v is None]
    failing = [seed for seed, v in verdicts.items() if v is not None]
    assert passing and failing, verdicts
    assert {verdicts[s].kind for s in failing} == {"deadlock"}
    # a schedule seed replays its interleaving: the same finding, word for word
    seed = failing[0]
    assert str(ps.run_once(program, seed)) == str(verdicts[seed])
    assert ps.run_once(program, passing[0]) is None
    fails(capsys, lambda args: check(*args), learner(W.serve_head_of_line), "deadlock")


def test_a_gradient_received_from_any_source_is_caught(capsys):
    fails(capsys, lambda args: check(*args), learner(W.serve_gradient_from_any),
          "mismatch in send/recv")


def test_a_server_that_spins_is_stopped(capsys, short_timeout):
    fails(capsys, lambda args: check(*args), learner(W.serve_spins),
          "rank 0 was still running after 2 s of work: the ranks used 2 s of CPU time",
          "without calling dist.recv never ends")


def test_an_unwritten_exercise_is_not_started(capsys):
    not_started(capsys, check, learner(W.serve_not_started), NAME,
                "the server's loop: receive a header from any worker, ...")


def test_explore_names_the_first_seed_that_loses_an_update_and_it_replays(capsys):
    assert ps.explore(ps.PLANTED_BUG, [], **ps.PLANTED_OPTIONS) is None   # round-robin
    capsys.readouterr()
    found = ps.explore(ps.PLANTED_BUG, seeds=range(30), **ps.PLANTED_OPTIONS)
    out = capsys.readouterr().out
    assert found is not None and found.kind == "lost update"
    earlier = [ps.run_once(ps.PLANTED_BUG, s, **ps.PLANTED_OPTIONS) for s in range(found.seed)]
    assert earlier == [None] * found.seed       # the first seed that shows it
    assert out.startswith(f"schedule_seed={found.seed}: worker ")
    assert f"Replay it: explore(program, seeds=[{found.seed}], round_robin=False)." in out
    again = ps.run_once(ps.PLANTED_BUG, found.seed, **ps.PLANTED_OPTIONS)
    assert str(again) == str(found)


def test_the_lesson_demo(capsys):
    found = ps.demo(range(10))
    out = capsys.readouterr().out.splitlines()
    assert out[0].endswith("no lost update, staleness violation or deadlock in 1 "
                           "interleaving (round-robin)")
    assert out[1] == f"planted bug, with seeds:       {found}"
    assert out[2].endswith("in 11 interleavings (round-robin and schedule seeds 0-9)")


def test_explore_says_when_nothing_was_found(capsys):
    assert ps.explore(R, seeds=range(3)) is None
    assert capsys.readouterr().out == (
        "no lost update, staleness violation or deadlock in 4 interleavings "
        "(round-robin and schedule seeds 0-2)\n")


def test_judge_names_lost_and_doubled_updates():
    import torch
    final = torch.full((12,), -ps.LR, dtype=torch.float64)
    assert ps.judge(final, []) is None
    final[5] = 0.0
    assert ps.judge(final, [])[1].startswith("worker 2's update of step 1 was lost")
    final[5] = -2 * ps.LR
    assert "applied 2 times" in ps.judge(final, [])[1]
    assert ps.judge(None, [])[1] == "serve returned None, not the parameters"


def test_replay_shows_every_pull_in_order(capsys):
    found = ps.replay(ps.PLANTED_BUG, 0, **ps.PLANTED_OPTIONS)
    out = capsys.readouterr().out.splitlines()
    assert len(out) == ps.WORKERS * ps.STEPS + 2
    assert out[0] == "worker 1 pulls for step 0: 1:.... 2:.... 3:...."
    assert out[-2].startswith("final parameters:          1:")
    assert out[-1] == str(found) and found.kind == "lost update"
    lost = ps.missing(ps.run_program(ps.PLANTED_BUG, 0, **ps.PLANTED_OPTIONS)[0])
    assert lost and found.what.startswith(lost[0])
    assert out[-2].count(".") == len(lost)


def test_a_server_that_returns_something_else_is_named(capsys):
    reference_serve = learner_namespace(R, R.serve)["serve"]

    def serve_returns_a_slice(params, lr, workers, steps, bound):
        return reference_serve(params, lr, workers, steps, bound)[:3]

    fails(capsys, lambda args: check(*args), learner(serve_returns_a_slice),
          "round-robin order: serve returned a float64 tensor of shape (3,), not the "
          "parameters")


# ------------------------------------------- wrong answers with a cause of their own


def test_a_program_that_sends_no_message_is_refused(capsys):
    # all-reduces instead of push and pull: every update arrives, no message is sent
    silent = ps.Program(W.silent_serve, W.silent_push, W.silent_pull, W.silent_pull)
    assert ps.judge(*ps.run_program(silent)) is None      # the values alone pass
    finding = ps.run_once(silent)
    assert finding.kind == "silent"
    assert str(finding) == ("round-robin order: the server sent 0 messages in 4 steps, "
                            "fewer than the 12 the protocol needs")
    assert "share no memory" in finding.hint
    fails(capsys, lambda args: check(*args), tuple(silent),
          "your push/pull/sync with the reference server", "deadlock",
          "each request starts with its one-element header")


def test_a_missing_learning_rate_is_named_as_such(capsys):
    fails(capsys, lambda args: check(*args), learner(W.serve_without_lr),
          "your serve with the reference workers",
          "every update moved its parameter by -1, the gradient itself, not by -lr",
          "params -= lr * gradient")


def test_a_step_up_the_gradient_is_named_as_such(capsys):
    fails(capsys, lambda args: check(*args), learner(W.serve_up_the_gradient),
          "every update moved its parameter by +0.375, up the gradient",
          "subtract lr * gradient")


def test_a_server_that_stops_early_is_told_so(capsys):
    fails(capsys, lambda args: check(*args), learner(W.serve_stops_early),
          "rank 0: returned", "the server returned after 9 of the 12 pushes",
          "count the pushes received per worker")


def test_a_deadlock_names_the_request_the_bound_allowed(capsys):
    fails(capsys, lambda args: check(*args), learner(W.serve_never_rechecks),
          "worker 1's pull() at step 2 is 0 pushes ahead of the slowest, which the bound "
          "allows, and was never answered", "look at all the waiting ones")


def test_a_pull_without_its_header_is_blamed_on_the_workers(capsys):
    answer = (R.serve, W.push, W.pull_without_header, W.sync)
    fails(capsys, lambda args: check(*args), (W.serve_never_rechecks, *answer[1:]),
          "your push/pull/sync with the reference server", "deadlock",
          "each request starts with its one-element header")
