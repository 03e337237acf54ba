"""nccl-tests and rccl-tests output, read as people keep it: whole logs, pasted excerpts, several
tests in one file, every column set the two tools have printed. Pure: no torch.

What a log holds (facts: ``docs/nccl-tests.md``):

* a header: ``# nccl-tests version 2.18.2 nccl-headers=23007 nccl-library=23007`` (newer builds),
  ``# Collective test starting: all_reduce_perf``, the parameter line (``# nThread 1 nGpus 8
  minBytes 8 maxBytes ... warmup iters: 5 iters: 20 ...``), one line per rank
  (``#  Rank  0 Group  0 Pid 204199 on nid005471 device  0 [0009:01:00] NVIDIA GH200 120GB``;
  no ``Group`` in older builds; ``-g 8``: one Pid drives 8 ranks), ``NCCL version 2.30.3+cuda13.0``
  or rccl's ``rccl-tests: Version ...`` / ``RCCL version : ...``;
* the column header, whose words say which columns follow: ``size count type [redop] [root]``,
  then out-of-place ``time algbw busbw #wrong|error`` and the same in place (old builds: a float
  max error, ``2e-07``, and no ``root``; ``N/A`` where nothing was checked);
* one row per size, then ``# Out of bounds values : 0 OK`` and ``# Avg bus bandwidth : X``.

What pasting does to it, undone here: srun's ``  0: `` and Open MPI's ``[1,0]<stdout>:`` line
prefixes, a markdown indent, runs of spaces, ``NCCL INFO`` and MPI lines between rows, one row cut
in two by them, rows left out (``.......``), a run that ends early (a failure, or no closing
lines: truncated). Fields are split on whitespace, never read at fixed columns. Newer builds'
modes: ``-S 1`` ends each row with a date and time (taken off), ``-C 1`` prints the host's launch
time as ``cputime`` where the op's time was (rows timed by size / algbw instead: :func:`by_algbw`).

A run becomes commbench's results file in :mod:`commbench.results.nccl_tests_record`.

Shapes: a file -> [Run]; a Run -> header facts and rows [Row], each with its out-of-place and
in-place :class:`Timing`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace

from commbench.names import canonical
from commbench.ops import OPS
from commbench.results.nccl_info import NcclSaid, clean_line, nccl_said

__all__ = ["CPU_ALGBW", "DTYPES", "Device", "LogError", "Row", "Run", "Timing", "by_algbw",
           "infer_op", "parse", "perf_op", "settle_op", "world_of_count", "world_of_ratio"]

# nccl-tests' type names -> (commbench's name, bytes per element)
DTYPES = {"int8": ("int8", 1), "char": ("int8", 1), "uint8": ("uint8", 1), "int32": ("int32", 4),
          "int": ("int32", 4), "uint32": ("uint32", 4), "int64": ("int64", 8),
          "uint64": ("uint64", 8), "half": ("float16", 2), "float16": ("float16", 2),
          "float": ("float32", 4), "float32": ("float32", 4), "double": ("float64", 8),
          "float64": ("float64", 8), "bfloat16": ("bfloat16", 2), "f8e4m3": ("float8_e4m3", 1),
          "f8e5m2": ("float8_e5m2", 1), "fp8_e4m3": ("float8_e4m3", 1),
          "fp8_e5m2": ("float8_e5m2", 1)}

_DEVICE = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+(\d+)\s+)?Pid\s+(\d+)\s+on\s+(\S+)\s+"
                     r"device\s+(\d+)\s+\[([^\]]*)\]\s+(.*?)\s*$")
_TOOL = re.compile(r"#\s*(nccl|rccl)-tests version\s+(\S+)(?:.*[nr]ccl-library=(\d+))?")
_RCCL_TESTS = re.compile(r"^rccl-tests:\s*Version\s*(.*?)\s*$")
_NCCL_VERSION = re.compile(r"^NCCL version\s+(\S+)")
_RCCL_VERSION = re.compile(r"^RCCL version\s*:\s*(\S+)")
_ITEMSIZE = {name: size for name, size in DTYPES.values()}  # commbench's dtype name -> bytes
_PERF = re.compile(r"\b([a-z_]+)_perf(?:_mpi)?\b")
_AVG = re.compile(r"^#\s*Avg bus bandwidth\s*:\s*([-+0-9.eE]+|nan|inf)")
_FAILURE = re.compile(r"Test (?:NCCL |CUDA |HIP )?failure")
_NCCL_INFO = re.compile(r"\b(?:NCCL|RCCL) (?:INFO|WARN|TRACE)\b")
_PARAM = re.compile(r"\b(nThread|nGpus|minBytes|maxBytes|validation|graph|unalign)\b:?\s+(-?\d+)")
_ITERS = re.compile(r"\b(warmup iters|agg iters|iters):\s*(\d+)")
_ELIDED = re.compile(r"^\s*(?:\.{3,}|…)\s*$")
# a header line whose leading '#' was lost (a log pasted into an issue outside a code block:
# markdown took each '# ' line for a heading): read as the header line it was
_HASHLESS = re.compile(r"(?:nThread\s+\d|Using devices\b|Rank\s+\d+\s+(?:Group\s+\d+\s+)?Pid\s"
                       r"|size\s+count\s+type\b|\(B\)\s+\(elements\)|Avg bus bandwidth\b"
                       r"|Out of bounds values\b|out-of-place\s+in-place\b"
                       r"|Collective test (?:starting|concluded)\b|(?:nccl|rccl)-tests version\b)")


class LogError(ValueError):
    """A file that is no nccl-tests or rccl-tests log, or a log that says too little."""


@dataclass(frozen=True)
class Device:
    rank: int
    pid: int
    host: str
    device: int
    bus_id: str
    name: str


@dataclass(frozen=True)
class Timing:
    """One half of a row: time (us, the average over the iterations), algbw and busbw (GB/s),
    and either ``wrong`` (elements, newer builds) or ``error`` (max error, older ones); None
    where the log printed ``N/A``. With ``-I 1`` (nccl-tests >= 2.19.2) each half also has its
    iterations' spread, timed by CUDA events (us): fastest, slowest and 99th percentile, and in
    the JSON output every iteration's time (``samples``, the skipped ones left out)."""

    time_us: float
    algbw: float
    busbw: float
    wrong: int | None = None
    error: float | None = None
    min_us: float | None = None
    max_us: float | None = None
    p99_us: float | None = None
    samples: tuple[float, ...] = ()
    cpu_us: float | None = None  # -C 1: the host's launch time the log printed (time_us: size/algbw)


