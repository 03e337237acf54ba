"""The contract every registered pattern keeps (commbench.patterns.registry).

For each pattern x variant x world size 1-4, with configs drawn by hypothesis: every rank's
outputs and every gradient equal the float64 single-process oracle within the pattern's stated
tolerance, and the calls the ledger booked equal ``predicted`` to the byte, as a multiset of
(op, group axis, buffer bytes, bytes sent, bytes received); and every tensor the pattern makes
is made on the world's device (commbench.patterns.device: a factory call without ``device=``
fails the run). Every broken variant a pattern declares must fail this same check, at each
world size it names.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commbench.patterns.registry import PATTERNS
from commbench.patterns.run import check, run_pattern

# a third of the profile's examples per pattern x variant x size: every variant of a pattern
# together draws more configs than one property of the pattern did before
EXAMPLES = max(2, settings().max_examples // 3)


def _marks(pattern) -> list:
    return [getattr(pytest.mark, m) for m in pattern.markers]


CASES = [pytest.param(name, v, marks=_marks(p), id=f"{name}-{v}")
         for name, p in PATTERNS.items() for v in p.variants]
EDGES = [c for c in CASES if PATTERNS[c.values[0]].edge_configs(4, c.values[1])]
BROKEN = [pytest.param(name, b.name, n, marks=_marks(p), id=f"{name}-{b.name}-n{n}")
          for name, p in PATTERNS.items() for b in p.broken for n in b.sizes]


@pytest.mark.world(sizes=[1, 2, 3, 4])
@pytest.mark.parametrize(("name", "variant"), CASES)
@settings(max_examples=EXAMPLES)
@given(data=st.data(), seed=st.integers(0, 999))
def test_pattern_matches_the_oracle_and_its_prediction(world, name, variant, data, seed):
    pattern = PATTERNS[name]
    cfg = data.draw(pattern.configs(world.size, variant), label="cfg")
    assert check(world, pattern, cfg, variant, seed) == []


@pytest.mark.world(sizes=[1, 2, 3, 4])
@pytest.mark.parametrize(("name", "variant"), EDGES)
def test_pattern_holds_at_its_edge_configs(world, name, variant):
    pattern = PATTERNS[name]
    for cfg in pattern.edge_configs(world.size, variant):
        assert check(world, pattern, cfg, variant, 3) == [], cfg


@pytest.mark.parametrize(("name", "broken", "size"), BROKEN)
def test_every_broken_variant_fails_the_contract(world_of, name, broken, size):
    pattern = PATTERNS[name]
    b = pattern.broken_variant(broken)
    world = world_of(size)
    for cfg in b.examples(size):
        assert check(world, pattern, cfg, b.variant, 5, broken), \
            f"{name}: broken variant {broken} ({b.why}) passed at {cfg}"


@pytest.mark.foundation
def test_every_pattern_declares_the_whole_interface():
    for name, p in PATTERNS.items():
        assert p.name == name and p.markers and p.axes
        assert p.naive in p.variants and p.optimized in p.variants, name
        assert p.tolerance.reason, f"{name}: a tolerance without its reason"
        assert all(b.variant in p.variants for b in p.broken), name
        assert p.bench_configs(4), f"{name}: nothing for its study to sweep"


@pytest.mark.foundation
def test_calls_match_takes_any_order_and_names_what_differs():
    from commbench.patterns.base import Call, calls_diff, calls_match

    want = [Call("all_reduce", "tp", 64, 48, 48), Call("all_gather", "sp", 16, 48, 48)]
    booked = [["all_gather", "sp", 16, 48, 48], ["all_reduce", "tp", 64, 48, 48]]
    assert calls_match(booked, want) and calls_diff(booked, want) == ""
    # negative: one call booked twice, one with other bytes, one missing
    assert not calls_match(booked + [booked[0]], want)
    assert not calls_match([["all_gather", "sp", 16, 48, 40], booked[1]], want)
    assert calls_diff(booked[:1], want) == ("booked but not predicted []; predicted but not booked "
                                            "[('all_reduce', 'tp', 64, 48, 48)]")


@pytest.mark.foundation
@pytest.mark.world(sizes=[2, 4])
def test_a_timed_pattern_run_takes_its_iterations_after_its_warm_up(world):
    """``iters`` timed samples per rank, whatever ``warmup`` is (the two swapped give 1)."""
    from commbench.patterns.registry import get

    n = world.size
    cfg = get("ddp").bench_configs(n)[0]
    small = type(cfg)(**{**cfg.as_dict(), "batch": n, "seq": 2, "hidden": 4, "ffn": 4,
                         "heads": 1})
    outs = world.run(run_pattern, "ddp", small, "ddp", 0, None, 3, 1)
    assert [len(o["times"]) for o in outs] == [3] * n


@pytest.mark.foundation
@pytest.mark.world(sizes=[2, 4])
def test_one_extra_call_of_a_kind_already_booked_fails_the_contract(world):
    """ZeRO-1 gathering its parameters twice holds the right values: only the booked calls,
    compared as a multiset against the prediction, give it away."""
    pattern = PATTERNS["zero"]
    cfg = pattern.broken_variant("parameters_gathered_twice").examples(world.size)[0]
    problems = check(world, pattern, cfg, "zero1", 5, "parameters_gathered_twice")
    assert problems and all("booked but not predicted [('all_gather'" in p for p in problems), \
        problems


@pytest.mark.foundation
def test_every_pattern_lives_in_a_module_of_its_name():
    for name, pattern in PATTERNS.items():
        assert type(pattern).__module__.rsplit(".", 1)[1] == name, (name, type(pattern).__module__)
