"""Lesson 13's parameter server on simulated ranks, and the tools that look for its races.

An article about interview questions asks for a whiteboard parameter server with
``push(gradients)``, ``pull() -> parameters`` and ``sync(all_workers)``, "thread-safe".
On a cluster there is no shared memory to lock: rank :data:`SERVER` holds the parameters
and every other rank is a worker that talks to it with ``torch.distributed`` messages. The
server takes requests in whatever order they arrive (``dist.recv(header)`` with no
``src``: any source), so the races live in the order of messages, and one run shows only
one order. :func:`explore` runs a program under many orders (``cluster.run(...,
schedule_seed=k)``) and names the first seed whose run loses an update, breaks the
staleness bound, deadlocks or never ends; running that seed again replays it.

A *program* is anything with four functions (a module, or :class:`Program`):

* ``serve(params, lr, workers, steps, bound)`` — the server's loop, on rank 0. It applies
  ``params -= lr * gradient`` for every push and returns ``params`` once every worker in
  ``workers`` has pushed ``steps`` gradients. A worker's pull is answered only while that
  worker is at most ``bound`` pushes ahead of the slowest worker (stale-synchronous
  parallel, Ho et al. 2013): otherwise the answer waits until the others catch up.
* ``push(gradients)`` — a worker sends one gradient.
* ``pull(params) -> params`` — a worker asks for the current parameters (into ``params``).
* ``sync(params) -> params`` — the article's ``sync(all_workers)``: a pull that waits until
  every worker has pushed as many gradients as this one (a staleness bound of 0).

The workers' loop is the checker's own (:func:`run_program`): pull (or sync), push a
gradient, ``steps`` times. Each gradient is a one-hot vector, one position per (worker,
step), and the parameters start at zero, so the parameters say exactly which updates they
contain: a lost update is a position still at 0, and a pull that misses an update the
bound promises is a staleness violation. (Powers of two and one-hot sums are exact in
float64, on every CPU.)

The reference answer is in :mod:`._reference_ps`, imported inside the functions that need
it only.
"""

import importlib
from dataclasses import dataclass
from typing import Callable, NamedTuple

import torch
import torch.distributed as dist

import simcluster as sc
from workbook import outputs
from workbook.checking import Failure, NotStarted, check, refuse_reference, simulate

SERVER = 0                 # the rank that holds the parameters
PUSH, PULL, SYNC = 0, 1, 2  # what a worker's request header says it wants
# lr 3/8: exact in binary, and 1/lr is no whole number, so a missing lr (a step of -1)
# is not mistaken for an update applied k times (k·lr)
WORKERS, STEPS, BOUND, LR = 3, 4, 1, 0.375
SYNC_EVERY = 3             # the checker's workers call sync() at steps 3, 6, ... (not pull)
SEEDS = range(60)          # the interleavings a check explores (besides round-robin)


class Program(NamedTuple):
    """The four functions of a parameter-server program (see the module's docstring)."""
    serve: Callable
    push: Callable
    pull: Callable
    sync: Callable


@dataclass
class Finding:
    """What went wrong under one interleaving: ``seed`` (None: round-robin) replays it."""
    seed: object
    kind: str      # "lost update", "wrong update", "staleness", "deadlock", "never ends",
    #                "silent" (too few messages), "error"
    what: str
    hint: str

    def __str__(self):
        return f"{_order(self.seed)}: {self.what}"


def _order(seed):
    return "round-robin order" if seed is None else f"schedule_seed={seed}"


def _reference_ps():
    return importlib.import_module(f"{__package__}._reference_ps")


def _position(worker_index, step, steps):
    """Where worker ``worker_index``'s gradient of ``step`` is 1."""
    return worker_index * steps + step


def update_name(position, steps=STEPS):
    """``"worker 2's update of step 1"``: what position ``position`` of the parameters
    records (worker ranks are 1, 2, ...; steps 0, 1, ...)."""
    return f"worker {position // steps + 1}'s update of step {position % steps}"


def missing(params, steps=STEPS):
    """The updates ``params`` (a run's parameters) does not contain, by name."""
    return [update_name(i, steps) for i, value in enumerate(params.tolist()) if value == 0.0]


