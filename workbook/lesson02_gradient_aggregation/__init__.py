"""Lesson 02, gradient aggregation: parameter servers, all-reduce from send/recv,
compression, local SGD. The lab gives ``chunk_bounds``, ``exchange`` and ``flat_view``.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
