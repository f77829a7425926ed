"""ZeRO and FSDP2 with torch's own APIs, measured: what lesson 07 imports.

The lab asks you to write ZeRO-1, ZeRO-2 and ZeRO-3 yourself, so none of them is here.
What is here is what the lesson measures with torch's APIs on the simulated cluster:

* :class:`MixedPrecisionAdam`: Adam with fp32 master weights for a bf16 model, the
  optimizer whose memory Rajbhandari et al. (2020) count: 2 bytes of parameter and 2 of
  gradient per parameter on the model, K = 12 bytes (master copy, momentum, variance) in
  the optimizer. It is plain mixed-precision Adam, not sharded.
* :func:`zero_step`, what every rank runs: a few training steps of a stack of bf16 linear
  layers in one of the four ZeRO stages as torch spells them (:data:`STAGES`): DDP; DDP with
  ``ZeroRedundancyOptimizer``; FSDP2 ``fully_shard`` keeping parameters gathered from the
  forward to the backward (``reshard_after_forward=False``); FSDP2 resharding after the
  forward. Options add FSDP2's ``MixedPrecisionPolicy`` and ``CPUOffloadPolicy``.
  :func:`measure_stage` runs it and returns a :class:`StageReport`: memory by category,
  collectives and bytes sent per step, time per step.
* the published formulas (docs/reference-numbers.md, "ZeRO"): :func:`model_state_bytes`;
  and :func:`zero3_vs_tp_step`, the cost model's comparison of ZeRO-3 with tensor and
  pipeline parallelism (Narayanan et al. 2021, Table 2).
"""

import contextlib
from collections import Counter
from dataclasses import dataclass

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc
from simcluster.costmodel import CostModel
from simcluster.spec import preset
from workbook.formulas import K, model_state_bytes  # noqa: F401 (shared with lesson 13's drills)
from workbook.models import MixedPrecisionAdam

GB = 1e9          # the ZeRO paper's gigabytes are 10⁹ bytes

#: How torch spells each ZeRO stage (what :func:`zero_step` builds).
STAGES = {0: "DDP + Adam",
          1: "DDP + ZeroRedundancyOptimizer",
          2: "fully_shard(reshard_after_forward=False)",
          3: "fully_shard(reshard_after_forward=True)"}

# ------------------------------------------------------------------ the optimizer


# ------------------------------------------------------------- one stage, measured


def make_model(layers, width, dtype=torch.bfloat16, seed=0):
    """``layers`` equal ``Linear(width, width)`` layers without bias, ReLU between them."""
    torch.manual_seed(seed)
    blocks = []
    for i in range(layers):
        blocks.append(nn.Linear(width, width, bias=False, dtype=dtype))
        if i < layers - 1:
            blocks.append(nn.ReLU())
    return nn.Sequential(*blocks)


