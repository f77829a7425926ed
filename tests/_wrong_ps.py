"""Wrong answers to lab 13's parameter server (tests/test_lesson13_ps.py): each is the
reference (workbook/lesson13_interview_prep/_reference_ps.py) with one mistake."""

import torch
import torch.distributed as dist

from workbook.lesson13_interview_prep.parameter_server import PULL, PUSH, SERVER, SYNC


def push(gradients):
    dist.send(torch.tensor([float(PUSH)]), SERVER)
    dist.send(gradients, SERVER)


def pull(params):
    dist.send(torch.tensor([float(PULL)]), SERVER)
    dist.recv(params, SERVER)
    return params


def sync(params):
    dist.send(torch.tensor([float(SYNC)]), SERVER)
    dist.recv(params, SERVER)
    return params


def _answer(params, clock, waiting):
    slowest = min(clock.values())
    for request in list(waiting):
        worker, lead = request
        if clock[worker] - slowest <= lead:
            dist.send(params, worker)
            waiting.remove(request)


def serve_gradient_from_any(params, lr, workers, steps, bound):
    """Receives the gradient from any worker, not from the one whose header it read: a
    push header sent in the meantime lands in the gradient buffer."""
    clock, waiting, header = {w: 0 for w in workers}, [], torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        if header.item() == PUSH:
            gradient = torch.zeros_like(params)
            src = dist.recv(gradient)           # the mistake: any source
            params -= lr * gradient
            clock[src] += 1
        else:
            waiting.append((src, bound if header.item() == PULL else 0))
        _answer(params, clock, waiting)
    return params


def serve_without_bound(params, lr, workers, steps, bound):
    """Answers every pull and sync at once: fully asynchronous, no staleness bound."""
    clock, header = {w: 0 for w in workers}, torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        if header.item() == PUSH:
            gradient = torch.empty_like(params)
            dist.recv(gradient, src)
            params -= lr * gradient
            clock[src] += 1
        else:
            dist.send(params, src)
    return params


def serve_answers_only_on_arrival(params, lr, workers, steps, bound):
    """Looks at the waiting requests only when a new request arrives, not after a push:
    a worker put aside may wait for ever."""
    clock, waiting, header = {w: 0 for w in workers}, [], torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        if header.item() == PUSH:
            gradient = torch.empty_like(params)
            dist.recv(gradient, src)
            params -= lr * gradient
            clock[src] += 1
        else:
            waiting.append((src, bound if header.item() == PULL else 0))
            _answer(params, clock, waiting)
    return params


def serve_spins(params, lr, workers, steps, bound):
    """Waits for the bound in a loop that receives nothing, so the clocks never move."""
    clock, header = {w: 0 for w in workers}, torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        if header.item() == PUSH:
            gradient = torch.empty_like(params)
            dist.recv(gradient, src)
            params -= lr * gradient
            clock[src] += 1
        else:
            lead = bound if header.item() == PULL else 0
            while clock[src] - min(clock.values()) > lead:
                pass
            dist.send(params, src)
    return params


def serve_bound_off_by_one(params, lr, workers, steps, bound):
    """Lets a worker run bound + 1 pushes ahead of the slowest."""
    clock, waiting, header = {w: 0 for w in workers}, [], torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        if header.item() == PUSH:
            gradient = torch.empty_like(params)
            dist.recv(gradient, src)
            params -= lr * gradient
            clock[src] += 1
        else:
            waiting.append((src, bound if header.item() == PULL else 0))
        slowest = min(clock.values())
        for request in list(waiting):
            worker, lead = request
            if clock[worker] - slowest <= lead + 1:
                dist.send(params, worker)
                waiting.remove(request)
    return params


def serve_not_started(params, lr, workers, steps, bound):
    raise NotImplementedError("the server's loop: receive a header from any worker, ...")


def serve_head_of_line(params, lr, workers, steps, bound):
    """Answers waiting requests in arrival order and stops at the first it may not answer
    yet: the slowest worker's request can wait behind it for ever."""
    clock, waiting, header = {w: 0 for w in workers}, [], torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        if header.item() == PUSH:
            gradient = torch.empty_like(params)
            dist.recv(gradient, src)
            params -= lr * gradient
            clock[src] += 1
        else:
            waiting.append((src, bound if header.item() == PULL else 0))
        while waiting and clock[waiting[0][0]] - min(clock.values()) <= waiting[0][1]:
            dist.send(params, waiting.pop(0)[0])
    return params


