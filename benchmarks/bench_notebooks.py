"""How long each lesson, solution and lab notebook takes to run from the top, kernel start included.

    PYTHONPATH=. .venv/bin/python benchmarks/bench_notebooks.py             # every notebook (~10 min)
    PYTHONPATH=. .venv/bin/python benchmarks/bench_notebooks.py 04 05       # lessons 04 and 05
    PYTHONPATH=. .venv/bin/python benchmarks/bench_notebooks.py --quick     # lesson 00, smoke test
    ... bench_notebooks.py --save before.json          # on the old tree, then on the new one:
    ... bench_notebooks.py --before before.json        # a before / after table
    ... bench_notebooks.py --nbval-env                 # with the Makefile's NBVAL_ENV, as `make test`

Goals (issue 29, on two cores, wall time, import included — what a learner waits for after
"Restart and run all"): every lesson in ``notebooks/`` in at most 45 s (hard limit 60 s),
every solution in ``solutions/`` in at most 30 s. Labs (``labs/``, the solutions without
their answers, checked by ``make test`` with ``--nbval-lax``) are timed too, for the sum
that ``make test`` pays, with no goal of their own.

Each notebook runs in a fresh kernel, one after the other (as nbval runs them), on a copy
in memory: nothing is written back. The table gives wall time and the CPU time of the
kernel process and its children. Wall time is what the goals are about, but on a machine
busy with other work it grows while CPU time does not: when the two differ a lot, the
machine was busy (the load average is printed), and the run should be repeated on a quiet
one.
"""

import argparse
import json
import os
import re
import time
from pathlib import Path

from benchmarks.goals import Goal, summary, verdict

ROOT = Path(__file__).resolve().parents[1]
DIRECTORIES = ("notebooks", "solutions", "labs")
# Wall-time goal per directory, in seconds (None: timed, no goal); see the docstring.
GOALS = {"notebooks": 45.0, "solutions": 30.0, "labs": None}
HARD_LIMIT_S = 60.0


def nbval_env():
    """The variables the Makefile sets for the notebook checks (``NBVAL_ENV``), as a dict."""
    text = (ROOT / "Makefile").read_text()
    match = re.search(r"^NBVAL_ENV\s*:?=\s*(.+)$", text, re.M)
    return dict(item.split("=", 1) for item in match.group(1).split()) if match else {}


def _kernel_cpu_seconds(client):
    """CPU seconds used so far by the kernel process and its children."""
    import psutil

    process = psutil.Process(client.km.provisioner.process.pid)
    total = 0.0
    for p in [process, *process.children(recursive=True)]:
        try:
            times = p.cpu_times()
        except psutil.NoSuchProcess:
            continue
        total += times.user + times.system + times.children_user + times.children_system
    return total


def time_notebook(path, env=None):
    """Run ``path`` top to bottom in a fresh kernel; return ``(wall s, kernel CPU s)``.

    ``env``: extra environment variables for the kernel (e.g. :func:`nbval_env`). A cell
    tagged ``raises-exception`` may raise, as under nbval; any other error propagates.
    """
    import nbformat
    from nbclient import NotebookClient

    notebook = nbformat.read(path, as_version=4)
    client = NotebookClient(notebook, timeout=600, kernel_name="python3",
                            resources={"metadata": {"path": str(path.parent)}})
    kernel_env = {**os.environ, **env} if env else None
    start = time.perf_counter()
    with client.setup_kernel(**({"env": kernel_env} if kernel_env else {})):
        for index, cell in enumerate(notebook.cells):
            client.execute_cell(cell, index)
        cpu = _kernel_cpu_seconds(client)
    return time.perf_counter() - start, cpu


def notebooks(lessons=(), directories=DIRECTORIES):
    """The notebooks to time, lessons first, then solutions, then labs; all of them, or
    those of ``lessons`` (e.g. ``("04",)``)."""
    found = [p for d in directories for p in sorted((ROOT / d).glob("*.ipynb"))]
    if lessons:
        found = [p for p in found if p.name[:2] in lessons]
    return found


def _goal(directory):
    """The :class:`~benchmarks.goals.Goal` of a notebook in ``directory`` (None: a lab)."""
    limit = GOALS.get(directory)
    return None if limit is None else Goal(f"each of {directory}/, wall", limit, unit="s")


def _verdict(wall, goal):
    """A notebook's verdict: "met" or "not met" (and whether over the hard limit)."""
    if goal is None:
        return "(no goal)"
    text = verdict(goal, wall)
    return text + (f" (over the {HARD_LIMIT_S:.0f} s hard limit)" if wall > HARD_LIMIT_S
                   else "")


