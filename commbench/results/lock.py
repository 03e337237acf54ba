"""One run at a time per results folder: two runs writing into one folder would interleave their
rows and the last writer would win. A run holds ``<folder>/.commbench.lock`` (an flock, released
by the kernel when the process ends, even killed) with its pid inside."""

from __future__ import annotations

import fcntl
import os
from contextlib import contextmanager

__all__ = ["FolderBusy", "folder_lock"]

NAME = ".commbench.lock"


class FolderBusy(Exception):
    """Another run holds the folder's lock."""


def _acquire(folder: str) -> tuple[int, str]:
    """Take ``folder``'s lock and write this process's pid in it: (its descriptor, its path);
    :class:`FolderBusy` naming the holder's pid when another process holds it. A plain
    function, apart from the context manager, so that ``make mutate`` reaches it."""
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, NAME)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 32, 0).decode(errors="replace").strip() or "unknown"
            raise FolderBusy(f"{folder}: another commbench run (pid {holder}) is writing there; "
                             "wait for it or give --out another folder") from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, str(os.getpid()).encode(), 0)
    except BaseException:
        os.close(fd)
        raise
    return fd, path


@contextmanager
def folder_lock(folder: str):
    """Hold ``folder``'s lock for the ``with`` block; :class:`FolderBusy` naming the holder's
    pid when another process holds it."""
    fd, path = _acquire(folder)
    try:
        yield path
    finally:
        os.close(fd)
