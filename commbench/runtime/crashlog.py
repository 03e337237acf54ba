"""Private crash logs, and the local worlds' folders that a killed driver left behind.

A failure's traceback carries paths, host names and the environment, so it is kept where only its
user can read it: ``$XDG_STATE_HOME/commbench/logs`` (an absolute ``XDG_STATE_HOME``, as the XDG
base directory rules say), else ``~/.local/state/commbench/logs``. The folder is mode 0700 and
must be this user's own real folder (a symlink or another user's folder is refused). Each log is
created new (``O_CREAT | O_EXCL | O_NOFOLLOW``, relative to the folder's own descriptor) with mode
0600 and a name no other user can predict; a name that exists, or a link planted there, is never
opened. The newest :data:`KEEP` logs are kept.

A local world's folder (``commbench-world-<pid>-*`` in the temporary directory) is removed when
the world closes; a driver killed by SIGKILL cannot, so the next local world removes this user's
folders whose creating process no longer exists.
"""

from __future__ import annotations

import datetime
import os
import secrets
import shutil
import stat
import tempfile

__all__ = ["KEEP", "WORLD_PREFIX", "log_dir", "remove_stale_worlds", "world_prefix", "write_log"]

KEEP = 20
WORLD_PREFIX = "commbench-world-"
_LOG_PREFIX = "commbench-"
_TRIES = 8


def log_dir() -> str:
    """Where this user's crash logs go (not created here)."""
    state = os.environ.get("XDG_STATE_HOME", "")
    if not os.path.isabs(state):  # unset, empty or relative: the rules say ignore it
        state = os.path.join(os.path.expanduser("~"), ".local", "state")
    return os.path.join(state, "commbench", "logs")


def _private_dir(path: str) -> int:
    """Make ``path`` (and its parents, 0700) and open it; refuse it unless it is this user's own
    real folder, and take its mode down to 0700. Returns a descriptor of the folder."""
    os.makedirs(path, mode=0o700, exist_ok=True)
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        st = os.fstat(fd)
        if st.st_uid != os.getuid():
            raise PermissionError(f"{path}: owned by uid {st.st_uid}, not this user "
                                  f"({os.getuid()})")
        if stat.S_IMODE(st.st_mode) & 0o077:
            os.fchmod(fd, 0o700)
        return fd
    except BaseException:
        os.close(fd)
        raise


def write_log(text: str, *, directory: str | None = None) -> str:
    """Write ``text`` to a new private log and return its path; keeps the newest :data:`KEEP`."""
    directory = directory or log_dir()
    dfd = _private_dir(directory)
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
    try:
        for attempt in range(_TRIES):  # a name that exists is never opened: another is drawn
            name = _name()
            try:
                fd = os.open(name, flags, 0o600, dir_fd=dfd)
                break
            except FileExistsError:
                if attempt == _TRIES - 1:
                    raise
        with os.fdopen(fd, "w") as f:
            f.write(text)
        _prune(dfd)
    finally:
        os.close(dfd)
    return os.path.join(directory, name)


def _name() -> str:
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return f"{_LOG_PREFIX}{stamp}-{os.getpid()}-{secrets.token_hex(8)}.log"


def _prune(dfd: int) -> None:
    """Remove all but the newest :data:`KEEP` regular log files (newest by time, then name)."""
    logs = []
    for name in os.listdir(dfd):
        if not (name.startswith(_LOG_PREFIX) and name.endswith(".log")):
            continue
        try:
            st = os.stat(name, dir_fd=dfd, follow_symlinks=False)
        except FileNotFoundError:
            continue
        if stat.S_ISREG(st.st_mode):
            logs.append((st.st_mtime_ns, name))
    for _, name in sorted(logs, reverse=True)[KEEP:]:
        try:
            os.unlink(name, dir_fd=dfd)
        except FileNotFoundError:
            pass


def world_prefix() -> str:
    """The prefix of a new local world's folder: it names the process that makes it."""
    return f"{WORLD_PREFIX}{os.getpid()}-"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another user's process: alive
        return True
    return True


def remove_stale_worlds(tmp: str | None = None) -> list[str]:
    """Remove this user's local-world folders whose creating process no longer exists; returns
    the removed paths. Folders of other users, of live processes, links and names without a pid
    are left alone."""
    tmp = tmp or tempfile.gettempdir()
    removed = []
    try:
        names = os.listdir(tmp)
    except OSError:
        return removed
    for name in names:
        if not name.startswith(WORLD_PREFIX):
            continue
        pid = name[len(WORLD_PREFIX):].split("-", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        path = os.path.join(tmp, name)
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            continue
        if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or _alive(int(pid)):
            continue
        shutil.rmtree(path, ignore_errors=True)
        removed.append(path)
    return removed
