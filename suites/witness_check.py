"""The witnesses beside each row against this machine's states: launches of one commit
compared pairwise with the gate's witness rule and without it.

    .venv/bin/python suites/witness_check.py [--launches 16] [--transport mpi] [--keep DIR]

``commbench run OPS --transport T --np 2 -b 64K -e 4M --repeat 3`` ``--launches`` times back to
back, each into a folder of its own, then ``commbench compare`` of every ordered pair three
times: as the gate judges (a row whose witness, either one, says it was measured in another
state of the machine is not judged), with the transport's witness alone, and with no witness.
Every row flagged is a false alarm (one commit, nothing changed). The table gives each launch's
witnesses, median and highest over its rows, and its native all-reduce at 1 MiB, so a launch
measured in another state, wholly or in part, shows; then the pairs' false alarms under each
rule. Writes ``results/gate/witness_<machine class>-x<np>.md``; ``--tables DIR`` judges kept
launches again."""

from __future__ import annotations

import argparse
import itertools
import os
import statistics
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gate_check import as_kept, kept, sweep_options  # noqa: E402  (suites/, the script's own folder)


def _launch(folder: str, a) -> None:
    out = subprocess.run([sys.executable, "-m", "commbench", "run", *a.ops, "--transport",
                          a.transport, "--np", str(a.np), "-b", a.b, "-e", a.e, "--repeat",
                          str(a.repeat), "--out", folder, "--label", "gate"],
                         capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"commbench run failed ({out.returncode}): {out.stderr[-800:]}")


def _judged(old: dict, new: dict) -> tuple[int, int]:
    """(rows flagged, rows the witness left unjudged) of one ordered pair."""
    from commbench.results.compare import STATE, compare

    rows, bad = compare(old, new)
    return len(bad), sum(1 for r in rows if r["verdict"] in STATE)


def _keeping(record: dict, fields: tuple[str, ...]) -> dict:
    """``record`` with only the witnesses ``fields`` beside its rows: the gate judges a row
    without a witness as a file written before it was (commbench.results.compare)."""
    from commbench.results.compare import WITNESSES

    drop = set(WITNESSES) - set(fields)
    return {**record, "rows": [{k: v for k, v in r.items() if k not in drop}
                               for r in record["rows"]]}


def _figures(record: dict) -> tuple[float, ...]:
    """(median and highest witness over a launch's rows, the same of the arithmetic witness, its
    native all-reduce at 1 MiB), us."""
    from commbench.results.compare import WITNESSES

    out = []
    for field in WITNESSES:
        seen = [r[field] for r in record["rows"] if field in r] or [float("nan")]
        out += [statistics.median(seen), max(seen)]
    native = [r["time_us"] for r in record["rows"] if (r["op"], r["algo"], r["size"]) ==
              ("all_reduce", "native", 1 << 20)]
    return (*out, native[0] if native else float("nan"))


def main() -> int:
    from commbench.results.compare import WITNESSES, load
    from commbench.results.machine import machine_class

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--launches", type=int, default=16)
    p.add_argument("--transport", default="mpi")
    sweep_options(p)
    a = p.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        folders = kept(a, scratch, "launch", a.launches, _launch)
        records = [load(os.path.join(d, next(f for f in sorted(os.listdir(d))
                                             if f.endswith(f"-{a.transport}-x{a.np}.json"))))
                   for d in folders]
    as_kept(a, records[0])
    when = "judged from kept tables" if a.tables else f"{(time.monotonic() - t0) / 60:.0f} min"
    figures = [_figures(r) for r in records]
    pairs = list(itertools.permutations(range(len(records)), 2))
    rules = (("the gate's (both witnesses read)", WITNESSES),
             ("the transport's witness alone", ("witness_us",)), ("witnesses ignored", ()))
    found = [[_judged(rs[i], rs[j]) for i, j in pairs]
             for rs in ([_keeping(r, fields) for r in records] for _, fields in rules)]
    hw = machine_class("")
    commit = records[0].get("commit", "")
    text = [f"# The witnesses against this machine's states: {hw}, {a.transport}, {a.np} ranks",
            "", f"`.venv/bin/python suites/witness_check.py --launches {a.launches} --transport "
            f"{a.transport} --np {a.np} -b {a.b} -e {a.e} --repeat {a.repeat} "
            f"{' '.join(a.ops)}` ({when}), commit `{commit}`. Each launch's witnesses after each "
            "row's loop (the transport's own all-reduce of 1 MiB; the arithmetic witness, four "
            "adds of 256 KiB), median and highest over its rows, and its native all-reduce at "
            "1 MiB (best round), us:", "",
            "| launch | witness, median | witness, highest | adds, median | adds, highest | "
            "native all_reduce 1 MiB |", "|---:|---:|---:|---:|---:|---:|"]
    text += [f"| {k + 1} | {w:.0f} | {hi:.0f} | {aw:.1f} | {ahi:.1f} | {t:.0f} |"
             for k, (w, hi, aw, ahi, t) in enumerate(figures)]
    text += ["", f"Every ordered pair of launches compared ({len(pairs)}), one commit: every row "
             "flagged is a false alarm.", "",
             "| rule | rows flagged | pairs with a row flagged | rows a witness left unjudged |",
             "|---|---:|---:|---:|"]
    text += [f"| {name} | {sum(f for f, _ in got)} | {sum(1 for f, _ in got if f)} | "
             f"{sum(u for _, u in got)} |" for (name, _), got in zip(rules, found, strict=True)]
    out = os.path.join(os.path.dirname(HERE), "results", "gate", f"witness_{hw}-x{a.np}.md")
    with open(out, "w") as f:
        f.write("\n".join(text) + "\n")
    print(f"wrote {out}")
    return 1 if sum(f for f, _ in found[0]) else 0


if __name__ == "__main__":
    sys.exit(main())
