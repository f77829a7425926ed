"""Lesson 10 (failure handling): the training job lab 10 checkpoints (:mod:`.job`), the
checks of the lab (:mod:`.checks`) and the reference answers they compare against
(:mod:`._reference`).

The lab imports :mod:`workbook.checks` and :mod:`.job` (the model, data and training step
its first exercise checkpoints), never the answers: the checks import ``_reference`` only
inside the check functions. Neither the lab nor its checks import :mod:`workbook.failures`,
the lesson's demos.
"""
