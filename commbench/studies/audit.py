"""Audit a user's own training step: every torch.distributed call it makes, booked by the
watcher (:mod:`commbench.wire.watch`), summed per group and per module.

``audit(step, *args)`` runs ``step(*args)`` on this rank under the watcher and returns the
booked entries; :func:`run_script` runs a whole script that way (as ``python SCRIPT ARGS``
would, on a rank whose process group is already up: the script's own
``init_process_group`` and ``destroy_process_group`` are skipped); :func:`tables` turns every
rank's entries into the rows ``commbench audit`` prints and writes.
"""

from __future__ import annotations

import contextlib
import runpy
import sys
from collections.abc import Callable

from commbench.wire.ledger import Entry, Ledger

__all__ = ["audit", "audit_markdown", "run_script", "tables"]


def audit(step: Callable, *args, ledger: Ledger | None = None, **kwargs) -> list[Entry]:
    """Run ``step(*args, **kwargs)`` under the watcher; the entries it booked on this rank."""
    from commbench.wire.watch import watch

    ledger = ledger or Ledger()
    with watch(ledger), ledger.capture() as cap:
        step(*args, **kwargs)
    return list(cap.entries)


@contextlib.contextmanager
def _process_group_kept():
    """The script's init_process_group / destroy_process_group become no-ops while the rank's
    own world is up (a launcher's script calls them; the audit's world already did)."""
    import torch.distributed as dist

    if not dist.is_initialized():
        yield
        return
    saved = dist.init_process_group, dist.destroy_process_group
    dist.init_process_group = lambda *a, **k: None
    dist.destroy_process_group = lambda *a, **k: None
    try:
        yield
    finally:
        dist.init_process_group, dist.destroy_process_group = saved


def run_script(ctx, path: str, argv: list[str]) -> list[tuple]:
    """On a rank: ``path`` run as ``__main__`` with ``argv`` under the watcher; its entries as
    plain tuples (``Entry`` fields), for the driver."""
    saved = sys.argv
    sys.argv = [path, *argv]
    try:
        with _process_group_kept():
            entries = audit(runpy.run_path, path, run_name="__main__", ledger=ctx.ledger)
    finally:
        sys.argv = saved
    return [tuple(e) for e in entries]


def tables(per_rank: list[list[tuple]]) -> dict:
    """Per (group, op, dtype, redop, phase): calls, elements, bytes sent and tensor bytes on the
    busiest rank, host seconds summed over calls (slowest rank); per module: calls and bytes."""
    groups: dict[tuple, dict] = {}
    modules: dict[tuple, dict] = {}
    for entries in per_rank:
        mine: dict[tuple, dict] = {}
        by_module: dict[tuple, dict] = {}
        for t in entries:
            e = Entry(*t)
            key = (list(e.group), e.op, e.dtype, e.redop or "-", e.phase or "-")
            row = mine.setdefault(str(key), {"key": key, "calls": 0, "count": 0, "sent": 0,
                                             "nbytes": 0, "seconds": 0.0})
            row["calls"] += 1
            row["count"] += e.count
            row["sent"] += e.sent
            row["nbytes"] += e.nbytes
            row["seconds"] += e.seconds
            m = by_module.setdefault((e.module or "(no module)",), {"calls": 0, "sent": 0})
            m["calls"] += 1
            m["sent"] += e.sent
        for k, row in mine.items():
            best = groups.setdefault(k, dict(row, ranks=0))
            best["ranks"] += 1
            for f in ("calls", "count", "sent", "nbytes", "seconds"):
                best[f] = max(best[f], row[f]) if best["ranks"] > 1 else row[f]
        for k, m in by_module.items():
            best = modules.setdefault(k, dict(m))
            best["calls"], best["sent"] = max(best["calls"], m["calls"]), max(best["sent"], m["sent"])
    group_rows = [{"group": r["key"][0], "op": r["key"][1], "dtype": r["key"][2],
                   "redop": r["key"][3], "phase": r["key"][4], "calls": r["calls"],
                   "elements": r["count"], "sent": r["sent"], "tensor_bytes": r["nbytes"],
                   "seconds": r["seconds"], "ranks": r["ranks"]} for r in groups.values()]
    module_rows = [{"module": k[0], "calls": m["calls"], "sent": m["sent"]}
                   for k, m in sorted(modules.items())]
    return {"groups": group_rows, "modules": module_rows}


def audit_markdown(record: dict) -> str:
    from tabulate import tabulate

    from commbench.results.records import markdown

    head = markdown(dict(record, rows=[])).rstrip()
    groups = tabulate([[r["group"], r["op"], r["dtype"], r["redop"], r["phase"], r["calls"],
                        r["elements"], r["sent"], r["tensor_bytes"], f"{r['seconds'] * 1e6:.0f}"]
                       for r in record["rows"]["groups"]],
                      headers=["group", "op", "dtype", "redop", "phase", "calls", "elements",
                               "sent(B)", "tensor(B)", "host time(us)"], tablefmt="github")
    modules = tabulate([[r["module"], r["calls"], r["sent"]] for r in record["rows"]["modules"]],
                       headers=["module", "calls", "sent(B)"], tablefmt="github")
    return (f"{head}\n\nPer group (the busiest rank's figures; bytes sent as the ledger books "
            f"them, tensor bytes as the call passed them):\n\n{groups}\n\nPer module:\n\n"
            f"{modules}\n")