def main(lessons=(), quick=False, verbose=True, env=None, before=None, directories=DIRECTORIES):
    """Time the notebooks; print a table; return ``{"dir/name": {"wall", "cpu", "goal",
    "goal_met"}}`` (``goal`` and ``goal_met`` are None for labs).

    ``before``: an earlier result (e.g. loaded from ``--save``'s file); the table then shows
    its wall time and the ratio now / before for each notebook they share.
    """
    out = print if verbose else (lambda *a, **k: None)
    paths = notebooks(("00",) if quick else lessons, directories)
    goals = ", ".join(f"{d}/ <= {g:.0f} s" for d, g in GOALS.items() if g is not None)
    out("bench_notebooks: each notebook in a fresh kernel, one after the other; "
        f"goals (wall): {goals}; hard limit {HARD_LIMIT_S:.0f} s")
    out(f"  kernel environment: {'NBVAL_ENV ' + str(env) if env else 'the machine default'}; "
        f"load average at start {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")
    header = f"  {'notebook':<42}{'wall':>8}{'CPU':>8}{'goal':>7}"
    out(header + (f"{'before':>9}{'ratio':>7}" if before else "") + "   verdict")
    result = {}
    for path in paths:
        wall, cpu = time_notebook(path, env)
        name = f"{path.parent.name}/{path.name}"
        goal = _goal(path.parent.name)
        result[name] = {"wall": wall, "cpu": cpu, "goal": goal and goal.limit,
                        "goal_met": None if goal is None else goal.met(wall)}
        row = (f"  {name:<42}{wall:>7.1f}s{cpu:>7.1f}s"
               f"{'-' if goal is None else f'{goal.limit:.0f}s':>7}")
        if before:
            old = before.get(name, {}).get("wall")
            row += (f"{old:>8.1f}s{wall / old:>6.2f}x" if old else f"{'-':>9}{'-':>7}")
        out(row + "   " + _verdict(wall, goal))
    load = os.getloadavg()[0]
    out(f"  load average at end {load:.2f}" + (
        f": more runnable processes than the {os.cpu_count()} CPUs, so wall times are "
        "inflated and the verdicts pessimistic; CPU time is the fairer figure, repeat on "
        "a quiet machine" if load > (os.cpu_count() or 1) else ""))
    for directory in directories:
        rows = [r for n, r in result.items() if n.startswith(directory + "/")]
        if not rows:
            continue
        total = sum(r["wall"] for r in rows)
        line = f"  {directory + '/':<11}{len(rows):>3} notebooks, {total:7.1f} s in all, " \
               f"slowest {max(r['wall'] for r in rows):.1f} s"
        if GOALS.get(directory) is not None:
            line += f"; goal met by {sum(bool(r['goal_met']) for r in rows)}/{len(rows)}"
        out(line)
    _summary(result, out)
    return result


def _summary(result, out):
    """Print the goals' verdict: which notebooks miss their goal, by how much; return the
    names of those that miss."""
    out("\nGoals (issue 29; wall time on this machine)")
    judged = {name: r for name, r in result.items() if r["goal"] is not None}
    for directory in DIRECTORIES:
        goal = _goal(directory)
        rows = {n: r for n, r in judged.items() if n.startswith(directory + "/")}
        if goal is None or not rows:
            continue
        missed = [f"{n} {r['wall']:.1f} s (CPU {r['cpu']:.1f} s)"
                  for n, r in rows.items() if not r["goal_met"]]
        out(f"  GOAL {goal.describe()}: {len(rows) - len(missed)} of {len(rows)} met"
            + (f"; not met: {', '.join(missed)}" if missed else ""))
        # On a busy machine wall time is inflated; kernel CPU is what a quiet one nears.
        over_cpu = [n for n, r in rows.items() if not goal.met(r["cpu"])]
        out(f"      kernel CPU within {goal.figure(goal.limit)}: {len(rows) - len(over_cpu)} "
            f"of {len(rows)}" + (f"; over: {', '.join(over_cpu)}" if over_cpu else ""))
    return summary({name: r["goal_met"] for name, r in judged.items()}, out)


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("lessons", nargs="*", help="lesson numbers, e.g. 04 05 (default: all)")
    parser.add_argument("--quick", action="store_true", help="lesson 00 only (smoke test)")
    parser.add_argument("--dirs", nargs="+", choices=DIRECTORIES, default=DIRECTORIES,
                        help="which directories to time (default: all three)")
    parser.add_argument("--nbval-env", action="store_true",
                        help="run the kernels with the Makefile's NBVAL_ENV, as `make test` does")
    parser.add_argument("--save", type=Path, help="write the result to this JSON file")
    parser.add_argument("--before", type=Path, help="a --save file to compare with")
    args = parser.parse_args()
    earlier = json.loads(args.before.read_text()) if args.before else None
    res = main(lessons=tuple(args.lessons), quick=args.quick,
               env=nbval_env() if args.nbval_env else None, before=earlier,
               directories=tuple(args.dirs))
    if args.save:
        args.save.write_text(json.dumps(res, indent=1) + "\n")
