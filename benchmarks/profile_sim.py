"""Where the sim's time goes above the serial floor, for bench_ddp's training.

    PYTHONPATH=. .venv/bin/python benchmarks/profile_sim.py            # ~1-2 min
    PYTHONPATH=. .venv/bin/python benchmarks/profile_sim.py --quick    # smoke test

Three parts:

1. **Ablation** (wall time of the training loop, interleaved repetitions, median): the
   serial floor, then the same serial compute inside a 1-rank ``cluster.run`` (with and
   without accounting: the cost of the dispatch mode alone, no threads switching), then
   DDP on 4 separate 1-rank runs (DDP's own Python and bucket-copy cost, no switching),
   the 4-rank DDP run with accounting off and RNG save/restore stubbed out, with accounting
   off, and the default. Each row adds one mechanism; the differences are its cost.
   A what-if row gives a lower bound for any Python dispatch mode by monkeypatching the
   accounting mode into one that only runs the op.
2. **Counts and unit costs**: baton hand-overs and dispatched aten ops per step; the cost
   of one ``_ProcessState`` save + restore and of one thread hand-over (Event ping-pong).
3. **cProfile of the default run**, every rank thread profiled with ``time.thread_time``
   (CPU time of that thread only, so time spent blocked while other ranks run is not
   counted), merged over ranks: exclusive time by area (file) and the top functions.

The stubs used here (no-op RNG save/restore, counting wrappers) are installed only inside
this script, for the duration of one measurement; simcluster itself is not changed.
"""

import argparse
import contextlib
import cProfile
import pstats
import statistics
import threading
import time

import torch
import torch.distributed as dist

from benchmarks import bench_ddp as bd


# ----------------------------------------------------------------- instrumentation
@contextlib.contextmanager
def patched(obj, name, value):
    saved = getattr(obj, name)
    setattr(obj, name, value)
    try:
        yield
    finally:
        setattr(obj, name, saved)


@contextlib.contextmanager
def no_rng_switching():
    """Ranks share one RNG/dtype state: _ProcessState.save/restore become no-ops."""
    from simcluster import scheduler
    with patched(scheduler._ProcessState, "save", lambda self: None), \
            patched(scheduler._ProcessState, "restore", lambda self: None):
        yield


@contextlib.contextmanager
def counting():
    """Count hand-overs, blocking waits and dispatched aten ops while inside."""
    from simcluster import scheduler
    counts = {"hand_over": 0, "blocked_waits": 0, "dispatched_ops": 0}
    hand_over = scheduler.RankScheduler._hand_over
    wait_until = scheduler.RankScheduler.wait_until

    def counted_hand_over(self, rank):
        counts["hand_over"] += 1
        return hand_over(self, rank)

    def counted_wait_until(self, ready, what):
        if not ready():
            counts["blocked_waits"] += 1
        return wait_until(self, ready, what)

    with contextlib.ExitStack() as stack:
        stack.enter_context(patched(scheduler.RankScheduler, "_hand_over", counted_hand_over))
        stack.enter_context(patched(scheduler.RankScheduler, "wait_until", counted_wait_until))
        from simcluster import accounting

        # both paths' classes: FastRankAccounting (the default) has its own dispatch
        for cls in (accounting.RankAccounting, accounting.FastRankAccounting):
            def counted_dispatch(self, func, types, args=(), kwargs=None,
                                 dispatch=cls.__torch_dispatch__):
                counts["dispatched_ops"] += 1
                return dispatch(self, func, types, args, kwargs)

            stack.enter_context(patched(cls, "__torch_dispatch__", counted_dispatch))
        yield counts


# ------------------------------------------------ what-if: a lower bound
@contextlib.contextmanager
def bare_dispatch_mode():
    """Lower bound: the accounting dispatch mode runs each op and does nothing else."""
    from simcluster import accounting

    def bare(self, func, types, args=(), kwargs=None):
        return func(*args, **(kwargs or {}))

    # both paths' classes: FastRankAccounting (the default) has its own dispatch
    with patched(accounting.RankAccounting, "__torch_dispatch__", bare), \
            patched(accounting.FastRankAccounting, "__torch_dispatch__", bare):
        yield


# ------------------------------------------------------------------------ variants
def serial_in_sim(cfg, data, accounting):
    """The serial floor's loop, run inside a 1-rank cluster.run (no DDP, no switching)."""
    import simcluster as sc
    run = sc.Cluster.preset("dgx-a100").run(bd.run_serial, world_size=1, args=(cfg, data),
                                            accounting=accounting)
    loop, _, cpu = run.results[0]
    return loop, cpu


def serial(cfg, data):
    loop, _, cpu = bd.run_serial(cfg, data)
    return loop, cpu


