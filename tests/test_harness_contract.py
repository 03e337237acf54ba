"""The harness's own contract: the rule that makes a row of the ranks' samples and the judge of
booked against predicted calls, each run on the same cases as its declared broken variants
(``timing.loop.BROKEN_RULES``, ``patterns.base.BROKEN_JUDGES``): the right one meets every case,
each broken one fails at least one. The cases are worked out by hand."""

from __future__ import annotations

import pytest

from commbench.patterns.base import BROKEN_JUDGES, Call, calls_match
from commbench.timing.loop import BROKEN_RULES, slowest

pytestmark = pytest.mark.foundation

# (each rank's samples, the row's samples: the slowest rank per sample)
RULE_CASES = [
    # equal medians and totals, each rank slowest in other samples
    ([[1.0, 1.0, 1.0, 3.0, 3.0], [3.0, 3.0, 1.0, 1.0, 1.0]], [3.0, 3.0, 1.0, 3.0, 3.0]),
    ([[2.0, 1.0]], [2.0, 1.0]),  # one rank
    ([[1.0, 9.0], [2.0, 1.0], [5.0, 1.0]], [5.0, 9.0]),  # the slowest is not rank 0
]

AR, AG = Call("all_reduce", "dp", 64, 48, 48), Call("all_gather", "tp", 16, 48, 48)
AR_WIDE = Call("all_reduce", "dp", 128, 96, 96)
# (booked, predicted, whether they match)
JUDGE_CASES = [
    ([AR, AG], [AR, AG], True),
    ([AG, AR], [AR, AG], True),          # in another order
    ([AR, AR, AG], [AR, AG], False),     # one extra call of a kind already booked
    ([AR], [AR, AR], False),             # one missing
    ([AR_WIDE, AG], [AR, AG], False),    # the same ops, other bytes
    ([], [], True),
]

RULES = {"slowest": slowest, **BROKEN_RULES}
JUDGES = {"calls_match": calls_match, **BROKEN_JUDGES}


def _rule_holds(rule) -> bool:
    return all(rule(per_rank) == want for per_rank, want in RULE_CASES)


def _judge_holds(judge) -> bool:
    return all(judge(booked, predicted) == want for booked, predicted, want in JUDGE_CASES)


@pytest.mark.parametrize("name", list(RULES))
def test_the_row_rule_meets_every_case_and_each_broken_one_fails(name):
    assert _rule_holds(RULES[name]) == (name == "slowest"), name


@pytest.mark.parametrize("name", list(JUDGES))
def test_the_calls_judge_meets_every_case_and_each_broken_one_fails(name):
    assert _judge_holds(JUDGES[name]) == (name == "calls_match"), name


def test_there_are_broken_variants_to_catch():
    assert len(BROKEN_RULES) >= 3 and len(BROKEN_JUDGES) >= 2
