"""Lesson 04, model parallelism: the naive split by layers with send/recv. The lab
splits :func:`.lab.make_model`.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
