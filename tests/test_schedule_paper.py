"""Each algorithm's schedule is written once (its record's step list); run on paper
(:mod:`commbench.collectives.simulate`) it must deliver every contribution exactly once, and its
critical path must be the alpha-beta terms its record states in closed form (kept closed so that
pricing 4096 ranks stays instant). A schedule that drops a step, or a formula that miscounts a
round, is caught."""

from __future__ import annotations

import pytest

from commbench.collectives import ALGORITHMS, ring, schedules
from commbench.collectives.algorithm import Algorithm, Step
from commbench.collectives.simulate import simulate
from commbench.ops import split_sizes

pytestmark = [pytest.mark.collectives, pytest.mark.ring]

SIZE = 840  # divisible by 1..8 and 12: every block the same length, as the closed forms assume


def _schedules(record: Algorithm, n: int, count: int, root: int = 0) -> list[list[Step]]:
    """Every member's steps of ``record`` for ``count`` elements (all-gather: per member)."""
    if record.steps is not None:
        return [record.steps(n, i, count) for i in range(n)]
    if record.op == "broadcast":
        return [schedules.broadcast_steps(n, i, count, root) for i in range(n)]
    if record.op == "reduce":
        return [schedules.reduce_steps(n, i, count, root) for i in range(n)]
    if (record.op, record.name) == ("reduce_scatter", "ring"):
        return [schedules.rs_schedule(n, i, split_sizes(count, n)) for i in range(n)]
    if (record.op, record.name) == ("all_gather", "ring"):
        return [schedules.ag_schedule(n, i, [count // n] * n) for i in range(n)]
    raise AssertionError(f"{record.op}/{record.name}: no schedule to read")


SCHEDULED = sorted(k for k, r in ALGORITHMS.items()
                   if r.fn is not None and not r.compiled and k[1] != "hierarchical"
                   and (r.steps is not None or k[1] in ("binomial", "ring")))


def test_the_scheduled_algorithms_are_the_ones_built_from_send_recv():
    assert {k[1] for k in SCHEDULED} == {"ring", "recursive_doubling", "rabenseifner", "naive",
                                         "binomial"}


@pytest.mark.parametrize("key", SCHEDULED, ids="/".join)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 12])
def test_closed_form_terms_are_the_schedules_critical_path(key, n):
    record = ALGORITHMS[key]
    paper = simulate(_schedules(record, n, SIZE), SIZE)
    assert paper.terms == pytest.approx(record.cost(n, SIZE), rel=1e-12, abs=1e-9)


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_a_formula_that_miscounts_a_round_is_caught(n):
    record = ALGORITHMS[("all_reduce", "ring")]
    wrong = Algorithm(record.op, record.name, record.fn, record.elements,
                      lambda n, S: (n - 1, 2 * (n - 1) / n * S, (n - 1) / n * S), steps=record.steps)
    paper = simulate(_schedules(record, n, SIZE), SIZE)
    assert paper.terms != pytest.approx(wrong.cost(n, SIZE))


@pytest.mark.parametrize("key", [k for k in SCHEDULED if k[0] == "all_reduce"], ids="/".join)
@pytest.mark.parametrize("n", [1, 2, 3, 4, 5, 6, 7, 8, 13, 16])
@pytest.mark.parametrize("count", [0, 1, 7, 100])
def test_every_all_reduce_schedule_delivers_every_contribution_once(key, n, count):
    assert simulate(_schedules(ALGORITHMS[key], n, count), count).complete()


@pytest.mark.parametrize("n", [2, 3, 4, 7])
@pytest.mark.parametrize("root", [0, 1])
def test_trees_deliver_the_roots_data_and_the_whole_reduction(n, root):
    root %= n
    cast = simulate(_schedules(ALGORITHMS[("broadcast", "binomial")], n, 5, root), 5)
    assert all(m == 1 << root for masks in cast.masks for m in masks)
    red = simulate(_schedules(ALGORITHMS[("reduce", "binomial")], n, 5, root), 5)
    assert red.complete([(0, 5) if i == root else (0, 0) for i in range(n)])


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_a_schedule_that_drops_a_step_is_caught(n):
    broken = [schedules.ring_steps(n, i, 40, rs=ring.skip_last_rs_step) for i in range(n)]
    assert not simulate(broken, 40).complete()


def test_a_contribution_counted_twice_is_caught():
    twice = [[Step((0, 1), 1 - i, (0, 1), 1 - i, reduce=True)] * 2 for i in range(2)]
    assert not simulate(twice, 1).complete()


def test_a_receive_nobody_sends_is_named_as_a_deadlock():
    with pytest.raises(ValueError, match=r"deadlocks: member 0 step 0 \(recv from 1\)"):
        simulate([[Step(recv=(0, 1), src=1)], []], 1)
