"""torch's flight recorder dumps (commbench/traces/flight.py): real dumps of gloo jobs written by
torch (tests/data/flight/make_dumps.py), each finding checked against the dumps read here
apart, by plain pickle and json."""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest
from said import said

from commbench.cli.main import main

pytestmark = pytest.mark.traces

DATA = os.path.join(os.path.dirname(__file__), "data", "flight")
HANG, DESYNC = os.path.join(DATA, "hang"), os.path.join(DATA, "desync")


def _raw(folder: str) -> dict[int, dict]:
    """Each rank's dump as torch wrote it (the test's own data: plain pickle is fine here)."""
    out = {}
    for f in sorted(os.listdir(folder)):
        with open(os.path.join(folder, f), "rb") as fh:
            data = fh.read()
        rank = int(f.split("_")[-1].split(".")[0])
        out[rank] = pickle.loads(data) if data[:1] == b"\x80" else json.loads(data)
    return out


def _default(dump: dict) -> list[dict]:
    return [e for e in dump["entries"] if e["process_group"][0] == "0"]


def test_the_rank_the_others_wait_for_is_named_with_the_call_it_never_issued(tmp_path, capsys):
    """Four ranks: ranks 0, 1 and 3 issued a fourth all-reduce on the world, rank 2 did not.
    The figures are the raw dumps': who holds the most calls on the default group, and the
    last call of the one behind."""
    raw = _raw(HANG)
    counts = {r: len(_default(d)) for r, d in raw.items()}
    top = max(counts.values())
    ahead = sorted(r for r, k in counts.items() if k == top)
    behind = sorted(r for r, k in counts.items() if k < top)
    assert (ahead, behind) == ([0, 1, 3], [2])
    fourth = _default(raw[0])[-1]
    assert main(["analyze", HANG, "--json", str(tmp_path / "a.json")]) == 1
    out = capsys.readouterr().out
    op = fourth["profiling_name"].split(":")[1]
    assert (f"# group 0 (default_pg): ranks [0, 1, 3] issued {op} #{top} "
            f"{fourth['input_sizes']} {fourth['input_dtypes'][0]} and wait in it; rank 2 never "
            f"issued it (last issued: {op} #{counts[2]}") in out
    rec = json.loads((tmp_path / "a.json").read_text())
    assert rec["ranks"] == [0, 1, 2, 3] and len(rec["findings"]) == 1
    halves = {g["group"]: g["members"] for g in rec["groups"] if g["group"] != "0"}
    assert sorted(halves.values()) == [[0, 1], [2, 3]]  # each half's all-gather: no finding
    assert all(not g["behind"] for g in rec["groups"] if g["group"] != "0")


def test_ranks_that_issued_different_collectives_at_one_place_are_a_desync(capsys):
    """Two ranks: after an all-reduce, rank 0 all-reduces 1024 floats where rank 1 broadcasts
    512. Both issued two calls (no rank behind); the second differs."""
    raw = _raw(DESYNC)
    second = {r: d["entries"][1] for r, d in raw.items()}
    assert {e["collective_seq_id"] for e in second.values()} == {2}
    assert main(["analyze", DESYNC]) == 1
    out, err = capsys.readouterr()
    parts = "; ".join(f"rank {r}: {e['profiling_name'].split(':')[1]} #2 {e['input_sizes']} "
                      f"{e['input_dtypes'][0]}" for r, e in sorted(second.items()))
    assert f"the ranks issued different collectives at the same place (a desync): {parts}" in out
    assert "1 finding(s) in the flight recorder dumps" in err and "behind" not in err


def test_a_size_alone_that_differs_is_a_desync_too_and_ranks_in_step_are_not(tmp_path, capsys):
    """The broken matcher compares the collectives' names only: the same dumps with rank 1's
    second call made an all-reduce of its 512 floats still differ from rank 0's 1024. Ranks 0
    and 1 of the four-rank job, alone, are in step on every group: exit 0."""
    for f in os.listdir(DESYNC):
        shutil.copy(os.path.join(DESYNC, f), tmp_path / f)
    one = tmp_path / "nccl_trace_rank_1.json"
    doc = json.loads(one.read_text())
    doc["entries"][1]["profiling_name"] = "gloo:all_reduce"
    one.write_text(json.dumps(doc))
    assert main(["analyze", str(tmp_path)]) == 1
    assert "rank 0: all_reduce #2 [[1024]] Float; rank 1: all_reduce #2 [[512]] Float" in \
        capsys.readouterr().out
    pair = [os.path.join(HANG, f"nccl_trace_rank_{r}") for r in (0, 1)]
    assert main(["analyze", *pair]) == 0
    assert "every member of every group issued the same collectives" in capsys.readouterr().out


def test_a_pickle_that_would_run_code_is_refused_without_running_it(tmp_path, capsys):
    """A dump is dicts, lists and numbers: one that names a function (here one that would
    create a file when unpickled) is refused, and the file is never made."""
    marker = tmp_path / "ran"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    (tmp_path / "nccl_trace_rank_0").write_bytes(pickle.dumps({"entries": [Evil()]}))
    assert main(["analyze", str(tmp_path)]) == 2
    err = said(capsys)
    assert "not a flight recorder dump (it names " in err and "open" in err
    assert not marker.exists()


