"""``make cluster-check``: commbench under Open MPI's mpirun, under Slurm's srun, and across the
nodes of an emulated cluster, each check with a timeout and a teardown of what it started.

    python suites/cluster/check.py [--only openmpi,slurm,emulated]

Needs root (network namespaces, tc, Slurm's daemons, the system's package manager). Prints one
line per check (``PASS``/``FAIL``, its time, and what it saw) and exits 1 when any failed. At
the end nothing it started is left: no daemon, namespace, link or temporary file.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import emulate  # noqa: E402
import openmpi  # noqa: E402
import slurm  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
VENV = Path(sys.executable).parent
SWEEP = ["run", "all_reduce", "--transport", "mpi,gloo", "--algo", "native,ring,hierarchical",
         "-b", "8", "-e", "1M", "-f", "8", "-n", "5", "-w", "1", "--no-write"]
FAILED: list[str] = []


def sh(cmd: list[str], timeout: float) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=ROOT)
    except subprocess.TimeoutExpired as exc:
        out = (exc.stdout or b"").decode(errors="replace") if isinstance(exc.stdout, bytes) \
            else (exc.stdout or "")
        return subprocess.CompletedProcess(cmd, 124, out, f"timed out after {timeout:.0f} s")


def check(name: str, fn: Callable[[], str]) -> None:
    t0 = time.time()
    try:
        detail, ok = fn(), True
    except AssertionError as exc:
        detail, ok = str(exc), False
    mark = "PASS" if ok else "FAIL"
    print(f"{mark} {name} ({time.time() - t0:.0f} s): {detail}", flush=True)
    if not ok:
        FAILED.append(name)


def fail(message: str) -> str:
    raise AssertionError(message)


def expect(r: subprocess.CompletedProcess, what: str) -> str:
    tail = (r.stdout + r.stderr).strip().splitlines()[-3:]
    assert r.returncode == 0, f"{what}: exit {r.returncode}: {' | '.join(tail)}"
    return r.stdout


def info_check(launch: list[str], hosts: dict[str, int], launcher: str,
               bin_dir: Path = VENV) -> str:
    """``commbench info``: the launcher, the world size and, where MPI gathers every rank's
    line, the ranks per host."""
    out = expect(sh(launch + [str(bin_dir / "commbench"), "info"], 180), "commbench info")
    seen_launcher = re.search(r"launcher +: (\S+)", out)
    assert seen_launcher and seen_launcher.group(1) == launcher, f"launcher: {out[-400:]}"
    size = re.search(r"world size : (\d+)", out)
    assert size and int(size.group(1)) == sum(hosts.values()), f"world size: {out[-400:]}"
    seen: dict[str, int] = {}
    for host in re.findall(r"Rank +\d+ Pid +\d+ on +(\S+)", out):
        seen[host] = seen.get(host, 0) + 1
    if sum(seen.values()) > 1:  # every rank's line where MPI gathers them, else rank 0's
        assert seen == hosts, f"ranks per host {seen}, expected {hosts}"
    nodes = re.search(r"# nodes +: (.*)", out)
    return f"{launcher}, {size.group(1)} ranks, {nodes.group(1) if nodes else 'rank 0 only'}"


def foundation_check(launch: list[str], bin_dir: Path = VENV) -> str:
    out = expect(sh(launch + [str(bin_dir / "python"), "-m", "pytest", "-m", "foundation", "-q",
                              "-p", "no:cacheprovider", "-x", "--color=no"], 600),
                 "pytest -m foundation")
    return out.strip().splitlines()[-1]


def sweep_check(launch: list[str], transports: str = "mpi,gloo", bin_dir: Path = VENV) -> str:
    args = [a if a != "mpi,gloo" else transports for a in SWEEP]
    out = expect(sh(launch + [str(bin_dir / "commbench")] + args, 600), "commbench run")
    assert "Out of bounds values : 0 OK" in out, f"#wrong: {out[-600:]}"
    rows = [line for line in out.splitlines() if line.strip().startswith("all_reduce")]
    return f"{len(rows)} rows over {transports}, #wrong 0"


def run_openmpi() -> None:
    bin_dir = openmpi.ensure(VENV.parent)
    launch = openmpi.mpirun(bin_dir, 4)
    host = {os.uname()[1]: 4}
    check("openmpi: mpirun -n 4 commbench info",
          lambda: info_check(launch, host, "openmpi", bin_dir))
    check("openmpi: mpirun -n 4 pytest -m foundation", lambda: foundation_check(launch, bin_dir))
    check("openmpi: mpirun -n 4 commbench run all_reduce",
          lambda: sweep_check(launch, "mpi,gloo", bin_dir))
    check("openmpi: a mismatched MPI is refused in one line", lambda: openmpi.mismatch(bin_dir))
    check("openmpi: commbench's own world of 4 (no launcher), started as root",
          lambda: own_world_check(bin_dir))


def own_world_check(bin_dir: Path) -> str:
    """No launcher: commbench starts its own 4 ranks with Open MPI's mpiexec, on fewer cores,
    as this check's user (root) and without the variables that let Open MPI start as root."""
    assert os.geteuid() == 0, "run as root: the check is of Open MPI's refusal of root"
    env = {k: v for k, v in os.environ.items() if k not in openmpi.ROOT_OK}
    r = subprocess.run([str(bin_dir / "commbench"), *SWEEP, "--np", "4"], env=env,
                       capture_output=True, text=True, timeout=600, cwd=ROOT)
    out = expect(r, "commbench run --np 4")
    assert "Out of bounds values : 0 OK" in out, f"#wrong: {out[-600:]}"
    rows = [line for line in out.splitlines() if line.strip().startswith("all_reduce")]
    assert any(" mpi " in line for line in rows), f"no MPI row: {out[-600:]}"
    return f"{len(rows)} rows over mpi and gloo, #wrong 0"


