"""SPMD cases for the compiled schedules: compiled against the reference path, replay, refusals."""

from __future__ import annotations

from unittest import mock

import torch
from collective_cases import _miscombine_on_member_0

from commbench.collectives import ALGORITHMS
from commbench.collectives.compiled import reduce as reduce_mod
from commbench.collectives.compiled import schedule as schedule_mod
from commbench.collectives.compiled import steps as steps_mod
from commbench.collectives.compiled.schedule import Compiled
from commbench.collectives.compiled.steps import step_list


def _short_pieces(lo, hi, seg):
    """A broken split: the last piece of a split message is never sent nor received."""
    out = _PIECES(lo, hi, seg)
    return out[:-1] if len(out) > 1 else out


_PIECES = schedule_mod.pieces
_TINY = reduce_mod.tiny_reducer
_LIKE = schedule_mod.like


def _poisoned_like(buf, count):
    """Scratch as the compiled path allocates it, filled with NaN: a dropped piece leaves what
    the scratch held, and uninitialised memory may still hold the very bytes the reference path
    just received (the allocator hands the same block back), so it must not pass for data."""
    out = _LIKE(buf, count)
    if out.dtype.is_floating_point:
        out.fill_(float("nan"))
    return out


def tiny_first_only(op, a, b):
    """A broken tiny reduction: the second element is never combined."""
    return _TINY(op, a[:1], b[:1])


def compiled_vs_reference(ctx, transport, algo, count, dtype, redop, seed, mutant=None,
                          segment=None, wait=None):
    """(reference result, compiled result) for arbitrary values (inexact sums); ``segment``:
    bytes per piece of the compiled path's MPI messages, ``wait``: how it waits for them (None:
    its defaults)."""
    comm, g, r = ctx.comm(transport), ctx.world, ctx.rank
    gen = torch.Generator().manual_seed(seed * 1000 + r)
    x = (torch.randn(count, generator=gen, dtype=torch.float64) * 3).to(getattr(torch, dtype))
    ref = ALGORITHMS[("all_reduce", algo)].fn(comm, x, g, op=redop)
    patch = mock.patch.dict(steps_mod.SCHEDULES, {algo: _miscombine_on_member_0(
        steps_mod.SCHEDULES[algo])}) if mutant == "corrupt" else mock.patch.dict({})
    if mutant == "short_pieces":
        patch = mock.patch.multiple(schedule_mod, pieces=_short_pieces, like=_poisoned_like)
    if mutant == "tiny_first_only":
        patch = mock.patch.object(reduce_mod, "tiny_reducer", tiny_first_only)
    with patch:
        got = ALGORITHMS[("all_reduce", f"{algo}_compiled")].fn(comm, x, g, op=redop, segment=segment,
                                                              wait=wait)
    return ref, got


def messages(ctx, transport, algo, count, segment):
    """The messages one compiled call books, with ``segment`` and with whole messages."""
    comm, g = ctx.comm(transport), ctx.world
    out = []
    for seg in (segment, 0):
        buf = torch.zeros(count)
        with Compiled(comm, buf, g, step_list(algo, g.size, g.index, count), "sum", algo,
                      seg) as c:
            out.append(c.messages())
    return out


def replay(ctx, transport, algo, count, times):
    """Compile once, run ``times`` times from the same input: every run's result, messages booked."""
    comm, g, r = ctx.comm(transport), ctx.world, ctx.rank
    x = torch.arange(count, dtype=torch.int64) * (r + 1)
    buf = x.clone()
    outs = []
    with ctx.ledger.capture() as cap, \
            Compiled(comm, buf, g, step_list(algo, g.size, g.index, count), "sum", algo) as c:
        for _ in range(times):
            buf.copy_(x)
            c.run()
            c.book()
            outs.append(buf.clone())
    return outs, len(cap.entries), len(c.messages())


def refusal(ctx, transport, algo, op, dtype):
    """The error a bad compiled call raises on this rank, before anything is sent."""
    comm, g = ctx.comm(transport), ctx.world
    try:
        ALGORITHMS[("all_reduce", f"{algo}_compiled")].fn(comm, torch.ones(5, dtype=dtype), g, op=op)
    except ValueError as exc:
        return str(exc)
    return None
