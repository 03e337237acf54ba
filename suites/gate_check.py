"""The regression gate on this machine's own noise: no false alarm between two runs of one
commit, every row of a slowed algorithm caught.

    .venv/bin/python suites/gate_check.py [--runs 4] [--np 2] [-b 64K] [-e 4M] [--repeat 3]

``commbench run OPS --np 2 --repeat 3`` ``--runs`` times back to back on the same commit, each
into a folder of its own (no in-run second look), then ``commbench compare`` of every ordered
pair of them, per transport. The targets, checked (exit 1 when one is missed):

* runs of one commit flag no row (rows whose medians differ but whose ranges overlap are listed
  as not judged, which does not fail the gate);
* the second table with one algorithm slowed 2x (each algorithm in turn; every time figure of
  its rows, rounds and quantiles, times 2: suites/plant_regression.py's arithmetic) is flagged
  on every row of that algorithm from 64 KiB up, and on no other row; where the runs' noise is
  too wide to tell, a row of it is listed as not judged instead, and none is passed as no
  regression. The table says how many were flagged and how many not judged, and why.

At 2 ranks (one per core): at 4 ranks on 2 cores a row's run-to-run spread is wider than any
useful threshold (suites/verdict_bench.py measured it). Writes
``results/gate_check_<machine class>-x<np>.md``. ``--keep DIR`` keeps the runs' tables;
``--tables DIR`` judges kept tables again without running (to try a rule on the same runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections import Counter

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from plant_regression import slowed  # noqa: E402  (suites/, the script's own folder)


def _run(folder: str, a, repeat: int | None = None) -> None:
    """``commbench run`` of ``a``'s settings into ``folder`` (``repeat``: its rounds, else
    ``a.repeat``)."""
    out = subprocess.run([sys.executable, "-m", "commbench", "run", *a.ops, "--np", str(a.np),
                          "-b", a.b, "-e", a.e, "--repeat", str(repeat or a.repeat), "--out", folder,
                          "--label", "gate"], capture_output=True, text=True, timeout=3600)
    if out.returncode != 0:
        raise SystemExit(f"commbench run failed ({out.returncode}): {out.stderr[-800:]}")


def sweep_options(p: argparse.ArgumentParser) -> None:
    """The options of the checks that sweep one commit several times (this one and
    suites/witness_check.py): ranks, sizes, rounds, where the tables are kept, the ops."""
    p.add_argument("--np", type=int, default=2)
    p.add_argument("-b", default="64K")
    p.add_argument("-e", default="4M")
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--keep", metavar="DIR", help="keep the runs' tables in DIR, a folder each")
    p.add_argument("--tables", metavar="DIR", help="judge the tables a --keep left in DIR instead "
                   "of running (the table written names their commit)")
    p.add_argument("ops", nargs="*", default=["all_reduce", "all_gather", "reduce_scatter",
                                              "all_to_all", "broadcast"])


def kept(a, scratch: str, name: str, count: int, run) -> list[str]:
    """The folders of ``count`` runs (``name``1, ``name``2, ...) under ``--tables``, else
    ``--keep``, else ``scratch``: each run into its own with ``run(folder, a)``, one after
    another, unless ``--tables`` holds them already."""
    top = a.tables or a.keep or scratch
    folders = [os.path.join(top, f"{name}{k + 1}") for k in range(count)]
    for folder in folders if not a.tables else []:
        run(folder, a)
        print(f"# {os.path.basename(folder)} done", flush=True)
    return folders


def as_kept(a, record: dict) -> None:
    """With ``--tables``, ``a`` takes the settings the kept runs were made with (``record``, one
    of them), not the flags' defaults, so that the command the report prints is theirs."""
    from commbench.names import size_text

    if not a.tables:
        return
    st = record.get("settings", {})
    a.np, a.repeat, a.ops = record["world_size"], st.get("repeat", 1), st.get("ops", a.ops)
    if st.get("sizes"):
        a.b, a.e = size_text(min(st["sizes"])), size_text(max(st["sizes"]))


def _tally(first: dict, second: dict) -> dict:
    """One ordered pair of tables: the gate's flags, its not-judged rows, and per algorithm how
    many of its judged rows a 2x slowdown of it alone gets flagged, listed as not judged, or
    passed as no regression (and how many other rows it flags)."""
    from commbench.results.compare import NOT_JUDGED, compare

    rows, bad = compare(first, second)
    judged = [r for r in rows if r["size"] >= 64 << 10]
    out = {"judged": len(judged), "flagged": len(bad),
           "unjudged": sum(1 for r in judged if r["verdict"] in NOT_JUDGED),
           "ratios": [r["time_ratio"] for r in judged], "planted": {}, "why": Counter()}
    for algo in sorted({r["algo"] for r in judged}):
        rows2, bad2 = compare(first, slowed(second, 2.0, algo))
        target = sum(1 for r in judged if r["algo"] == algo)
        caught = sum(1 for r in bad2 if r["algo"] == algo)
        mine = [r for r in rows2 if r["algo"] == algo and r["size"] >= 64 << 10]
        unjudged = sum(1 for r in mine if r["verdict"] in NOT_JUDGED)
        passed = sum(1 for r in mine if not r["verdict"])
        out["why"].update(r["verdict"] for r in mine if r["verdict"] in NOT_JUDGED)
        out["planted"][algo] = (caught, target, sum(1 for r in bad2 if r["algo"] != algo),
                                unjudged, passed)
    return out