def sim(cfg, data, accounting=True, patch=contextlib.nullcontext):
    """(loop wall seconds, loop CPU seconds) of one 4-rank DDP cluster.run."""
    with patch():
        loop, _, results = bd.run_sim(cfg, data, accounting=accounting)
    return loop, bd.loop_cpu(results, one_process=True)


def variants(cfg, data):
    return [
        ("serial floor", lambda: serial(cfg, data)),
        ("serial compute in 1-rank cluster.run, accounting off",
         lambda: serial_in_sim(cfg, data, False)),
        ("serial compute in 1-rank cluster.run, accounting on",
         lambda: serial_in_sim(cfg, data, True)),
        ("DDP in 4 separate 1-rank runs, accounting off (summed)",
         lambda: bd.run_ddp_alone(cfg, data)),
        ("4-rank DDP sim, accounting off, no RNG save/restore",
         lambda: sim(cfg, data, False, no_rng_switching)),
        ("4-rank DDP sim, accounting off", lambda: sim(cfg, data, False)),
        ("4-rank DDP sim (default cluster.run)", lambda: sim(cfg, data)),
        ("  the same, reference per-op path (SIMCLUSTER_FAST_PATH=0)",
         lambda: sim(cfg, data, True, lambda: bd.fast_path(False))),
        ("  what-if: default, dispatch mode that only runs the op",
         lambda: sim(cfg, data, True, bare_dispatch_mode)),
    ]


def ablation(cfg, data, repeats, out):
    rows = variants(cfg, data)
    for _, fn in rows:
        fn()                                   # warm-up
    wall = {label: [] for label, _ in rows}
    cpu = {label: [] for label, _ in rows}
    for _ in range(repeats):
        for label, fn in rows:
            w, c = fn()
            wall[label].append(w)
            cpu[label].append(c)
    out(f"\n1. ablation: training loop, median of {repeats} interleaved repetitions; "
        "CPU = process CPU time\n   (robust to other load on the machine; wall time "
        "also pays for the OS waking\n   the next rank's thread)")
    out(f"  {'variant':<60}{'wall':>9}{'/ floor':>9}{'CPU':>9}{'/ floor':>9}"
        f"{'CPU/step':>10}")
    result = {}
    for label, _ in rows:
        w, c = statistics.median(wall[label]), statistics.median(cpu[label])
        w_ratio = statistics.median(a / b for a, b in zip(wall[label], wall["serial floor"]))
        c_ratio = statistics.median(a / b for a, b in zip(cpu[label], cpu["serial floor"]))
        result[label] = {"wall": w, "cpu": c, "wall_over_floor": w_ratio,
                         "cpu_over_floor": c_ratio}
        out(f"  {label:<60}{w * 1e3:>6.0f} ms{w_ratio:>9.2f}{c * 1e3:>6.0f} ms{c_ratio:>9.2f}"
            f"{c / cfg.steps * 1e3:>7.2f} ms")
    return result


# ----------------------------------------------------------------- unit costs
def unit_costs(cfg, data, out):
    from simcluster import scheduler
    with counting() as counts:
        bd.run_sim(cfg, data)
    per_step = {k: v / cfg.steps for k, v in counts.items()}
    state = scheduler._ProcessState([None])   # its own record of the live numpy state
    n = 300
    best = float("inf")
    for _ in range(5):
        t = time.perf_counter()
        for _ in range(n):
            state.save()
            state.restore()
        best = min(best, (time.perf_counter() - t) / n)
    handoff = _event_ping_pong()
    out("\n2. counts (4-rank DDP, default run) and unit costs")
    out(f"  hand-overs of the baton per step: {per_step['hand_over']:.1f}; blocking waits per "
        f"step: {per_step['blocked_waits']:.1f}  (whole run / steps: includes DDP "
        "construction and barriers)")
    out(f"  aten ops through the accounting dispatch mode per step (4 ranks): "
        f"{per_step['dispatched_ops']:.0f}")
    out(f"  one _ProcessState save + restore: {best * 1e6:.0f} us; one thread hand-over "
        f"(Event set -> other thread runs): {handoff * 1e6:.0f} us")
    switch = best + handoff
    out(f"  => switching costs ~{per_step['hand_over'] * switch * 1e3:.2f} ms per step "
        f"({per_step['hand_over']:.1f} x {switch * 1e6:.0f} us)")
    return {"per_step": per_step, "save_restore_s": best, "handoff_s": handoff}


def _event_ping_pong(rounds=2000):
    events = [threading.Event(), threading.Event()]

    def player(i):
        for _ in range(rounds):
            events[i].wait()
            events[i].clear()
            events[1 - i].set()

    threads = [threading.Thread(target=player, args=(i,)) for i in range(2)]
    start = time.perf_counter()
    for t in threads:
        t.start()
    events[0].set()
    for t in threads:
        t.join()
    return (time.perf_counter() - start) / (2 * rounds)


