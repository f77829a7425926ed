"""Lesson 06, tensor and sequence parallelism: Megatron's MLP and attention with
DTensor. The lab parallelizes :class:`.lab.Block`.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
