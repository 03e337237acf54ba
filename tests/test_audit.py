"""``commbench audit``: a user's own script run on every rank under the watcher; the calls it
books are the library's own (torch's CommDebugMode counts the same calls), and the DTensor
example's are worked out by hand."""

from __future__ import annotations

import glob
import json
import os
import runpy
import subprocess
import sys
from collections import Counter

import pytest
import torch
from command import commbench
from said import said

from commbench.studies.audit import _process_group_kept, in_steps, run_script, tables
from commbench.wire.ledger import Entry

pytestmark = pytest.mark.foundation

EXAMPLES = os.path.join(os.path.dirname(__file__), "..", "examples")
# torch's names of the same calls, as CommDebugMode counts them
TORCH = {"c10d.scatter_": "scatter", "c10d.broadcast_": "broadcast",
         "c10d_functional.all_gather_into_tensor": "all_gather",
         "c10d_functional.reduce_scatter_tensor": "reduce_scatter",
         "c10d_functional.all_reduce": "all_reduce", "c10d._allgather_base_": "all_gather",
         "c10d._reduce_scatter_base_": "reduce_scatter", "c10d.allreduce_": "all_reduce",
         "c10d.alltoall_base_": "all_to_all"}


def _audit_and_count(ctx, name, args=()):
    from torch.distributed.tensor.debug import CommDebugMode

    path = os.path.join(EXAMPLES, name)
    booked = run_script(ctx, path, list(args))
    saved, sys.argv = sys.argv, [path, *args]  # the script's own argument parser reads it
    try:
        with _process_group_kept(), CommDebugMode() as cdm:
            runpy.run_path(path, run_name="__main__")
    finally:
        sys.argv = saved
    counts = Counter()
    for op, n in cdm.get_comm_counts().items():
        counts[TORCH[str(op)]] += n
    return booked, dict(counts)


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("name", ["dtensor.py", "torch_tp_sp.py", "fsdp2.py", "megatron_sp.py"])
def test_every_example_books_the_calls_the_library_makes(world, name):
    outs = world.run(_audit_and_count, name)
    for booked, counts in outs:
        assert Counter(t[0] for t in booked) == counts, name
    rows = tables([b for b, _ in outs])
    assert sum(r["calls"] for r in rows["groups"]) == sum(outs[0][1].values())


@pytest.mark.world(sizes=[2, 4])
def test_the_dtensor_example_by_hand(world):
    """a [4P, 4] and b [4, 2P] scattered from rank 0; the matmul all-gathers b's row shard
    (4/P x 2P = 8 elements); the logits [4P, 2P] go from rows to columns through an all-gather
    of a row block (4 x 2P); loss_parallel all-reduces 4P values three times: max, sum, sum."""
    P = world.size
    for booked, _ in world.run(_audit_and_count, "dtensor.py"):
        assert [(t[0], t[4], t[11]) for t in booked] == [
            ("scatter", 16 * P, ""), ("scatter", 8 * P, ""), ("all_gather", 8, ""),
            ("all_gather", 8 * P, ""), ("all_reduce", 4 * P, "max"), ("all_reduce", 4 * P, "sum"),
            ("all_reduce", 4 * P, "sum")]


