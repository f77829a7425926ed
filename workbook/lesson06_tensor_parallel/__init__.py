"""Lesson 06 (tensor and sequence parallelism): the checks of its lab (:mod:`.checks`)
and the reference answers they compare against (:mod:`._reference`).

The lab imports :mod:`workbook.checks` (and the checks' models and inputs from
:mod:`.checks`), never the answers: the checks import ``_reference`` only inside the
check functions.
"""
