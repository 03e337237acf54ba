"""``commbench analyze TRACE...``: a job's own profiler traces, every call against the bytes it
must move, NCCL's model and the committed sweep (commbench/traces/); or its flight recorder
dumps, what a hung job's ranks last issued (commbench/traces/flight.py); or its own log, what
torch's NCCL watchdog and NCCL said when it failed (commbench/traces/joblog.py,
joblog_findings.py)."""

from __future__ import annotations

import gc
import os
import sys

from tabulate import tabulate

from commbench.cli.checks import check_file, max_chars
from commbench.cli.common import UsageError
from commbench.cli.sniff import hint, reader_of
from commbench.rankset import rank_list, ranks_text
from commbench.results.records import write_atomic, write_json
from commbench.traces import flight, joblog, joblog_findings, wire
from commbench.traces.analysis import covers, match_job
from commbench.traces.calls import MAX_WORLD, TraceError
from commbench.traces.job import load
from commbench.traces.report import markdown, record
from commbench.traces.wire import as_entries

__all__ = ["add_parser", "command"]


def add_parser(sub) -> None:
    a = sub.add_parser("analyze", help="a job's PyTorch-profiler traces: every call's bytes, "
                       "busbw, skew and exposed time, against the wire",
                       description="Reads one Kineto trace per rank (a folder is one job; "
                       ".json or .json.gz), matches each collective across ranks by group and "
                       "sequence number, and prints the worst calls first, then per group, per "
                       "op and size, and per step. Given torch's flight recorder dumps of a "
                       "hung job (nccl_trace_rank_N), names per process group the ranks the "
                       "others wait for and any desync (exit 1 on one). Given the job's own "
                       "log (its stderr, one file or one a rank), reads torch's NCCL watchdog "
                       "lines (which call of which group timed out where, which ranks never "
                       "issued it), NCCL's warnings and errors (exit 1 on any). Example: commbench "
                       "analyze traces/ --topology dgx-h100 --nodes 2 --baseline "
                       "results/collectives_X-nccl-x8.json")
    a.add_argument("traces", nargs="+", help="trace files, or a folder of one trace per rank "
                   "(or of flight recorder dumps, or the job's logs)")
    a.add_argument("--topology", default="", metavar="PRESET|FILE",
                   help="NCCL's model beside each call (default: the preset the traces' device "
                        "names point to, if any)")
    a.add_argument("--nodes", type=int, default=None,
                   help="nodes of the topology (default: as many as the world needs)")
    a.add_argument("--world", type=int, default=0, metavar="N",
                   help="the job's world size, where its traces state none (no distributedInfo."
                        "world_size: a torch < 2.1 trace's calls are on the world; default: as "
                        "the traces state it, else the least world their ranks and groups fit); "
                        "of a job's log: the default group's size, to name its silent ranks")
    a.add_argument("--baseline", default="", metavar="FILE",
                   help="a committed sweep (results/collectives_*.json): its busbw beside each call")
    a.add_argument("--layout", default="", metavar="SPEC",
                   help="compare rank 0's calls with this layout's, as commbench audit --layout; "
                        "exit 1 on a difference")
    a.add_argument("--step", type=int, default=None, metavar="N",
                   help="with --layout: compare only ProfilerStep#N (and --steps K from it)")
    a.add_argument("--steps", type=int, default=1, metavar="K", help="with --step: K steps")
    a.add_argument("--top", type=int, default=20, help="worst calls shown")
    a.add_argument("--max-size", type=float, default=16.0, metavar="GB",
                   help="read at most this many GiB of text from one trace (default 16)")
    a.add_argument("--json", default="", metavar="FILE", help="also write the record as JSON")
    a.add_argument("--markdown", default="", metavar="FILE", help="also write the markdown")


def command(a) -> int:
    """The job's analysis. Python's cycle collector is off while it runs (and in the workers
    that read the ranks): a big job's calls are many small objects without cycles, which
    reference counting frees, and each full collection would walk them all again (a fifth of
    the time after reading on four ranks of 80 MB)."""
    was = gc.isenabled()
    gc.disable()
    try:
        return _command(a)
    finally:
        if was:
            gc.enable()


