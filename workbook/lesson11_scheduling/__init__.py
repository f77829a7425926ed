"""Lesson 11 (sharing a cluster): the lesson's measurements (:mod:`.demos`), the lab's
helpers (:mod:`.lab`), the lab's checks (:mod:`.checks`) and the reference answers they
compare against (:mod:`._reference`).

The lab imports :mod:`workbook.checks` and :mod:`.lab`, never the answers: the checks
import ``_reference`` only inside the check functions, and refuse the simulator's own
rules (:mod:`simcluster.scheduling`), which a learner could otherwise hand in.
"""
