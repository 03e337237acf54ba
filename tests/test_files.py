"""Every input file is bounded: topology and results files are read from regular files only, at
most a stated size, and refused in one line with exit 2 otherwise; a results file that repeats a
row, holds an absurd size or nests too deep is refused naming the row or the rule."""

from __future__ import annotations

import json
import os

import pytest
from said import said

from commbench.cli.main import main
from commbench.results.files import FileRefused, read_json

pytestmark = pytest.mark.foundation
RESULTS = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "results")
GOOD = os.path.join(RESULTS, "collectives_amd-epyc-2c-gloo-x4.json")


def _one_line(capsys, code: int, *fragments: str) -> None:
    err = said(capsys)
    assert code == 2 and err.startswith("commbench: error: ") and err.count("\n") == 1, err
    assert all(f in err for f in fragments), err


def _hostile(tmp_path) -> dict[str, str]:
    fifo = str(tmp_path / "fifo")
    os.mkfifo(fifo)
    big = str(tmp_path / "big.json")
    with open(big, "wb") as f:
        f.truncate(1 << 30)  # 1 GB, sparse: no disk used, nothing read
    return {"a device": "/dev/zero", "a FIFO": fifo, "more than": big}


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_device_a_fifo_and_a_large_file_are_refused_as_a_topology(tmp_path, capsys):
    for why, path in _hostile(tmp_path).items():
        code = main(["predict", "layout", "--topology", path, "--nodes", "2", "--tp", "8"])
        _one_line(capsys, code, path, why)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_device_a_fifo_and_a_large_file_are_refused_as_results(tmp_path, capsys):
    for why, path in _hostile(tmp_path).items():
        _one_line(capsys, main(["compare", path, GOOD]), path, why)
        _one_line(capsys, main(["compare", GOOD, path]), path, why)


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="needs FIFOs")
def test_a_fifo_is_named_as_one_wherever_a_file_is_read_or_written(tmp_path, capsys):
    """A trace, a script, a log: read, it would block for ever (or be called missing); written,
    the results' temporary file would replace it. Each is one line naming the FIFO, exit 2."""
    fifo = _hostile(tmp_path)["a FIFO"]
    log = os.path.join(os.path.dirname(__file__), "data", "nccl_tests",
                       "cscs_gh200_2x4_all_reduce.log")
    trace = os.path.join(os.path.dirname(__file__), "data", "traces")
    for argv, rule in (
            (["analyze", fifo], "is a FIFO; a trace must be a regular file or a folder of them"),
            (["replay", fifo, "--np", "2"], "is a FIFO; a trace must be a regular file"),
            (["audit", fifo, "--np", "2"], "is a FIFO; a script must be a regular file"),
            (["import", fifo], "is a FIFO; a log file must be a regular file"),
            (["analyze", trace, "--json", fifo], "--json " + fifo + ": is a FIFO; give a regular"),
            (["calibrate", log, "--topology", "alps-gh200", "--json", fifo],
             "--json " + fifo + ": is a FIFO; give a regular file's name"),
            (["audit", os.path.join(RESULTS, "..", "examples", "ddp.py"), "--trace", fifo],
             "--trace " + fifo + ": is a FIFO")):
        _one_line(capsys, main(argv), fifo, rule)
    assert os.path.exists(fifo) and not os.path.isfile(fifo)  # still the FIFO


def _record_with(tmp_path, change) -> str:
    with open(GOOD) as f:
        record = json.load(f)
    change(record)
    path = str(tmp_path / "changed.json")
    with open(path, "w") as f:
        json.dump(record, f)
    return path


def test_a_repeated_row_is_refused_naming_both(tmp_path, capsys):
    path = _record_with(tmp_path, lambda r: r["rows"].append(dict(r["rows"][3])))
    _one_line(capsys, main(["compare", GOOD, path]), "repeats row 3")


def test_an_absurd_size_is_refused(tmp_path, capsys):
    def huge(r):
        r["rows"][0]["size"] = 10 ** 400
    _one_line(capsys, main(["compare", GOOD, _record_with(tmp_path, huge)]), "size = 1000",
              "2**50")


def test_deep_nesting_is_refused_not_a_crash(tmp_path, capsys):
    path = tmp_path / "deep.json"
    path.write_text("[" * 100000 + "]" * 100000)
    _one_line(capsys, main(["compare", GOOD, str(path)]), "nested too deeply")
    with pytest.raises(FileRefused, match="nested too deeply"):
        read_json(str(path), "results", 1 << 20)


def test_a_good_file_still_compares(capsys):
    assert main(["compare", GOOD, GOOD]) == 0


def test_list_names_every_topology_preset(capsys):
    from commbench.costmodel.topology import presets

    assert main(["list", "--topologies"]) == 0
    out = capsys.readouterr().out
    assert presets() and all(f"| {name} " in out for name in presets())
