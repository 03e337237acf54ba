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
