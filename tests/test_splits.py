"""Making groups under NCCL (commbench.wire.splits): torch's new_group as a sequence of
ncclCommSplit calls on every rank, checked to line up. The model reproduces what a replay of a
tp=2 x dp=2 job's groups and a pipeline's pair groups did with a gloo group beside each NCCL one
(one-rank communicators; a hang), and every group commbench's own patterns, studies and replays
make passes it at 2, 3, 4 and 8 ranks."""

from __future__ import annotations

import pytest

from commbench.patterns.registry import PATTERNS
from commbench.runtime.group import grid_groups
from commbench.wire.splits import Creation, check, split_calls
from commbench.world.context import Context

pytestmark = pytest.mark.foundation


def _with_side_groups(groups, n: int, balanced: bool) -> list[list[Creation]]:
    """Every rank's creations: each group as NCCL, then a gloo group of the same ranks beside
    it (what commbench does on NCCL), all ranks in one order."""
    world = tuple(range(n))
    mine = [Creation(world, "gloo")]
    for g in groups:
        if g != world:
            mine.append(Creation(g, "nccl"))
        mine.append(Creation(g, "gloo", balanced=balanced))
    return [list(mine) for _ in range(n)]


def test_a_replayed_tp_dp_job_leaves_one_rank_communicators_without_the_balancing_split():
    groups = sorted([(0, 1), (2, 3), (0, 2), (1, 3)])  # replay's order
    problems = check(_with_side_groups(groups, 4, balanced=False))
    assert problems and "ncclCommSplit 1: ranks [0] pass the colour of group [0, 2]" in problems[0]
    assert "without ranks [2] (rank 2 splits with no colour)" in problems[0]
    assert check(_with_side_groups(groups, 4, balanced=True)) == []


def test_a_pipelines_pair_groups_hang_in_the_split_without_it():
    groups = [(0,), (1,), (2,), (3,), (0, 1), (1, 2), (2, 3)]
    problems = check(_with_side_groups(groups, 4, balanced=False))
    assert any("ncclCommSplit hangs" in p for p in problems)
    assert check(_with_side_groups(groups, 4, balanced=True)) == []


def test_overlapping_groups_made_in_different_orders_are_caught():
    a = [Creation((0, 1), "nccl"), Creation((0, 2), "nccl")]
    b = [Creation((0, 2), "nccl"), Creation((0, 1), "nccl")]
    problems = check([a, a, b])
    assert problems and "ncclCommSplit 0" in problems[0]
    assert check([a, a, a]) == []


def test_torch_s_rules_per_rank_and_lazy_init_splits_nothing():
    made = [Creation((0, 1), "nccl"), Creation((0, 1), "gloo"), Creation((2, 3), "gloo", True)]
    assert split_calls(0, made) == [(0, 1), None]  # no colour for a group it is not in
    assert split_calls(2, made) == [None, None, None]
    assert split_calls(3, made, mode="lazy") == []
    assert check([made, made, made, made], mode="lazy") == []


def _contexts(n: int) -> list[Context]:
    return [Context(rank=r, size=n, backend=None) for r in range(n)]


def _configs(pattern, n: int) -> list:
    out = list(pattern.bench_configs(n))
    for v in pattern.variants:
        out += pattern.edge_configs(n, v)
    return out


@pytest.mark.parametrize("n", [2, 3, 4, 8])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_every_patterns_groups_line_up_under_nccl(name, n):
    pattern = PATTERNS[name]
    configs = _configs(pattern, n)
    if not configs:
        pytest.skip(f"{name}: no config at {n} ranks")
    ctxs = _contexts(n)
    for cfg in configs:
        for ctx in ctxs:
            pattern.groups(ctx, cfg)
    assert check([c.creations for c in ctxs]) == []


@pytest.mark.parametrize("n", [2, 3, 4, 8])
def test_a_replays_groups_and_a_pipelines_pairs_line_up_under_nccl(n):
    """replay makes every recorded group, one-rank ones too, in sorted order on every rank."""
    dims = {"tp": 2, "dp": n // 2} if n % 2 == 0 else {"tp": n}
    recorded = set()
    for axes in (("tp",), ("dp",)) if n % 2 == 0 else (("tp",),):
        recorded |= set(grid_groups(dims, axes))
    recorded |= {(r,) for r in range(n)} | {(r, r + 1) for r in range(n - 1)}
    ctxs = _contexts(n)
    for ctx in ctxs:
        for g in sorted(recorded):
            ctx.group(g)
    assert check([c.creations for c in ctxs]) == []
