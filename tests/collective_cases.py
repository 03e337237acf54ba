"""The one judge of a collective (native or an algorithm's record) and the SPMD case it runs.

:func:`judge` runs :func:`collective_case` on every rank and returns every problem it finds
(empty: all good), as the patterns' ``check`` does:

* ``values="exact"``: inputs are :mod:`commbench.timing.verify` patterns (small integers, exact in
  every dtype), so each rank's result must equal the oracle element for element; the bytes the
  ledger counted must equal the record's formula; a dtype/reduction the transport cannot do must
  be refused with its rule on every rank, never answered wrong;
* ``values="random"``: arbitrary floats, whose sums are inexact: every rank of an all-reduce must
  hold bitwise the same result (the schedule, not luck, makes them agree), and a compiled
  schedule bitwise the result of the algorithm it compiles;
* in both, an all-reduce leaves every rank bitwise equal.

``broken`` names a deliberately broken variant: one its record declares (its parts replaced),
or a wrong comm layer standing in for the transport (``corrupt``, ``wrong_root``,
``wrong_permutation``), for the negative tests. A world the algorithm cannot run on is an error
in the judge: a test skips it by name (:func:`skip_unless_runs`) or draws another example
(``assume(runs(...))``), never passes by doing nothing.
"""

from __future__ import annotations

import pytest
import torch

from commbench.collectives import ALGORITHMS
from commbench.ops import OPS, split_sizes
from commbench.timing import verify
from commbench.verdict import Verdict
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


WRONG_COMMS = {"corrupt": CorruptingComm, "wrong_root": ShiftedRootComm,
               "wrong_permutation": ReversedSplitsComm}


def _comm(ctx, transport: str, broken: str | None) -> Comm:
    base = ctx.comm(transport)
    cls = WRONG_COMMS.get(broken or "")
    return cls(base.backend, base.ledger, base.tracker, device=base.device) if cls else base


def _input(op: str, count: int, n: int, r: int, seed: int, dt, redop: str, values: str, splits,
           row: int) -> torch.Tensor:
    total = sum(splits[r]) * row if splits else count * (n if op in ("reduce_scatter",
                                                                   "all_to_all") else 1)
    if values == "random":  # arbitrary values: agreement must come from the schedule
        gen = torch.Generator().manual_seed(seed * 1000 + r)
        return (torch.randn(total, generator=gen, dtype=torch.float64) * 3).to(dt)
    x = verify.seeded(seed, r, total, dt, redop)
    return x.reshape(-1, row) if splits else x


def _native(comm, g, op, x, redop, root, inplace, splits, count, seed, dt):
    r, n = g.index, g.size
    if op == "all_reduce":
        y = comm.all_reduce(x, g, op=redop, inplace=inplace)
        if inplace and y is not x:
            return "inplace all_reduce returned a new tensor"
        return y
    if op == "reduce_scatter":
        return comm.reduce_scatter(x, g, op=redop)
    if op == "all_gather":
        return comm.all_gather(x, g)
    if op == "all_to_all":
        return comm.all_to_all(x, g, splits[r] if splits else None)  # uneven: counts exchanged
    if op == "broadcast":
        return comm.broadcast(x, g, root=root, inplace=inplace)
    if op == "reduce":
        return comm.reduce(x, g, root=root, op=redop)
    if op == "gather":
        return comm.gather(x, g, root=root)
    if op == "scatter":
        return comm.scatter(verify.seeded(seed, r, count * n, dt, redop) if r == root else x, g,
                            root=root)
    raise ValueError(op)


def collective_case(ctx, transport, op, algo, count, dtype, redop, root, seed, inplace=False,
                    values="exact", broken=None, splits=None, row=1, options=None) -> dict:
    """One call on this rank: its result (or the ValueError's message), the bytes the ledger
    counted, the bytes its record predicts (algorithms) and, for a compiled schedule, the
    result of the algorithm it compiles on the same input."""
    comm, g, n, r = _comm(ctx, transport, broken), ctx.world, ctx.size, ctx.rank
    dt, root = DTYPES[dtype], root % n
    x = _input(op, count, n, r, seed, dt, redop, values, splits, row)
    record = ALGORITHMS[(op, algo)]
    out = {"predicted": None, "reference": None}
    try:
        with ctx.ledger.capture() as cap:
            if algo == "native":
                y = _native(comm, g, op, x, redop, root, inplace, splits, count, seed, dt)
            else:
                declared = broken if broken in {b.name for b in record.broken} else None
                even = [count] * n if op == "all_to_all" else None
                y = record.bind(ctx, comm, x, root=root, redop=redop, splits=even,
                                broken=declared, **(options or {}))()
                out["predicted"] = record.bytes(n, g.index, x.numel(), dt.itemsize, root=root,
                                                in_splits=even, out_splits=even)
    except ValueError as exc:
        return {**out, "y": f"ValueError: {exc}", "counted": None}
    if record.compiled and values == "random":
        out["reference"] = ALGORITHMS[(op, record.compiled)].function(ctx.comm(transport), x, g,
                                                                op=redop)
    return {**out, "y": y, "counted": (cap.sent, cap.recv)}


