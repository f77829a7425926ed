"""The reference answer to lab 13's parameter server (:mod:`.parameter_server`).

Import it only inside a function (the check, the lesson's demo), never at module level:
importing the lab's checks must not load answers.
"""

import torch
import torch.distributed as dist

from workbook.lesson13_interview_prep.parameter_server import PULL, PUSH, SERVER, SYNC


def push(gradients):
    """Send one gradient: a header that says PUSH, then the gradient itself."""
    dist.send(torch.tensor([float(PUSH)]), SERVER)
    dist.send(gradients, SERVER)


def pull(params):
    """Ask for the parameters; the server answers when the staleness bound allows."""
    dist.send(torch.tensor([float(PULL)]), SERVER)
    dist.recv(params, SERVER)
    return params


def sync(params):
    """A pull that waits until every worker has pushed as often as this one."""
    dist.send(torch.tensor([float(SYNC)]), SERVER)
    dist.recv(params, SERVER)
    return params


def serve(params, lr, workers, steps, bound):
    """The server: apply every push, answer requests as the bound allows, return params."""
    clock = {w: 0 for w in workers}   # pushes received from each worker
    waiting = []                       # (worker, lead it may have) not yet answered
    header = torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)        # any worker: requests arrive in any order
        if header.item() == PUSH:
            gradient = torch.empty_like(params)
            dist.recv(gradient, src)   # from that worker, not any: its header came first
            params -= lr * gradient
            clock[src] += 1
        else:
            waiting.append((src, bound if header.item() == PULL else 0))
        # Answer every request the slowest worker now allows (a push may free several).
        slowest = min(clock.values())
        for request in list(waiting):
            worker, lead = request
            if clock[worker] - slowest <= lead:
                dist.send(params, worker)
                waiting.remove(request)
    return params