def zero_step(stage, layers=8, width=64, batch=4, steps=2, fake=False, mixed=False,
              offload=False, prefetch=False):
    """What every rank runs: ``steps`` training steps of :func:`make_model` in ZeRO
    ``stage`` (0-3, as :data:`STAGES` spells it), with :class:`MixedPrecisionAdam`.

    ``mixed`` keeps the model in fp32 and lets FSDP2 compute in bf16
    (``MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32)``) with torch's own Adam:
    the fp32 parameters are then the master weights. ``offload`` adds FSDP2's
    ``CPUOffloadPolicy()``, ``prefetch`` FSDP2's explicit prefetching (each layer's
    forward issues the next layer's all-gather, each backward the previous one's). All
    three only for stages 2 and 3. Each rank reads its own batch.

    Barriers mark the start of the last step and its end (after the optimizer step), so
    that its collectives can be told apart in ``run.collectives``; the peak is reset at
    its start. Returns ``{"state": device memory by category after the last optimizer
    step, before zero_grad; "host": the same for host memory; "params": rank's local
    parameters (real tensors only)}``.
    """
    if (mixed or offload or prefetch) and stage < 2:
        raise ValueError("mixed, offload and prefetch are FSDP2's: use stage 2 or 3")
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))   # before fake mode
    with sc.fake_tensors() if fake else contextlib.nullcontext():
        model = make_model(layers, width, torch.float32 if mixed else torch.bfloat16)
        if stage <= 1:
            model = DDP(model)
            params = model.parameters()
            optimizer = (MixedPrecisionAdam(params) if stage == 0 else
                         ZeroRedundancyOptimizer(params, optimizer_class=MixedPrecisionAdam))
        else:
            policy = {"mesh": mesh, "reshard_after_forward": stage == 3}
            if mixed:
                policy["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                           reduce_dtype=torch.float32)
            if offload:
                policy["offload_policy"] = CPUOffloadPolicy()
            linears = [layer for layer in model if isinstance(layer, nn.Linear)]
            for layer in linears:
                fully_shard(layer, **policy)
            fully_shard(model, **policy)
            if prefetch:
                for before, after in zip(linears, linears[1:]):
                    before.set_modules_to_forward_prefetch([after])
                    after.set_modules_to_backward_prefetch([before])
            optimizer = (torch.optim.Adam if mixed else MixedPrecisionAdam)(model.parameters())
        g = torch.Generator().manual_seed(1 + dist.get_rank())
        for step in range(steps):
            x = torch.randn(batch, width, generator=g, dtype=torch.bfloat16)
            if step == steps - 1:
                dist.barrier()                 # the measured step starts here
                sc.reset_peak_memory()
            model(x.float() if mixed else x).float().square().mean().backward()
            optimizer.step()
            state, host = sc.memory_in_use(), sc.host_memory_in_use()
            optimizer.zero_grad()
        dist.barrier()                         # ... and ends here
        local = None if fake else [(p.to_local() if hasattr(p, "to_local") else p).detach().clone()
                                   for p in model.parameters()]
    return {"state": state, "host": host, "params": local}


@dataclass
class StageReport:
    """The last training step of :func:`zero_step`, seen from rank 0.

    Attributes:
        stage, n, psi: the ZeRO stage, the number of ranks, the number of parameters.
        state: device bytes by category after the optimizer step (what persists).
        host: host (pinned) bytes by category after the optimizer step.
        peak: device bytes by category at the step's peak, and ``"total"``.
        param_peak: the most bytes of parameters rank 0 held at any moment of the step
            (gathered layers included).
        ops: ``Counter`` of the collectives of the step, e.g. ``{"all_gather": 16}``.
        bytes_sent: bytes rank 0 sent in the step, as the cost model's algorithms move
            them (a ring all-reduce of n bytes sends 2(N−1)/N·n from every rank).
        host_transfers: bytes rank 0 copied over its PCIe link in the whole run.
        seconds: simulated seconds of the step.
        results: what :func:`zero_step` returned on every rank.
    """

    stage: int
    n: int
    psi: int
    state: dict
    host: dict
    peak: dict
    param_peak: int
    ops: Counter
    bytes_sent: float
    host_transfers: dict
    seconds: float
    results: list

    def per_parameter(self, counts):
        """``{category: bytes per parameter}`` of ``counts`` (a dict of bytes)."""
        return {k: v / self.psi for k, v in counts.items() if v}


def measure_stage(cluster, stage, n, **kwargs):
    """Run :func:`zero_step` (``stage``, ``kwargs``) on ``n`` ranks of ``cluster``; return
    its :class:`StageReport` and the :class:`~simcluster.Run`."""
    run = cluster.run(zero_step, world_size=n, args=(stage,), kwargs=kwargs)
    start, end = (c.end for c in [c for c in run.collectives if c.op == "barrier"][-2:])
    step = [c for c in run.collectives if c.op != "barrier" and start <= c.start < end]
    cost = run.recorder.cost
    sent = sum(nbytes for c in step
               for src, _, nbytes in cost.traffic(c.op, c.algorithm, list(c.ranks), c.nbytes)
               if src == 0)
    layers, width = kwargs.get("layers", 8), kwargs.get("width", 64)
    report = StageReport(
        stage=stage, n=n, psi=layers * width * width, state=run.results[0]["state"],
        host=run.results[0]["host"], peak=run.peak_memory(0),
        param_peak=run.category_peaks(0)["parameters"],
        ops=Counter(c.op.replace("_into_tensor", "").replace("_tensor", "") for c in step),
        bytes_sent=sent, host_transfers=run.host_transfers[0], seconds=end - start,
        results=run.results)
    return report, run


# ------------------------------------------------------------------- the formulas


def zero3_vs_tp_step(gpus, psi=174.6e9, layers=96, hidden=12288, seq=2048, batch=1536,
                     tp=8, pp=12, device_flops=312e12, efficiency=0.5):
    """Seconds per training step of a GPT model on ``gpus`` A100s (DGX nodes of 8) for
    ZeRO-3 and for tensor + pipeline parallelism (PTD-P), by the simulator's cost model.

    Both do the same compute per GPU: 8·Ψ·tokens/gpus FLOPs (forward, backward and the
    recomputation of the forward), at ``efficiency`` of the GPU's peak. They differ in what
    they send, and where:

    * ZeRO-3, every GPU data-parallel, its batch/gpus sequences in one micro-batch:
      all-gather the bf16 parameters for the forward and again for the backward,
      reduce-scatter the gradients: 3 collectives of 2Ψ bytes over all GPUs, across
      nodes, every step. ``"zero3"`` overlaps them with compute perfectly (the step
      takes the longer of the two), ``"zero3_exposed"`` not at all (their sum).
    * PTD-P, t = ``tp`` inside a node, p = ``pp`` stages, d = gpus/(t·p) data-parallel:
      per micro-batch (one sequence) 4 all-reduces of s·h bf16 values per layer inside
      the node, on the critical path; the pipeline bubble (p−1)/m; the gradient
      all-reduce over d GPUs overlaps the backward and is not counted.

    Returns seconds: ``{"zero3", "zero3_exposed", "ptdp", "compute", "zero3_comm"}``.
    """
    cost = CostModel(preset("dgx-a100", gpus // 8))
    everyone = list(range(gpus))
    compute = 8 * psi * batch * seq / gpus / (device_flops * efficiency)
    zero3_comm = (2 * cost.collective_time("all_gather", everyone, 2 * psi).seconds
                  + cost.collective_time("reduce_scatter", everyone, 2 * psi).seconds)
    d = gpus // (tp * pp)
    m = batch / d                                    # micro-batches of one sequence
    layer_allreduce = cost.collective_time("all_reduce", list(range(tp)),
                                           2 * seq * hidden).seconds
    ptdp = compute * (1 + (pp - 1) / m) + m * (layers / pp) * 4 * layer_allreduce
    return {"zero3": max(compute, zero3_comm), "zero3_exposed": compute + zero3_comm,
            "ptdp": ptdp, "compute": compute, "zero3_comm": zero3_comm}
