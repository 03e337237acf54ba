"""``commbench compare OLD NEW``: per-row ratios between two results files, and a regression gate.

Rows are matched on (op, algo, transport, type, redop, root, size). A row regresses when, at a
size of at least ``min_size`` (default 64 KiB; smaller messages measure latency, whose noise on a
shared machine exceeds any threshold worth setting), its time grew by more than the threshold
(default 10%, in busbw: fell by more than 10%) both in the median and in the best iteration
(``min_us``), at three consecutive sizes of the same series (op, algo, transport, ...); a
series with fewer sizes at or above ``min_size`` must regress at all of them. Slow outliers move
the median but not the best iteration, a lucky best iteration moves the minimum but not the
median; a slow spell of a shared machine strikes one or two sizes; a regression of the code
moves both statistics over a range of sizes (the reruns that decided it: docs/decisions.md).
Tables measured with ``--repeat R`` hold each row's best round.

Exit status: 0 no regression, 1 regression, 2 unreadable or incomparable files.
"""

from __future__ import annotations

import json

from commbench.results.records import SCHEMA

__all__ = ["CompareError", "compare", "load"]

KEY = ("op", "algo", "transport", "type", "redop", "root", "size")
RUN = 3  # consecutive sizes of a series that must regress together
NEEDED = (*KEY, "time_us", "min_us", "busbw")


class CompareError(ValueError):
    """A results file that cannot be compared: unreadable, wrong schema, other world size."""


def load(path: str) -> dict:
    try:
        with open(path) as f:
            record = json.load(f)
    except FileNotFoundError:
        raise CompareError(f"{path}: no such file") from None
    except json.JSONDecodeError as exc:
        raise CompareError(f"{path}: not valid JSON (truncated or corrupt?): {exc.msg} at line "
                           f"{exc.lineno}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise CompareError(f"{path}: cannot read: {exc}") from None
    if not isinstance(record, dict) or "schema" not in record:
        raise CompareError(f"{path}: not a commbench results file (no 'schema' field)")
    if record["schema"] != SCHEMA:
        raise CompareError(f"{path}: schema {record['schema']!r}, this commbench reads {SCHEMA!r}")
    rows = record.get("rows")
    if not isinstance(rows, list):
        raise CompareError(f"{path}: 'rows' must be a list")
    for k, row in enumerate(rows):
        missing = [f for f in NEEDED if not isinstance(row, dict) or f not in row]
        if missing:
            raise CompareError(f"{path}: row {k} lacks {', '.join(missing)}")
    if not isinstance(record.get("world_size"), int):
        raise CompareError(f"{path}: 'world_size' must be an integer")
    return record


def compare(old: dict, new: dict, threshold: float = 0.10, min_size: int = 64 << 10
            ) -> tuple[list[dict], list[dict]]:
    """(every matched row with its ratio and verdict, the regressed rows)."""
    if not 0 < threshold < 1:
        raise CompareError(f"threshold={threshold}: must be between 0 and 1")
    if old["world_size"] != new["world_size"]:
        raise CompareError(f"world sizes differ: {old['world_size']} ranks against "
                           f"{new['world_size']}; results of different worlds do not compare")
    before = {tuple(r[k] for k in KEY): r for r in old["rows"]}
    out, bad = [], []
    for r in new["rows"]:
        key = tuple(r[k] for k in KEY)
        o = before.get(key)
        if o is None:
            continue
        ratio = r["busbw"] / o["busbw"] if o["busbw"] > 0 else float("nan")
        limit = 1 / (1 - threshold)  # a busbw drop of `threshold` is a time growth of this factor
        regressed = (r["size"] >= min_size and o["busbw"] > 0
                     and r["time_us"] > o["time_us"] * limit and r["min_us"] > o["min_us"] * limit)
        row = {**dict(zip(KEY, key)), "old_busbw": o["busbw"], "new_busbw": r["busbw"],
               "ratio": ratio, "old_us": o["time_us"], "new_us": r["time_us"],
               "new_min_us": r["min_us"], "regressed": regressed}
        out.append(row)
    series: dict[tuple, list[dict]] = {}
    for row in out:
        if row["size"] >= min_size:
            series.setdefault(tuple(row[k] for k in KEY[:-1]), []).append(row)
    for rows in series.values():
        rows.sort(key=lambda row: row["size"])
        slow = [row["regressed"] for row in rows]
        run = min(RUN, len(rows))  # a shorter series must regress at every size
        for i, row in enumerate(rows):
            row["regressed"] = any(all(slow[j:j + run]) for j in range(max(0, i - run + 1),
                                                                       min(i, len(rows) - run) + 1))
    bad = [row for row in out if row["regressed"]]
    return out, bad


def report(rows: list[dict], bad: list[dict], threshold: float, min_size: int) -> str:
    from tabulate import tabulate

    table = [[r["op"], r["algo"], r["transport"], r["size"], f"{r['old_us']:.1f}",
              f"{r['new_us']:.1f}", f"{r['old_busbw']:.4f}", f"{r['new_busbw']:.4f}",
              f"{r['ratio']:.3f}", "REGRESSED" if r["regressed"] else ""] for r in rows]
    text = tabulate(table, headers=["op", "algo", "transport", "size", "old(us)", "new(us)",
                                    "old busbw", "new busbw", "new/old", ""], tablefmt="github")
    verdict = (f"# {len(bad)} of {len(rows)} rows regressed (time up > {1 / (1 - threshold) - 1:.1%}"
               f" in the median and in the best iteration, at >= {min_size} B, over {RUN} "
               "consecutive sizes of a series)" if bad else
               f"# no regression in {len(rows)} matched rows")
    return text + "\n" + verdict
