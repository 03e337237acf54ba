"""The pattern interface: every communication pattern of the notes declared once, in one shape.

As nccl-tests makes the collective its unit (one ``struct testColl`` per collective: bytes, data,
bandwidth, run), commbench makes the pattern its unit. A pattern says:

==============================  ==================================================================
``name``, ``markers``            registry key; pytest markers (the first is its topic)
``variants``                     ``naive``, ``optimized`` and the others its family has
``axes``                         the group axes it communicates on (``tp``, ``dp``, ``sp``, ...);
                                 ``grid(cfg)`` lays out the ranks (``"dp=2,tp=2"``)
``Config``                       a frozen dataclass; ``validate(world_size, variant)`` raises one
                                 line naming the value and the rule, before any collective
``configs(world_size, variant)`` a hypothesis strategy of valid configs
``bench_configs(world_size)``    the configs its study sweeps
``inputs(cfg, seed, device)``    the whole seeded data, drawn on the CPU, placed on ``device``
``shard(cfg, inputs, groups, variant, parts)``  this rank's part of it (untimed)
``oracle(cfg, seed)``            outputs and every gradient of the unsharded computation, float64
``references(cfg, seed)``        equally right low-precision answers (float32 runs are held to
                                 their spread), none for float64
``expected(oracle, cfg, rank, variant)``  this rank's part of the oracle
``step(ctx, cfg, local, variant, groups, parts)``  this rank's outputs and gradients
``predicted(cfg, variant, rank, seed)``  the calls this rank makes: [:class:`Call`, ...]
``layout_calls(lay, stage)``     its calls in a whole training layout, per group
``tolerance``                    :class:`Tolerance`, with its reason
``parts_from``, ``broken``       where the step's swappable operators are (``"tp.tp_layer_comms:
                                 TPParts"``), and :class:`Broken` variants declared as
                                 replacements of them, by the same kind of name

==============================  ==================================================================

Generic code turns a pattern into its contract test (``tests/test_patterns.py``), its study
(``commbench run <pattern>``), its claims and its layout prediction. Nothing in a pattern's step
knows about tests: a broken variant is the same step given other parts.

A pattern's record (``seq/ulysses.py``) imports neither torch nor hypothesis: its config, byte
formula, tolerance and broken declarations answer ``commbench predict`` and ``list`` at once.
What runs (operators, oracle, data) sits in its ``*_comms.py`` and its family's modules, imported
by the methods that need them; the operators are named as ``"module:attribute"`` under
``commbench.patterns`` and found when a step runs (:func:`named`).
"""

from __future__ import annotations

import dataclasses
import functools
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from commbench import names
from commbench.runtime.group import grid_coords, parse_grid

__all__ = ["BROKEN_JUDGES", "DRAWS", "Broken", "Call", "Pattern", "Tolerance", "calls_diff",
           "calls_match", "drawn", "float32_references", "named", "nudger", "reference_nudges"]


def drawn(draw_config: Callable, *args):
    """The hypothesis strategy of ``draw_config(draw, st, *args)`` -> a config (``st``:
    hypothesis's strategies, imported here so that the records import no hypothesis)."""
    # lazy: imports hypothesis
    from hypothesis import strategies as st

    return st.composite(lambda draw: draw_config(draw, st, *args))()


def named(name: str):
    """The object ``"module:attribute"`` names, the module under ``commbench.patterns``."""
    return names.named(name, "commbench.patterns")


@dataclass(frozen=True, slots=True)
class Call:
    """One call of one rank, as predicted or as booked by the ledger.

    op: the comm layer's name (``all_reduce``, ``all_to_all``, ``isend``, ...); axis: the group
    axis it runs on; size: bytes of this rank's buffer (the ledger's count x itemsize); sent /
    recv: bytes this rank sends and receives (:mod:`commbench.ops`).
    """

    op: str
    axis: str
    size: int
    sent: int
    recv: int


def _row(call) -> tuple:
    return dataclasses.astuple(call) if isinstance(call, Call) else tuple(call)


