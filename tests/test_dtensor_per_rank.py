"""DTensor's process-wide toggles act per rank, as they would in separate processes.

``loss_parallel()`` adds cross-entropy handlers to a table every thread shares and
removes them on exit; without per-rank state the first rank to leave took them away
from the others (``nll_loss_backward got mixed torch.Tensor and DTensor``, or a
``KeyError`` when the second rank removed them again).
"""

import pytest
import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Replicate, Shard, distribute_tensor
from torch.distributed.tensor.experimental import implicit_replication
from torch.distributed.tensor.parallel import (ColwiseParallel, loss_parallel,
                                               parallelize_module)

import simcluster as sc

HIDDEN, VOCAB, BATCH, SEQ = 16, 32, 3, 5


def _lm_head_and_data():
    torch.manual_seed(0)
    head = nn.Linear(HIDDEN, VOCAB, bias=False)
    hidden = torch.randn(BATCH, SEQ, HIDDEN)
    target = torch.randint(VOCAB, (BATCH, SEQ))
    return head, hidden, target


def _vocab_parallel_cross_entropy():
    """The LM head column-parallel over the vocabulary, the loss with loss_parallel()."""
    head, hidden, target = _lm_head_and_data()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(head, mesh, ColwiseParallel(use_local_output=False))
    hidden = hidden.requires_grad_()
    logits = head(hidden)                      # DTensor, Shard(-1): each rank's vocabulary
    assert logits.placements == (Shard(2),)
    with loss_parallel():
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten())
        loss.backward()
    return loss.full_tensor(), head.weight.grad.full_tensor(), hidden.grad


@pytest.mark.parametrize("world_size", [2, 4])
def test_loss_parallel_matches_single_process_cross_entropy(world_size):
    run = sc.Cluster.preset("dgx-a100").run(_vocab_parallel_cross_entropy,
                                            world_size=world_size)
    head, hidden, target = _lm_head_and_data()
    hidden.requires_grad_()
    loss = F.cross_entropy(head(hidden).flatten(0, 1), target.flatten())
    loss.backward()
    for rank, (rank_loss, weight_grad, hidden_grad) in enumerate(run.results):
        torch.testing.assert_close(rank_loss, loss, msg=f"rank {rank}: loss")
        torch.testing.assert_close(weight_grad, head.weight.grad, msg=f"rank {rank}: dW")
        torch.testing.assert_close(hidden_grad, hidden.grad, msg=f"rank {rank}: dx")
    # the vocabulary-parallel softmax all-reduces its max and its sum
    assert sum(c.op == "all_reduce" for c in run.collectives) >= 2


def _leave_loss_parallel_at_different_times():
    """Rank 0 leaves loss_parallel() while rank 1 is still inside, waiting on rank 0."""
    mesh = init_device_mesh("cpu", (2,))
    rank = dist.get_rank()
    torch.manual_seed(0)
    logits = distribute_tensor(torch.randn(4, 8), mesh, [Shard(1)]).requires_grad_()
    target = torch.randint(8, (4,))
    with loss_parallel():
        loss = F.cross_entropy(logits, target)
        if rank == 1:
            dist.barrier()                    # rank 0 leaves meanwhile
            loss.backward()
    if rank == 0:
        dist.barrier()
    handlers = DTensor._op_dispatcher._custom_op_handlers
    return torch.ops.aten._log_softmax.default in handlers, logits.grad is not None


def test_a_rank_leaving_loss_parallel_leaves_the_others_inside():
    handlers = dict(DTensor._op_dispatcher._custom_op_handlers)
    run = sc.Cluster.preset("dgx-a100").run(_leave_loss_parallel_at_different_times,
                                            world_size=2)
    assert run.results == [(False, False), (False, True)]
    assert DTensor._op_dispatcher._custom_op_handlers == handlers   # the notebook's


def _fail_inside_loss_parallel():
    mesh = init_device_mesh("cpu", (2,))
    logits = distribute_tensor(torch.zeros(2, 4), mesh, [Shard(1)])
    with loss_parallel():                     # torch's context has no finally:
        F.cross_entropy(logits, torch.zeros(2, dtype=torch.long))
        raise ValueError("learner's bug")    # its handlers stay on in this process


def test_a_run_that_fails_inside_loss_parallel_leaves_the_notebook_as_it_was():
    handlers = dict(DTensor._op_dispatcher._custom_op_handlers)
    with pytest.raises(sc.RankError, match="learner's bug"):
        sc.Cluster.preset("dgx-a100").run(_fail_inside_loss_parallel, world_size=2)
    assert DTensor._op_dispatcher._custom_op_handlers == handlers


def _implicit_replication_on_rank_0_only():
    mesh = init_device_mesh("cpu", (2,))
    x = distribute_tensor(torch.ones(4), mesh, [Replicate()])
    if dist.get_rank() == 0:
        with implicit_replication():
            dist.barrier()                     # rank 1 runs while rank 0 is inside
            return (x + torch.ones(4)).to_local().tolist()
    dist.barrier()
    with pytest.raises(RuntimeError, match="mixed torch.Tensor and DTensor"):
        x + torch.ones(4)
    return "refused"


def test_implicit_replication_is_per_rank():
    run = sc.Cluster.preset("dgx-a100").run(_implicit_replication_on_rank_0_only,
                                            world_size=2)
    assert run.results == [[2.0] * 4, "refused"]


