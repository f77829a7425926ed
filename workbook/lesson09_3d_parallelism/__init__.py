"""Lesson 09 (3D parallelism and the planner): the checks of its lab (:mod:`.checks`) and
the reference answers the checks compare against (:mod:`._reference`).

The lab imports :mod:`workbook.checks` and :mod:`simcluster.planner`, never the answers:
the checks import ``_reference`` only inside the check functions.
"""
