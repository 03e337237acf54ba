"""``commbench import LOG... [--out DIR]``: nccl-tests / rccl-tests logs as commbench results files,
each row beside NCCL's model (results/nccl_tests.py, costmodel/calibrate.py)."""

from __future__ import annotations

import os
import re
import sys

from tabulate import tabulate

from commbench.cli.common import UsageError
from commbench.cli.sniff import hint
from commbench.costmodel.calibrate import beside, topology_for
from commbench.costmodel.nccl import versions
from commbench.costmodel.nccl_said import said_against, tuning_against
from commbench.names import canonical
from commbench.ops import OPS
from commbench.results import osu
from commbench.results.files import FileRefused, read_text
from commbench.results.nccl_tests import CPU_ALGBW, LogError, world_of_count, world_of_ratio
from commbench.results.nccl_tests_json import runs_of
from commbench.results.nccl_tests_record import check_printed, record
from commbench.results.records import write_atomic, write_json
from commbench.traces.calls import MAX_WORLD

__all__ = ["LOG_LIMIT", "add_parser", "command"]

LOG_LIMIT = 256 << 20  # bytes: NCCL_DEBUG=INFO logs of a large job run to tens of MB


def add_parser(sub) -> None:
    c = sub.add_parser(
        "import", help="nccl-tests / rccl-tests logs as results files, beside NCCL's model",
        description="Reads every run in each log (several tests per file, old and new column "
        "sets, srun/Open MPI prefixes, NCCL INFO lines between rows, rows cut by pasting) and "
        "writes one results file per run, so that compare, plots and the regression gate work on "
        "it as on commbench's own runs. Each row is printed beside NCCL's modelled busbw on the "
        "topology the header's GPU and hosts describe (or --topology). Exit 0: read; 1: a row "
        "with #wrong > 0, or an older build's max error past its bound (written and flagged); "
        "2: a file that is no such log. A truncated log keeps its complete rows and says so on "
        "stderr. OSU Micro-Benchmarks' collective latency "
        "tests and osu_latency are read too (docs/nccl-tests.md). Example: commbench import "
        "all_reduce_perf.log --out results/cluster")
    c.add_argument("logs", nargs="+", metavar="LOG",
                   help="nccl-tests or rccl-tests output (text, or nccl-tests' -J JSON)")
    c.add_argument("--out", default="results", help="folder for the results files")
    c.add_argument("--topology", help="preset or topology file to set the rows beside "
                   "(default: the preset of the header's GPU, narrowed to its nodes)")
    c.add_argument("--op", help="the collective, for a log that names none (no 'Collective "
                   "test starting' line, no *_perf command, no op in its file name)")
    c.add_argument("--nccl-version", default="2.30.7", help="NCCL version of the model")
    c.add_argument("--ranks", type=int, default=0, help="the world of a log that does not say "
                   "it: an OSU log without its launch line (srun/mpirun -n, -N x "
                   "--ntasks-per-node), an nccl-tests table pasted without its device lines")


def _unique(stem: str, taken: set[str]) -> str:
    """``stem``, or ``stem-2``, ``stem-3``, ... : the first name not yet ``taken`` (now taken),
    so that several runs of one file and op each get a file of their own."""
    k, name = 1, stem
    while name in taken:
        k += 1
        name = f"{stem}-{k}"
    taken.add(name)
    return name


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "gpu"