def calls_diff(booked, predicted) -> str:
    """'' when a rank's booked calls (ledger rows or :class:`Call`) are the predicted ones, in
    any order; else what was booked but not predicted and predicted but not booked."""

    got, want = Counter(map(_row, booked)), Counter(map(_row, predicted))
    if got == want:
        return ""
    return (f"booked but not predicted {sorted((got - want).elements())}; predicted but not "
            f"booked {sorted((want - got).elements())}")


def calls_match(booked, predicted) -> bool:
    """Whether a rank's booked calls are the predicted ones (:func:`calls_diff`)."""
    return not calls_diff(booked, predicted)


# Deliberately wrong judges of booked against predicted calls, declared as the patterns'
# broken variants are: the harness's contract (tests/test_harness_contract.py) must tell each
# from :func:`calls_match` on the same calls.
BROKEN_JUDGES: dict[str, Callable[[list, list], bool]] = {
    "as_sets": lambda b, p: set(map(_row, b)) == set(map(_row, p)),  # a repeated call unseen
    "ops_only": lambda b, p: sorted(_row(c)[0] for c in b) == sorted(_row(c)[0] for c in p),
}


@dataclass(frozen=True)
class Tolerance:
    """How close a rank's value must be to the oracle's, with the reason.

    float64 runs: ``|got - want| <= atol + rtol |want|`` elementwise. Lower precision: the
    largest error of the pattern's :meth:`Pattern.references` (unsharded computations in the
    same precision, each an equally right answer) times ``factor``, plus ``floor`` x
    max(1, max |want|): the sharded run sums in another order, and no fixed bound fits both a
    LayerNorm that amplifies rounding and one that does not.
    """

    reason: str
    rtol: float = 1e-10
    atol: float = 1e-10
    factor: float = 8.0
    floor: float = 1e-6


@dataclass(frozen=True)
class Broken:
    """A deliberately broken variant: ``variant`` run with ``parts`` replacing the pattern's
    own (part -> ``"module:attribute"``, :func:`named`). ``examples(world_size)`` gives configs
    at which the contract must catch it, at each of ``sizes``."""

    name: str
    variant: str
    parts: dict[str, str]
    why: str
    examples: Callable[[int], list]
    sizes: tuple[int, ...] = (2, 4)