def run_slurm() -> None:
    with slurm.cluster() as launch:
        host = {os.uname()[1]: 4}
        # --mpi=pmi2: MPI starts from Slurm's PMI server (MPICH reads PMI_RANK)
        check("slurm: srun -n 4 --mpi=pmi2 commbench info",
              lambda: info_check(launch, host, "mpich"))
        check("slurm: srun -n 4 pytest -m foundation", lambda: foundation_check(launch))
        check("slurm: srun -n 4 commbench run all_reduce", lambda: sweep_check(launch))
        # --mpi=none: no MPI; gloo's rendezvous from SLURM_JOB_NODELIST and SLURM_JOB_ID
        plain = [a if a != "--mpi=pmi2" else "--mpi=none" for a in launch]
        check("slurm: srun -n 4 --mpi=none commbench info",
              lambda: info_check(plain, host, "slurm"))
        check("slurm: srun --mpi=none, gloo's rendezvous from Slurm's variables",
              lambda: sweep_check(plain, "gloo"))


def run_emulated() -> None:
    emulate.up()
    try:
        emulate.shape(1.0)

        def info() -> str:
            out = expect(sh(emulate.launch([str(VENV / "commbench"), "info"]), 180), "info")
            assert "launcher   : mpich" in out, f"launcher: {out[-500:]}"
            assert "# nodes      : 2 x 2 (node0: 0-1; node1: 2-3); the hierarchical all-reduce " \
                   "runs on these nodes (2 ranks each)" in out, f"node layout: {out[-500:]}"
            return "2 x 2 (node0: 0-1; node1: 2-3), the hierarchical all-reduce on them"

        def sweep() -> str:
            before = emulate.link_bytes()
            out = expect(sh(emulate.launch([str(VENV / "commbench")] + SWEEP), 600), "run")
            assert "Out of bounds values : 0 OK" in out, f"#wrong: {out[-600:]}"
            sent = [a - b for a, b in zip(emulate.link_bytes(), before, strict=True)]
            assert min(sent) > 1 << 20, f"the link carried {sent} bytes: traffic bypassed it"
            return f"#wrong 0; the link carried {sent[0]:,} and {sent[1]:,} bytes"

        def three() -> str:
            out = expect(sh(emulate.launch([str(VENV / "commbench"), "info"], per_node=3), 180),
                         "info")
            assert "2 x 3 (node0: 0-2; node1: 3-5); the hierarchical all-reduce runs on these " \
                   "nodes (3 ranks each)" in out, f"node layout: {out[-500:]}"
            out = expect(sh(emulate.launch([str(VENV / "commbench"), "run", "all_reduce",
                                            "--algo", "hierarchical", "-b", "1M", "-e", "1M",
                                            "-n", "3", "-w", "0", "--no-write"], per_node=3),
                            300), "run")
            rows = [x.split() for x in out.splitlines() if x.strip().startswith("all_reduce")]
            assert rows and all(r[-3] == "0" and r[-2] == r[-1] for r in rows), out[-800:]
            return f"2 x 3: {len(rows)} rows, #wrong 0, bytes sent = those of nodes of 3"

        check("emulated: 2 nodes x 2 ranks, node layout", info)
        check("emulated: all_reduce across the 1 Gbit/s link", sweep)
        check("emulated: 2 nodes x 3 ranks, the hierarchical all-reduce on nodes of 3", three)
    finally:
        emulate.down()


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--only", default="openmpi,slurm,emulated")
    a = p.parse_args()
    if os.geteuid() != 0:
        print("cluster-check needs root (namespaces, tc, Slurm's daemons)", file=sys.stderr)
        return 2
    parts = {"openmpi": run_openmpi, "slurm": run_slurm, "emulated": run_emulated}
    for name in a.only.split(","):
        try:
            parts[name]()
        except Exception as exc:  # a part that cannot start fails, the others still run
            check(f"{name}: set-up", lambda exc=exc: fail(f"{type(exc).__name__}: {exc}"))
    left = emulate.leftovers() + slurm.leftovers()
    check("nothing left behind", lambda: fail(f"left: {left}") if left else
          "no daemon, namespace, link or file of the checks remains")
    print(f"# cluster-check: {'FAILED: ' + ', '.join(FAILED) if FAILED else 'all passed'}")
    return 1 if FAILED else 0


if __name__ == "__main__":
    raise SystemExit(main())
