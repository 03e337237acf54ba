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


# -- crash logs and the folders of killed drivers (commbench.runtime.crashlog) -------------------

def _mode(path) -> int:
    return stat.S_IMODE(os.lstat(path).st_mode)


def test_crash_logs_go_to_the_users_private_state_folder(tmp_path, monkeypatch):
    from commbench.runtime import crashlog

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "state"))
    assert crashlog.log_dir() == str(tmp_path / "state" / "commbench" / "logs")
    log = crashlog.write_log("Traceback: secret\n")
    assert os.path.dirname(log) == crashlog.log_dir()
    assert open(log).read() == "Traceback: secret\n"
    assert _mode(log) == 0o600 and _mode(crashlog.log_dir()) == 0o700
    # a relative or empty XDG_STATE_HOME is ignored, as the base directory rules say
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for value in ("relative/state", ""):
        monkeypatch.setenv("XDG_STATE_HOME", value)
        assert crashlog.log_dir() == str(tmp_path / "home" / ".local" / "state" / "commbench"
                                         / "logs")


def test_a_link_planted_at_a_logs_name_is_never_followed(tmp_path, monkeypatch):
    from commbench.runtime import crashlog

    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    logs = tmp_path / "logs"
    logs.mkdir(mode=0o700)
    planted = ["commbench-planted-1.log", "commbench-planted-2.log"]
    for name in planted:
        os.symlink(victim, logs / name)
    names = iter([*planted, "commbench-fresh.log"])
    monkeypatch.setattr(crashlog, "_name", lambda: next(names))
    log = crashlog.write_log("trace\n", directory=str(logs))
    assert log == str(logs / "commbench-fresh.log") and open(log).read() == "trace\n"
    assert victim.read_text() == "precious\n"
    # every name taken: no log at all, the victim untouched
    monkeypatch.setattr(crashlog, "_name", lambda: planted[0])
    with pytest.raises(FileExistsError):
        crashlog.write_log("trace\n", directory=str(logs))
    assert victim.read_text() == "precious\n"


def test_the_log_folder_must_be_the_users_own_real_folder(tmp_path):
    from commbench.runtime import crashlog

    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    os.symlink(elsewhere, tmp_path / "logs")
    with pytest.raises(OSError):
        crashlog.write_log("trace\n", directory=str(tmp_path / "logs"))
    assert os.listdir(elsewhere) == []
    loose = tmp_path / "loose"
    loose.mkdir(mode=0o755)
    os.chmod(loose, 0o777)
    crashlog.write_log("trace\n", directory=str(loose))
    assert _mode(loose) == 0o700  # taken down to the owner's
    if os.getuid() == 0:  # root can give a folder away: another user's folder is refused
        theirs = tmp_path / "theirs"
        theirs.mkdir(mode=0o700)
        os.chown(theirs, 12345, 12345)
        with pytest.raises(PermissionError, match="owned by uid 12345"):
            crashlog.write_log("trace\n", directory=str(theirs))


def test_only_the_newest_logs_are_kept(tmp_path):
    from commbench.runtime import crashlog

    for i in range(crashlog.KEEP + 5):
        path = tmp_path / f"commbench-old-{i:02d}.log"
        path.write_text("old\n")
        os.utime(path, ns=(i * 10**9, i * 10**9))
    (tmp_path / "notes.txt").write_text("mine\n")
    os.symlink(tmp_path / "notes.txt", tmp_path / "commbench-link.log")
    new = crashlog.write_log("new\n", directory=str(tmp_path))
    kept = sorted(n for n in os.listdir(tmp_path) if n.startswith("commbench-old-"))
    assert kept == [f"commbench-old-{i:02d}.log" for i in range(6, crashlog.KEEP + 5)]
    assert os.path.exists(new) and (tmp_path / "notes.txt").exists()
    assert os.path.islink(tmp_path / "commbench-link.log")  # not a log of ours: left alone


def test_a_failure_line_names_its_private_log(tmp_path, monkeypatch, capsys):
    from commbench.cli.main import _failed

    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path))
    assert _failed(RuntimeError("boom"), "run", debug=False) == 3
    err = capsys.readouterr().err
    log = err.rsplit("traceback in ", 1)[1].strip()
    assert log.startswith(str(tmp_path / "commbench" / "logs")) and _mode(log) == 0o600
    assert "RuntimeError: boom" in open(log).read()
    # no folder to be had: the line says so instead of a path
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "a-file"))
    (tmp_path / "a-file").write_text("a file, not a folder\n")
    assert _failed(RuntimeError("boom"), "run", debug=False) == 3
    assert "traceback in (no log: " in capsys.readouterr().err


def _dead_pid() -> int:
    import subprocess
    import sys

    p = subprocess.Popen([sys.executable, "-c", "pass"])
    p.wait()
    return p.pid


def test_the_folders_of_killed_drivers_are_removed_and_no_others(tmp_path):
    from commbench.runtime import crashlog

    dead = _dead_pid()
    stale = tmp_path / f"{crashlog.WORLD_PREFIX}{dead}-abc"
    live = tmp_path / f"{crashlog.WORLD_PREFIX}{os.getppid()}-abc"
    unnamed = tmp_path / f"{crashlog.WORLD_PREFIX}abc"
    for d in (stale, live, unnamed):
        d.mkdir()
        (d / "store").write_text("")
    target = tmp_path / "kept"
    target.mkdir()
    os.symlink(target, tmp_path / f"{crashlog.WORLD_PREFIX}{dead}-link")
    assert crashlog.remove_stale_worlds(str(tmp_path)) == [str(stale)]
    assert not stale.exists() and live.exists() and unnamed.exists() and target.exists()
    if os.getuid() == 0:
        theirs = tmp_path / f"{crashlog.WORLD_PREFIX}{dead}-theirs"
        theirs.mkdir()
        os.chown(theirs, 12345, 12345)
        assert crashlog.remove_stale_worlds(str(tmp_path)) == [] and theirs.exists()


@pytest.mark.local
def test_a_new_local_world_removes_the_folder_a_killed_driver_left(tmp_path, monkeypatch):
    import signal
    import subprocess
    import sys
    import tempfile

    from commbench.runtime import crashlog

    monkeypatch.setenv("TMPDIR", str(tmp_path))
    monkeypatch.setattr(tempfile, "tempdir", None)  # read TMPDIR again
    code = ("import os, sys, time; from commbench.world.local.world import LocalWorld; "
            "w = LocalWorld(1, launch='plain').start(); print(w._dir, flush=True); time.sleep(60)")
    driver = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
    left = driver.stdout.readline().strip()
    assert os.path.basename(left).startswith(f"{crashlog.WORLD_PREFIX}{driver.pid}-")
    driver.send_signal(signal.SIGKILL)
    driver.wait()
    assert os.path.isdir(left)  # SIGKILL: the driver could not remove it
    from commbench.world.local.world import LocalWorld

    world = LocalWorld(1, launch="plain").start()
    try:
        assert not os.path.exists(left)
        assert os.path.dirname(world._dir) == str(tmp_path)
    finally:
        world.close()
    monkeypatch.undo()
    tempfile.tempdir = None
