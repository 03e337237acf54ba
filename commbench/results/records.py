"""Result records: rows from the timing loop, the JSON schema, markdown tables, atomic writes.

A results file (schema ``commbench.results.records/1``) is one JSON object::

    schema       "commbench.results.records/1"
    suite        e.g. "collectives"
    created      ISO 8601 time, UTC
    host         host name (no paths)
    hardware     "cpu" or the GPU's name
    world_size   ranks in the run
    launch       how the ranks were started: "local-mpi", "local-plain", or the launcher's name
    versions     python, torch, mpi4py, the MPI library, NCCL, commbench
    commit       git commit of the tree that ran, when known
    measurement  cadence, rank aggregation, statistic, iterations, warm-up (see
                 commbench.collectives.measure);
                 a study adds its own (versus: rounds, order; versus and model over MPI:
                 compiled_wait, how the compiled schedules waited); over MPI: binding, where
                 the ranks of MPI series ran (commbench.collectives.measure.placement)
    rows         one object per (series, size): op, algo, transport, dtype, redop, root, size
                 (bytes, nccl-tests' convention), count, time_us (median), min_us, p10_us
                 (lower decile), avg_us (mean), max_us, p99_us, algbw, busbw (GB/s), wrong, sent, recv (bytes
                 booked per rank, max over ranks), pred_sent (bytes predicted per rank), n_samples

Files are written to a temporary name and renamed, so a reader never sees half a file; one
top-level key per line and one row per line (:func:`json_lines`).
"""

from __future__ import annotations

import csv
import datetime
import io
import json
import os
import platform
import socket
import statistics
import subprocess
import tempfile
from collections.abc import Callable, Iterable, Iterator, Sequence

from tabulate import tabulate

from commbench.version import __version__

SCHEMA = "commbench.results.records/1"


def percentile(xs: list[float], q: float) -> float:
    s = sorted(xs)
    if not s:
        return float("nan")
    k = min(len(s) - 1, max(0, round(q / 100 * (len(s) - 1))))
    return s[k]


def summarize_iters(iters: list[float]) -> dict:
    """min / lower decile / median / mean / max / p99 in microseconds of per-iteration times (seconds;
    each the maximum over ranks)."""
    return {"time_us": statistics.median(iters) * 1e6, "min_us": min(iters) * 1e6,
            "avg_us": statistics.fmean(iters) * 1e6,
            "p10_us": percentile(iters, 10) * 1e6,
            "max_us": max(iters) * 1e6, "p99_us": percentile(iters, 99) * 1e6,
            "n_samples": len(iters)}


def versions() -> dict:
    out = {"python": platform.python_version()}
    try:
        # lazy: imports torch
        import torch

        out["torch"] = torch.__version__
        if torch.cuda.is_available():
            out["nccl"] = ".".join(map(str, torch.cuda.nccl.version()))
    except ImportError:
        pass
    try:
        # lazy: imports mpi4py
        import mpi4py

        out["mpi4py"] = mpi4py.__version__
    except ImportError:
        pass

    out["commbench"] = __version__
    return out


def git_commit(here: str | None = None) -> str | None:
    """The checkout's commit (of ``here``, default this package's), ``+dirty`` when tracked
    files outside ``results/`` differ from it."""
    here = here or os.path.dirname(os.path.abspath(__file__))
    try:
        r = subprocess.run(["git", "-C", here, "rev-parse", "--short=12", "HEAD"],
                           capture_output=True, text=True, timeout=5)
        # the results folder is the runs' output, not code: a table rewritten by an earlier
        # command of the same regeneration leaves the code clean
        dirty = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no",
                                "--", ":(top)", ":(top,exclude)results"],
                               capture_output=True, text=True, timeout=5).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return (r.stdout.strip() + ("+dirty" if dirty else "")) if r.returncode == 0 else None


def header(suite: str, world_size: int, launch: str, hardware: str, measurement: dict) -> dict:
    return {"schema": SCHEMA, "suite": suite,
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": socket.gethostname(), "hardware": hardware, "world_size": world_size,
            "launch": launch, "versions": versions(), "commit": git_commit(),
            "measurement": measurement, "rows": []}