class Pattern:
    """Base of every pattern (see the module docstring); subclasses fill in the class
    attributes and the methods that raise :class:`NotImplementedError`."""

    name: ClassVar[str]
    markers: ClassVar[tuple[str, ...]]
    variants: ClassVar[tuple[str, ...]]
    naive: ClassVar[str]
    optimized: ClassVar[str]
    axes: ClassVar[tuple[str, ...]]
    Config: ClassVar[type]
    tolerance: ClassVar[Tolerance]
    parts_from: ClassVar[str]  # "module:Class": a frozen dataclass of the step's operators
    broken: tuple[Broken, ...] = ()
    dtypes: ClassVar[tuple[str, ...]] = ("float64", "float32")  # what the contract draws

    # -- configs --------------------------------------------------------------------------------
    def configs(self, world_size: int, variant: str):
        raise NotImplementedError

    def bench_configs(self, world_size: int) -> list:
        raise NotImplementedError

    def edge_configs(self, world_size: int, variant: str) -> list:
        """Configs the contract runs every time besides the drawn ones: the edges a random
        draw reaches only sometimes (a layer smaller than the world, an empty split)."""
        return []

    def coords(self, cfg, rank: int) -> dict[str, int]:
        """``rank``'s index along each axis of :meth:`grid`: the layout its groups are built
        from, so a rank's shard and its expected share agree."""

        return grid_coords(parse_grid(self.grid(cfg)), rank)

    def check(self, cfg, world_size: int, variant: str) -> None:
        """The one place a run checks its config: variant, then the config's own rules."""
        if variant not in self.variants:
            raise ValueError(f"variant={variant!r}: {self.name} has {', '.join(self.variants)}")
        if not isinstance(cfg, self.Config):
            raise ValueError(f"config {type(cfg).__name__}: the {self.name} pattern takes a "
                             f"{self.Config.__name__}")
        cfg.validate(world_size, variant)

    # -- data -----------------------------------------------------------------------------------
    def inputs(self, cfg, seed: int, device) -> dict:
        raise NotImplementedError

    def shard(self, cfg, inputs: dict, groups: dict, variant: str, parts) -> dict:
        return inputs

    def groups(self, ctx, cfg) -> dict:
        """This rank's group along every axis of its grid and every combination of
        :attr:`combos` (``dp_ep``), by name; built collectively (every rank calls it)."""
        grid = ctx.grid(self.grid(cfg), combos=self.combos)
        return {"_".join(axes): g for axes, g in grid.groups.items()}

    def grid(self, cfg) -> str:
        raise NotImplementedError

    combos: ClassVar[tuple[tuple[str, ...], ...]] = ()

    # -- truth ----------------------------------------------------------------------------------
    def oracle(self, cfg, seed: int) -> dict:
        raise NotImplementedError

    def references(self, cfg, seed: int) -> list[dict]:
        return []

    def expected(self, oracle: dict, cfg, rank: int, variant: str) -> dict:
        raise NotImplementedError

    # -- the run --------------------------------------------------------------------------------
    def step(self, ctx, cfg, local: dict, variant: str, groups: dict, parts) -> dict:
        raise NotImplementedError

    def predicted(self, cfg, variant: str, rank: int, seed: int | None = None) -> list[Call]:
        """The calls ``rank`` books in one step. Where they depend on the data (MoE's routing),
        ``seed`` picks it; without a seed such a pattern raises ValueError."""
        raise NotImplementedError

    def metrics(self, cfg, variant: str, outs: list[dict]) -> dict:
        """Columns of its own for the study (bubble, memory, ...), from every rank's result."""
        return {}

    def layout_calls(self, lay, stage: int | None) -> dict[str, list[tuple[Call, int]]]:
        """Its calls in a whole training layout (``commbench predict layout``): group -> [(a
        call of one rank of pipeline stage ``stage``, times per step)], None: the busiest
        stage. ``lay`` is a :class:`commbench.costmodel.layout_config.Layout` (read, not
        imported: the cost model sits above the patterns). A pattern the layout does not use
        adds nothing."""
        return {}

    # -- helpers --------------------------------------------------------------------------------
    @functools.cached_property
    def parts(self):
        """The step's own operators (made when a step first needs them)."""
        return named(self.parts_from)()

    def parts_for(self, broken: str | None):
        """The step's parts, with a broken variant's replacements when one is named."""
        if broken is None:
            return self.parts
        b = self.broken_variant(broken)
        return dataclasses.replace(self.parts, **{k: named(v) for k, v in b.parts.items()})

    def broken_variant(self, name: str) -> Broken:
        for b in self.broken:
            if b.name == name:
                return b
        known = ", ".join(b.name for b in self.broken) or "none"
        raise ValueError(f"broken={name!r}: {self.name} declares {known}")


# -- equally right references: the scale a lower-precision run is held to --------------------
DRAWS = 3  # one-ulp nudged reference runs besides the plain one


def nudger(draw: int):
    """A function moving each element of a tensor one ulp up, down or not at all, seeded.

    One float32 reference run's error can be small by luck of cancellation; runs whose inputs
    are each moved by one ulp are equally right answers, and the largest of their errors is the
    scale a sharded run, whose sums go in another order, is held to."""
    # lazy: imports torch
    import torch  # here: the pattern records themselves import no torch

    g = torch.Generator().manual_seed(draw)

    def nudge(t: torch.Tensor) -> torch.Tensor:
        u = torch.randint(-1, 2, t.shape, generator=g)
        inf = torch.full_like(t, float("inf"))
        return torch.where(u > 0, torch.nextafter(t, inf),
                           torch.where(u < 0, torch.nextafter(t, -inf), t))

    return nudge


def reference_nudges() -> list:
    """None (as is), then :data:`DRAWS` seeded nudges."""
    return [None] + [nudger(k) for k in range(DRAWS)]


def float32_references(cfg, oracle: Callable[..., dict]) -> list[dict]:
    """A pattern's equally right references (:meth:`Pattern.references`): ``oracle(dtype,
    nudge)`` in float32, as is and nudged, for a float32 run; none for float64."""
    if cfg.dtype == "float64":
        return []
    # lazy: imports torch
    import torch

    return [oracle(torch.float32, nudge) for nudge in reference_nudges()]
