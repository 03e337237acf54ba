"""The results folder's lock and the Chrome trace of booked calls, single-process, at their
edges: a lock held elsewhere names its holder, a shorter pid leaves no tail of a longer one, a
folder not there yet is made; a trace's time origin is its earliest call or step, its units
microseconds, NCCL's host times enqueue times, and the bubble read off it by hand."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from commbench.results.lock import NAME, FolderBusy, folder_lock
from commbench.results.trace import chrome_trace, idle_fraction
from commbench.wire.ledger import Entry

pytestmark = pytest.mark.foundation


def test_the_lock_makes_its_folder_and_holds_this_process_s_pid(tmp_path):
    folder = tmp_path / "not" / "yet"
    with folder_lock(str(folder)) as path:
        assert path == str(folder / NAME)
        assert (folder / NAME).read_text() == str(os.getpid())


def test_a_shorter_pid_leaves_no_tail_of_the_last_holder_s(tmp_path):
    (tmp_path / NAME).write_text("9" * 20)
    with folder_lock(str(tmp_path)):
        assert (tmp_path / NAME).read_text() == str(os.getpid())


def test_a_second_hold_is_refused_naming_the_holder_and_taken_once_released(tmp_path):
    with folder_lock(str(tmp_path)):
        with pytest.raises(FolderBusy, match=rf"pid {os.getpid()}\) is writing there"):
            with folder_lock(str(tmp_path)):
                pass
    with folder_lock(str(tmp_path)):  # released with the block
        pass


def test_the_refusal_says_what_to_do_and_reads_a_garbled_holder(tmp_path):
    """The whole message; a lock file whose pid is garbled (not UTF-8) or empty still names
    something; the lock file is not executable (0o644 under the umask)."""
    umask = os.umask(0)
    os.umask(umask)
    with folder_lock(str(tmp_path)) as path:
        assert os.stat(path).st_mode & 0o777 == 0o644 & ~umask
        for text, shown in ((b"\xff42", "\ufffd42"), (b"", "unknown")):
            with open(path, "r+b") as f:
                f.truncate(0)
                f.write(text)
            with pytest.raises(FolderBusy) as err:
                with folder_lock(str(tmp_path)):
                    pass
            assert str(err.value) == (f"{tmp_path}: another commbench run (pid {shown}) is "
                                      "writing there; wait for it or give --out another folder")


def test_a_lock_held_by_another_process_is_refused_and_freed_when_it_dies(tmp_path):
    code = ("import sys, time; from commbench.results.lock import folder_lock\n"
            "with folder_lock(sys.argv[1]):\n    print('held', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", code, str(tmp_path)], stdout=subprocess.PIPE,
                              text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        with pytest.raises(FolderBusy, match=rf"pid {holder.pid}\)"):
            with folder_lock(str(tmp_path)):
                pass
    finally:
        holder.kill()
        holder.wait()
    with folder_lock(str(tmp_path)):  # the kernel let go of the killed holder's lock
        pass


def _e(op: str, start: float, seconds: float, **kw) -> tuple:
    base = dict(op=op, group=(0, 1), transport="gloo", dtype="float32", count=4, sent=16, recv=16,
                seconds=seconds, start=start)
    return tuple(Entry(**{**base, **kw}))


def test_a_trace_starts_at_its_earliest_call_or_step_in_microseconds():
    per_rank = [[_e("all_reduce", 10.5, 0.25, transport="nccl", device_seconds=0.0001,
                    nbytes=16)],
                [_e("all_reduce", 10.0, 0.5)]]
    trace = chrome_trace([("a", per_rank)])
    names = [e for e in trace["traceEvents"] if e["ph"] == "M"]
    assert [(e["pid"], e["args"]["name"]) for e in names] == [(0, "rank 0"), (1, "rank 1")]
    calls = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert [(e["pid"], e["ts"], e["dur"]) for e in calls] == [(0, 500_000.0, 250_000.0),
                                                             (1, 0.0, 500_000.0)]
    assert calls[0] == {"name": "all_reduce", "cat": "call", "ph": "X", "pid": 0, "tid": 0,
                        "ts": 500_000.0, "dur": 250_000.0, "args": {
                            "run": "a", "group": [0, 1], "axis": "", "dtype": "float32",
                            "elements": 4, "sent_bytes": 16, "tensor_bytes": 16, "redop": "",
                            "phase": "", "module": "", "device_us": pytest.approx(100.0),
                            "host_time": "enqueue"}}
    assert calls[1]["args"]["host_time"] == "call"
    assert calls[0]["args"]["device_us"] == pytest.approx(100.0)
    assert calls[1]["args"]["device_us"] is None and calls[1]["args"]["tensor_bytes"] is None
    # a step that began before any call moves the origin to it
    stepped = chrome_trace([("a", per_rank, [(9.0, 11.0), (9.5, 11.0)])])
    steps = [e for e in stepped["traceEvents"] if e["name"] == "step"]
    assert [(e["ts"], e["dur"]) for e in steps] == [(0.0, 2_000_000.0), (500_000.0, 1_500_000.0)]
    assert steps[1] == {"name": "step", "cat": "step", "ph": "X", "pid": 1, "tid": 0,
                        "ts": 500_000.0, "dur": 1_500_000.0, "args": {"run": "a"}}
    assert stepped["displayTimeUnit"] == "ms"
    assert chrome_trace([]) == {"traceEvents": [], "displayTimeUnit": "ms"}


def test_the_bubble_read_off_a_trace_by_hand():
    """Rank 0's step 2 s, 0.5 s of it in a receive and 0.25 s in an isend (not idle); rank 1's
    step 1.5 s, 0.5 s in a send and a receive, and it waits 0.5 s for rank 0's longer step:
    ((0.5) + (0.5 + 0.5)) / (2 x 2) = 0.375."""
    per_rank = [[_e("recv", 1.0, 0.5), _e("isend", 2.0, 0.25)],
                [_e("send", 1.0, 0.25), _e("recv", 1.25, 0.25)]]
    trace = chrome_trace([("pp", per_rank, [(0.0, 2.0), (0.0, 1.5)]),
                          ("other", per_rank, [(0.0, 9.0), (0.0, 9.0)])])
    assert idle_fraction(trace, "pp") == pytest.approx(0.375)
    with pytest.raises(ValueError, match="run 'none': no step slices"):
        idle_fraction(trace, "none")
