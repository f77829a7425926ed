"""Each kind of allocation the lessons show is counted in the category the lessons give it:
parameters (also autocast's low-precision weight copies and FSDP2's unsharded parameters),
gradients (also DDP's buckets when the gradients are views into them), optimizer state,
activations (also those activation checkpointing recomputes in backward), communication
buffers (DDP's buckets, FSDP2's all-gather buffers) and other (temporaries)."""

import gc

import pytest
import torch
import torch.nn as nn
from torch.utils.checkpoint import checkpoint

import simcluster as sc
from simcluster import accounting
from simcluster._torch_internals import in_backward, storage_key

F32 = 4
WIDTH = 64


@pytest.fixture(scope="module")
def node():
    return sc.Cluster.preset("dgx-a100")


def _category(tensor):
    return accounting.current().memory.category_of(storage_key(tensor))


class _Probe(nn.Module):
    """Linear -> ReLU that notes the category of its hidden tensor at each run, and
    whether it ran in the backward pass (a recomputation)."""

    def __init__(self, seen):
        super().__init__()
        self.linear, self.seen = nn.Linear(WIDTH, WIDTH), seen

    def forward(self, x):
        hidden = self.linear(x)
        self.seen.append(("backward" if in_backward() else "forward", _category(hidden)))
        return torch.relu(hidden)


def _checkpointed_steps(use_reentrant):
    torch.manual_seed(0)
    seen = []
    blocks = nn.ModuleList([_Probe(seen) for _ in range(2)])
    x = torch.randn(4, WIDTH, requires_grad=True)
    for _ in range(2):
        y = x
        for block in blocks:
            y = checkpoint(block, y, use_reentrant=use_reentrant)
        y.sum().backward()
    after = torch.ones(1000)   # made outside any module, after two checkpointed steps
    return seen, _category(after)


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_recomputed_activations_are_activations(node, use_reentrant):
    seen, after = node.run(_checkpointed_steps, world_size=1,
                           args=(use_reentrant,)).results[0]
    recomputed = [category for when, category in seen if when == "backward"]
    assert len(recomputed) == 4   # 2 blocks x 2 steps
    assert set(recomputed) == {"activations"}
    forward = {category for when, category in seen if when == "forward"}
    # The reentrant checkpoint runs its first forward under no_grad: nothing is kept for
    # backward, so what it allocates is a temporary.
    assert forward == ({"other"} if use_reentrant else {"activations"})
    # A recomputation cut short (non-reentrant's early stop) leaves no module "running".
    assert after == "other"


def _optimizer_state(name):
    torch.manual_seed(0)
    model = nn.Linear(WIDTH, WIDTH)
    opt = (torch.optim.Adam(model.parameters()) if name == "adam"
           else torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9))
    model(torch.randn(4, WIDTH)).sum().backward()
    categories = {"weight": _category(model.weight), "grad": _category(model.weight.grad)}
    opt.step()
    for key, value in opt.state[model.weight].items():
        if torch.is_tensor(value) and value.numel() > 1:
            categories[key] = _category(value)
    return categories


@pytest.mark.parametrize("name, state", [("adam", ("exp_avg", "exp_avg_sq")),
                                         ("sgd", ("momentum_buffer",))])
def test_parameters_gradients_and_optimizer_state(node, name, state):
    categories = node.run(_optimizer_state, world_size=1, args=(name,)).results[0]
    assert categories == {"weight": "parameters", "grad": "gradients",
                          **dict.fromkeys(state, "optimizer state")}


def _autocast_forward():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    memory = accounting.current().memory
    before = memory.in_use["parameters"]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = model(torch.randn(4, WIDTH))
        during = memory.in_use["parameters"]
    y.float().sum().backward()
    del y
    gc.collect()
    return before, during, memory.in_use["parameters"]


def test_autocast_weight_copies_are_parameters(node):
    """autocast casts each weight to bf16 once per forward (and caches it): a second,
    half-size copy of the parameters that lives until backward has used it."""
    before, during, after = node.run(_autocast_forward, world_size=1).results[0]
    fp32 = F32 * 2 * (WIDTH * WIDTH + WIDTH)
    assert before == after == fp32
    assert during == fp32 + fp32 // 2


def _ddp_steps(as_view):
    from torch.nn.parallel import DistributedDataParallel as DDP
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH)),
                gradient_as_bucket_view=as_view)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):   # DDP rebuilds its buckets in the second step's forward
        model(torch.randn(4, WIDTH)).sum().backward()
        opt.step()
    gc.collect()
    return dict(accounting.current().memory.in_use), [_category(p.grad)
                                                      for p in model.parameters()]


