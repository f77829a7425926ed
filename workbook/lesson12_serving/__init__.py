"""Lesson 12, serving models: prefill and decode, the KV cache, batching, replicas and
autoscaling, on :mod:`simcluster.serving`. The lesson measures a decode step executed on
the cluster (:mod:`.demos`); the lab sizes caches, batches, fleets and autoscalers.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
