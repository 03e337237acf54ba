"""``commbench compare OLD NEW``: per-row ratios between two results files, and a regression gate.

Rows are matched on (op, algo, transport, type, redop, root, size). Each run's row carries its
own spread, a *range* of its typical time:

* measured with ``--repeat R`` (``rounds_us``): from its fastest round's median to its slowest's,
  the run-to-run spread measured inside the run;
* else from the lower decile of its iterations (``p10_us``; ``min_us`` in files without it) to
  their median;
* imported from a log that prints no spread (``spread`` false: nccl-tests' one average per
  size): that one figure, and the report says how many such rows there were.

A row *regresses* when, at a size of at least ``min_size`` (default 64 KiB; smaller messages
measure latency, whose noise on a shared machine exceeds any threshold worth setting), the new
run's range lies wholly above the old run's by more than the threshold: the new range's low end
is more than ``1/(1 - threshold)`` times the old range's high end (default 10% in busbw, 11.1% in
time), at three consecutive sizes of the same series (op, algo, transport, ...; a series with
fewer sizes at or above ``min_size`` must regress at all of them). A row whose median is that
much slower but whose ranges overlap is *not judged*: the runs' own spread cannot tell a
regression from the machine's noise there; so is a row beyond the spread at fewer consecutive
sizes (a slow spell of a shared machine strikes one or two sizes; a regression of the code
strikes a range of them: docs/decisions.md). Where the new run is slower as a whole, or one
op's series are (:class:`Shift`: the median time ratio of the judged rows, over two series or
more for the run, three or more for an op, past the threshold's time growth), the two runs were
measured in different states of the machine: this machine's slow spells slow a whole run, or
one op's every algorithm, by 1.5 to 2.3x and some of their rows 5 to 9x (docs/decisions.md), so
none of those rows is judged (``run shifted``, ``op shifted``); rows of imported logs
(nccl-tests, OSU) give no shift and are judged as they stand.
A run faster as a whole (its median time ratio below the threshold's the other way), or an op's
series so, was measured in another state of the machine just the same, and hides a slowdown of
the code (a 2x slowdown in a run the machine made 1.8x faster looks unchanged; in one the
machine made 2x faster at a run's median, 4x at one row, it looks as fast as the run): none of
its rows passes (``run faster``, ``op faster``: not judged), and a row regressed even there is
flagged. Nor, in two runs of commbench's own, does a row faster than the rest of its series by
more than the threshold (the median time ratio of the series' other judged sizes, three or
more, so that one slow spell among them does not move it, over the threshold's growth), at
fewer than three consecutive sizes (``faster alone``): as a row slower at one or two sizes is a
slow spell of the new run, one faster there is a slow spell of the old one, and a slowdown of
the code at that size hides behind it; a range of sizes faster than the rest is the code's, and
judged.
Where both runs carry a witness beside their rows (``witness_us``: the transport's own all-reduce
of 1 MiB, timed after each row's loop; :mod:`commbench.collectives.measure`), a row whose new
witness is above every witness of its series in the old run by more than the threshold's growth
(or whose old one is below every one in the new run by as much) was measured in another state of
the machine: this one runs its MPI transport 2.7x slower for seconds to minutes at a time, at
some series of a run and not others. Such a row is not judged when slower (``machine slower``)
nor, in a faster state, when it would pass (``machine faster``), and it does not break a range
of regressed sizes around it: it says nothing either way. A row's witness is set against the
other run's whole series, not one figure: a state moves every size measured in it, the
witness's own noise one size at a time. A second witness beside it (``witness_add_us``: four
in-place adds of 256 KiB, the arithmetic commbench's own algorithms do between their messages)
is read the same way, on its own: a milder state of this machine slows those algorithms by 1.2
to 1.9x and the adds by 1.2 to 1.5x, and leaves the transport's own call as it was. A change of
the transport itself moves the witness too, and is reported the same way, not flagged.
Not-judged rows are listed and do not fail the gate.

Every row must be sound before anything is compared: a size that is not a whole number >= 0, a
time (median or best) that is not a finite number > 0, a busbw that is not finite and >= 0 (> 0
at sizes above 0), or a row that is not an object with every field, makes the file unreadable.

Exit status: 0 no regression, 1 regression, 2 unreadable, unsound or incomparable files.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass

from tabulate import tabulate

from commbench.results.files import RESULTS_LIMIT, FileRefused, read_json
from commbench.results.records import SCHEMA

__all__ = ["NOT_JUDGED", "CompareError", "Shift", "compare", "load", "report", "run_shift",
           "shifted"]

KEY = ("op", "algo", "transport", "type", "redop", "root", "size")
RUN = 3  # consecutive sizes of a series that must regress together
NEEDED = (*KEY, "time_us", "min_us", "busbw")
NOT_JUDGED = ("within spread", "isolated", "run shifted", "op shifted", "run faster",
              "op faster", "faster alone", "machine slower", "machine faster")  # rows not judged
ALONE = 3  # other sizes of its series a row is set beside (faster alone): one slow spell among
# them then leaves their median as it was
OP_SERIES = 3  # series an op needs for a shift of its own: one regressed series is a minority
IMPORTED = ("nccl-tests", "osu")  # the suites of imported logs: no shift (run_shift)
STATE = ("machine slower", "machine faster")  # the witness's verdicts (_witnessed)
# the witnesses a row may carry (collectives.measure): the transport's own all-reduce, and the
# device's arithmetic (the in-place adds commbench's own algorithms do between their messages)
WITNESSES = ("witness_us", "witness_add_us")
MAX_SIZE = 1 << 50  # bytes: a PiB per call is past any sweep; larger is a corrupt file


class CompareError(ValueError):
    """A results file that cannot be compared: unreadable, wrong schema, other world size."""


def load(path: str) -> dict:
    try:
        record = read_json(path, "results", RESULTS_LIMIT)
    except FileRefused as exc:
        raise CompareError(str(exc)) from None
    if not isinstance(record, dict) or "schema" not in record:
        raise CompareError(f"{path}: not a commbench results file (no 'schema' field)")
    if record["schema"] != SCHEMA:
        raise CompareError(f"{path}: schema {record['schema']!r}, this commbench reads {SCHEMA!r}")
    rows = record.get("rows")
    if not isinstance(rows, list):
        raise CompareError(f"{path}: 'rows' must be a list")
    seen: dict[tuple, int] = {}
    for k, row in enumerate(rows):
        missing = [f for f in NEEDED if not isinstance(row, dict) or f not in row]
        if missing:
            raise CompareError(f"{path}: row {k} lacks {', '.join(missing)}")
        key = (*(str(row[f]) for f in KEY), str(row.get("requested")))  # sizes that round alike
        if key in seen:
            raise CompareError(f"{path}: row {k} ({row['op']} {row['algo']} {row['transport']} "
                               f"size {row['size']!r}) repeats row {seen[key]}: a results file "
                               "holds each configuration once")
        seen[key] = k
        why = _unsound(row, record.get("world_size"))
        if why:
            raise CompareError(f"{path}: row {k} ({row['op']} {row['algo']} {row['transport']}"
                               f" size {row['size']!r}): {why}")
    if not isinstance(record.get("world_size"), int):
        raise CompareError(f"{path}: 'world_size' must be an integer")
    return record


def _number(v) -> bool:
    return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)


def _unsound(row: dict, ranks) -> str:
    """Why ``row`` cannot be compared ('' when it can). A world of one moves nothing: its busbw
    is 0 at every size."""
    size = row["size"]
    if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_SIZE:
        return f"size = {size!r:.40}: must be a whole number of bytes in 0..2**50"
    for field in ("time_us", "min_us"):
        if not _number(row[field]) or row[field] <= 0:
            return f"{field} = {row[field]!r}: must be a finite number > 0"
    b = row["busbw"]
    if not _number(b) or b < 0 or (size > 0 and b == 0 and ranks != 1):
        return f"busbw = {b!r}: must be a finite number, > 0 at a size above 0"
    return ""


def typical(row: dict) -> tuple[float, float]:
    """(low, high) of a row's typical time, us: the range of its rounds' medians, else its
    iterations' lower decile to median; the median always inside it (module docstring)."""
    median = row["time_us"]
    rounds = row.get("rounds_us")
    if row.get("spread") is False:
        return median, median
    if isinstance(rounds, list) and len(rounds) > 1 and all(_number(t) and t > 0 for t in rounds):
        return min(min(rounds), median), max(max(rounds), median)
    low = row.get("p10_us", row["min_us"])
    low = low if _number(low) and low > 0 else row["min_us"]
    return min(low, median), median