def command(a) -> int:
    if a.nccl_version not in versions():
        raise UsageError(f"--nccl-version {a.nccl_version}: must be one of {', '.join(versions())}")
    op = canonical(a.op) if a.op else ""
    if a.op and (op not in OPS or OPS[op].bus is None):
        raise UsageError(f"--op {a.op}: not a collective nccl-tests measures")
    if not 0 <= a.ranks <= MAX_WORLD:  # a typo's world would price absurd bandwidths
        raise UsageError(f"--ranks {a.ranks}: must be 1 to {MAX_WORLD} (0: the log's own)")
    parsed, osu = [], []
    for path in a.logs:  # every file read and checked before anything is written
        try:
            text = read_text(path, "log", LOG_LIMIT)
        except FileRefused as exc:
            raise UsageError(str(exc) + hint([path], "commbench import", str(exc))) from None
        if _osu_runs(path, text, a.ranks, osu):
            continue
        try:
            runs = runs_of(text, os.path.basename(path))
        except LogError as exc:
            raise UsageError(str(exc) + hint([path], "commbench import", str(exc))) from None
        for run in runs:  # a header whose table was not pasted, or a test that failed at once
            if not run.rows:
                print(f"{path}: line {run.first_line}: the {run.op or 'unnamed'} run has no rows"
                      + (f" ({run.failure})" if run.failure else "") + "; left out",
                      file=sys.stderr)
        runs = [run for run in runs if run.rows]
        if not runs:
            raise UsageError(f"{path}: no run with rows: nothing to import")
        for run in runs:
            if op and run.op_from in ("", "columns"):
                run.op, run.op_from = op, "--op"
                if not run.devices:  # a world read off the factor of another op: read again
                    run.world, run.world_from = 0, ""
            if not run.op:
                raise UsageError(f"{path}: line {run.first_line}: the run names no collective and "
                                 "its columns fit none alone; give --op")
            if run.devices and a.ranks and a.ranks != run.ranks:
                raise UsageError(f"--ranks {a.ranks}: {path} names {run.ranks} ranks in its "
                                 "device lines")
            if not run.devices:  # a table pasted without its header: the world given or read
                _world(run, a.ranks, path)
        parsed.append((path, runs))
    taken: set[str] = set()
    wrong = _write_osu(osu, a.out, taken)
    for path, runs in parsed:
        for run in runs:
            rec = record(run, os.path.basename(path))
            name = _unique(f"{run.tool}_{run.op}_{_slug(run.gpu)}-x{run.ranks}", taken)
            try:
                topo, why = topology_for(run, a.topology)
            except ValueError as exc:
                raise UsageError(str(exc)) from None
            model = {b.size: b for b in beside(run, topo, a.nccl_version)} if topo else {}
            said = run.nccl
            picked = _picks(said, run.op)
            for row in rec["rows"]:
                b = model.get(row["size"])
                if b is not None:
                    row |= {"nccl_model_busbw": b.model, "meas_over_model": b.ratio,
                            "nccl_model_algo": f"{b.algo}/{b.proto}"}
                if row["size"] in picked:  # what NCCL's own tuner ran at that size
                    row["nccl_pick"] = picked[row["size"]]
            rec["measurement"]["model"] = why
            if said is not None:
                rec["measurement"]["nccl_said"] = said.facts()
                rec["measurement"]["nccl_contradicts"] = said_against(said, topo) + \
                    tuning_against(said, run.op, topo, a.nccl_version) + \
                    _picks_against(rec["rows"], topo.name) if topo else []
            write_json(os.path.join(a.out, name + ".json"), rec)
            write_atomic(os.path.join(a.out, name + ".md"), _markdown(rec))
            print(_table(rec, run, path, why))
            if said is not None and said.facts():
                print("# NCCL said: " + ", ".join(said.facts()))
                for line in rec["measurement"]["nccl_contradicts"]:
                    print(f"# NCCL against the model's topology: {line}")
            print(f"# wrote {os.path.join(a.out, name)}.json and .md")
            for line in check_printed(run):
                print(f"# {path}: {line}", file=sys.stderr)
            if rec["measurement"]["rows_untimed"]:
                print(f"{path}: the {run.op} run's time column is the host's launch time (-C 1): "
                      f"rows timed by size / algbw; {rec['measurement']['rows_untimed']} row(s) "
                      f"of algbw under {CPU_ALGBW:g} GB/s print too few digits for it and are "
                      "left out", file=sys.stderr)
            if run.truncated:
                print(f"{path}: the {run.op} run from line {run.first_line} is truncated: "
                      f"{len(run.rows)} complete rows kept", file=sys.stderr)
            if run.failure:
                print(f"{path}: the {run.op} run failed after {len(run.rows)} rows: "
                      f"{run.failure}", file=sys.stderr)
            if run.cut_rows:
                print(f"{path}: {run.cut_rows} row fragment(s) could not be joined and were left "
                      "out", file=sys.stderr)
            bad = sum(1 for r in rec["rows"] if r["wrong"])
            if bad:
                what = "#wrong > 0" if any(r.wrong for r in run.rows) else \
                    "a max error beyond nccl-tests' bound"
                print(f"{path}: {bad} row(s) of the {run.op} run report {what} (flagged in "
                      "the results file)", file=sys.stderr)
            wrong += bad
    return 1 if wrong else 0


