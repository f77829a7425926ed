"""Lesson 08 (memory and precision): the checks of its lab (:mod:`.checks`), the helpers
the lab gives the learner (the optimizer with fp32 master weights, the block stack to
checkpoint and its profile, the small device to fit a model on) and the reference answers
the checks compare against (:mod:`._reference`).

The lab imports :mod:`workbook.checks` and :mod:`.checks`, never the answers: the checks
import ``_reference`` only inside the check functions.
"""
