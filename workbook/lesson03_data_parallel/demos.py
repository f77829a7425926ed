"""Data parallelism with torch's own DDP, measured: what lesson 03 imports.

The lab asks you to write gradient averaging, bucketing, overlap, accumulation and the
trainer of an article about an 11-node GPU platform yourself, so none of them is here. What is here are the models
the lesson measures and the code that times them on the simulated cluster:

* models: :func:`mlp`, a stack of equal ``Linear`` layers (many same-sized gradients);
  :func:`resnet50`, ResNet-50 written out (He et al. 2016: 25.6 M parameters, 4.1 G
  multiply-adds per 224×224 image), for fake-tensor runs at real size;
  :func:`resnet50_equivalent`, a cheaper stand-in with ResNet-50's parameters and FLOPs;
  :class:`BertLike`, BERT-base's shape;
* :func:`ddp_steps`, the function every rank runs: build the model, wrap it in
  :class:`~torch.nn.parallel.DistributedDataParallel`, train a few steps, then time one;
  :func:`measure` runs it on a cluster and returns a :class:`StepReport`: simulated step
  time, compute, communication, how much of it was hidden behind backward, the
  collectives of the timed step, and peak memory;
* :func:`accumulation_memory`, peak memory of one BERT-base step with gradient
  accumulation, and :func:`large_batch_loss`, the learning-rate scaling experiment.

How a step is timed: after the warm-up steps every rank calls ``dist.barrier()``, so all
ranks start the timed step together; the step runs from the end of that barrier to the
end of the run. The warm-up matters for DDP: its first step puts every gradient in one
bucket, and at the start of the second step it rebuilds the buckets (``bucket_cap_mb``,
in the order the gradients arrived), broadcasting the new layout. With ``warmup=2`` the
timed step is a steady-state one.
"""

import contextlib
import functools
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc
from workbook.models import mlp

# ------------------------------------------------------------------------- models


class Bottleneck(nn.Module):
    """ResNet's bottleneck block: 1×1 down to ``width``, 3×3, 1×1 up to ``4 * width``,
    plus the shortcut (a strided 1×1 convolution when the shape changes)."""

    def __init__(self, in_channels, width, stride):
        super().__init__()
        out = 4 * width
        self.body = nn.Sequential(
            nn.Conv2d(in_channels, width, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, width, 3, stride, 1, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
            nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out))
        self.shortcut = (nn.Identity() if stride == 1 and in_channels == out else
                         nn.Sequential(nn.Conv2d(in_channels, out, 1, stride, bias=False),
                                       nn.BatchNorm2d(out)))

    def forward(self, x):
        return torch.relu(self.body(x) + self.shortcut(x))


def resnet50(num_classes=1000):
    """ResNet-50 (He et al. 2016, torchvision's layout): 25,557,032 parameters.

    Stages of 3, 4, 6 and 3 bottleneck blocks; one 224×224 image costs 4.1 G
    multiply-adds forward (8.2 GFLOP as torch's FLOP counter counts them).
    """
    layers = [nn.Conv2d(3, 64, 7, 2, 3, bias=False), nn.BatchNorm2d(64), nn.ReLU(),
              nn.MaxPool2d(3, 2, 1)]
    channels = 64
    for blocks, width, stride in ((3, 64, 1), (4, 128, 2), (6, 256, 2), (3, 512, 2)):
        for i in range(blocks):
            layers.append(Bottleneck(channels, width, stride if i == 0 else 1))
            channels = 4 * width
    layers += [nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(channels, num_classes)]
    return nn.Sequential(*layers)


def resnet50_equivalent(width=2528, depth=4):
    """A stand-in for ResNet-50 that costs the same and runs ten times fewer ops.

    ``depth`` ``Linear(width, width)`` layers (25.6 M parameters, as ResNet-50) applied
    at each of 160 places of a sample (input shape :data:`RESNET50_EQUIVALENT_INPUT`): one
    sample costs ``2 × 25.6 M × 160 = 8.2`` GFLOP forward, as one 224×224 image does in
    ResNet-50. Gradient bytes and FLOPs match; the layer shapes do not (ResNet's early
    layers are small), which moves when the first bucket is ready, not how much is sent.
    """
    return mlp(width, depth)


RESNET50_INPUT = (3, 224, 224)                   # one image
RESNET50_EQUIVALENT_INPUT = (160, 2528)          # 160 positions × 2528 features
MODELS = {"mlp": mlp, "resnet50": resnet50, "resnet50_equivalent": resnet50_equivalent}

# ------------------------------------------------------------------ one timed step