@dataclass(frozen=True)
class Row:
    size: int
    count: int
    dtype: str
    redop: str
    root: int
    out: Timing
    inplace: Timing | None
    line: int

    @property
    def wrong(self) -> int:
        """Wrong elements in either half (0 where neither counted)."""
        return sum(t.wrong or 0 for t in (self.out, self.inplace) if t is not None)

    @property
    def checked(self) -> bool:
        """Whether the log says the results were checked: a count or an error in either half
        (``-c 0`` prints ``N/A`` in both)."""
        return any(t.wrong is not None or t.error is not None
                   for t in (self.out, self.inplace) if t is not None)


@dataclass
class Run:
    """One test of a log (a file may hold several): its header facts, rows and how it ended."""

    op: str = ""
    op_from: str = ""             # where the op came from: header, command, file name, columns
    tool: str = "nccl-tests"
    tests_version: str = ""
    library: str = ""             # NCCL's or RCCL's version, as printed
    params: dict = field(default_factory=dict)
    devices: list[Device] = field(default_factory=list)
    columns: tuple[str, ...] = ()
    rows: list[Row] = field(default_factory=list)
    avg_busbw: float | None = None
    closed: bool = False           # the closing lines were read
    failure: str = ""
    elided: int = 0                # "......." lines: rows the paster left out
    cut_rows: int = 0              # fragments that could not be joined into a row
    first_line: int = 0
    info: list[str] = field(default_factory=list)  # NCCL's own INFO lines inside the run
    world: int = 0                 # where no device line names a rank: the world given (--ranks)
    world_from: str = ""           # or read off the bus factor (world_of_ratio), and which
    cputime: bool = False          # -C 1: the time column is the host's launch time, not the op's
    timestamps: bool = False       # -S 1: each row ends with the date and time it was printed
    untimed: int = 0               # -C 1: rows left out, their algbw too coarse to time them
    inferred: str = ""             # a table pasted without its column header: its columns as
    #                                read off its rows' shape (:func:`shape_columns`), and why

    @property
    def nccl(self) -> NcclSaid | None:
        """What NCCL printed about this run (``NCCL_DEBUG=INFO``), if it printed anything."""
        return nccl_said(self.info)

    @property
    def ranks(self) -> int:
        """Ranks of the run: as many as its device lines name, and at least one more than the
        highest rank they name (an excerpt pasted from the middle of the device lines: ``Rank
        71`` alone is a run of 72 ranks)."""
        named = {d.rank for d in self.devices}
        return max(len(named), max(named) + 1) if named else self.world

    @property
    def listed(self) -> bool:
        """Whether every rank's device line is in the log: only then are its hosts the run's
        nodes and its GPUs per node known."""
        return len({d.rank for d in self.devices}) == self.ranks

    @property
    def hosts(self) -> list[str]:
        return list(dict.fromkeys(d.host for d in self.devices))

    @property
    def gpus_per_node(self) -> int:
        per = [sum(1 for d in self.devices if d.host == h) for h in self.hosts]
        return max(per) if per else 0

    @property
    def gpu(self) -> str:
        names = list(dict.fromkeys(d.name for d in self.devices))
        return names[0] if len(names) == 1 else ", ".join(names)

    @property
    def processes(self) -> int:
        return len({(d.host, d.pid) for d in self.devices})

    @property
    def truncated(self) -> bool:
        """Rows were printed but the run never reached its closing lines nor a failure."""
        return bool(self.rows) and not self.closed and not self.failure


