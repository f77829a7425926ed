"""Lesson 05, pipeline parallelism: GPipe, 1F1B, interleaving, torch's pipelining.
The lab times its schedules with :func:`.lab.measure_schedule`.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