def serve_never_rechecks(params, lr, workers, steps, bound):
    """Answers a request at once if the bound allows, else puts it aside, and never looks
    at the ones put aside again."""
    clock, waiting, header = {w: 0 for w in workers}, [], torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        if header.item() == PUSH:
            gradient = torch.empty_like(params)
            dist.recv(gradient, src)
            params -= lr * gradient
            clock[src] += 1
        elif clock[src] - min(clock.values()) <= (bound if header.item() == PULL else 0):
            dist.send(params, src)
        else:
            waiting.append(src)
    return params


def serve_answers_before_applying(params, lr, workers, steps, bound):
    """Answers the requests a push frees before it applies that push."""
    clock, waiting, header = {w: 0 for w in workers}, [], torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        gradient = torch.zeros_like(params)
        if header.item() == PUSH:
            dist.recv(gradient, src)
            clock[src] += 1
        else:
            waiting.append((src, bound if header.item() == PULL else 0))
        _answer(params, clock, waiting)
        params -= lr * gradient
    return params


# Workers that push new parameters (what they pulled, minus their step) instead of the
# gradient; the server turns them back into a difference with the parameters it last sent.
_pulled = {}


def push_parameters(gradients):
    from workbook.lesson13_interview_prep.parameter_server import LR
    dist.send(torch.tensor([float(PUSH)]), SERVER)
    dist.send(_pulled[dist.get_rank()] - LR * gradients, SERVER)


def pull_remembering(params):
    pull(params)
    _pulled[dist.get_rank()] = params.clone()
    return params


def sync_remembering(params):
    sync(params)
    _pulled[dist.get_rank()] = params.clone()
    return params


def serve_snapshot_per_step(params, lr, workers, steps, bound):
    """Applies each push as (new parameters - the parameters it served for that step),
    keeping one copy per step, not per worker: right in round-robin order, where the
    workers of a step are served the same parameters; other orders lose updates."""
    clock, waiting, header = {w: 0 for w in workers}, [], torch.zeros(1)
    served = {}
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        if header.item() == PUSH:
            new = torch.empty_like(params)
            dist.recv(new, src)
            params += new - served[clock[src]]
            clock[src] += 1
        else:
            waiting.append((src, bound if header.item() == PULL else 0))
        slowest = min(clock.values())
        for request in list(waiting):
            worker, lead = request
            if clock[worker] - slowest <= lead:
                dist.send(params, worker)
                served[clock[worker]] = params.clone()
                waiting.remove(request)
    return params


def serve_without_lr(params, lr, workers, steps, bound):
    """Applies the gradient itself: params -= gradient."""
    return _serve_applying(params, workers, steps, bound, lambda g: g)


def serve_up_the_gradient(params, lr, workers, steps, bound):
    """Adds lr * gradient instead of subtracting it."""
    return _serve_applying(params, workers, steps, bound, lambda g: -lr * g)


def _serve_applying(params, workers, steps, bound, step_of):
    clock, waiting, header = {w: 0 for w in workers}, [], torch.zeros(1)
    while sum(clock.values()) < steps * len(workers):
        src = dist.recv(header)
        if header.item() == PUSH:
            gradient = torch.empty_like(params)
            dist.recv(gradient, src)
            params -= step_of(gradient)
            clock[src] += 1
        else:
            waiting.append((src, bound if header.item() == PULL else 0))
        _answer(params, clock, waiting)
    return params


def serve_stops_early(params, lr, workers, steps, bound):
    """Stops after steps - 1 pushes per worker: the last pushes are never received."""
    from workbook.lesson13_interview_prep import _reference_ps
    return _reference_ps.serve(params, lr, workers, steps - 1, bound)


def pull_without_header(params):
    """Waits for the parameters without asking for them."""
    dist.recv(params, SERVER)
    return params


# A server and workers that send no point-to-point message: every pull and every push is
# an all-reduce that the server joins (the server adds its parameters to a pull's zeros,
# and takes the sum of the pushes), so every update arrives in time, but nothing is
# pushed to or pulled from the server.
def silent_push(gradients):
    dist.all_reduce(gradients)


def silent_pull(params):
    params.zero_()
    dist.all_reduce(params)
    return params


def silent_serve(params, lr, workers, steps, bound):
    for _ in range(steps):
        dist.all_reduce(params.clone())                  # every worker's pull
        pushed = torch.zeros_like(params)
        dist.all_reduce(pushed)                          # every worker's push
        params -= lr * pushed
    return params
