"""Failures, checkpoints and recovery, measured: what lesson 10 imports.

Lab 10 asks you to write a checkpointing training loop, a straggler detector, the
checkpoint interval and a parameter-server recovery. The lab does not import this
module, and its checks refuse the functions here (:func:`daly_interval` is not your
answer). What is here:

* how often to checkpoint (docs/reference-numbers.md, "Checkpoint interval"):
  :func:`young_interval`, :func:`daly_interval`, :func:`expected_goodput` (Daly's exact
  expectation) and :func:`simulate_goodput`, a Monte-Carlo run of a long job that
  checkpoints every ``interval`` and fails at random; :func:`goodput_sweep` and
  :func:`plot_goodput` put them side by side;
* differential snapshots: :func:`snapshot_delta`, the bytes a snapshot of only what
  changed would write;
* lossy links, forward error correction against retransmission (whose cost model is
  :mod:`simcluster.faults`' ``PacketLoss``): :func:`fec_group_loss`,
  :func:`fec_parity_needed`;
* the parameter-server recovery flow of an article about a training "protocol" on lesson 02's server:
  :func:`sharded_ps_train`.

Everything that says "on every rank" runs inside ``cluster.run(...)`` (SPMD).
"""

import math
import os
import zlib

import numpy as np
import torch
import torch.distributed as dist

from simcluster.goodput import daly_interval, expected_goodput, young_interval  # noqa: F401
from workbook.models import chunk_bounds

# ------------------------------------------------------------ checkpoint interval


def simulate_goodput(interval, delta, mtbf, restart, work, trials=200, seed=0):
    """Goodput measured by simulating the job ``trials`` times, each with its own random
    failures: ``(mean, standard error, failures per trial)``.

    The job needs ``work`` of compute, done in segments of ``interval`` (the last one
    shorter), each followed by a checkpoint of ``delta``. A failure at any moment — while
    computing, writing a checkpoint or restarting — throws away the segment in progress;
    the job then restarts (``restart``) from the last checkpoint and tries that segment
    again. Failures are a Poisson process of mean gap ``mtbf`` (numpy's generator,
    ``seed``: the same numbers every time).
    """
    rng = np.random.default_rng(seed)
    full, rest = divmod(work, interval)
    lengths = np.asarray([interval + delta] * int(full)
                         + ([rest + delta] if rest > 1e-12 * work else []))
    need = np.tile(lengths, (trials, 1))                        # one row per trial
    wall = np.zeros_like(need)
    failures = np.zeros(need.shape, dtype=np.int64)
    rows, cols = np.indices(need.shape)
    rows, cols = rows.ravel(), cols.ravel()                     # the segments still to do
    while rows.size:
        # one attempt per pending segment; the exponential clock is memoryless, so one
        # draw per attempt is the time to the next failure
        ttf = rng.exponential(mtbf, size=rows.size)
        todo = need[rows, cols]
        done = ttf >= todo
        wall[rows, cols] += np.where(done, todo, ttf)
        rows, cols = rows[~done], cols[~done]
        failures[rows, cols] += 1
        # retry after a restart, which can itself be hit by the next failure
        need[rows, cols] = restart + lengths[cols]
    goodput = work / wall.sum(axis=1)
    return (float(goodput.mean()), float(goodput.std(ddof=1) / math.sqrt(trials)),
            float(failures.sum(axis=1).mean()))


def goodput_sweep(delta, mtbf, restart, intervals, work_mtbfs=40, trials=200, seed=0):
    """:func:`simulate_goodput` and :func:`expected_goodput` at every interval of
    ``intervals``, for a job of ``work_mtbfs`` MTBFs of compute, and at Young's and
    Daly's intervals. Returns a dict: ``intervals``, ``simulated``, ``stderr``,
    ``expected``, ``failures`` (per trial), ``best`` (the interval of ``intervals`` with
    the highest simulated goodput), ``young``, ``daly`` (the intervals) and
    ``at_young``, ``at_daly`` (their simulated goodput)."""
    work = work_mtbfs * mtbf
    young, daly = young_interval(delta, mtbf), daly_interval(delta, mtbf)
    points = list(intervals) + [young, daly]
    # the same seed at every interval (common random numbers): the curve is smoother
    # and differences between intervals are not noise between seeds
    sims = [simulate_goodput(t, delta, mtbf, restart, work, trials, seed) for t in points]
    simulated = [s[0] for s in sims[:-2]]
    return {"intervals": list(intervals), "simulated": simulated,
            "stderr": [s[1] for s in sims[:-2]], "failures": [s[2] for s in sims[:-2]],
            "expected": [expected_goodput(t, delta, mtbf, restart) for t in intervals],
            "best": intervals[int(np.argmax(simulated))], "young": young, "daly": daly,
            "at_young": sims[-2][0], "at_daly": sims[-1][0]}


