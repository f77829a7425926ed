"""Lesson 02 (gradient aggregation): the checks of its lab (:mod:`.checks`) and the
reference answers they compare against (:mod:`._reference`).

The lesson and the lab import :mod:`workbook.aggregation` (helpers, demos, measuring) and
:mod:`workbook.checks`; neither imports the answers. The checks import ``_reference``
only inside the check functions.
"""
