"""Lesson 08, memory and precision: bytes per parameter, loss scaling, activation
checkpointing. The lab's helpers include :class:`.lab.MasterWeights`, :func:`.lab.run_fit`.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
