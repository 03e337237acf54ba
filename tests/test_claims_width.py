"""The claims table wrapped to a terminal's width (the committed file keeps it whole)."""

from __future__ import annotations

import pytest

from commbench.studies.claims import claims_markdown

pytestmark = pytest.mark.zero

ROW = {"claim": "ZeRO-3 moves 1.5x DDP's bytes per step, as the notes say of every stage",
       "predicted": "one micro-batch: DDP 12 B, ZeRO-1 12 B, ZeRO-2 12 B, ZeRO-3 18 B (1.50x DDP)",
       "measured": "the same, booked on every rank by the ledger exactly",
       "verdict": "holds for one micro-batch, not under gradient accumulation",
       "holds": "partly", "ledger_matches_prediction": True}
RECORD = {"suite": "claims", "hardware": "cpu", "world_size": 4, "launch": "local-mpi",
          "created": "2026-12-03T00:00:00+00:00", "host": "h", "commit": "c",
          "versions": {"python": "3.11", "torch": "2.13.0+cpu", "mpi4py": "4.1.2"},
          "measurement": {"what": "ledger bytes, not time"}, "rows": [ROW]}


@pytest.mark.parametrize("width", [80, 100, 132])
def test_the_table_fits_the_terminal_and_keeps_every_word(width):
    text = claims_markdown(RECORD, width)
    assert max(len(line) for line in text.splitlines()) <= width
    flat = " ".join(text.replace("|", " ").split())
    for word in ("ZeRO-3", "18", "accumulation", "partly", "yes"):
        assert word in flat


def test_without_a_width_the_table_is_whole():
    text = claims_markdown(RECORD)
    assert ROW["predicted"] in text and max(len(line) for line in text.splitlines()) > 132
