"""Every pattern commbench knows, one line each. A new pattern adds its line here."""

from __future__ import annotations

from commbench.patterns.base import Pattern
from commbench.patterns.dp.ddp import DataParallel
from commbench.patterns.dp.hsdp import HSDP
from commbench.patterns.dp.zero import Zero
from commbench.patterns.moe.moe import ExpertParallel
from commbench.patterns.moe.moe_gating import MoEGating
from commbench.patterns.pp.pp import Pipeline
from commbench.patterns.seq.ring_attention import RingAttention
from commbench.patterns.seq.ulysses import Ulysses
from commbench.patterns.seq.ulysses_zero3 import UlyssesZero3
from commbench.patterns.tp.tp_layer import TPLayer
from commbench.patterns.tp.tp_mlp import TPMLP
from commbench.patterns.tp.vocab import VocabHead

__all__ = ["PATTERNS", "get", "select"]

PATTERNS: dict[str, Pattern] = {p.name: p for p in (
    TPMLP(),
    TPLayer(),
    VocabHead(),
    DataParallel(),
    Zero(),
    HSDP(),
    Ulysses(),
    UlyssesZero3(),
    RingAttention(),
    Pipeline(),
    MoEGating(),
    ExpertParallel(),
)}


def get(name: str) -> Pattern:
    try:
        return PATTERNS[name]
    except KeyError:
        raise ValueError(f"pattern {name!r}: known: {', '.join(PATTERNS)}") from None


def select(target: str) -> list[str]:
    """The patterns a command-line target names: a pattern, or every pattern of a marker."""
    if target in PATTERNS:
        return [target]
    return [name for name, p in PATTERNS.items() if target in p.markers]