def compare(old: dict, new: dict, threshold: float = 0.10, min_size: int = 64 << 10,
            shift: Shift | None = None) -> tuple[list[dict], list[dict]]:
    """(every matched row with its ratios, ranges and verdict, the regressed rows). A row's
    ``verdict``: ``REGRESSED``, one of :data:`NOT_JUDGED`, or ''. ``shift``: the new run's
    :func:`run_shift`, where ``new`` holds a part of it only (some series measured again); None:
    the shift of the rows given."""
    if not 0 < threshold < 1:
        raise CompareError(f"threshold={threshold}: must be between 0 and 1")
    if old["world_size"] != new["world_size"]:
        raise CompareError(f"world sizes differ: {old['world_size']} ranks against "
                           f"{new['world_size']}; results of different worlds do not compare")
    pairs = _pairs(old, new)
    own = _own(old) and _own(new)
    limit = 1 / (1 - threshold)  # a busbw drop of `threshold` is a time growth of this factor
    if shift is None:
        shift = _shift(pairs, min_size) if own else Shift()
    state = _witnessed(pairs, min_size, limit) if own else {}
    out, bad = [], []
    for o, r in pairs:
        key = tuple(r[k] for k in KEY)
        ratio = r["busbw"] / o["busbw"] if o["busbw"] > 0 else float("nan")
        old_range, new_range = typical(o), typical(r)
        judged = r["size"] >= min_size and o["busbw"] > 0
        flat = r.get("spread") is False or o.get("spread") is False
        moved = shift.moved(_op(r), limit) if own else ""  # imported logs: as they stand
        witness = state.get(key, "")
        moved = moved or (witness if witness == "machine slower" else "")
        slower = judged and r["time_us"] > o["time_us"] * limit
        regressed = judged and not moved and new_range[0] > old_range[1] * limit
        verdict = ""
        if slower and not regressed:  # not judged: in a shifted run or op, else within spread
            verdict = moved or "within spread"
        elif judged and not slower and own:  # in a run or op faster as a whole
            verdict = shift.faster(_op(r), limit) or (witness if witness == "machine faster"
                                                      else "")
        row = {**dict(zip(KEY, key)), "old_busbw": o["busbw"], "new_busbw": r["busbw"],
               "ratio": ratio, "time_ratio": r["time_us"] / o["time_us"], "old_us": o["time_us"],
               "new_us": r["time_us"], "new_min_us": r["min_us"], "old_range": old_range,
               "new_range": new_range, "regressed": regressed,
               **{field: (o.get(field), r.get(field)) for field in WITNESSES},
               "verdict": verdict,
               "no_spread": flat, "own_run": own}
        out.append(row)
    series: dict[tuple, list[dict]] = {}
    for row in out:
        if row["size"] >= min_size:
            series.setdefault(_series(row), []).append(row)
    for rows in series.values():
        rows.sort(key=lambda row: row["size"])
        run = min(RUN, len(rows))  # a shorter series must regress at every size
        # a size measured in another state of the machine says nothing either way: the sizes
        # on either side of it are consecutive
        live = [row for row in rows if row["verdict"] not in STATE]
        slow = [row["regressed"] for row in live]
        for i, row in enumerate(live):
            row["regressed"] = any(all(slow[j:j + run]) for j in range(max(0, i - run + 1),
                                                                       min(i, len(live) - run) + 1))
            if slow[i] and not row["regressed"]:
                row["verdict"] = "isolated"
        if own:
            _alone(rows, limit)
    for row in out:
        if row["regressed"]:
            row["verdict"] = "REGRESSED"
    bad = [row for row in out if row["regressed"]]
    return out, bad


