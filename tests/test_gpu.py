"""The GPU paths with a world of one: NCCL, CUDA tensors through every transport, CUDA-event timing.

`make gpu-check` runs this file on a machine with one GPU, after ``commbench gpu-check`` (every
pattern on the device), which fails first on a machine without CUDA.
A world of one cannot test NCCL across ranks; it does run commbench's NCCL code path end to end
(process group creation with a bound device, each collective on device memory, booking, timing).
"""

from __future__ import annotations

import pytest
import torch

from commbench.collectives.measure import Case, measure
from commbench.timing import verify

pytestmark = [pytest.mark.gpu, pytest.mark.local, pytest.mark.skipif(
    not torch.cuda.is_available(), reason="needs a CUDA device; this machine has none")]


@pytest.fixture(scope="module")
def gpu_world():
    import os

    from commbench.world.local import LocalWorld

    os.environ.setdefault("TORCH_NCCL_ENABLE_TIMING", "1")  # the audit's device time
    with LocalWorld(1, backend="nccl") as w:
        yield w


def _every_op_on_cuda(ctx, transport):
    comm, g = ctx.comm(transport), ctx.world
    x = verify.seeded(0, 0, 1000, torch.float32, device="cuda")
    out = {
        "device": str(ctx.device),
        "all_reduce": comm.all_reduce(x, g),
        "all_gather": comm.all_gather(x, g),
        "reduce_scatter": comm.reduce_scatter(x, g),
        "all_to_all": comm.all_to_all(x, g),
        "broadcast": comm.broadcast(x, g),
        "reduce": comm.reduce(x, g),
    }
    assert all(v.is_cuda for k, v in out.items() if k != "device")
    return {k: (v.cpu() if isinstance(v, torch.Tensor) else v) for k, v in out.items()}, \
        [(e.op, e.transport, e.sent) for e in ctx.ledger.entries]


def test_nccl_world_of_one_binds_a_device(gpu_world):
    assert gpu_world.transports[0] == "nccl"


@pytest.mark.parametrize("transport", ["nccl", "mpi"])
def test_every_op_with_cuda_tensors(gpu_world, transport):
    if transport not in gpu_world.transports:
        pytest.skip(f"{transport} is not in this world ({gpu_world.transports})")
    (values, entries), = gpu_world.run(_every_op_on_cuda, transport)
    want = verify.seeded(0, 0, 1000, torch.float32)
    assert values["device"] == "cuda:0"
    for op in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast", "reduce"):
        assert torch.equal(values[op], want), op
    assert [e[0] for e in entries] == ["all_reduce", "all_gather", "reduce_scatter", "all_to_all",
                                       "broadcast", "reduce"]
    assert all(e[1] == transport and e[2] == 0 for e in entries)  # one rank sends nothing


def test_cuda_event_timing(gpu_world):
    (out,) = gpu_world.run(measure, Case("all_reduce", "nccl", iters=5, warmup=2), 1 << 20)
    assert out["wrong"] == 0 and len(out["times"]) == 5 and all(t > 0 for t in out["times"])


def _audited_calls(ctx):
    import torch.distributed as dist

    from commbench.studies.audit import audit

    x = torch.ones(1 << 24, device="cuda")  # 64 MiB
    out = torch.empty_like(x)

    def step():
        dist.all_reduce(x)
        dist.all_gather_into_tensor(out, x)

    return [(e.op, e.device_seconds) for e in audit(step)]


def test_the_audit_books_each_call_s_device_time(gpu_world):
    """Each call's time on the device: a blocking call on NCCL returns no Work to read NCCL's
    events from (torch 2.11 on an H200: both read 0.0 before), so the watcher's own events on
    the current stream time it."""
    (entries,) = gpu_world.run(_audited_calls)
    assert [op for op, _ in entries] == ["all_reduce", "all_gather"]
    assert all(seconds > 0 for _, seconds in entries)


def _pipeline_compute(ctx):
    from commbench.patterns.pp.pp_comms import compute

    busy_start = torch.cuda.Event(enable_timing=True)
    busy_end = torch.cuda.Event(enable_timing=True)
    busy_start.record()
    compute(0.05, ctx.device)
    busy_end.record()
    busy_end.synchronize()
    return busy_start.elapsed_time(busy_end) / 1e3


def test_the_pipelines_compute_runs_on_the_device(gpu_world):
    """On CUDA the pipeline's synthetic compute is a kernel on the stage's stream: CUDA events
    around it see it (device time; a host sleep would leave them about 0)."""
    (device_s,) = gpu_world.run(_pipeline_compute)
    assert device_s > 0.5 * 0.05