def plot_goodput(sweeps, unit="min"):
    """Goodput against the checkpoint interval, one panel per sweep
    (``{title: goodput_sweep(...)}``): simulated points with error bars, Daly's exact
    expectation as a line, the simulated optimum, Young's and Daly's intervals marked. Each
    panel's title gives its intervals; one legend below the panels says what the marks are
    (the figure is sized to be shown unscaled, so the text stays legible)."""
    import matplotlib.pyplot as plt
    from matplotlib import ticker

    fig, axes = plt.subplots(1, len(sweeps), figsize=(3.4 * len(sweeps), 3.4), squeeze=False)
    for ax, (title, s) in zip(axes[0], sweeps.items()):
        x = s["intervals"]
        ax.plot(x, [100 * g for g in s["expected"]], color="0.6", lw=1.5,
                label="Daly's expectation")
        ax.errorbar(x, [100 * g for g in s["simulated"]],
                    yerr=[200 * e for e in s["stderr"]], fmt="o", ms=3, label="simulated")
        best = s["intervals"].index(s["best"])
        ax.plot([s["best"]], [100 * s["simulated"][best]], "*", ms=14, color="C3",
                label="best simulated")
        ax.axvline(s["young"], color="C2", ls=":", label="Young's interval")
        ax.axvline(s["daly"], color="C1", ls="--", label="Daly's interval")
        ax.set_xscale("log")
        ax.xaxis.set_major_locator(ticker.LogLocator(subs=(1, 2, 5)))
        ax.xaxis.set_major_formatter(ticker.FormatStrFormatter("%g"))
        ax.xaxis.set_minor_formatter(ticker.NullFormatter())
        ax.set(xlabel=f"checkpoint interval ({unit})", ylabel="goodput (%)")
        ax.set_title(f"{title}\nbest {s['best']:.3g}, Young {s['young']:.3g}, "
                     f"Daly {s['daly']:.3g} {unit}", fontsize=9)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.tight_layout(rect=(0, 0.1, 1, 1))
    fig.legend(handles, labels, loc="lower center", ncol=len(labels), fontsize=9,
               frameon=False)
    return fig


# ---------------------------------------------------------- differential snapshots


def snapshot_delta(old, new):
    """What a differential snapshot of ``new`` against ``old`` (two state dicts with the
    same tensors) would write. Returns a dict of byte counts: ``full`` (every tensor),
    ``changed`` (only the elements whose bits changed, plus a 4-byte index each — a sparse
    delta), ``full_zlib`` (the full snapshot compressed) and ``xor_zlib`` (the bitwise XOR
    of new and old, compressed: unchanged bits are zeros, which compress); and two counts
    of elements, ``elements`` (all) and ``changed_elements`` (those whose bits changed).
    """
    full = changed = full_z = xor_z = elements = changed_elements = 0
    for name, a in new.items():
        if not torch.is_tensor(a) or not a.is_floating_point():
            continue
        width = {2: torch.int16, 4: torch.int32, 8: torch.int64}[a.element_size()]
        bits_new = a.detach().contiguous().view(width)
        bits_old = old[name].detach().contiguous().view(width)
        full += a.numel() * a.element_size()
        n_changed = int((bits_new != bits_old).sum())
        elements += a.numel()
        changed_elements += n_changed
        changed += n_changed * (a.element_size() + 4)
        full_z += len(zlib.compress(bits_new.numpy().tobytes(), 1))
        xor_z += len(zlib.compress((bits_new ^ bits_old).numpy().tobytes(), 1))
    return {"full": full, "changed": changed, "full_zlib": full_z, "xor_zlib": xor_z,
            "elements": elements, "changed_elements": changed_elements}


# -------------------------------------------------------------------- lossy links


def fec_group_loss(rate, data=8, parity=1):
    """Forward error correction with ``data`` packets per group and ``parity`` repair
    packets (an erasure code: any ``data`` of the ``data + parity`` rebuild the group; one
    parity packet is a plain XOR). The chance that more than ``parity`` packets of a
    group are lost, so that the group must be sent again after all."""
    n = data + parity
    return sum(math.comb(n, k) * rate**k * (1 - rate) ** (n - k)
               for k in range(parity + 1, n + 1))


def fec_parity_needed(rate, data=8, target=1e-3):
    """The fewest repair packets per group of ``data`` for which a group is lost with
    probability at most ``target`` (:func:`fec_group_loss`)."""
    parity = 0
    while fec_group_loss(rate, data, parity) > target:
        parity += 1
    return parity


# ------------------------------------------------- parameter server, with failures


