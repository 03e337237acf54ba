"""A fuzz test of the whole command line: hypothesis draws arguments for every subcommand, numbers
at the edges and results files with NaN, negative, zero and malformed rows, and holds the
contract of the README's exit-code table: the code is one of 0, 1, 2, 3, 130, 143; a non-zero
exit writes one line to stderr and no traceback; no process is left behind.

``run`` and ``claims`` are drawn with at least one bad argument, so that each example is refused
before any rank starts (a valid run takes seconds; tests/test_cli.py runs real ones).
"""

from __future__ import annotations

import copy
import json
import os

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from commbench.cli.main import main
from commbench.names import ALIASES, COLLECTIVES, DTYPE_NAMES

pytestmark = [pytest.mark.faults, pytest.mark.local]

CODES = {0, 1, 2, 3, 130, 143}
SIZES = ["8", "1K", "64M", "0", "-8", "abc", "1.5M", "16G", "99999999999G", "", "8B"]
INTS = ["0", "1", "2", "-1", "3", "abc", "99999999999", "1e3"]
FLOATS = ["0", "-1", "nan", "inf", "1e-9", "0.1", "1", "x"]

# (flag, a bad value): every drawn run has one
BAD_RUN = [("-b", "0"), ("-e", "-8"), ("-f", "1"), ("-n", "0"), ("-w", "-1"),
           ("-d", "complex64"), ("-o", "xor"), ("-c", "2"), ("--np", "0"), ("--np", "100000"),
           ("--timeout", "nan"), ("--timeout", "0"), ("--transport", "carrier-pigeon"),
           ("--algo", "quantum"), ("--batch", "0"), ("--repeat", "-1"), ("--rounds", "0"),
           ("--label", "a/b"), ("-e", "99999999999G"), ("-r", "-3"), ("--launch", "rocket")]
GOOD_RUN = [("-b", SIZES), ("-e", SIZES), ("-f", INTS), ("-n", INTS), ("-w", INTS),
            ("-d", [*DTYPE_NAMES, "complex64"]), ("-o", ["sum", "avg", "max", "xor"]),
            ("-r", INTS), ("--np", INTS), ("--timeout", FLOATS), ("--transport",
            ["gloo", "mpi", "gloo,mpi", "nccl"]), ("--algo", ["native", "ring", "native,ring"]),
            ("--batch", INTS), ("--repeat", INTS), ("--rounds", INTS), ("-c", ["0", "1"])]
TARGETS = [*COLLECTIVES, *list(ALIASES)[:6], "collectives", "versus", "overhead", "model", "zero",
           "tp", "nonsense", "moe"]


