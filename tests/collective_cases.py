"""SPMD case functions and deliberately broken variants shared by the collective property tests.

Each case runs on every rank and returns what the driver needs to judge it: this rank's result
(or the error it raised), the bytes the ledger counted and, for algorithms, the bytes predicted.
A ``mutant`` name makes the rank run a broken variant instead, for the negative tests.
"""

from __future__ import annotations

import torch

from commbench.collectives import ALGORITHMS
from commbench.timing import verify
from commbench.wire.comm import Comm
from commbench.wire.dtypes import DTYPES


class CorruptingComm(Comm):
    """Member 0 adds one to the first element of every message it sends."""

    @staticmethod
    def _corrupt(x, group):
        if group.index == 0 and x.numel():
            x = x.clone()
            x.view(-1)[0] += 1
        return x

    def isend(self, x, group, peer, *, tag=0):
        return super().isend(self._corrupt(x, group), group, peer, tag=tag)

    def exchange(self, sends, recvs, group, *, tag=0):
        sends = [(self._corrupt(x, group), peer) for x, peer in sends]
        return super().exchange(sends, recvs, group, tag=tag)


class ShiftedRootComm(Comm):
    """Broadcasts from the wrong root: the next member."""

    def broadcast(self, x, group, *, root=0, inplace=False):
        return super().broadcast(x, group, root=(root + 1) % group.size, inplace=inplace)


class ReversedSplitsComm(Comm):
    """All-to-all that sends its blocks in reverse member order (a wrong permutation)."""

    inner = False

    def all_to_all(self, x, group, in_splits=None, out_splits=None):
        if self.inner:  # the count exchange inside the real call stays correct
            return super().all_to_all(x, group, in_splits, out_splits)
        n = group.size
        splits = in_splits or [x.shape[0] // n] * n
        blocks = list(torch.split(x, splits))[::-1]
        self.inner = True
        try:
            return super().all_to_all(torch.cat(blocks), group, splits[::-1], out_splits)
        finally:
            self.inner = False


def _comm(ctx, transport: str, mutant: str | None) -> Comm:
    base = ctx.comm(transport)
    cls = {"corrupt": CorruptingComm, "wrong_root": ShiftedRootComm,
           "wrong_permutation": ReversedSplitsComm}.get(mutant or "")
    return cls(base.backend, base.ledger, base.tracker, device=base.device) if cls else base


def native_case(ctx, transport, op, count, dtype, redop, root, inplace, seed, mutant=None):
    """One native collective through the comm layer; the result or the error's message."""
    comm, g, n, r = _comm(ctx, transport, mutant), ctx.world, ctx.size, ctx.rank
    dt = DTYPES[dtype]
    root %= n
    x = verify.seeded(seed, r, count * (n if op in ("reduce_scatter", "all_to_all") else 1), dt,
                       redop)
    try:
        if op == "all_reduce":
            y = comm.all_reduce(x, g, op=redop, inplace=inplace)
            if inplace and y is not x:
                return "inplace all_reduce returned a new tensor"
        elif op == "reduce_scatter":
            y = comm.reduce_scatter(x, g, op=redop)
        elif op == "all_gather":
            y = comm.all_gather(x, g)
        elif op == "all_to_all":
            y = comm.all_to_all(x, g)
        elif op == "broadcast":
            y = comm.broadcast(x, g, root=root, inplace=inplace)
        elif op == "reduce":
            y = comm.reduce(x, g, root=root, op=redop)
        elif op == "gather":
            y = comm.gather(x, g, root=root)
        elif op == "scatter":
            src = verify.seeded(seed, r, count * n, dt, redop) if r == root else x
            y = comm.scatter(src, g, root=root)
        else:
            raise ValueError(op)
    except ValueError as exc:
        return f"ValueError: {exc}"
    return y


def alltoallv_case(ctx, transport, splits, row, seed, mutant=None):
    """Uneven all-to-all: member i sends ``splits[i][j]`` rows of width ``row`` to member j."""
    comm, g, r = _comm(ctx, transport, mutant), ctx.world, ctx.rank
    mine = splits[r]
    x = verify.seeded(seed, r, sum(mine) * row, torch.int32).reshape(sum(mine), row)
    return comm.all_to_all(x, g, mine)  # counts exchanged first


def algorithm_case(ctx, transport, op, algo, count, dtype, redop, root, seed, mutant=None,
                   random_floats=False):
    """One algorithm built from send/recv: (result, (sent, recv) counted, (sent, recv) predicted)."""
    comm, g, n, r = _comm(ctx, transport, mutant), ctx.world, ctx.size, ctx.rank
    dt = DTYPES[dtype]
    total = count * n if op in ("reduce_scatter", "all_to_all") else count
    if random_floats:  # arbitrary values: sums are inexact, so agreement must come from the schedule
        gen = torch.Generator().manual_seed(seed * 1000 + r)
        x = torch.randn(total, generator=gen, dtype=torch.float64).to(dt)
    else:
        x = verify.seeded(seed, r, total, dt, redop)
    record = ALGORITHMS[(op, algo)]
    splits = [count] * n if op == "all_to_all" else None
    declared = mutant if mutant in {b.name for b in record.broken} else None
    run = record.bind(ctx, comm, x, root=root % n, redop=redop, splits=splits, broken=declared)
    with ctx.ledger.capture() as cap:
        y = run()
    pred = record.bytes(n, g.index, total, dt.itemsize, root=root % n, in_splits=splits,
                        out_splits=splits)
    return y, (cap.sent, cap.recv), pred
