"""``commbench audit --layout``: rank 0's booked calls against the calls of the layout, by axis,
op and elements, each difference flagged (an extra all-gather, a call in another width, a group
the layout does not have); Megatron's SP layer written with plain torch.distributed
(examples/megatron_sp.py) makes exactly the layout's calls."""

from __future__ import annotations

import os
import subprocess

import pytest
from command import commbench

from commbench.costmodel.layout_config import Layout
from commbench.studies.audit import run_script
from commbench.studies.audit_layout import (
    _predicted,
    compare,
    layout_groups,
    layout_tables,
    parse_layout,
)
from commbench.wire.ledger import Entry

pytestmark = pytest.mark.foundation

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "megatron_sp.py")
SHAPE_DS = "layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,loss=none,act-bytes=4"
SPEC = ("grad-norm=0,tp={P},sp,bias,layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,"
        "loss=none,act-bytes=4,grad-bytes=4")


def test_a_layout_spec_is_read_and_checked_before_any_rank_starts():
    lay = parse_layout("tp=2,sp,dp=2,hidden=64,heads=4,act_bytes=4", 4)
    assert (lay.tp, lay.sp, lay.dp, lay.hidden, lay.act_bytes) == (2, True, 2, 64, 4)
    for spec, says in (("tp=2,size=3", "no such setting"), ("tp=two", "'two' is not a int"),
                       ("tp", "needs a value"), ("pp=2,layers=32", "loss='megatron': rank 0 is the first"),
                       ("tp=4", "tp*cp*dp*pp = 4 ranks; the audit runs 2"),
                       ("tp=2,heads=3", "must split over tp=2")):
        with pytest.raises(ValueError) as err:
            parse_layout(spec, 2)
        assert says in str(err.value)


def test_the_layout_s_groups_in_megatron_order():
    # with ep = 1 the expert parameters' dp group (edp) is the dp group
    assert layout_groups(Layout(tp=2, dp=2, grad_norm=False)) == {
        (0, 1): ("tp",), (2, 3): ("tp",), (0, 2): ("dp", "edp"), (1, 3): ("dp", "edp")}
    # megatron-core's gradient norm: on the model-parallel ranks, or under the distributed
    # optimizer on every rank
    assert layout_groups(Layout(tp=2, dp=2))[(0, 1)] == ("tp", "mp")
    assert layout_groups(Layout(tp=2, dp=2, zero=1))[(0, 1, 2, 3)] == ("world",)
    # with dp = 1 the cp ranks reduce gradients too
    cp = layout_groups(Layout(tp=2, cp=2, seq=8, grad_norm=False))
    assert cp == {(0, 1): ("tp",), (2, 3): ("tp",), (0, 2): ("cp", "dp", "edp"),
                  (1, 3): ("cp", "dp", "edp")}
    moe = layout_groups(Layout(cp=2, ep=2, dp=4, experts=4, seq=8))  # edp: two strides
    assert moe[(0, 1, 4, 5)] == ("edp",) and moe[(0, 2)] == ("ep",) and len(moe[(0, 1)]) == 1


def _entries(lay: Layout, group=(0, 1), dtype="float32") -> list[tuple]:
    """Rank 0's calls exactly as the layout predicts them, as the ledger books entries."""
    out = []
    for (_axis, op, count), times in _predicted(lay)[0].items():
        out += [tuple(Entry(op, group, "gloo", dtype, count, 0, 0, 0.0))] * times
    return out


def test_the_layout_s_own_calls_have_no_difference_and_each_planted_one_is_flagged():
    lay = parse_layout(SPEC.format(P=2), 2)
    exact = _entries(lay)
    assert compare(lay, exact)["flags"] == []
    ag = next(e for e in exact if e[0] == "all_gather")
    flags = compare(lay, [*exact, ag])["flags"]
    assert flags == ["extra all_gather: 1 more of 128 elements on tp than the layout makes (8)"]
    flags = compare(lay, [e for e in exact if e is not ag] + [ag] * 7)["flags"]
    assert flags[0].startswith("missing all_gather: 1 fewer")
    stray = tuple(Entry("all_reduce", (0, 2), "gloo", "float32", 8, 0, 0, 0.0))
    lay4 = parse_layout(SPEC.format(P=2).replace("tp=2", "tp=4"), 4)
    flags = compare(lay4, [*_entries(lay4, (0, 1, 2, 3)), stray])["flags"]
    assert flags == ["unexpected group: 1 all_reduce on ranks [0, 2], none of the layout's groups"]
    half = compare(parse_layout(SPEC.format(P=2).replace("act-bytes=4", "act-bytes=2"), 2), exact)
    assert len(half["flags"]) == 3 and all(f.startswith("dtype: ") and "act_bytes=2" in f
                                           for f in half["flags"])


