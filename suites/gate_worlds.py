"""Rounds in one world against rounds in fresh worlds: would the regression gate be better
served if each ``--repeat`` round ran in a world of its own?

    .venv/bin/python suites/gate_worlds.py [--worlds 8] [--runs 4] [--np 2] [--splits 60]

A row's ``--repeat`` rounds all run in one world (one set of rank processes), so the range the
gate judges by holds the spread within a world and not the spread between worlds, which on a
shared machine is the larger (a whole MPI world 1.4x slower than the others, every round of it
alike: ``results/machine_noise_amd-epyc-2c.md``). Measured here side by side, interleaved:
``--runs`` runs of ``commbench run OPS --repeat 3`` (three rounds in one world each) and
``--worlds`` runs of ``--repeat 1`` (one round a world). Same-world tables are the runs
themselves, every ordered pair compared; fresh-world tables are three worlds' rounds merged as
``--repeat`` merges rounds (``studies.sweep.merge_rounds``), ``--splits`` random pairs of
disjoint triples compared. For each: rows flagged between tables of one commit (target 0),
and each algorithm slowed 2x in the second table in turn: its rows flagged, not judged, passed
(suites/gate_check.py's arithmetic). Writes ``results/gate/worlds_<machine class>-x<np>.md``.
"""

from __future__ import annotations

import argparse
import itertools
import os
import random
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))

from gate_check import _run  # noqa: E402  (suites/, the script's own folder)
from gate_check import _tally as tally  # noqa: E402


def _tally(pairs) -> dict:
    """Over (first, second) tables of one commit: rows flagged, and each algorithm's rows,
    slowed 2x in the second, flagged / not judged / passed (gate_check's tally of each pair,
    summed)."""
    out = {"judged": 0, "flagged": 0, "caught": 0, "unjudged": 0, "passed": 0, "slowed": 0}
    for first, second in pairs:
        t = tally(first, second)
        out["judged"] += t["judged"]
        out["flagged"] += t["flagged"]
        for caught, target, _, unjudged, passed in t["planted"].values():
            out["caught"] += caught
            out["slowed"] += target
            out["unjudged"] += unjudged
            out["passed"] += passed
    return out


def main() -> int:
    from commbench.results.compare import load
    from commbench.results.machine import machine_class
    from commbench.studies.sweep import merge_rounds

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--worlds", type=int, default=8, help="runs of one round each (>= 6)")
    p.add_argument("--runs", type=int, default=4, help="runs of three rounds in one world each")
    p.add_argument("--np", type=int, default=2)
    p.add_argument("-b", default="64K")
    p.add_argument("-e", default="4M")
    p.add_argument("--splits", type=int, default=60, help="pairs of disjoint triples of worlds")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("ops", nargs="*", default=["all_reduce", "all_gather", "reduce_scatter",
                                              "all_to_all", "broadcast"])
    a = p.parse_args()
    if a.worlds < 6 or a.runs < 2:
        raise SystemExit(f"--worlds {a.worlds} --runs {a.runs}: must be >= 6 and >= 2 (two "
                         "disjoint triples of worlds; a pair of runs)")
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory() as top:
        # interleaved, so that both kinds of table meet the machine's same spells
        order = [("world", k) for k in range(a.worlds)] + [("run", k) for k in range(a.runs)]
        order.sort(key=lambda x: x[1] / (a.worlds if x[0] == "world" else a.runs))
        for kind, k in order:
            _run(os.path.join(top, f"{kind}{k}"), a, 1 if kind == "world" else 3)
            print(f"# {kind} {k + 1} done", flush=True)
        names = sorted(f for f in os.listdir(os.path.join(top, "world0")) if f.endswith(".json"))
        tables = {f: ([load(os.path.join(top, f"world{k}", f)) for k in range(a.worlds)],
                      [load(os.path.join(top, f"run{k}", f)) for k in range(a.runs)])
                  for f in names}
    minutes = (time.monotonic() - t0) / 60
    rng = random.Random(a.seed)
    lines = []
    for name in names:
        worlds, runs = tables[name]
        transport = runs[0]["rows"][0]["transport"]
        commit = runs[0].get("commit", "")

        def merged(ids, worlds=worlds):
            rec = dict(worlds[ids[0]])
            rec["rows"] = merge_rounds([worlds[i]["rows"] for i in ids], a.np)
            return rec

        fresh = []
        for _ in range(a.splits):
            ids = rng.sample(range(a.worlds), 6)
            fresh.append((merged(ids[:3]), merged(ids[3:])))
        same = list(itertools.permutations(runs, 2))
        for kind, pairs in (("one world", same), ("fresh worlds", fresh)):
            t = _tally(pairs)
            lines.append((transport, kind, len(pairs), t))
    hw = machine_class("")
    text = [f"# Rounds in one world against rounds in fresh worlds: {hw}, {a.np} ranks", "",
            f"`.venv/bin/python suites/gate_worlds.py --worlds {a.worlds} --runs {a.runs} --np "
            f"{a.np} -b {a.b} -e {a.e} --splits {a.splits} --seed {a.seed} {' '.join(a.ops)}` "
            f"({minutes:.0f} min), commit `{commit}`. `one world`: {a.runs} runs of `--repeat 3`"
            f", every ordered pair; `fresh worlds`: {a.worlds} runs of `--repeat 1`, {a.splits} "
            "random pairs of disjoint triples, each triple's rounds merged as `--repeat` merges "
            "them; the two kinds interleaved in one sitting. `flagged`: rows the gate calls "
            "regressed between tables of one commit (target 0); then each algorithm slowed 2x "
            "in the second table in turn: its rows flagged (target: all), listed as not judged, "
            "passed as no regression.", "",
            "| transport | rounds | pairs | judged | flagged | slowed rows | flagged | not judged "
            "| passed |", "|---|---|---:|---:|---:|---:|---:|---:|---:|"]
    def share(t: dict, k: str) -> str:
        return f"{t[k]} ({t[k] / max(t['slowed'], 1):.0%})"

    for transport, kind, n, t in lines:
        text.append(f"| {transport} | {kind} | {n} | {t['judged']} | {t['flagged']} "
                    f"({t['flagged'] / max(t['judged'], 1):.2%}) | {t['slowed']} | "
                    f"{share(t, 'caught')} | {share(t, 'unjudged')} | {share(t, 'passed')} |")
    out = os.path.join(os.path.dirname(HERE), "results", "gate", f"worlds_{hw}-x{a.np}.md")
    with open(out, "w") as f:
        f.write("\n".join(text) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
