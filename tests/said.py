"""What a command said on stderr, as each rank of a launched test run sees it: under a launcher
rank 0 alone prints a refusal (every rank makes the same one), so another rank checks that it
kept quiet and leaves the wording to rank 0."""

from __future__ import annotations

import pytest


def quiet_rank() -> bool:
    from commbench.runtime.launch import detect

    info = detect()
    return info.launched and info.rank != 0


def said(capsys) -> str:
    err = capsys.readouterr().err
    if quiet_rank():
        assert err == "", err
        pytest.skip("under a launcher rank 0 alone prints a refusal (checked on rank 0)")
    return err
