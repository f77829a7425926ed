"""Reference answers of lab 03 (data parallelism); the checks import them while they run.

Not imported by the lab or the lesson: the lab asks the learner to write these.
"""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc


def average_gradients(model):
    """After ``backward()``: every gradient becomes its mean over the ranks."""
    p = dist.get_world_size()
    for param in model.parameters():
        if param.grad is not None:
            dist.all_reduce(param.grad)
            param.grad /= p


def bucket_parameters(params, bucket_cap_bytes):
    """DDP's buckets: parameters in reverse order, a bucket closed once it holds at least
    ``bucket_cap_bytes``."""
    buckets, current, size = [], [], 0
    for param in reversed(list(params)):
        current.append(param)
        size += param.numel() * param.element_size()
        if size >= bucket_cap_bytes:
            buckets.append(current)
            current, size = [], 0
    if current:
        buckets.append(current)
    return buckets


def _reduce_bucket(bucket, flat, p):
    """Copy the all-reduced ``flat`` back into the bucket's gradients, divided by ``p``."""
    flat /= p
    offset = 0
    for param in bucket:
        n = param.numel()
        param.grad.copy_(flat[offset:offset + n].view_as(param.grad))
        offset += n


def allreduce_in_buckets(model, bucket_cap_bytes):
    """After ``backward()``: one all-reduce per bucket of flattened gradients."""
    p = dist.get_world_size()
    for bucket in bucket_parameters(model.parameters(), bucket_cap_bytes):
        flat = torch.cat([param.grad.reshape(-1) for param in bucket])
        dist.all_reduce(flat)
        _reduce_bucket(bucket, flat, p)


class OverlappedDDP:
    """Launches each bucket's all-reduce from gradient hooks during backward;
    :meth:`finish` waits for them before the optimizer step."""

    def __init__(self, model, bucket_cap_bytes):
        self.model = model
        self.buckets = bucket_parameters(model.parameters(), bucket_cap_bytes)
        self.bucket_of = {param: i for i, bucket in enumerate(self.buckets)
                          for param in bucket}
        self.ready = [0] * len(self.buckets)
        self.pending = []
        for param in model.parameters():
            param.register_post_accumulate_grad_hook(self._grad_ready)

    def _grad_ready(self, param):
        i = self.bucket_of[param]
        self.ready[i] += 1
        if self.ready[i] == len(self.buckets[i]):
            flat = torch.cat([q.grad.reshape(-1) for q in self.buckets[i]])
            self.pending.append((i, flat, dist.all_reduce(flat, async_op=True)))

    def finish(self):
        """Wait for every bucket's all-reduce and write the averaged gradients back."""
        p = dist.get_world_size()
        for i, flat, work in self.pending:
            work.wait()
            _reduce_bucket(self.buckets[i], flat, p)
        self.pending, self.ready = [], [0] * len(self.buckets)


def train_with_accumulation(ddp_model, optimizer, micro_batches, loss_fn):
    """One optimizer step over ``micro_batches`` (a list of ``(x, y)``): the gradients
    accumulate under ``no_sync()``, and only the last backward all-reduces them."""
    k = len(micro_batches)
    with ddp_model.no_sync():   # forward and backward: DDP decides in forward
        for x, y in micro_batches[:-1]:
            (loss_fn(ddp_model(x), y) / k).backward()
    x, y = micro_batches[-1]
    (loss_fn(ddp_model(x), y) / k).backward()
    optimizer.step()
    optimizer.zero_grad()


class DistributedTrainer:
    """The GPU platform article's trainer on torch DDP; ``batch_size`` is per GPU."""

    def __init__(self, nodes, gpus_per_node, batch_size, gradient_accumulation=1,
                 communication="nccl"):
        self.nodes, self.gpus_per_node = nodes, gpus_per_node
        self.batch_size, self.gradient_accumulation = batch_size, gradient_accumulation
        self.communication = communication
        self.world_size = nodes * gpus_per_node
        self.global_batch = batch_size * self.world_size * gradient_accumulation
        self.cluster = sc.Cluster(sc.ClusterSpec(
            f"{nodes}x{gpus_per_node}",
            tuple(sc.NodeSpec(f"node{i}", gpus_per_node) for i in range(nodes))))

    def train(self, make_model, inputs, targets, loss_fn, lr, steps):
        """On every rank: DDP, SGD, ``steps`` optimizer steps; returns the parameters."""
        rank, b, k = dist.get_rank(), self.batch_size, self.gradient_accumulation
        model = DDP(make_model())
        optimizer = torch.optim.SGD(model.parameters(), lr=lr)
        for step in range(steps):
            start = step * self.global_batch + rank * b * k
            micro = [(inputs[start + i * b:start + (i + 1) * b],
                      targets[start + i * b:start + (i + 1) * b]) for i in range(k)]
            train_with_accumulation(model, optimizer, micro, loss_fn)
        return [param.detach().clone() for param in model.parameters()]

    def fit(self, make_model, inputs, targets, loss_fn, lr, steps):
        """Train on the simulated cluster; returns the :class:`~simcluster.Run`."""
        return self.cluster.run(self.train, args=(make_model, inputs, targets, loss_fn,
                                                  lr, steps))