def _columns(line: str) -> tuple[str, ...] | None:
    """The column words of a header line (``# size count type redop root time ...``; ``-C 1``
    prints ``cputime`` for ``time``, ``-S 1`` a last ``timestamp``: :func:`_modes`)."""
    words = line.lstrip("#").split()
    if len(words) >= 6 and words[0] == "size" and words[1] == "count" and \
            ("time" in words or "cputime" in words):
        return tuple(words)
    return None


_REDOPS = ("sum", "prod", "max", "min", "avg", "premulsum", "none")


def shape_columns(toks: list[str]) -> tuple[tuple[str, ...], str] | None:
    """The columns of a row pasted without its table's header, read off its shape, and how:
    ``size count type redop [root] time algbw busbw X time algbw busbw X`` (out of place, then
    in place), where a 13th cell is ``root`` (builds since 2.10 print it; a rooted test's root,
    else -1) and X is ``#wrong`` (an integer, or ``N/A`` without validation) or an older
    build's ``error`` (a float: ``0e+00``). None where the row is no such row: a type and an
    operation nccl-tests prints, and numbers in every other cell."""
    if len(toks) not in (12, 13) or toks[2] not in DTYPES or toks[3] not in _REDOPS:
        return None
    rooted = len(toks) == 13
    if not (toks[0].isdigit() and toks[1].isdigit()) or (rooted and not _integer(toks[4])):
        return None
    half = toks[5:] if rooted else toks[4:]
    if any(_number(t) is None for t in half[:3] + half[4:7]) or \
            any(_number(t) is None and t != "N/A" for t in (half[3], half[7])):
        return None
    check = "#wrong" if all(_integer(t) or t == "N/A" for t in (half[3], half[7])) else "error"
    side = ("time", "algbw", "busbw", check)
    cols = ("size", "count", "type", "redop", *(("root",) if rooted else ()), *side, *side)
    return cols, (f"{len(toks)} cells: {' '.join(cols)} (no column header in the log; read "
                  "off the rows' shape)")


