"""Cross-process locks for conversations: ``flock`` on a separate ``.lock`` file, with a timeout.

Rules:
- ``flock`` (BSD locks), never ``lockf``/``fcntl`` record locks: record locks belong to the process and
  vanish when *any* descriptor of the file is closed. ``flock`` belongs to the open file description.
- Lifetime (issue 10: acknowledged appends were lost): a ``PathLock`` has exactly one owner, which opens
  it, serialises every call on it, and closes it when no thread can reach the owner any more. There is no
  process-wide registry, no weak map and no ``__del__``: the old ``WeakValueDictionary`` handed out a
  lock while ``__del__`` was closing its descriptor, so ``flock`` ran on EBADF or on a reused fd number of
  another file and two processes wrote one conversation. Two owners of the same path in one process hold
  two open file descriptions, and ``flock`` excludes them from each other like two processes.
- Not thread-safe by itself: the owner serialises (``ConversationLog`` calls it only under its I/O lock;
  fsck and export are single-threaded per lock).
- ``release`` is idempotent and unconditional (``LOCK_UN`` of an unheld flock is a no-op), so an owner
  may call it in ``finally`` even when an interrupt arrived in the middle of ``acquire``. An unexpected
  ``OSError`` while locking or unlocking closes the descriptor (closing drops the flock: never left held)
  and surfaces as ``Io``; a later ``acquire`` reopens the file.
- The lock-file dance (issue 33: a purge unlinked ``.lock`` files; a process that still had one open
  went on flocking the unlinked inode, one that opened the path afterwards flocked a new file, and both
  wrote one log): after ``flock`` succeeds, the holder proves that the path still names the file it
  locked (the path's ``statx`` against the descriptor's identity, taken by one ``fstat`` when the file
  was opened: an inode number cannot be reused while the descriptor holds it open). If the path is gone
  or names another file, it unlocks by closing and retries with a fresh open, within the same timeout;
  ``acquire`` then says so (returns True), so an owner that reads through other descriptors of that file
  (the commit point) drops them.
- A lock file is unlinked only by a holder of its flock (``erasure.purge_site``), never beside it: so
  whoever flocks the old inode afterwards (a waiter that was blocked on it, an owner that kept it open)
  finds the path no longer names it. Unlinking a lock file nobody holds would let two owners each hold
  "the" lock on two inodes. Its remover changes its header first (``commit_point``'s change counter),
  so an owner may stand its word for the path's ``statx`` (``acquire(unchanged=...)``): one that finds
  the header as it left it knows nobody removed the file since (issue 35; the dance's ``statx`` was a
  sixth of an append's CPU: docs/PERFORMANCE.md).

Why not ``filelock.FileLock`` on the hot path: it reopens and re-validates the lock file on each
acquire, some 80 times the CPU of this one (docs/PERFORMANCE.md, "The lock-file dance": figures). It is
the same ``flock`` on the same file, so a ``filelock.FileLock`` on a ``.lock`` path (e.g. an external
tool) excludes correctly against these locks. Site-level, rarely taken locks use filelock.
"""

from __future__ import annotations

import fcntl
import os
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from ..core.errors import Io, Timeout
from .fileio import FILE_MODE, READ_ONLY_ERRNOS
from .statx import PathId, fstat_ident

__all__ = ["PathLock", "held"]