def _picks(said, op: str) -> dict[int, str]:
    """size -> "algo/proto" NCCL's tuner picked for the run's op, as its log says. Only for an
    op whose size is its whole buffer (all-reduce, broadcast, reduce), which NCCL counts as
    nccl-tests' size column does; an all-gather's and a reduce-scatter's NCCL has counted
    otherwise across its versions, and their picks are a fact of the log only."""
    if said is None or op not in OPS or OPS[op].input != "whole":
        return {}
    return {size: f"{algo}/{proto}" for (o, size), (algo, proto) in said.picks.items() if o == op}


def _picks_against(rows: list[dict], topo: str) -> list[str]:
    """One line where NCCL's own pick and the model's differ at some of the run's sizes."""
    both = [r for r in rows if "nccl_pick" in r and "nccl_model_algo" in r]
    apart = [r for r in both if r["nccl_pick"] != r["nccl_model_algo"]]
    if not apart:
        return []
    r = apart[0]
    return [f"the model on {topo} picks otherwise than NCCL's own tuner at {len(apart)} of "
            f"{len(both)} sizes (first: {r['size']} B, NCCL {r['nccl_pick']}, model "
            f"{r['nccl_model_algo']})"]


def _world(run, given: int, path: str) -> None:
    """A run without device lines: its world from --ranks, else off its bus factor
    (:func:`~commbench.results.nccl_tests.world_of_ratio`); a given world its rows deny, or
    neither, is refused."""
    read = run.world or world_of_ratio(run)  # read with its op from the columns, or now
    counted = world_of_count(run)  # one rank's block in the count column: exact where it fits
    if given and read and given != read:
        raise UsageError(f"--ranks {given}: {path}'s busbw / algbw is nccl-tests' {run.op} "
                         f"factor at {read} ranks")
    if given and counted and given != counted:
        raise UsageError(f"--ranks {given}: {path}'s count column is one rank's block of its "
                         f"{run.op} at {counted} ranks")
    if given:
        run.world, run.world_from = given, "--ranks"
    elif read:
        run.world, run.world_from = read, f"read off busbw / algbw, the {run.op} factor"
    elif counted:
        run.world, run.world_from = counted, f"read off the count column, one rank's block of " \
            f"its {run.op}"
    else:
        raise UsageError(f"{path}: line {run.first_line}: no '# Rank N ... device' lines, and "
                         f"its busbw / algbw does not tell the world of its {run.op}: give "
                         "--ranks")


def _osu_runs(path: str, text: str, ranks: int, out: list) -> bool:
    """Whether ``text`` is OSU output; its importable runs (with their world) added to ``out``,
    those of no commbench op said on stderr; refusals (a world unknown, nothing importable)
    raised before anything is written."""

    if not osu.is_osu(text):
        return False
    runs = osu.parse(text)
    kept = 0
    for run in runs:
        if not run.op:
            print(f"{path}: line {run.first_line}: OSU {run.test} test left out (no commbench "
                  "op measures it: bandwidth, non-blocking and barrier tests)", file=sys.stderr)
            continue
        if not run.rows:
            print(f"{path}: line {run.first_line}: OSU {run.test} test has no rows; left out",
                  file=sys.stderr)
            continue
        n = run.ranks or ranks or (2 if run.two else 0)
        known = "launch line" if run.ranks else "--ranks" if ranks else \
            "osu_latency's two processes"
        if not n:
            raise UsageError(f"{path}: line {run.first_line}: the OSU {run.test} test's world is "
                             "unknown (no srun/mpirun line with -n or -N and --ntasks-per-node "
                             "before it); give --ranks")
        if n < 2:
            raise UsageError(f"{path}: line {run.first_line}: {n} rank: OSU's tests need 2 or "
                             "more")
        out.append((path, run, n, os.path.basename(path), known))
        kept += 1
    if not kept:
        raise UsageError(f"{path}: OSU output with no test commbench reads (collective latency "
                         "tests and osu_latency)")
    return True