def _integer(tok: str) -> bool:
    return tok.lstrip("-").isdigit()


def _modes(run: Run, cols: tuple[str, ...]) -> tuple[str, ...]:
    """The columns a row's fields are read by, the run's modes noted: ``cputime`` read as the
    time column it stands in for (the run's ``cputime``), a last ``timestamp`` (two fields,
    ``%Y-%m-%d %H:%M:%S``, taken off each row: :data:`_STAMP`) dropped."""
    run.cputime = "cputime" in cols
    run.timestamps = cols[-1] == "timestamp"
    return tuple("time" if w == "cputime" else w for w in cols if w != "timestamp")


_STAMP = re.compile(r"\s+\d{4}-\d{2}-\d{2}\s+\d{2}:\d{2}:\d{2}\s*$")


def _number(tok: str) -> float | None:
    try:
        return float(tok)
    except ValueError:
        return None


def _timing(words: list[str], values: list[str]) -> Timing:
    got = dict(zip(words, values, strict=True))
    wrong = got.get("#wrong")
    error = got.get("error")
    spread = [float(got[k]) if k in got else None for k in ("i_min", "i_max", "i_p99")]
    return Timing(float(got["time"]), float(got["algbw"]), float(got["busbw"]),
                  None if wrong in (None, "N/A") else int(float(wrong)),
                  None if error in (None, "N/A") else float(error), *spread)


def _row(cols: tuple[str, ...], toks: list[str], line: int) -> Row:
    first = cols.index("time")
    lead, rest = cols[:first], cols[first:]
    half = len(rest) // 2 if rest.count("time") == 2 else len(rest)
    head = dict(zip(lead, toks[:first], strict=True))
    out = _timing(list(rest[:half]), toks[first:first + half])
    inplace = _timing(list(rest[half:]), toks[first + half:]) if len(toks) > first + half else None
    dtype = head.get("type", "")
    root = head.get("root", "-1")
    return Row(int(head["size"]), int(head["count"]), DTYPES.get(dtype, (dtype, 0))[0],
               head.get("redop", "none"), int(root) if root.lstrip("-").isdigit() else -1,
               out, inplace, line)


def _fits(cols: tuple[str, ...], toks: list[str]) -> bool:
    """``toks`` are a whole row under ``cols`` (both halves, or the out-of-place one alone)."""
    first = cols.index("time")
    half = first + (len(cols) - first) // 2
    if len(toks) not in (len(cols), half) or not toks[0].isdigit() or not toks[1].isdigit():
        return False
    return all(_number(t) is not None or t == "N/A" for t in toks[first:])


def _filled(cols: tuple[str, ...], toks: list[str]) -> list[str]:
    """``toks`` with the redop column nccl-tests' older builds print blank for an op that
    reduces nothing (all-gather, all-to-all, broadcast: newer ones print ``none``) given back as
    ``none``: a row one word short of its header, a number where the redop would be."""
    if "redop" not in cols or "time" not in cols:
        return toks
    at, first = cols.index("redop"), cols.index("time")
    half = first + (len(cols) - first) // 2
    if len(toks) + 1 in (len(cols), half) and len(toks) > at and _number(toks[at]) is not None:
        return [*toks[:at], "none", *toks[at:]]
    return toks


def _add(run: Run, toks: list[str], line: int) -> None:
    try:
        run.rows.append(_row(run.columns, toks, line))
    except (ValueError, KeyError):
        run.cut_rows += 1


def _op_of(name: str) -> str:
    op = canonical(name)
    return op if op in OPS and OPS[op].bus is not None else ""


def perf_op(text: str) -> str:
    """The collective an nccl-tests binary's name in ``text`` stands for (``all_reduce_perf``,
    ``alltoall_perf_mpi``: ``all_reduce``, ``all_to_all``); '' where none is named."""
    m = _PERF.search(text)
    return _op_of(m.group(1)) if m else ""


