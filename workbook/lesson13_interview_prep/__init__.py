"""Lesson 13, interview preparation: numeric drills with computed answers, the 1,000-node
system-design question worked end to end and graded (:mod:`.design`), a race-free
parameter server explored over many interleavings, the questions and claims of an article
about a training "protocol" answered with measurements, and a reading list.

Modules: ``design``, ``demos``, ``lab``, ``checks``, ``_reference``, ``quizzes`` (see
:mod:`workbook`); ``drills`` and ``parameter_server`` hold the drills and the parameter
server, with their own checks, which ``checks`` re-exports."""
