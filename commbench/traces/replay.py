"""Re-issue a recorded job's calls on a world, timed (``commbench replay``).

Every rank makes every recorded group, in one sorted order (a group is made by the whole world
at once), then walks its own calls in the recorded order. A collective runs once through the
checked comm API (booked: the entry the recording is checked against), then ``warmup + iters``
times as the sweep times it (:func:`commbench.timing.loop.timed`: the transport's barrier on
the call's group before each sample, the bare transport call timed). Consecutive point-to-point
calls of a rank on one group are posted as one group call (NCCL's ``ncclGroupStart``/``End``,
torch's ``batch_isend_irecv``), timed as one unit without a barrier (their peers differ).
"""

from __future__ import annotations

from dataclasses import astuple

import torch

from commbench.ops import bufferless
from commbench.timing.loop import timed
from commbench.timing.native import PREPARE, prepare_native
from commbench.traces.calls import P2P
from commbench.traces.recorded import Rec
from commbench.wire.dtypes import DTYPES
from commbench.wire.ledger import Entry

__all__ = ["BROKEN", "mismatches", "replay_rank", "units"]

BOOKED_AS = {"isend": "send", "irecv": "recv"}
# replays broken on purpose, by name: the ledger check must catch each (tests/test_replay.py)
BROKEN = {"every buffer float32": {"dtype": "float32"},
          "all-gather issued as all-reduce": {"op": {"all_gather": "all_reduce"}}}


def units(recs: list[Rec]) -> list[list[Rec]]:
    """Each collective alone; runs of point-to-point calls on one group together."""
    out: list[list[Rec]] = []
    for r in recs:
        if r.op in P2P and out and out[-1][0].op in P2P and out[-1][0].group == r.group:
            out[-1].append(r)
        else:
            out.append([r])
    return out


def _tensor(r: Rec, count: int, device, broken: dict | None = None) -> torch.Tensor:
    dtype = DTYPES.get((broken or {}).get("dtype", r.dtype), torch.uint8)
    return torch.ones(count, dtype=dtype, device=device)


def _collective(ctx, comm, g, r: Rec, broken: dict):
    """(the checked first call, the bare call to time, the element count booked)."""

    dev = ctx.device
    if bufferless(r.op):
        return (lambda: comm.barrier(g)), (lambda: comm.backend.barrier(g))
    if r.op == "all_to_all" and r.in_splits and (len(set(r.in_splits)) > 1 or
                                                 len(set(r.out_splits)) > 1):
        x = _tensor(r, sum(r.in_splits), dev)  # splits fix the size: never broken
        ins, outs = list(r.in_splits), list(r.out_splits)
        fn = lambda: comm.all_to_all(x, g, ins, outs)  # noqa: E731
        return fn, fn
    if r.op not in PREPARE:
        raise ValueError(f"{r.op}: not replayed")
    x = _tensor(r, r.count, dev, broken)
    op = broken.get("op", {}).get(r.op, r.op)
    prep = prepare_native(comm, g, op, r.redop if r.redop in ("sum", "max", "min") else "sum",
                          0, x, r.count)
    return prep.first, prep.call


def _p2p(comm, g, unit: list[Rec], device, broken: dict):
    sends = [(_tensor(r, r.count, device, broken), g.ranks.index(r.peer))
             for r in unit if r.op == "send"]
    recvs = [(_tensor(r, r.count, device, broken), g.ranks.index(r.peer))
             for r in unit if r.op == "recv"]
    if len(unit) == 1:  # one message alone, as recorded
        r, (t, peer) = unit[0], (sends or recvs)[0]
        fn = (lambda: comm.send(t, g, peer)) if r.op == "send" else (lambda: comm.recv(t, g, peer))
        return fn
    return lambda: comm.exchange(sends, recvs, g)


def replay_rank(ctx, plan: dict[int, list[Rec]], iters: int, warmup: int,
                broken: str = "") -> list[dict]:
    """On a rank: its recorded calls re-issued; per unit its booked entries and its times
    (``broken``: a name of :data:`BROKEN`)."""

    bent = BROKEN[broken] if broken else {}
    comm = ctx.comm()
    # every group of every rank, one-rank groups too: making a group is collective, so every
    # rank makes the same ones in the same order
    groups = sorted({r.group for recs in plan.values() for r in recs})
    made = {g: ctx.group(g) for g in groups}
    cuda = ctx.device.type == "cuda"
    out = []
    for k, unit in enumerate(units(plan.get(ctx.rank, []))):
        r = unit[0]
        g = made[r.group]
        where = f"replay call {k} ({r.op} on ranks {list(r.group)})"
        ctx.tracker.enter(where, g.ranks)
        if r.op in P2P:
            first = call = _p2p(comm, g, unit, ctx.device, bent)
            barrier = _none
        else:
            first, call = _collective(ctx, comm, g, r, bent)
            be = comm.backend
            barrier = be.barrier_call(g)
        with ctx.ledger.capture() as cap:
            first()
        times = timed(call, barrier, iters, warmup, cuda,
                      progress=lambda i, n, w=where: ctx.tracker.progress(w, i, n))
        ctx.tracker.leave(r.op)
        out.append({"unit": k, "recs": [astuple(x) for x in unit],
                    "booked": [tuple(e) for e in cap.entries], "times": times})
    return out


def _none() -> None:
    return None


def mismatches(unit: dict) -> list[str]:
    """What the booked entries of one unit say that its recorded calls do not."""
    recs = [Rec(*t) for t in unit["recs"]]
    booked = [Entry._make(t) for t in unit["booked"]]
    got = sorted((BOOKED_AS.get(e.op, e.op), e.group, "" if bufferless(e.op) else e.dtype,
                  e.count, e.peer if e.op in ("isend", "irecv", "send", "recv") else -1)
                 for e in booked)
    want = sorted((r.op, r.group if len(r.group) > 1 else got[0][1] if got else r.group,
                   "" if bufferless(r.op) else r.dtype, 0 if bufferless(r.op) else r.count,
                   r.peer if r.op in P2P else -1) for r in recs)
    if got == want:
        return []
    return [f"recorded {want}, booked {got}"]