def _alone(rows: list[dict], limit: float) -> None:
    """Mark ``faster alone`` each passed row of one series (its judged sizes, by size) whose time
    ratio, times ``limit``, is below the median ratio of the series' other rows (:data:`ALONE`
    or more), at fewer than :data:`RUN` consecutive sizes: one or two sizes moved apart from
    their series, the faster way, as a slow spell strikes them; a range of sizes so is the
    code's (module docstring)."""
    apart = []
    for i, row in enumerate(rows):
        others = [x["time_ratio"] for k, x in enumerate(rows) if k != i and x["old_busbw"] > 0]
        apart.append(row["old_busbw"] > 0 and len(others) >= ALONE
                     and row["time_ratio"] * limit < statistics.median(others))
    for i, row in enumerate(rows):
        ranged = any(all(apart[j:j + RUN]) for j in range(max(0, i - RUN + 1),
                                                         min(i, len(rows) - RUN) + 1))
        if apart[i] and not ranged and not row["verdict"] and not row["regressed"]:
            row["verdict"] = "faster alone"


def _witnessed(pairs: list[tuple[dict, dict]], min_size: int, limit: float) -> dict[tuple, str]:
    """Per row (its key) measured in another state of the machine than its old row (module
    docstring), read from each witness (:data:`WITNESSES`) on its own: 'machine slower' where its
    new witness is above every witness of its series in the old run by more than ``limit``, or
    its old one below every one in the new run by as much; 'machine faster' the other way round;
    slower wins where the two witnesses disagree. A row's witness is set against the other run's
    whole series, not against one figure: a state moves every size measured in it, the witness's
    own noise one size at a time. Only series whose every judged row carries that witness in
    both runs, two rows or more."""
    out: dict[tuple, str] = {}
    for field in WITNESSES:
        seen: dict[tuple, list[tuple[tuple, float, float]]] = {}
        for o, r in pairs:
            if r["size"] >= min_size and o["busbw"] > 0:
                seen.setdefault(_series(r), []).append((tuple(r[k] for k in KEY),
                                                         o.get(field), r.get(field)))
        for rows in seen.values():
            if len(rows) < 2 or not all(_number(w) and w > 0 for _, *ws in rows for w in ws):
                continue
            lo_old, hi_old = min(w for _, w, _ in rows), max(w for _, w, _ in rows)
            lo_new, hi_new = min(w for _, _, w in rows), max(w for _, _, w in rows)
            for key, old, new in rows:
                slower = new > hi_old * limit or old * limit < lo_new
                faster = new * limit < lo_old or old > hi_new * limit
                if slower or faster:
                    said = "machine slower" if new > old else "machine faster"
                    out[key] = "machine slower" if "machine slower" in (said, out.get(key)) \
                        else said
    return out