def run_program(program, schedule_seed=None, workers=WORKERS, steps=STEPS, bound=BOUND,
                lr=LR, sync_every=SYNC_EVERY, state=None):
    """Run ``program`` once: rank 0 serves, ranks 1..``workers`` pull (every
    ``sync_every``-th step: sync) and push ``steps`` times. Returns
    ``(final parameters, [(worker, step, how, parameters it got)])``, in the order the
    pulls returned. A deadlock, an error on a rank or a run that never ends raises
    :class:`~workbook.checking.Failure` (:func:`~workbook.checking.simulate`). No
    accounting: only the order matters here (workers: 7 at most, one DGX node).

    ``state`` (a dict), if given, is filled as the run goes, so that it tells what the
    workers were doing when a run fails: ``pushed`` (pushes that returned, per worker),
    ``asking`` (``worker: (step, "pull" or "sync")`` while a request is open) and, after
    a run that ends, ``messages`` (point-to-point messages each rank sent).
    """
    size = workers * steps
    seen = []
    state = {} if state is None else state
    pushed = state.setdefault("pushed", {w: 0 for w in range(1, workers + 1)})
    asking = state.setdefault("asking", {})

    def body():
        rank = dist.get_rank()
        if rank == SERVER:
            return program.serve(torch.zeros(size, dtype=torch.float64), lr,
                                 list(range(1, workers + 1)), steps, bound)
        for step in range(steps):
            how = "sync" if sync_every and step and step % sync_every == 0 else "pull"
            asking[rank] = (step, how)
            got = getattr(program, how)(torch.zeros(size, dtype=torch.float64))
            del asking[rank]
            seen.append((rank, step, how, got.clone() if isinstance(got, torch.Tensor)
                         else got))
            gradient = torch.zeros(size, dtype=torch.float64)
            gradient[_position(rank - 1, step, steps)] = 1.0
            program.push(gradient)
            pushed[rank] += 1
        return None

    run = simulate(sc.Cluster.preset("dgx-a100"), body, workers + 1,
                   lambda rank: _order(schedule_seed), accounting=False,
                   schedule_seed=schedule_seed)
    state["messages"] = list(run.messages_sent)
    return run.results[SERVER], seen


def judge(final, seen, lr=LR, steps=STEPS, bound=BOUND, workers=WORKERS):
    """The first thing wrong with one run's result (:func:`run_program`), as
    ``(kind, what, hint)``, or None."""
    size = workers * steps
    if not isinstance(final, torch.Tensor) or final.dtype != torch.float64 or \
            tuple(final.shape) != (size,):
        return ("error", f"serve returned {_describe(final)}, not the parameters",
                "return params (the float64 tensor serve was given) once every worker has "
                "pushed its last gradient.")
    for position, value in enumerate(final.tolist()):
        if value == 0.0:
            return ("lost update", f"{update_name(position, steps)} was lost (its place "
                    "in the final parameters is still 0)", HINTS_PS["lost"])
    if any(value != -lr for value in final.tolist()):
        return _misapplied(final, lr, steps)
    for worker, step, how, got in seen:
        if not isinstance(got, torch.Tensor) or tuple(got.shape) != (size,):
            return ("error", f"worker {worker}'s {how}() returned {_describe(got)}",
                    "return the tensor you received the parameters into.")
        lead = 0 if how == "sync" else bound
        for position, value in enumerate(got.tolist()):
            other, other_step = divmod(position, steps)
            own = other + 1 == worker
            needed = other_step < step if own else other_step < step - lead
            if needed and value != -lr:
                rule = ("its own earlier pushes" if own else
                        f"every update of steps < {step} - {lead}"
                        if lead else f"every update of steps < {step}")
                return ("staleness", f"worker {worker}'s {how}() at step {step} got "
                        f"parameters without {update_name(position, steps)}, but must see "
                        f"{rule}", HINTS_PS["own" if own else how])
    return None


def _misapplied(final, lr, steps):
    """The finding for the first update that is in the parameters but not as ``-lr``
    (each gradient is a 1): a missing learning rate or a wrong sign shows in every
    update alike; one update applied k times, or mixed up with another, in that one."""
    values = final.tolist()
    if all(value == -1.0 for value in values):
        return ("wrong update", "every update moved its parameter by -1, the gradient "
                f"itself, not by -lr = {-lr:g}", HINTS_PS["lr"])
    if all(value == lr for value in values):
        return ("wrong update", f"every update moved its parameter by +{lr:g}, up the "
                "gradient", HINTS_PS["sign"])
    position, value = next((i, v) for i, v in enumerate(values) if v != -lr)
    name, times = update_name(position, steps), value / -lr
    if times == round(times) and times > 1:
        return ("lost update", f"{name} was applied {times:g} times, not once",
                HINTS_PS["twice"])
    return ("lost update", f"{name} moved its parameter by {value:g}, not by -lr = {-lr:g}: "
            "another update overwrote or undid it", HINTS_PS["lost"])


