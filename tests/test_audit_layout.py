"""``commbench audit --layout``: rank 0's booked calls against the calls of the layout, by axis,
op and elements, each difference flagged (an extra all-gather, a call in another width, a group
the layout does not have); Megatron's SP layer written with plain torch.distributed
(examples/megatron_sp.py) makes exactly the layout's calls."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from commbench.costmodel.layout_config import Layout
from commbench.studies.audit import run_script
from commbench.studies.audit_layout import _predicted, compare, layout_groups, parse_layout
from commbench.wire.ledger import Entry

pytestmark = pytest.mark.foundation

EXAMPLE = os.path.join(os.path.dirname(__file__), "..", "examples", "megatron_sp.py")
SPEC = ("tp={P},sp,layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,"
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
    assert layout_groups(Layout(tp=2, dp=2)) == {(0, 1): ("tp",), (2, 3): ("tp",),
                                                 (0, 2): ("dp", "edp"), (1, 3): ("dp", "edp")}
    cp = layout_groups(Layout(tp=2, cp=2, seq=8))  # with dp = 1 the cp ranks reduce gradients too
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
                 act_bytes=4, grad_bytes=4)
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


@pytest.mark.local
def test_audit_layout_exits_1_with_the_differences_and_2_on_a_bad_spec(tmp_path):
    cmd = [sys.executable, "-m", "commbench", "audit", EXAMPLE, "--np", "2", "--out",
           str(tmp_path), "--label", "t", "--layout", SPEC.format(P=2)]
    out = subprocess.run([*cmd, "--", "--extra-gather"], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 1, out.stderr
    assert "#   extra all_gather: 1 more of 128 elements on tp" in out.stdout
    text = (tmp_path / "audit_megatron_sp_t-x2.md").read_text()
    assert "Against the layout" in text and "- extra reduce_scatter" in text
    bad = subprocess.run([*cmd[:-1], "tp=3"], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1
    assert "tp=3" in bad.stderr
