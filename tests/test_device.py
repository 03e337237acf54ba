"""The device guard (commbench.patterns.device): a tensor made without ``device=`` in a pattern's
file fails the run, on a CPU. The contract runs every pattern under it
(tests/test_patterns.py); here it must catch what it is there to catch."""

from __future__ import annotations

import os

import pytest
import torch

from commbench.patterns.device import DeviceError, device_guard

pytestmark = pytest.mark.foundation

HERE = (os.path.dirname(os.path.abspath(__file__)),)


def _lost_device(x: torch.Tensor) -> torch.Tensor:
    return x + torch.zeros(x.shape)  # the bug: no device=


def _kept_device(x: torch.Tensor) -> torch.Tensor:
    seeded = torch.randn(x.shape, generator=torch.Generator().manual_seed(0), device="cpu")
    return x + torch.zeros(x.shape, device=x.device) + x.new_ones(x.shape) + \
        torch.empty_like(x).fill_(0) + seeded.to(x.device)


def test_a_factory_call_that_lost_its_device_fails():
    with pytest.raises(DeviceError, match=r"test_device.py:\d+: torch.zeros\(\.\.\.\) without "
                                          r"device=: the tensor lands on the default device"):
        with device_guard(torch.device("cpu"), HERE):
            _lost_device(torch.ones(3, device="cpu"))


def test_tensors_placed_on_the_device_pass():
    want = 2 + torch.randn(3, generator=torch.Generator().manual_seed(0))
    with device_guard(torch.device("cpu"), HERE):
        got = _kept_device(torch.ones(3, device="cpu"))
    assert torch.equal(got, want)


def test_a_tensor_named_on_another_device_fails():
    with pytest.raises(DeviceError, match=r"torch.arange\(\.\.\., device=cpu\) on a world whose "
                                          r"device is meta"):
        with device_guard(torch.device("meta"), HERE):
            torch.arange(3, device="cpu")


def test_code_outside_the_roots_is_not_judged():
    with device_guard(torch.device("cpu")):  # roots: the library; this file is not in it
        _lost_device(torch.ones(3))


# -- the rest of the library: the debug fingerprint ---------------------------------------------
def _fingerprint_as_first_written(fp: list[int]) -> torch.Tensor:
    return torch.tensor(fp, dtype=torch.int64)  # the bug: a CPU tensor for any group's transport


def test_the_library_guard_catches_a_fingerprint_made_off_the_device():
    """Debug mode once all-gathered ``torch.tensor(fp)`` over the benchmark's group: on NCCL,
    "No backend type associated with device type cpu". The library guard catches it on a CPU."""
    with pytest.raises(DeviceError, match="without device="):
        with device_guard(torch.device("cpu"), HERE):
            _fingerprint_as_first_written([1, 2, 3])


def _debug_all_reduce(ctx):
    from commbench.patterns.device import LIBRARY

    comm = ctx.comm()
    comm.debug, board = True, comm.board
    try:
        out = []
        # a local world's board, then the all-gather of ranks on several hosts (no board)
        for comm.board in (board, None):
            with device_guard(ctx.device, (LIBRARY,)):
                out.append(comm.all_reduce(torch.ones(4, device=ctx.device), ctx.world).tolist())
        return out
    finally:
        comm.debug, comm.board = ctx.debug, board


@pytest.mark.world(sizes=[1, 2, 4])
def test_debug_mode_makes_its_fingerprint_on_the_transports_device(world):
    assert world.run(_debug_all_reduce) == [[[float(world.size)] * 4] * 2] * world.size
