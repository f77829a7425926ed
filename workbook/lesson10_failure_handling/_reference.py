"""Reference answers of lab 10 (failure handling); the checks import them while they run.

Not imported by the lab or the lesson: the lab asks the learner to write these.
"""

import copy
import math
import os

import torch
import torch.distributed as dist

from workbook.lesson10_failure_handling import lab as job

# What a bit-identical restart must bring back; :func:`train` can leave one out, so that
# a check can tell which one a learner forgot.
PIECES = ("model", "optimizer", "scheduler", "data position", "RNG")


def train(ckpt_dir, steps, every, leave_out=None, step_shift=0):
    """Train :mod:`job` for ``steps`` steps on every rank, checkpoint every ``every``
    steps into ``ckpt_dir``, and resume from the latest checkpoint if there is one.
    Returns the final parameters (flat). ``leave_out`` (a piece of :data:`PIECES`, or
    "own RNG": rank 0's RNG state restored on every rank; "saved RNG": rank 0's state
    saved for every rank, with no gather) and
    ``step_shift`` (resume that many steps after the saved one) are the slips a check
    replays to name the one a learner made."""
    rank = dist.get_rank()
    model, ddp, optimizer, scheduler = job.build()
    path = os.path.join(ckpt_dir, "latest.pt")
    step = 0
    if os.path.exists(path):
        ckpt = torch.load(path, weights_only=False)
        restore = {"model": lambda: model.load_state_dict(ckpt["model"]),
                   "optimizer": lambda: optimizer.load_state_dict(ckpt["optimizer"]),
                   "scheduler": lambda: scheduler.load_state_dict(ckpt["scheduler"]),
                   "RNG": lambda: torch.set_rng_state(
                       ckpt["rng"][0 if leave_out == "own RNG" else rank])}
        for piece, load in restore.items():
            if piece != leave_out:
                load()
        if leave_out != "data position":
            step = ckpt["step"] + step_shift
    while step < steps:
        job.train_step(ddp, optimizer, scheduler, *job.batch(step))
        step += 1
        if step % every == 0:
            rngs = [None] * dist.get_world_size()    # every rank's dropout RNG
            if leave_out == "saved RNG":             # a slip: rank 0's own state for all
                rngs = [torch.get_rng_state()] * len(rngs)
            else:
                dist.all_gather_object(rngs, torch.get_rng_state())
            if rank == 0:
                torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                            "scheduler": scheduler.state_dict(), "step": step, "rng": rngs},
                           path + ".tmp")
                os.replace(path + ".tmp", path)      # a crash mid-write keeps the old one
    return job.params(model)


def find_straggler(step_times, threshold=1.2):
    """The rank whose median step time is more than ``threshold`` times the median over
    the ranks of their medians, or None. ``step_times[rank][step]``."""
    times = torch.as_tensor(step_times, dtype=torch.float64)
    typical = times.median(dim=1).values          # one slow step (a GC pause) is not a rank
    slowest = int(typical.argmax())
    return slowest if typical[slowest] > threshold * typical.median() else None


def checkpoint_interval(delta, mtbf):
    """Daly's (2006) optimum compute time between checkpoints for a checkpoint time
    ``delta`` and a mean time between failures ``mtbf`` (same unit)."""
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def recover(plan, failure):
    """The new plan after ``failure`` (``("worker", w)`` or ``("server", s)``): the failed
    worker's tasks to the live workers; after a server failure its slices to live servers,
    and every slice back to the checkpoint (``reload``, ``round``)."""
    kind, dead = failure
    new = copy.deepcopy(plan)
    new["reload"] = []
    if kind == "worker":
        new["workers"] = [w for w in plan["workers"] if w != dead]
        orphans = sorted(t for t, w in plan["tasks"].items() if w == dead)
        for i, task in enumerate(orphans):
            new["tasks"][task] = new["workers"][i % len(new["workers"])]
        return new                      # a worker holds no state: nothing is lost
    new["servers"] = [s for s in plan["servers"] if s != dead]
    for piece, owner in plan["owner"].items():
        if owner == dead:
            new["owner"][piece] = new["servers"][piece % len(new["servers"])]
    # The dead server's slices can only come back as they were at the checkpoint; the
    # next gradients need the whole model at one round, so every slice goes back there.
    new["round"] = plan["checkpoint"]
    new["reload"] = sorted(plan["owner"])
    return new