def test_a_group_serving_two_axes_books_each_call_on_the_axis_that_predicts_it():
    """tp=2, cp=2, dp=1: ranks (0, 2) are the cp ring and the gradients' dp group at once. The
    ring's sends and the gradient all-reduce, booked on that one group, each land on their own
    axis; one more gradient all-reduce is an extra on dp, not on cp."""
    lay = Layout(tp=2, cp=2, layers=1, hidden=8, heads=4, kv_heads=4, seq=8, vocab=16,
                 act_bytes=4, grad_bytes=4, grad_norm=False)
    groups = {"tp": (0, 1), "cp": (0, 2), "dp": (0, 2)}
    exact = [tuple(Entry(op, groups[axis], "gloo", "float32", count, 0, 0, 0.0))
             for (axis, op, count), times in _predicted(lay)[0].items() for _ in range(times)]
    assert {axis for axis, _, _ in _predicted(lay)[0]} == {"tp", "cp", "dp"}
    rows = compare(lay, exact)
    assert rows["flags"] == []
    assert {(r["axis"], r["op"]) for r in rows["rows"]} >= {("cp", "send"), ("dp", "all_reduce")}
    grad = next(e for e in exact if e[0] == "all_reduce" and e[1] == (0, 2))
    assert compare(lay, [*exact, grad])["flags"] == [
        f"extra all_reduce: 1 more of {grad[4]} elements on dp than the layout makes (1)"]


def _audit(ctx, args):
    return run_script(ctx, EXAMPLE, args)


@pytest.mark.world(sizes=[2, 4])
def test_megatron_s_sp_layer_makes_the_layout_s_calls(world):
    P = world.size
    lay = parse_layout(SPEC.format(P=P), P)
    assert compare(lay, world.run(_audit, [])[0])["flags"] == []
    regather = parse_layout(SPEC.format(P=P) + ",regather", P)  # the layout told of a re-gather
    assert [f.split(":")[0] for f in compare(regather, world.run(_audit, [])[0])["flags"]] == \
        ["missing all_gather"]
    flags = compare(lay, world.run(_audit, ["--extra-gather"])[0])["flags"]
    assert [f.split(":")[0] for f in flags] == ["extra all_gather", "extra reduce_scatter"]
    # the example's linears have biases: a layout without them sums 4h, not 6h, a layer
    bare = parse_layout(SPEC.format(P=P).replace(",bias", ""), P)
    assert compare(bare, world.run(_audit, [])[0])["flags"] == [
        "size: 1 all_reduce on tp of 192 elements where the layout makes 128 (+64 each)"]