def _children() -> set[int]:
    """Pids of this process's children (read from /proc)."""
    me, out = os.getpid(), set()
    for pid in os.listdir("/proc"):
        if pid.isdigit():
            try:
                with open(f"/proc/{pid}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[1]) == me and fields[0] != "Z":
                out.add(int(pid))
    return out


def _holds_contract(argv: list[str], capsys) -> int:
    before = _children()
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse: --help, --version (0) and usage errors (2)
        code = exc.code if isinstance(exc.code, int) else 2
    captured = capsys.readouterr()
    assert code in CODES, (argv, code, captured.err)
    assert "Traceback" not in captured.err, (argv, captured.err)
    if code != 0:
        assert captured.err.count("\n") == 1 and captured.err.startswith("commbench"), \
            (argv, captured.err)
    assert _children() <= before, (argv, "a process was left behind")
    return code


def _flags(draw, table) -> list[str]:
    picks = draw(st.lists(st.sampled_from(table), max_size=5, unique_by=lambda t: t[0]))
    out: list[str] = []
    for flag, values in picks:
        out += [flag, draw(st.sampled_from(values))]
    return out


@st.composite
def bad_runs(draw) -> list[str]:
    targets = draw(st.lists(st.sampled_from(TARGETS), max_size=2))
    flags = _flags(draw, GOOD_RUN)
    bad_flag, bad_value = draw(st.sampled_from(BAD_RUN))
    flags += [bad_flag, bad_value]
    return ["run", *targets, *flags, "--no-write"]


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(argv=bad_runs())
def test_run_with_a_bad_argument_is_refused_in_one_line(argv, capsys):
    assert _holds_contract(argv, capsys) == 2


@FUZZ
@given(what=st.sampled_from(["collective", "layout"]), op=st.sampled_from(
       ["all_reduce", "all_gather", "broadcast", "bogus"]), size=st.sampled_from(SIZES),
       flags=st.lists(st.tuples(st.sampled_from(["--ranks", "--nodes", "--tp", "--dp", "--pp",
                                                 "--cp", "--ep", "--experts", "--zero",
                                                 "--layers", "--heads", "--topology"]),
                                st.sampled_from([*INTS, "dgx-h100", "nope.json", ""])),
                      max_size=4, unique_by=lambda t: t[0]))
def test_predict_holds_the_exit_code_contract(what, op, size, flags, capsys):
    argv = ["predict", what, *([op, size] if what == "collective" else [])]
    for flag, value in flags:
        if what == "layout" and flag == "--ranks" or what == "collective" and flag not in (
                "--ranks", "--nodes", "--topology"):
            continue
        argv += [flag, value]
    _holds_contract(argv, capsys)


def _record(rows: int = 4) -> dict:
    sizes = [64 << 10 << k for k in range(rows)]
    return {"schema": "commbench.results.records/1", "suite": "collectives", "world_size": 2,
            "rows": [{"op": "all_reduce", "algo": "ring", "transport": "gloo", "type": "float32",
                      "redop": "sum", "root": -1, "size": s, "time_us": 100.0 + s / 1e4,
                      "min_us": 90.0 + s / 1e4, "busbw": s / (100.0 + s / 1e4) / 1e3}
                     for s in sizes]}


CORRUPT = {"nan time": ("time_us", float("nan")), "inf busbw": ("busbw", float("inf")),
           "negative busbw": ("busbw", -1.0), "zero time": ("time_us", 0.0),
           "size text": ("size", "abc"), "size negative": ("size", -64), "size float": ("size", 1.5),
           "time text": ("min_us", "fast"), "busbw null": ("busbw", None)}


@FUZZ
@given(old=st.sampled_from(["good", "slower", *CORRUPT, "missing field", "not json", "empty",
                            "no file", "folder", "not an object"]),
       new=st.sampled_from(["good", "slower", *CORRUPT, "not json"]), row=st.integers(0, 3),
       threshold=st.sampled_from(["0.1", "0", "1", "-0.5", "nan", "x"]),
       min_size=st.sampled_from(["64K", "0", "-1", "abc", "1G"]))
def test_compare_holds_the_exit_code_contract(old, new, row, threshold, min_size, tmp_path_factory,
                                              capsys):
    folder = tmp_path_factory.mktemp("cmp")
    paths = [_write(folder, f"{k}.json", kind, row) for k, kind in enumerate((old, new))]
    code = _holds_contract(["compare", *paths, "--threshold", threshold, "--min-size", min_size],
                           capsys)
    corrupt = {old, new} - {"good", "slower"}
    if corrupt or threshold not in ("0.1",) or min_size in ("-1", "abc", "0"):
        assert code == 2, (old, new, threshold, min_size)


def _write(folder, name: str, kind: str, row: int) -> str:
    path = os.path.join(folder, name)
    if kind == "no file":
        return path
    if kind == "folder":
        os.mkdir(path)
        return path
    record = _record()
    if kind == "slower":
        for r in record["rows"]:
            r["time_us"] *= 2
            r["min_us"] *= 2
            r["busbw"] /= 2
    elif kind in CORRUPT:
        field, value = CORRUPT[kind]
        record["rows"][row][field] = value
    elif kind == "missing field":
        del record["rows"][row]["busbw"]
    texts = {"not json": '{"schema": "commbench.res', "empty": "", "not an object": "[1, 2]"}
    text = texts[kind] if kind in texts else json.dumps(copy.deepcopy(record))
    with open(path, "w") as f:
        f.write(text)
    return path


@pytest.mark.parametrize("argv", [["--help"], ["--version"], ["run", "--help"], ["list"],
                                  ["claims", "--np", "0"], ["claims", "--np", "-3"],
                                  ["predict", "published", "--no-write"], ["nonsense"], [],
                                  ["audit", "no/such.py"], ["audit", "examples/dtensor.py",
                                                            "--np", "0"],
                                  ["audit", "examples/dtensor.py", "--timeout", "nan"]])
def test_every_other_command_holds_the_contract(argv, capsys):
    _holds_contract(argv, capsys)
