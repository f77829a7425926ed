"""Lesson 08 (memory and precision): ``notebooks/08_memory_and_precision.ipynb`` and its lab.

- :mod:`.demos`: what the lesson notebook imports (its models, demos, measurements);
- :mod:`.lab`: what the lab gives the learner (models, data, measuring helpers);
- :mod:`.checks`: the lab's exercise checks, on the protocol of :mod:`workbook.checking`;
- :mod:`._reference`: the reference answers the checks compare against.

The lab imports :mod:`.lab` and :mod:`.checks`, never the answers: the checks import
``_reference`` only inside the check functions, and neither :mod:`.lab` nor
:mod:`._reference` imports :mod:`.checks`. This package imports no other lesson's.
"""
