"""Booked calls as a Chrome trace: the JSON that Perfetto and chrome://tracing open.

One track per rank (a process named "rank r"), one complete event ("ph": "X") per call with its
op, group, elements, booked and tensor bytes, reduction, phase and module; the gaps between a
rank's calls are its computation. Times are microseconds from the first call of the trace; the
ranks of one host share its monotonic clock (``time.perf_counter``), so their tracks line up.
"""

from __future__ import annotations

from commbench.wire.ledger import Entry

__all__ = ["chrome_trace"]


def chrome_trace(runs: list[tuple[str, list[list[tuple]]]]) -> dict:
    """``runs``: (label, every rank's entries as tuples) per run; a run's label goes with each
    of its events (``args.run``)."""
    entries = [(label, rank, Entry(*t)) for label, per_rank in runs
               for rank, es in enumerate(per_rank) for t in es]
    ranks = max((len(per_rank) for _, per_rank in runs), default=0)
    t0 = min((e.start for _, _, e in entries), default=0.0)
    events = [{"name": "process_name", "ph": "M", "pid": r, "tid": 0,
               "args": {"name": f"rank {r}"}} for r in range(ranks)]
    events += [{"name": e.op, "cat": e.phase or "call", "ph": "X", "pid": rank, "tid": 0,
                "ts": (e.start - t0) * 1e6, "dur": e.seconds * 1e6,
                "args": {"run": label, "group": list(e.group), "axis": e.axis, "dtype": e.dtype,
                         "elements": e.count, "sent_bytes": e.sent, "tensor_bytes": e.nbytes or None,
                         "redop": e.redop, "phase": e.phase, "module": e.module}}
               for label, rank, e in entries]
    return {"traceEvents": events, "displayTimeUnit": "ms"}
