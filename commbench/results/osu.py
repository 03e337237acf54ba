"""OSU Micro-Benchmarks' output read as commbench results: the collective latency tests
(``osu_allreduce``, ``osu_alltoall``, ...) and the point-to-point ``osu_latency``.

A test's block, as OMB 5.x to 7.x print it (markdown indents and shell prompts of pasted logs
allowed)::

    $ srun -N2 --ntasks-per-node=4 ./collective/osu_alltoall --validation
    # OSU MPI All-to-All Personalized Exchange Latency Test v7.5
    # Datatype: MPI_CHAR.
    # Size       Avg Latency(us)        Validation
    1                      12.46              Pass

The title names the API (``MPI``, ``MPI-CUDA``, ``MPI-ROCM``, ``NCCL``, ...) and the test; the
columns are ``Avg Latency(us)``, with ``-f`` also ``Min``, ``Max`` and ``Iterations``, with
``--validation`` a ``Pass``/``Fail`` column. OMB prints no world size: it is read from the
launch line before the title (``-n``/``-np``/``--ntasks``, or ``-N`` nodes times
``--ntasks-per-node``, flux's ``--tasks-per-node``; a script's echo of it, ``### Running: srun
...``, too), else given to ``commbench import --ranks``; ``osu_latency`` runs on exactly two
processes (OMB refuses any other count), so its world is two where nothing else says it.

Sizes: OMB's ``Size`` is the message of one rank (its whole buffer for all-reduce, broadcast,
reduce and reduce-scatter; its block to or from each peer for all-gather, all-to-all, gather and
scatter). A row's ``size`` is commbench's (nccl-tests' size column: the whole send or output
buffer), so the block tests' sizes are multiplied by the ranks; ``osu_size`` keeps OMB's. The
time is OMB's average latency (averaged over iterations and ranks; min and max across ranks
with ``-f``): no spread of iterations is printed, so rows are ``spread: false``. A ``Fail`` is
a wrong result (``wrong`` 1, exit 1). Bandwidth tests (``osu_bw``, ``osu_bibw``, ``osu_mbw_mr``)
and the non-blocking ones measure what no commbench op does, and ``osu_barrier`` prints no Size
column: they are left out, and said so.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass, field

from commbench.names import canonical
from commbench.ops import OPS
from commbench.results.records import SCHEMA

__all__ = ["OsuRun", "is_osu", "parse", "record"]

_TITLE = re.compile(r"^#\s*OSU\s+(?P<api>\S+)\s+(?P<test>.+?)\s+Test\s+v(?P<version>\S+)\s*$")
_DATATYPE = re.compile(r"^#\s*Datatype:\s*(?P<dtype>\S+?)\.?\s*$")
_LAUNCH = re.compile(r"(?:^|[\s/])(?:srun|mpirun|mpiexec\S*|aprun|jsrun|flux)\s")
# the part of OMB's latency test titles that is no collective's name
_EXTRA = re.compile(r"personalizedexchange$")
_DTYPES = {"MPI_CHAR": ("int8", 1), "MPI_SIGNED_CHAR": ("int8", 1), "MPI_INT": ("int32", 4),
           "MPI_FLOAT": ("float32", 4), "MPI_DOUBLE": ("float64", 8)}


@dataclass
class OsuRun:
    """One test's block: title, launch line, columns and rows (size, avg, min, max, valid)."""

    api: str
    test: str
    version: str
    first_line: int
    command: str = ""
    datatype: str = ""
    columns: tuple[str, ...] = ()
    rows: list[tuple[int, float, float | None, float | None, bool | None, int]] = field(
        default_factory=list)

    @property
    def op(self) -> str:
        """The collective of the title (``Allreduce Latency`` -> all_reduce; ``Latency``,
        osu_latency's, -> pingpong); '' for tests of no commbench op (bandwidth, non-blocking,
        barrier, whose output has no Size column)."""
        if not self.test.endswith("Latency"):
            return ""
        flat = _EXTRA.sub("", re.sub(r"[^a-z]", "", self.test[: -len("Latency")].lower()))
        op = canonical(flat or "osu_latency")
        return op if op in OPS and OPS[op].bus is not None and OPS[op].input != "none" else ""

    @property
    def per_peer(self) -> bool:
        """Whether OMB's Size is one rank's block (per peer, or its part of a gather) rather
        than its whole buffer: a block op, or one that splits its buffer without reducing."""
        rec = OPS[self.op]
        return rec.input == "block" or (rec.input == "blocks" and not rec.reduces)

    @property
    def ranks(self) -> int:
        """The world the launch line asks for; 0 where it says none."""
        c = self.command
        n = re.search(r"(?:^|\s)(?:-n|-np|--ntasks|--np)[=\s]*(\d+)", c)
        if n:
            return int(n.group(1))
        nodes = re.search(r"(?:^|\s)(?:-N|--nodes)[=\s]*(\d+)", c)
        per = re.search(r"--n?tasks-per-node[=\s]*(\d+)", c)  # srun's; flux's
        if nodes and per:
            return int(nodes.group(1)) * int(per.group(1))
        return 0

    @property
    def two(self) -> bool:
        """Whether this is ``osu_latency``, which OMB runs on exactly two processes."""
        return self.test == "Latency"

    @property
    def transport(self) -> str:
        api = self.api.upper()
        return "nccl" if "NCCL" in api else "rccl" if "RCCL" in api else "mpi"


