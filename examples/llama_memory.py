"""Does LLaMA-7B train on 8 x A100-80GB?  DDP: no.  FSDP2: yes — measured, not computed.

The model is built on the meta device, sharded (FSDP2) or not (DDP), and then given
*fake* storage: tensors with shapes but no data (``sc.fake_tensors()``). The real
DistributedDataParallel, fully_shard and Adam then run one training step, and the
simulator counts every byte each rank would hold, by category.

    python examples/llama_memory.py            # the full 7B model: under a minute on 2 cores
"""

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.nn.parallel import DistributedDataParallel as DDP

import simcluster as sc


class Block(nn.Module):
    """One LLaMA layer: RMSNorm, attention projections, RMSNorm, SwiGLU MLP."""

    def __init__(self, hidden, intermediate, heads):
        super().__init__()
        self.heads = heads
        self.attn_norm, self.mlp_norm = nn.RMSNorm(hidden), nn.RMSNorm(hidden)
        self.q, self.k, self.v, self.o = (nn.Linear(hidden, hidden, bias=False)
                                          for _ in range(4))
        self.gate = nn.Linear(hidden, intermediate, bias=False)
        self.up = nn.Linear(hidden, intermediate, bias=False)
        self.down = nn.Linear(intermediate, hidden, bias=False)

    def forward(self, x):
        b, s, h = x.shape
        y = self.attn_norm(x)
        q, k, v = (p(y).view(b, s, self.heads, -1).transpose(1, 2)
                   for p in (self.q, self.k, self.v))
        attn = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.o(attn.transpose(1, 2).reshape(b, s, h))
        y = self.mlp_norm(x)
        return x + self.down(F.silu(self.gate(y)) * self.up(y))


class Llama(nn.Module):
    """LLaMA-7B's shape by default: 32 layers, hidden 4096, 32 heads, vocabulary 32000."""

    def __init__(self, layers=32, hidden=4096, intermediate=11008, heads=32, vocab=32000):
        super().__init__()
        self.embed = nn.Embedding(vocab, hidden)
        self.layers = nn.ModuleList(Block(hidden, intermediate, heads) for _ in range(layers))
        self.norm = nn.RMSNorm(hidden)
        self.head = nn.Linear(hidden, vocab, bias=False)

    def forward(self, tokens):
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        return self.head(self.norm(x))


def parameter_count(layers=32):
    """How many parameters the model has (counted on the meta device: nothing allocated)."""
    with torch.device("meta"):
        return sum(p.numel() for p in Llama(layers).parameters())


def train_step(parallelism, layers=32, batch=1, seq=128):
    """One Adam step of LLaMA on fake tensors; ``parallelism`` is "ddp" or "fsdp".

    Returns the rank's memory in use by category after the step.
    """
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))  # before fake mode
    with torch.device("meta"):
        model = Llama(layers)
    if parallelism == "fsdp":  # shard while still on the meta device: quicker than fake
        for layer in model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(model, mesh=mesh)
    with sc.fake_tensors():
        if parallelism == "fsdp":
            model.to_empty(device="cpu")  # allocates only this rank's shards
        else:
            model.to_empty(device="cpu")
            model = DDP(model, init_sync=False)
        optimizer = torch.optim.Adam(model.parameters())
        # The meta-device model counted until it was sharded; measure the step alone.
        sc.reset_peak_memory()
        tokens = torch.zeros(batch, seq, dtype=torch.long)
        model(tokens).float().logsumexp(-1).mean().backward()
        optimizer.step()
        return sc.memory_in_use()


def main(layers=32, cluster=None):
    """Print each parallelism's fate and per-category peak memory on rank 0."""
    cluster = cluster or sc.Cluster.preset("dgx-a100")
    params = parameter_count(layers)
    print(f"LLaMA with {layers} layers: {params / 1e9:.2f} B parameters, "
          f"on {cluster.world_size} x {cluster.spec.nodes[0].device.name}")
    outcomes = {}
    for parallelism in ("ddp", "fsdp"):
        try:
            run = cluster.run(train_step, args=(parallelism, layers))
        except sc.OutOfMemoryError as error:
            outcomes[parallelism] = error
            print(f"{parallelism}: out of memory\n  {error}")
            continue
        outcomes[parallelism] = run
        for what, memory in (("peak during the step", run.peak_memory(0)), ("after the step", run.results[0])):
            shown = ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in memory.items() if v)
            print(f"{parallelism}: {what} on rank 0: {shown}")
    return outcomes


if __name__ == "__main__":
    main()