def _pairs(old: dict, new: dict) -> list[tuple[dict, dict]]:
    """(old row, new row) of every row of ``new`` that ``old`` has, in ``new``'s order."""
    before = {tuple(r[k] for k in KEY): r for r in old["rows"]}
    return [(before[key], r) for r in new["rows"] if (key := tuple(r[k] for k in KEY)) in before]


def _own(record: dict) -> bool:
    """Whether ``record`` is a run commbench measured, not a log it imported."""
    return record.get("suite") not in IMPORTED


@dataclass(frozen=True)
class Shift:
    """How much slower the new run is than the old one as a whole (``run``: the median time
    ratio, new/old, of the judged rows, where they are of two series or more) and each op's
    (``ops``: the same over the rows of that op over one transport, where they are of
    :data:`OP_SERIES` series or more, so that one series regressed alone is a minority of them);
    1.0 where not read."""

    run: float = 1.0
    ops: tuple[tuple[str, float], ...] = ()  # (op and transport: "all_reduce (mpi)", shift)

    def moved(self, op: str, limit: float) -> str:
        """The verdict of a slower row of ``op`` that the shift leaves unjudged ('' if none)."""
        if self.run > limit:
            return "run shifted"
        return "op shifted" if dict(self.ops).get(op, 1.0) > limit else ""

    def faster(self, op: str, limit: float) -> str:
        """The verdict of a row of ``op`` no slower than the old one's, where the new run, else
        ``op``'s series, is faster as a whole past the threshold's time growth the other way
        ('' where neither is): not judged, for the machine sped the run, and what the code did
        to the row cannot be told (a 2x slowdown in a run 1.8x faster looks unchanged)."""
        if self.run * limit < 1:
            return "run faster"
        return "op faster" if dict(self.ops).get(op, 1.0) * limit < 1 else ""