def ddp_steps(model="mlp", input_shape=(256,), batch=32, warmup=1, micro_batches=1,
              use_no_sync=True, fake=False, barrier_every_step=False, model_kwargs=None,
              ddp_kwargs=None, full_warmup=True):
    """On every rank: train ``model`` under DDP for ``warmup`` steps, then one timed step.

    Args:
        model: a name in :data:`MODELS`.
        input_shape: one sample's shape; ``batch`` samples per rank per micro-batch.
        warmup: steps before the timed one (DDP has one bucket in step 1 and rebuilds
            its buckets at the start of step 2: ``warmup=2`` times a steady step).
        micro_batches: micro-batches per optimizer step of the timed step (gradient
            accumulation; the loss is not divided by their number: this times steps, it
            doesn't train). Warm-up steps run one micro-batch: they only have to set up
            DDP's buckets.
        use_no_sync: run all micro-batches but the last under ``model.no_sync()``;
            False all-reduces after every micro-batch.
        fake: build and train under :func:`simcluster.fake_tensors` (shapes, no data).
        barrier_every_step: call ``dist.barrier()`` after every optimizer step.
        model_kwargs: passed to the model's builder.
        ddp_kwargs: passed to ``DistributedDataParallel`` (``bucket_cap_mb``, ...).
        full_warmup: run every warm-up step in full (forward, backward, optimizer step).
            False runs only what the timed step depends on: the first warm-up step's
            forward and backward (DDP records the order in which the gradients arrive),
            and the forward of the others (the first of them rebuilds the buckets). Their
            optimizer steps change only the weights' values, and SGD without momentum
            keeps no state: the timed step is the same, and quicker to simulate.

    Peak memory is measured from the start of the timed step: read it with
    ``run.peak_memory(rank)`` afterwards.
    """
    generator = torch.Generator().manual_seed(dist.get_rank())
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        net = DDP(MODELS[model](**(model_kwargs or {})), **(ddp_kwargs or {}))
        optimizer = torch.optim.SGD(net.parameters(), lr=0.01)

        def loss():
            x = torch.randn(batch, *input_shape, generator=None if fake else generator)
            return net(x).square().mean()

        def step(micro_batches):
            optimizer.zero_grad(set_to_none=False)
            for i in range(micro_batches):
                sync = i == micro_batches - 1 or not use_no_sync
                with contextlib.nullcontext() if sync else net.no_sync():
                    loss().backward()
            optimizer.step()
            if barrier_every_step:
                dist.barrier()

        # the warm-up only has to let DDP build and rebuild its buckets, which one
        # synchronised backward per step does: accumulating there would be wasted work
        has_buffers = any(True for _ in net.buffers())
        for i in range(warmup):
            if full_warmup:
                step(1)
            elif i == 0 or has_buffers:
                # a synchronised backward: DDP records the order the gradients arrive in
                # (a model with buffers also keeps DDP's broadcast of them in step)
                loss().backward()
            else:
                # DDP rebuilds its buckets in this forward; under no_sync() it expects no
                # backward after it (a synchronised forward would leave one pending)
                with net.no_sync():
                    loss()
        dist.barrier()                       # the timed step starts when this one ends
        sc.reset_peak_memory()
        step(micro_batches)


@dataclass
class StepReport:
    """One timed DDP step on rank 0, in simulated seconds.

    Attributes:
        time: the step, from the end of the barrier before it to the end of the run.
        compute: time the compute stream computed (forward, backward, optimizer).
        comm: time the communication stream was busy (DDP's all-reduces, ...).
        exposed: time the compute stream waited for communication (``time - compute``).
        hidden: communication that ran while compute ran (``comm - exposed``, ≥ 0).
        collectives: the :class:`~simcluster.CollectiveRecord` list of the timed step.
        peak: rank 0's peak memory in the timed step, ``{category: bytes}`` and
            ``"total"``.
    """

    time: float
    compute: float
    comm: float
    exposed: float
    hidden: float
    collectives: list
    peak: dict

    @property
    def all_reduces(self):
        """The all-reduces of the timed step (DDP's buckets)."""
        return [c for c in self.collectives if c.op == "all_reduce"]


