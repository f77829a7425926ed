"""What the notebooks need besides the cluster.

- :mod:`workbook.checks`: every lab's exercise checks (``checks.check_ring_allreduce(fn)``),
  on the protocol of :mod:`workbook.checking`; each lesson keeps its checks and its
  private reference answers in ``workbook.lessonNN``;
- :mod:`workbook.aggregation`: lesson 02's helpers, demos and measuring functions;
- :mod:`workbook.pipeline`: stages, the bubble formula and the measured bubble (lessons 04, 05);
- :mod:`workbook.quiz`: quizzes; :mod:`workbook.labs`: the lab builder;
  :mod:`workbook.progress`: the progress report;
- :mod:`workbook.outputs`: printing what every CPU reproduces (bounds, stable digits) and
  progress bars that are stored finished.
"""
