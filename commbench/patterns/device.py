"""A check that a pattern makes every tensor on the context's device, runnable on a CPU.

Under NCCL every tensor a pattern computes with must live on ``ctx.device`` (a CUDA device); a
``torch.zeros(n)`` that forgot its ``device=`` runs on a CPU-only machine and fails on the
first GPU cluster. :func:`device_guard` catches it on a CPU: a torch function mode sees every
factory call (``torch.zeros``, ``torch.tensor``, ``torch.arange``, ...), and one made from a
pattern's source file must name the device (``device=...``) and it must be the context's. A
seeded draw (``generator=`` given) may name the CPU: CPU generators draw the same numbers on
every machine, and the draw is then moved. ``*_like`` and ``Tensor.new_*`` calls inherit the
device of their tensor and pass.

The rest of the library (runtime, wire, timing, collectives, studies, the audit: :data:`LIBRARY`)
is held to the first half of the rule: a factory call there names its device, the world's or,
for the harness's own traffic over a side gloo group, the CPU; the comm layer then refuses any
tensor off its transport's device (``commbench.wire.checks.check_device``). A fingerprint made
with ``torch.tensor(fp)`` for an NCCL group is caught here on a CPU.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Iterator

import torch
from torch.overrides import TorchFunctionMode

__all__ = ["DeviceError", "FACTORIES", "LIBRARY", "device_guard"]

FACTORIES = frozenset({
    "zeros", "ones", "empty", "full", "rand", "randn", "randint", "randperm", "arange",
    "linspace", "logspace", "eye", "tensor", "as_tensor", "scalar_tensor", "empty_strided",
    "tril_indices", "triu_indices"})
PATTERNS_DIR = os.path.dirname(os.path.abspath(__file__))
LIBRARY = os.path.dirname(PATTERNS_DIR)  # the whole commbench package


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
                harness = where.startswith(LIBRARY + os.sep) and not where.startswith(
                    PATTERNS_DIR + os.sep)
                self._check(name, kwargs, f"{os.path.relpath(where, LIBRARY)}:{caller.f_lineno}",
                            harness)
        return func(*args, **kwargs)

    def _check(self, name: str, kwargs: dict, where: str, harness: bool) -> None:
        dev = kwargs.get("device")
        if dev is None:
            raise DeviceError(f"{where}: torch.{name}(...) without device=: the tensor lands on "
                              f"the default device, not on the context's {self.device}")
        dev = torch.device(dev)
        if dev.type != self.device.type and kwargs.get("generator") is None and not harness:
            raise DeviceError(f"{where}: torch.{name}(..., device={dev}) on a world whose "
                              f"device is {self.device}")


@contextlib.contextmanager
def device_guard(device: torch.device, roots: tuple[str, ...] = (LIBRARY,)) -> Iterator[None]:
    """Raise :class:`DeviceError` at a factory call from a file under ``roots`` (default: the
    whole library) that names no device, or, in a pattern, another device than ``device``."""
    with _Guard(torch.device(device), tuple(os.path.abspath(r) for r in roots)):
        yield
