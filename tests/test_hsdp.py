"""The hsdp pattern's own rules, by hand (its contract with the oracle, its predicted calls and
its broken variants run in tests/test_patterns.py with every pattern)."""

from __future__ import annotations

import pytest

from commbench.patterns.dp.hsdp import HSDPConfig, hsdp_calls
from commbench.patterns.registry import get

pytestmark = [pytest.mark.zero, pytest.mark.ddp]


def _per_axis(calls) -> dict[str, list[tuple[str, int, int]]]:
    out: dict[str, list] = {}
    for c in calls:
        out.setdefault(c.axis, []).append((c.op, c.size, c.sent))
    return out


def test_hsdp_moves_zero3_on_the_shard_group_and_one_all_reduce_per_layer_across_replicas():
    # 2 layers of h=3: 12 elements each, padded to 12 on a shard group of 2: chunks of 6
    cfg = HSDPConfig(layers=2, hidden=3, batch=8, micro=2, steps=1, shard=2, replicate=2,
                     dtype="float32")
    axes = _per_axis(hsdp_calls(cfg, rank=3))
    # per layer and micro-batch: 2 gathers of a 6-element chunk (forward, backward) and one
    # reduce-scatter of the 12-element gradient, each sending half of its 12 elements
    assert sorted(axes["dp_shard"]) == sorted([("all_gather", 24, 24)] * 8 +
                                              [("reduce_scatter", 48, 24)] * 4)
    # per layer and step: the 6-element chunk all-reduced by 2 replicas: 2 (R-1)/R x 6 sent
    assert axes["dp_replicate"] == [("all_reduce", 24, 24)] * 2
    # under mixed precision the chunk goes in fp32, the gathers in bf16
    mixed = _per_axis(hsdp_calls(HSDPConfig(layers=1, hidden=3, batch=4, shard=2, replicate=2,
                                            steps=1, dtype="bfloat16"), rank=0))
    assert mixed["dp_replicate"] == [("all_reduce", 24, 24)]
    assert ("all_gather", 12, 12) in mixed["dp_shard"]


def test_the_replicate_group_carries_1_over_s_of_the_gradient():
    """DDP all-reduces every gradient over all P ranks; HSDP all-reduces only a rank's 1/S chunk
    over its R replicas: 2(R-1)/R Psi/S per rank against 2(P-1)/P Psi."""
    hsdp = get("hsdp")
    cfg = HSDPConfig(layers=3, hidden=7, batch=8, steps=1, shard=4, replicate=2)  # 56 elements
    ddp = sum(c.sent for c in hsdp.predicted(cfg, "ddp", 0))
    across = sum(c.sent for c in hsdp.predicted(cfg, "hsdp", 0) if c.axis == "dp_replicate")
    assert ddp == 3 * 2 * 7 * 56 // 8 * 8  # 2 (P-1)/P x 56 elements x 8 bytes, 3 layers
    assert across == 3 * 2 * 1 * 14 // 2 * 8  # 2 (R-1)/R x 14-element chunk x 8 bytes


@pytest.mark.parametrize(("cfg", "message"), [
    (HSDPConfig(shard=2, replicate=3, batch=6), "replicate=3 x shard=2: must equal the world "
                                                "size 4"),
    (HSDPConfig(shard=0, replicate=4, batch=4), "shard=0: must be >= 1"),
    (HSDPConfig(shard=2, replicate=2, batch=6), "batch=6: must be a multiple of the DP size 4"),
])
def test_a_bad_config_is_refused_in_one_line_naming_the_rule(cfg, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        get("hsdp").check(cfg, 4, "hsdp")
