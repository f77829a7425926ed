"""Lesson 03, data parallelism: DDP, buckets, overlap, accumulation. The lab trains
:func:`.lab.make_mlp` on :func:`.lab.batch`.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
