"""The layout's library flavours against the libraries' own calls: torch's DDP after it rebuilds
its buckets (``impl=torch-ddp``) on the session's world, at several bucket caps; DeepSpeed's
ZeRO 1, 2 and 3 (``impl=deepspeed``) in tests/test_audit_libs.py. The flavours' arithmetic by
hand here, single-process."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from commbench.costmodel.flavours import (
    DDP_CAP,
    FIRST_BUCKET,
    _chunks,
    ddp_buckets,
    deepspeed_calls,
    ds_buckets,
    fsdp2_calls,
    layer_params,
    megatron_buffer,
)
from commbench.studies.audit import in_steps, run_script
from commbench.studies.audit_layout import compare, parse_layout

pytestmark = pytest.mark.foundation

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
SHAPE = "layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,loss=none"
PARAMS = layer_params(16, 16, 64, 1) * 2  # examples/layers.py's, 3136 a layer


def test_a_layer_s_parameters_are_the_layout_s_layer():
    assert PARAMS[:10] == [16, 16, 256, 256, 256, 256, 16, 16, 1024, 1024] and sum(PARAMS) == 6272
    assert layer_params(16, 8, 64, 2) == [16, 16, 128, 64, 64, 128, 16, 16, 512, 512]  # LNs whole
    assert all(type(x) is int for x in layer_params(16, 8, 64, 2))
    # with biases, each after its weight: q, k, v and fc1's split over tp, o and fc2's whole
    assert layer_params(16, 8, 64, 2, bias=True) == [16, 16, 128, 8, 64, 4, 64, 4, 128, 16, 16,
                                                     16, 512, 32, 512, 16]


@pytest.mark.parametrize("cap, want", [
    # the last layer's fc2 (4096 B) is under 4194 B: fc1 closes the first bucket at 2048
    (int(0.004 * 2**20), [2048, 1056, 1056, 1056, 1056]),
    # 524 B: each matrix closes its own bucket, LayerNorm pairs ride with the next one
    (int(0.0005 * 2**20), [1024, 1024, 288, 256, 256, 256, 1056, 1024, 288, 256, 256, 256, 32]),
    (int(0.01 * 2**20), [2848, 2624, 800]),
])
def test_ddp_s_rebuilt_buckets_by_hand(cap, want):
    assert ddp_buckets(PARAMS, 4, cap, cap) == want
    assert ddp_buckets(PARAMS, 4, DDP_CAP, FIRST_BUCKET) == [6272]  # the default: one bucket


def test_ddp_s_first_bucket_is_1_mib_only_at_the_default_cap():
    """torch 2.13 as measured (eight 256 x 256 float32 weights, 0.25 MiB each): at the default
    cap the first bucket closes at 1 MiB; with ``bucket_cap_mb=1.6`` given, at 1.6 MB, seven
    weights; with ``find_unused_parameters`` the cut runs in registration order."""
    w = [65536] * 8
    assert ddp_buckets(w, 4, DDP_CAP, FIRST_BUCKET) == [262144, 262144]
    cap = int(1.6 * 2**20)
    assert ddp_buckets(w, 4, cap, cap) == [458752, 65536]
    assert ddp_buckets(w, 4, cap, cap, rebuilt=False) == [458752, 65536]
    assert ddp_buckets([1, 2, 3], 4, 8, 8, rebuilt=False) == [3, 3]  # (1, 2) then 3
    assert ddp_buckets([1, 2, 3], 4, 8, 8) == [3, 2, 1]  # 12 B, then 8 B: each closes alone
    assert ddp_buckets([512, 256, 768], 4, 4096, 4096) == [1024, 512]  # at the cap: closed
    # the example's layers at 524 B, never rebuilt: LayerNorm pairs ride with the next weight
    assert sorted(ddp_buckets(PARAMS, 4, 524, 524, rebuilt=False)) == sorted(
        [288, 256, 256, 256, 1056, 1024] * 2)


def test_deepspeed_s_calls_by_hand():
    psi, g = 6272, 4
    assert deepspeed_calls(1, psi, 4, 3, g) == [("all_reduce", 6272, 4, 1),
                                                ("all_gather", 1568, 4, 1), ("all_reduce", 1, 4, 1)]
    assert deepspeed_calls(2, psi, 4, 3, g) == [("all_reduce", 6272, 4, 3),
                                                ("all_gather", 1568, 4, 1), ("all_reduce", 1, 4, 1)]
    assert deepspeed_calls(3, psi, 2, 2, g) == [("all_gather", 3136, 4, 2),
                                                ("reduce_scatter", 6272, 4, 2), ("all_reduce", 1, 8, 1)]
    # a model past the buckets: the bytes whole, in ceil(psi / bucket) calls; the partitions
    # in one all_gather_into_tensor (allgather_bucket_size cuts nothing in DeepSpeed 0.19.8
    # wherever torch has it: runtime/utils.py, all_gather_dp_groups)
    big = deepspeed_calls(1, 1_200_000_000, 8, 1, 2)
    assert [(op, c, k) for op, c, _, k in big] == [
        ("all_reduce", 400_000_000, 3), ("all_gather", 150_000_000, 1), ("all_reduce", 1, 1)]
    big3 = deepspeed_calls(3, 1_200_000_000, 8, 1, 2)  # 150M per rank, gathers of 50M/8
    assert [(op, c, k) for op, c, _, k in big3] == [
        ("all_gather", 6_250_000, 24), ("reduce_scatter", 400_000_000, 3), ("all_reduce", 1, 1)]
    assert all(type(c) is int for _, c, _, _ in big + big3)
    with pytest.raises(ValueError, match="zero=0: must be 1, 2 or 3"):
        deepspeed_calls(0, psi, 2, 1, g)


def test_buckets_of_a_bounded_size_keep_every_element():
    assert _chunks(10, 4) == [4, 3, 3] and _chunks(8, 4) == [4, 4] and _chunks(3, 4) == [3]
    assert _chunks(0, 4) == [0] and _chunks(9, 1) == [1] * 9


def test_fsdp2_s_calls_by_hand():
    """Two layers of 3136 over 2 ranks, 3 micro-batches: gathers forward and backward, a
    reduce-scatter per layer per micro-batch; a root of 64 gathers once per micro-batch."""
    assert fsdp2_calls(3136, 2, 0, 2, 3, 4) == [("all_gather", 1568, 4, 12),
                                                ("reduce_scatter", 3136, 4, 6)]
    assert fsdp2_calls(3136, 2, 64, 4, 1, 2)[2:] == [("all_gather", 16, 2, 1),
                                                     ("reduce_scatter", 64, 2, 1)]
    assert fsdp2_calls(3136, 2, 64, 2, 3, 4, reshard=False) == [
        ("all_gather", 1568, 4, 6), ("reduce_scatter", 3136, 4, 6), ("all_gather", 32, 4, 3),
        ("reduce_scatter", 64, 4, 3)]
    # elements are whole numbers (a float equals its int in a comparison, not in a ledger)
    assert all(type(c) is int for _, c, _, _ in fsdp2_calls(3136, 2, 64, 4, 1, 2))
    # a MixedPrecisionPolicy: gathers in param_dtype (2 B), reduce-scatters in reduce_dtype (4 B)
    assert fsdp2_calls(3136, 2, 64, 2, 1, 4, p=2) == [
        ("all_gather", 1568, 2, 4), ("reduce_scatter", 3136, 4, 2), ("all_gather", 32, 2, 1),
        ("reduce_scatter", 64, 4, 1)]


def test_megatron_s_padded_buffer_by_hand():
    """Each parameter starts at a multiple of 64 elements, the bucket ends at a multiple of
    lcm(n, 128): examples/layers.py's two layers' 6272 become 6656 (eight 16-element LayerNorm
    tensors take 64 each); the reverse-order walk megatron-core makes gives the same sum."""
    assert megatron_buffer(PARAMS, 2) == megatron_buffer(PARAMS, 4) == 6656
    assert megatron_buffer([1024, 64, 1024, 16], 2) == 2176  # the last param's tail to 128
    assert megatron_buffer([128], 3) == 384  # lcm(3, 128): three equal aligned shards
    assert megatron_buffer([100], 256) == 256


def test_deepspeed_s_buckets_by_hand():
    """At 2000 elements: ZeRO-1 walks registration order, ZeRO-2/3 arrival order, a parameter
    that would pass the cap sending the bucket first (as measured in tests/test_audit_libs)."""
    assert ds_buckets(PARAMS, 2000, False) == [1088, 1024, 1824, 1312, 1024]
    assert ds_buckets(PARAMS, 2000, True) == [1024, 1824, 1312, 1824, 288]
    assert ds_buckets(PARAMS, 500_000_000, True) == [6272]
    assert ds_buckets([3000, 10], 2000, False) == [3000, 10]  # a parameter over the cap alone
    assert deepspeed_calls(2, 6272, 2, 1, 4, PARAMS, 2000)[:4] == [
        ("all_reduce", 1024, 4, 1), ("all_reduce", 1824, 4, 2), ("all_reduce", 1312, 4, 1),
        ("all_reduce", 288, 4, 1)]


def test_a_ds_config_is_read_and_must_agree_with_the_layout(tmp_path):
    good = tmp_path / "ds.json"
    good.write_text('{"gradient_accumulation_steps": 2, "zero_optimization": {"stage": 2, '
                    '"reduce_bucket_size": 2e3}}')
    lay = parse_layout(f"impl=deepspeed,zero=2,dp=2,ds-config={good},{SHAPE}"
                       .replace("micro-batches=1", "micro-batches=2"), 2)
    assert lay.ds_config == str(good)
    bad = tmp_path / "bad.json"
    for text, says in (("{", "not JSON"), ('{"zero_optimization": 3}', "needs an object with a "
                       "zero_optimization object"),
                       ('{"zero_optimization": {"reduce_bucket_size": 0}}',
                        "reduce_bucket_size=0: must be a whole number >= 1"),
                       ('{"zero_optimization": {"stage3_prefetch_bucket_size": 0}}',
                        "stage3_prefetch_bucket_size=0: must be a whole number >= 1"),
                       ('{"zero_optimization": {"stage3_param_persistence_threshold": -1}}',
                        "stage3_param_persistence_threshold=-1: must be a whole number >= 0")):
        bad.write_text(text)
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_layout(f"impl=deepspeed,zero=2,dp=2,ds-config={bad},{SHAPE}", 2)
    for spec, says in ((f"impl=deepspeed,zero=1,dp=2,ds-config={good}",
                        f"zero=1: ds_config='{good}' says stage=2; give zero=2"),
                       (f"impl=deepspeed,zero=2,dp=2,ds-config={good}",
                        f"micro_batches=1: ds_config='{good}' says gradient_accumulation_steps=2"),
                       (f"impl=megatron,dp=2,ds-config={good}", "ds_config="),
                       (f"impl=deepspeed,zero=2,dp=2,ds-config={tmp_path}/none.json",
                        "no such file or directory")):
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_layout(f"{spec},{SHAPE}", 2)


def test_megatron_s_overlapped_buckets_as_megatron_core_measured():
    """megatron-core 0.16's buffer under overlap_grad_reduce, examples/megatron_core_distopt.py's
    parameters (tests/test_audit_libs.py booked them): last to first, each parameter at a
    multiple of 64, a bucket closed at 2000 elements or more and padded to lcm(n, 128). One
    bucket large enough is the flat buffer; the layout cuts the reduce-scatter and the gather
    by bucket, and refuses the settings where they do not apply."""
    from commbench.costmodel.flavours import layer_params, megatron_buckets, megatron_buffer

    ps = layer_params(16, 16, 64, 1) * 2
    assert megatron_buckets(ps, 2, 2000) == [2048, 2304, 2176, 128]
    assert megatron_buckets(ps, 2, 1 << 30) == [megatron_buffer(ps, 2)] == [6656]
    assert megatron_buckets(ps, 3, 2000) == [2304, 2304, 2304, 384]  # lcm(3, 128) = 384
    lay = parse_layout(f"zero=1,dp=2,{SHAPE},overlap-grad-reduce,bucket-size=2000", 2)
    assert lay.flat_buckets == [2048, 2304, 2176, 128]
    assert parse_layout(f"zero=1,dp=2,{SHAPE},overlap-grad-reduce", 2).flat_buckets == [6656]
    for spec, says in (("impl=fsdp2,overlap-grad-reduce", "overlap_grad_reduce=True: "),
                       ("zero=3,overlap-grad-reduce", "needs impl='megatron', zero=1"),
                       ("zero=1,bucket-size=2000", "bucket_size=2000: megatron-core's, used "
                                                   "only with overlap_grad_reduce")):
        with pytest.raises(ValueError, match=re.escape(says)):
            parse_layout(f"dp=2,{spec},{SHAPE}", 2)


def test_zero3_gathers_module_by_module_as_deepspeed_measured():
    """DeepSpeed 0.19.8's ZeRO-3 gathers of examples/deepspeed_zero.py's two layers (h 16,
    ffn 64, no biases: LayerNorms of 16 + 16, four 256-element attention matrices, two of 1024)
    over 2 ranks, as its audits booked them (tests/test_audit_libs.py): the module about to run
    and the ones after it while the fetch holds fewer than the prefetch bucket's elements;
    parameters of at most the persistence threshold gathered alone, once a step. Negative: a
    threshold one element short keeps the LayerNorms sharded; equal parts of the bucket (the
    rule before) cut 3136 otherwise."""
    from commbench.costmodel.flavours import deepspeed_calls, layer_modules, zero3_gathers

    mods = layer_modules(16, 16, 64, 1) * 2
    assert mods[:8] == [[16, 16], [256], [256], [256], [256], [16, 16], [1024], [1024]]
    assert zero3_gathers(mods, 2, 1100) == ([1056, 656, 912, 512], [])
    assert zero3_gathers(mods, 2, 1000) == ([528, 528, 512] * 2, [])
    assert zero3_gathers(mods, 2, 50_000_000, 16) == ([3072], [8] * 8)
    assert zero3_gathers(mods, 2, 50_000_000, 15) == ([3136], [])
    assert zero3_gathers(mods, 2, 50_000_000, 100_000) == ([], [8, 8, 128, 128, 128, 128, 8, 8,
                                                                512, 512] * 2)
    # per micro-batch the fetched, per step the persistent (m = 2)
    calls = deepspeed_calls(3, 6272, 2, 2, 4, modules=mods, persist=16)
    assert sorted(calls) == [("all_gather", 8, 4, 8), ("all_gather", 3072, 4, 2),
                             ("all_reduce", 1, 8, 1), ("reduce_scatter", 6272, 4, 2)]
    assert sorted(deepspeed_calls(3, 6272, 2, 1, 4, prefetch=1100)) != sorted(
        deepspeed_calls(3, 6272, 2, 1, 4, modules=mods, prefetch=1100))


def test_a_layout_prices_deepspeed_s_prefetch_and_persistence_from_its_ds_config(tmp_path):
    """ZeRO-3's gathers read the job's own ds_config, DeepSpeed's defaults where it says
    nothing (persistence 100,000 elements: every tensor of this small model gathered alone,
    once a step); without a ds_config, every parameter sharded (the flavour's assumption)."""
    from commbench.costmodel.layout import _flavour_calls

    spec = SHAPE.replace("micro-batches=1", "micro-batches=2")
    cfg = tmp_path / "ds.json"

    def gathers(extra: str) -> set:
        lay = parse_layout(f"impl=deepspeed,zero=3,dp=2,{spec}{extra}", 2)
        return {(c.op, c.size // 4, k) for c, k in _flavour_calls(lay)["dp"]  # float32
                if c.op == "all_gather"}

    assert gathers("") == {("all_gather", 3136, 2)}
    cfg.write_text('{"zero_optimization": {"stage3_prefetch_bucket_size": 1100, '
                   '"stage3_param_persistence_threshold": 0}}')
    assert gathers(f",ds-config={cfg}") == {("all_gather", n, 2) for n in (1056, 656, 912, 512)}
    cfg.write_text('{"zero_optimization": {"stage": 3}}')
    assert gathers(f",ds-config={cfg}") == {("all_gather", 8, 8), ("all_gather", 128, 8),
                                            ("all_gather", 512, 4)}


@pytest.mark.parametrize("spec, says", [
    ("impl=deepspeed,zero=0", "impl='deepspeed': ZeRO stage 1, 2 or 3 on a dense model"),
    ("impl=torch-ddp,zero=1", "impl='torch-ddp': replicates every parameter"),
    ("impl=torch-ddp,bucket-mb=-1", "bucket_mb=-1.0: must be >= 0 (0: torch's default)"),
    ("impl=deepspeed,zero=2,bucket-mb=5", "bucket_mb=5.0: DistributedDataParallel's setting; "
                                          "needs impl='torch-ddp' (impl='deepspeed')"),
    ("impl=fsdp2,find-unused", "find_unused=True: DistributedDataParallel's setting; needs "
                               "impl='torch-ddp' (impl='fsdp2')"),
    ("impl=deepspeed,zero=2,no-sync", "no_sync=True: DDP's no_sync() or FSDP2's "
                                      "set_requires_gradient_sync(False); needs "
                                      "impl='torch-ddp' or 'fsdp2' (impl='deepspeed')"),
    ("impl=megatron,param-bytes=2", "param_bytes=2: FSDP2's param_dtype, 1, 2, 4 or 8 bytes; "
                                    "needs impl='fsdp2' (impl='megatron')"),
    ("impl=fsdp2,param-bytes=3", "param_bytes=3: FSDP2's param_dtype"),
    ("impl=fsdp2,grad-norm=0", "grad_norm=False: megatron-core's optimizer's norm all-reduce; "
                               "needs impl='megatron' (impl='fsdp2': the flavour says)"),
    ("impl=fsdp2,tp=2,sp,regather", "regather=True: Megatron's backward re-gather; torch's "
                                    "ColwiseParallel keeps its gathered input (impl='fsdp2')"),
    ("impl=horovod", "impl='horovod': must be one of megatron, fsdp2, deepspeed, torch-ddp"),
    ("impl=torch-ddp,no-reshard", "no_reshard=True: FSDP2's reshard_after_forward; needs "
                                  "impl='fsdp2' (impl='torch-ddp')"),
])
def test_a_flavour_that_cannot_hold_is_refused_naming_the_rule(spec, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parse_layout(f"{spec},dp=2,{SHAPE}", 2)


def _ddp_step_3(ctx, args, step=3):
    booked = run_script(ctx, os.path.join(EXAMPLES, "ddp_layers.py"),
                        ["--steps", str(step), *args])
    return in_steps(booked, step, 1)


@pytest.mark.world(sizes=[2, 4])
def test_ddp_s_rebuilt_buckets_are_the_torch_ddp_flavour_s_calls(world):
    """Step 3 (the first two build and then share the rebuilt bucket order) of DDP over the
    example's layers at three caps: no difference from ``impl=torch-ddp``; Megatron's flavour
    (one all-reduce of every gradient) moves the same bytes cut differently, and says so; a
    planted all-reduce is flagged."""
    P = world.size
    for mb in ("0.004", "0.0005", "0.01"):
        lay = parse_layout(f"impl=torch-ddp,bucket-mb={mb},dp={P},{SHAPE}", P)
        got = compare(lay, world.run(_ddp_step_3, ["--bucket-mb", mb])[0])
        assert got["flags"] == [], (mb, got["flags"])
        cap = int(float(mb) * 2**20)
        assert sum(r["observed"] for r in got["rows"]) == len(ddp_buckets(PARAMS, 4, cap, cap))
    megatron = compare(parse_layout(f"dp={P},{SHAPE}", P),
                       world.run(_ddp_step_3, ["--bucket-mb", "0.004"])[0])
    assert megatron["flags"] == ["same bytes per step, cut differently: all_reduce on dp, 6272 "
                                 "elements as 4 x 1056 + 1 x 2048 where the layout makes 1 x 6272"]
    extra = compare(parse_layout(f"impl=torch-ddp,bucket-mb=0.004,dp={P},{SHAPE}", P),
                    world.run(_ddp_step_3, ["--bucket-mb", "0.004", "--extra"])[0])
    assert extra["flags"] == ["extra all_reduce: 1 more of 8 elements on dp than the layout "
                              "makes (0)"]


@pytest.mark.world(sizes=[4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_ddp_over_torch_tp_on_a_dp_x_tp_mesh_makes_the_calls_of_its_flavour(world, sp):
    """DDP over the dp dim of a (dp 2, tp 2) mesh, torch's TP (and SP) inside each layer
    (``_pre_dp_module_transform``), step 3. A TP rank's 1600 elements a layer are bucketed in
    the order their gradients arrive: without SP the LayerNorms' (plain tensors) first, then
    the DTensors' (fc2, fc1, o, v, k, q, last layer first), 1152 + 1536 + 512 at a 4194 B cap;
    under SP every parameter is a DTensor and the order is the reverse of registration again,
    32 + 3 x 1056. ``impl=torch-ddp,tp=2`` predicts every call, phase ``backward``, each
    bucket carrying its modules' elements; bucketed in reverse registration order, as without
    TP, the first case would be flagged."""
    from commbench.wire.ledger import Entry

    spec = f"impl=torch-ddp,bucket-mb=0.004,tp=2,dp=2,act-bytes=4,{SHAPE}" + (",sp" if sp else "")
    booked = world.run(_ddp_step_3, ["--bucket-mb", "0.004", "--tp", "2",
                                     *(["--sp"] if sp else [])])[0]
    got = compare(parse_layout(spec, 4), booked)
    assert got["flags"] == [], got["flags"]
    dp = sorted(r["elements"] for r in got["rows"] for _ in range(r["observed"])
                if r["axis"] == "dp")
    assert dp == ([32, 1056, 1056, 1056] if sp else [512, 1152, 1536])
    cap = int(0.004 * 2**20)
    plain = sorted(ddp_buckets(layer_params(16, 16, 64, 2) * 2, 4, cap, cap))
    assert (plain == dp) is sp  # the registration order holds under SP only
    grads = [Entry._make(t) for t in booked if t[0] == "all_reduce" and tuple(t[1]) == (0, 2)]
    assert {e.phase for e in grads} == {"backward"}
    assert all(sum(k for _, k in e.carries) == e.count for e in grads)
    assert sorted(m.rsplit(".", 1)[-1] for e in grads for m, _ in e.carries) == sorted(
        ["ln1", "q", "k", "v", "o", "ln2", "fc1", "fc2"] * 2)


@pytest.mark.world(sizes=[2])
@pytest.mark.parametrize("setting, args, step", [
    ("find-unused", ["--find-unused"], 3),
    ("no-sync,micro-batches=3", ["--no-sync", "--micro-batches", "3"], 3),
    ("no-sync,find-unused,micro-batches=3", ["--no-sync", "--find-unused", "--micro-batches",
                                             "3"], 3),
    ("static-graph", ["--static-graph"], 4),
    ("static-graph,find-unused", ["--static-graph", "--find-unused"], 4),
], ids=["find-unused", "no-sync", "no-sync-find-unused", "static-graph", "static-find-unused"])
def test_ddp_s_settings_are_the_torch_ddp_flavour_s_calls(world, setting, args, step):
    """DDP's everyday settings at 524 B buckets, in a step after its set-up (static_graph
    rebuilds one step later: step 4): no difference from the flavour told the same setting.
    find_unused_parameters keeps the buckets of registration order and all-reduces a bitmap of
    the 20 parameters (int32) per synchronised backward; no_sync() leaves one all-reduce per
    bucket per step; the default flavour flags each of them. gradient_as_bucket_view moves the
    same calls."""
    spec = f"impl=torch-ddp,bucket-mb=0.0005,dp=2,{SHAPE}".replace("micro-batches=1,", "")
    booked = world.run(_ddp_step_3, ["--bucket-mb", "0.0005", "--bucket-view", *args], step)[0]
    m = "" if "micro-batches" in setting else ",micro-batches=1"
    got = compare(parse_layout(f"{spec},{setting}{m}", 2), booked)
    assert got["flags"] == [], got["flags"]
    bitmap = [r for r in got["rows"] if r["dtype"] == "int32"]
    unused = "find-unused" in setting and "static" not in setting
    assert [(r["elements"], r["observed"]) for r in bitmap] == ([(20, 1)] if unused else [])
    plain = compare(parse_layout(f"{spec},micro-batches={3 if 'no-sync' in setting else 1}", 2),
                    booked)["flags"]
    assert (plain != []) == (setting not in ("static-graph", "static-graph,find-unused"))


def _ddp_phases(ctx, args):
    from collections import Counter

    from commbench.studies.audit import step_of
    from commbench.wire.ledger import Entry

    booked = run_script(ctx, os.path.join(EXAMPLES, "ddp_layers.py"), ["--bucket-mb", "0.004",
                                                                        *args])
    return Counter((e.op, e.dtype, step_of(e.scope), e.phase) for e in map(Entry._make, booked))


@pytest.mark.world(sizes=[2])
def test_every_call_of_ddp_has_the_phase_of_what_ddp_is_doing(world):
    """DDP's set-up (the parameter broadcast and the groups' exchange, before the first step)
    and its broadcast of the rebuilt bucket order (two int32 calls, in the forward of step 2,
    of step 3 with static_graph) are ``setup``; the gradients' all-reduces and
    find_unused_parameters' bitmap are ``backward``; nothing is ``forward``."""
    setup = {("all_gather", "int64", 0, "setup"): 1, ("broadcast", "int64", 0, "setup"): 1,
             ("broadcast", "float32", 0, "setup"): 1}
    grads = {("all_reduce", "float32", s, "backward"): 5 for s in (2, 3)}
    assert world.run(_ddp_phases, [])[0] == {
        **setup, ("all_reduce", "float32", 1, "backward"): 1, **grads,
        ("broadcast", "int32", 2, "setup"): 2}
    static = world.run(_ddp_phases, ["--static-graph", "--steps", "4"])[0]
    assert static == {**setup, ("all_reduce", "float32", 1, "backward"): 1,
                      ("all_reduce", "int32", 1, "backward"): 1,
                      ("all_reduce", "float32", 2, "backward"): 1,
                      **{("all_reduce", "float32", s, "backward"): 5 for s in (3, 4)},
                      ("broadcast", "int32", 3, "setup"): 2}
    unused = world.run(_ddp_phases, ["--find-unused"])[0]
    assert unused == {**setup, **{("all_reduce", "float32", s, "backward"): 5 for s in (1, 2, 3)},
                      **{("all_reduce", "int32", s, "backward"): 1 for s in (1, 2, 3)}}


@pytest.mark.world(sizes=[2])
def test_a_bucket_s_bytes_go_to_every_module_it_carries(world):
    """DDP with gradient_as_bucket_view: each bucket's all-reduce carries the modules whose
    gradients lie in it, their elements adding up to the call's, and the module table shares
    its bytes among them in proportion; without the view the bucket is a copy, and the call
    carries the same modules, read off DDP's reducer (its buckets' parameters, reduced in
    index order)."""
    from commbench.studies.audit import tables
    from commbench.wire.ledger import Entry

    view = world.run(_ddp_step_3, ["--bucket-mb", "0.004", "--bucket-view"])
    calls = [Entry._make(t) for t in view[0] if t[0] == "all_reduce"]
    assert sorted(e.count for e in calls) == [1056] * 4 + [2048]
    assert all(sum(k for _, k in e.carries) == e.count for e in calls)
    fc2 = next(e for e in calls if e.count == 2048)  # the last layer's fc2 and fc1
    assert [m.rsplit(".", 2)[-2:] for m, _ in fc2.carries] == [["1", "fc1"], ["1", "fc2"]]
    assert fc2.module == "DistributedDataParallel.module.1"
    modules = {r["module"]: r for r in tables(view)["modules"]}
    assert modules["DistributedDataParallel.module.1.fc2"]["sent"] == fc2.sent // 2
    assert len([m for m in modules if m.count(".") == 3]) == 16  # every leaf of both layers
    copy = world.run(_ddp_step_3, ["--bucket-mb", "0.004"])
    assert [(e.count, e.carries, e.module) for e in calls] == [
        (e.count, e.carries, e.module) for e in map(Entry._make, copy[0])
        if e.op == "all_reduce"]
    assert tables(copy)["modules"] == tables(view)["modules"]
    # find_unused_parameters: buckets of registration order, and an int32 bitmap no bucket's
    unused = [Entry._make(t) for t in world.run(_ddp_step_3, ["--bucket-mb", "0.004",
                                                              "--find-unused"])[0]]
    assert [sum(k for _, k in e.carries) for e in unused if e.op == "all_reduce"] == [
        e.count if e.dtype == "float32" else 0 for e in unused if e.op == "all_reduce"]
    assert {e.dtype for e in unused if e.op == "all_reduce"} == {"float32", "int32"}


def test_ddp_s_buckets_are_read_off_its_log_or_not_at_all():
    """DDP's log names its rebuilt buckets by parameter index, its first ones by size in bytes
    (cut from the parameters last to first); a log that does not add up to the parameters
    gives no buckets rather than wrong ones."""
    import torch

    from commbench.wire.modules import _ddp_cut

    ps = [torch.zeros(n) for n in (16, 16, 256, 1024)]
    rebuilt = _ddp_cut(ps, "3 2, 1 0", "")
    assert [(k, [p.numel() for p in b]) for k, b in rebuilt] == [(1280, [1024, 256]),
                                                                (32, [16, 16])]
    first = _ddp_cut(ps, None, "4096, 1152")  # 1024 x 4 B, then (256 + 16 + 16) x 4 B
    assert [k for k, _ in first] == [1024, 288] and first[0][1][0] is ps[3]
    assert _ddp_cut(ps, None, "4096, 1000") == []  # cuts no parameter's edge
    assert _ddp_cut(ps, None, "4096") == []  # leaves parameters out
    assert _ddp_cut(ps, "3 9", "") == []  # names a parameter DDP does not have


PIPE = "grad-norm=0,layers={P},hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,loss=none,act-bytes=4"


def _pipelined_steps(ctx, args):
    return run_script(ctx, os.path.join(EXAMPLES, "torch_pipelining.py"), ["--steps", "2", *args])


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_torch_pipelining_makes_the_calls_of_the_layout_s_first_stage(world, schedule):
    """Rank 0, the first of P stages, in step 2 (step 1 also sends the stages' shapes ahead):
    each of 4 micro-batches' activations [2, 8, 16] sent on and their gradients received back,
    whatever the schedule's order: the layout's pp calls. The whole script has the shapes too;
    a layout of 2 micro-batches misses half; a planted all-reduce is flagged on pp."""
    P = world.size

    def flags(spec, *args, step=2):
        lay = parse_layout(f"pp={P},{PIPE.format(P=P)},{spec}", P)
        got = world.run(_pipelined_steps, ["--schedule", schedule, *args])[0]
        return compare(lay, in_steps(got, step, 1) if step else got)

    ok = flags("micro-batches=4")
    assert ok["flags"] == []
    assert {(r["axis"], r["op"], r["elements"], r["observed"]) for r in ok["rows"]} == {
        ("pp", "send", 256, 4), ("pp", "recv", 256, 4)}
    whole = flags("micro-batches=4", step=0)["flags"]  # both steps, and the shapes' calls
    assert "extra send: 4 more of 256 elements on pp than the layout makes (4)" in whole
    assert len(whole) > 2 and all(f.startswith(("extra send", "extra recv")) for f in whole)
    assert flags("micro-batches=2")["flags"] == [
        f"extra {op}: 2 more of 256 elements on pp than the layout makes (2)"
        for op in ("recv", "send")]
    assert flags("micro-batches=4", "--extra")["flags"] == [
        "extra all_reduce: 1 more of 8 elements on pp than the layout makes (0)"]


TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--no-python",
            sys.executable, "-m", "commbench", "audit", "--no-write"]


@pytest.mark.launcher
@pytest.mark.local
@pytest.mark.parametrize("script, spec, args", [
    ("ddp_layers.py", f"impl=torch-ddp,bucket-mb=0.004,dp=2,{SHAPE}", ["--step", "3"]),
    ("fsdp2_layers.py", f"impl=fsdp2,dp=2,{SHAPE},act-bytes=4", []),
    ("fsdp2_layers.py", f"impl=fsdp2,no-reshard,dp=2,{SHAPE},act-bytes=4", ["--", "--no-reshard"]),
    ("torch_pipelining.py", f"pp=2,micro-batches=4,{PIPE.format(P=2)}",
     ["--step", "2", "--", "--steps", "2", "--schedule", "1f1b"]),
], ids=["ddp", "fsdp2", "fsdp2-no-reshard", "pipelining"])
def test_the_flavours_examples_under_torchrun_make_their_flavour_s_calls(tmp_path, script, spec,
                                                                          args):
    """The examples run under torchrun as a user runs them (each rank its own process, the
    launcher's variables), against their flavour: exit 0 and no difference."""
    extra = ["--", "--steps", "3"] if script == "ddp_layers.py" else []
    out = subprocess.run([*TORCHRUN, os.path.join(EXAMPLES, script), "--layout", spec, *args,
                          *extra], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "No difference: every call is one the layout makes." in out.stdout, out.stdout[-2000:]