def _command(a) -> int:
    if a.json:
        check_file(a.json, "--json")
    if a.markdown:
        check_file(a.markdown, "--markdown")

    if a.top < 0:
        raise UsageError(f"--top {a.top}: must be >= 0")
    if not 0 <= a.world <= MAX_WORLD:
        raise UsageError(f"--world {a.world}: must be 1 to {MAX_WORLD} (0: as the traces "
                         "state it)")
    if a.nodes is not None and a.nodes < 1:
        raise UsageError(f"--nodes {a.nodes}: must be >= 1")
    if a.step is not None and (a.step < 0 or a.steps < 1):
        raise UsageError(f"--step {a.step} --steps {a.steps}: must be >= 0 and >= 1")
    if a.step is not None and not a.layout:
        raise UsageError(f"--step {a.step}: selects the steps --layout compares; give --layout")
    dumps = flight.files_of(a.traces)
    if dumps is not None:  # torch's flight recorder dumps, not profiler traces
        return _flight(a, dumps)
    skipped: list[str] = []
    logs = joblog.files_of(a.traces, skipped)
    if logs is not None and all(reader_of(p)[1] in ("", "commbench analyze") for p in logs):
        return _joblog(a, logs, skipped)  # the job's own text log, not a trace nor a benchmark's
    try:
        traces = load(a.traces, limit=max_chars(a.max_size), world=a.world)
        cover = covers(traces)
        rows, apart = match_job(traces, cover)
        extra: dict = {}
        if a.world and not all(t.world_stated for t in traces):
            extra["world_given"] = True  # --world: the user's word, not the traces'
        if apart:
            extra["misaligned"] = apart
        said: list[str] = []
        topo = wire.topology(traces, a.topology or None, a.nodes, said)
        if topo is not None:
            wire.add_model(rows, topo)
            extra["topology"] = f"{topo.name} x{topo.nodes} node(s)"
        if said:
            extra["model_note"] = "; ".join(said)  # which model, or why none; any warning
        if a.baseline:
            extra["baseline"] = wire.add_baseline(rows, a.baseline)
    except (TraceError, ValueError) as exc:
        raise UsageError(str(exc) + hint(a.traces, "commbench analyze", str(exc))) from None
    if a.layout:
        extra["layout"] = _layout(a, traces)
    rec = record(traces, rows, extra, cover)
    text = markdown(rec, a.top)
    print(text)

    if a.json:
        write_json(a.json, rec)
        print(f"# wrote {a.json}")
    if a.markdown:
        write_atomic(a.markdown, text)
        print(f"# wrote {a.markdown}")
    flags = rec.get("layout", {}).get("flags", [])
    if flags:
        print(f"# {len(flags)} difference(s) from the layout:", *flags, sep="\n#   ")
    return 1 if flags else 0


class _Echo:
    """Lines printed and kept: what ``--markdown FILE`` writes of a report of dumps or logs."""

    def __init__(self) -> None:
        self.lines: list[str] = []

    def __call__(self, *parts, sep: str = " ") -> None:
        text = sep.join(map(str, parts))
        print(text)
        if not text.startswith("# wrote "):
            self.lines.append(text)

    def write(self, path: str) -> None:
        if path:
            write_atomic(path, "\n".join(self.lines) + "\n")
            print(f"# wrote {path}")


def _traces_only(a, what: str) -> None:
    """The flags of profiler traces refused for files of another kind, saying ``what`` they
    hold instead."""
    for flag, given in (("--layout", a.layout), ("--baseline", a.baseline),
                        ("--topology", a.topology)):
        if given:
            raise UsageError(f"{flag}: {what}; {flag} applies to profiler traces")


