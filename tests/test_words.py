"""What a user reads: every non-zero exit says why on stderr; a script with a syntax error is
refused before any rank starts; predict layout names its NCCL version; --resume with nothing to
resume says so."""

from __future__ import annotations

import os

import pytest
from said import said

from commbench.cli.main import main

pytestmark = pytest.mark.foundation

DATA = os.path.join(os.path.dirname(__file__), "data", "nccl_tests")


def test_a_regression_prints_its_line_on_stderr(tmp_path, capsys):
    for name in ("cscs_gh200_2x4_all_reduce.log", "cscs_gh200_2x4_all_reduce_nocxi.log"):
        assert main(["import", os.path.join(DATA, name), "--out", str(tmp_path / name)]) == 0
    good, bad = (next((tmp_path / n).glob("*.json")) for n in
                 ("cscs_gh200_2x4_all_reduce.log", "cscs_gh200_2x4_all_reduce_nocxi.log"))
    capsys.readouterr()
    assert main(["compare", str(good), str(bad)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rows regressed" in err[0]


def test_a_script_with_a_syntax_error_is_refused_before_any_rank_starts(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("import torch\n\ndef f(:\n    pass\n")
    assert main(["audit", str(script), "--np", "2", "--no-write"]) == 2
    err = said(capsys).strip().splitlines()
    assert len(err) == 1 and f"{script}:3: syntax error" in err[0]


def test_predict_layout_names_the_nccl_version_of_its_model(capsys):
    assert main(["predict", "layout", "--tp", "4", "--dp", "2", "--nccl-version", "2.30.7"]) == 0
    assert "; NCCL 2.30.7 model" in capsys.readouterr().out


def test_resume_with_nothing_to_resume_says_so():
    from commbench.studies.collectives import _resumed

    said_lines: list[str] = []
    assert _resumed(os.path.join(DATA, "nothing-here.json"), 2, {}, {}, said_lines.append) is None
    assert said_lines and "nothing to resume" in said_lines[0]
