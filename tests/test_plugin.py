"""The pytest plugin's Hypothesis seeds: one per test and world size, all replayed from the run's."""

from __future__ import annotations

import pytest

from commbench.pytest_plugin import seed_for as seed_of

pytestmark = [pytest.mark.foundation, pytest.mark.local]


def test_each_test_and_world_size_gets_its_own_seed():
    a = seed_of(1234, "tests/test_x.py::test_p[n2]")
    assert a == seed_of(1234, "tests/test_x.py::test_p[n2]")  # replays from the run's seed
    others = {seed_of(1234, "tests/test_x.py::test_p[n4]"), seed_of(1234, "tests/test_x.py::test_q"),
              seed_of(99, "tests/test_x.py::test_p[n2]")}
    assert a not in others and len(others) == 3


def test_the_seed_in_force_is_this_tests_own(request):
    from hypothesis import core

    run_seed = request.config._commbench_seed
    assert core.global_force_seed == seed_of(run_seed, request.node.nodeid)


DROPPED = """
from commbench.verdict import Verdict

def judge(problems):
    return Verdict(problems, "judge of all_reduce/ring")

def test_dropped():
    judge([])            # the answer is never looked at: passes by doing nothing

def test_read():
    assert judge([]) == []

def test_read_by_truth():
    problems = judge(["rank 1: 3 wrong elements"])
    assert problems

def test_failing_stays_its_own_failure():
    judge([])
    assert 1 == 2
"""


@pytest.mark.local
def test_a_test_that_never_reads_its_judge_s_verdict_fails(pytester):
    """The plugin fails a test that left a verdict unread, naming the judge; a test that reads
    it passes; a test failing on its own keeps its own error."""
    pytester.makepyfile(test_dropped=DROPPED)
    out = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    out.assert_outcomes(passed=2, failed=2)
    text = out.stdout.str()
    assert "1 verdict(s) never read: judge of all_reduce/ring" in text
    failed = sorted(line for line in text.splitlines() if line.startswith("FAILED"))
    assert failed[0].startswith("FAILED test_dropped.py::test_dropped - AssertionError: 1 verdict")
    assert failed[1] == "FAILED test_dropped.py::test_failing_stays_its_own_failure - assert 1 == 2"


def _selected(*args: str) -> tuple[int, list[str]]:
    """``pytest --collect-only ARGS`` in this process (the test modules are imported already):
    its exit code and the node ids it selected. Without this plugin, whose set-up would load
    its Hypothesis profile over the one this session runs with; markers are the tests' own."""
    import os

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    class Selected:
        ids: list[str] = []

        def pytest_collection_finish(self, session):
            Selected.ids = [item.nodeid for item in session.items]

    cwd = os.getcwd()
    os.chdir(root)
    try:
        code = pytest.main(["--collect-only", "-q", "-p", "no:cacheprovider", "-p", "no:commbench",
                            *args],
                           plugins=[Selected()])
    finally:
        os.chdir(cwd)
    return int(code), Selected.ids


def test_every_test_carries_a_topic_marker():
    """`pytest -m TOPIC` selects a topic's every test: none of the suite's tests is without a
    topic (the plugin's TOPICS), so deselecting every topic leaves nothing."""
    from commbench.pytest_plugin import TOPICS

    code, unmarked = _selected("-m", f"not ({' or '.join(TOPICS)})", "tests")
    assert code == 5 and not unmarked, unmarked[:20]
    # the check can fail: one topic fewer leaves that topic's tests unmarked
    code, unmarked = _selected("-m", f"not ({' or '.join(t for t in TOPICS if t != 'ulysses')})",
                               "tests/test_ulysses.py")
    assert code == 0 and unmarked and all(i.startswith("tests/test_ulysses.py::") for i in unmarked)


LAUNCHED = """
import pytest

@pytest.mark.launcher
def test_starts_torchrun():
    pass

def test_plain():
    pass
"""


@pytest.mark.local
def test_the_tests_that_start_a_launcher_run_only_when_asked(pytester):
    """The default session skips a `launcher` test naming how to run it; --launchers runs it,
    alone with `-m launcher` (as `make test-launchers` does)."""
    from commbench.pytest_plugin import LAUNCHERS_SKIPPED

    pytester.makepyfile(test_launched=LAUNCHED)
    out = pytester.runpytest("-p", "no:cacheprovider", "-rs")
    out.assert_outcomes(passed=1, skipped=1)
    assert LAUNCHERS_SKIPPED in out.stdout.str()
    out = pytester.runpytest("-p", "no:cacheprovider", "--launchers")
    out.assert_outcomes(passed=2)
    out = pytester.runpytest("-p", "no:cacheprovider", "-m", "launcher", "--launchers")
    out.assert_outcomes(passed=1, deselected=1)


QUIET_RANK = """
def test_passes():
    pass

def test_fails_here_alone():
    assert 1 == 2
"""


@pytest.mark.local
def test_a_quiet_rank_names_the_test_it_failed(pytester, monkeypatch):
    """Under a launcher rank 0 alone reports; a test that is not SPMD can fail on another rank
    alone, whose run then ended failed without a word of which test (`make test-2`). That rank
    says it on stderr, one line a test."""
    pytester.makepyfile(test_q=QUIET_RANK)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("COMMBENCH_ALL_RANKS", raising=False)
    out = pytester.runpytest_subprocess("-p", "no:cacheprovider")
    assert out.ret == 1
    err = [line for line in out.stderr.str().splitlines() if line.startswith("commbench: rank")]
    assert err == ["commbench: rank 1: FAILED test_q.py::test_fails_here_alone (call): "
                   "assert 1 == 2"]
    assert "test_passes" not in out.stderr.str() + out.stdout.str()