def parse(text: str, name: str = "log") -> list[Run]:
    """Every run in ``text`` (a log file's contents); ``name`` (the file's) may name the op.
    Raises :class:`LogError` when no run with a column header is found."""
    runs: list[Run] = []
    run = Run()
    pending_op, pending_from = "", ""
    # a header anywhere: the log's tables are read by their headers, never by their shape
    header = any(_columns(clean_line(x)) for x in text.splitlines())
    fragment: list[str] = []
    fragment_line = 0

    def start(lineno: int) -> Run:
        nonlocal run
        if run.columns or run.rows:
            runs.append(run)
            run = Run()
        run.first_line = run.first_line or lineno
        return run

    for lineno, raw in enumerate(text.splitlines(), 1):
        line = clean_line(raw)
        if not line:
            continue
        if line[0] != "#" and _HASHLESS.match(line):
            line = "# " + line
        if _NCCL_INFO.search(line):
            run.info.append(raw)  # NCCL's own lines, between anything: read by nccl_said
            continue
        if (m := _TOOL.search(line)) and line.startswith("#"):
            start(lineno)
            run.tool = f"{m.group(1)}-tests"
            run.tests_version = m.group(2)
            if m.group(3):
                code = int(m.group(3))
                run.library = run.library or f"{code // 10000}.{code // 100 % 100}.{code % 100}"
            continue
        if "Collective test concluded:" in line:  # rccl-tests' last line names the test
            op = _op_of(line.rsplit(":", 1)[1].strip().removesuffix("_mpi").removesuffix("_perf"))
            if op and (run.rows or run.closed) and not run.op:
                run.op, run.op_from = op, "footer"
            continue
        if "Collective test starting:" in line:
            start(lineno)
            op = _op_of(line.rsplit(":", 1)[1].strip().removesuffix("_mpi").removesuffix("_perf"))
            run.op, run.op_from = op, ("header" if op else "")
            continue
        if line.startswith("# nThread"):
            if run.rows or run.columns:
                start(lineno)
            run.first_line = run.first_line or lineno
            params = {k: int(v) for k, v in _PARAM.findall(line)}
            params |= {k.replace(" ", "_"): int(v) for k, v in _ITERS.findall(line)}
            run.params = params
            if pending_op and not run.op:
                run.op, run.op_from = pending_op, pending_from
            continue
        if m := _DEVICE.match(line):
            run.devices.append(Device(int(m.group(1)), int(m.group(3)), m.group(4), int(m.group(5)),
                                      m.group(6), m.group(7)))
            continue
        if m := _RCCL_TESTS.match(line):
            run.tool, run.tests_version = "rccl-tests", m.group(1) or run.tests_version
            continue
        if m := _NCCL_VERSION.match(line):
            run.library = m.group(1)
            continue
        if m := _RCCL_VERSION.match(line):
            run.tool, run.library = "rccl-tests", m.group(1)
            continue
        if line.startswith("#"):
            if cols := _columns(line):
                if run.rows:
                    start(lineno)
                run.first_line = run.first_line or lineno  # a table pasted without its header
                run.columns = _modes(run, cols)
                if pending_op and not run.op:
                    run.op, run.op_from = pending_op, pending_from
            elif m := _AVG.match(line):
                run.avg_busbw = _number(m.group(1))
                run.closed = True
            continue
        if _FAILURE.search(line):
            run.failure = run.failure or line
            continue
        if _ELIDED.match(line):
            run.elided += 1
            continue
        if run.timestamps:
            line = _STAMP.sub("", line)
        toks = line.split()
        if not run.columns and not header and toks and \
                (shaped := shape_columns(toks)):  # rows pasted without the table's header
            run.columns, run.inferred = shaped
            run.first_line = run.first_line or lineno
            if pending_op and not run.op:
                run.op, run.op_from = pending_op, pending_from
        if run.columns and toks and _number(toks[0]) is not None:
            toks = _filled(run.columns, toks)
            if fragment:  # the rest of a row an interleaved line cut in two?
                joined = _filled(run.columns, fragment + toks)
                fragment = []
                if _fits(run.columns, joined):
                    _add(run, joined, fragment_line)
                    continue
                run.cut_rows += 1
            if not toks[0].isdigit():
                continue
            if _fits(run.columns, toks):
                _add(run, toks, lineno)
            elif len(toks) < len(run.columns):
                fragment, fragment_line = toks, lineno
            continue
        if op := perf_op(line):
            pending_op, pending_from = op, "command line"
            if run.rows or run.closed:
                start(lineno)
            if not run.op and not run.rows:
                run.op, run.op_from = op, "command line"
    if fragment:
        run.cut_rows += 1
    if run.columns or run.rows:
        runs.append(run)
    runs = [r for r in runs if r.columns]
    if not runs:
        raise LogError(f"{name}: no nccl-tests or rccl-tests column header (# size count type ...) "
                       "found: not such a log")
    for r in runs:
        _one_job(r, name)
        by_algbw(r)
        settle_op(r, name)
    return runs


