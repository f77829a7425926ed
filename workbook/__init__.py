"""What the notebooks need besides the cluster.

One package per lesson, named ``lesson`` + the notebook's stem
(``notebooks/03_data_parallel.ipynb`` → :mod:`workbook.lesson03_data_parallel`), holding
everything that lesson and its lab need:

- ``demos.py``: the lesson notebook's models, demos and measuring functions;
- ``lab.py``: what the lab gives the learner (its models, data, measuring helpers);
- ``checks.py``: the lab's exercise checks, on the protocol of :mod:`workbook.checking`;
- ``_reference.py``: the reference answers, imported only inside the check functions.

A lesson package imports only its own modules and the shared ones below, never another
lesson's package. Shared, because several lessons use them:

- :mod:`workbook.checking`: the check protocol (and :mod:`workbook.restart`, the kernel
  extension that answers a check cell run before the setup cell);
  :mod:`workbook.quiz`: quizzes;
  :mod:`workbook.labs`: the lab builder; :mod:`workbook.progress`: the progress report;
- :mod:`workbook.models`: the models and optimizer several lessons train;
  :mod:`workbook.pipeline`: stages and bubbles (lessons 04, 05, 09);
  :mod:`workbook._parameter_server`: lesson 02's answer that lesson 10's demos reuse.
- :mod:`workbook.outputs`: printing what every CPU reproduces (bounds, stable digits) and
  progress bars that are stored finished.
- the workshop's tools: :mod:`workbook.doctor`, :mod:`workbook.workspace`,
  :mod:`workbook.handin`, :mod:`workbook.instructor`, :mod:`workbook.slides`
  (``workshop/README.md``).

The import paths of release 0.1 (``workbook.checks``, ``workbook.dataparallel``,
``workbook.lesson03.checks``, ...) still work, as deprecated aliases
(:mod:`workbook._aliases`).
"""

from workbook import _aliases

_aliases.install()