def _write_osu(runs: list, folder: str, taken: set[str]) -> int:
    """Each OSU run as a results file; the rows with OSU's validation failed."""
    wrong = 0
    for path, run, n, source, known in runs:
        rec = osu.record(run, n, source)
        name = _unique(f"osu_{run.op}_{_slug(run.api)}-x{n}", taken)
        cells = [[r["osu_size"], r["size"], f"{r['time_us']:.2f}", f"{r['busbw']:.4f}",
                  r.get("flag", "")] for r in rec["rows"]]
        table = tabulate(cells, headers=["OSU size(B)", "size(B)", "time(us)", "busbw(GB/s)",
                                         ""], tablefmt="github", disable_numparse=True)
        head = (f"# {path}: OSU {run.api} {run.test} v{run.version}, {run.op}, {n} ranks "
                f"({known}), {len(rec['rows'])} rows")
        write_json(os.path.join(folder, name + ".json"), rec)
        write_atomic(os.path.join(folder, name + ".md"), head.lstrip("# ") + "\n\n" + table
                     + "\n")
        print(head + "\n" + table + f"\n# wrote {os.path.join(folder, name)}.json and .md")
        bad = sum(r["wrong"] for r in rec["rows"])
        if bad:
            print(f"{path}: {bad} row(s) of the OSU {run.test} test failed its validation "
                  "(flagged in the results file)", file=sys.stderr)
        wrong += bad
    return wrong


def _cells(rec: dict) -> tuple[list[str], list[list]]:
    headers = ["size(B)", "count", "type", "time(us)", "in-place(us)", "busbw(GB/s)", "#wrong",
               "model busbw", "meas/model", "model algo"]
    cells = [[r["size"], r["count"], r["type"], f"{r['time_us']:.2f}",
              f"{r['inplace_us']:.2f}" if r["inplace_us"] is not None else "",
              f"{r['busbw']:.3f}", r["wrong"] if r.get("checked", True) else "N/A",
              f"{r['nccl_model_busbw']:.2f}" if "nccl_model_busbw" in r else "",
              f"{r['meas_over_model']:.2f}" if "meas_over_model" in r else "",
              r.get("nccl_model_algo", "")] for r in rec["rows"]]
    if any("nccl_pick" in r for r in rec["rows"]):  # the log holds NCCL's own picks
        headers.append("NCCL's pick")
        for row, r in zip(cells, rec["rows"], strict=True):
            row.append(r.get("nccl_pick", ""))
    return headers, cells


def _table(rec: dict, run, path: str, why: str) -> str:
    m = rec["measurement"]
    if run.listed:
        where = f"on {m['nodes']} node(s) x {m['gpus_per_node']} {run.gpu}"
    elif run.devices:
        where = f"({len(run.devices)} device line(s) only: nodes unknown) of {run.gpu}"
    else:
        where = f"({run.world_from}; no device lines: GPU and nodes unknown)"
    head = (f"# {path}: {run.tool} {run.tests_version or '(version not printed)'} {run.op} "
            f"(op from the {m['op_from']}), {run.ranks} ranks {where}, "
            f"{'library ' + run.library if run.library else 'library version not printed'}")
    headers, cells = _cells(rec)
    columns = [f"# columns: {run.inferred}"] if run.inferred else []
    return "\n".join([head, *columns, f"# model: {why}",
                      tabulate(cells, headers=headers, tablefmt="plain")])


def _markdown(rec: dict) -> str:
    m = rec["measurement"]
    headers, cells = _cells(rec)
    return "\n".join([f"# {rec['suite']}: {rec['hardware']}, {rec['world_size']} ranks "
                      f"({rec['launch']})", "",
                      "- versions: " + ", ".join(f"{k} {v}" for k, v in rec["versions"].items()),
                      "- measurement: " + ", ".join(f"{k}: {v}" for k, v in m.items()), "",
                      tabulate(cells, headers=headers, tablefmt="github"), ""])
