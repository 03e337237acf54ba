"""The audit on two libraries' own implementations, when installed (``pip install
'commbench[libs]'``; skipped otherwise): megatron-core's ColumnParallelLinear and
RowParallelLinear with and without sequence parallelism, and DeepSpeed-Ulysses'
DistributedAttention, each booked call worked out by hand from the library's design.

Each runs as its own ``commbench audit`` (a fresh local world): the libraries are heavy to
import (megatron-core leaves some 390,000 Python objects, which slowed every later test of a
shared world's ranks threefold through the garbage collector). DeepSpeed's CPU-only
shared-memory op is neither built nor used during an audit (commbench.studies.audit): a
DeepSpeed audit here compiles nothing."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections import Counter

import pytest

pytestmark = [pytest.mark.foundation, pytest.mark.local]

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
NEEDS = {"megatron_core_sp.py": ("megatron.core", "megatron-core"),
         "megatron_core_distopt.py": ("megatron.core", "megatron-core"),
         "deepspeed_ulysses.py": ("deepspeed", "deepspeed"),
         "deepspeed_zero.py": ("deepspeed", "deepspeed")}


def _needs(name: str) -> None:
    module, package = NEEDS[name]
    try:
        found = importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:
        found = False
    if not found:
        pytest.skip(f"{name}: needs {package} (pip install 'commbench[libs]')")


def _by_hand(name: str, args: list[str], P: int) -> Counter:
    """(op, elements per call, phase) -> calls on the busiest rank."""
    s, b, h = 8, 2, 16  # the examples' defaults
    if name == "deepspeed_ulysses.py":  # q, k, v and the output; and their gradients
        return Counter({("all_to_all", s // P * b * 4 * 4, "forward"): 4,
                        ("all_to_all", s // P * b * 4 * 4, "backward"): 4})
    if args == ["--no-sp"]:  # Megatron's f and g: one all-reduce each way
        return Counter({("all_reduce", s * b * h, "forward"): 1,
                        ("all_reduce", s * b * h, "backward"): 1})
    # SP: gather before up, scatter after down; backward: the scatter's gather, the input's
    # re-gather for the weight gradient, and the gather's reduce-scatter
    return Counter({("all_gather", s // P * b * h, "forward"): 1,
                    ("reduce_scatter", s * b * h, "forward"): 1,
                    ("all_gather", s // P * b * h, "backward"): 2,
                    ("reduce_scatter", s * b * h, "backward"): 1})


@pytest.mark.parametrize("name, args, P", [("megatron_core_sp.py", [], 2),
                                           ("megatron_core_sp.py", ["--no-sp"], 2),
                                           ("deepspeed_ulysses.py", [], 2)])
def test_a_library_s_own_calls_are_booked(tmp_path, name, args, P):
    _needs(name)
    cmd = [sys.executable, "-m", "commbench", "audit", os.path.join(EXAMPLES, name), "--np",
           str(P), "--out", str(tmp_path), "--label", "t", "--", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "shm_comm" not in out.stdout + out.stderr  # DeepSpeed built and loaded no CPU op
    (path,) = tmp_path.glob("audit_*.json")
    groups = json.loads(path.read_text())["rows"]["groups"]
    want = _by_hand(name, args, P)
    assert {(r["op"], r["phase"]): r["calls"] for r in groups} == \
        {(op, phase): k for (op, _, phase), k in want.items()}
    for r in groups:  # every call of a kind has the same size: elements sum to calls x size
        (size,) = [e for (op, e, phase) in want if (op, phase) == (r["op"], r["phase"])]
        assert r["elements"] == r["calls"] * size and r["ranks"] == P


def test_the_library_examples_exist():
    assert all(os.path.isfile(os.path.join(EXAMPLES, n)) for n in NEEDS)


SHAPE = "layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,loss=none"


def _against(calls: list, spec: str, P: int, step: int = 3) -> list[str]:
    """The flags of rank 0's booked ``calls`` (the audit's JSON) of ``step`` against the layout
    ``spec``: the same run judged by a layout that is wrong for it, without running the script
    again."""
    from commbench.studies.audit import in_steps
    from commbench.studies.audit_layout import compare, parse_layout
    from commbench.wire.ledger import Entry

    mine = in_steps([tuple(e[f] for f in Entry._fields) for e in calls], step, 1)
    return compare(parse_layout(spec, P), mine)["flags"]


@pytest.mark.parametrize("P", [2, 4])
def test_megatron_core_s_distributed_optimizer_makes_the_calls_of_the_megatron_flavour(tmp_path,
                                                                                       P):
    """megatron-core's DistributedDataParallel and DistributedOptimizer over examples/layers.py's
    6272 float32 parameters, step 2: its buffer pads each parameter's start to 64 elements
    (the eight 16-element LayerNorm tensors to 64 each: 6656) and its end to lcm(P, 128), the
    whole buffer is reduce-scattered (backward), the gradients' norm all-reduced over every rank
    and the 6656/P shards all-gathered (both in the optimizer's step): ``impl=megatron,zero=1``
    predicts each call and phase, and the norm is taken whether or not the step clips (a
    layout without it flags the call). The bucket's reduce-scatter carries all 16 modules."""
    from commbench.studies.audit import in_steps
    from commbench.wire.ledger import Entry

    _needs("megatron_core_distopt.py")

    def audit(*args, spec=""):
        cmd = [sys.executable, "-m", "commbench", "audit",
               os.path.join(EXAMPLES, "megatron_core_distopt.py"), "--np", str(P), "--out",
               str(tmp_path), "--label", "t", "--step", "2", "--layout",
               f"zero=1,dp={P},micro-batches=1,act-bytes=4,{SHAPE}{spec}", "--", *args]
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
        assert out.returncode in (0, 1), out.stderr[-2000:]
        (path,) = tmp_path.glob("audit_*.json")
        rec = json.loads(path.read_text())
        path.unlink()
        return out.returncode, rec["layout"], rec["calls"][0]

    code, lay, calls = audit()
    assert code == 0 and lay["flags"] == [], lay["flags"]
    assert {(r["axis"], r["op"], r["elements"], r["observed"]) for r in lay["rows"]} == {
        ("dp", "reduce_scatter", 6656, 1), ("dp", "all_gather", 6656 // P, 1),
        ("world", "all_reduce", 1, 1)}
    entries = [tuple(e[f] for f in Entry._fields) for e in calls]
    step = list(map(Entry._make, in_steps(entries, 2, 1)))
    assert {(e.op, e.phase) for e in step} == {("reduce_scatter", "backward"),
                                               ("all_reduce", "optimizer"),
                                               ("all_gather", "optimizer")}
    # the one bucket carries every module's gradients: its bytes are theirs, in proportion
    rs = next(e for e in step if e.op == "reduce_scatter")
    assert len(rs.carries) == 16 and sum(k for _, k in rs.carries) == 6272
    # each call's line is the script's own, not its CPU stand-in's torch function mode
    with open(os.path.join(EXAMPLES, "megatron_core_distopt.py")) as f:
        source = f.read().splitlines()
    said = {e.op: source[int(e.line.rsplit(":", 1)[1]) - 1].strip() for e in step}
    assert said == {"reduce_scatter": "model.finish_grad_sync()", "all_reduce": "opt.step()",
                    "all_gather": "opt.step()"}
    # megatron-core 0.16's ChainedOptimizer takes the norm even when it clips nothing
    code, lay, _ = audit("--clip-grad", "0")
    assert code == 0 and lay["flags"] == []
    # the same calls against layouts that are wrong for them (no script run again)
    base = f"zero=1,dp={P},micro-batches=1,act-bytes=4,{SHAPE}"
    assert _against(calls, base + ",grad-norm=0", P, step=2) == [
        "extra all_reduce: 1 more of 1 elements on dp than the layout makes (0)"]  # world = dp
    # overlap_grad_reduce with buckets of 2000 elements: the parameters taken last to first,
    # each bucket's end padded to lcm(P, 128); each bucket reduce-scattered, its shard gathered
    buckets = {2: [2048, 2304, 2176, 128], 4: [2048, 2304, 2176, 128]}[P]
    overlap = ",overlap-grad-reduce,bucket-size=2000"
    code, lay, calls = audit("--overlap-grad-reduce", "--bucket-size", "2000", spec=overlap)
    assert code == 0 and lay["flags"] == [], lay["flags"]
    assert sorted(r["elements"] for r in lay["rows"] if r["op"] == "reduce_scatter") == \
        sorted(buckets)
    assert sorted(r["elements"] for r in lay["rows"] if r["op"] == "all_gather") == \
        sorted(b // P for b in buckets)
    assert _against(calls, base, P, step=2)  # one flat buffer: flagged


@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_megatron_core_at_tp_2_x_dp_2_makes_the_calls_of_the_megatron_flavour(tmp_path, sp):
    """megatron-core's column- and row-parallel linears (examples/megatron_core_distopt.py's
    MegatronLayer: q, k, v fused) under its DistributedDataParallel and DistributedOptimizer
    on a (dp 2, tp 2) grid, step 2. A TP rank's 1600 elements a layer (the LayerNorms whole)
    make a 3584-element buffer, reduce-scattered on dp and its 1792-element shard gathered. On
    tp, without SP: the row linears' forward all-reduces and the column linears' backward ones,
    4 each; with SP: 4 all-gathers forward, 8 backward (the re-gather of each column input
    among them, megatron-core's default: ``regather``), 4 reduce-scatters each way, and one
    all-reduce of both layers' LayerNorm gradients (128 elements) in ``finalize_model_grads``.
    ``impl=megatron,zero=1,tp=2`` predicts every call, phase by phase; told no re-gather, the
    layout flags the four gathers it lacks."""
    from commbench.studies.audit import in_steps
    from commbench.wire.ledger import Entry

    _needs("megatron_core_distopt.py")
    spec = f"zero=1,tp=2,dp=2,micro-batches=1,act-bytes=4,{SHAPE}" + (",sp" if sp else "")
    cmd = [sys.executable, "-m", "commbench", "audit",
           os.path.join(EXAMPLES, "megatron_core_distopt.py"), "--np", "4", "--out",
           str(tmp_path), "--label", "t", "--step", "2", "--layout",
           spec + (",regather" if sp else ""), "--", "--tp", "2", *(["--sp"] if sp else [])]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stdout[-2000:] + out.stderr[-2000:]
    (path,) = tmp_path.glob("audit_*.json")
    rec = json.loads(path.read_text())
    assert rec["layout"]["flags"] == []
    step = [Entry._make(t) for t in in_steps(
        [tuple(e[f] for f in Entry._fields) for e in rec["calls"][0]], 2, 1)]
    on = Counter((e.op, tuple(e.group), e.phase) for e in step)
    dp, tp = (0, 2), (0, 1)
    want = {("reduce_scatter", dp, "backward"): 1, ("all_gather", dp, "optimizer"): 1,
            ("all_reduce", (0, 1, 2, 3), "optimizer"): 1}
    if sp:
        want |= {("all_gather", tp, "forward"): 4, ("all_gather", tp, "backward"): 8,
                 ("reduce_scatter", tp, "forward"): 4, ("reduce_scatter", tp, "backward"): 4,
                 ("all_reduce", tp, "backward"): 1}
    else:
        want |= {("all_reduce", tp, "forward"): 4, ("all_reduce", tp, "backward"): 4}
    assert on == want
    rs = next(e for e in step if e.op == "reduce_scatter" and tuple(e.group) == dp)
    assert (rs.count, sum(k for _, k in rs.carries), len(rs.carries)) == (3584, 3200, 12)
    if sp:
        norms = next(e for e in step if e.op == "all_reduce" and tuple(e.group) == tp)
        assert norms.count == 128  # 2 layers x 4h, flattened into one call
        assert _against(rec["calls"][0], spec, 4, step=2) == [
            "extra all_gather: 4 more of 128 elements on tp than the layout makes (8)"]


def _zero(tmp_path, P: int, stage: int, m: int, *args: str, buckets: str = "",
          zero3: dict | None = None, tp: int = 1) -> tuple[int, dict, list]:
    """``commbench audit examples/deepspeed_zero.py`` against ``impl=deepspeed`` in its third
    step (the first two trace ZeRO-3's parameter order): exit code, the comparison and rank 0's
    booked calls. ``buckets``: the job's ds_config has a reduce_bucket_size of 2000 and an
    allgather_bucket_size of 1500 elements (``zero3``: or these ZeRO settings), and the layout
    reads it (``read``) or not (``unread``). The file states the persistence threshold the
    script sets (0) unless ``zero3`` says another. ``tp``: the script's Megatron-style TP
    layers on a (dp, tp) grid, DeepSpeed told it through its ``mpu``."""
    _needs("deepspeed_zero.py")
    spec = f"impl=deepspeed,zero={stage},dp={P // tp},micro-batches={m},{SHAPE}"
    if tp > 1:
        spec += f",tp={tp},act-bytes=4"
        args = (*args, "--tp", str(tp))
    if buckets:
        config = tmp_path / "ds_config.json"
        zero = {"reduce_bucket_size": 2000, "allgather_bucket_size": 1500} if zero3 is None \
            else zero3
        config.write_text(json.dumps({"gradient_accumulation_steps": m, "zero_optimization": {
            "stage": stage, "stage3_param_persistence_threshold": 0, **zero}}))
        args = (*args, "--config", str(config))
        spec += f",ds-config={config}" if buckets == "read" else ""
    cmd = [sys.executable, "-m", "commbench", "audit", os.path.join(EXAMPLES, "deepspeed_zero.py"),
           "--np", str(P), "--out", str(tmp_path), "--label", "t", "--step", "3", "--layout",
           spec, "--", "--stage", str(stage), "--micro-batches", str(m), "--steps", "3", *args]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300,
                         env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert out.returncode in (0, 1), out.stderr[-2000:]
    (path,) = tmp_path.glob("audit_*.json")
    rec = json.loads(path.read_text())
    return out.returncode, rec["layout"], rec["calls"][0]


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_s_own_buckets_from_its_ds_config_are_the_flavour_s_calls(tmp_path, stage):
    """The job's ds_config, read by the layout too (``ds-config=PATH``), with a
    reduce_bucket_size of 2000 elements: DeepSpeed cuts the gradient at parameters, ZeRO-1 in
    registration order (1088, 1024, 1824, 1312, 1024), ZeRO-2 and 3 as the gradients arrive
    (1024, 1824, 1312, 1824, 288); an allgather_bucket_size of 1500 cuts nothing. No
    difference; without the file the layout says the same bytes are cut differently."""
    code, lay, calls = _zero(tmp_path, 2, stage, 1, buckets="read")
    assert code == 0 and lay["flags"] == [], lay["flags"]
    op = "reduce_scatter" if stage == 3 else "all_reduce"
    cut = Counter({1: [1088, 1024, 1824, 1312, 1024]}.get(stage, [1024, 1824, 1312, 1824, 288]))
    assert {r["elements"]: r["observed"] for r in lay["rows"] if r["op"] == op
            and r["elements"] > 1} == cut
    unread = _against(calls, f"impl=deepspeed,zero={stage},dp=2,micro-batches=1,{SHAPE}", 2)
    assert len(unread) == 1 and unread[0].startswith(
        f"same bytes per step, cut differently: {op} on dp, 6272 elements as ")


@pytest.mark.parametrize("zero3, m, gathers", [
    ({"stage3_prefetch_bucket_size": 1100}, 1, {1056: 1, 656: 1, 912: 1, 512: 1}),
    ({"stage3_prefetch_bucket_size": 1000}, 2, {528: 8, 512: 4}),
    ({"stage3_param_persistence_threshold": 100}, 2, {8: 8, 3072: 2})])
def test_deepspeed_s_zero3_prefetch_and_persistence_from_its_ds_config(tmp_path, zero3, m,
                                                                       gathers):
    """ZeRO-3's parameter gathers as the job's ds_config cuts them: module by module up to the
    prefetch bucket (the module about to run, then the next while the fetch holds fewer
    elements than the bucket), once a micro-batch; the LayerNorms' 16-element tensors under a
    persistence threshold of 100 gathered alone, once a step. No difference with the file
    read; without it, the layout's single gather differs."""
    code, lay, calls = _zero(tmp_path, 2, 3, m, buckets="read", zero3=zero3)
    assert code == 0 and lay["flags"] == [], lay["flags"]
    assert {r["elements"]: r["observed"] for r in lay["rows"] if r["op"] == "all_gather"} == \
        gathers
    unread = _against(calls, f"impl=deepspeed,zero=3,dp=2,micro-batches={m},{SHAPE}", 2)
    assert any("all_gather" in f for f in unread), unread


@pytest.mark.parametrize("P", [2, 4])
@pytest.mark.parametrize("stage, m", [(1, 2), (2, 2), (3, 1)])
def test_deepspeed_s_zero_makes_the_calls_of_the_deepspeed_flavour(tmp_path, P, stage, m):
    """DeepSpeed 0.19.8, 6272 float32 parameters over P ranks. ZeRO-1: the gradient all-reduced
    once per step, ZeRO-2 after each of the m micro-batches; then the 6272/P partitions
    all-gathered. ZeRO-3: the 6272/P shards gathered and the gradient reduce-scattered per
    micro-batch. Each: one all-reduce of the gradients' norm (float64 in ZeRO-3)."""
    from commbench.studies.audit import in_steps
    from commbench.wire.ledger import Entry

    code, lay, calls = _zero(tmp_path, P, stage, m)
    assert code == 0 and lay["flags"] == [], lay["flags"]
    want = {1: {("all_reduce", 6272, 1), ("all_gather", 6272 // P, 1), ("all_reduce", 1, 1)},
            2: {("all_reduce", 6272, m), ("all_gather", 6272 // P, 1), ("all_reduce", 1, 1)},
            3: {("all_gather", 6272 // P, m), ("reduce_scatter", 6272, m), ("all_reduce", 1, 1)}}
    assert {(r["op"], r["elements"], r["observed"]) for r in lay["rows"]} == want[stage]
    # the gradient's reduction is backward although ZeRO-1/2 issue it after autograd returns;
    # the norm and the partitions' gather run in the optimizer's step
    phase = {(op, n): "backward" if op != "all_gather" else "optimizer"
             for op, n, _ in want[stage]} | {("all_reduce", 1): "optimizer"}
    if stage == 3:
        phase[("all_gather", 6272 // P)] = "forward"
    entries = [tuple(e[f] for f in Entry._fields) for e in calls]
    mine = in_steps(entries, 3, 1)
    assert {(e.op, e.count, e.phase) for e in map(Entry._make, mine)} == \
        {(op, n, p) for (op, n), p in phase.items()}
    if stage == 3:  # each gather and reduction under the module whose parameters it carries
        root = "DeepSpeedEngine.module"
        assert {(e.op, e.module) for e in map(Entry._make, mine)} == {
            ("all_gather", root), ("reduce_scatter", root), ("all_reduce", root)}
        leaves = {f"{root}.{i}.{n}" for i in range(2)
                  for n in ("ln1", "q", "k", "v", "o", "ln2", "fc1", "fc2")}
        first = Counter((e.module, e.phase) for e in map(Entry._make, in_steps(entries, 1, 1))
                        if e.op == "all_gather")  # step 1: ZeRO-3 fetches module by module
        assert first == Counter({(m, p): 1 for m in leaves for p in ("forward", "backward")})


@pytest.mark.parametrize("stage", [1, 3])
def test_deepspeed_s_zero_at_tp_2_x_dp_2_makes_the_calls_of_the_deepspeed_flavour(tmp_path,
                                                                                    stage):
    """DeepSpeed told a (dp 2, tp 2) grid through its ``mpu``, Megatron's TP in each layer
    (examples/deepspeed_zero.py's TPLayer: f and g, q, k, v fused), step 3. A TP rank's 3200
    elements go through ZeRO on dp as at tp = 1 (ZeRO-1: all-reduced, its 1600-element
    partition gathered; ZeRO-3: its shards gathered, the gradient reduce-scattered); on tp the
    row linears' 4 forward and the column linears' 4 backward all-reduces; and the gradients'
    norm is summed over dp and then over the model-parallel ranks, one element each (float64
    in ZeRO-3), both in the optimizer's step. ``impl=deepspeed,tp=2`` predicts each call;
    without the model-parallel norm, the layout's call is missing."""
    from commbench.studies.audit import in_steps
    from commbench.studies.audit_layout import compare, parse_layout
    from commbench.wire.ledger import Entry

    code, lay, calls = _zero(tmp_path, 4, stage, 1, tp=2)
    assert code == 0 and lay["flags"] == [], lay["flags"]
    dp, tp, width = (0, 2), (0, 1), "float64" if stage == 3 else "float32"
    step = [Entry._make(t) for t in in_steps(
        [tuple(e[f] for f in Entry._fields) for e in calls], 3, 1)]
    want = Counter({("all_reduce", tp, 256, "float32", "forward"): 4,
                    ("all_reduce", tp, 256, "float32", "backward"): 4,
                    ("all_reduce", dp, 1, width, "optimizer"): 1,
                    ("all_reduce", tp, 1, width, "optimizer"): 1})
    want.update({("all_reduce", dp, 3200, "float32", "backward"): 1,
                 ("all_gather", dp, 1600, "float32", "optimizer"): 1} if stage == 1 else
                {("all_gather", dp, 1600, "float32", "forward"): 1,
                 ("reduce_scatter", dp, 3200, "float32", "backward"): 1})
    assert Counter((e.op, tuple(e.group), e.count, e.dtype, e.phase) for e in step) == want
    spec = f"impl=deepspeed,zero={stage},tp=2,dp=2,micro-batches=1,act-bytes=4,{SHAPE}"
    no_norm = [tuple(e) for e in step if not (e.count == 1 and tuple(e.group) == tp)]
    assert compare(parse_layout(spec, 4), no_norm)["flags"] == [
        "missing all_reduce: 1 fewer of 1 elements on mp than the layout makes (1): the "
        "gradients' norm DeepSpeed sums over the model-parallel ranks of the mpu it is given, "
        "every step"]


def test_deepspeed_s_zero_against_megatron_s_flavour_and_a_planted_call(tmp_path):
    """ZeRO-2 is not Megatron's reduce-scatter (of its padded buffer, 6656); an all-reduce the
    script adds is flagged."""
    from commbench.studies.audit import in_steps
    from commbench.studies.audit_layout import compare, parse_layout
    from commbench.wire.ledger import Entry

    code, lay, calls = _zero(tmp_path, 2, 2, 1, "--extra")
    assert code == 1
    assert lay["flags"] == ["extra all_reduce: 1 more of 8 elements on dp than the layout makes (0)"]
    mine = in_steps([tuple(e[f] for f in Entry._fields) for e in calls], 3, 1)
    megatron = compare(parse_layout(f"zero=2,dp=2,micro-batches=1,{SHAPE}", 2), mine)["flags"]
    assert "missing reduce_scatter: 1 fewer of 6656 elements on dp than the layout makes (1)" in \
        megatron and "extra all_reduce: 1 more of 6272 elements on dp than the layout makes (0)" \
        in megatron, megatron


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_deepspeed_s_zero_under_torchrun_makes_the_calls_of_its_flavour(tmp_path, stage):
    """As a user runs it: torchrun's ranks, DeepSpeed reading their variables."""
    _needs("deepspeed_zero.py")
    spec = f"impl=deepspeed,zero={stage},dp=2,micro-batches=1,{SHAPE}"
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--no-python",
           sys.executable, "-m", "commbench", "audit", "--no-write",
           os.path.join(EXAMPLES, "deepspeed_zero.py"), "--step", "3", "--layout", spec, "--",
           "--stage", str(stage), "--steps", "3"]
    out = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path,
                         env={**os.environ, "DS_ACCELERATOR": "cpu"})
    assert out.returncode == 0, out.stderr[-2000:]
    assert "No difference: every call is one the layout makes." in out.stdout, out.stdout[-2000:]
