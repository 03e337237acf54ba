"""pytest plugin: topic markers, hypothesis profiles and the ``world`` fixture.

Two ways to run the same test files:

* no launcher: ``pytest``. The session spawns a local world per world size on first use and keeps
  it to the end (``--world-sizes``, ``--world-launch``); tests send SPMD functions to its ranks and
  hypothesis runs once, in this process.
* under a launcher: ``mpiexec -n 4 python -m pytest -m tp`` (or torchrun, srun). Every rank runs
  pytest; ``world`` is the launcher's world and each test runs once, at that size. Hypothesis draws
  the same examples on every rank (``derandomize``) and every rank sees every rank's outcome, so all
  reach one verdict and shrink in step.

``@pytest.mark.world(sizes=(1, 2, 3, 4), min_size=1)`` says which sizes a test runs at locally; under
a launcher it runs at the launcher's size if that is at least ``min_size`` and, where ``sizes`` is
given, one of them; otherwise it is skipped with the reason.

``@pytest.mark.launcher`` marks the tests that start ``torchrun`` or ``mpiexec`` themselves, as a
user launches: each of their ranks imports torch afresh, 5 to 9 s a test. They run with
``--launchers`` (``make test-launchers``, which CI runs), and are skipped, with that reason,
otherwise.
"""

from __future__ import annotations

import hashlib
import os
import sys

import pytest

from commbench.runtime.launch import detect
from commbench.verdict import collecting, unread
from commbench.world.local import LocalWorld, spawn, zygote

