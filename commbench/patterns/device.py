"""A check that a pattern makes every tensor on the context's device, runnable on a CPU.

Under NCCL every tensor a pattern computes with must live on ``ctx.device`` (a CUDA device); a
``torch.zeros(n)`` that forgot its ``device=`` runs on a CPU-only machine and fails on the
first GPU cluster. :func:`device_guard` catches it on a CPU: a torch function mode sees every
factory call (``torch.zeros``, ``torch.tensor``, ``torch.arange``, ...), and one made from a
pattern's source file must name the device (``device=...``) and it must be the context's. A
seeded draw (``generator=`` given) may name the CPU: CPU generators draw the same numbers on
every machine, and the draw is then moved. ``*_like`` and ``Tensor.new_*`` calls inherit the
device of their tensor and pass.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["DeviceError", "FACTORIES", "device_guard"]

FACTORIES = frozenset({
    "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange",
    "linspace", "logspace", "eye", "tensor", "as_tensor", "scalar_tensor", "empty_strided",
    "tril_indices", "triu_indices"})
PATTERNS_DIR = os.path.dirname(os.path.abspath(__file__))


class DeviceError(RuntimeError):
    """A pattern made a tensor off the context's device."""


class _Guard(TorchFunctionMode):
    def __init__(self, device: torch.device, roots: tuple[str, ...]) -> None:
        super().__init__()
        self.device, self.roots = device, roots

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        name = getattr(func, "__name__", "")
        if name in FACTORIES:
            caller = sys._getframe(1)
            where = os.path.abspath(caller.f_code.co_filename)
            if where.startswith(self.roots):
                self._check(name, kwargs, f"{os.path.relpath(where, os.path.dirname(PATTERNS_DIR))}"
                                          f":{caller.f_lineno}")
        return func(*args, **kwargs)

    def _check(self, name: str, kwargs: dict, where: str) -> None:
        dev = kwargs.get("device")
        if dev is None:
            raise DeviceError(f"{where}: torch.{name}(...) without device=: the tensor lands on "
                              f"the default device, not on the context's {self.device}")
        dev = torch.device(dev)
        if dev.type != self.device.type and kwargs.get("generator") is None:
            raise DeviceError(f"{where}: torch.{name}(..., device={dev}) on a world whose "
                              f"device is {self.device}")


@contextlib.contextmanager
def device_guard(device: torch.device, roots: tuple[str, ...] = (PATTERNS_DIR,)) -> Iterator[None]:
    """Raise :class:`DeviceError` at a factory call from a file under ``roots`` (default: the
    patterns) that does not place its tensor on ``device``."""
    with _Guard(torch.device(device), tuple(os.path.abspath(r) for r in roots)):
        yield