def run_shift(old: dict, new: dict, min_size: int = 64 << 10) -> Shift:
    """The new run's :class:`Shift` against the old one, of two runs that commbench measured.
    Imported logs (nccl-tests, OSU) give none: a cluster measured slower at every size after a
    change of driver or fabric is what its owner compares two logs for, not a slow spell of a
    shared machine."""
    return _shift(_pairs(old, new), min_size) if _own(old) and _own(new) else Shift()


def _shift(pairs: list[tuple[dict, dict]], min_size: int) -> Shift:
    """:func:`run_shift` of (old row, new row) pairs of two runs of commbench's own."""
    judged = [(o, r) for o, r in pairs if r["size"] >= min_size and o["busbw"] > 0]
    ratios = _medians([(_op(r), _series(r), r["time_us"] / o["time_us"]) for o, r in judged])
    return Shift(ratios.pop(None, 1.0), tuple(sorted(ratios.items())))


def _series(row: dict) -> tuple:
    """A row's series: its key but the size."""
    return tuple(row[k] for k in KEY[:-1])


def _op(row: dict) -> str:
    """A row's op over its transport (measured apart, in spells of their own)."""
    return f"{row['op']} ({row['transport']})"


def _medians(rows: list[tuple[str, tuple, float]]) -> dict:
    """From (op, series, time ratio) of the judged rows: the run's median ratio (key None) where
    they are of two series or more, and each op's where its rows are of :data:`OP_SERIES` series
    or more."""
    out: dict = {}
    if len({s for _, s, _ in rows}) >= 2:
        out[None] = statistics.median(t for _, _, t in rows)
    for op in sorted({op for op, _, _ in rows}):
        mine = [(s, t) for o, s, t in rows if o == op]
        if len({s for s, _ in mine}) >= OP_SERIES:
            out[op] = statistics.median(t for _, t in mine)
    return out


def _witness(row: dict, field: str) -> str:
    """The row's witness ``field``, old -> new ('' unless both runs measured one)."""
    old, new = row.get(field) or (None, None)
    return f"{old:.0f}->{new:.0f}" if _number(old) and _number(new) else ""


def _span(lo_hi: tuple[float, float]) -> str:
    return f"{lo_hi[0]:.1f}-{lo_hi[1]:.1f}"


def shifted(rows: list[dict], threshold: float, min_size: int) -> str:
    """Lines saying that the new run is slower as a whole, or one op's series are ('' when
    neither is): the median time ratio of the judged rows, over two series or more (the run) or
    :data:`OP_SERIES` or more (an op), past the threshold's time growth. Rows of commbench's own
    runs so shifted are not judged (``run shifted``, ``op shifted``): the machine's state moved
    between the runs, as often as the code did. Rows of imported logs are judged as they stand,
    and the line says so (:func:`run_shift`). A run faster as a whole is said so where rows of
    it are left unjudged for it (``run faster``)."""
    limit = 1 / (1 - threshold)
    judged = [r for r in rows if r["size"] >= min_size and r["old_busbw"] > 0]
    own = [r for r in judged if r.get("own_run", True)]
    again = ("for a shift that many series share is the machine's state during one of the "
             "runs as often as the code: rerun both, one after the other, to judge them")
    for some, moved in ((own, True), (judged, False)):
        found = _medians([(_op(r), _series(r), r["time_ratio"]) for r in some])
        whole = found.pop(None, 1.0)
        fast = sum(1 for r in some if r["verdict"] == "run faster") if moved else 0
        if fast and whole * limit < 1:
            return (f"# the new run is faster as a whole: its median row takes {whole:.2f}x the "
                    f"old one's time, over {len(some)} judged rows of "
                    f"{len({_series(r) for r in some})} series; none of its rows passes ({fast} "
                    f"not judged, rows regressed even so flagged), {again}")
        if whole > limit:
            head = (f"# the new run is slower as a whole: its median row takes {whole:.2f}x the "
                    f"old one's time, over {len(some)} judged rows of "
                    f"{len({_series(r) for r in some})} series")
            if moved:
                return f"{head}; no row of it is judged, {again}"
            return (f"{head} (rows of imported logs, judged as they stand); where the logs were "
                    "measured on a shared machine, rerun both before trusting the rows flagged")
        if moved:
            lines = []
            for op, t in found.items():
                mine = [r for r in some if _op(r) == op]
                where = (f"its median row takes {t:.2f}x the old one's time, over {len(mine)} "
                         f"judged rows of {len({_series(r) for r in mine})} series")
                if t > limit:
                    lines.append(f"# {op} is slower as a whole in the new run: {where}; no row of "
                                 f"{op} is judged, {again}")
                elif any(r["verdict"] == "op faster" for r in mine):
                    lines.append(f"# {op} is faster as a whole in the new run: {where}; none of "
                                 f"its rows passes, {again}")
            if lines:
                return "\n".join(lines)
    return ""