def _one_job(run: Run, name: str) -> None:
    """Refuse a run whose device lines give one rank to two processes: copies of a job, each
    printing its own header and table into one log, their rows mixed with no way to tell whose
    is whose (nccl-tests built without MPI=1 and started by mpirun: every copy is rank 0 of
    one), not one run of their ranks together."""
    seen: dict[int, Device] = {}
    for d in run.devices:
        first = seen.setdefault(d.rank, d)
        if (first.host, first.pid) != (d.host, d.pid):
            copies = sum(1 for x in run.devices if x.rank == d.rank)
            raise LogError(
                f"{name}: line {run.first_line}: rank {d.rank} is listed by {copies} processes "
                f"(pid {first.pid} on {first.host}, pid {d.pid} on {d.host}): {copies} copies of "
                f"a job, each printing its own table into this log, not one run of their ranks "
                "(nccl-tests built without MPI=1 and started by mpirun makes every copy rank 0 "
                "of one; rebuild it with MPI=1)")


def settle_op(run: Run, name: str) -> None:
    """A run that nothing in it names gets its op from the file's name (``X_perf``), else
    from its columns and numbers (:func:`infer_op`); a table pasted without its device lines,
    its op and its world together, where one op alone has a world its bus factor fits
    (:func:`world_of_ratio`)."""
    if not run.op and (op := perf_op(name)):
        run.op, run.op_from = op, "file name"
    if not run.op and not run.ranks:  # a table pasted alone: the op and world that fit together
        fits = []
        for each, record in OPS.items():
            if record.perf and record.bus is not None:
                run.op, run.world = each, 0
                run.world = world_of_ratio(run)
                if run.world and infer_op(run) == each:
                    fits.append((each, run.world))
        run.op, run.world = "", 0
        if len(fits) == 1:
            (run.op, run.world), run.op_from = fits[0], "columns"
            run.world_from = f"read off busbw / algbw, the {run.op} factor"
            return
    if not run.op:
        run.op, run.op_from = infer_op(run), "columns"


def infer_op(run: Run) -> str:
    """The collective a run's columns and numbers allow, when nothing names it: a reduction or
    not (``redop``), a root or not, one rank's block or the whole buffer in ``count``, and
    nccl-tests' bus factor in busbw / algbw. '' when none or several fit."""
    n = run.ranks
    rows = [r for r in run.rows if r.size > 0 and r.count > 0]
    if not n or not rows:
        return ""
    rooted = "root" in run.columns and any(r.root >= 0 for r in rows)
    reduces = rows[0].redop not in ("none", "")
    item = _ITEMSIZE.get(rows[0].dtype, 0)
    per_rank = bool(item) and rows[0].size == rows[0].count * item * n and n > 1
    best = max(rows, key=lambda r: r.out.algbw)
    ratio = best.out.busbw / best.out.algbw if best.out.algbw >= 1.0 else None
    fits = []
    for name, op in OPS.items():
        if not op.perf:
            continue
        if op.rooted != rooted or op.reduces != reduces:
            continue
        # nccl-tests prints its ``paramcount``: one rank's block for every op that moves blocks
        # (all-to-all's too: one peer's share, src/alltoall.cu), the whole buffer for the rest
        if item and per_rank != (op.input in ("block", "blocks")):
            continue
        if ratio is not None and abs(op.bus(n) - ratio) > 0.02 * ratio:
            continue
        fits.append(name)
    return fits[0] if len(fits) == 1 else ""


