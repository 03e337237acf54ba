"""Booked calls as a Chrome trace: the JSON that Perfetto and chrome://tracing open.

One track per rank (a process named "rank r"), one complete event ("ph": "X") per call with its
op, group, elements, booked and tensor bytes, reduction, phase and module; the gaps between a
rank's calls are its computation. Where a run gives each rank's step (start, end), a ``step``
slice holds that rank's calls, and :func:`idle_fraction` reads the step's idle share off the
trace: the time in blocking calls over the slowest rank's step (the pipeline's bubble). Times
are microseconds from the first event of the trace; the ranks of one host share its monotonic
clock (``time.perf_counter``), so their tracks line up.

On NCCL a call returns once its kernel is queued on the GPU: the host time of a slice is then
its enqueue time, not its run time (``args.host_time``: "enqueue"), and the GPU's own duration
is ``device_us`` where NCCL reported it (``TORCH_NCCL_ENABLE_TIMING``).
"""

from __future__ import annotations

from commbench.wire.ledger import Entry

__all__ = ["chrome_trace", "idle_fraction"]

# their booked time runs from the post to the wait, over computation: not idle
NONBLOCKING = ("isend", "irecv")


def chrome_trace(runs: list[tuple]) -> dict:
    """``runs``: (label, every rank's entries as tuples[, every rank's step (start, end)]) per
    run; a run's label goes with each of its events (``args.run``)."""
    entries = [(label, rank, Entry(*t)) for label, per_rank, *_ in runs
               for rank, es in enumerate(per_rank) for t in es]
    spans = [(label, rank, span) for label, _, *rest in runs if rest
             for rank, span in enumerate(rest[0])]
    ranks = max((len(per_rank) for _, per_rank, *_ in runs), default=0)
    t0 = min([e.start for _, _, e in entries] + [sp[0] for _, _, sp in spans], default=0.0)
    events = [{"name": "process_name", "ph": "M", "pid": r, "tid": 0,
               "args": {"name": f"rank {r}"}} for r in range(ranks)]
    events += [{"name": e.op, "cat": e.phase or "call", "ph": "X", "pid": rank, "tid": 0,
                "ts": (e.start - t0) * 1e6, "dur": e.seconds * 1e6,
                "args": {"run": label, "group": list(e.group), "axis": e.axis, "dtype": e.dtype,
                         "elements": e.count, "sent_bytes": e.sent, "tensor_bytes": e.nbytes or None,
                         "redop": e.redop, "phase": e.phase, "module": e.module,
                         "device_us": e.device_seconds * 1e6 or None,
                         "host_time": "enqueue" if e.transport == "nccl" else "call"}}
               for label, rank, e in entries]
    events += [{"name": "step", "cat": "step", "ph": "X", "pid": rank, "tid": 0,
                "ts": (sp[0] - t0) * 1e6, "dur": (sp[1] - sp[0]) * 1e6, "args": {"run": label}}
               for label, rank, sp in spans]
    return {"traceEvents": events, "displayTimeUnit": "ms"}


def idle_fraction(trace: dict, run: str) -> float:
    """The mean over ranks of the time in blocking calls (all but isend/irecv) plus the wait
    for the slowest rank, over the slowest rank's step: 1 - computation / step, as the
    pipeline's bubble is defined, read off ``run``'s step and call slices."""
    mine = [e for e in trace["traceEvents"] if e.get("ph") == "X" and e["args"].get("run") == run]
    steps = {e["pid"]: e["dur"] for e in mine if e["name"] == "step"}
    if not steps:
        raise ValueError(f"run {run!r}: no step slices in the trace")
    wall = max(steps.values())
    idle = dict.fromkeys(steps, 0.0)
    for e in mine:
        if e["cat"] != "step" and e["name"] not in NONBLOCKING:
            idle[e["pid"]] += e["dur"]
    return sum(idle[r] + wall - steps[r] for r in steps) / (len(steps) * wall)