def report(rows: list[dict], bad: list[dict], threshold: float, min_size: int) -> str:
    table = [[r["op"], r["algo"], r["transport"], r["size"], f"{r['old_us']:.1f}",
              f"{r['new_us']:.1f}", f"{r['time_ratio']:.3f}", _span(r["old_range"]),
              _span(r["new_range"]), f"{r['ratio']:.3f}", *(_witness(r, f) for f in WITNESSES),
              r["verdict"]] for r in rows]
    text = tabulate(table, headers=["op", "algo", "transport", "size", "old(us)", "new(us)",
                                    "time new/old", "old range(us)", "new range(us)",
                                    "busbw new/old", "witness(us)", "adds(us)", "verdict"],
                    tablefmt="github", disable_numparse=True)  # the precision chosen above
    test = (f"the new run's range of typical times (rounds' medians, else lower decile to median"
            f" of its iterations) above the old run's by > {1 / (1 - threshold) - 1:.1%} (busbw "
            f"down > {threshold:.0%}), at >= {min_size} B, over {RUN} consecutive sizes of a "
            "series")
    verdict = (f"# {len(bad)} of {len(rows)} rows regressed: {test}" if bad else
               f"# no regression in {len(rows)} matched rows ({test})")
    unjudged = [r for r in rows if r["verdict"] in NOT_JUDGED]
    if unjudged:
        spread = sum(1 for r in unjudged if r["verdict"] == "within spread")
        whole = sum(1 for r in unjudged if r["verdict"] in ("run shifted", "op shifted"))
        fast = sum(1 for r in unjudged if r["verdict"] in ("run faster", "op faster"))
        alone = sum(1 for r in unjudged if r["verdict"] == "faster alone")
        state = sum(1 for r in unjudged if r["verdict"] in STATE)
        slow = len(unjudged) - fast - alone - state
        if slow:
            verdict += (f"\n# {slow} rows not judged: slower by > "
                        f"{1 / (1 - threshold) - 1:.1%} in the median, but {spread} within the "
                        f"runs' own spread and {slow - spread - whole} beyond it at fewer than "
                        f"{RUN} consecutive sizes" + (f", {whole} in a run or op slower as a "
                                                       "whole" if whole else "") +
                        " (the machine's noise cannot be told from the code's)")
        if state:
            verdict += (f"\n# {state} rows not judged: a witness beside them (the transport's "
                        "own all_reduce of 1 MiB, or four adds of 256 KiB, timed after each row's "
                        "loop) moved by more than "
                        f"{1 / (1 - threshold) - 1:.1%} between the runs, beyond every witness "
                        "of their series in the other run: the machine, or the transport, was "
                        "in another state; slower rows of a slower state and others of a faster "
                        "one cannot be told from the code's")
        if fast:
            verdict += (f"\n# {fast} rows not judged: no slower than the old run's, in a new run "
                        f"(or op) faster as a whole (its median row under {1 - threshold:.2f}x "
                        "the old one's time: a slowdown of the code hides in a run the machine "
                        "sped)")
        if alone:
            verdict += (f"\n# {alone} rows not judged: their time new/old under "
                        f"{1 - threshold:.2f}x the median of the other sizes of their series, at "
                        f"fewer than {RUN} consecutive sizes: a size that moved apart from its "
                        "series, the faster way, is the machine's (a slow spell of the old run "
                        "there), and a slowdown of the code at that size hides behind it")
    flat = sum(1 for r in rows if r.get("no_spread"))
    if flat:
        verdict += (f"\n# {flat} of {len(rows)} rows come from logs that print no spread "
                    "(nccl-tests, OSU: one average per size): judged on that average alone, as "
                    "its whole range")
    return text + "\n" + verdict
