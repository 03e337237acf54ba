"""What a user reads: a script with a syntax error is
refused before any rank starts; predict layout names its NCCL version; --resume with nothing to
resume says so; a run says it is starting its ranks before it imports torch."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from said import said

from commbench.cli.main import main

pytestmark = pytest.mark.foundation


def test_a_script_with_a_syntax_error_is_refused_before_any_rank_starts(tmp_path, capsys):
    script = tmp_path / "broken.py"
    script.write_text("import torch\n\ndef f(:\n    pass\n")
    assert main(["audit", str(script), "--np", "2", "--no-write"]) == 2
    err = said(capsys).strip().splitlines()
    assert len(err) == 1 and f"{script}:3: syntax error" in err[0]


def test_predict_layout_names_the_nccl_version_of_its_model(capsys):
    assert main(["predict", "layout", "--tp", "4", "--dp", "2", "--nccl-version", "2.30.7"]) == 0
    assert "; NCCL 2.30.7 model" in capsys.readouterr().out


def test_resume_with_nothing_to_resume_says_so(tmp_path):
    from commbench.studies.collectives import _resumed

    said_lines: list[str] = []
    assert _resumed(str(tmp_path / "nothing-here.json"), 2, {}, {}, said_lines.append) is None
    assert said_lines and "nothing to resume" in said_lines[0]


def test_a_script_importing_what_is_not_installed_is_refused_before_any_rank_starts(
        tmp_path, capsys, monkeypatch):
    script = tmp_path / "needs.py"
    script.write_text("import os\n\ndef main():\n    import not_installed_anywhere_xyz\n")
    assert main(["audit", str(script), "--np", "2", "--no-write"]) == 2
    err = said(capsys).strip().splitlines()
    assert len(err) == 1 and f"{script}:4: imports not_installed_anywhere_xyz, which is not " \
        "installed here" in err[0]


def test_the_libs_examples_name_the_libs_extra_when_it_is_missing(capsys, monkeypatch):
    import importlib.util

    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "deepspeed" else real(name, *a))
    example = os.path.join(os.path.dirname(__file__), "..", "examples", "deepspeed_zero.py")
    assert main(["audit", example, "--np", "2", "--no-write"]) == 2
    err = said(capsys).strip().splitlines()
    assert len(err) == 1 and "imports deepspeed, which is not installed here: install the libs " \
        "extra (pip install 'commbench[libs]')" in err[0]


def test_an_import_guarded_by_try_is_not_refused():
    from commbench.cli.audit import _missing_imports

    path = os.path.join(os.path.dirname(__file__), "data", "audit", "guarded.py")
    assert _missing_imports(path) == []


@pytest.mark.parametrize(("cmd", "message", "hint"), [
    ("run", "DefaultCPUAllocator: can't allocate memory: you tried to allocate 8 GB", "lower -e"),
    ("audit", "CUDA out of memory. Tried to allocate 2.00 GiB", "a smaller model, fewer ranks"),
    ("audit", "rank 0 raised in _allocate_buffers_for_parameters: bad config", "see the log"),
])
def test_the_hint_follows_what_failed_not_a_word_in_it(cmd, message, hint):
    from commbench.cli.main import _what_to_do

    assert hint in _what_to_do(RuntimeError(message), cmd)
    assert "lower -e" not in _what_to_do(RuntimeError(message), cmd) or cmd == "run"


def test_a_local_world_says_it_is_starting_before_its_ranks_take_their_seconds(capsys):
    """... and gives the start its import of torch, to run once the ranks' processes exist
    (their start-up and the import overlap: the next tests)."""
    from commbench.cli.checks import _import_torch, start_world
    from commbench.world.local import LocalWorld

    world = LocalWorld(4, launch="plain")  # made, not started
    printed, given = [], []

    def start(meanwhile=None):
        printed.append(capsys.readouterr().out)  # what was said before
        given.append(meanwhile)

    world.start = start
    start_world(world, True)
    assert printed == ["# starting 4 local rank(s) (plain): a few seconds\n"]
    start_world(world, False)  # a rank that does not print says nothing
    assert printed[-1] == "" and given == [_import_torch, _import_torch]


# a fresh interpreter that runs a command up to the point where it would start its ranks
# (commbench.cli.checks.start_world), refusing torch until then, and says whether it was asked for
_UP_TO_THE_START = """
import importlib.abc, sys, traceback
class NoTorch(importlib.abc.MetaPathFinder):
    asked = False
    def find_spec(self, name, path, target=None):
        # an import (not a look-up: audit asks whether the script's imports are installed)
        if name.split(".")[0] == "torch" and any(
                f.name == "_find_and_load" for f in traceback.extract_stack()):
            NoTorch.asked = True
            raise ImportError("torch, before the ranks start")
sys.meta_path.insert(0, NoTorch())
import commbench.cli.checks as checks, commbench.cli.run as run
def start_world(world, prints):
    print("the start reached", flush=True)
    raise SystemExit(0)
checks.start_world = run.start_world = start_world
try:
    {early}
    from commbench.cli.main import main
    main(sys.argv[1:])
except BaseException:
    pass
print("torch asked for before the start:", NoTorch.asked, flush=True)
"""
EXAMPLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples")
# the commands that start ranks, as a user gives them (each writes into the test's folder)
STARTING = {"run": ["run", "all_reduce", "--np", "2", "-b", "8", "-e", "8"],
            "run ulysses": ["run", "ulysses", "--np", "2"],
            "claims": ["claims", "--np", "2"],
            "audit": ["audit", os.path.join(EXAMPLES, "torch_tp_sp.py"), "--np", "2"]}


def _torch_before_the_start(tmp_path, command: list[str], early: str = "pass") -> bool:
    """Whether ``commbench COMMAND`` asked for torch before starting its ranks, in a fresh
    interpreter (``early``: a line run before the command line, a broken variant); False only
    where the command got as far as the start."""
    out = subprocess.run([sys.executable, "-c", _UP_TO_THE_START.format(early=early), *command,
                          "--out", str(tmp_path)], capture_output=True, text=True, timeout=300)
    said_ = [ln for ln in out.stdout.splitlines() if ln.startswith("torch asked for")]
    assert out.returncode == 0 and len(said_) == 1, (out.stdout[-2000:], out.stderr[-2000:])
    return said_[0].endswith("True") or "the start reached" not in out.stdout


@pytest.mark.local  # the commands start a local world: no launcher around pytest
@pytest.mark.parametrize("name", STARTING)
def test_a_command_imports_torch_only_once_its_ranks_start(tmp_path, name):
    """Importing torch takes a second or two of a core: a command's checks, its results folder
    and its world's making come first (so that it says it is starting its ranks at once), and
    torch is imported while the ranks start. On a host with a GPU driver the memory check asks
    torch first (the GPU's free memory)."""
    from commbench.cli.checks import no_gpu_driver

    if not no_gpu_driver():
        pytest.skip("this host has a GPU driver: the check of the GPU's memory imports torch")
    assert not _torch_before_the_start(tmp_path, STARTING[name])


@pytest.mark.local
def test_a_command_that_imports_torch_before_its_ranks_start_is_caught(tmp_path):
    run = STARTING["run"]
    # broken on purpose: a module the command line imports that reads torch at its import
    assert _torch_before_the_start(tmp_path, run, "import commbench.wire.dtypes")
    # broken on purpose: the memory check that asks torch where the host may have a GPU
    assert _torch_before_the_start(tmp_path, run, "import commbench.cli.checks as c; "
                                   "c.no_gpu_driver = lambda: False")
