"""Models split into stages, and pipelines measured: what lessons 04 and 05 share.

Nothing here runs a schedule: the labs ask you to write the schedules (naive split, GPipe,
1F1B) yourself, and the lessons use torch's own :mod:`torch.distributed.pipelining`. What
is here is the arithmetic both need:

* :func:`split`: the layers of an ``nn.Sequential`` cut into ``p`` stages;
* :func:`bubble_formula`: the idle fraction of wall time a schedule should have,
  ``(p - 1) / (v·m + p - 1)`` for ``p`` stages, ``m`` micro-batches and ``v`` model
  chunks per stage (GPipe and 1F1B: ``v = 1``);
* :func:`bubble`: the same fraction measured on a finished run: how much of the wall
  time the stages' compute streams did not compute;
* :func:`bubble_uneven`: the formula for stages of unequal cost, where the slowest
  stage sets the pace.
"""

import torch.nn as nn


def split(model, p, boundaries=None):
    """Cut ``model`` (an ``nn.Sequential``) into ``p`` consecutive stages.

    ``boundaries`` are the indices of the layers where stages 1 … p−1 start (``p - 1``
    increasing numbers); None cuts into stages of equal layer count (the first stages get
    one more layer when ``p`` does not divide the count). Returns a list of ``p``
    ``nn.Sequential`` that share their parameters with ``model``.
    """
    n = len(model)
    if boundaries is None:
        sizes = [n // p + (1 if i < n % p else 0) for i in range(p)]
        boundaries = [sum(sizes[:i + 1]) for i in range(p - 1)]
    boundaries = list(boundaries)
    if len(boundaries) != p - 1 or boundaries != sorted(set(boundaries)) or \
            (boundaries and not 0 < boundaries[0] <= boundaries[-1] < n):
        raise ValueError(f"boundaries {boundaries} do not cut {n} layers into {p} non-empty "
                         f"stages: give {p - 1} increasing layer indices between 1 and {n - 1}")
    edges = [0] + boundaries + [n]
    return [model[a:b] for a, b in zip(edges, edges[1:])]


def bubble_formula(p, m, v=1):
    """The bubble as a fraction of wall time: ``(p - 1) / (v·m + p - 1)``.

    With equal stages and free communication, a schedule of ``m`` micro-batches over ``p``
    stages takes ``m + (p - 1)/v`` micro-batch slots, of which each stage computes in
    ``m``. (Papers often quote the bubble relative to the ideal time instead:
    ``(p - 1)/(v·m)``.)
    """
    return (p - 1) / (v * m + p - 1)


def bubble(run, ranks=None, since=0.0):
    """The measured bubble of a finished run: ``1 - compute / elapsed``, averaged over
    ``ranks`` (default: all). Communication a stage waits for counts as bubble.

    ``since`` (simulated seconds) measures only from then to the end of the run, e.g.
    from the end of a barrier that closes the set-up (building the model is not part of
    the schedule)."""
    ranks = range(run.world_size) if ranks is None else ranks
    computes = [sum(max(0.0, e.end - max(e.start, since)) for e in run.clock(r).events
                    if e.lane == "compute") for r in ranks]
    return 1 - sum(computes) / (len(computes) * (run.elapsed - since))


def bubble_uneven(costs, m):
    """The bubble of GPipe or 1F1B over stages of unequal cost, as a fraction of wall time.

    ``costs[s]`` is stage ``s``'s compute time for one micro-batch (any unit). The first
    micro-batch passes every stage once (``sum(costs)``); each of the other ``m - 1`` then
    leaves the pipeline one slowest-stage time later (``max(costs)``), forward and
    backward alike. Each stage computes ``m · costs[s]`` of that. With equal costs this is
    :func:`bubble_formula` ``(p, m)``.
    """
    wall = sum(costs) + (m - 1) * max(costs)
    return 1 - sum(costs) * m / (len(costs) * wall)