def sharded_ps_train(problem, rounds, shards, workers, ckpt_dir, lr=0.5, batch=32,
                     checkpoint_every=5, worker_fails=None, shard_fails=None,
                     recovery="seed"):
    """Synchronous training with the parameters split over ``shards`` server ranks
    (``0 .. shards-1``, each a lesson-02 :class:`ParameterServer` per slice it owns) and
    ``workers`` worker ranks after them; call on every rank (``cluster.run``).

    Every round has ``workers`` tasks (task ``t`` is mini-batch ``problem.batch(round, t,
    ...)``); a worker pulls every slice from its owner, computes the gradient of each task
    it is given, and pushes each slice back; each owner applies the mean of the round's
    task gradients (in task order). Every ``checkpoint_every`` rounds each owner writes
    its slices to ``ckpt_dir`` with ``torch.save``.

    Failures, at the start of a round, known to every rank as a heartbeat would tell
    them: ``worker_fails = {worker: round}``, ``shard_fails = {shard: round}``. Recovery
    follows the article's ``handle_node_failure``: the failed workers' tasks go to the live
    workers (round robin), the failed shard's slices go to the next live shard (the shard
    map is rebuilt), and the new owner reloads them from the latest checkpoint. With
    ``recovery="seed"`` the other slices carry on; with ``recovery="rollback"`` every
    slice reloads that checkpoint and the rounds since are done again.

    Returns, on each shard, ``{slice: (params, rounds_applied)}`` for the slices it owns
    at the end; on workers, None.
    """
    # lesson 02's answer: imported here, so that this module does not hand it out
    from workbook._parameter_server import ParameterServer

    rank = dist.get_rank()
    bounds = chunk_bounds(problem.num_params, shards)
    init = problem.init_params()
    # the failures, in the order they strike: (round, "worker" or "shard", index)
    pending = sorted([(at, "worker", w) for w, at in (worker_fails or {}).items()]
                     + [(at, "shard", s) for s, at in (shard_fails or {}).items()])
    dead_workers, dead_shards = set(), set()

    def load(j):
        saved = torch.load(os.path.join(ckpt_dir, f"slice{j}.pt"))
        return [ParameterServer(saved["params"], lr, workers), saved["round"]]

    state = {}                          # my slices: {j: [ParameterServer, rounds applied]}
    if rank < shards:
        state[rank] = [ParameterServer(init[slice(*bounds[rank])], lr, workers), 0]
        torch.save({"params": state[rank][0].params, "round": 0},
                   os.path.join(ckpt_dir, f"slice{rank}.pt"))     # round 0: the start
    owner = list(range(shards))
    r = 0
    while r < rounds:
        # --- handle_node_failure, for every failure that strikes now
        while pending and pending[0][0] == r:
            _, kind, index = pending.pop(0)
            if (kind == "worker" and rank == shards + index) or (kind == "shard" and rank == index):
                return None             # this process is gone, and its memory with it
            if kind == "worker":
                dead_workers.add(index)     # its tasks are rescheduled below
                continue
            dead_shards.add(index)
            live_shards = [s for s in range(shards) if s not in dead_shards]
            heir = min(live_shards, key=lambda s: (s - index) % shards)
            for j in range(shards):          # rebuild the shard map
                if owner[j] == index:
                    owner[j] = heir
                    if rank == heir:         # reload the orphaned slice
                        state[j] = load(j)
            if recovery == "rollback":       # every slice back to the checkpoint
                for j in state:
                    state[j] = load(j)
                r = torch.load(os.path.join(ckpt_dir, "slice0.pt"))["round"]
        live = [w for w in range(workers) if w not in dead_workers]
        assign = {t: t if t in live else live[t % len(live)] for t in range(workers)}
        mine = [j for j in range(shards) if owner[j] == rank]
        me = rank - shards
        # --- pull: every live worker gets every slice from its owner
        if rank < shards:
            sends = [dist.isend(state[j][0].params, shards + w) for w in live for j in mine]
            for work in sends:
                work.wait()
        else:
            params = torch.empty(problem.num_params)
            for j in range(shards):
                buf = torch.empty(bounds[j][1] - bounds[j][0])
                dist.recv(buf, owner[j])
                params[slice(*bounds[j])] = buf
            # --- compute and push, task by task
            for t in sorted(t for t, w in assign.items() if w == me):
                x, y = problem.batch(r, t, workers, batch)
                _, grad = problem.loss_and_grad(params, x, y)
                for j in range(shards):
                    dist.send(grad[slice(*bounds[j])].contiguous(), owner[j])
        if rank < shards:
            for t in range(workers):
                for j in mine:
                    grad = torch.empty(bounds[j][1] - bounds[j][0])
                    dist.recv(grad, shards + assign[t])
                    state[j][0].push(t, grad)
            for j in mine:
                state[j][0].sync(range(workers))
                state[j][1] += 1
        r += 1
        if rank < shards and r % checkpoint_every == 0:
            for j in mine:
                torch.save({"params": state[j][0].params, "round": state[j][1]},
                           os.path.join(ckpt_dir, f"slice{j}.pt"))
    if rank >= shards:
        return None
    return {j: (ps.params.clone(), applied) for j, (ps, applied) in state.items()}
