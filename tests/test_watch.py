"""The ledger watching third-party torch.distributed code: every entry point, each call once.

The bytes for torch's tensor parallelism and FSDP2 are worked out by hand in each test's docstring.
"""

from __future__ import annotations

import pytest
import torch

from commbench.wire.watch import watch

pytestmark = pytest.mark.foundation


def _entry_points(ctx):
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol

    n = ctx.size
    x = torch.ones(6)
    with watch(ctx.ledger), ctx.ledger.capture() as cap:
        dist.all_reduce(x.clone())
        dist.all_reduce(x.clone(), async_op=True).wait()
        funcol.wait_tensor(funcol.all_reduce(x, "sum", dist.group.WORLD))
        dist.all_gather_into_tensor(torch.empty(6 * n), x)  # deprecated forms are still used
        dist.all_gather([torch.empty(6) for _ in range(n)], x)
        funcol.wait_tensor(funcol.all_gather_tensor(x, 0, dist.group.WORLD))
        dist.reduce_scatter_tensor(torch.empty(2), torch.ones(2 * n))
        dist.all_to_all_single(torch.empty(2 * n), torch.ones(2 * n))
        dist.broadcast(x.clone(), src=0)
        dist.barrier()
        ctx.comm().all_reduce(x, ctx.world)  # booked by the comm layer, not again by the watcher
    return [(e.op, e.count, e.sent, e.recv, e.source) for e in cap.entries]


@pytest.mark.world(sizes=[2, 4])
def test_every_entry_point_is_booked_once(world):
    n = world.size
    S = 6 * 4
    ar = 2 * (n - 1) * S // n if 6 % n == 0 else None
    for got in world.run(_entry_points):
        ops = [g[0] for g in got]
        assert ops == ["all_reduce"] * 3 + ["all_gather"] * 3 + ["reduce_scatter", "all_to_all",
                                                                 "broadcast", "barrier",
                                                                 "all_reduce"]
        assert [g[4] for g in got] == ["torch"] * 10 + ["commbench"]
        if ar is not None:
            assert all(g[2:4] == (ar, ar) for g in got if g[0] == "all_reduce")
        assert all(g[1:4] == (6, (n - 1) * S, (n - 1) * S) for g in got if g[0] == "all_gather")
        assert got[6][1:4] == (2 * n, (n - 1) * 8, (n - 1) * 8)
        assert got[7][1:4] == (2 * n, (n - 1) * 8, (n - 1) * 8)


def _tensor_parallel_mlp(ctx, b, s, h):
    from torch.distributed.tensor import init_device_mesh
    from torch.distributed.tensor.parallel import (
        ColwiseParallel,
        RowwiseParallel,
        parallelize_module,
    )

    torch.manual_seed(0)
    mlp = torch.nn.Sequential(torch.nn.Linear(h, 4 * h, bias=False), torch.nn.GELU(),
                              torch.nn.Linear(4 * h, h, bias=False))
    parallelize_module(mlp, init_device_mesh("cpu", (ctx.size,)),
                       {"0": ColwiseParallel(), "2": RowwiseParallel()})
    x = torch.randn(b, s, h, requires_grad=True)
    with watch(ctx.ledger), ctx.ledger.capture() as cap:
        mlp(x).sum().backward()
    return [(e.op, e.group, e.count, e.sent, e.recv, e.dtype) for e in cap.entries]


@pytest.mark.world(sizes=[2, 4])
def test_torch_tensor_parallel_mlp_bytes_by_hand(world):
    """Megatron's MLP through torch.distributed.tensor.parallel, b=2, s=3, h=4 on P ranks.

    Forward: RowwiseParallel all-reduces the output, b*s*h = 24 float32 = 96 B. Backward:
    ColwiseParallel all-reduces the input's gradient, again 24 float32. A ring all-reduce of 96 B
    on P=2 sends and receives 2*(P-1)/P * 96 = 96 B per rank. Nothing else moves.
    """
    if world.size != 2:
        pytest.skip("worked out for 2 ranks")
    for got in world.run(_tensor_parallel_mlp, 2, 3, 4):
        assert got == [("all_reduce", (0, 1), 24, 96, 96, "float32")] * 2


def _fsdp2(ctx):
    from torch.distributed.fsdp import fully_shard
    from torch.distributed.tensor import init_device_mesh

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 6, bias=False),
                                torch.nn.Linear(6, 4, bias=False))
    mesh = init_device_mesh("cpu", (ctx.size,))
    for layer in model:
        fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    with watch(ctx.ledger), ctx.ledger.capture() as cap:
        model(torch.ones(2, 4)).sum().backward()
    return [(e.op, e.count, e.sent, e.recv) for e in cap.entries]


