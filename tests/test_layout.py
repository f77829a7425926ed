"""The workbook's layout: one package per lesson, no import cycles, no lesson package that
imports another, labs that import only their own lesson and the shared protocol, and
the import paths of release 0.1 still working (deprecated aliases, workbook._aliases).
"""

import ast
import importlib
import inspect
import json
import re
from pathlib import Path

import nbformat
import pytest

from workbook import _aliases

ROOT = Path(__file__).resolve().parents[1]
WORKBOOK = ROOT / "workbook"
LESSONS = sorted(p.name for p in WORKBOOK.iterdir() if re.fullmatch(r"lesson\d\d_\w+", p.name))
# what several lessons share; a lab may import the protocol and these, besides its lesson
SHARED = {"workbook.checking", "workbook.quiz", "workbook.pipeline", "workbook.models"}


def _module_name(path):
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


def _imports(path, top_level_only):
    """The workbook modules ``path`` imports (``from workbook import x`` counts as
    ``workbook.x`` when that is a module), at module level or anywhere."""
    tree = ast.parse(path.read_text())
    nodes = tree.body if top_level_only else list(ast.walk(tree))
    found = set()
    for node in nodes:
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.add(node.module)
            found |= {f"{node.module}.{a.name}" for a in node.names}
    return {name for name in found if name.startswith("workbook")}


def _modules():
    return {_module_name(p): p for p in WORKBOOK.rglob("*.py")}


def test_every_lesson_notebook_with_a_lab_has_its_package():
    stems = {p.stem for p in (ROOT / "solutions").glob("*.ipynb")}
    assert {f"lesson{stem}" for stem in stems} <= set(LESSONS)
    for lesson in LESSONS:
        files = {p.name for p in (WORKBOOK / lesson).glob("*.py")}
        assert {"__init__.py", "checks.py", "_reference.py"} <= files, lesson


def test_no_import_cycles_at_module_level():
    modules = _modules()
    graph = {name: _imports(path, top_level_only=True) & set(modules)
             for name, path in modules.items()}
    # a package's submodule imports its package first: that edge is not a cycle
    graph = {name: {d for d in deps if d != name and not name.startswith(d + ".")}
             for name, deps in graph.items()}
    done, stack = set(), []

    def visit(name):
        if name in stack:
            cycle = stack[stack.index(name):] + [name]
            raise AssertionError("import cycle: " + " -> ".join(cycle))
        if name in done:
            return
        stack.append(name)
        for dep in sorted(graph[name]):
            visit(dep)
        stack.pop()
        done.add(name)

    for name in sorted(graph):
        visit(name)


def _lesson_of(module):
    """``lesson03_data_parallel`` for ``workbook.lesson03_data_parallel.checks``, else None."""
    parts = module.split(".")
    return parts[1] if len(parts) > 1 and parts[1] in LESSONS else None


def test_no_lesson_package_imports_another_nor_an_old_name():
    old = set(_aliases.ALIASES) | {"workbook.checks"}
    for name, path in _modules().items():
        imported = _imports(path, top_level_only=False)
        if name in old or name == "workbook._aliases":
            continue
        assert not imported & old, f"{name} imports a deprecated name: {imported & old}"
        lesson = _lesson_of(name)
        others = {i for i in imported if _lesson_of(i) not in (None, lesson)}
        assert not others, f"{name} imports another lesson's package: {others}"


@pytest.mark.parametrize("lesson", LESSONS)
def test_answers_are_imported_only_inside_the_checks(lesson):
    package = f"workbook.{lesson}"
    modules = _modules()
    for module in ("checks", "lab", "demos", "__init__"):
        path = WORKBOOK / lesson / f"{module}.py"
        if path.exists():
            top = _imports(path, top_level_only=True)
            assert f"{package}._reference" not in top, f"{package}.{module} imports the answers"
    for module in ("lab", "_reference"):
        path = WORKBOOK / lesson / f"{module}.py"
        if path.exists():
            assert f"{package}.checks" not in _imports(path, top_level_only=False), \
                f"{package}.{module} imports its checks"
    assert f"{package}.checks" in modules


def _code_lines(path):
    nb = json.loads(path.read_text())
    return [line for cell in nb["cells"] if cell["cell_type"] == "code"
            for line in "".join(cell["source"]).splitlines()]


@pytest.mark.parametrize("solution", sorted((ROOT / "solutions").glob("*.ipynb")),
                         ids=lambda p: p.stem)
def test_a_lab_imports_only_its_lesson_and_the_shared_protocol(solution):
    own = f"workbook.lesson{solution.stem}"
    tree = ast.parse("\n".join(line for line in _code_lines(solution)
                               if not line.lstrip().startswith(("%", "!"))))
    for node in ast.walk(tree):
        names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                 [node.module] if isinstance(node, ast.ImportFrom) and node.module else [])
        for name in names:
            if name.startswith("workbook.lesson"):
                assert name == own or name.startswith(own + "."), (solution.name, name)
            elif name == "workbook":
                imported = {f"workbook.{a.name}" for a in node.names}
                assert imported <= SHARED, (solution.name, imported - SHARED)
            elif name.startswith("workbook"):
                assert name in SHARED, (solution.name, name)


# ------------------------------------------------- release 0.1's import paths, aliased