def _flight(a, paths: list[str]) -> int:
    """A job's flight recorder dumps: per process group the last collective each member
    enqueued, the ranks the others wait for and any desync; exit 1 when there is one."""
    _traces_only(a, "flight recorder dumps hold the calls' order, not their timing on a "
                    "topology")
    try:
        dumps = [flight.read(p) for p in paths]
    except TraceError as exc:
        raise UsageError(str(exc)) from None
    echo = _Echo()
    seen: dict[int, str] = {}
    for d in dumps:
        if d.rank in seen:
            raise UsageError(f"{d.path}: rank {d.rank} again (also {seen[d.rank]}): one dump a "
                             "rank")
        seen[d.rank] = d.path
    notes: list[str] = []
    rows, said = flight.findings(dumps, notes)
    ranks = sorted(seen)
    versions = sorted({d.version for d in dumps})
    echo(f"# commbench analyze: flight recorder dumps of {len(dumps)} rank(s), ranks "
          f"{ranks_text(ranks)} (torch's format {', '.join(versions) or '?'}); "
          f"{sum(len(d.entries) for d in dumps)} calls in their buffers, the last each rank "
          "recorded")
    timed = any(r["median_ms"] is not None for r in rows)

    def span(lo: int, hi: int):
        return lo if lo == hi else f"{lo}-{hi}"

    table = [[r["group"], r["desc"] or "-", ranks_text(r["members"]), ranks_text(r["dumps"]),
              span(r["last_min"], r["last_max"]), span(r["done_min"], r["done_max"]),
              rank_list(r["behind"]) if r["behind"] else "-"]
             + ([r["median_ms"] if r["median_ms"] is not None else "-"] if timed else [])
             for r in rows]
    echo("\n" + tabulate(table, headers=["group", "desc", "members", "dumps", "last issued",
                                          "last completed", "behind"]
                          + (["median ms"] if timed else []), tablefmt="github"))
    echo("\n" + ("\n".join(f"# {line}" for line in said) if said else
                  "# every member of every group issued the same collectives, the same number"))
    for line in notes:
        echo(f"# {line}")
    if a.json:
        write_json(a.json, {"schema": "commbench.flight/1", "files": [os.path.basename(p) for p in
                                                                     paths],
                            "ranks": ranks, "versions": versions, "groups": rows,
                            "findings": said, "notes": notes})
        echo(f"# wrote {a.json}")
    echo.write(a.markdown)
    if said:
        print(f"commbench analyze: {len(said)} finding(s) in the flight recorder dumps: "
              f"{said[0]}", file=sys.stderr)
    return 1 if said else 0


