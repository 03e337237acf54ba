"""A long study keeps each finished piece: an interrupted pattern study, model or versus study
resumes without measuring them again (commbench.results.pieces)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time

import pytest
from command import commbench

from commbench.results.pieces import Pieces

pytestmark = pytest.mark.faults


def _kept(path) -> dict:
    lines = [json.loads(line) for line in open(path).read().splitlines()]
    return {p["key"]: p["value"] for p in lines[1:]}


def test_pieces_are_saved_as_they_come_and_taken_back_by_resume_only(tmp_path):
    path = str(tmp_path / "s.partial.jsonl")
    first = Pieces(path, {"iters": 5})
    first.put("a", {"time_us": 1.5})
    first.put("b", [1, 2])
    assert _kept(path) == {"a": {"time_us": 1.5}, "b": [1, 2]}
    said: list[str] = []
    again = Pieces(path, {"iters": 5}, resume=True, emit=said.append)
    assert again.get("a") == {"time_us": 1.5} and again.get("b") == [1, 2]
    assert again.get("c") is None and "2 finished pieces kept" in said[0]
    assert Pieces(path, {"iters": 5}).get("a") is None  # without --resume: measured again
    again.put("c", 3)  # the kept pieces written again, then each new one appended once
    again.put("d", 4)
    assert _kept(path) == {"a": {"time_us": 1.5}, "b": [1, 2], "c": 3, "d": 4}
    again.finish()
    assert not os.path.exists(path)


def test_a_last_piece_cut_short_is_measured_again_and_a_bad_line_before_it_refused(tmp_path):
    path = tmp_path / "s.partial.jsonl"
    Pieces(str(path), {"iters": 5}).put("a", 1)
    with open(path, "a") as f:
        f.write('{"key": "b", "val')  # a kill while the line was written
    resumed = Pieces(str(path), {"iters": 5}, resume=True)
    assert resumed.get("a") == 1 and resumed.get("b") is None
    resumed.put("b", 2)  # the torn line does not stay in front of the next piece
    assert _kept(path) == {"a": 1, "b": 2}
    with open(path, "a") as f:
        f.write("garbage\n" + json.dumps({"key": "c", "value": 3}) + "\n")
    with pytest.raises(ValueError, match="line 4 is not a finished piece"):
        Pieces(str(path), {"iters": 5}, resume=True)


def test_resume_refuses_pieces_measured_otherwise_or_a_file_of_another_kind(tmp_path):
    path = str(tmp_path / "s.partial.jsonl")
    Pieces(path, {"iters": 5, "ranks": 2}).put("a", 1)
    with pytest.raises(ValueError, match=r"measured otherwise: iters 5 -> 6"):
        Pieces(path, {"iters": 6, "ranks": 2}, resume=True)
    (tmp_path / "s.partial.jsonl").write_text(json.dumps({"rows": []}))
    with pytest.raises(ValueError, match="not a file of finished pieces"):
        Pieces(path, {"iters": 5}, resume=True)
    (tmp_path / "s.partial.jsonl").write_text("[" * 100000)
    with pytest.raises(ValueError, match="--resume"):
        Pieces(path, {"iters": 5}, resume=True)


class _Launched:
    """A launched world of two whose rank 0 holds the file: every rank takes rank 0's pieces."""

    def __init__(self, theirs):
        self.theirs = theirs

    def agree(self, mine):
        return [self.theirs, mine]


def test_under_a_launcher_every_rank_takes_rank_0_s_pieces_and_refusal(tmp_path):
    assert Pieces(None, {}, resume=True, world=_Launched({"a": 1})).get("a") == 1
    with pytest.raises(ValueError, match="measured otherwise"):
        Pieces(None, {}, resume=True, world=_Launched("--resume: x was measured otherwise: y"))


def _study(tmp_path, *extra):
    return subprocess.Popen(commbench("run", "ddp", "--np", "2", "-n", "2", "-w", "1", "--out",
                                      str(tmp_path), "--label", "test-box", *extra),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


@pytest.mark.local
def test_a_pattern_study_stopped_by_sigterm_keeps_its_rows_and_resumes(tmp_path):
    partial = tmp_path / "patterns_test-box-gloo-x2.partial.jsonl"
    proc = _study(tmp_path)
    deadline = time.monotonic() + 180
    while proc.poll() is None and time.monotonic() < deadline:
        if partial.exists() and len(_kept(partial)) >= 2:
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.05)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, err
    kept = _kept(partial)
    assert len(kept) >= 2
    again = _study(tmp_path, "--resume")
    out, err = again.communicate(timeout=300)
    assert again.returncode == 0, err
    assert f"{len(kept)} finished pieces kept" in out and out.count("(kept)") == len(kept)
    rows = json.loads((tmp_path / "ddp_test-box-gloo-x2.json").read_text())["rows"]
    by_key = {f"{r['pattern']}|{r['variant']}|{r['config']}": r for r in rows}
    assert all(by_key[k]["time_us"] == v["time_us"] for k, v in kept.items())  # not re-measured
    assert f"calls booked = predicted in {len(rows)} of {len(rows)} rows" in out  # all there
    assert not partial.exists()  # the table is whole: its partial file is gone
