"""Lesson 09, 3D parallelism and the planner. The lab chooses a layout for
:data:`.lab.LLAMA_7B` on :func:`.lab.layout_cluster`.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
