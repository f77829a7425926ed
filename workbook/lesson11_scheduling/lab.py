"""What lab 11's cells use besides the checks: a picture of a cluster's free GPUs and of a
placement, so that a learner can see what their rule did."""


def show(free, taken=None, switches=None):
    """Print one line per node: ``.`` for a free GPU, ``X`` for one that ``taken``
    ({node: count}) takes; the nodes of each leaf switch (``switches``) together."""
    taken = taken or {}
    groups = switches or [list(range(len(free)))]
    for i, members in enumerate(groups):
        if i:
            print()
        for node in members:
            n = taken.get(node, 0)
            print(f"node {node:2d}: " + "X" * n + "." * (free[node] - n)
                  + f"   ({free[node]} free{f', takes {n}' if n else ''})")