def write_atomic(path: str, text: str | Iterable[str]) -> None:
    """``text`` (or its pieces, written as they come) into ``path`` through a temporary file
    in the same folder, renamed over ``path`` once whole; nothing is left where writing
    fails."""
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=d, prefix=".tmp-", suffix=os.path.basename(path))
    try:
        with os.fdopen(fd, "w") as f:
            if isinstance(text, str):
                f.write(text)
            else:
                f.writelines(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it private; results are for everyone to read
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


class Rows(Sequence):
    """A table's rows made one at a time, as they are read or written, from ``items`` by
    ``make``: a big job's rows (an analysis' calls) are never all held as dicts at once."""

    def __init__(self, items: list, make: Callable[[object], dict]) -> None:
        self._items, self._make = items, make

    @property
    def items(self) -> list:
        """What the rows are made from."""
        return self._items

    @property
    def make(self) -> Callable[[object], dict]:
        return self._make

    def __len__(self) -> int:
        return len(self._items)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self._make(x) for x in self._items[i]]
        return self._make(self._items[i])

    def __iter__(self) -> Iterator[dict]:
        return map(self._make, self._items)


def json_lines(record: dict) -> Iterator[str]:
    """``record`` as JSON text, in pieces: one top-level key per line, each object of a list
    of objects (a table's rows, an analysis' calls; :class:`Rows` made as they are written) on
    a line of its own, every other value compact on its key's line. As readable and as
    diffable as an indented dump, a third of its size, and written by json's C encoder (an
    indented dump runs its pure-Python one)."""
    yield "{"
    for i, (key, value) in enumerate(record.items()):
        yield ("\n" if i == 0 else ",\n") + json.dumps(str(key)) + ": "
        if isinstance(value, Rows) and not len(value):
            yield "[]"
        elif isinstance(value, Rows) or \
                (isinstance(value, list) and value and all(type(v) is dict for v in value)):
            yield "[\n"
            for j, v in enumerate(value):
                yield ("" if j == 0 else ",\n") + json.dumps(v)
            yield "\n]"
        else:
            yield json.dumps(value)
    yield "\n}\n"


def write_json(path: str, record: dict) -> None:
    write_atomic(path, json_lines(record))


def write_study(stem: str, record: dict, to_markdown, emit, plot=None) -> None:
    """A study's table: ``<stem>.json``, ``<stem>.md`` (``to_markdown(record)``) and, given
    ``plot`` (returns the path it wrote, or None without matplotlib), ``<stem>.png``."""
    write_json(stem + ".json", record)
    write_atomic(stem + ".md", to_markdown(record))
    emit(f"# wrote {stem}.json and {stem}.md")
    if plot is not None:
        png = plot(record, stem + ".png")
        emit(f"# wrote {png}" if png else "# no matplotlib: no plot")


def no_plot(record: dict) -> str:
    """Why :func:`plot` drew nothing: no row that moves bytes (a barrier's), or no
    matplotlib."""
    if not any(r.get("size", 0) > 0 for r in record.get("rows", [])):
        return "no row moves bytes: no plot"
    return "no matplotlib: no plot"

def markdown(record: dict) -> str:
    v = record["versions"]
    m = record["measurement"]
    lines = [f"# {record['suite']}: {record['hardware']}, {record['world_size']} ranks "
             f"({record['launch']})", "",
             f"- created {record['created']} on `{record['host']}`, commit `{record['commit']}`",
             "- versions: " + ", ".join(f"{k} {val}" for k, val in v.items()),
             "- measurement: " + ", ".join(f"{k}: {val}" for k, val in m.items()), ""]
    by_series: dict[tuple, list[dict]] = {}
    for row in record["rows"]:
        by_series.setdefault((row["op"], row["transport"], row["algo"]), []).append(row)
    if record.get("memcpy_GBps"):
        lines.insert(-1, f"- memory-copy bandwidth in the same run: {record['memcpy_GBps']:.2f} GB/s"
                     " (rows of 16 MiB and up give busbw as a fraction of it)")
    best = record.get("best_vs_native")
    if best:
        lines += ["## all_reduce: the transport's own against the fastest algorithm built here", "",
                  tabulate([[b["size"], f"{b['native_us']:.1f}", b["best_algo"],
                             f"{b['best_us']:.1f}", f"{b['native_over_best']:.2f}"] for b in best],
                           headers=["size(B)", "native(us)", "best algorithm", "best(us)",
                                    "native/best"], tablefmt="github"), ""]
    for (op, transport, algo), rows in by_series.items():
        lines += [f"## {op} / {transport} / {algo}", ""]
        table = [[r["size"], r["count"], r["type"], r["redop"], r["root"], f"{r['time_us']:.1f}",
                  f"{r['p99_us']:.1f}", f"{r['algbw']:.3f}", f"{r['busbw']:.3f}", r["wrong"],
                  r["sent"], r["pred_sent"],
                  f"{r['memcpy_frac']:.3f}" if "memcpy_frac" in r else "",
                  f"{r['pred_us']:.1f}" if r.get("pred_us") else "",
                  f"{r['meas_over_pred']:.2f}" if r.get("meas_over_pred") else "",
                  f"{r['nccl_pred_us']:.1f}" if r.get("nccl_pred_us") is not None else ""]
                 for r in rows]
        lines.append(tabulate(table, headers=["size(B)", "count", "type", "redop", "root",
                                              "time(us)", "p99(us)", "algbw(GB/s)", "busbw(GB/s)",
                                              "#wrong", "sent(B)", "pred(B)", "busbw/memcpy",
                                              "model(us)", "meas/model", "NCCL model(us)"],
                              tablefmt="github"))
        lines.append("")
    return "\n".join(lines)


