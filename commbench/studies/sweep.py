"""Sweeps across sizes, driven from one process: one task per size, one printed line per result.

The driver sends :func:`commbench.collectives.measure.measure` to every rank for each size, aggregates the
samples (per-iteration max over ranks), prints the row at once in nccl-tests' layout and appends
it to the record, which is rewritten atomically after every row: an interrupted or failed sweep
keeps every row it finished.
"""

from __future__ import annotations

import statistics
from collections.abc import Callable

from commbench.collectives.measure import Case, measure
from commbench.names import ITEMSIZE
from commbench.ops import OPS, counts_for
from commbench.results import records as res
from commbench.results.busbw import algbw, busbw
from commbench.results.compare import WITNESSES
from commbench.timing.loop import slowest

__all__ = ["HEADER", "format_row", "merge_rounds", "pool_passes", "run_series"]

ALGO_WIDTH = 27  # the longest algorithm name (recursive_doubling_compiled): columns stay aligned
# column name, unit, width
_COLUMNS = [("op", "", 14), ("size", "(B)", 11), ("count", "(elems)", 10), ("type", "", 8),
            ("redop", "", 5), ("root", "", 4), ("algo", "", ALGO_WIDTH), ("transport", "", 9),
            ("time", "(us)", 10), ("p99", "(us)", 9), ("min", "(us)", 9), ("avg", "(us)", 9),
            ("max", "(us)", 9), ("algbw", "(GB/s)", 7), ("busbw", "(GB/s)", 7),
            ("#wrong", "", 6), ("sent", "(B)", 11), ("pred", "(B)", 11)]
# nccl-tests' two header lines: the names, then the units; '#' starts both
HEADER = "\n".join("#" + " ".join(f"{text:>{w}}" for text, w in line)[1:]
                   for line in ([(c, w) for c, _, w in _COLUMNS], [(u, w) for _, u, w in _COLUMNS]))


def format_row(row: dict) -> str:
    """One row under :data:`HEADER` (time: the median; avg: the mean of the same samples)."""
    return (f"{row['op']:>14} {row['size']:>11} {row['count']:>10} {row['type']:>8} "
            f"{row['redop']:>5} {row['root']:>4} {row['algo']:>{ALGO_WIDTH}} {row['transport']:>9} "
            f"{row['time_us']:>10.1f} {row['p99_us']:>9.1f} {row['min_us']:>9.1f} "
            f"{row.get('avg_us', float('nan')):>9.1f} {row['max_us']:>9.1f} {row['algbw']:>7.3f} "
            f"{row['busbw']:>7.3f} {row['wrong']:>6} {row['sent']:>11} {row['pred_sent']:>11}")


def row_key(row: dict) -> tuple:
    """What defines a row besides the run's settings: a resumed run skips the rows it holds."""
    return (row["op"], row["algo"], row["transport"], row["type"], row["redop"], row["root"],
            row["size"])


