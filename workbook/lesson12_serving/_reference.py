"""Reference answers of lab 12 (serving). Imported only inside the checks
(:mod:`.checks`), never by the lab: these are the answers."""

import math

from simcluster import planner, serving


def kv_room(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    """Sequences of ``context`` tokens whose KV cache fits beside the weights in
    ``utilization`` of ``memory`` bytes, before rounding (negative: the weights do not
    fit)."""
    kv_per_token = 2 * cfg.layers * cfg.kv * cfg.head_dim * dtype_bytes
    free = utilization * memory - planner.parameter_count(cfg) * dtype_bytes
    return free / (kv_per_token * context)


def max_batch(cfg, memory, context, dtype_bytes=2, utilization=0.9):
    """Whole sequences of ``context`` tokens whose KV cache fits (:func:`kv_room`)."""
    return max(0, math.floor(kv_room(cfg, memory, context, dtype_bytes, utilization)))


def dynamic_batches(arrivals, max_batch, max_queue_delay, service):
    """Triton's dynamic batcher in front of one server: ``[(start, size)]``."""
    batches, free, i = [], 0.0, 0
    while i < len(arrivals):
        full = i + max_batch - 1
        close = arrivals[full] if full < len(arrivals) else math.inf
        start = max(free, min(arrivals[i] + max_queue_delay, close))
        size = 0
        while i + size < len(arrivals) and size < max_batch and arrivals[i + size] <= start:
            size += 1
        batches.append((start, size))
        free = start + service(size)
        i += size
    return batches


def schedule(running, waiting, free_blocks, block_size=16, max_num_seqs=256, watermark=0):
    """One iteration of vLLM-style continuous batching: ``("prefill", admitted)``,
    ``("decode", preempted)`` or ``("idle", 0)``."""
    admitted = 0
    for prompt in waiting:
        need = -(-prompt // block_size)
        if len(running) + admitted >= max_num_seqs or free_blocks - need < watermark:
            break
        free_blocks -= need
        admitted += 1
    if admitted:
        return "prefill", admitted
    if not running:
        return "idle", 0
    needed = sum(1 for length in running if length % block_size == 0)
    preempted = 0
    running = list(running)
    while needed > free_blocks:
        victim = running.pop()                   # the latest admitted
        free_blocks += -(-victim // block_size)
        needed -= victim % block_size == 0
        preempted += 1
    return "decode", preempted


def size_fleet(cluster, cfg, requests, ttft_slo, tpot_slo):
    """``(replicas, tp)`` with the fewest GPUs whose p99 TTFT and TPOT meet the SLOs."""
    gpus = cluster.spec.world_size
    best = None
    for tp in (1, 2, 4, 8):
        if cfg.heads % tp or tp > gpus:
            continue
        for replicas in range(1, gpus // tp + 1):
            if best and replicas * tp >= best[0] * best[1]:
                break
            try:
                dep = serving.Deployment(cluster, cfg, replicas=replicas, tp=tp,
                                         load_balancer="least_outstanding")
            except ValueError:          # the weights do not fit at this tp
                break
            res = serving.simulate(requests, dep)
            if res.percentile("ttft", 99) <= ttft_slo and res.percentile("tpot", 99) <= tpot_slo:
                best = (replicas, tp)
                break
    return best


def kpa_desired(stable, panic, ready, panicking_since, now, target):
    """Knative's KPA decision, target utilization 100 % and no rate limits:
    ``(replicas, panicking_since)`` (``serving.Autoscaler.desired`` with its limits)."""
    if panic / ready >= 2 * target:           # over the panic threshold: (re)start panic
        panicking_since = now
    elif panicking_since is not None and now >= panicking_since + 60.0:
        panicking_since = None                # a stable window without crossing it
    if panicking_since is not None:
        want = max(math.ceil(panic / target), ready)   # never scale down in panic
    else:
        want = math.ceil(stable / target)
    return max(1, want), panicking_since