def test_a_dump_whose_name_holds_no_rank_is_refused(tmp_path, capsys):
    shutil.copy(os.path.join(HANG, "nccl_trace_rank_0"), tmp_path / "dump")
    assert main(["analyze", str(tmp_path / "dump")]) == 2
    assert "holds no rank and its name ends in no number" in said(capsys)
    assert main(["analyze", HANG, "--topology", "dgx-h100"]) == 2
    assert "--topology: flight recorder dumps hold the calls' order" in said(capsys)


@pytest.mark.launcher
@pytest.mark.local
def test_the_installed_torch_s_own_dumps_read_to_the_same_findings(tmp_path):
    """The corpus written again by the installed torch (its make_dumps.py, into a copy of the
    folder): the same findings, so that a torch whose dump format moves is caught here."""
    import subprocess
    import sys

    shutil.copy(os.path.join(DATA, "make_dumps.py"), tmp_path / "make_dumps.py")
    subprocess.run([sys.executable, str(tmp_path / "make_dumps.py")], check=True, timeout=300,
                   capture_output=True)
    for name in ("hang", "desync"):
        got = [main(["analyze", str(tmp_path / name), "--json", str(tmp_path / f"{name}.json")])]
        got.append(main(["analyze", os.path.join(DATA, name), "--json",
                         str(tmp_path / f"{name}0.json")]))
        fresh, kept = (json.loads((tmp_path / f).read_text()) for f in (f"{name}.json",
                                                                       f"{name}0.json"))
        assert got == [1, 1] and fresh["findings"] == kept["findings"]


def test_a_call_every_member_issued_and_not_all_completed_is_noted_with_its_states(
        tmp_path, capsys):
    """NCCL's dumps say more than gloo's: a call's state (scheduled, started, completed, with
    CUDA events) and its duration. The desync dumps made NCCL-like: both ranks' second call the
    same all-reduce, rank 0's started and not completed, rank 1's completed in 2.5 ms. No rank is
    behind and nothing differs: no finding, exit 0, and a note that rank 0 had not completed
    it, with the states; the groups' median duration is a column."""
    for r in (0, 1):
        doc = json.loads(open(os.path.join(DESYNC, f"nccl_trace_rank_{r}.json")).read())
        first, second = doc["entries"]
        second.update(profiling_name=first["profiling_name"], input_sizes=first["input_sizes"],
                      input_dtypes=first["input_dtypes"], state="started" if r == 0 else "completed")
        first.update(state="completed", duration_ms=1.5)
        if r == 1:
            second["duration_ms"] = 2.5
            doc["pg_status"]["0"]["last_completed_collective"] = "2"
        (tmp_path / f"nccl_trace_rank_{r}.json").write_text(json.dumps(doc))
    assert main(["analyze", str(tmp_path), "--json", str(tmp_path / "a.json")]) == 0
    out = capsys.readouterr().out
    assert ("# group 0: every member issued all_reduce #2 [[1024]] Float; rank 0 had not "
            "completed it when the dumps were taken (started on rank 0; completed on rank 1)") in out
    rec = json.loads((tmp_path / "a.json").read_text())
    (row,) = rec["groups"]
    assert (row["done_min"], row["done_max"], row["median_ms"]) == (1, 2, 1.5)
    assert rec["findings"] == [] and len(rec["notes"]) == 1 and "median ms" in out


def test_a_member_the_group_config_names_without_a_dump_is_said(tmp_path, capsys):
    """NCCL's dumps name each group's ranks (``pg_config``, its ranks a string ``"[0, 1,
    2]"``). The desync dumps given a config of three ranks: rank 2 has no dump, and what it
    issued is not known; the two dumps present are still set against each other."""
    for r in (0, 1):
        doc = json.loads(open(os.path.join(DESYNC, f"nccl_trace_rank_{r}.json")).read())
        doc["pg_config"] = {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1, 2]"}}
        (tmp_path / f"nccl_trace_rank_{r}.json").write_text(json.dumps(doc))
    assert main(["analyze", str(tmp_path), "--json", str(tmp_path / "a.json")]) == 1
    rec = json.loads((tmp_path / "a.json").read_text())
    (row,) = rec["groups"]
    assert row["members"] == [0, 1, 2] and row["absent"] == [2] and row["dumps"] == [0, 1]
    assert any("no dump of rank 2" in f for f in rec["findings"])
    assert any("a desync" in f for f in rec["findings"])
    capsys.readouterr()


@pytest.mark.parametrize("field, value", [
    ("entries", {"a": 1}), ("entries", [1, "x"]), ("pg_status", [1]), ("pg_config", "x"),
    ("pg_config", {"0": {"ranks": "[0, oops"}}), ("pg_config", {"0": {"ranks": 7}}),
    ("process_group", "abc"), ("input_sizes", "big"), ("input_sizes", [[1, [2]]]),
    ("collective_seq_id", None), ("duration_ms", "slow"), ("input_dtypes", 3)])
def test_a_dump_with_a_field_of_the_wrong_kind_is_read_or_refused_in_one_line(
        tmp_path, capsys, field, value):
    """Bad input gets a line, never a traceback: each field of the desync dumps given a value of
    another kind (the dump's own, or its first entry's) reads, or is refused with exit 2."""
    for r in (0, 1):
        doc = json.loads(open(os.path.join(DESYNC, f"nccl_trace_rank_{r}.json")).read())
        target = doc if field in doc and field not in doc["entries"][0] else doc["entries"][0]
        target[field] = value
        (tmp_path / f"nccl_trace_rank_{r}.json").write_text(json.dumps(doc))
    assert main(["analyze", str(tmp_path)]) in (0, 1, 2)
    capsys.readouterr()