@pytest.mark.world(sizes=[2, 4])
def test_fsdp2_bytes_by_hand(world):
    """FSDP2 on two Linear layers of 6x4 and 4x6 weights (24 elements each), P=2, no bias.

    Each rank holds a 12-element shard of each weight (dim 0 split in two). Forward all-gathers
    each layer (12 elements in, 24 out): sends and receives (P-1)*12*4 = 48 B. The layers reshard
    after forward, so backward all-gathers both again: 4 all-gathers in all. Backward
    reduce-scatters each layer's 24-element gradient: (P-1)*24/P*4 = 48 B each way.
    """
    if world.size != 2:
        pytest.skip("worked out for 2 ranks")
    for got in world.run(_fsdp2):
        assert got == [("all_gather", 12, 48, 48)] * 4 + [("reduce_scatter", 24, 48, 48)] * 2


def _dtensor_matmul_and_loss(ctx):
    """A DTensor Shard(0) @ Shard(0) matmul (DTensor all-gathers the right operand inside the
    op), the result's full_tensor, and torch's loss_parallel cross-entropy (3 all-reduces
    inside DTensor ops: the row max, the sum of exponentials, the target logit)."""
    from torch.distributed.tensor import Shard, distribute_tensor, init_device_mesh
    from torch.distributed.tensor.parallel import loss_parallel

    mesh = init_device_mesh("cpu", (ctx.size,))
    a = distribute_tensor(torch.ones(8, 4), mesh, [Shard(0)])
    b = distribute_tensor(torch.ones(4, 6), mesh, [Shard(0)])
    torch.manual_seed(0)
    logits = distribute_tensor(torch.randn(6, 8), mesh, [Shard(1)])
    target = torch.randint(0, 8, (6,))
    with watch(ctx.ledger), ctx.ledger.capture() as cap:
        (a @ b).full_tensor()
        with loss_parallel():
            torch.nn.functional.cross_entropy(logits, target)
    return [(e.op, e.group, e.count, e.dtype) for e in cap.entries]


@pytest.mark.world(sizes=[2, 4])
def test_collectives_inside_dtensor_ops_are_booked_once(world):
    P, ranks = world.size, tuple(range(world.size))
    for got in world.run(_dtensor_matmul_and_loss):
        assert got == [("all_gather", ranks, 4 // P * 6, "float32"),   # b, inside the matmul
                       ("all_gather", ranks, 8 // P * 6, "float32"),   # full_tensor of a @ b
                       *[("all_reduce", ranks, 6, "float32")] * 3]     # inside cross_entropy


def _tp_mlp_context(ctx):
    import torch.distributed as dist

    _tensor_parallel_mlp(ctx, 2, 3, 4)
    with watch(ctx.ledger):
        dist.all_reduce(torch.ones(2), op=dist.ReduceOp.MAX)
    last = ctx.ledger.entries[-3:]
    return [(e.redop, e.phase, e.module, e.nbytes) for e in last]


@pytest.mark.world(sizes=[2, 4])
def test_entries_carry_reduction_phase_module_and_tensor_bytes(world):
    """torch's TP MLP: the forward all-reduce of RowwiseParallel's output (issued by its forward
    hook, once module 2's own forward ended: the innermost active module is the Sequential) and
    the backward all-reduce of ColwiseParallel's input gradient (module 0); then a MAX outside
    any module. Tensor bytes: 24 float32 = 96 B; 2 float32 = 8 B."""
    for got in world.run(_tp_mlp_context):
        assert got == [("sum", "forward", "Sequential", 96), ("sum", "backward", "Sequential.0", 96),
                       ("max", "forward", "", 8)]


class _Reduced(torch.nn.Module):
    """A layer whose forward all-reduces its output (a row-parallel linear's g operator)."""

    def __init__(self) -> None:
        super().__init__()
        self.lin = torch.nn.Linear(3, 3, bias=False)

    def forward(self, x):
        import torch.distributed as dist

        y = self.lin(x)
        dist.all_reduce(y.detach().clone())  # the collective itself is not differentiated here
        return y


class _CopyToRegion(torch.autograd.Function):
    """Megatron's f: identity forward, all-reduce of the gradient in backward."""

    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, g):
        import torch.distributed as dist

        g = g.clone()
        dist.all_reduce(g)
        return g


def _phase_disagreements(ctx):
    """Where torch's module tracker and the autograd engine disagree about the phase: a layer
    recomputed by activation checkpointing runs its forward (the tracker's forward hooks fire)
    inside the backward pass; a gradient hook on a tensor runs inside the backward pass outside
    any module's backward; Megatron's f used outside any module all-reduces in backward while
    no module's backward hook has told the tracker; after backward, a call outside any module
    (a gradient-norm all-reduce of clipping) is in neither."""
    import torch.distributed as dist
    from torch.utils.checkpoint import checkpoint, set_checkpoint_early_stop

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(3, 3), _Reduced())
    x = torch.randn(2, 3, requires_grad=True)
    with watch(ctx.ledger), ctx.ledger.capture() as cap:
        h = model[0](x)
        h.register_hook(lambda g: dist.all_reduce(g[0].clone()))
        with set_checkpoint_early_stop(False):  # recompute the whole forward, collective too
            y = checkpoint(model[1], h, use_reentrant=False)
            y.sum().backward()
        (_CopyToRegion.apply(torch.ones(4, requires_grad=True)) * 2).sum().backward()
        dist.all_reduce(torch.ones(1))
    return [(e.phase, e.module, e.count) for e in cap.entries]