# every import line of release 0.1's notebooks, solutions and labs that names the workbook
OLD_IMPORTS = """\
from workbook import aggregation as agg
from workbook import checks, quiz
from workbook import dataparallel as dp
from workbook import modelparallel as mp
from workbook import pipeline, quiz
from workbook import quiz, schedules
from workbook.pipeline import bubble_formula, bubble_uneven
from workbook import tensorparallel as tp
from workbook import zero
from workbook import precision as P
from workbook import parallel3d as p3
from workbook import failures as fail
from workbook.lesson03.checks import batch, make_mlp, mse
from workbook.lesson04.checks import batch, in_shapes, make_model, mse
from workbook.lesson05.checks import measure_schedule
from workbook.lesson06.checks import SEQUENCE, Block, activations
from workbook.lesson07.checks import fit_psi, fit_time, my_shard, shard_size
from workbook.lesson08.checks import (CHECKPOINT_CAPS, FIT_MEMORY, measure_checkpoints,
                                      oom_text, profile_blocks, recipe_model, run_fit,
                                      scaled_training, train_plain)
from workbook.lesson09.checks import (LAYOUT_CAPS_GIB, LLAMA_7B, GiB, describe_layout,
                                      layout_cluster)
from workbook.lesson10 import job
from workbook.lesson02 import checks as checks_02
from workbook.lesson07.checks import ShardedLinear
from workbook.lesson08.checks import MasterWeights
"""


def test_release_0_1_import_lines_still_work():
    namespace = {}
    exec(OLD_IMPORTS, namespace)
    lab08 = importlib.import_module("workbook.lesson08_memory_and_precision.lab")
    assert namespace["MasterWeights"] is lab08.MasterWeights
    assert namespace["job"].build is importlib.import_module(
        "workbook.lesson10_failure_handling.lab").build
    checks03 = importlib.import_module("workbook.lesson03_data_parallel.checks")
    assert namespace["checks"].check_average_gradients is checks03.check_average_gradients
    assert namespace["agg"].TinyMLP is importlib.import_module("workbook.models").TinyMLP


@pytest.mark.parametrize("old", sorted(_aliases.ALIASES))
def test_each_alias_is_marked_for_removal_and_re_exports_the_new_module(old):
    module = importlib.import_module(old)
    assert module.__doc__.startswith("Deprecated alias: ") and "remove after" in module.__doc__
    new = importlib.import_module(_aliases.ALIASES[old][0])
    # (a package's submodules are themselves aliased: workbook.lesson03.checks)
    public = [name for name, value in vars(new).items()
              if not name.startswith("_") and not inspect.ismodule(value)]
    assert all(getattr(module, name) is getattr(new, name) for name in public)
    assert public or new.__name__.count(".") == 1
    with pytest.raises(AttributeError, match="no attribute 'not_a_name'"):
        module.not_a_name  # noqa: B018


def test_workbook_checks_is_an_alias_of_every_release_0_1_lessons_checks():
    from workbook import checks

    assert checks.__doc__.startswith("Deprecated alias: ")
    # later lessons' labs import their own checks: they never used workbook.checks
    for lesson in (f"lesson{n}_{stem}" for n, stem in _aliases._PACKAGES.items()):
        lesson_checks = importlib.import_module(f"workbook.{lesson}.checks")
        own = [name for name, value in vars(lesson_checks).items()
               if name.startswith("check_")
               and getattr(value, "__module__", "") == lesson_checks.__name__]
        assert own and all(getattr(checks, name) is getattr(lesson_checks, name)
                           for name in own), lesson


# release 0.1's import lines of lab 03, and the lines that replaced them
LAB03_OLD = {"from workbook import quiz\nfrom workbook.lesson03_data_parallel import checks\n":
             "from workbook import checks, quiz\n",
             "from workbook.lesson03_data_parallel.lab import batch, make_mlp, mse":
             "from workbook.lesson03.checks import batch, make_mlp, mse"}


def test_a_lab_solved_with_release_0_1_imports_passes_every_check():
    """A learner's lab 03, solved before the upgrade (its import lines are 0.1's), runs
    after it as the lab with today's lines does: for every name the solved lab's code
    uses, the old lines bind the very object the new ones bind (and it uses the checks
    module only through its attributes). So it passes every check, as the lab solved with
    today's lines does when tests/test_lab_02_learner.py runs it, without running it again."""
    from test_lab_02_learner import fill_in

    name = "03_data_parallel.ipynb"
    lab = nbformat.read(ROOT / "labs" / name, as_version=4)
    solution = nbformat.read(ROOT / "solutions" / name, as_version=4)
    numbers = {e["number"] for e in lab.metadata["workbook"]["exercises"]}
    code = "\n".join(cell.source for cell in fill_in(lab, solution, numbers).cells
                     if cell.cell_type == "code")
    assert sum(code.count(new) for new in LAB03_OLD) == len(LAB03_OLD), \
        "lab 03's import lines changed: update LAB03_OLD"
    new_names, old_names = {}, {}
    for new, old in LAB03_OLD.items():
        exec(new, new_names)                # noqa: S102 -- the lab's own import lines
        exec(old, old_names)                # noqa: S102
    bound = set(new_names) - {"__builtins__"}
    assert bound == set(old_names) - {"__builtins__"} == {"checks", "quiz", "batch",
                                                          "make_mlp", "mse"}
    tree = ast.parse(code)
    parents = {child: node for node in ast.walk(tree) for child in ast.iter_child_nodes(node)}
    used = [node for node in ast.walk(tree) if isinstance(node, ast.Name) and node.id == "checks"]
    assert used and all(isinstance(parents[node], ast.Attribute) for node in used), \
        "the lab uses the checks module itself, not only its attributes"
    attributes = {parents[node].attr for node in used}
    assert {"check_average_gradients", "check_distributed_trainer"} <= attributes
    for attribute in sorted(attributes):
        assert getattr(old_names["checks"], attribute) is getattr(new_names["checks"], attribute), \
            attribute
    for other in sorted(bound - {"checks"}):
        assert old_names[other] is new_names[other], other