class _TinyGPT(nn.Module):
    """Embedding, two pre-norm MLP blocks, final norm, LM head: the layers a TP plan with
    sequence parallelism and a vocabulary-parallel loss touches."""

    def __init__(self):
        super().__init__()
        self.emb = nn.Embedding(VOCAB, HIDDEN)
        self.blocks = nn.ModuleList(
            nn.ModuleDict({"norm": nn.LayerNorm(HIDDEN), "up": nn.Linear(HIDDEN, 4 * HIDDEN),
                           "down": nn.Linear(4 * HIDDEN, HIDDEN)}) for _ in range(2))
        self.norm = nn.LayerNorm(HIDDEN)
        self.head = nn.Linear(HIDDEN, VOCAB, bias=False)

    def forward(self, tokens):
        x = self.emb(tokens)
        for block in self.blocks:
            x = x + block["down"](F.gelu(block["up"](block["norm"](x))))
        return self.head(self.norm(x))


def _gpt_and_data():
    torch.manual_seed(0)
    tokens, target = torch.randint(VOCAB, (2, BATCH, SEQ * 4))   # SEQ * 4: divisible by 4 ranks
    return _TinyGPT(), tokens, target


def _sequence_parallel_gpt():
    from torch.distributed.tensor.parallel import RowwiseParallel, SequenceParallel

    model, tokens, target = _gpt_and_data()
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    plan = {"emb": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
            "norm": SequenceParallel(),
            "head": ColwiseParallel(input_layouts=Shard(1), use_local_output=False)}
    for i in range(2):
        plan |= {f"blocks.{i}.norm": SequenceParallel(),
                 f"blocks.{i}.up": ColwiseParallel(input_layouts=Shard(1)),
                 f"blocks.{i}.down": RowwiseParallel(output_layouts=Shard(1))}
    parallelize_module(model, mesh, plan)
    with loss_parallel():
        loss = F.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
        loss.backward()
    return loss.full_tensor(), {n: p.grad.full_tensor() for n, p in model.named_parameters()}


def test_sequence_parallel_gpt_with_loss_parallel_matches_single_process():
    run = sc.Cluster.preset("dgx-a100").run(_sequence_parallel_gpt, world_size=4)
    model, tokens, target = _gpt_and_data()
    loss = F.cross_entropy(model(tokens).flatten(0, 1), target.flatten())
    loss.backward()
    for rank, (rank_loss, grads) in enumerate(run.results):
        torch.testing.assert_close(rank_loss, loss, msg=f"rank {rank}: loss")
        for name, p in model.named_parameters():
            torch.testing.assert_close(grads[name], p.grad, msg=f"rank {rank}: {name}")
    # sequence parallelism: the block's all-reduce became reduce-scatter + all-gather
    assert {"reduce_scatter_tensor", "all_gather_into_tensor"} <= {c.op for c in run.collectives}


def _count_with_comm_debug_mode():
    from torch.distributed.tensor.debug import CommDebugMode
    from torch.distributed.tensor.parallel import RowwiseParallel

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(HIDDEN, 2 * HIDDEN), nn.ReLU(), nn.Linear(2 * HIDDEN, HIDDEN))
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(4, HIDDEN, requires_grad=True)
    with CommDebugMode() as comm:
        model(x).sum().backward()
    return {module: {phase: {str(op): n for op, n in ops.items()} for phase, ops in phases.items()}
            for module, phases in comm.comm_module_counts.items() if module.startswith("Sequential.")}


def test_comm_debug_mode_counts_each_ranks_own_collectives():
    """The Megatron MLP: one all-reduce forward (row-parallel output), one backward
    (column-parallel input gradient), each in its own module, on every rank."""
    run = sc.Cluster.preset("dgx-a100").run(_count_with_comm_debug_mode, world_size=4)
    all_reduce = {"c10d_functional.all_reduce": 1}
    assert run.results == [{"Sequential.0": {"forward": {}, "backward": all_reduce},
                            "Sequential.2": {"forward": all_reduce, "backward": {}}}] * 4


# ---------------------------------------------- process-wide module hooks, per rank
def _comm_debug_mode_on_a_tensor_parallel_block():
    from torch.distributed.tensor.debug import CommDebugMode

    from workbook.models import Block, tp_plan

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = parallelize_module(Block(), mesh, tp_plan())
    with CommDebugMode() as comm:
        model(torch.randn(2, 8, 64, requires_grad=True)).sum().backward()
    return ({str(op): n for op, n in comm.get_comm_counts().items()},
            sorted(comm.get_parameter_info()))


def test_comm_debug_mode_counts_each_ranks_own_modules():
    """CommDebugMode follows modules with process-wide module hooks; with ranks as
    threads each rank's tool heard the others' modules and stopped with KeyError: 'MLP.up'.
    On gloo (one process per rank) it counts the 4 all-reduces of one TP layer."""
    run = sc.Cluster.preset("dgx-a100").run(_comm_debug_mode_on_a_tensor_parallel_block,
                                            world_size=4, accounting=False)
    for counts, modules in run.results:
        assert counts == {"c10d_functional.all_reduce": 4}
        assert "Block.mlp.up" in modules


def test_a_module_hook_registered_in_a_rank_fires_for_that_rank_only():
    def fn():
        seen = []
        handle = nn.modules.module.register_module_forward_pre_hook(
            lambda module, args: seen.append(dist.get_rank()))
        layer = nn.Linear(2, 2)
        dist.barrier()                 # every rank has registered its hook
        layer(torch.ones(2))
        dist.barrier()                 # every rank has called its layer
        handle.remove()
        return seen

    run = sc.Cluster.preset("dgx-a100").run(fn, world_size=3, accounting=False)
    assert run.results == [[0], [1], [2]]
    assert not nn.modules.module._global_forward_pre_hooks