def csv_text(rows: list[dict]) -> str:
    """The rows as CSV: one column per field any row has, in first-seen order (lists as JSON)."""

    fields: list[str] = []
    for r in rows:
        fields += [k for k in r if k not in fields and k != "samples_s"]
    out = io.StringIO()
    w = csv.DictWriter(out, fieldnames=fields, extrasaction="ignore", lineterminator="\n")
    w.writeheader()
    for r in rows:
        w.writerow({k: json.dumps(v) if isinstance(v, list | dict) else v for k, v in r.items()})
    return out.getvalue()


def study_markdown(record: dict, headers: list[str], cells: list[list], note: str = "") -> str:
    """The record's header lines, a note, and one table (the studies' common layout)."""

    head = markdown(dict(record, rows=[])).rstrip()
    table = tabulate(cells, headers=headers, tablefmt="github")
    return f"{head}\n\n{note}\n\n{table}\n" if note else f"{head}\n\n{table}\n"


def overhead_markdown(record: dict) -> str:
    rows = record["rows"]
    head = markdown(dict(record, rows=[])).rstrip()
    table = tabulate([[r["size"], f"{r['raw_us']:.2f}", f"{r['commbench_us']:.2f}",
                       f"{r['ratio']:.3f}", f"{r['raw_p99_us']:.1f}", f"{r['commbench_p99_us']:.1f}",
                       r["samples"]] for r in rows],
                     headers=["size(B)", "raw mpi4py (us)", "commbench (us)", "ratio",
                              "raw p99 (us)", "commbench p99 (us)", "samples each"],
                     tablefmt="github")
    worst = max(r["ratio"] for r in rows)
    return (f"{head}\n\n## MPI all-reduce: commbench's reported time over a bare mpi4py loop\n\n"
            f"{table}\n\nWorst ratio: {worst:.3f} (target: at most 1.10).\n")


def plot_title(record: dict) -> str:
    """What a plot says it shows: the suite, the machine class, the transports of its rows, the
    world and how it was launched, and the commit measured (two plots of one machine, one per
    transport, otherwise read alike)."""
    transports = sorted({str(r.get("transport", "")) for r in record.get("rows", [])} - {""})
    return (f"{record['suite']}: {record['hardware']}, {'+'.join(transports) or 'no rows'}, "
            f"{record['world_size']} ranks ({record['launch']}), commit "
            f"{record.get('commit') or 'unknown'}")


def plot(record: dict, path: str) -> str | None:
    """busbw against size, one panel per collective, one line per algorithm. None without
    matplotlib, or without a row that moves bytes (:func:`no_plot` says which)."""
    try:
        # lazy: imports matplotlib
        import matplotlib

        matplotlib.use("Agg")
        # lazy: imports matplotlib
        import matplotlib.pyplot as plt
    except ImportError:
        return None
    series: dict[str, dict[str, list[tuple[int, float]]]] = {}
    for r in record["rows"]:
        if r["size"] > 0:
            series.setdefault(r["op"], {}).setdefault(r["algo"], []).append((r["size"], r["busbw"]))
    if not series:
        return None
    cols = min(3, len(series))
    rows = -(-len(series) // cols)
    fig, axes = plt.subplots(rows, cols, figsize=(5 * cols, 3.6 * rows), squeeze=False)
    for ax, (op, algos) in zip(axes.flat, sorted(series.items())):
        for algo, pts in sorted(algos.items()):
            pts.sort()
            ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=algo)
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("size (B)")
        ax.set_ylabel("busbw (GB/s)")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=7)
    for ax in list(axes.flat)[len(series):]:
        ax.axis("off")
    fig.suptitle(plot_title(record))
    fig.tight_layout()
    tmp = path + ".tmp.png"
    fig.savefig(tmp, dpi=90)
    plt.close(fig)
    os.replace(tmp, path)
    return path
