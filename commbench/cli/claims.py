"""``commbench claims``: the notes' claims measured on a local world, or on the launcher's ranks
(studies/claims.py)."""

from __future__ import annotations

import os
import shutil
import sys

from commbench.cli import checks
from commbench.cli.common import UsageError
from commbench.results import records as res
from commbench.results.machine import machine_class

__all__ = ["add_parser", "command"]


def add_parser(sub) -> None:
    k = sub.add_parser("claims", help="measure the notes' claims; write the claims table",
                       description="Measures each claim of the study notes and says whether it "
                       "holds. Example: commbench claims --np 4")
    checks.world_options(k, np=4, timeout=None)


def command(a) -> int:
    if a.np < 2:
        raise UsageError(f"--np {a.np}: the claims need at least 2 ranks")
    checks.check_world(a)
    if getattr(a, "host_refusal", ""):  # not yet agreed across ranks here, as run's is
        raise UsageError(a.host_refusal)
    world, prints = checks.open_world(a)
    try:
        checks.start_world(world, prints)  # imports torch while the ranks start
        # lazy: imports torch
        from commbench.studies.claims import claims_markdown, measure_claim

        # lazy: imports torch
        from commbench.studies.claims_list import CLAIMS

        n = world.size
        rows = [measure_claim(world, c) for c in CLAIMS if n >= c.min_ranks]
        launch = a.launcher or f"local-{world.launch}"
    finally:
        world.close()
    if not prints:  # under a launcher every rank measured the same rows; rank 0 reports
        return 1 if any(not r["ledger_matches_prediction"] for r in rows) else 0
    record = res.header("claims", n, launch, machine_class(a.label),
                        {"what": "ledger bytes, not time"})
    record["rows"] = rows
    text = claims_markdown(record)
    tty = sys.stdout.isatty()  # a terminal gets the table wrapped to its width; files, as is
    print(claims_markdown(record, shutil.get_terminal_size().columns) if tty else text)
    if not a.no_write:
        stem = os.path.join(a.out, f"claims_{machine_class(a.label)}-x{n}")
        res.write_json(stem + ".json", record)
        res.write_atomic(stem + ".md", text)
        print(f"# wrote {stem}.json and {stem}.md")
    bad = [r["claim"] for r in rows if not r["ledger_matches_prediction"]]
    for claim in bad:
        print(f"# ledger != prediction in the runs of: {claim}", file=sys.stderr)
    return 1 if bad else 0