def is_osu(text: str) -> bool:
    return any(_TITLE.match(line.strip()) for line in text.splitlines()[:10000])


def parse(text: str) -> list[OsuRun]:
    """Every test block of ``text``, in order (those of no commbench op included: the caller
    says which it leaves out)."""
    runs: list[OsuRun] = []
    command, run = "", None
    for k, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        m = _TITLE.match(line)
        if m:
            run = OsuRun(m["api"], m["test"], m["version"], k, command)
            runs.append(run)
            command = ""
            continue
        if "osu_" in line and (_LAUNCH.search(line) or line.startswith(("$", "./"))):
            command, run = line, None  # the next block's launch
            continue
        if run is None:
            continue
        m = _DATATYPE.match(line)
        if m:
            run.datatype = m["dtype"]
            continue
        if line.startswith("#") and "Size" in line:
            run.columns = tuple(c.strip() for c in re.split(r"\s{2,}", line.lstrip("#").strip()))
            continue
        toks = line.split()
        if run.columns and toks and toks[0].isdigit() and len(toks) >= 2:
            try:
                values = [float(t) for t in toks[1:] if t not in ("Pass", "Fail")]
            except ValueError:
                run = None
                continue
            valid = (toks[-1] == "Pass") if toks[-1] in ("Pass", "Fail") else None
            cols = [c for c in run.columns[1:] if c != "Validation"]
            named = dict(zip(cols, values, strict=False))
            avg = next((v for c, v in named.items() if "Latency" in c), values[0])
            run.rows.append((int(toks[0]), avg, named.get("Min Latency(us)"),
                             named.get("Max Latency(us)"), valid, k))
        elif line and run.rows:
            run = None  # the block has ended
    return runs


def record(run: OsuRun, ranks: int, source: str) -> dict:
    """``run`` as a commbench results file of ``ranks`` ranks (module docstring)."""
    op = OPS[run.op]
    dtype, item = _DTYPES.get(run.datatype, ("int8", 1))
    factor = op.bus(ranks) if op.bus and ranks > 1 else 1.0
    rows = []
    for size, avg, lo, hi, valid, line in run.rows:
        whole = size * ranks if run.per_peer else size
        alg = whole / avg / 1e3 if avg > 0 else 0.0
        row = {"op": run.op, "algo": "native", "transport": run.transport, "size": whole,
               "requested": whole, "osu_size": size, "count": whole // item, "type": dtype,
               "redop": "sum" if op.reduces else "none", "root": 0 if op.rooted else -1,
               "time_us": avg, "min_us": avg, "avg_us": avg, "spread": False,
               "n_samples": None, "algbw": alg, "busbw": alg * factor,
               "wrong": int(valid is False), "line": line}
        if lo is not None:
            row["min_over_ranks_us"], row["max_over_ranks_us"] = lo, hi
        if valid is False:
            row["flag"] = "OSU validation: Fail"
        rows.append(row)
    return {"schema": SCHEMA, "suite": "osu",
            "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "host": "", "hardware": f"OSU {run.api}", "world_size": ranks,
            "launch": run.command or "not in the log", "versions": {"osu": run.version},
            "commit": None,
            "measurement": {"statistic": "OSU's average latency over iterations and ranks (no "
                            "spread printed)", "source": source, "test": run.test,
                            "api": run.api, "datatype": run.datatype or "not printed",
                            "osu_size": "one rank's message; size: the whole buffer "
                            "(nccl-tests' convention)"},
            "rows": rows}