def measure(cluster, world_size, **kwargs):
    """Run :func:`ddp_steps` (``kwargs``) on ``world_size`` ranks; return the
    :class:`StepReport` of its timed step, and the :class:`~simcluster.Run`.

    DDP is built with ``init_sync=False`` unless ``ddp_kwargs`` says otherwise: every rank
    builds the same model (a fixed seed, or fake tensors), so the broadcast of rank 0's
    parameters at construction changes nothing in the timed step, and it costs the
    simulation a copy of the model per rank (a quarter of a 64-rank run on fake tensors).
    For the same reason the warm-up runs only what the timed step depends on
    (``full_warmup=False`` unless passed: over a quarter fewer ops per rank); the timed
    step's time, collectives and peak are the same.
    """
    kwargs = {"full_warmup": False, **kwargs,
              "ddp_kwargs": {"init_sync": False, **(kwargs.get("ddp_kwargs") or {})}}
    run = cluster.run(ddp_steps, world_size=world_size, kwargs=kwargs)
    barriers = [c for c in run.collectives if c.op == "barrier"]
    # the timed step starts after the barrier before it; with a barrier in every step,
    # the last one belongs to the timed step itself
    start = barriers[-2 if kwargs.get("barrier_every_step") else -1].end
    end = run.elapsed
    events = [e for e in run.clock(0).events if e.end > start]
    compute = sum(e.end - max(e.start, start) for e in events if e.lane == "compute")
    comm = sum(e.end - max(e.start, start) for e in events if e.lane == "comm")
    exposed = (end - start) - compute
    report = StepReport(time=end - start, compute=compute, comm=comm, exposed=exposed,
                        hidden=max(0.0, comm - exposed),
                        collectives=[c for c in run.collectives if c.start >= start],
                        peak=run.peak_memory(0))
    return report, run


# ------------------------------------------------------- memory of accumulation


class BertLike(nn.Module):
    """A BERT-base-sized encoder (Devlin et al. 2019: 12 layers, hidden 768, 12 heads,
    feed-forward 3072, 30,522-token vocabulary; about 110 M parameters) with a
    masked-language-model head tied to the embedding."""

    def __init__(self, layers=12, hidden=768, heads=12, vocab=30522, max_len=512):
        super().__init__()
        self.tokens = nn.Embedding(vocab, hidden)
        self.positions = nn.Embedding(max_len, hidden)
        # separate layers, not nn.TransformerEncoder's deep copies of one (copying a fake
        # tensor reads its missing data)
        self.layers = nn.ModuleList(
            nn.TransformerEncoderLayer(hidden, heads, 4 * hidden, batch_first=True,
                                       activation="gelu") for _ in range(layers))

    def forward(self, ids):
        positions = torch.arange(ids.shape[1], device=ids.device)
        h = self.tokens(ids) + self.positions(positions)
        for layer in self.layers:
            h = layer(h)
        return h @ self.tokens.weight.T    # logits over the vocabulary


def accumulation_memory(batch=32, seq_len=512, micro_batches=1):
    """On one rank, with fake tensors: one Adam step of :class:`BertLike` on ``batch``
    sequences of ``seq_len`` tokens, cut into ``micro_batches`` micro-batches whose
    gradients are accumulated. The peak memory of that step (the optimizer state exists
    from a first step before it) is ``run.peak_memory(0)`` afterwards."""
    with sc.fake_tensors():
        model = BertLike()
        optimizer = torch.optim.Adam(model.parameters())
        for step in range(2):   # the first step creates Adam's state; measure the second
            sc.reset_peak_memory()
            optimizer.zero_grad(set_to_none=False)
            # the first step only creates the state and the gradients: one micro-batch does
            for _ in range(micro_batches if step else 1):
                ids = torch.randint(0, 30522, (batch // micro_batches, seq_len))
                logits = model(ids)
                nn.functional.cross_entropy(logits.flatten(0, 1), ids.flatten()).backward()
                del logits
            optimizer.step()


# ------------------------------------------------------------ learning rate vs batch


def large_batch_loss(scale, scaled_lr, base_lr=0.005, base_batch=32, epochs=4,
                     samples=8192):
    """Train a small regression model with SGD (momentum 0.9) for ``epochs`` epochs at a
    global batch of ``scale × base_batch``; return the final training loss.

    The learning rate is ``base_lr × scale`` if ``scaled_lr`` (the linear scaling rule),
    else ``base_lr``. One process on the whole global batch: section 1 of lesson 03
    shows that this is what DDP on ``scale`` ranks of ``base_batch`` computes. The data
    (a random teacher network plus noise) and the initial weights are the same for
    every call, so a learning rate and batch already trained are not trained again
    (``scale=1`` is the same run with and without ``scaled_lr``).
    """
    lr = base_lr * scale if scaled_lr else base_lr
    return _final_loss(lr, scale * base_batch, epochs, samples)


@functools.lru_cache(maxsize=None)
def _final_loss(lr, batch, epochs, samples):
    """:func:`large_batch_loss` at learning rate ``lr`` and global batch ``batch``."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(samples, 32, generator=g)
    torch.manual_seed(0)
    teacher = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 1))
    with torch.no_grad():
        y = teacher(x) + 0.1 * torch.randn(samples, 1, generator=g)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(32, 128), nn.Tanh(), nn.Linear(128, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    order = torch.randperm(samples, generator=g)
    for step in range(epochs * samples // batch):
        rows = order[(step * batch) % samples:][:batch]
        optimizer.zero_grad()
        nn.functional.mse_loss(model(x[rows]), y[rows]).backward()
        optimizer.step()
    with torch.no_grad():
        return nn.functional.mse_loss(model(x), y).item()