def run_series(world, case: Case, sizes: list[int], record: dict | None = None,
               path: str | None = None, emit: Callable[[str], None] = print,
               samples: bool = False, timeline: list | None = None) -> list[dict]:
    """Measure ``case`` at each size on ``world``; print and record each row as it finishes.

    Sizes the record already holds for this series (a resumed run) are not measured again, nor
    a size that rounds to one already measured (split collectives round each block down: 8 B
    and 32 B of all-gather on 4 ranks are both 0 B).
    With ``samples`` each row also keeps ``samples_s``, its per-iteration times (max over
    ranks, seconds), for :func:`pool_passes`. With ``case.trace``, ``timeline`` gains each
    row's traced call: (label, every rank's entries, every rank's (start, end)).
    """

    n = world.size
    rows = []
    done = {row_key(r) for r in (record or {}).get("rows", [])}
    redop = case.redop if OPS[case.op].reduces else "-"
    root = case.root % n if OPS[case.op].rooted else -1
    for nbytes in sizes:
        size = counts_for(case.op, nbytes, n, ITEMSIZE[case.dtype])[1]
        key = (case.op, case.algo, case.transport, case.dtype, redop, root, size)
        if key in done:
            continue
        done.add(key)
        outs = world.run(measure, case, nbytes)
        iters = slowest([o["times"] for o in outs])  # per iteration, the max over ranks
        stats = res.summarize_iters(iters)
        size, count = outs[0]["size"], outs[0]["count"]
        seconds = stats["time_us"] / 1e6
        row = {"op": case.op, "algo": case.algo, "transport": case.transport, "size": size,
               "requested": nbytes,
               "count": count, "type": case.dtype,
               "redop": redop, "root": root, **stats, "algbw": algbw(size, seconds),
               "busbw": busbw(case.op, n, size, seconds), "wrong": sum(o["wrong"] for o in outs),
               "sent": max(o["sent"] for o in outs), "recv": max(o["recv"] for o in outs),
               "pred_sent": max(o["pred_sent"] for o in outs)}
        for field in WITNESSES:  # the machine's state beside the row (collectives.measure):
            sample = field.removesuffix("_us")  # each rank's samples, as measure names them
            if sample in outs[0]:
                row[field] = statistics.median(slowest([o[sample] for o in outs])) * 1e6
        if samples:
            row["samples_s"] = iters
        if timeline is not None and "span" in outs[0]:
            timeline.append((f"{case.op}/{case.algo} {case.transport} {size} B",
                             [o["timeline"] for o in outs], [o["span"] for o in outs]))
        rows.append(row)
        emit(format_row(row))
        if record is not None:
            record["rows"].append(row)
            if path:
                res.write_json(path, record)
    return rows


def merge_rounds(rounds: list[list[dict]], n: int) -> list[dict]:
    """One row per size from R repeated sweeps: the best round's median (``time_us``) and its
    witnesses (``witness_us``, ``witness_add_us``: the state the machine was in then), the lowest
    single iteration (``min_us``), every round's median (``rounds_us``).

    Repeats run one after another over the whole series, so a slow spell of a shared machine
    hits one round, not all; the best round is the machine's steady state. A code regression
    slows every round alike, so it still shows."""
    out = []
    for rows in zip(*rounds, strict=True):
        best = min(rows, key=lambda r: r["time_us"])
        row = dict(rows[0])
        row.update({k: best[k] for k in ("time_us", "p10_us", "p99_us", "max_us", "avg_us",
                                         *WITNESSES) if k in best},
                   min_us=min(r["min_us"] for r in rows), rounds_us=[r["time_us"] for r in rows],
                   wrong=sum(r["wrong"] for r in rows))
        out.append(_bandwidths(row, n))
    return out


def pool_passes(passes: list[dict], n: int) -> dict:
    """One row from the same row measured in several passes over a study's job list: the
    statistics of all their iterations together (the passes' ``samples_s``, which the pooled
    row drops), the passes' medians kept as ``passes_us``.

    A shared machine has slow spells of seconds to minutes; a row measured in one go lands in or
    out of one whole, and neighbouring sizes of a series disagree by far more than their
    iterations do. Passes minutes apart put each row's iterations into several spells, as every
    other row's, so the series' rows see the same mix."""
    iters = [t for p in passes for t in p["samples_s"]]
    row = {k: v for k, v in passes[0].items() if k != "samples_s"}
    row.update(res.summarize_iters(iters), passes_us=[p["time_us"] for p in passes],
               wrong=sum(p["wrong"] for p in passes))
    return _bandwidths(row, n)


def _bandwidths(row: dict, n: int) -> dict:
    """``row`` with algbw and busbw set again from its (merged) ``time_us``."""
    seconds = row["time_us"] / 1e6
    row["algbw"] = algbw(row["size"], seconds)
    row["busbw"] = busbw(row["op"], n, row["size"], seconds)
    return row
