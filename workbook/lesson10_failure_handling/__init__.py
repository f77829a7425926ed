"""Lesson 10, failure handling: crashes, stragglers, checkpoints, recovery. The lab
checkpoints the training job of :mod:`.lab`.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
