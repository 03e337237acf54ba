"""A pattern's step on one rank: checked, placed, run once under the ledger, then timed.

:func:`run_pattern` is the one SPMD entry point of every pattern (``world.run(run_pattern,
"ulysses", cfg, "ulysses", seed)``): the contract test, the study, the claims and ``make
gpu-check`` all call it. It returns plain data for the driver: outputs on the CPU, the calls the
ledger booked (as :class:`~commbench.patterns.base.Call` fields) and the per-sample times.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import astuple

import torch

from commbench.patterns.base import Call, Pattern
from commbench.patterns.device import device_guard
from commbench.patterns.judge import judge
from commbench.patterns.registry import get
from commbench.runtime.errors import SPMDError
from commbench.timing.loop import timed
from commbench.verdict import Verdict
from commbench.wire.posts import recording

__all__ = ["booked_calls", "check", "run_pattern"]


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

    pattern = get(name)
    pattern.check(cfg, ctx.size, variant)  # before any collective: one line, value and rule
    parts = pattern.parts_for(broken)
    groups = pattern.groups(ctx, cfg)
    local = pattern.shard(cfg, pattern.inputs(cfg, seed, ctx.device), groups, variant, parts)

    def step() -> dict:
        return pattern.step(ctx, cfg, local, variant, groups, parts)

    checked = device_guard(ctx.device) if guard else contextlib.nullcontext()
    with checked, recording(ctx) as posts:
        out, entries, span = _traced(ctx, step)
    stats: list = []
    times: list[float] = []
    first = out.get("stats")
    if iters:
        comm = ctx.comm()
        times = timed(lambda: stats.append(step().get("stats")),
                      lambda: comm.backend.barrier(ctx.world), iters, warmup,
                      ctx.device.type == "cuda")
        # the trace's step: a warm one (the first pays the transport's lazy connections)
        traced, trace_entries, span = _traced(ctx, step)
        first = traced.get("stats")
    else:
        trace_entries = entries
    return {"outputs": _cpu(out), "ledger": booked_calls(entries), "times": times,
            "posts": posts.export(),  # the first step's, for commbench.wire.nccl_rules
            "timeline": [tuple(e) for e in trace_entries],  # the traced step's calls, timed
            "span": span, "span_stats": first,  # its start and end here, its own stats
            "stats": stats[warmup:], "groups": {k: g.ranks for k, g in groups.items()}}


def _traced(ctx, step) -> tuple[dict, list, tuple[float, float]]:
    """One step with the ranks started together (an unbooked barrier): its result, its booked
    entries and its (start, end) on this rank."""
    if ctx.backend or ctx.mpi is not None:
        ctx.comm().backend.barrier(ctx.world)
    with ctx.ledger.capture() as cap:
        t0 = time.perf_counter()
        out = step()
        span = (t0, time.perf_counter())
    return out, list(cap.entries), span


def check(world, pattern: Pattern, cfg, variant: str, seed: int, broken: str | None = None,
          guard: bool = True) -> Verdict:
    """Run ``variant`` (or a broken variant of it) on ``world`` and judge it; with ``guard``
    (default) a tensor the pattern makes off the world's device is an error. The
    :class:`~commbench.verdict.Verdict` must be read."""
    try:
        outs = world.run(run_pattern, pattern.name, cfg, variant, seed, broken, 0, 0, guard)
    except SPMDError as exc:  # a rank raised: the run itself is wrong (a hang still raises)
        return Verdict([f"the run failed: {str(exc).splitlines()[0]}"],
                       f"check of {pattern.name}/{variant}")

    return judge(pattern, cfg, variant, seed, outs)