TOPICS = {
    "foundation": "launch detection, local world, comm layer, ledger",
    "collectives": "standard collectives through the comm layer",
    "ring": "ring algorithms built from send/recv",
    "ddp": "data parallelism (DDP)",
    "zero": "ZeRO-1/2/3",
    "tp": "Megatron tensor parallelism",
    "sp": "Megatron sequence parallelism",
    "cp": "context parallelism (ring attention)",
    "ulysses": "DeepSpeed-Ulysses all-to-all",
    "moe": "MoE gating, capacity, dispatch/combine",
    "ep": "expert parallelism",
    "pp": "pipeline schedules",
    "model": "cost model and topologies",
    "bench": "benchmarks (suites/)",
    "faults": "fault injection: hangs, dead ranks, bad input",
    "traces": "a job's own traces: analyze and replay",
    "nccltests": "nccl-tests / rccl-tests logs: import, beside the model, calibrate",
    "gpu": "needs a CUDA device; skipped without one",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    g = parser.getgroup("commbench")
    g.addoption("--world-sizes", default=os.environ.get("COMMBENCH_WORLD_SIZES", "1,2,4"),
                help="world sizes for tests that take the `world` fixture (local runs only)")
    g.addoption("--world-launch", default=os.environ.get("COMMBENCH_WORLD_LAUNCH", "auto"),
                choices=("auto", "mpi", "plain"),
                help="how the local world starts its ranks: mpiexec (gloo+MPI) or plain (gloo)")
    g.addoption("--world-timeout", type=float, default=120.0,
                help="seconds before a call on the world fails as a hang")
    g.addoption("--no-debug-collectives", action="store_true",
                help="skip the check that ranks agree on each collective before it starts")
    g.addoption("--launchers", action="store_true",
                default=os.environ.get("COMMBENCH_LAUNCHERS") == "1",
                help="also run the tests that start torchrun or mpiexec themselves (marked "
                     "`launcher`, 5 to 9 s each; `make test-launchers`; or COMMBENCH_LAUNCHERS=1)")


def _launched() -> bool:
    return detect().launched and not os.environ.get("COMMBENCH_WORKER")


def pytest_configure(config: pytest.Config) -> None:
    for name, text in TOPICS.items():
        config.addinivalue_line("markers", f"{name}: {text}")
    config.addinivalue_line("markers", "world(sizes=None, min_size=1): world sizes for a test")
    config.addinivalue_line("markers", "local: tests of the local world itself; skipped under a "
                            "launcher, where every rank would start worlds of its own")
    config.addinivalue_line("markers", "launcher: starts torchrun or mpiexec itself, a user's own "
                            "launch; run with --launchers (make test-launchers)")
    # lazy: imports hypothesis
    from hypothesis import HealthCheck, settings

    common = dict(deadline=None, print_blob=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
    if not config.getoption("no_debug_collectives"):
        os.environ["COMMBENCH_DEBUG"] = "1"  # read by every rank's Context (commbench.runtime.debug)
    launched = _launched()
    if launched:  # every rank must draw the same examples and keep no per-rank database
        common.update(derandomize=True, database=None)
    settings.register_profile("commbench", max_examples=15, **common)
    settings.register_profile("thorough", max_examples=300, **common)
    if not config.getoption("hypothesis_profile", None):
        settings.load_profile(os.environ.get("COMMBENCH_HYPOTHESIS_PROFILE", "commbench"))
    seed = config.getoption("hypothesis_seed", None)
    if seed is None and not launched:  # one seed for the session, printed, so any failure replays
        seed = int.from_bytes(os.urandom(4), "little")
    config._commbench_seed = seed
    config._commbench_pool = _Pool(config, launched)
    if launched:
        if detect().rank != 0 and os.environ.get("COMMBENCH_ALL_RANKS") != "1":
            config.option.verbose = -1
            config._commbench_quiet = True  # see pytest_configure below (trylast)


def _share_zygote() -> None:
    """One fork server (:mod:`commbench.world.local.zygote`) for the session's worlds and for
    those of every command a test starts, named to them by ``COMMBENCH_ZYGOTE``: each rank of
    each would otherwise import torch for itself. Started once the tests are collected, where
    one of them takes a world or starts its own (a session of other tests starts none); it
    imports torch while the first tests run."""

    if zygote.supported() and not os.environ.get(zygote.ENV):
        z = zygote.own(spawn.worker_env(b""))
        if z is not None:
            os.environ[zygote.ENV] = z.path


@pytest.hookimpl(tryfirst=True)
def pytest_sessionstart(session: pytest.Session) -> None:
    """Under a launcher one report, rank 0's: every rank reaches the same verdicts (each sees
    every rank's outcome), so the others run without a terminal reporter (their stderr stays;
    COMMBENCH_ALL_RANKS=1 keeps every rank's report)."""
    config = session.config
    if getattr(config, "_commbench_quiet", False):
        reporter = config.pluginmanager.getplugin("terminalreporter")
        if reporter is not None:
            config.pluginmanager.unregister(reporter)


def pytest_report_header(config: pytest.Config) -> str | None:
    seed = getattr(config, "_commbench_seed", None)
    if seed is None:
        if getattr(config, "_commbench_pool", None) is not None and config._commbench_pool.launched:
            return ("commbench: hypothesis derandomized under the launcher (every rank draws "
                    "the same examples; --hypothesis-seed=N picks others)")
        return None
    return (f"commbench: hypothesis seed {seed}, hashed with each test's node id (a failure "
            "prints the command that replays it)")


def seed_for(run_seed: int | str, nodeid: str) -> int:
    """The Hypothesis seed of one test: the run's seed and the test's node id (which names its
    world size and parameters) hashed together, so that every test and every world size of a
    property draws its own examples, and the run's one printed seed still replays any of them."""

    digest = hashlib.sha256(f"{run_seed}:{nodeid}".encode()).digest()
    return int.from_bytes(digest[:4], "little")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_call(item: pytest.Item):
    """Each test's hypothesis seed; and a test that leaves a judge's verdict unread fails
    (:mod:`commbench.verdict`): it would pass by doing nothing."""

    seed = getattr(item.config, "_commbench_seed", None)
    derandomized = seed is None or item.config._commbench_pool.launched
    with collecting() as made:
        if derandomized:
            outcome = yield
        else:
            # lazy: imports hypothesis
            from hypothesis import core

            saved = core.global_force_seed
            core.global_force_seed = seed_for(seed, item.nodeid)
            try:
                outcome = yield
            finally:
                core.global_force_seed = saved
    left = unread(made)
    if left and outcome.excinfo is None:
        raise AssertionError(f"{len(left)} verdict(s) never read: {', '.join(sorted(set(left)))}"
                             " (assert on what the judge returns)")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    outcome = yield
    report = outcome.get_result()
    if report.failed and getattr(item.config, "_commbench_quiet", False):
        # a quiet rank's failure of a test that is not SPMD (rank 0 passed it): one line on
        # stderr, else the launcher's run ends failed with no word of which test
        said = next((line[1:].strip() for line in report.longreprtext.splitlines()
                     if line.startswith("E ")), "")
        print(f"commbench: rank {detect().rank}: FAILED {item.nodeid} ({report.when}): "
              f"{said[:200]}", file=sys.stderr, flush=True)
    seed = getattr(item.config, "_commbench_seed", None)
    if report.failed and call.when == "call" and hasattr(getattr(item, "obj", None), "hypothesis"):
        how = f"--hypothesis-seed={seed}" if seed is not None else "(derandomized: as it is)"
        report.sections.append(("commbench replay",
                                f"replay: python -m pytest '{item.nodeid}' {how}"))


def pytest_unconfigure(config: pytest.Config) -> None:
    pool = getattr(config, "_commbench_pool", None)
    if pool is not None:
        pool.close()


LAUNCHERS_SKIPPED = ("starts torchrun or mpiexec itself (each rank imports torch afresh): "
                     "`make test-launchers` or `pytest --launchers` runs it")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if not config.getoption("launchers"):
        for item in items:
            if item.get_closest_marker("launcher"):
                item.add_marker(pytest.mark.skip(reason=LAUNCHERS_SKIPPED))
    if not config._commbench_pool.launched:
        if not os.environ.get("COMMBENCH_WORKER") and any(
                "world" in getattr(item, "fixturenames", ()) or item.get_closest_marker("local")
                for item in items):
            _share_zygote()  # only for a session that starts ranks
        return
    skip = pytest.mark.skip(reason="tests the local world itself; under a launcher the ranks are "
                                   "the launcher's")
    for item in items:
        if item.get_closest_marker("local"):
            item.add_marker(skip)


def _sizes(config: pytest.Config) -> list[int]:
    raw = config.getoption("world_sizes")
    try:
        sizes = [int(s) for s in raw.split(",") if s.strip()]
    except ValueError:
        raise pytest.UsageError(f"--world-sizes={raw!r}: a comma-separated list of integers") from None
    if not sizes or min(sizes) < 1:
        raise pytest.UsageError(f"--world-sizes={raw!r}: sizes must be >= 1")
    return sizes


def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
    if "world" not in metafunc.fixturenames:
        return
    marker = metafunc.definition.get_closest_marker("world")
    kw = marker.kwargs if marker else {}
    min_size = kw.get("min_size", 1)
    pool: _Pool = metafunc.config._commbench_pool
    if pool.launched:
        sizes = [pool.launcher_size()]
        written = kw.get("sizes")
        why = (f"needs a world of at least {min_size} ranks, the launcher gave {sizes[0]}"
               if sizes[0] < min_size else
               f"written for worlds of {list(written)} ranks, the launcher gave {sizes[0]}"
               if written and sizes[0] not in written else "")
        if why:
            metafunc.parametrize("world", [pytest.param(0, marks=pytest.mark.skip(reason=why))],
                                 indirect=True, ids=["skipped"])
            return
    else:
        sizes = [s for s in (kw.get("sizes") or _sizes(metafunc.config)) if s >= min_size]
    metafunc.parametrize("world", sizes, indirect=True, ids=[f"n{s}" for s in sizes],
                         scope="session")


@pytest.fixture(scope="session")
def world(request: pytest.FixtureRequest):
    """The world of ``request.param`` ranks: a kept local world, or the launcher's world."""
    return request.config._commbench_pool.get(request.param)


@pytest.fixture(scope="session")
def world_of(request: pytest.FixtureRequest):
    """``world_of(n)``: the world of ``n`` ranks (kept locally), or under a launcher its world
    when it has ``n`` ranks; a test asking for another size is skipped with the reason."""
    pool = request.config._commbench_pool

    def get(n: int):
        if pool.launched and pool.launcher_size() != n:
            pytest.skip(f"written for {n} ranks; the launcher started {pool.launcher_size()}")
        return pool.get(n)

    return get


class _Pool:
    """One world per size for the whole session (spawning 4 torch ranks costs seconds)."""

    def __init__(self, config: pytest.Config, launched: bool) -> None:
        self.config, self.launched = config, launched
        self._worlds: dict[int, object] = {}
        self._launcher_world = None

    def launcher_size(self) -> int:
        return detect().size

    def get(self, size: int):
        if self.launched:
            if self._launcher_world is None:
                # lazy: imports torch
                from commbench.world.context import Context

                # lazy: imports torch
                from commbench.world.spmd import LauncherWorld

                self._launcher_world = LauncherWorld(
                    Context.from_launcher(), timeout_s=self.config.getoption("world_timeout"))
            return self._launcher_world

        w = self._worlds.get(size)
        if w is None:
            w = LocalWorld(size, launch=self.config.getoption("world_launch"),
                           timeout_s=self.config.getoption("world_timeout"))
            self._worlds[size] = w
        return w.start()

    def close(self) -> None:
        for w in self._worlds.values():
            w.close()
        self._worlds.clear()
        if self._launcher_world is not None:
            self._launcher_world.close()
