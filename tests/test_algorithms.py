"""Algorithms built from send/recv: equal to the oracle, byte-exact against their formulas.

Three properties per algorithm, each with negative tests that break it on purpose:

* the result equals the oracle exactly (verify patterns: small integers, exact in every dtype);
* with arbitrary floats, every rank of an all-reduce holds bitwise the same result (the schedule,
  not luck, makes them agree);
* the bytes the ledger counted, message by message, equal the algorithm's formula, and the formula
  equals the textbook closed form where one applies.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
from collective_cases import judge, runs, skip_unless_runs
from hypothesis import assume, example, given, settings
from hypothesis import strategies as st

from commbench.collectives import ALGORITHMS

pytestmark = [pytest.mark.collectives, pytest.mark.ring]

ALGOS = sorted(k for k, record in ALGORITHMS.items() if record.fn is not None)  # built here


def predict(op, algo, n, i, count, itemsize, **kw):
    return ALGORITHMS[(op, algo)].bytes(n, i, count, itemsize, **kw)
DTYPE_NAMES = ["float32", "float64", "float16", "bfloat16", "int8", "uint8", "int32", "int64"]
COUNTS = st.sampled_from([0, 1, 2, 3, 5, 7, 11, 13, 97, 4099]) | st.integers(0, 200)


def _redop(op: str, dtype: str, wanted: str) -> str:
    """``wanted`` where ``op`` reduces and ``dtype`` allows it; sum otherwise."""
    floating = dtype.startswith(("float", "bfloat"))
    reduces = op in ("all_reduce", "reduce_scatter", "reduce")
    return wanted if reduces and (wanted != "avg" or floating) else "sum"


def _runnable_first(test):
    """Skip where the algorithm cannot run on the world before hypothesis runs a single example:
    a skip raised inside an explicit example is printed by hypothesis as a failing example, among
    the skip lines of the summary, though nothing failed."""
    @functools.wraps(test)
    def run(world, key, **kw):
        skip_unless_runs(*key, world.size)
        return test(world=world, key=key, **kw)
    return run


def _oracle_property(test):
    """The oracle property's examples: drawn, and the edges every run sees (each reduction, avg
    in two precisions; counts 0, 1 and prime)."""
    for edge in [dict(count=11, dtype="int8", root=5, seed=6, redop="min"),
                 dict(count=7, dtype="float64", root=3, seed=5, redop="prod"),
                 dict(count=97, dtype="int32", root=7, seed=4, redop="max"),
                 dict(count=13, dtype="float16", root=2, seed=3, redop="sum"),
                 dict(count=1, dtype="bfloat16", root=1, seed=2, redop="avg"),
                 dict(count=0, dtype="float32", root=0, seed=1, redop="avg")]:
        test = example(**edge)(test)
    return given(count=COUNTS, dtype=st.sampled_from(DTYPE_NAMES), root=st.integers(0, 7),
                 seed=st.integers(0, 999),
                 redop=st.sampled_from(["sum", "prod", "min", "max", "avg"]))(test)


def _oracle_case(world, key, count, dtype, root, seed, redop):
    op, algo = key
    redop = _redop(op, dtype, redop)
    for transport in world.transports:
        assert judge(world, transport, op, algo, count=count, dtype=dtype, redop=redop, root=root,
                     seed=seed) == []


@pytest.mark.world(sizes=[1, 2, 3, 4])
@pytest.mark.parametrize("key", ALGOS, ids=["/".join(k) for k in ALGOS])
@_runnable_first
@_oracle_property
def test_algorithms_match_the_oracle_and_their_bytes(world, key, count, dtype, root, seed, redop):
    _oracle_case(world, key, count, dtype, root, seed, redop)


# Worlds of 5 and 8 ranks, more than the cores of the 2- and 4-core machines the default run
# must stay fast on, run each example several times slower: the same edges, a third of the
# drawn examples (the draws' axes, counts, types and reductions, are explored on the smaller
# worlds; what these add is the ranks' number, which every example has)
@pytest.mark.world(sizes=[5, 8])
@pytest.mark.parametrize("key", ALGOS, ids=["/".join(k) for k in ALGOS])
@_runnable_first
@settings(max_examples=max(2, settings().max_examples // 3))
@_oracle_property
def test_algorithms_match_the_oracle_and_their_bytes_on_more_ranks(world, key, count, dtype,
                                                                   root, seed, redop):
    _oracle_case(world, key, count, dtype, root, seed, redop)


@pytest.mark.world(sizes=[2, 3, 4, 5, 8])
@given(algo=st.sampled_from([a for o, a in ALGOS if o == "all_reduce"]),
       count=st.integers(1, 300), seed=st.integers(0, 999))
def test_all_reduce_leaves_every_rank_bitwise_equal(world, algo, count, seed):
    assume(runs("all_reduce", algo, world.size))
    for transport in world.transports:
        assert judge(world, transport, "all_reduce", algo, count=count, seed=seed,
                     values="random") == []


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16])
def test_formulas_meet_the_closed_forms(n):
    """Where P divides S: ring 2(P-1)/P*S, Rabenseifner 2(p-1)/p*S, recursive doubling log2(P)*S,
    Bruck (P/2)*log2(P) blocks (P a power of two), pairwise (P-1) blocks; all per rank."""
    S = 16 * 9 * 5 * 7  # divisible by every n used and by every power-of-two split
    for i in range(n):
        assert predict("all_reduce", "ring", n, i, S, 1) == (2 * (n - 1) * S // n,) * 2
        assert predict("all_to_all", "pairwise", n, i, S, 1, in_splits=[S // n] * n,
                       out_splits=[S // n] * n) == ((n - 1) * S // n,) * 2
        if n & (n - 1) == 0:
            log = int(math.log2(n))
            assert predict("all_reduce", "rabenseifner", n, i, S, 1) == (2 * (n - 1) * S // n,) * 2
            assert predict("all_reduce", "recursive_doubling", n, i, S, 1) == (log * S,) * 2
            assert predict("all_to_all", "bruck", n, i, S, 1) == (n // 2 * log * S // n,) * 2


# -- negative tests ---------------------------------------------------------------------------------
@pytest.mark.world(sizes=[3, 4])
@pytest.mark.parametrize("key", ALGOS, ids=["/".join(k) for k in ALGOS])
def test_oracle_property_catches_a_corrupted_message(world, key):
    op, algo = key
    if algo == "hierarchical" and world.size % 2:
        pytest.skip(f"{op}/{algo} needs an even world; this one has {world.size} ranks")
    root = 1 if op == "reduce" else 0  # member 0, the corrupter, must send something
    for transport in world.transports:
        broken = "miscombine" if algo.endswith("_compiled") else "corrupt"  # a record's own
        assert judge(world, transport, op, algo, count=12, dtype="int32", root=root, seed=1,
                     broken=broken)


@pytest.mark.world(sizes=[4])
def test_oracle_property_catches_a_corrupted_hierarchical_message(world):
    for transport in world.transports:
        assert judge(world, transport, "all_reduce", "hierarchical", count=12, dtype="int32",
                     seed=1, broken="corrupt")


# the compiled schedules' are caught where each shows (tests/test_schedule.py)
BROKEN = [(op, algo, b.name) for (op, algo), r in ALGORITHMS.items() for b in r.broken
          if not r.compiled]


@pytest.mark.world(sizes=[4])
@pytest.mark.parametrize(("op", "algo", "broken"), BROKEN, ids=["/".join(k) for k in BROKEN])
def test_every_broken_variant_an_algorithm_declares_is_caught(world, op, algo, broken):
    for transport in world.transports:
        problems = judge(world, transport, op, algo, count=13, dtype="int64", seed=2,
                         broken=broken)
        assert problems, f"{op}/{algo} {broken} went unnoticed on {transport}"


def test_the_ring_declares_its_broken_variants_and_refuses_others():
    ring = ALGORITHMS[("all_reduce", "ring")]
    assert {b.name for b in ring.broken} == {"skip_step", "off_by_one_chunk"}
    assert ring.parts_of("off_by_one_chunk").split(13, 4) == [5, 3, 3, 2] != \
        ring.parts_of().split(13, 4)
    with pytest.raises(ValueError, match="broken='nope': all_reduce/ring declares skip_step"):
        ring.parts_of("nope")


@pytest.mark.world(sizes=[4])
@pytest.mark.parametrize("algo", ["ring_compiled", "rabenseifner_compiled"])
def test_compiled_schedules_catch_an_off_by_one_chunk(world, algo):
    """Every member cutting the same wrong chunks still sums right: the bytes give it away."""
    for transport in world.transports:
        problems = judge(world, transport, "all_reduce", algo, count=13, dtype="int64", seed=2,
                         broken="off_by_one_chunk")
        assert any("ledger counted" in p for p in problems), f"{algo} on {transport}"


@pytest.mark.world(sizes=[3, 4])
def test_bitwise_property_catches_a_rank_that_differs(world):
    for transport in world.transports:
        problems = judge(world, transport, "all_reduce", "ring", count=50, seed=3,
                         values="random", broken="corrupt")
        assert any("ranks differ bitwise" in p for p in problems), problems


def _pairwise_uneven(ctx, seed: int, exchange_counts: bool, broken: bool = False):
    """The pairwise all-to-all with uneven (some empty) splits, its out splits given or found
    by its count exchange: (result == every sender's rows for this rank, bytes, predicted).
    ``broken``: a variant that files each sender's rows in the slot of the sender across."""
    from commbench.collectives.alltoall import pairwise_elements
    from commbench.collectives.alltoall_comms import pairwise_all_to_all

    n, r, row = ctx.size, ctx.rank, 2

    def splits_of(j: int) -> list[int]:
        return [(3 * j + 5 * k + seed) % 4 for k in range(n)]

    def rows_of(j: int) -> torch.Tensor:
        return torch.arange(sum(splits_of(j)) * row, dtype=torch.float32).reshape(-1, row) + 1e3 * j

    mine, out = splits_of(r), [splits_of(j)[r] for j in range(n)]
    want = torch.cat([rows_of(j)[sum(splits_of(j)[:r]):sum(splits_of(j)[:r + 1])]
                      for j in range(n)])
    with ctx.ledger.capture() as cap:
        got = pairwise_all_to_all(ctx.comm(), rows_of(r), ctx.world, mine,
                                  None if exchange_counts else out)
    if broken:
        blocks = list(torch.split(got, out))
        got = torch.cat([blocks[(r - j) % n] for j in range(n)])  # src j's slot holds src -j's
    sent, _ = pairwise_elements(n, r, 0, mine, out, row=row)
    pred = sent * 4 + ((n - 1) * 8 if exchange_counts else 0)  # the int64 counts go first
    return bool(got.shape == want.shape and (got == want).all()), cap.sent, pred


@pytest.mark.world(sizes=[2, 3, 4])
@pytest.mark.parametrize("exchange_counts", [False, True])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_pairwise_all_to_all_with_uneven_and_empty_splits(world, seed, exchange_counts):
    for ok, sent, pred in world.run(_pairwise_uneven, seed, exchange_counts):
        assert ok and sent == pred


@pytest.mark.world(sizes=[3, 4])
def test_uneven_split_check_catches_rows_filed_under_the_wrong_sender(world):
    assert not all(ok for ok, _, _ in world.run(_pairwise_uneven, 1, True, True))