def _describe(value):
    if isinstance(value, torch.Tensor):
        return f"a {str(value.dtype).replace('torch.', '')} tensor of shape {tuple(value.shape)}"
    return repr(value) if value is None else f"a {type(value).__name__}"


HINTS_PS = {
    "lost": "two pushes must never overwrite each other: the server applies each gradient "
            "to the parameters it holds now (params -= lr * grad), and receives each "
            "gradient from the worker whose header it just read (src=that worker).",
    "twice": "receive each gradient once, into its own buffer, and apply it once.",
    "lr": "an update is the gradient times the learning rate serve was given: "
          "params -= lr * gradient.",
    "sign": "gradient descent goes down the gradient: subtract lr * gradient.",
    "silent": "on a cluster the ranks share no memory: push, pull and sync must carry the "
              "requests, gradients and parameters as messages (dist.send / dist.recv), "
              "and the server must answer with messages too.",
    "own": "a worker's pull must see its own earlier pushes: wait for a push to be "
           "received before asking for the parameters.",
    "pull": "answer a pull only while clock[worker] - min(clock) <= bound; keep the other "
            "requests waiting and answer them after a push (when the slowest worker moves).",
    "sync": "answer a sync only when clock[worker] - min(clock) <= 0: every worker has "
            "pushed as often as this one.",
    "deadlock": "every request the server puts aside must be answered as soon as the "
                "bound allows it: after every push, look at all the waiting ones (not only "
                "the oldest or the newest).",
    "returned": "serve may return only when every worker of workers has pushed steps "
                "gradients: count the pushes received per worker, not the messages.",
    "timeout": "the server learns something new only by receiving a message: a loop that "
               "waits for the clocks to change without calling dist.recv never ends.",
}
# What a finding means when the learner's workers run with the reference server.
_PUSH_AS_GIVEN = ("push sends the gradient it was given, unchanged: the server applies the "
                  "learning rate and keeps the parameters.")
WORKER_HINTS = {
    "deadlock": "each request starts with its one-element header (PUSH, PULL or SYNC) sent "
                "to SERVER; a push then sends its gradient, a pull or a sync then receives "
                "the parameters from SERVER into params.",
    "lost update": _PUSH_AS_GIVEN,
    "wrong update": _PUSH_AS_GIVEN,
    "staleness": "pull and sync receive the parameters from SERVER into params and "
                 "return params.",
}


def run_once(program, schedule_seed=None, **options):
    """:func:`run_program` then :func:`judge`: a :class:`Finding`, or None if the run was
    right. A deadlock, an error, a run that never ends, or a run whose ranks exchanged
    too few messages to carry the protocol is a finding too; an exercise still raising
    the lab's ``NotImplementedError`` raises :class:`NotStarted`."""
    state = {}
    try:
        final, seen = run_program(program, schedule_seed, state=state, **options)
    except NotStarted:
        raise
    except Failure as failure:
        text = str(failure.what)
        if text.startswith(_order(schedule_seed) + ": "):
            text = text[len(_order(schedule_seed)) + 2:]
        if text.startswith("deadlock"):
            return Finding(schedule_seed, "deadlock", *_deadlock(text, state, options))
        if "still running" in text:
            return Finding(schedule_seed, "never ends", text, HINTS_PS["timeout"])
        return Finding(schedule_seed, "error", text, failure.hint)
    keys = {k: options[k] for k in ("lr", "steps", "bound", "workers") if k in options}
    verdict = judge(final, seen, **keys) or _silent(state["messages"], **keys)
    return None if verdict is None else Finding(schedule_seed, *verdict)


