"""Lesson 05 (pipeline parallelism): the checks of its lab (:mod:`.checks`) and the
reference answers they compare against (:mod:`._reference`).

The lab imports :mod:`workbook.checks`, never the answers: the checks import
``_reference`` only inside the check functions.
"""
