"""The data dir's own lock (``<data_dir>/data_dir.lock``): leveldb's and etcd's one ``LOCK`` per data dir.

Who holds it, and how (docs/OPERATIONS.md, "What runs online"):
- every ``Store`` holds it SHARED from its open to its close (``serve``, its workers, an embedded store,
  ``migrate`` into a data dir), and so do the online operator commands that read or repair a data dir
  beside running servers (``fsck``, ``fsck --repair``, ``export``, the source of ``backup``, the backup a
  ``restore`` reads). Cost: one ``open`` and one ``flock`` (and one ``stat``) per open, nothing per append;
- commands that rewrite or replace a data dir's files wholesale and must not run beside anyone who holds
  them take it EXCLUSIVE, without waiting: ``restore`` into a data dir, and ``backup`` into its
  destination (which removes conversations and replaces manifests there, so a server must not be serving
  it). When it is held they refuse (``DataDirInUse``) and change nothing.

Rules:
- ``flock`` (BSD locks), never ``fcntl`` record locks (logstore.file.locking says why); the lock goes
  with its process however it ends, kill -9 included.
- Never unlinked. Still, a process proves that what it locked is what the path names: after ``flock``
  it compares the descriptor's file with the path's, and retries on a replaced file (the lock-file dance).
- A read-only data dir (a snapshot, a read-only bind mount): the lock file is opened ``O_RDONLY`` when it
  exists (``flock`` works on a read-only descriptor); when it does not, a shared holder goes on without
  it (nothing can write that data dir, so there is nobody to exclude). An exclusive taker needs to write
  anyway and gets the file system's error.
"""

from __future__ import annotations

import fcntl
import os
import time

from ..core.errors import Unavailable
from . import layout
from .fileio import READ_ONLY_ERRNOS, FileOps

__all__ = ["DataDirLock", "DataDirInUse"]


class DataDirInUse(Unavailable):
    """The data dir's lock is held in the conflicting mode (a store or server has the data dir open, or
    an offline-only command is rewriting it)."""

    code = "Unavailable"


class DataDirLock:
    """The held lock; ``close`` releases it (idempotent). One owner, as ``PathLock``."""

    __slots__ = ("ops", "path", "_fd")

    def __init__(self, ops: FileOps, path: str, fd: int | None) -> None:
        self.ops, self.path, self._fd = ops, path, fd

    @classmethod
    def shared(cls, ops: FileOps, data_dir: str, *, timeout: float) -> DataDirLock:
        """Hold the data dir for reading and online writing; waits up to ``timeout`` seconds for an
        offline-only command to finish, then raises ``DataDirInUse``."""
        return cls._take(ops, data_dir, exclusive=False, timeout=timeout, what="")

    @classmethod
    def exclusive(cls, ops: FileOps, data_dir: str, *, what: str) -> DataDirLock:
        """Hold the data dir alone (no wait): ``DataDirInUse`` when a store, a server or another command
        holds it. ``what`` names the command in the refusal."""
        return cls._take(ops, data_dir, exclusive=True, timeout=0.0, what=what)

    def close(self) -> None:
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                self.ops.close(fd)  # closing the only descriptor drops the flock
            except OSError:
                pass

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @classmethod
    def _take(cls, ops: FileOps, data_dir: str, *, exclusive: bool, timeout: float, what: str) -> DataDirLock:
        path = layout.data_dir_lock_path(data_dir)
        mode = fcntl.LOCK_EX if exclusive else fcntl.LOCK_SH
        deadline: float | None = None
        delay = 0.001
        while True:
            fd = _open(ops, path, exclusive=exclusive)
            if fd is None:
                return cls(ops, path, None)  # read-only and never locked: nobody can write it
            try:
                try:
                    fcntl.flock(fd, mode | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass
                else:
                    if ops.same_file(fd, path):  # the lock-file dance: still the file the path names
                        lock, fd = cls(ops, path, fd), None
                        return lock
                    continue  # replaced meanwhile: lock the new one
            finally:
                if fd is not None:
                    ops.close(fd)
            if deadline is None:
                deadline = time.monotonic() + timeout
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise DataDirInUse(_refusal(data_dir, exclusive=exclusive, what=what))
            time.sleep(min(delay, remaining))
            delay = min(delay * 2, 0.05)


def _open(ops: FileOps, path: str, *, exclusive: bool) -> int | None:
    try:
        return ops.open(path, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW)
    except OSError as exc:
        if exclusive or exc.errno not in READ_ONLY_ERRNOS:
            raise
    try:
        return ops.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return None


def _refusal(data_dir: str, *, exclusive: bool, what: str) -> str:
    if exclusive:
        return (
            f"the data dir {data_dir} is in use (a server, a store or another operator command holds "
            f"{layout.DATA_DIR_LOCK}); {what} needs it to itself: stop them first. Nothing was changed"
        )
    return (
        f"the data dir {data_dir} is being rewritten by an offline operator command (restore, or a backup "
        f"into it holds {layout.DATA_DIR_LOCK}): open it when that command has finished"
    )
