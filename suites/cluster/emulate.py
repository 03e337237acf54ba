"""An emulated cluster on one Linux host: "nodes" that are network namespaces joined by a veth
link shaped with ``tc``'s token bucket filter, and MPICH's ``mpiexec`` spanning them.

Node k is the namespace ``cbnodek`` with the host name ``nodek`` (its own UTS, IPC and /dev/shm,
set by ``nsexec`` for every process started there) and the address ``10.77.0.(k+1)`` on its end
of the link. Two nodes only: one veth pair is one full-duplex link, each direction shaped to the
same rate. The ranks of one node talk over loopback and shared memory, unshaped.

Needs root. Everything it makes is named ``cbnode*`` and removed by :func:`down`, which is safe
to call at any time (also when nothing is up).
"""

from __future__ import annotations

import os
import shlex
import subprocess
from pathlib import Path

__all__ = ["NODES", "down", "hosts", "launch", "shape", "up"]

HERE = Path(__file__).resolve().parent
NSEXEC = HERE / "nsexec"
NODES = ("node0", "node1")
SUBNET = "10.77.0"
NETNS_ETC = Path("/etc/netns")


def _ns(node: str) -> str:
    return f"cb{node}"


def _ip(k: int) -> str:
    return f"{SUBNET}.{k + 1}"


def _run(*cmd: str, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, check=check, capture_output=True, text=True)


def up() -> None:
    """Both nodes, the link between them (unshaped) and their /etc/hosts."""
    if os.geteuid() != 0:
        raise SystemExit("the emulated cluster needs root (network namespaces, tc)")
    down()
    for node in NODES:
        _run("ip", "netns", "add", _ns(node))
        etc = NETNS_ETC / _ns(node)
        etc.mkdir(parents=True, exist_ok=True)
        (etc / "hosts").write_text("127.0.0.1 localhost\n" + "".join(
            f"{_ip(j)} {n}\n" for j, n in enumerate(NODES)))
    a, b = (f"cbv{k}" for k in range(2))
    _run("ip", "link", "add", a, "type", "veth", "peer", "name", b)
    for k, (node, dev) in enumerate(zip(NODES, (a, b), strict=True)):
        _run("ip", "link", "set", dev, "netns", _ns(node))
        _run("ip", "-n", _ns(node), "addr", "add", f"{_ip(k)}/24", "dev", dev)
        _run("ip", "-n", _ns(node), "link", "set", dev, "up")
        _run("ip", "-n", _ns(node), "link", "set", "lo", "up")


def shape(gbit: float | None) -> None:
    """Both directions of the link at ``gbit`` Gbit/s (token bucket), or unshaped (None).

    The bucket holds 4 ms at the rate (at least 256 KiB): more than one segment of the veth's
    64 KiB offloads, so the rate holds for any message size."""
    for k, node in enumerate(NODES):
        dev = f"cbv{k}"
        _run("ip", "netns", "exec", _ns(node), "tc", "qdisc", "del", "dev", dev, "root",
             check=False)
        if gbit is not None:
            burst = max(256 * 1024, int(gbit * 1e9 / 8 * 0.004))
            _run("ip", "netns", "exec", _ns(node), "tc", "qdisc", "add", "dev", dev, "root",
                 "tbf", "rate", f"{int(gbit * 1000)}mbit", "burst", str(burst),
                 "latency", "200ms")


def link_bytes() -> list[int]:
    """Bytes sent so far by each node's end of the link."""
    return [int(_run("ip", "netns", "exec", _ns(node), "cat",
                     f"/sys/class/net/cbv{k}/statistics/tx_bytes").stdout)
            for k, node in enumerate(NODES)]


def hosts(per_node: int) -> str:
    return ",".join(f"{n}:{per_node}" for n in NODES)


def launch(args: list[str], per_node: int = 2, env: dict[str, str] | None = None) -> list[str]:
    """The command that runs ``args`` on every rank of the emulated cluster: ``mpiexec`` started
    on node0, reaching node1 through ``nsexec``. Inter-node MPI traffic over TCP (libfabric's
    tcp provider), so that it crosses the shaped link."""
    from commbench.world.local import find_mpiexec

    mpiexec = find_mpiexec()
    if mpiexec is None:
        raise SystemExit("no mpiexec: install the mpich wheel (pip install mpich)")
    genv = {"FI_PROVIDER": "tcp", **(env or {})}
    inner = [mpiexec, "-launcher", "ssh", "-launcher-exec", str(NSEXEC),
             "-hosts", hosts(per_node), "-n", str(per_node * len(NODES))]
    for k, v in genv.items():
        inner += ["-genv", k, v]
    return [str(NSEXEC), NODES[0], shlex.join(inner + args)]


def down() -> None:
    """Kill what runs in the nodes, remove them, their link and their /etc/netns files."""
    for node in NODES:
        ns = _ns(node)
        pids = _run("ip", "netns", "pids", ns, check=False).stdout.split()
        if pids:
            _run("kill", "-9", *pids, check=False)
        _run("ip", "netns", "del", ns, check=False)
        etc = NETNS_ETC / ns
        if etc.exists():
            for f in etc.iterdir():
                f.unlink()
            etc.rmdir()
    if NETNS_ETC.is_dir() and not any(NETNS_ETC.iterdir()):
        NETNS_ETC.rmdir()
    _run("ip", "link", "del", "cbv0", check=False)


def leftovers() -> list[str]:
    """What :func:`down` should have removed and is still there."""
    left = [ns for ns in _run("ip", "netns", "list", check=False).stdout.split()
            if ns.startswith("cbnode")]
    left += [str(p) for p in NETNS_ETC.glob("cbnode*")]
    if _run("ip", "link", "show", "cbv0", check=False).returncode == 0:
        left.append("link cbv0")
    return left
