"""Rank grids: the layout math (pure) and the groups a world builds from one description."""

from __future__ import annotations

import pytest

from commbench.runtime.group import grid_groups, parse_grid

pytestmark = pytest.mark.foundation


def test_grid_groups_match_megatron_layout():
    dims = parse_grid("dp=2,tp=2")
    assert grid_groups(dims, ("tp",)) == [(0, 1), (2, 3)]
    assert grid_groups(dims, ("dp",)) == [(0, 2), (1, 3)]
    assert grid_groups(dims, ("dp", "tp")) == [(0, 1, 2, 3)]
    three = parse_grid({"pp": 2, "dp": 2, "tp": 2})
    assert grid_groups(three, ("dp",)) == [(0, 2), (1, 3), (4, 6), (5, 7)]
    assert grid_groups(three, ("pp",)) == [(0, 4), (1, 5), (2, 6), (3, 7)]


def test_every_axis_partitions_the_world():
    dims = parse_grid("ep=2,dp=3,tp=2")
    for axes in [("ep",), ("dp",), ("tp",), ("ep", "tp"), ("dp", "tp")]:
        groups = grid_groups(dims, axes)
        assert sorted(r for g in groups for r in g) == list(range(12))


@pytest.mark.parametrize(("spec", "message"), [
    ("dp=0", "dp=0: must be >= 1"), ("tp", "name=size"), ("tp=2,tp=2", "given twice"),
    ("tp=x", "must be an integer"), ("", "no axes"),
])
def test_bad_grid_specs(spec, message):
    with pytest.raises(ValueError, match=message):
        parse_grid(spec)


def _grid_groups_on_ranks(ctx, spec):
    grid = ctx.grid(spec, combos=(("dp", "tp"),))
    out = {"coords": grid.coords}
    for axes in (("tp",), ("dp",), ("dp", "tp")):
        g = grid.group(*axes)
        for transport in ctx.transports:
            total = ctx.comm(transport).all_reduce(_one(), g)
            out[("_".join(axes), transport)] = (g.ranks, int(total.item()))
    return out


def _one():
    import torch

    return torch.ones(1)


@pytest.mark.world(sizes=[4], min_size=2)
def test_named_groups_on_a_world(world):
    if world.size % 2:
        pytest.skip(f"a dp x tp=2 grid needs an even world, this one has {world.size} ranks")
    n = world.size
    results = world.run(_grid_groups_on_ranks, f"dp={n // 2},tp=2")
    for rank, out in enumerate(results):
        assert out["coords"] == {"dp": rank // 2, "tp": rank % 2}
        for transport in world.transports:
            assert out[("tp", transport)] == ((rank // 2 * 2, rank // 2 * 2 + 1), 2)
            assert out[("dp", transport)] == (tuple(range(rank % 2, n, 2)), n // 2)
            assert out[("dp_tp", transport)] == (tuple(range(n)), n)


def _bad_grid(ctx):
    ctx.grid(f"dp={ctx.size + 1},tp=2")


@pytest.mark.world(sizes=[2, 4])
def test_grid_that_does_not_fit_the_world(world):
    from commbench.runtime.errors import SPMDError

    n = world.size
    with pytest.raises(SPMDError, match=f"multiply to {2 * n + 2}, the world has {n}"):
        world.run(_bad_grid)