class PathLock:
    """Exclusive lock across processes (and across owners in one process). Not reentrant, one owner."""

    __slots__ = ("path", "_fd", "_id", "_held_id", "_named", "_holding")

    def __init__(self, path: str) -> None:
        self.path = os.path.abspath(path)
        self._named = PathId(self.path)  # which file the path names now (one statx, no timestamps)
        self._fd: int | None = None
        self._id: tuple[int, int, int] | None = None  # which file ``_fd`` is
        self._held_id: tuple[int, int, int] | None = None  # the file the last ``acquire`` locked
        self._holding = False  # between a successful ``acquire`` and ``release`` (``held``)

    def acquire(self, timeout: float, *, unchanged: Callable[[], bool] | None = None) -> bool:
        """Take the lock or raise ``Timeout`` after ``timeout`` seconds (``Io`` on an OS failure; its
        ``errno`` is ENOENT when the lock file's directory is gone). Returns True when the file now locked
        is not the one this lock had open before (the path was replaced or removed since, by a holder of
        its flock): the owner drops what it read through other descriptors of the old file. (Against the
        last ``acquire`` that returned, so a replacement seen by one that timed out is not forgotten.)

        ``unchanged``: asked right after ``flock``, when the descriptor is still the one the last
        ``acquire`` proved; True (the owner's word that no holder changed the file since it left it:
        ``commit_point``'s change counter) stands for the path's ``statx``. Whoever unlinks a lock file
        changes it first, under its flock."""
        deadline: float | None = None  # read the clock only once the first try failed
        delay = 0.0002
        try:
            while True:
                fd = self._fd
                if fd is None:
                    fd = self._open()
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except BlockingIOError:
                    pass
                else:
                    if unchanged is not None and self._id == self._held_id and unchanged():
                        self._holding = True
                        return False
                    if self._named.file_id() == self._id:
                        held, self._held_id, self._holding = self._held_id, self._id, True
                        return held is not None and held != self._id
                    # We locked a file the path no longer names: its remover held the flock until it
                    # had unlinked it. Closing drops our flock on the dead inode; open the path again.
                    self._drop()
                    continue
                if deadline is None:
                    deadline = time.monotonic() + timeout
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise Timeout(
                        f"conversation is busy: lock {os.path.basename(self.path)} held by another "
                        f"owner for more than {timeout:g}s"
                    )
                time.sleep(min(delay, remaining))
                delay = min(delay * 2, 0.01)
        except Timeout:
            raise
        except OSError as exc:
            self._drop()
            raise Io(f"cannot lock {self.path}: {exc.strerror or exc}", errno=exc.errno) from exc
        except BaseException:
            # An interrupt may have landed just after flock succeeded: never leave it held.
            try:
                self.release()
            except Io:
                pass  # release closed the descriptor, which drops the flock; the interrupt wins
            raise

    def _open(self) -> int:
        """Open (or create) the lock file; note which file it is (one ``fstat`` per open)."""
        self._fd = fd = _open(self.path)
        self._id = fstat_ident(fd).file_id
        return fd

    def release(self) -> None:
        """Drop the lock if held (a no-op otherwise). Never leaves it held: on failure the fd is closed."""
        self._holding = False
        fd = self._fd
        if fd is None:
            return
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        except OSError as exc:
            self._drop()
            raise Io(f"cannot unlock {self.path}: {exc.strerror or exc}", errno=exc.errno) from exc

    def close(self) -> None:
        """Release and close the descriptor. Only the owner calls this, once nobody can reach it."""
        self._drop()

    def held(self) -> bool:
        """Whether the last ``acquire`` succeeded and no ``release`` followed (its owner's precondition
        checks: ``log.held``)."""
        return self._holding

    def _drop(self) -> None:
        self._holding = False
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                os.close(fd)  # closing the last descriptor of the open file description drops the flock
            except OSError:
                pass


def _open(path: str) -> int:
    """The lock file, created if needed; on a read-only data dir the existing one, read-only (``flock``
    works on a read-only descriptor: readers and fsck of a snapshot still exclude each other)."""
    try:
        return os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)
    except OSError as exc:
        if exc.errno not in READ_ONLY_ERRNOS:
            raise
        try:
            return os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise exc from None


@contextmanager
def held(path: str, timeout: float) -> Iterator[None]:
    """Take the lock on ``path`` for a block, with a lock object of its own (tools, fsck, export)."""
    lock = PathLock(path)
    try:
        lock.acquire(timeout)
        yield
    finally:
        lock.close()