def _refusal(op: str, transport: str, dtype: str, redop: str) -> str | None:
    """The rule a call must be refused with on every rank, if any."""
    if OPS[op].reduces and redop == "avg" and not DTYPES[dtype].is_floating_point:
        return "avg needs a floating dtype"
    if transport == "mpi" and dtype == "bfloat16" and OPS[op].reduces:
        return "MPI has no reduction"
    return None


def _want(op, seed, r, n, count, dt, redop, root, splits, row):
    if splits:  # every sender's rows for this rank, in sender order
        rows = [verify.seeded(seed, j, sum(splits[j]) * row, dt, redop).reshape(-1, row)
                for j in range(n)]
        return torch.cat([rows[j][sum(splits[j][:r]):sum(splits[j][:r + 1])] for j in range(n)])
    if op == "reduce_scatter":  # member r keeps chunk r of split_sizes(total, n)
        total, c = count * n, split_sizes(count * n, n)
        full = verify.expected("all_reduce", seed, r, n, total, dt, redop)
        return full[sum(c[:r]):sum(c[: r + 1])]
    total = count * n if op in ("all_to_all", "scatter") else count
    return verify.expected(op, seed, r, n, total, dt, redop, root)


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.reshape(-1).view(torch.uint8) if t.numel() else t.reshape(-1)


def runs(op: str, algo: str, n: int) -> bool:
    """Whether ``op``/``algo`` runs on ``n`` ranks."""
    return not ALGORITHMS[(op, algo)].needs(n)


def skip_unless_runs(op: str, algo: str, n: int) -> None:
    """Skip, saying why, where ``op``/``algo`` cannot run on ``n`` ranks."""
    why = ALGORITHMS[(op, algo)].needs(n)
    if why:
        pytest.skip(f"{op}/{algo} at {n} ranks: {why}")


def judge(world, transport, op, algo="native", *, count, dtype="float32", redop="sum", root=0,
          seed=0, inplace=False, values="exact", broken=None, splits=None, row=1,
          **options) -> Verdict:
    """Every problem of one call of ``op``/``algo`` on every rank of ``world`` (module
    docstring), a :class:`~commbench.verdict.Verdict` the test must read; ``options`` go to the
    algorithm (a compiled schedule's ``segment``, ``wait``)."""
    return Verdict(_problems(world, transport, op, algo, count=count, dtype=dtype, redop=redop,
                             root=root, seed=seed, inplace=inplace, values=values, broken=broken,
                             splits=splits, row=row, **options), f"judge of {op}/{algo}")


def _problems(world, transport, op, algo, *, count, dtype, redop, root, seed, inplace, values,
              broken, splits, row, **options) -> list[str]:
    n = world.size
    why = ALGORITHMS[(op, algo)].needs(n)
    if why:
        raise ValueError(f"{op}/{algo} does not run at {n} ranks ({why}): skip or assume first")
    outs = world.run(collective_case, transport, op, algo, count, dtype, redop, root, seed,
                     inplace, values, broken, splits, row, options)
    what = f"{op}/{algo} ({transport}, {dtype}, {redop}, count {count}, root {root % n})"
    rule = _refusal(op, transport, dtype, redop)
    if rule is not None and algo == "native":
        ok = all(isinstance(o["y"], str) and rule in o["y"] for o in outs)
        return [] if ok else [f"{what}: not refused ({rule}): {outs[0]['y']!r}"]
    problems = [f"rank {r}: {o['y']}" for r, o in enumerate(outs) if isinstance(o["y"], str)]
    if problems:
        return problems
    dt = DTYPES[dtype]
    for r, o in enumerate(outs):
        if values == "exact":
            got = o["y"].reshape(-1) if o["y"] is not None and not splits else o["y"]
            bad = verify.wrong(got, _want(op, seed, r, n, count, dt, redop, root % n,
                                          splits, row))
            if bad:
                problems.append(f"rank {r}: {bad} wrong elements in {what}")
        if o["predicted"] is not None and o["counted"] != o["predicted"]:
            problems.append(f"rank {r}: ledger counted {o['counted']} bytes, formula says "
                            f"{o['predicted']} ({what})")
        if values == "random" and o["reference"] is not None and \
                not torch.equal(_bits(o["y"]), _bits(o["reference"])):
            problems.append(f"rank {r}: {what} differs bitwise from the algorithm it compiles")
    if op == "all_reduce" and any(not torch.equal(_bits(o["y"]), _bits(outs[0]["y"]))
                                  for o in outs):
        problems.append(f"{what}: ranks differ bitwise")
    return problems
