"""The notes' claims, measured: ``commbench claims`` writes ``results/claims_<hw>-x<ranks>.{md,json}``.

A claim (:mod:`commbench.studies.claims_list`) names the pattern runs that test it. Each run is
one step of a registered pattern on the world; its row gives what the pattern predicts (from
``predicted``), what the ledger booked, the claim's verdict against those figures, and whether
every rank's booked calls equal its predicted calls. No byte formula lives here: the figures are
the patterns' and the ledger's.

The notes (shared/seed, in Chinese) state the claims in model *parameters*; most of this traffic
is activations, whose size does not depend on the parameter count. Each row gives both numbers.
"""

from __future__ import annotations

import textwrap
from collections import Counter
from collections.abc import Callable, Hashable
from dataclasses import astuple, dataclass, field

from tabulate import tabulate

from commbench.patterns.base import calls_match
from commbench.patterns.registry import get
from commbench.patterns.run import run_pattern
from commbench.results.records import markdown

__all__ = ["Claim", "Measured", "Run", "claims_markdown", "measure_claim"]


@dataclass(frozen=True)
class Run:
    """One step of ``pattern``'s ``variant`` at ``cfg``."""

    pattern: str
    variant: str
    cfg: object


@dataclass
class Measured:
    """A run's rank-0 calls, booked and predicted, and whether every rank's agree."""

    run: Run
    booked: list[tuple]
    predicted: list[tuple]
    match: bool
    outs: list[dict] = field(repr=False, default_factory=list)

    def sent(self, axis: str | None = None, op: str | None = None, calls=None) -> int:
        calls = self.booked if calls is None else calls
        return sum(c[3] for c in calls if (axis is None or c[1] == axis)
                   and (op is None or c[0] == op))

    def count(self, op: str, axis: str | None = None) -> int:
        return sum(1 for c in self.booked if c[0] == op and (axis is None or c[1] == axis))

    def calls(self, axis: str | None = None, calls=None) -> str:
        """``2 all_reduce, 1 all_gather`` of the calls on ``axis``."""
        calls = self.booked if calls is None else calls
        n = Counter(c[0] for c in calls if axis is None or c[1] == axis)
        return ", ".join(f"{v} {k}" for k, v in sorted(n.items())) or "none"

    def summary(self) -> str:
        """The prediction in words: calls per axis and bytes one rank sends."""
        axes = sorted({c[1] for c in self.predicted})
        parts = [f"{self.calls(a, self.predicted)} on {a}" for a in axes] or ["no calls"]
        r = self.run
        return f"{r.pattern}/{r.variant}: {'; '.join(parts)}: {self.sent(calls=self.predicted)} B " \
               "sent by rank 0"


@dataclass(frozen=True)
class Claim:
    """A claim of the notes: the runs that test it, and its verdict from their figures.

    ``verdict(m, P)`` gets the measured runs by key and the world size; it returns (measured:
    the figures in words, verdict: what holds of the claim, holds: yes | partly | no)."""

    text: str
    runs: Callable[[int], dict[Hashable, Run]]  # a key names a run: "mlp", ("zero1", 4)
    verdict: Callable[[dict[Hashable, Measured], int], tuple[str, str, str]]
    min_ranks: int = 2  # the claim needs at least this many ranks (EP x TP: 4)


def measure_claim(world, claim: Claim, seed: int = 1) -> dict:
    """Run ``claim``'s pattern runs on ``world`` and build its row."""
    measured = {}
    for key, run in claim.runs(world.size).items():
        pattern = get(run.pattern)
        outs = world.run(run_pattern, run.pattern, run.cfg, run.variant, seed)
        predicted = [[astuple(c) for c in pattern.predicted(run.cfg, run.variant, r, seed)]
                     for r in range(world.size)]
        match = all(calls_match(o["ledger"], p) for o, p in zip(outs, predicted, strict=True))
        measured[key] = Measured(run, [tuple(c) for c in outs[0]["ledger"]], predicted[0], match,
                                 outs)
    text, verdict, holds = claim.verdict(measured, world.size)
    return {"claim": claim.text, "predicted": "; ".join(m.summary() for m in measured.values()),
            "measured": text, "verdict": verdict, "holds": holds,
            "ledger_matches_prediction": all(m.match for m in measured.values())}


def claims_markdown(record: dict, width: int | None = None) -> str:
    """The claims table; with ``width`` (a terminal's columns) its text wrapped to fit it."""

    head = markdown(dict(record, rows=[])).rstrip()
    rows = [[r["claim"], r["predicted"], r["measured"], r["verdict"], r["holds"],
             "yes" if r["ledger_matches_prediction"] else "NO"] for r in record["rows"]]
    headers = ["claim (the notes)", "predicted (the patterns)", "measured (ledger)", "verdict",
               "the notes hold", "ledger = predicted"]
    if width:
        # the four text columns as wide as the terminal leaves them (tabulate pads each cell
        # and its header: measured, not computed), narrowing until the table fits
        headers = ["claim", "predicted", "measured", "verdict", "holds", "ledger"]
        for text in range(max(8, width // 4), 7, -1):
            table = tabulate(rows, headers=headers, tablefmt="grid",
                             maxcolwidths=[text, text, text, text, 7, 6])
            if max(map(len, table.splitlines())) <= width:
                break
        head = "\n".join(textwrap.fill(line, width, subsequent_indent="  ") if line else line
                         for line in head.splitlines())
    else:
        table = tabulate(rows, headers=headers, tablefmt="github")
    return f"{head}\n\n{table}\n"
