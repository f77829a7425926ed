"""Lesson 07, ZeRO and FSDP2. The lab shards with :func:`.lab.my_shard` and
:class:`.lab.ShardedLinear`, and fits models with :func:`.lab.fit_time`
and :func:`.lab.fit_memory`.

Modules: ``demos``, ``lab``, ``checks``, ``_reference`` (see :mod:`workbook`)."""