def main() -> int:
    import itertools

    from commbench.results.compare import load
    from commbench.results.machine import machine_class

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", type=int, default=4, help="runs of one commit, back to back; every "
                   "ordered pair of them is compared")
    sweep_options(p)
    a = p.parse_args()
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as scratch:
        folders = kept(a, scratch, "run", a.runs, _run)
        names = sorted(f for f in os.listdir(folders[0]) if f.endswith(".json"))
        tables = {f: [load(os.path.join(d, f)) for d in folders] for f in names}
        commit = tables[names[0]][0].get("commit", "")
    as_kept(a, tables[names[0]][0])
    minutes = (time.monotonic() - t0) / 60
    lines, planted, why = [], {}, Counter()
    for name in names:
        transport = tables[name][0]["rows"][0]["transport"]
        for i, j in itertools.permutations(range(a.runs), 2):
            t = _tally(tables[name][i], tables[name][j])
            why.update(t["why"])
            ratios = t["ratios"] or [float("nan")]  # no row judged: no ratio
            lines.append((transport, i + 1, j + 1, t["judged"], t["flagged"], t["unjudged"],
                          statistics.median(ratios), min(ratios), max(ratios)))
            for algo, (c, n, o, u, ok) in t["planted"].items():
                k = planted.setdefault((transport, algo), [0, 0, 0, 0, 0, 0, 0])
                k[0] += c == n  # every row of the algorithm caught
                k[1] += 1
                k[2] += c
                k[3] += n
                k[4] += o
                k[5] += u
                k[6] += ok
    hw = machine_class("")
    flagged = sum(x[4] for x in lines)
    judged = sum(x[3] for x in lines)
    caught, unjudged, passed, rows = (sum(k[i] for k in planted.values()) for i in (2, 5, 6, 3))
    other = sum(k[4] for k in planted.values())
    every = sum(1 for k in planted.values() if k[0] == k[1])
    reasons = ", ".join(f"{v} {n}" for v, n in why.most_common())
    targets = [  # (target, met, what was found)
        ("two runs of one commit flag no row", not flagged,
         f"{flagged} of {judged} judged rows flagged"),
        ("a 2x slowdown of one algorithm is flagged on every row of it from 64 KiB up, or, "
         "where the runs' noise is too wide to tell, listed as not judged; none passed, no row "
         "of another algorithm flagged", not passed and not other,
         f"{caught} of {rows} flagged, {unjudged} not judged ({reasons}), {passed} passed; "
         f"{other} rows of other algorithms flagged; every row flagged in every pair of runs "
         f"for {every} of {len(planted)} algorithms")]
    missed = [t for t, ok, _ in targets if not ok]
    text = [f"# The regression gate on this machine's noise: {hw}, {a.np} ranks, --repeat "
            f"{a.repeat}", "",
            f"`.venv/bin/python suites/gate_check.py --runs {a.runs} --np {a.np} -b {a.b} -e "
            f"{a.e} --repeat {a.repeat} {' '.join(a.ops)}` "
            f"({'judged from kept tables' if a.tables else f'{minutes:.0f} min'}), commit "
            f"`{commit}`. `commbench run {' '.join(a.ops)} --np {a.np} -b {a.b} -e {a.e} "
            f"--repeat {a.repeat}` {a.runs} times back to back, each into its own folder; "
            "`commbench compare` of every ordered pair (threshold 10% busbw, rows >= 64 KiB "
            "judged). `flagged`: rows the gate calls regressed (target 0); `not judged`: slower "
            "medians within the runs' own spread, at isolated sizes or within the second run's "
            "shift as a whole, sizes faster than the rest of their series, and rows whose "
            "witness says the machine was in another state (listed, exit 0); "
            "`second/first`: the judged rows' ratio of best-round medians, median (min-max): "
            "the machine's run-to-run noise.", "",
            "| transport | first | second | judged | flagged | not judged | second/first |",
            "|---|---:|---:|---:|---:|---:|---|"]
    text += [f"| {t} | {i} | {j} | {n} | {f} | {u} | {m:.2f} ({lo:.2f}-{hi:.2f}) |"
             for t, i, j, n, f, u, m, lo, hi in lines]
    text += ["", "Each algorithm slowed 2x alone in the second table of every pair (every time "
             "figure of its rows, rounds and quantiles, doubled): pairs in which every one of "
             "its judged rows was flagged, its rows flagged in all, its rows the gate listed as "
             "not judged (the runs' noise too wide to tell), its rows it passed as no regression "
             "(the second run that much faster there), and other rows flagged (target: every "
             "row flagged, no other).", "",
             "| transport | algorithm | every row caught | rows caught | not judged | passed "
             "| other rows flagged |",
             "|---|---|---:|---:|---:|---:|---:|"]
    text += [f"| {t} | {algo} | {k[0]} of {k[1]} | {k[2]} of {k[3]} | {k[5]} | {k[6]} | {k[4]} |"
             for (t, algo), k in sorted(planted.items())]
    text += ["", f"In all: of {rows} slowed rows, {caught} flagged, {unjudged} not judged, "
             f"{passed} passed."]
    text += ["", "Targets:", ""] + [f"* {t}: {'met' if ok else 'missed'} ({found})"
                                   for t, ok, found in targets]
    out = os.path.join(os.path.dirname(HERE), "results", f"gate_check_{hw}-x{a.np}.md")
    with open(out, "w") as f:
        f.write("\n".join(text) + "\n")
    print(f"wrote {out}")
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
