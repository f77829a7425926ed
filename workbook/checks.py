"""Deprecated alias: every lab's checks in one module (``from workbook import checks``);
remove after release 0.2.

Each lesson now keeps its checks in its own package, and a lab imports them from there
(``from workbook.lesson03_data_parallel import checks``). This module re-exports every
lesson's ``check_*`` functions so that a lab edited before the upgrade still runs.
"""

import importlib

_LESSONS = ("lesson02_gradient_aggregation", "lesson03_data_parallel",
            "lesson04_model_parallel", "lesson05_pipeline_parallel",
            "lesson06_tensor_parallel", "lesson07_zero_fsdp",
            "lesson08_memory_and_precision", "lesson09_3d_parallelism",
            "lesson10_failure_handling")

__all__ = []
for _lesson in _LESSONS:
    _checks = importlib.import_module(f"workbook.{_lesson}.checks")
    for _name in dir(_checks):
        _value = getattr(_checks, _name)
        # the lesson's own checks, not the protocol's helpers it imports (check_outputs)
        if _name.startswith("check_") and getattr(_value, "__module__", "") == _checks.__name__:
            globals()[_name] = _value
            __all__.append(_name)