def _deadlock(text, state, options):
    """``(what, hint)`` for a deadlock: the server returned too early, or a request the
    bound allows was never answered (which worker, at which step)."""
    steps, bound = options.get("steps", STEPS), options.get("bound", BOUND)
    pushed = state["pushed"]
    done, total = sum(pushed.values()), steps * len(pushed)
    if "rank 0: returned" in text:
        return (f"{text}: the server returned after {done} of the {total} pushes",
                HINTS_PS["returned"])
    slowest = min(pushed.values())
    for worker, (step, how) in sorted(state["asking"].items()):
        lead = pushed[worker] - slowest
        if lead <= (bound if how == "pull" else 0):
            return (f"{text}: worker {worker}'s {how}() at step {step} is {lead} "
                    f"push{'es' if lead != 1 else ''} ahead of the slowest, which the "
                    "bound allows, and was never answered", HINTS_PS["deadlock"])
    return text, HINTS_PS["deadlock"]


def _silent(messages, steps=STEPS, workers=WORKERS, **_):
    """A finding if a rank sent fewer messages than the protocol needs: a worker at least
    a request and a gradient per step, the server a reply per request."""
    for rank, sent in enumerate(messages):
        need = workers * steps if rank == SERVER else 2 * steps
        if sent < need:
            who = "the server" if rank == SERVER else f"worker {rank}"
            return ("silent", f"{who} sent {sent} message{'s' if sent != 1 else ''} in "
                    f"{steps} steps, fewer than the {need} the protocol needs",
                    HINTS_PS["silent"])
    return None


def explore(program, seeds=SEEDS, round_robin=True, quiet=False, progress=False,
            **options):
    """Run ``program`` under round-robin order (if ``round_robin``), then under every
    ``schedule_seed`` in ``seeds``; stop at the first run that loses an update, breaks the
    staleness bound, deadlocks or never ends, print it with the schedule seed that
    replays it, and return it (a :class:`Finding`). Returns None (and says so) if every
    run was right. ``progress``: show a progress bar (60 seeds take a few seconds).
    ``options``: ``workers``, ``steps``, ``bound``, ``lr``, ``sync_every``
    (:func:`run_program`)."""
    seeds = list(seeds)
    orders = ([None] if round_robin else []) + seeds
    bar = outputs.progress(orders, "interleavings") if progress else None
    try:
        finding = next((found for found in (run_once(program, seed, **options)
                                            for seed in (bar if progress else orders))
                        if found is not None), None)
    finally:
        if bar is not None:
            bar.close()
    if not quiet:
        print(verdict(finding, seeds, round_robin))
    return finding


def verdict(finding, seeds, round_robin=True):
    """What :func:`explore` prints: the finding and how to replay it, or that the runs
    under round-robin order and ``seeds`` were all right."""
    if finding is not None:
        if finding.seed is None:
            return f"{finding}."
        return (f"{finding}. Replay it: explore(program, seeds=[{finding.seed}], "
                "round_robin=False).")
    count = len(list(seeds)) + bool(round_robin)
    return (f"no lost update, staleness violation or deadlock in {count} "
            f"interleaving{'s' if count != 1 else ''} ({_span(seeds, round_robin)})")


def _span(seeds, round_robin):
    seeds = list(seeds)
    parts = ["round-robin"] if round_robin else []
    if seeds:
        contiguous = seeds == list(range(seeds[0], seeds[0] + len(seeds)))
        parts.append(f"schedule seeds {seeds[0]}-{seeds[-1]}" if contiguous and len(seeds) > 1
                     else "schedule seeds " + ", ".join(map(str, seeds)))
    return " and ".join(parts)


# -------------------------------------------------- the lab's check, and the lesson's demo


@check("race-free parameter server")
def check_parameter_server(serve, push, pull, sync):
    """The lab's check: first the learner's workers with the reference server and the
    learner's server with the reference workers (round-robin order: which side is wrong),
    then the learner's four functions under round-robin order and every seed of
    :data:`SEEDS`, with 3 workers, 4 steps, staleness bound 1 (and a sync at step 3); ✅
    if no interleaving loses an update, breaks the bound, deadlocks or passes no
    messages."""
    reference = _reference_ps()
    for mine, theirs in ((serve, reference.serve), (push, reference.push),
                         (pull, reference.pull), (sync, reference.sync)):
        refuse_reference(mine, theirs)
    for side, program in (
            ("your push/pull/sync with the reference server",
             Program(reference.serve, push, pull, sync)),
            ("your serve with the reference workers",
             Program(serve, reference.push, reference.pull, reference.sync))):
        finding = run_once(program)
        if finding is not None:
            hint = (WORKER_HINTS.get(finding.kind, finding.hint)
                    if program.serve is reference.serve else finding.hint)
            raise Failure(f"{side}: {finding}", hint)
    program = Program(serve, push, pull, sync)
    finding = explore(program, quiet=True, progress=True)
    if finding is not None:
        replay = ("" if finding.seed is None else
                  f" (replay: explore(Program(serve, push, pull, sync), "
                  f"seeds=[{finding.seed}], round_robin=False))")
        raise Failure(f"{finding}{replay}", finding.hint)
    return (f"no lost update, staleness violation or deadlock in {len(SEEDS) + 1} "
            f"interleavings ({WORKERS} workers, {STEPS} steps, bound {BOUND}, sync at step "
            f"{SYNC_EVERY})")


