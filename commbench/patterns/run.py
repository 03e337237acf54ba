"""A pattern's step on one rank: checked, placed, run once under the ledger, then timed.

:func:`run_pattern` is the one SPMD entry point of every pattern (``world.run(run_pattern,
"ulysses", cfg, "ulysses", seed)``): the contract test, the study, the claims and ``make
gpu-check`` all call it. It returns plain data for the driver: outputs on the CPU, the calls the
ledger booked (as :class:`~commbench.patterns.base.Call` fields) and the per-sample times.
"""

from __future__ import annotations

import contextlib
from dataclasses import astuple

import torch

from commbench.patterns.base import Call
from commbench.patterns.device import device_guard
from commbench.timing.loop import timed

__all__ = ["booked_calls", "run_pattern"]


def booked_calls(entries) -> list[tuple]:
    """Ledger entries as :class:`Call` tuples (op, axis, size, sent, recv): picklable, and
    comparable with a pattern's prediction."""
    return [astuple(Call(e.op, e.axis, e.count * getattr(torch, e.dtype).itemsize, e.sent,
                         e.recv)) for e in entries]


def _cpu(value):
    if isinstance(value, torch.Tensor):
        return value.detach().cpu()
    if isinstance(value, dict):
        return {k: _cpu(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return type(value)(_cpu(v) for v in value)
    return value


def run_pattern(ctx, name: str, cfg, variant: str, seed: int, broken: str | None = None,
                iters: int = 0, warmup: int = 0, guard: bool = False) -> dict:
    """Run ``variant`` of pattern ``name`` on this rank; time it ``iters`` more times.

    ``broken`` names one of the pattern's declared broken variants. ``guard`` runs the first
    step under :func:`~commbench.patterns.device.device_guard`: a tensor the pattern creates
    off ``ctx.device`` is an error.
    """
    from commbench.patterns.registry import get

    pattern = get(name)
    pattern.check(cfg, ctx.size, variant)  # before any collective: one line, value and rule
    parts = pattern.parts_for(broken)
    groups = pattern.groups(ctx, cfg)
    local = pattern.shard(cfg, pattern.inputs(cfg, seed, ctx.device), groups, variant, parts)

    def step() -> dict:
        return pattern.step(ctx, cfg, local, variant, groups, parts)

    checked = device_guard(ctx.device) if guard else contextlib.nullcontext()
    with checked, ctx.ledger.capture() as cap:
        out = step()
    stats: list = []
    times: list[float] = []
    if iters:
        comm = ctx.comm()
        times = timed(lambda: stats.append(step().get("stats")),
                      lambda: comm.backend.barrier(ctx.world), iters, warmup,
                      ctx.device.type == "cuda")
    return {"outputs": _cpu(out), "ledger": booked_calls(cap.entries), "times": times,
            "timeline": [tuple(e) for e in cap.entries],  # the first step's calls, with times
            "stats": stats[warmup:], "groups": {k: g.ranks for k, g in groups.items()}}