@pytest.mark.local
def test_audit_layout_exits_1_with_the_differences_and_2_on_a_bad_spec(tmp_path):
    cmd = commbench("audit", EXAMPLE, "--np", "2", "--out", str(tmp_path), "--label", "t",
                    "--layout", SPEC.format(P=2))
    out = subprocess.run([*cmd, "--", "--extra-gather"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1, out.stderr
    assert "#   extra all_gather: 1 more of 128 elements on tp" in out.stdout
    text = (tmp_path / "audit_megatron_sp_t-x2.md").read_text()
    assert "Against the layout" in text and "- extra reduce_scatter" in text
    bad = subprocess.run([*cmd[:-1], "tp=3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "tp=3" in bad.stderr


def _p2p(op: str, peer: int, count: int, group=(0, 1, 2, 3), dtype="float32") -> tuple:
    return tuple(Entry(op, group, "gloo", dtype, count, 0, 0, 0.0, peer=peer))


def test_a_pipeline_layout_is_compared_on_the_first_stage_by_each_call_s_peer():
    """tp=2, pp=2 on 4 ranks: rank 0's pp neighbour is rank 2. Per step the first stage sends
    each of m=3 micro-batches' activations [2 x 8, 16/1] on and receives their gradients (the
    pp pattern's 1F1B stage 0), blocking or not, named on the world group as torch's
    pipelining does; its TP calls are those of 4/2 layers, without the last stage's head. A
    send to rank 1 (tp, not pp) or rank 3 (no group of rank 0's) is flagged; a receive from
    the wrong neighbour is not a pp call."""
    spec = ("grad-norm=0,tp=2,pp=2,layers=4,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=3,"
            "loss=none,act-bytes=4")
    lay = parse_layout(spec, 4)
    counts = _predicted(lay)[0]
    assert {k: v for k, v in counts.items() if k[0] == "pp"} == {("pp", "send", 256): 3,
                                                                 ("pp", "recv", 256): 3}
    tp = [e for e in _entries(lay) if (e[0], e[4]) not in (("send", 256), ("recv", 256))]
    assert sum(k for (axis, _, _), k in counts.items() if axis == "tp") == len(tp) > 0
    pp = [_p2p("isend", 2, 256), _p2p("send", 2, 256), _p2p("send", 2, 256),
          _p2p("irecv", 2, 256), _p2p("recv", 2, 256), _p2p("recv", 2, 256)]
    ok = compare(lay, tp + pp)
    assert ok["flags"] == []
    assert [r for r in ok["rows"] if r["axis"] == "pp"] == [
        {"axis": "pp", "op": op, "elements": 256, "dtype": "float32", "predicted": 3,
         "observed": 3, "flag": ""} for op in ("recv", "send")]
    assert compare(lay, tp + pp + [_p2p("isend", 1, 256)])["flags"] == [
        "extra send: 1 more of 256 elements on tp than the layout makes (0)"]
    assert compare(lay, [_p2p("send", 3, 256)] * 2 + tp + pp[1:])["flags"] == [
        "unexpected group: 2 send on ranks [0, 3], none of the layout's groups",
        "missing send: 1 fewer of 256 elements on pp than the layout makes (3)"]
    assert compare(lay, tp + pp + [_p2p("recv", 2, 8, dtype="int64")])["flags"] == [
        "extra recv: 1 more of 8 elements on pp than the layout makes (0); dtype: recv of 8 "
        "elements on pp in int64; the layout's activations are 4 B per element (act_bytes=4)"]
    # of 3 stages the busiest, which predict layout prices, is the middle one, not rank 0's
    from commbench.costmodel.layout import _calls

    three = Layout(pp=3, layers=3, hidden=16, heads=4, seq=8, micro_batches=3, loss="none")
    assert len(_calls(three)["pp"]) == 12 and len(_calls(three, stage=0)["pp"]) == 6


def test_a_pipeline_spec_prices_no_loss_on_the_first_stage():
    """With a loss the layout prices the last stage's head (and never the first stage's
    embedding): a pipeline spec for the audit must say loss=none."""
    for loss in ("megatron", "fused", "naive"):
        with pytest.raises(ValueError, match=f"pp=2 with loss='{loss}': rank 0 is the first "
                                             "stage, whose embedding the layout does not price; "
                                             "give loss=none"):
            parse_layout(f"pp=2,layers=2,loss={loss}", 2)
    from commbench.costmodel.layout import _calls

    lay = Layout(tp=2, pp=2, layers=2, hidden=16, heads=4, seq=8, vocab=32, micro_batches=1)
    tp = {0: _calls(lay, stage=0)["tp"], 1: _calls(lay, stage=1)["tp"], None: _calls(lay)["tp"]}
    assert len(tp[0]) < len(tp[1]) == len(tp[None])  # the head and the loss: the last stage's


def test_the_comparison_s_table_and_verdict_by_hand():
    rows = [{"axis": "dp", "op": "all_reduce", "elements": 8, "dtype": "float32", "predicted": 1,
             "observed": 2, "flag": "extra all_reduce"}]
    table, verdict = layout_tables({"rows": rows, "flags": ["extra all_reduce", "dtype: x"]},
                                   "audited")
    assert table.splitlines() == [
        "| axis   | op         |   elements | dtype   |   layout |   audited | flag             |",
        "|--------|------------|------------|---------|----------|-----------|------------------|",
        "| dp     | all_reduce |          8 | float32 |        1 |         2 | extra all_reduce |"]
    assert verdict == "- extra all_reduce\n- dtype: x"
    assert layout_tables({"rows": [], "flags": []}, "seen")[1] == \
        "No difference: every call is one the layout makes."


def test_the_same_bytes_cut_differently_are_said_once():
    """ZeRO-2 priced as one 6272-element all-reduce, booked as DeepSpeed's 2000-element buckets
    cut: one line naming both cuts, no extra and missing per size; a cut that loses bytes is
    flagged size by size; sizes booked as predicted stay out of the line."""
    lay = parse_layout(f"impl=deepspeed,zero=2,dp=2,micro-batches=1,{SHAPE_DS}", 2)

    def booked(*sizes):
        return [tuple(Entry("all_reduce", (0, 1), "gloo", "float32", k, 0, 0, 0.0))
                for k in (*sizes, 1)] + [tuple(Entry("all_gather", (0, 1), "gloo", "float32",
                                                     3136, 0, 0, 0.0))]

    got = compare(lay, booked(1024, 1824, 1312, 1824, 288))
    assert got["flags"] == ["same bytes per step, cut differently: all_reduce on dp, 6272 "
                            "elements as 1 x 288 + 1 x 1024 + 1 x 1312 + 2 x 1824 where the "
                            "layout makes 1 x 6272"]
    assert {r["elements"]: r["flag"] for r in got["rows"] if r["op"] == "all_reduce"} == {
        1: "", 288: "cut differently", 1024: "cut differently", 1312: "cut differently",
        1824: "cut differently", 6272: "cut differently"}
    short = compare(lay, booked(1024, 1824, 1312, 1824))["flags"]
    assert len(short) == 4 and all(f.startswith(("extra", "missing")) for f in short)
    assert compare(lay, booked(6272))["flags"] == []


def test_the_same_calls_of_another_size_are_said_with_the_difference():
    """A ZeRO-1 script without megatron-core's padding against the Megatron flavour: one line
    per op saying the calls are the layout's, resized, and why; a count that differs too is
    flagged size by size."""
    lay = parse_layout(f"zero=1,dp=2,micro-batches=1,grad-norm=0,{SHAPE_DS}", 2)

    def call(op, count):
        return tuple(Entry(op, (0, 1), "gloo", "float32", count, 0, 0, 0.0))

    got = compare(lay, [call("reduce_scatter", 6272), call("all_gather", 3136)])
    pad = ("; the layout pads megatron-core's distributed-optimizer buffer: 6272 parameters "
           "become 6656")
    assert got["flags"] == [
        "size: 1 all_gather on dp of 3136 elements where the layout makes 3328 (-192 each)" + pad,
        "size: 1 reduce_scatter on dp of 6272 elements where the layout makes 6656 (-384 each)"
        + pad]
    assert {r["flag"] for r in got["rows"]} == {"resized"}
    twice = compare(lay, [call("reduce_scatter", 6272)] * 2 + [call("all_gather", 3328)])
    assert [f.split(":")[0] for f in twice["flags"]] == ["extra reduce_scatter",
                                                          "missing reduce_scatter"]


def test_the_comparison_s_edges():
    """Settings read as the command line writes them; calls the comparison leaves out (a group
    of one, a barrier) wherever they come; a call in a width of its own (DeepSpeed's float64
    norm of the gradients) and a gradient in another dtype; two wrong dtypes of one call."""
    base = "hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,loss=none,layers=2"
    for raw, sp in (("1", True), ("true", True), ("Yes", True), ("TRUE", True), ("0", False),
                    ("no", False)):
        assert parse_layout(f"tp=2,sp={raw},{base}", 2).sp is sp
    with pytest.raises(ValueError, match="'size=3': no such setting; known: layers, hidden, ffn, "):
        parse_layout("size=3", 2)
    lay = parse_layout(f"impl=deepspeed,zero=3,dp=2,{base},grad-bytes=4", 2)
    assert _predicted(lay)[1] == {("dp", "all_reduce", 1): 8}
    exact = _entries(lay, (0, 1))
    norm = next(e for e in exact if e[4] == 1)
    calls = [e if e is not norm else norm[:3] + ("float64",) + norm[4:] for e in exact]
    one = tuple(Entry("all_reduce", (0,), "gloo", "float32", 8, 0, 0, 0.0))
    barrier = tuple(Entry("barrier", (0, 1), "gloo", "uint8", 0, 0, 0, 0.0))
    assert compare(lay, [one, barrier, *calls, one, barrier])["flags"] == []
    flags = compare(lay, exact)["flags"]  # the norm in float32
    assert flags == ["dtype: all_reduce of 1 elements on dp in float32; the layout makes this "
                     "call in 8 B per element"]
    grad = next(e for e in calls if e[0] == "reduce_scatter")
    twice = [e if e is not grad else grad[:3] + ("bfloat16",) + grad[4:] for e in calls]
    both = compare(lay, [*twice, grad[:3] + ("float16",) + grad[4:]])
    assert both["flags"] == [
        f"extra reduce_scatter: 1 more of {grad[4]} elements on dp than the layout makes (1); "
        f"dtype: reduce_scatter of {grad[4]} elements on dp in bfloat16, float16; the layout's "
        "gradients are 4 B per element (grad_bytes=4)"]
    assert [r["dtype"] for r in both["rows"] if r["op"] == "reduce_scatter"] == ["bfloat16,float16"]
    missing = compare(lay, [e for e in calls if e is not grad])
    (row,) = [r for r in missing["rows"] if r["op"] == "reduce_scatter"]
    assert row == {"axis": "dp", "op": "reduce_scatter", "elements": grad[4], "dtype": "-",
                   "predicted": 1, "observed": 0, "flag": missing["flags"][0]}


def test_three_stages_compare_rank_0_s_stage_not_the_busiest():
    lay = parse_layout("grad-norm=0,pp=3,layers=3,hidden=16,heads=4,seq=8,micro-batch=2,micro-batches=2,"
                       "loss=none,act-bytes=4", 3)
    assert _predicted(lay)[0] == {("pp", "send", 256): 2, ("pp", "recv", 256): 2}
    sends = [_p2p(op, 1, 256, group=(0, 1, 2)) for op in ("isend", "irecv") * 2]
    assert compare(lay, sends)["flags"] == []