def world_of_ratio(run: Run, most: int = 4096) -> int:
    """The world a run's rows were measured on, read off nccl-tests' bus factor (busbw / algbw,
    which nccl-tests works out from the world) where no device line names it: the one number of
    ranks whose factor for the run's op lies within every row's printing precision (two
    decimals) of its busbw / algbw, over the rows of algbw >= 1 GB/s; 0 where none or several
    fit (a factor that does not change with the world: broadcast, reduce, send/recv; rows too
    slow to print enough digits; worlds too big to tell apart)."""
    record = OPS.get(run.op)
    if record is None or record.bus is None:
        return 0
    rows = [r.out for r in run.rows if r.out.algbw >= 1.0 and r.out.busbw > 0]
    if not rows:
        return 0
    fit = [n for n in range(2, most + 1)
           if all(abs(record.bus(n) - t.busbw / t.algbw) <=
                  t.busbw / t.algbw * (0.005 / t.algbw + 0.005 / t.busbw) + 1e-12 for t in rows)]
    return fit[0] if len(fit) == 1 else 0


def world_of_count(run: Run, most: int = 1 << 20) -> int:
    """The world read off the ``count`` column where the run's op prints one rank's block in it
    (all-gather, reduce-scatter, all-to-all, gather, scatter: nccl-tests' ``paramcount``, the
    size's elements over the ranks, rounded down to whole 16 B), whatever its busbw prints: the
    one number of ranks that gives every row's count; 0 where the op prints its whole buffer,
    the type's size is unknown, or the rows allow none or several."""
    record = OPS.get(run.op)
    item = _ITEMSIZE.get(run.rows[0].dtype, 0) if run.rows else 0
    if record is None or record.input not in ("block", "blocks") or not 0 < item <= 16:
        return 0
    rows = [r for r in run.rows if r.count > 0 and r.size >= r.count * item]
    if not rows:
        return 0
    big = max(rows, key=lambda r: r.count)
    align = ~(16 // item - 1)
    # the largest row's block bounds the world within one rounding step either side
    low = max(2, big.size // item // (big.count + 16 // item))
    high = min(most, big.size // item // big.count)
    fit = [n for n in range(low, high + 1)
           if all((r.size // item // n) & align == r.count for r in rows)]
    return fit[0] if len(fit) == 1 else 0


CPU_ALGBW = 1.0  # GB/s: under -C 1, the least printed algbw a row is timed from (0.5% at most)


def by_algbw(run: Run) -> None:
    """Under ``-C 1`` (``cputime``) a row's time column is the host's time to launch the op, not
    the op's: each half is timed instead by size / algbw, the figure nccl-tests works its
    bandwidths out from, the printed time kept as ``cpu_us``. A row whose algbw prints too few
    digits for it (below :data:`CPU_ALGBW`) is left out and counted (``untimed``)."""
    if not run.cputime:
        return
    kept = []
    for r in run.rows:
        if r.out.algbw < CPU_ALGBW:
            run.untimed += 1
            continue
        halves = [None if t is None or t.algbw <= 0 else
                  replace(t, time_us=r.size / (t.algbw * 1e3), cpu_us=t.time_us)
                  for t in (r.out, r.inplace)]
        kept.append(replace(r, out=halves[0], inplace=halves[1]))
    run.rows = kept
