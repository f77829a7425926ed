"""Lesson 12 (serving models): the lesson's measurements (:mod:`.demos`), the lab's
helpers (:mod:`.lab`), the lab's checks (:mod:`.checks`) and the reference answers they
compare against (:mod:`._reference`, imported only inside the check functions).

The lab imports :mod:`workbook.checks` and :mod:`.lab`, never the answers.
"""