# A planted bug for the lesson. Workers push their new *parameters* (what they pulled,
# minus their step); the server turns each into a difference against the parameters it
# served for that step, params += new - served[step]. But it keeps one copy per *step*,
# not per worker: when two workers were served different parameters for the same step,
# the later copy replaces the earlier, and a push is measured against parameters it never
# saw. In round-robin order the workers of a step are served the same parameters and all
# is well; in other orders updates are lost. No staleness bound, no sync: not the lab's
# answer.
_pulled = {}   # rank -> the parameters it last pulled (ranks are threads of one process)


def _per_step_serve(params, lr, workers, steps, bound):
    header = torch.zeros(1)
    clock = {w: 0 for w in workers}
    served = {}                              # step -> parameters served for it (the bug)
    for _ in range(2 * len(workers) * steps):   # every worker: a pull and a push per step
        src = dist.recv(header)
        if header.item() == PUSH:
            new = torch.empty_like(params)
            dist.recv(new, src)
            params += new - served[clock[src]]
            clock[src] += 1
        else:
            dist.send(params, src)
            served[clock[src]] = params.clone()
    return params


def _push_parameters(gradients):
    dist.send(torch.tensor([float(PUSH)]), SERVER)
    dist.send(_pulled[dist.get_rank()] - LR * gradients, SERVER)


def _pull_remembering(params):
    dist.send(torch.tensor([float(PULL)]), SERVER)
    dist.recv(params, SERVER)
    _pulled[dist.get_rank()] = params.clone()
    return params


PLANTED_BUG = Program(_per_step_serve, _push_parameters, _pull_remembering,
                      _pull_remembering)
PLANTED_OPTIONS = {"bound": STEPS, "sync_every": None}   # only lost updates count


def grid(params, steps=STEPS):
    """Which updates ``params`` holds, one group per worker: ``"1:xx.. 2:x... 3:...."``
    (``x``: worker 1's step 0 and 1 are in, ``.``: not (yet))."""
    marks = ["x" if value != 0.0 else "." for value in params.tolist()]
    return " ".join(f"{w + 1}:{''.join(marks[w * steps:(w + 1) * steps])}"
                    for w in range(len(marks) // steps))


def replay(program, schedule_seed, **options):
    """Run ``program`` once more under ``schedule_seed`` and print, in the order they
    happened, what every pull (or sync) got and what the final parameters hold
    (:func:`grid`), then the verdict. Returns the :class:`Finding` or None."""
    final, seen = run_program(program, schedule_seed, **options)
    steps = options.get("steps", STEPS)
    for worker, step, how, got in seen:
        print(f"worker {worker} {how}s for step {step}: {grid(got, steps)}")
    print(f"final parameters:          {grid(final, steps)}")
    finding = run_once(program, schedule_seed, **options)
    print(finding if finding is not None else f"{_order(schedule_seed)}: all updates in")
    return finding


def demo(seeds=range(20)):
    """The lesson's demo: the planted server (:data:`PLANTED_BUG`) under round-robin order
    alone, then under ``seeds`` too (no bound, no sync: only lost updates count); then the
    reference server (bound 1, a sync at step 3) under the same orders. Returns the
    planted bug's :class:`Finding`."""
    reference = Program(*(getattr(_reference_ps(), name) for name in Program._fields))
    for name, program, orders, options in (
            ("planted bug, round-robin only", PLANTED_BUG, [], PLANTED_OPTIONS),
            ("planted bug, with seeds", PLANTED_BUG, seeds, PLANTED_OPTIONS),
            ("the reference server", reference, seeds, {})):
        finding = explore(program, orders, quiet=True, **options)
        print(f"{name + ':':31s}{finding or verdict(finding, orders)}")
        if program is PLANTED_BUG:
            found = finding
    return found
