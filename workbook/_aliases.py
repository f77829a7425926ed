"""Deprecated alias: the import paths of workbook 0.1, from before each lesson had one
package (``workbook.checks``, ``workbook.lesson03.checks``, ``workbook.dataparallel``,
``workbook.lesson10.job``, ...); remove after release 0.2.

A lab a learner edited before the upgrade still imports them, and a learner's work is
sacred, so each old name in :data:`ALIASES` stays importable: importing it makes a thin
module that re-exports the names of the modules that now hold its contents (the first
that has a name wins). Nothing in the workbook itself imports an old name, and
``tests/test_layout.py`` runs a lab written with them. ``workbook.checks`` is a file of
its own (:mod:`workbook.checks`), for the same reason.
"""

import importlib
import importlib.abc
import importlib.util
import sys

# the lessons' packages, by their old names (workbook.lessonNN)
_PACKAGES = {"02": "gradient_aggregation", "03": "data_parallel", "04": "model_parallel",
             "05": "pipeline_parallel", "06": "tensor_parallel", "07": "zero_fsdp",
             "08": "memory_and_precision", "09": "3d_parallelism", "10": "failure_handling"}
# the old topic modules: each is now its lesson's demos
_TOPICS = {"aggregation": "02", "dataparallel": "03", "modelparallel": "04", "schedules": "05",
           "tensorparallel": "06", "zero": "07", "precision": "08", "parallel3d": "09",
           "failures": "10"}


def _new(number, module=""):
    return f"workbook.lesson{number}_{_PACKAGES[number]}" + (f".{module}" if module else "")


# old module name: the new modules whose names it re-exports
ALIASES = {f"workbook.{topic}": (_new(number, "demos"),) for topic, number in _TOPICS.items()}
for _n in _PACKAGES:
    ALIASES[f"workbook.lesson{_n}"] = (_new(_n),)
    # the old checks module was also the lab's helper module
    ALIASES[f"workbook.lesson{_n}.checks"] = (_new(_n, "checks"), _new(_n, "lab"))
    ALIASES[f"workbook.lesson{_n}._reference"] = (_new(_n, "_reference"),)
ALIASES["workbook.lesson10.job"] = (_new("10", "lab"),)
# a few names moved to the modules several lessons share
ALIASES["workbook.aggregation"] += ("workbook.models",)
ALIASES["workbook.dataparallel"] += ("workbook.models",)
ALIASES["workbook.tensorparallel"] += ("workbook.models",)
ALIASES["workbook.zero"] += ("workbook.models",)
ALIASES["workbook.lesson02._reference"] += ("workbook._parameter_server",)


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old names of :data:`ALIASES` and makes their modules."""

    def find_spec(self, name, path=None, target=None):
        if name not in ALIASES:
            return None
        # workbook.lessonNN is a package: its old submodules are imported through it
        return importlib.util.spec_from_loader(name, self, is_package=name.count(".") == 1
                                               and name in (f"workbook.lesson{n}"
                                                            for n in _PACKAGES))

    def create_module(self, spec):
        return None

    def exec_module(self, module):
        name = module.__name__
        targets = [importlib.import_module(target) for target in ALIASES[name]]
        module.__doc__ = (f"Deprecated alias: {name} is now "
                          f"{' and '.join(t.__name__ for t in targets)}; remove after "
                          "release 0.2.")
        public = sorted({attr for t in targets for attr in dir(t) if not attr.startswith("_")})
        module.__all__ = public

        def __getattr__(attr):
            for t in targets:
                if hasattr(t, attr):
                    return getattr(t, attr)
            raise AttributeError(f"module {name!r} (now {ALIASES[name][0]}) has no "
                                 f"attribute {attr!r}")

        module.__getattr__ = __getattr__
        module.__dir__ = lambda: public


def install():
    """Make the old names importable (once per process; :mod:`workbook` calls this)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        # first: an editable install's finder would otherwise find an old checkout's files
        sys.meta_path.insert(0, _AliasFinder())
