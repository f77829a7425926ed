"""The lessons' functions run unchanged on real gloo, with the results the simulator gives.

Lesson 00 promises that the functions you hand to ``cluster.run`` is plain
``torch.distributed`` code that runs under ``torchrun`` with gloo. This test holds it to
that: it takes the functions out of lesson 00's code cells by name (with ``ast``, so the
notebook stays the single source), runs every one of them on 2 simulated ranks and on 2
real gloo processes (spawned as in ``test_differential_gloo.py``), and compares each
rank's result. A function that needs the simulator, or a feature gloo lacks, fails here.
(The lessons sum and divide rather than use ``ReduceOp.AVG``: gloo accepts AVG in the
pinned torch 2.13, but older versions raise "Cannot use ReduceOp.AVG with Gloo".)

A second test makes sure no lesson-00 function escapes: every function the lesson passes
to ``cluster.run`` is either checked here or listed as deliberately broken (the deadlock
and mismatch examples, which must not run on gloo: they would hang until a timeout).
"""

import ast
import json
import os
import re
import sys

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

# The gloo workers are spawned interpreters that import this module by name to find
# their target: put this directory on sys.path (they inherit it), as the differential test does.
_HERE = os.path.dirname(os.path.abspath(__file__))
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)

import _differential_cases as cases  # noqa: E402
from test_differential_gloo import assert_same  # noqa: E402

import simcluster as sc  # noqa: E402

pytestmark = pytest.mark.slow  # spawns 2 gloo processes: ~15 s on two idle cores

NOTEBOOKS = os.path.join(os.path.dirname(_HERE), "notebooks")
LESSON_00 = "00_simulated_cluster.ipynb"
WORLD_SIZE = 2

# Lesson-00 functions that are wrong on purpose (sections 6 and 7): on gloo they hang.
DELIBERATELY_BROKEN = {"swap_broken", "log_mean_loss_broken", "gather_predictions_broken"}


def _training_data():
    """A small regression problem like lesson 00's (the same on every rank and backend)."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(16, 3, generator=g)
    y = x @ torch.tensor([[2.0, -1.0, 0.5]]).T + 0.3 + 0.1 * torch.randn(16, 1, generator=g)
    return x, y, 5, 0.5


# (notebook, function, arguments), run in this order on every rank. ``draw(False)`` is not
# compared: it reads the generator's starting state, a fixed seed on the simulator (for
# reproducible runs) but one drawn from the OS in a fresh torch 2.13 process, as the
# lesson says.
CASES = [
    (LESSON_00, "draw", lambda: (True,)),
    (LESSON_00, "hello", tuple),
    (LESSON_00, "where_am_i", lambda: (sc.Cluster.preset("dgx-a100", nodes=2).spec,)),
    (LESSON_00, "first_all_reduce", tuple),
    (LESSON_00, "average", tuple),
    (LESSON_00, "train", _training_data),
    (LESSON_00, "swap_ordered", tuple),
    (LESSON_00, "swap_nonblocking", tuple),
    (LESSON_00, "swap_batched", tuple),
    (LESSON_00, "log_mean_loss", tuple),
    (LESSON_00, "gather_predictions", lambda: (9,)),   # 9 samples: slices of 5 and 4
]


def _code_cells(notebook):
    with open(os.path.join(NOTEBOOKS, notebook), encoding="utf-8") as f:
        cells = json.load(f)["cells"]
    return ["".join(c["source"]) for c in cells if c["cell_type"] == "code"]


def lesson_function(notebook, name):
    """The function ``name`` as defined in a code cell of ``notebook``.

    Only its ``def`` is executed, in a namespace holding what the lessons import
    (torch, dist, nn, DDP) — and not simcluster, so a function that needs the simulator
    fails here.
    """
    for source in _code_cells(notebook):
        for node in ast.parse(source).body:
            if isinstance(node, ast.FunctionDef) and node.name == name:
                namespace = {"torch": torch, "dist": dist, "nn": nn, "DDP": DDP}
                exec(compile(ast.Module([node], []), f"{notebook}:{name}", "exec"), namespace)
                return namespace[name]
    raise LookupError(f"{notebook} defines no function {name!r} in its code cells")


def run_lesson_functions():
    """Every case of ``CASES`` on the current default group, in order: a list of results
    (``{"__error__": ...}`` for a case that raised, as the differential test records it)."""
    results = []
    for notebook, name, make_args in CASES:
        try:
            results.append(lesson_function(notebook, name)(*make_args()))
        except Exception as exc:  # noqa: BLE001 — compared with the other backend's
            results.append({"__error__": f"{type(exc).__name__}: {exc}"})
    return results


@pytest.fixture(scope="module")
def both_backends():
    """``(sim, gloo)``: each a list over ranks of :func:`run_lesson_functions`' results."""
    gloo_run = cases.GlooRun((WORLD_SIZE,), target=run_lesson_functions).start()
    try:
        sim = sc.Cluster.preset("dgx-a100").run(run_lesson_functions, world_size=WORLD_SIZE,
                                                timeout=60).results
        gloo = gloo_run.collect()[WORLD_SIZE]
    finally:
        gloo_run.close()
    if isinstance(gloo, BaseException):
        pytest.fail(f"gloo run failed: {gloo}", pytrace=False)
    return sim, gloo


@pytest.mark.parametrize("index", range(len(CASES)),
                         ids=[f"{nb[:2]}-{name}-{i}" for i, (nb, name, _) in enumerate(CASES)])
def test_lesson_function_gives_the_same_on_gloo(both_backends, index):
    sim, gloo = both_backends
    notebook, name, _ = CASES[index]
    for rank in range(WORLD_SIZE):
        result = gloo[rank][index]
        assert not (isinstance(result, dict) and "__error__" in result), (
            f"{notebook}: {name}() raised on gloo rank {rank}: {result['__error__']}")
        assert_same(sim[rank][index], result, f"{notebook}: {name}() on rank {rank}")


def test_every_lesson_00_function_is_checked_or_broken_on_purpose():
    run_by_lesson = set()
    for source in _code_cells(LESSON_00):
        run_by_lesson |= set(re.findall(r"\.run\(\s*(\w+)", source))
    checked = {name for notebook, name, _ in CASES if notebook == LESSON_00}
    assert run_by_lesson, "found no cluster.run(...) call in lesson 00"
    assert run_by_lesson - DELIBERATELY_BROKEN == checked, (
        "lesson 00 runs functions that are neither checked on gloo nor marked broken: "
        f"{sorted(run_by_lesson - DELIBERATELY_BROKEN - checked)}; checked but not run: "
        f"{sorted(checked - run_by_lesson)}")
