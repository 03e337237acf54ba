"""The audit's booked calls as Kineto-shaped traces, one per rank (pure).

gloo's own profiler trace has no ``record_param_comms`` and no message sizes, so the audit
writes what an NCCL job's trace would hold for the same calls: one ``record_param_comms`` CPU op
per call with torch's argument names (``Collective name``, ``In msg nelems``, ``Out msg
nelems``, ``dtype``, ``Group size``, ``Process Group Name``/``Ranks``, ``Seq``, ``In split
size``/``Out split size``, ``Rank``: a point-to-point call's peer in its group), the host times
of the calls, ``ProfilerStep#N`` around the calls of each step the script marked, and
``distributedInfo`` with every group's ranks. :mod:`commbench.traces.kineto` reads them back.
"""

from __future__ import annotations

import json

from commbench.ops import OPS
from commbench.traces.calls import DTYPES
from commbench.wire.ledger import Entry
from commbench.wire.steps import step_of

__all__ = ["NAMES", "kineto_traces"]

# commbench's op -> the Collective name torch 2.13 records for it (the first of Names.torch)
NAMES = {o.name: o.names.torch[0] for o in OPS.values() if o.names.torch}
TORCH_DTYPES = {name: key for key, (name, _) in DTYPES.items()}


def _elems(e: Entry) -> tuple[int, int]:
    if OPS[e.op].split and e.splits:
        return sum(e.splits[0]), sum(e.splits[1])
    return OPS[e.op].call_elems(e.count, len(e.group))


def kineto_traces(per_rank: list[list[tuple]]) -> list[dict]:
    """One Kineto-shaped document per rank for the booked ``per_rank`` entries."""
    entries = [[Entry._make(t) for t in es] for es in per_rank]
    backend = next((e.transport for es in entries for e in es), "gloo")
    groups = sorted({e.group for es in entries for e in es if e.group})
    names = {g: str(k) for k, g in enumerate(groups)}
    pg_config = [{"pg_name": names[g], "pg_desc": "", "backend_config": backend,
                  "pg_size": len(g), "ranks": list(g)} for g in groups]
    docs = []
    for rank, es in enumerate(entries):
        events: list[dict] = [{"ph": "M", "name": "process_name", "pid": rank, "tid": 0,
                               "args": {"name": f"rank {rank}"}}]
        seqs: dict[tuple, int] = {}
        steps: dict[int, list[float]] = {}
        for k, e in enumerate(es):
            if e.op not in NAMES:
                continue
            n_in, n_out = _elems(e)
            args = {"Collective name": NAMES[e.op], "In msg nelems": n_in,
                    "Out msg nelems": n_out, "Group size": len(e.group),
                    "dtype": TORCH_DTYPES.get(e.dtype, e.dtype),
                    "In split size": json.dumps(list(e.splits[0]) if e.splits else []),
                    "Out split size": json.dumps(list(e.splits[1]) if e.splits else []),
                    "Process Group Name": names[e.group], "Process Group Description": e.axis,
                    "Process Group Ranks": json.dumps(list(e.group)), "External id": k + 1}
            if e.op in ("send", "isend", "recv", "irecv"):
                if e.peer in e.group:
                    args["Rank"] = e.group.index(e.peer)
            else:
                args["Seq"] = seqs.get(e.group, 0)
                seqs[e.group] = args["Seq"] + 1
            ts, dur = e.start * 1e6, e.seconds * 1e6
            events.append({"ph": "X", "cat": "cpu_op", "name": "record_param_comms",
                           "pid": rank, "tid": 1, "ts": ts, "dur": dur, "args": args})
            if step_of(e.scope):
                steps.setdefault(step_of(e.scope), []).extend([ts, ts + dur])
        for n, ts in sorted(steps.items()):
            events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{n}",
                           "pid": rank, "tid": 1, "ts": min(ts), "dur": max(ts) - min(ts) + 1})
        docs.append({"schemaVersion": 1, "deviceProperties": [],
                     "distributedInfo": {"backend": backend, "rank": rank,
                                         "world_size": len(entries), "pg_count": len(groups),
                                         "pg_config": pg_config},
                     "traceEvents": events, "displayTimeUnit": "ms"})
    return docs
