"""SPMD cases for the compiled schedules: compiled against the reference path, replay, refusals."""

from __future__ import annotations

import torch

from commbench.collectives import ALGORITHMS
from commbench.collectives.compiled.schedule import Compiled
from commbench.collectives.compiled.steps import step_list


def messages(ctx, transport, algo, count, segment, dtype="float32"):
    """The messages one compiled call books, with ``segment`` and with whole messages, and the
    ledger's (elements, bytes sent + received) of each booked message of the split call."""
    comm, g = ctx.comm(transport), ctx.world
    out = []
    for seg in (segment, 0):
        buf = torch.zeros(count, dtype=getattr(torch, dtype))
        with Compiled(comm, buf, g, step_list(algo, g.size, g.index, count), "sum", algo,
                      seg) as c:
            out.append(c.messages())
            if seg:
                with ctx.ledger.capture() as cap:
                    c.book()
                booked = [(e.count, e.sent + e.recv) for e in cap.entries]
    return out[0], out[1], booked


def waits(ctx, transport, algo, count, wait):
    """The wait modes a compiled call asked its waiter for, run once with ``wait``."""
    from dataclasses import replace

    from commbench.collectives.compiled.schedule import COMPILED
    from commbench.collectives.compiled.waiting import waiter

    asked: list[str] = []

    def recording(req, mode):
        asked.append(mode)
        return waiter(req, mode)

    comm, g = ctx.comm(transport), ctx.world
    buf = torch.ones(count)
    with Compiled(comm, buf, g, step_list(algo, g.size, g.index, count), "sum", algo, 0, wait,
                  replace(COMPILED, waiter=recording)) as c:
        c.run()
    return asked


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
    comm = ctx.comm(transport)
    try:
        ALGORITHMS[("all_reduce", f"{algo}_compiled")].bind(ctx, comm, torch.ones(5, dtype=dtype),
                                                            redop=op)()
    except ValueError as exc:
        return str(exc)
    return None
