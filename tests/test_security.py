"""Nobody else can reach a rank: a local world listens on loopback only, keeps its rendezvous in
a file of its own 0700 folder, and nothing a rank reads from a store is unpickled."""

from __future__ import annotations

import os
import pickle
import stat

import pytest

pytestmark = pytest.mark.foundation


def _listening() -> list[str]:
    """The local addresses of this process's listening TCP sockets."""
    inodes = set()
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith("socket:["):
            inodes.add(target[8:-1])
    found = []
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        with open(path) as f:
            for line in f.read().splitlines()[1:]:
                fields = line.split()
                if fields[3] == "0A" and fields[9] in inodes:  # 0A: LISTEN
                    found.append(fields[1].split(":")[0])
    return found


def _loopback(hex_addr: str) -> bool:
    if len(hex_addr) == 8:  # IPv4, little-endian words: 127.x.x.x ends in 7F
        return hex_addr[-2:] == "7F"
    return hex_addr in ("00000000000000000000000001000000", "0000000000000000FFFF00000100007F")


def _sockets_and_store(ctx):
    store = os.environ.get("COMMBENCH_STORE_PATH", "")
    return _listening(), store


@pytest.mark.local  # a launcher's own sockets are the launcher's (docs/security.md)
@pytest.mark.skipif(not os.path.exists("/proc/net/tcp"), reason="needs Linux's /proc/net")
@pytest.mark.parametrize("launch", ["plain", "mpi"])
def test_a_local_world_listens_on_loopback_only(launch):
    from commbench.world.local import LocalWorld
    from commbench.world.local.spawn import mpi_usable

    if launch == "mpi" and not mpi_usable():
        pytest.skip("needs mpiexec")
    with LocalWorld(2, launch=launch) as world:
        outs = world.run(_sockets_and_store)
        folder = world._dir
        assert stat.S_IMODE(os.stat(folder).st_mode) == 0o700  # no other user gets in
    for addrs, store in outs:
        assert addrs, "a rank with no listening socket: the check would see nothing"
        assert all(_loopback(a) for a in addrs), addrs
        assert store == os.path.join(folder, "store")


def test_the_loopback_check_sees_a_socket_on_every_interface():
    """Negative: a socket bound to all addresses is caught by the same check."""
    import socket

    with socket.socket() as s:
        s.bind(("0.0.0.0", 0))
        s.listen()
        addrs = _listening()
        assert addrs and not all(_loopback(a) for a in addrs)


def test_a_hang_status_read_from_a_store_is_never_unpickled():
    from commbench.world.spmd import _status

    assert _status(b'["in op", 3, "all_reduce on world"]') == ("in op", 3, "all_reduce on world")

    class Boom:
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    for hostile in (pickle.dumps(Boom()), b'{"a": 1}', b'["x", "y", "z"]', b"\xff\xfe"):
        with pytest.raises(ValueError):
            _status(hostile)
