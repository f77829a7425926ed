"""One DDP training script, two launchers: a real one (torchrun, gloo on CPU) and the
simulated cluster. Both train the same model on the same data and end with the same
parameters and the same loss curve.

    torchrun --nproc_per_node=4 examples/train_ddp.py     # 4 processes, gloo
    python examples/train_ddp.py --sim                    # 4 simulated A100s, one process

``train()`` is ordinary ``torch.distributed`` code: DistributedDataParallel, a
DistributedSampler, an optimizer. Only ``main()`` differs between the launchers. Under
torchrun it initialises the gloo process group itself (torchrun supplies the rank and
world size); with ``--sim`` it hands ``train`` to ``cluster.run``, which starts the
ranks with their default group already initialised. ``--out FILE`` writes rank 0's
loss curve and final parameters as JSON (tests/test_examples.py compares the two runs).
"""

import argparse
import gc
import json

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

WORLD_SIZE = 4
SAMPLES, FEATURES, BATCH = 512, 8, 16   # 512 / 4 ranks / 16 = 8 steps per epoch
EPOCHS = 3
LR = 0.05


def make_data():
    """The same data set on every rank: a smooth target with a little noise."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, FEATURES, generator=g)
    w = torch.randn(FEATURES, 1, generator=g) / FEATURES ** 0.5
    y = torch.tanh(2 * x @ w) + 0.05 * torch.randn(SAMPLES, 1, generator=g)
    return TensorDataset(x, y)


def make_model():
    """A small MLP, initialised from a fixed seed (DDP broadcasts rank 0's copy anyway)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Linear(32, 1))


def train(epochs=EPOCHS):
    """Train with DDP; return the loss curve (mean over ranks, per step) and the final
    parameters, the same on every rank."""
    world = dist.get_world_size()
    data = make_data()
    # Each rank reads its own 1/world of every epoch, shuffled the same way on all ranks.
    sampler = DistributedSampler(data, shuffle=True, seed=0)
    loader = DataLoader(data, batch_size=BATCH, sampler=sampler)
    model = DDP(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    losses = []
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for x, y in loader:
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.backward()                      # DDP all-reduces the gradients here
            optimizer.step()
            mean_loss = loss.detach().clone()
            dist.all_reduce(mean_loss)           # the curve: the loss over all ranks' batches
            losses.append(mean_loss.item() / world)
    params = {name: p.detach().tolist() for name, p in model.module.named_parameters()}
    return {"losses": losses, "parameters": params}


def report(result, out=None):
    """Print the loss curve; write ``result`` as JSON to ``out`` if given."""
    losses = result["losses"]
    for step in range(0, len(losses), 4):
        print(f"step {step + 1:3d}  loss {losses[step]:.6f}")
    print(f"final loss {losses[-1]:.6f} after {len(losses)} steps")
    if out:
        with open(out, "w") as f:
            json.dump(result, f)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sim", action="store_true",
                        help=f"run on {WORLD_SIZE} simulated GPUs instead of under torchrun")
    parser.add_argument("--epochs", type=int, default=EPOCHS)
    parser.add_argument("--out", help="write rank 0's losses and parameters to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(1)   # one op thread per rank: ranks are processes, or threads

    if args.sim:
        import simcluster as sc

        run = sc.Cluster.preset("dgx-a100").run(train, world_size=WORLD_SIZE,
                                                args=(args.epochs,))
        report(run.results[0], args.out)
        print(f"simulated time on {WORLD_SIZE} A100s: {run.elapsed * 1e3:.3f} ms")
    else:
        dist.init_process_group("gloo")   # torchrun sets RANK, WORLD_SIZE, MASTER_ADDR, ...
        rank = dist.get_rank()
        result = train(args.epochs)
        # DDP's reducer holds the process group and its last work in reference cycles:
        # free them, and let every rank finish, before the group is torn down. Without
        # this, gloo now and then aborts a rank at exit ("terminate called without an
        # active exception"; 2 runs in 30 here, none in 32 with it).
        gc.collect()
        dist.barrier()
        dist.destroy_process_group()
        if rank == 0:
            report(result, args.out)


if __name__ == "__main__":
    main()