@pytest.mark.local
def test_the_audit_command_prints_and_writes_its_tables(tmp_path):
    out = subprocess.run(commbench("audit", os.path.join(EXAMPLES, "torch_tp_sp.py"), "--np",
                                   "2", "--out", str(tmp_path), "--label", "test-box"),
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "| group" in out.stdout and "reduce_scatter" in out.stdout
    record = json.loads((tmp_path / "audit_torch_tp_sp_test-box-x2.json").read_text())
    phases = {(r["op"], r["phase"]) for r in record["rows"]["groups"]}
    assert {("all_gather", "forward"), ("reduce_scatter", "forward"), ("all_gather", "backward"),
            ("reduce_scatter", "backward")} <= phases  # sequence parallelism, both ways


def test_audit_and_watch_are_the_package_s_own():
    import commbench
    from commbench.studies.audit import audit
    from commbench.wire.watch import watch

    assert commbench.audit is audit and commbench.watch is watch


def test_a_missing_script_is_refused(capsys):
    from commbench.cli.main import main

    assert main(["audit", "no/such/script.py"]) == 2
    assert "no/such/script.py: no such script" in said(capsys)


@pytest.mark.world(sizes=[2, 4])
def test_the_trace_is_chrome_s_format_one_track_per_rank(world):
    """Chrome's trace event format: metadata naming each rank's track, one complete event
    ("ph": "X", ts and dur in microseconds) per booked call, a rank's calls one after another."""
    from commbench.results.trace import chrome_trace

    per_rank = [b for b, _ in world.run(_audit_and_count, "fsdp2.py")]
    trace = json.loads(json.dumps(chrome_trace([("fsdp2", per_rank)])))
    events = trace["traceEvents"]
    names = [e for e in events if e["ph"] == "M"]
    assert [(e["name"], e["pid"], e["args"]["name"]) for e in names] == \
        [("process_name", r, f"rank {r}") for r in range(world.size)]
    calls = [e for e in events if e["ph"] == "X"]
    assert len(calls) == sum(len(b) for b in per_rank)
    assert min(e["ts"] for e in calls) == 0.0
    for r in range(world.size):
        mine = sorted((e for e in calls if e["pid"] == r), key=lambda e: e["ts"])
        assert [e["name"] for e in mine] == [t[0] for t in per_rank[r]]
        assert all(isinstance(e["ts"], float) and e["dur"] >= 0 and e["tid"] == 0 for e in mine)
        assert all(a["ts"] + a["dur"] <= b["ts"] + 1e-3 for a, b in zip(mine, mine[1:]))
        assert {e["args"]["phase"] for e in mine} == {"forward", "backward"}


def test_device_time_comes_from_each_call_s_work_and_shows_as_a_column():
    """On a GPU, NCCL's own events give each c10d call's device time (tests/test_gpu.py runs it
    for real); here, works that report a duration and one that cannot (no timing enabled)."""
    from commbench.studies.audit import audit_markdown
    from commbench.wire.ledger import Entry, Ledger
    from commbench.wire.watch import _work_of, watch

    class Work:
        def __init__(self, ms):
            self.ms = ms

        def _get_duration(self):
            if self.ms is None:
                raise RuntimeError("Work timing is not enabled")
            return self.ms

    ledger = Ledger()
    w = watch(ledger)
    a = ledger.record("all_reduce", (0, 1), "nccl", "float32", 8, 16, 16, 1e-3, source="torch")
    b = ledger.record("all_gather", (0, 1), "nccl", "float32", 8, 32, 32, 1e-3, source="torch")
    w.works += [(a, Work(2.5)), (b, Work(None))]
    assert w.device_times() == {id(a): 0.0025}
    assert _work_of((torch.zeros(1), "not a work")) is None and _work_of(torch.zeros(1)) is None
    timed = [tuple(a._replace(device_seconds=0.0025)), tuple(b)]
    rows = tables([timed])
    assert {r["op"]: r["device_seconds"] for r in rows["groups"]} == {"all_reduce": 0.0025,
                                                                      "all_gather": 0.0}
    record = {"suite": "audit", "hardware": "h", "world_size": 2, "launch": "x", "host": "h",
              "created": "", "commit": "", "versions": {"python": "", "torch": "",
                                                         "commbench": ""},
              "measurement": {}, "rows": rows}
    assert "device time(us)" in audit_markdown(record)
    plain = dict(record, rows=tables([[tuple(Entry(*t)._replace(device_seconds=0.0))
                                       for t in timed]]))
    assert "device time(us)" not in audit_markdown(plain)


def test_a_long_audit_says_it_is_still_running_and_stops_saying_it_when_done(capsys):
    import time

    from commbench.cli import audit as audit_cli

    with audit_cli._still_running("train.py", True, first_s=0.01, every_s=0.01) as note:
        deadline = time.monotonic() + 60
        while not note.done.is_set() and time.monotonic() < deadline:
            if "still running" in capsys.readouterr().err:
                break
            time.sleep(0.01)
        else:
            raise AssertionError("no line while the script ran")
    assert not note.thread.is_alive()
    capsys.readouterr()
    time.sleep(0.05)
    assert capsys.readouterr().err == ""  # quiet once the script is done
    with audit_cli._still_running("train.py", False, first_s=0.0) as quiet:
        pass
    assert quiet.thread.ident is None  # not the printing rank: never started


def test_the_audit_tables_by_hand_busiest_rank_per_field_and_the_layout_section():
    """Two ranks. Rank 0: two forward all-reduces of 8 floats in module "a" (0.1 ms each) and
    a backward one in no module; rank 1: one forward all-reduce of 8 (0.5 ms) in "a" and one
    all-gather. Per (group, op, dtype, redop, phase) each field is the busiest rank's: calls 2,
    elements 16, sent 64 B, time the larger sum (0.5 ms against 0.2); ranks that made any.
    Per module: the busiest rank's calls and bytes."""
    from commbench.studies.audit import audit_markdown
    from commbench.wire.ledger import Entry

    def e(op, phase, module, seconds, count=8, group=(0, 1)):
        return tuple(Entry(op, group, "gloo", "float32", count, 4 * count, 4 * count, seconds,
                           source="torch", redop="sum" if op == "all_reduce" else "",
                           phase=phase, module=module, nbytes=4 * count))

    rank0 = [e("all_reduce", "forward", "a", 1e-4), e("all_reduce", "forward", "a", 1e-4),
             e("all_reduce", "backward", "", 2e-4)]
    rank1 = [e("all_reduce", "forward", "a", 5e-4), e("all_gather", "forward", "b", 1e-4, 4)]
    rows = tables([rank0, rank1])
    by = {(r["op"], r["phase"]): r for r in rows["groups"]}
    fwd = by[("all_reduce", "forward")]
    assert (fwd["calls"], fwd["elements"], fwd["sent"], fwd["tensor_bytes"], fwd["ranks"]) == \
        (2, 16, 64, 64, 2)
    assert fwd["seconds"] == pytest.approx(5e-4) and fwd["redop"] == "sum"
    assert (by[("all_reduce", "backward")]["ranks"], by[("all_gather", "forward")]["redop"]) == \
        (1, "-")
    assert rows["modules"] == [{"module": "(no module)", "calls": 1, "sent": 32},
                               {"module": "a", "calls": 2, "sent": 64},
                               {"module": "b", "calls": 1, "sent": 16}]
    record = {"suite": "audit", "hardware": "h", "world_size": 2, "launch": "x", "host": "h",
              "created": "", "commit": "", "versions": {"python": ""}, "measurement": {},
              "rows": rows}
    text = audit_markdown(record)
    assert "Against the layout" not in text and "| (no module) |" in text
    lay = {"spec": "tp=2", "rows": [{"axis": "tp", "op": "all_reduce", "elements": 8,
                                     "dtype": "float32", "predicted": 2, "observed": 3,
                                     "flag": "extra all_reduce"}], "flags": ["extra all_reduce"]}
    assert "- extra all_reduce" in audit_markdown(dict(record, layout=lay))
    calm = dict(lay, flags=[], rows=[dict(lay["rows"][0], observed=2, flag="")])
    assert "No difference: every call is one the layout makes." in \
        audit_markdown(dict(record, layout=calm))


TORCHRUN_SCRIPT = """
import os
import torch
import torch.distributed as dist

dist.init_process_group("gloo")  # the audit's world is up already: skipped
rank, size = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
assert (rank, size) == (dist.get_rank(), dist.get_world_size()), (rank, size)
assert os.environ["LOCAL_RANK"] == str(rank) and os.environ["LOCAL_WORLD_SIZE"] == str(size)
assert os.environ["MASTER_ADDR"] and int(os.environ["MASTER_PORT"]) > 0
dist.all_reduce(torch.ones(size))
"""


def _script_with_torchrun_env(ctx, path):
    import os

    entries = run_script(ctx, path, [])
    return [(e[0], e[4]) for e in entries], "RANK" in os.environ


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.local  # under a launcher the launcher's own variables are the ones seen
def test_a_local_rank_looks_to_the_script_like_a_rank_of_torchrun(world, tmp_path):
    """RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR/PORT set while the script
    runs (DeepSpeed's initialize reads LOCAL_RANK), and gone again after it."""
    path = tmp_path / "reads_env.py"
    path.write_text(TORCHRUN_SCRIPT)
    for entries, left in world.run(_script_with_torchrun_env, str(path)):
        assert entries == [("all_reduce", world.size)] and not left


RAISES_AT_RANK_1 = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 1:
    raise ValueError("planted at rank 1")
dist.all_reduce(torch.ones(4))  # rank 0 waits here for rank 1, which never comes
"""


def _launchers():
    from commbench.world.local.spawn import find_mpiexec, mpi_usable

    out = [pytest.param([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                         "--no-python"], id="torchrun")]
    if mpi_usable():
        out.append(pytest.param([find_mpiexec(), "-n", "2"], id="mpiexec"))
    return out


@pytest.mark.launcher
@pytest.mark.local
@pytest.mark.parametrize("launcher", _launchers())
def test_a_rank_whose_script_raises_under_a_launcher_is_named_with_its_error(launcher, tmp_path):
    """Rank 1 raises before the all-reduce rank 0 waits in: the audit ends (exit 3 under
    mpiexec; torchrun reports its worker's failure as 1) with one line naming rank 1 and the
    error's last line, the traceback in the log, and not by the watchdog's timeout."""
    script = tmp_path / "raises.py"
    script.write_text(RAISES_AT_RANK_1)
    segments = set(glob.glob("/dev/shm/mpich_shm_*"))
    out = subprocess.run([*launcher, sys.executable, "-m", "commbench", "audit", str(script),
                          "--no-write", "--timeout", "600"], capture_output=True, text=True,
                         timeout=300, cwd=tmp_path)
    # no MPI_Finalize on the way out: the ranks' supervisors remove MPICH's segment
    assert not set(glob.glob("/dev/shm/mpich_shm_*")) - segments
    assert out.returncode == (1 if "torch.distributed.run" in launcher else 3), out.stderr[-2000:]
    ours = [line for line in out.stderr.splitlines() if " stopped: " in line]
    assert ours == ["[rank 1] commbench: script_rank stopped: rank 1 of 2 raised ValueError: "
                    "planted at rank 1 (its traceback is in the log)"], out.stderr[-2000:]
    assert 'raise ValueError("planted at rank 1")' in out.stderr  # the traceback
    assert "timed out" not in out.stderr


def _pipelined(ctx, schedule):
    booked = run_script(ctx, os.path.join(EXAMPLES, "torch_pipelining.py"),
                        ["--schedule", schedule])
    return Counter((t[0], t[12]) for t in booked if t[3] == "float32")


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved"])
def test_torch_pipelining_s_sends_carry_the_phase_the_schedule_gives_them(world, schedule):
    """4 micro-batches through one stage per rank (interleaved: two, stages r and r + P of 2P):
    each stage but the last sends its activations forward and receives their gradients
    (backward), each but the first receives activations and sends gradients back. The gradient
    batches run outside the autograd engine; torch labels them ``bwd_send`` / ``bwd_recv``, and
    its multi-stage schedules' actions ``SEND_B`` / ``RECV_B``: the watcher reads either."""
    P = world.size
    stages = 2 * P if schedule == "interleaved" else P
    for rank, got in enumerate(world.run(_pipelined, schedule)):
        want = Counter()
        for s in range(rank, stages, P):  # this rank's stages
            if s < stages - 1:
                want.update({("send", "forward"): 4, ("recv", "backward"): 4})
            if s > 0:
                want.update({("recv", "forward"): 4, ("send", "backward"): 4})
        assert got == want, (rank, got)


def _ddp(ctx):
    booked = run_script(ctx, os.path.join(EXAMPLES, "ddp.py"), [])
    return Counter((t[0], t[4], t[12]) for t in booked if t[3] == "float32")


@pytest.mark.world(sizes=[2, 4])
def test_ddp_s_example_by_hand(world):
    """Four 16 x 16 float32 weights, 1024 elements: broadcast once from rank 0 when DDP is
    built (its set-up); then per iteration one all-reduce of all of them (under the 4.2 kB
    cap), in backward. torch 2.13's CommDebugMode cannot count it to compare (its module hook
    raises IndexError in DDP's forward), so the count is by hand."""
    for got in world.run(_ddp):
        assert got == Counter({("broadcast", 1024, "setup"): 1,
                               ("all_reduce", 1024, "backward"): 2})


STEPPED = """
import os
import runpy
import sys

import torch
import torch.distributed as dist

import commbench

dist.init_process_group("gloo")
dist.broadcast(torch.zeros(3), src=0)  # set-up: not a step
example = os.path.join(sys.argv.pop(1), "megatron_sp.py")
for _ in range(2):
    with commbench.audit.step():
        runpy.run_path(example, run_name="__main__")
"""
SP_LAYOUT = ("grad-norm=0,tp=2,sp,bias,layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,"
             "loss=none,act-bytes=4,grad-bytes=4")


def _stepped(ctx, path, examples):
    return run_script(ctx, path, [examples])


@pytest.mark.world(sizes=[2])
@pytest.mark.local  # the script is written on the driver's disk, the command run here
def test_the_step_a_script_marks_is_compared_apart_from_its_set_up(world, tmp_path):
    """A set-up broadcast, then Megatron's SP layer twice, each a marked step: ``--step 2``
    compares one step and finds the layout's calls (the command, end to end); the whole script
    has the set-up call and twice the layout's; two steps together are the layout's twice;
    steps the script never marked are refused naming those it did."""
    from commbench.studies.audit import in_steps
    from commbench.studies.audit_layout import compare, parse_layout

    script = tmp_path / "stepped.py"
    script.write_text(STEPPED)

    def audit(*flags):
        return subprocess.run(commbench("audit", str(script), "--np", "2", "--no-write",
                                        "--layout", SP_LAYOUT, *flags, "--",
                                        os.path.abspath(EXAMPLES)),
                              capture_output=True, text=True, timeout=300, cwd=tmp_path)

    one = audit("--step", "2")
    assert one.returncode == 0, one.stdout[-1500:] + one.stderr[-1500:]
    assert "rank 0's calls in steps 2..2 the script marked" in one.stdout
    assert "| set-up |" in one.stdout and "No difference" in one.stdout
    # steps it never marked, as many as a typo gives (listed one by one, they ran out of memory)
    missing = audit("--step", "2", "--steps", "99999999999")
    assert missing.returncode == 2 and "the script marked steps [1, 2]" in missing.stderr, \
        missing.stderr
    entries = world.run(_stepped, str(script), os.path.abspath(EXAMPLES))[0]
    lay = parse_layout(SP_LAYOUT, 2)
    assert compare(lay, in_steps(entries, 1, 2), steps=2)["flags"] == []
    whole = compare(lay, entries)["flags"]
    assert "extra broadcast: 1 more of 3 elements on tp than the layout makes (0)" in whole


def _p2p_peers(ctx):
    import torch.distributed as dist

    booked = run_script(ctx, os.path.join(EXAMPLES, "torch_pipelining.py"), [])
    out = Counter((t[0], t[17]) for t in booked if t[3] == "float32")
    return dist.get_rank(), out


@pytest.mark.world(sizes=[4])
def test_a_point_to_point_call_names_its_peer(world):
    """Stage r of 4 sends its activations to r+1 and its gradients to r-1, receives from
    the same neighbours; the tables name the peer beside the group."""
    from commbench.studies.audit import _group_cell

    for rank, got in world.run(_p2p_peers):
        want = Counter()
        if rank < 3:
            want.update({("send", rank + 1): 4, ("recv", rank + 1): 4})
        if rank > 0:
            want.update({("recv", rank - 1): 4, ("send", rank - 1): 4})
        assert got == want, rank
    row = {"group": [0, 1, 2, 3], "op": "send", "peer": 2}
    assert _group_cell(row) == "[0, 1, 2, 3] to 2"
    assert _group_cell(dict(row, op="recv")) == "[0, 1, 2, 3] from 2"
    assert _group_cell(dict(row, op="all_reduce", peer=-1)) == "[0, 1, 2, 3]"


OBJECTS = """
import torch
import torch.distributed as dist

dist.init_process_group("gloo")
out = [None] * dist.get_world_size()
dist.all_gather_object(out, {"rank": dist.get_rank()})
objs = [[1, 2, 3]]
dist.broadcast_object_list(objs, src=0)
a, b = dist.new_group([0, 1]), dist.new_group([0, 1])
dist.all_reduce(torch.ones(8), group=a)
dist.all_reduce(torch.ones(8), group=a)
dist.all_reduce(torch.ones(8), group=b)
dist.all_reduce(torch.ones(4))
r = dist.get_rank()
dist.scatter(torch.zeros(4), [torch.ones(4)] * dist.get_world_size() if r == 0 else None, src=0)
"""


def _objects(ctx, path):
    return run_script(ctx, path, [])


@pytest.mark.world(sizes=[2])
@pytest.mark.local  # the script is written on the driver's disk
def test_object_collectives_and_groups_of_the_same_ranks_have_rows_of_their_own(world, tmp_path):
    """all_gather_object and broadcast_object_list are each a size and a payload call, shown as
    parts of the object call; two groups of ranks [0, 1] made apart are two rows, named by
    their own process groups, and only those ranks' rows say a group name. A plain all-reduce
    is no object call's part. A non-root rank's scatter passed its own block only."""
    from commbench.studies.audit import _group_cell, _op_cell

    path = tmp_path / "objects.py"
    path.write_text(OBJECTS)
    per_rank = world.run(_objects, str(path))
    rows = [r for r in tables(per_rank)["groups"] if r["op"] != "scatter"]
    got = {(r["op"], r["api"], r["dtype"], r["pg"], r["calls"]) for r in rows}
    # a scatter's tensor bytes: the root's list of blocks, each other rank its own block
    assert [[Entry._make(t).nbytes for t in es if t[0] == "scatter"] for es in per_rank] == \
        [[32], [16]]
    default = next(r["pg"] for r in rows if r["op"] == "all_reduce" and r["elements"] == 4)
    assert default and {(op, api, dtype) for op, api, dtype, *_ in got} == {
        ("all_gather", "all_gather_object", "int64"), ("all_gather", "all_gather_object", "uint8"),
        ("broadcast", "broadcast_object_list", "int64"),
        ("broadcast", "broadcast_object_list", "uint8"), ("all_reduce", "", "float32")}
    reduces = sorted((r["pg"], r["calls"]) for r in rows if r["op"] == "all_reduce")
    assert len(reduces) == 3 and len({pg for pg, _ in reduces}) == 3
    assert sorted(k for _, k in reduces) == [1, 1, 2]
    cells = {(_group_cell(r), _op_cell(r)) for r in rows}
    assert (f"[0, 1] pg {default}", "all_gather (all_gather_object)") in cells


PROFILED = """
import torch
import torch.distributed as dist
from torch.profiler import ProfilerActivity, profile

dist.init_process_group("gloo")
dist.broadcast(torch.zeros(2), src=0)  # before the profiler: set-up
with profile(activities=[ProfilerActivity.CPU]) as prof:
    for k in range(3):
        dist.all_reduce(torch.ones(k + 1))
        prof.step()
"""


def _profiled(ctx, path):
    from commbench.wire.steps import step_of

    return [(t[0], t[4], step_of(t[8])) for t in run_script(ctx, path, [])]


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.local  # the script is written on the driver's disk
def test_the_profiler_s_steps_mark_the_steps_of_a_script_that_marks_none(world, tmp_path):
    """ProfilerStep#0 opens with the profiler, each prof.step() the next: the all-reduce of
    k + 1 elements is step k + 1; the broadcast before the profiler is set-up (0)."""
    path = tmp_path / "profiled.py"
    path.write_text(PROFILED)
    for got in world.run(_profiled, str(path)):
        assert got == [("broadcast", 2, 0), ("all_reduce", 1, 1), ("all_reduce", 2, 2),
                       ("all_reduce", 3, 3)]


def _fsdp2(ctx, flags):
    booked = run_script(ctx, os.path.join(EXAMPLES, "fsdp2.py"), flags)
    calls = Counter((t[0], t[4], t[12]) for t in booked if t[3] == "float32")
    return calls, {(t[4], t[13]) for t in booked if t[3] == "float32"}


@pytest.mark.world(sizes=[2, 4])
@pytest.mark.parametrize("reshard", [True, False])
def test_fsdp2_with_and_without_resharding_by_hand(world, reshard):
    """Two Linear layers of 8 x 16 + 16 = 144 and 16 x 8 + 8 = 136 parameters, each its own
    FSDP2 unit over P ranks: forward all-gathers each rank's 144/P and 136/P; backward gathers
    them again unless ``reshard_after_forward=False`` kept them; each gradient is
    reduce-scattered (the whole 144 and 136 in, averaged). Every call is under the layer whose
    parameters it carries, the backward gathers prefetched for the next layer and the final
    reduce-scatters included."""
    P = world.size
    want = Counter({("all_gather", 144 // P, "forward"): 1, ("all_gather", 136 // P, "forward"): 1,
                    ("reduce_scatter", 144, "backward"): 1, ("reduce_scatter", 136, "backward"): 1})
    if reshard:
        want.update({("all_gather", 144 // P, "backward"): 1, ("all_gather", 136 // P, "backward"): 1})
    for got, modules in world.run(_fsdp2, [] if reshard else ["--no-reshard"]):
        assert got == want
        assert modules == {(144 // P, "FSDPSequential.0"), (144, "FSDPSequential.0"),
                           (136 // P, "FSDPSequential.2"), (136, "FSDPSequential.2")}


FSDP2_LAYOUT = ("layers=2,hidden=16,heads=4,ffn=64,seq=8,micro-batch=2,micro-batches=1,"
                "loss=none,act-bytes=4,grad-bytes=4")


def _fsdp2_layers(ctx, args):
    return run_script(ctx, os.path.join(EXAMPLES, "fsdp2_layers.py"), args)


@pytest.mark.world(sizes=[2, 4])
def test_fsdp2_makes_the_calls_of_the_layout_s_fsdp2_flavour(world):
    """Per layer of 3136 parameters (2 x 16^2 attention, 2 x 16 x 16 for k and v, 4 x 16 for
    the LayerNorms, 2 x 16 x 64 for the MLP), sharded over P: an all-gather of 3136/P forward
    and again backward, a reduce-scatter of 3136. ``impl=fsdp2`` predicts exactly that;
    Megatron's flavour (one all-reduce of the gradients) does not, and a planted all-reduce is
    flagged."""
    from commbench.studies.audit_layout import compare, parse_layout

    P = world.size

    def flags(spec, *args):
        lay = parse_layout(f"{spec},dp={P},{FSDP2_LAYOUT}", P)
        return compare(lay, world.run(_fsdp2_layers, list(args))[0])

    ok = flags("impl=fsdp2")
    assert ok["flags"] == []
    assert {(r["op"], r["elements"], r["observed"]) for r in ok["rows"]} == {
        ("all_gather", 3136 // P, 4), ("reduce_scatter", 3136, 2)}
    assert any(f.startswith("missing all_reduce") for f in flags("impl=megatron")["flags"])
    assert flags("impl=fsdp2", "--extra")["flags"] == [
        "extra all_reduce: 1 more of 8 elements on dp than the layout makes (0)"]
    # reshard_after_forward=False: the layers stay gathered, backward gathers nothing
    kept = flags("impl=fsdp2,no-reshard", "--no-reshard")
    assert kept["flags"] == []
    assert {(r["op"], r["elements"], r["observed"]) for r in kept["rows"]} == {
        ("all_gather", 3136 // P, 2), ("reduce_scatter", 3136, 2)}
    assert flags("impl=fsdp2", "--no-reshard")["flags"] == [
        f"missing all_gather: 2 fewer of {3136 // P} elements on dp than the layout makes (4)"]


@pytest.mark.world(sizes=[4])
def test_fsdp2_on_a_two_d_mesh_makes_the_calls_of_hybrid_sharding(world):
    """torch's own fully_shard on a (replicate 2, shard 2) device mesh: per layer the shard
    group gathers 3136/2 twice and reduce-scatters 3136, and the replicate group all-reduces the
    1568-element gradient shard: ``impl=fsdp2,dp-shard=2,dp-replicate=2`` predicts exactly that;
    the same script priced as plain FSDP2 over 4 ranks is flagged."""
    from commbench.studies.audit_layout import compare, parse_layout

    booked = world.run(_fsdp2_layers, ["--dp-replicate", "2"])[0]
    lay = parse_layout(f"impl=fsdp2,dp-shard=2,dp-replicate=2,{FSDP2_LAYOUT}", 4)
    ok = compare(lay, booked)
    assert ok["flags"] == []
    assert {(r["axis"], r["op"], r["elements"], r["observed"]) for r in ok["rows"]} == {
        ("dp_shard", "all_gather", 1568, 4), ("dp_shard", "reduce_scatter", 3136, 2),
        ("dp_replicate", "all_reduce", 1568, 2)}
    flat = compare(parse_layout(f"impl=fsdp2,dp=4,{FSDP2_LAYOUT}", 4), booked)["flags"]
    assert any("unexpected group" in f for f in flat), flat


def _fsdp2_step_2(ctx, args):
    booked = run_script(ctx, os.path.join(EXAMPLES, "fsdp2_layers.py"), ["--steps", "2", *args])
    return in_steps(booked, 2, 1)


@pytest.mark.world(sizes=[2])
def test_fsdp2_accumulating_reduce_scatters_once_per_step(world):
    """Three micro-batches with set_requires_gradient_sync(False) on the first two: each layer
    gathers per micro-batch (forward and backward: 12) and reduce-scatters once (2);
    ``no-sync`` says so, and the plain flavour misses four reduce-scatters."""
    from commbench.studies.audit_layout import compare, parse_layout

    booked = world.run(_fsdp2_step_2, ["--micro-batches", "3", "--no-sync"])[0]
    spec = f"impl=fsdp2,dp=2,{FSDP2_LAYOUT}".replace("micro-batches=1", "micro-batches=3")
    ok = compare(parse_layout(spec + ",no-sync", 2), booked)
    assert ok["flags"] == []
    assert {(r["op"], r["elements"], r["observed"]) for r in ok["rows"]} == {
        ("all_gather", 1568, 12), ("reduce_scatter", 3136, 2)}
    assert compare(parse_layout(spec, 2), booked)["flags"] == [
        "missing reduce_scatter: 4 fewer of 3136 elements on dp than the layout makes (6)"]


@pytest.mark.world(sizes=[2])
def test_fsdp2_s_mixed_precision_gathers_in_param_dtype_and_reduces_in_reduce_dtype(world):
    """MixedPrecisionPolicy(param_dtype=bf16, reduce_dtype=fp32) on fp32 parameters: the
    gathers are bfloat16, the reduce-scatters float32; ``param-bytes=2`` says so and nothing is
    flagged. Without it the gathers are flagged as parameters (not gradients) and the setting
    to give is named; the policy priced but not used is flagged the other way."""
    from commbench.studies.audit_layout import compare, parse_layout

    spec = f"impl=fsdp2,dp=2,{FSDP2_LAYOUT}"
    policy = ["--param-dtype", "bfloat16", "--reduce-dtype", "float32"]
    mixed, plain = world.run(_fsdp2_layers, policy)[0], world.run(_fsdp2_layers, [])[0]
    ok = compare(parse_layout(spec + ",param-bytes=2", 2), mixed)
    assert ok["flags"] == []
    assert {(r["op"], r["elements"], r["dtype"]) for r in ok["rows"]} == {
        ("all_gather", 1568, "bfloat16"), ("reduce_scatter", 3136, "float32")}
    assert compare(parse_layout(spec, 2), mixed)["flags"] == [
        "dtype: all_gather of 1568 elements on dp in bfloat16; the layout's gathered parameters "
        "are 4 B per element (grad_bytes=4)"]
    assert compare(parse_layout(spec + ",param-bytes=2", 2), plain)["flags"] == [
        "dtype: all_gather of 1568 elements on dp in float32; the layout's gathered parameters "
        "are 2 B per element (param_bytes=2)"]


def _fsdp2_tp_step_2(ctx, args):
    booked = run_script(ctx, os.path.join(EXAMPLES, "fsdp2_layers.py"),
                        ["--tp", "2", "--steps", "2", "--micro-batches", "2", *args])
    return in_steps(booked, 2, 1)


@pytest.mark.world(sizes=[4])
@pytest.mark.parametrize("sp", [False, True], ids=["tp", "sp"])
def test_fsdp2_with_torch_tp_on_a_dp_x_tp_mesh_makes_the_calls_of_its_flavour(world, sp):
    """torch's TP (and SP) inside each layer, FSDP2 over the (dp 2, tp 2) mesh's dp dim, two
    micro-batches of step 2. Per layer a TP rank holds 3072/2 matrix elements and the 64
    LayerNorm elements whole: FSDP2 gathers 1600/2 = 800 (forward and backward) and
    reduce-scatters 1600. On tp, torch's modules each convert their own activations: q, k and
    v apart make three calls where Megatron's fused linear makes one; under SP each LayerNorm
    tensor's gradient is all-reduced alone, every backward. ``impl=fsdp2`` predicts every call;
    the Megatron flavour, which fuses q/k/v and sums the LayerNorms once per step, is flagged.
    (Split over tp, as the layout once counted them, the LayerNorms would give 784.)"""
    from commbench.studies.audit_layout import compare, parse_layout

    spec = "impl=fsdp2,tp=2,dp=2,micro-batches=2," + FSDP2_LAYOUT.replace(
        "micro-batches=1,", "") + (",sp" if sp else "")
    booked = world.run(_fsdp2_tp_step_2, ["--sp"] if sp else [])[0]
    ok = compare(parse_layout(spec, 4), booked)
    assert ok["flags"] == []
    A = 2 * 8 * 16  # the micro-batch's activations [b, s, h]
    tp = ({("tp", "all_gather", A // 2, 24), ("tp", "reduce_scatter", A, 24),
           ("tp", "all_reduce", 16, 16)} if sp else {("tp", "all_reduce", A, 24)})
    assert {(r["axis"], r["op"], r["elements"], r["observed"]) for r in ok["rows"]} == {
        ("dp", "all_gather", 800, 8), ("dp", "reduce_scatter", 1600, 4)} | tp
    # the phase of every call of the step, by op and group ([0, 2] dp, [0, 1] tp)
    on = Counter((t[0], tuple(t[1]), Entry._make(t).phase) for t in booked)
    assert sum(on.values()) == len(booked)
    assert on[("all_gather", (0, 2), "forward")] == on[("all_gather", (0, 2), "backward")] == 4
    assert on[("reduce_scatter", (0, 2), "backward")] == 4
    if sp:  # forward: q, k, v, fc1 gather, o, fc2 scatter; backward the other way round
        assert (on[("all_gather", (0, 1), "forward")], on[("all_gather", (0, 1), "backward")],
                on[("reduce_scatter", (0, 1), "forward")],
                on[("reduce_scatter", (0, 1), "backward")],
                on[("all_reduce", (0, 1), "backward")]) == (16, 8, 8, 16, 16)
    else:  # forward: o and fc2's outputs; backward: q, k, v and fc1's inputs' gradients
        assert (on[("all_reduce", (0, 1), "forward")],
                on[("all_reduce", (0, 1), "backward")]) == (8, 16)
    megatron = compare(parse_layout(spec.replace("impl=fsdp2", "impl=megatron,zero=3"), 4),
                       booked)["flags"]
    assert any(f.startswith("extra all_") and "on tp" in f for f in megatron), megatron


SAYS_HELLO = """
import sys
import torch
import torch.distributed as dist

if sys.argv[1:] == ["init"]:
    dist.init_process_group("gloo")
print(f"rank {dist.get_rank()} says hello")
print("and warns", file=sys.stderr)
dist.all_reduce(torch.ones(4))
"""


@pytest.mark.local
def test_a_script_that_never_initialises_is_told_so_and_its_output_is_shown(tmp_path, capsys):
    """Under torchrun a script without init_process_group fails at its first collective: the
    audit says so (exit 1) rather than passing with the calls booked. What the script printed
    is shown, rank 0's unless --output names others."""
    from commbench.cli.main import main

    script = tmp_path / "hello.py"
    script.write_text(SAYS_HELLO)
    assert main(["audit", str(script), "--np", "2", "--no-write", "--timeout", "120"]) == 1
    out, err = capsys.readouterr()
    assert "# rank 0's output:\nrank 0 says hello\nand warns\n# (end of rank 0's output)" in out
    assert "rank 1 says hello" not in out and "| all_reduce" in out
    assert "never calls torch.distributed.init_process_group (itself or through a library) " \
           "on ranks [0, 1]" in err
    assert main(["audit", str(script), "--np", "2", "--no-write", "--timeout", "120", "--output",
                 "1", "--", "init"]) == 0
    out, err = capsys.readouterr()
    assert "rank 1 says hello" in out and "rank 0 says hello" not in out
    assert "init_process_group" not in err


def test_output_naming_a_rank_outside_the_world_is_refused_before_any_rank_starts(capsys):
    from commbench.cli.main import main

    script = os.path.join(EXAMPLES, "ddp.py")
    assert main(["audit", script, "--np", "2", "--output", "0,5", "--no-write"]) == 2
    assert "--output 0,5: rank 5 is not in the world of 2 (0..1)" in said(capsys)
    assert main(["audit", script, "--np", "2", "--output", "first", "--no-write"]) == 2
    assert "--output first: must be 0, a list of ranks (0,3), all or none" in said(capsys)


def _status_after(ctx, path):
    from commbench.runtime.status import MemorySink, Tracker

    saved, ctx.tracker = ctx.tracker, Tracker(MemorySink())
    try:
        run_script(ctx, path, ["init"])
        return ctx.tracker.sink.text
    finally:
        ctx.tracker = saved


@pytest.mark.world(sizes=[2])
def test_a_rank_s_status_names_the_script_s_call_and_its_line(world, tmp_path):
    """What a hang report shows of a rank blocked in (or after) a script's collective: the
    call, its line in the script and its group, not "no call yet"."""
    script = tmp_path / "hello.py"
    script.write_text(SAYS_HELLO)
    for text in world.run(_status_after, str(script)):
        assert text == "running hello.py, after all_reduce at hello.py:10 (call #1) on group " \
                       "[0, 1]", text


def _script_s_view(ctx):
    import torch.distributed as dist
    import torch.distributed.device_mesh as device_mesh

    asked: dict = {}
    seen = []
    with _process_group_kept(asked):
        seen.append((dist.is_initialized(), device_mesh.is_initialized(), dict(asked)))
        dist.init_process_group("gloo", device_id=None)
        seen.append((dist.is_initialized(), device_mesh.is_initialized(), dict(asked)))
    seen.append((dist.is_initialized(), device_mesh.is_initialized(), {}))
    return seen


@pytest.mark.world(sizes=[2])
def test_to_the_script_the_group_is_up_once_it_or_a_library_initialised_it(world):
    """The examples initialise only ``if not dist.is_initialized()``; DeepSpeed and Megatron
    likewise; device_mesh initialises the default group itself: to the script the group is up
    only once one of them called init_process_group, and after the script it is up again."""
    for seen in world.run(_script_s_view):
        assert seen == [(False, False, {"called": False}),
                        (True, True, {"called": True, "device_id": None}), (True, True, {})]


def test_deepspeed_s_cpu_op_is_neither_built_nor_used_while_a_script_runs(tmp_path, monkeypatch):
    """A stand-in for DeepSpeed's torch backend module, whose ``build_shm_op`` would compile
    the CPU op: while a script runs under the audit it gives None, whether the script imports
    the module then (the import hook) or it was imported before; afterwards it is the
    library's own again, and a script that never loads DeepSpeed gets nothing imported."""
    from commbench.studies.audit import _deepspeed_without_its_cpu_op

    comm = tmp_path / "deepspeed" / "comm"
    comm.mkdir(parents=True)
    (tmp_path / "deepspeed" / "__init__.py").write_text("")
    (comm / "__init__.py").write_text("")
    (comm / "torch.py").write_text("def build_shm_op():\n    return 'compiled'\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def deepspeed_modules() -> list[str]:
        return [n for n in sys.modules if n.split(".")[0] == "deepspeed"]

    for name in deepspeed_modules():  # the real library's, put back after the test
        monkeypatch.delitem(sys.modules, name)
    try:
        with _deepspeed_without_its_cpu_op():
            pass
        assert "deepspeed" not in sys.modules  # nothing imported for a script without it
        with _deepspeed_without_its_cpu_op():
            from deepspeed.comm import torch as backend  # imported while the script runs

            assert backend.build_shm_op() is None
        assert backend.build_shm_op() == "compiled"  # the library's own once the script is done
        with _deepspeed_without_its_cpu_op():
            assert sys.modules["deepspeed.comm.torch"].build_shm_op() is None  # imported before
        assert backend.build_shm_op() == "compiled"
    finally:  # the stand-in leaves: later tests ask whether DeepSpeed is installed
        for name in deepspeed_modules():
            del sys.modules[name]


def test_a_big_job_s_group_is_printed_as_ranges():
    """An audit under srun of 512 ranks: its world group is one range with its size, a small
    group's ranks and a send's peer as before."""
    from commbench.studies.audit import _group_cell

    assert _group_cell({"group": list(range(512)), "op": "all_reduce"}) == "[0-511] (512 ranks)"
    assert _group_cell({"group": [0, 1], "op": "send", "peer": 1, "pg": "2"}) == "[0, 1] pg 2 to 1"