# -------------------------------------------------------------------- cProfile
AREAS = (("simcluster/accounting.py", "simcluster accounting (dispatch mode)"),
         ("simcluster/costmodel.py", "simcluster cost model"),
         ("simcluster/scheduler.py", "simcluster scheduler"),
         ("simcluster/backend.py", "simcluster backend"),
         ("simcluster/collectives.py", "simcluster collectives"),
         ("simcluster/", "simcluster, other"),
         ("torch/utils/_pytree.py", "torch pytree (tree_flatten)"),
         ("torch/utils/flop_counter.py", "torch flop counter"),
         ("torch/utils/_python_dispatch.py", "torch python dispatch"),
         ("torch/utils/module_tracker.py", "torch ModuleTracker"),
         ("torch/_dynamo", "torch._dynamo wrappers"),
         ("torch/_library", "torch._library"),
         ("torch/nn/parallel", "DDP (python)"),
         ("torch/nn/modules", "nn.Module (python)"),
         ("torch/optim", "optimizer (python)"),
         ("torch/autograd", "autograd (python)"),
         ("torch/distributed", "torch.distributed (python)"),
         ("benchmarks/", "benchmark code"),
         ("threading.py", "threading"),
         ("random.py", "RNG state save/restore (random, numpy)"),
         ("numpy/", "RNG state save/restore (random, numpy)"),
         ("", "other"))

BUILTIN_AREAS = (("get_state", "RNG state save/restore (random, numpy)"),
                 ("set_state", "RNG state save/restore (random, numpy)"),
                 ("getstate", "RNG state save/restore (random, numpy)"),
                 ("setstate", "RNG state save/restore (random, numpy)"),
                 ("rng_state", "RNG state save/restore (random, numpy)"),
                 ("run_backward", "torch C++: autograd engine (backward kernels)"),
                 ("torch", "torch C++ calls (kernels, dispatcher)"),
                 ("", "Python builtins"))


def _area(filename, funcname):
    if filename == "~":                    # a C function: its name says what it is
        return next(area for needle, area in BUILTIN_AREAS if needle in funcname)
    return next(area for needle, area in AREAS if needle in filename)


def profile(cfg, data, out, top=20):
    profiles = {}

    def rank_fn(cfg, data):
        prof = cProfile.Profile(time.thread_time)
        profiles[dist.get_rank()] = prof
        prof.enable()
        try:
            return bd.ddp_train(cfg, data)
        finally:
            prof.disable()

    import simcluster as sc
    sc.Cluster.preset("dgx-a100").run(rank_fn, world_size=cfg.world_size, args=(cfg, data))
    stats = pstats.Stats(profiles[0])
    for r in range(1, cfg.world_size):
        stats.add(profiles[r])
    areas, total = {}, 0.0
    for (filename, _, funcname), (_, _, tottime, _, _) in stats.stats.items():
        area = _area(filename, funcname)
        areas[area] = areas.get(area, 0.0) + tottime
        total += tottime
    out(f"\n3. cProfile of the default 4-rank run (CPU time of the rank threads, all ranks, "
        f"whole rank function incl. DDP construction; profiler overhead inflates Python "
        f"code): total {total:.2f} s")
    out("  exclusive time by area:")
    for area, seconds in sorted(areas.items(), key=lambda kv: -kv[1]):
        if seconds / total >= 0.005:
            out(f"    {area:<48}{seconds:>8.3f} s {seconds / total:>6.1%}")
    out(f"  top {top} functions by exclusive time:")
    rows = sorted(stats.stats.items(), key=lambda kv: -kv[1][2])[:top]
    for (filename, line, funcname), (cc, nc, tottime, cumtime, _) in rows:
        where = filename.split("site-packages/")[-1].split("/work/main/")[-1]
        out(f"    {tottime:>7.3f} s {cumtime:>7.3f} s cum {nc:>8} calls  "
            f"{where}:{line}({funcname})")
    return {"total_s": total, "areas": areas}


def main(repeats=5, quick=False, verbose=True):
    out = print if verbose else (lambda *a, **k: None)
    cfg = bd.QUICK if quick else bd.Config()
    if quick:
        repeats = 1
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        data = bd.make_data(cfg)
        out(f"profile_sim: {cfg.describe()}; torch.set_num_threads(1)")
        result = {"ablation": ablation(cfg, data, repeats, out),
                  "unit_costs": unit_costs(cfg, data, out),
                  "profile": profile(cfg, data, out)}
        return result
    finally:
        torch.set_num_threads(threads)


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--quick", action="store_true")
    a = p.parse_args()
    main(repeats=a.repeats, quick=a.quick)