def _joblog(a, paths: list[str], skipped: list[str] | None = None) -> int:
    """A job's own log: per failed call of a process group the ranks it failed on, how far
    they had issued and completed the group's calls, and the findings; exit 1 on one."""
    _traces_only(a, "a job's log holds what failed, not the calls' timing")
    try:
        log = joblog.read(paths, max_chars(a.max_size))
    except TraceError as exc:
        raise UsageError(str(exc) + hint(paths, "commbench analyze", str(exc))) from None
    echo = _Echo()
    notes: list[str] = []
    rows, said = joblog_findings.findings(log, notes, a.world)
    base = os.path.commonpath([os.path.abspath(p) for p in paths]) if len(paths) > 1 else ""
    shown = [os.path.relpath(os.path.abspath(p), base) if base else os.path.basename(p)
             for p in paths]  # torchrun's logs are all stderr.log: their folders tell them
    names = ", ".join(shown[:4]) + (f" and {len(paths) - 4} more" if len(paths) > 4 else "")
    counts = [(len(log.timeouts), "watchdog timeout line(s)"),
              (len(log.progress), "progress line(s)"), (len(log.signals), "timeout signal(s)"),
              (len(log.mismatches), "collective check failure(s)"),
              (len(log.dumped), "flight recorder dump(s) begun"),
              (len(log.barriers), "monitored barrier failure(s)"),
              (len(log.stuck), "stuck watchdog(s)"), (len(log.warns), "kind(s) of NCCL warning"),
              (sum(log.errors.values()), "NCCL error line(s)"),
              (len(log.gloo), "gloo error(s)"),
              (len(log.root) and 1, "torchrun failure report")]
    echo(f"# commbench analyze: the job's log ({names}; {log.lines} lines): "
          + (", ".join(f"{n} {what}" for n, what in counts if n) or "no failure line"))
    if skipped:
        echo(f"# read the last attempt of torchrun's restarts; {len(skipped)} earlier attempt(s) "
             f"left out ({', '.join(os.path.basename(x) for x in skipped[:4])}): give such a "
             "folder to read it")
    facts = log.nccl.facts() if log.nccl else []
    if facts:
        echo("# NCCL said: " + "; ".join(facts))

    def span(pair):
        return "-" if not pair else pair[0] if pair[0] == pair[1] else f"{pair[0]}-{pair[1]}"

    if rows:
        table = [[r["group"], r["desc"] or "-", r["seq"], r["op"],
                  "/".join(map(str, r["numel_in"])) or "-",
                  "/".join(map(str, r["numel_out"])) or "-",
                  ("" if r["job_ranks"] else "group ") + _short(r["ranks"]),
                  f"{r['timeout_s']:g}" if r["timeout_s"] else "-", span(r["enqueued"]),
                  span(r["completed"])] for r in rows]
        echo("\n" + tabulate(table, headers=["group", "desc", "call", "op", "NumelIn",
                                              "NumelOut", "ranks", "timeout(s)",
                                              "last enqueued", "last completed"],
                              tablefmt="github"))
    for message, hosts in list(log.warns.items())[:SHOWN]:
        echo(f"# NCCL WARN ({_some(sorted(hosts))}): {message}")
    if len(log.warns) > SHOWN:
        echo(f"# ... and {len(log.warns) - SHOWN} more kind(s) of NCCL warning"
              + (f" (all in {a.json})" if a.json else " (--json FILE keeps them all)"))
    echo("\n" + ("\n".join(f"# {line}" for line in said) if said else
                  "# no watchdog timeout, stuck watchdog, NCCL warning or error, gloo error in "
                  "the log"))
    for line in notes:
        echo(f"# {line}")
    if a.json:
        write_json(a.json, {"schema": "commbench.joblog/1",
                            "files": [os.path.basename(p) for p in paths], "lines": log.lines,
                            "calls": rows, "findings": said, "notes": notes,
                            "nccl_warnings": {m: sorted(h) for m, h in log.warns.items()},
                            "nccl_errors": dict(log.errors), "root_cause": log.root,
                            "signals": [vars(x) for x in log.signals],
                            "dumping": sorted(r for r in log.dumped if r is not None),
                            "barriers": [{"waiter": w, "timeout_ms": ms, "absent": sorted(a)}
                                         for (w, ms), a in sorted(log.barriers.items())],
                            "mismatches": [[{"group_rank": r, "seq": c[0], "op": c[1],
                                             "shape": c[2], "dtype": c[3]} for r, c in pair]
                                           for pair in log.mismatches],
                            "nccl_error_path": [{"host": h, "code": c, "lines": n, "first": f}
                                                for (h, c), (n, f) in log.chains.items()],
                            "nccl_said": facts,
                            "gloo": [{k: v for k, v in vars(g).items() if k != "where"}
                                     for g in log.gloo]})
        echo(f"# wrote {a.json}")
    echo.write(a.markdown)
    if said:
        print(f"commbench analyze: {len(said)} finding(s) in the job's log: {said[0]}",
              file=sys.stderr)
    return 1 if said else 0


SHOWN = 8  # kinds of NCCL warning, and hosts of one, printed (the JSON keeps them all)


def _some(names: list[str]) -> str:
    return ", ".join(names[:SHOWN]) + (f" and {len(names) - SHOWN} more" if len(names) > SHOWN
                                       else "")


def _short(ranks: list[int]) -> str:
    """A table cell of ranks: their ranges, or where those run long (a strided group less one
    rank), how many of which span."""
    text = ranks_text(ranks)
    return text if len(text) <= 32 else f"{len(ranks)} of {ranks[0]}-{ranks[-1]}"


def _layout(a, traces) -> dict:
    # lazy: imports commbench.patterns.registry
    from commbench.studies.audit_layout import compare, parse_layout  # only for --layout

    world = max([t.world_size for t in traces] + [len(traces)])
    try:
        lay = parse_layout(a.layout, world)
    except ValueError as exc:
        raise UsageError(str(exc)) from None
    zero = next((t for t in traces if t.rank == 0), None)
    if zero is None:
        raise UsageError("--layout: compares rank 0's calls; rank 0's trace is not given")
    span = None if a.step is None else (a.step, a.step + a.steps - 1)
    if span is not None:
        marked = {n for n, _, _ in zero.steps}
        # more steps than marked cannot all be: said without listing them (--steps 10^11)
        if a.steps > len(marked) or not set(range(span[0], span[1] + 1)) <= marked:
            raise UsageError(f"--step {a.step} --steps {a.steps}: rank 0's trace has "
                             f"ProfilerStep# {sorted(marked) or 'none'}")
    steps = a.steps if span is not None else 1
    return {"spec": a.layout, "settings": lay.as_dict(), "step": a.step, "steps": steps,
            **compare(lay, as_entries(zero, span), steps)}