@pytest.mark.world(sizes=[1, 2, 4])
def test_phase_follows_the_autograd_engine_where_the_module_tracker_disagrees(world):
    """Layers called on their own, so the tracker names them by class; the hook's module is the
    one whose backward the tracker is in (the layer that made h). torch 2.13's tracker reads its
    ``is_bw`` from the engine, so phase cannot come from which hook fired last: the recomputed
    forward fires forward hooks inside backward, with grad enabled (a phase read from
    ``torch.is_grad_enabled()`` calls it forward: planted, caught at index 1)."""
    for got in world.run(_phase_disagreements):
        assert got == [("forward", "_Reduced", 6),   # the checkpointed layer's own forward
                       ("backward", "_Reduced", 6),  # its recomputation, inside backward
                       ("backward", "Linear", 3),    # the gradient hook on h
                       ("backward", "", 4),          # f's backward, outside any module
                       ("forward", "", 1)]           # after backward, outside any module


def _gradient_by_autograd_grad(ctx):
    """A script that takes its gradient with ``torch.autograd.grad`` (torch's pipelining with
    dynamic shapes does): the first layer's input is a leaf that requires grad, on which torch's
    own module tracker made the engine raise. The layer's backward all-reduces its input's
    gradient (Megatron's f); then ``backward()`` the same way."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(_Copy(), torch.nn.Linear(3, 3), torch.nn.Linear(3, 1))
    x = torch.randn(2, 3, requires_grad=True)
    with watch(ctx.ledger), ctx.ledger.capture() as cap:
        (g,) = torch.autograd.grad(model(x).sum(), x)
        model(x).sum().backward()
    return g.shape, [(e.op, e.phase, e.module, e.count) for e in cap.entries]


class _Copy(torch.nn.Module):
    def forward(self, x):
        return _CopyToRegion.apply(x)


@pytest.mark.world(sizes=[1, 2, 4])
def test_a_gradient_by_autograd_grad_is_watched_not_broken(world):
    for shape, got in world.run(_gradient_by_autograd_grad):
        assert tuple(shape) == (2, 3)
        assert got == [("all_reduce", "backward", "Sequential.0", 6)] * 2


def _barrier_dtype(ctx):
    import torch.distributed as dist

    with watch(ctx.ledger), ctx.ledger.capture() as cap:
        dist.barrier()
    return [(e.op, e.dtype) for e in cap.entries]


@pytest.mark.world(sizes=[2])
def test_a_barrier_carries_no_dtype(world):
    """A barrier moves no tensor of the caller's: booked without a dtype (the audit's table
    shows '-'), not as the uint8 of torch's internal one-byte tensor."""
    for got in world.run(_barrier_dtype):
        assert got == [("barrier", "")]


def _watched_twice(ctx):
    import importlib
    import sys

    import torch.distributed as dist

    from commbench.wire.ledger import Ledger

    ledger = Ledger()

    def booked():
        with watch(ledger), ledger.capture() as cap:
            dist.all_reduce(torch.ones(4))
            dist.broadcast(torch.ones(3), src=0)
        return [(e.op, e.count, e.source) for e in cap.entries]

    first = booked()
    imported = "torch._dynamo" in sys.modules
    importlib.import_module("torch._dynamo")  # as a script that compiles has it: the guard

    return imported, first, booked()


@pytest.mark.local  # a fresh rank of its own: the kept worlds' ranks may have imported dynamo
def test_the_watcher_books_alike_and_imports_no_dynamo_of_its_own():
    """torch's guard around a dispatch mode imports torch._dynamo at the first call (1.6 s of
    a core in each audited rank); the watcher takes that guard only where dynamo was already
    imported, and books the same calls either way."""
    from commbench.world.local import LocalWorld

    with LocalWorld(1) as w:
        imported, first, again = w.run(_watched_twice)[0]
    assert not imported
    assert first == again == [("all_reduce", 4, "torch"), ("broadcast", 3, "torch")]