@pytest.mark.parametrize("as_view", [False, True])
def test_ddp_buckets(node, as_view):
    """DDP's buckets (one flat copy of the gradients) are communication buffers; with
    gradient_as_bucket_view the gradients live in them, so they are the gradients."""
    params = F32 * 2 * (WIDTH * WIDTH + WIDTH)
    for in_use, grads in node.run(_ddp_steps, world_size=2, args=(as_view,)).results:
        assert set(grads) == {"gradients"}
        assert in_use["activations"] == 0   # no graph is alive
        assert in_use["parameters"] == params
        assert in_use["gradients"] == params
        if as_view:
            assert in_use["communication buffers"] < 1024   # the reducer's bookkeeping
        else:
            assert params <= in_use["communication buffers"] < params + 1024


def _fsdp_step():
    from torch.distributed.fsdp import fully_shard
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.ReLU(), nn.Linear(WIDTH, WIDTH))
    for layer in (model[0], model[2]):
        fully_shard(layer)
    fully_shard(model)
    seen = []
    model[2].register_forward_pre_hook(   # runs after FSDP2's, which unshards
        lambda m, args: seen.append((_category(m.weight), dict(
            accounting.current().memory.in_use))))
    model(torch.randn(4, WIDTH)).sum().backward()
    shards = {_category(p.grad.to_local()) for p in model.parameters()}
    return seen, accounting.current().memory.category_peaks, shards


def test_fsdp2_unsharded_parameters_and_all_gather_buffers(node):
    """In forward a layer computes with its unsharded parameters ("parameters"); the
    all-gather that rebuilt them used communication buffers, in forward and in backward
    (where FSDP2 gathers each layer's parameters again), and so did the reduce-scatter:
    only the gradients themselves, unsharded and then sharded, are "gradients"."""
    layer = F32 * (WIDTH * WIDTH + WIDTH)
    for seen, peaks, shards in node.run(_fsdp_step, world_size=2).results:
        assert shards == {"gradients"}
        [(weight, in_use)] = seen
        assert weight == "parameters"
        assert in_use["parameters"] >= layer   # the unsharded layer, plus shards
        assert in_use["communication buffers"] >= layer
        assert in_use["gradients"] == 0
        # backward: one layer's unsharded gradients, a few activation gradients and the
        # shards; not the all-gathered weights nor the reduce-scatter's flat buffers
        assert peaks["gradients"] < 2 * layer


def _grad_scaler_state():
    scaler = torch.amp.GradScaler("cpu")
    model = nn.Linear(WIDTH, WIDTH)
    scaler.scale(model(torch.randn(4, WIDTH)).sum()).backward()
    return _category(scaler._scale), _category(scaler._growth_tracker)


def test_grad_scaler_state_is_optimizer_state(node):
    """The loss scale and its growth tracker live as long as the optimizer's state."""
    assert node.run(_grad_scaler_state, world_size=1).results[0] == ("optimizer state",) * 2


def _gradient_peaks(checkpointed):
    """One backward of 4 Linear+ReLU blocks of width 512 over 256 rows: the most the
    "gradients" category held, and the parameter gradients' own bytes."""
    torch.manual_seed(0)
    blocks = nn.ModuleList([nn.Sequential(nn.Linear(512, 512), nn.ReLU()) for _ in range(4)])
    y = torch.randn(256, 512)
    for block in blocks:
        y = checkpoint(block, y, use_reentrant=False) if checkpointed else block(y)
    y.sum().backward()
    memory = accounting.current().memory
    grads = [p.grad for p in blocks.parameters()]
    return (memory.category_peaks["gradients"], sum(g.numel() * F32 for g in grads),
            {memory.category_of(storage_key(g)) for g in grads})


@pytest.mark.parametrize("checkpointed", [False, True])
def test_gradients_are_parameter_gradients_only(node, checkpointed):
    """Activations' gradients (and, with checkpointing, what the recomputation allocates)
    are not "gradients": that category never holds more than the parameter gradients.
    Before the fix every allocation in backward was a "gradient"."""
    peak, param_grads, categories = node.run(_gradient_peaks, world_size=1,
                                             args=(checkpointed,)).results[0]
    assert categories == {"gradients"}
    assert peak == param_grads
