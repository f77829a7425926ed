"""How often to checkpoint, and what failures cost: the formulas lessons 10 and 13 share.

For a checkpoint that takes ``delta`` to write and failures that arrive at random with a
mean gap ``mtbf`` (exponential), :func:`young_interval` and :func:`daly_interval` give the
compute time between checkpoints that maximises goodput, and :func:`expected_goodput`
the goodput itself (Daly 2006, eq. 13). docs/reference-numbers.md, "Checkpoint interval",
has the sources; lesson 10 checks :func:`expected_goodput` against a Monte-Carlo run.
"""

import math


def young_interval(delta, mtbf):
    """Young (1974): the compute time between checkpoints that maximises goodput to first
    order, ``sqrt(2 * delta * mtbf)``; ``delta`` is the time to write one checkpoint,
    ``mtbf`` the mean time between failures (same unit, any)."""
    return math.sqrt(2 * delta * mtbf)


def daly_interval(delta, mtbf):
    """Daly (2006): the higher-order estimate of the optimum interval,
    ``sqrt(2δM)·[1 + ⅓·sqrt(δ/2M) + (δ/2M)/9] − δ`` for ``δ < 2M``, else ``M``."""
    if delta >= 2 * mtbf:
        return mtbf
    x = delta / (2 * mtbf)
    return math.sqrt(2 * delta * mtbf) * (1 + math.sqrt(x) / 3 + x / 9) - delta


def expected_goodput(interval, delta, mtbf, restart):
    """Useful compute over wall time, in expectation, for a job that computes
    ``interval``, writes a checkpoint of ``delta``, and so on; failures arrive at random
    (exponential, mean ``mtbf``), each costs ``restart`` and the work since the last
    checkpoint, and may also strike during a checkpoint or a restart.

    Daly (2006), eq. 13: each segment of ``interval + delta`` takes on average
    ``M·e^(R/M)·(e^((τ+δ)/M) − 1)``.
    """
    per_segment = mtbf * math.exp(restart / mtbf) * math.expm1((interval + delta) / mtbf)
    return interval / per_segment


def job_mtbf(nodes, failures_per_node_per_day):
    """Seconds between failures of a job on ``nodes`` nodes, each failing independently
    at ``failures_per_node_per_day``: any one of them stops the gang."""
    return 86400.0 / (nodes * failures_per_node_per_day)
