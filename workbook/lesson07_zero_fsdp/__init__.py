"""Lesson 07 (ZeRO stages 1–3 and FSDP2): the checks of its lab (:mod:`.checks`), the
helpers the lab gives the learner (the shard layout, the sharded linear layer) and the
reference answers the checks compare against (:mod:`._reference`).

The lab imports :mod:`workbook.checks` and :mod:`.checks`, never the answers: the checks
import ``_reference`` only inside the check functions.
"""
