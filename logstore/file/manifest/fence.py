"""The manifest's fence (issue 35): a change counter in ``<manifest dir>/fence.lock`` that stands for the
per-record ``statx`` of the held journal (``journal.stale``) while nothing changed.

What the ``statx`` proves after each journal write: the journal was not sealed (a roll, a compaction,
fsck's rebuild: a newer journal exists and the old one may have been read already) nor unlinked (a
purge; a journal ``open_current`` created and found not current). Each of those acts now first *fences*
(``fencing``): under the fence file's exclusive flock it bumps the counter, then acts (chmod, unlink),
then lets go. A writer that proved its journal current holds the counter's value; after each write it
reads the counter from a shared mapping (no syscall): unchanged, and the record is where every later
reader looks; changed (or no mapping), and it takes the slow path, today's ``statx``.

Why that proves the same (the journal's inode lock orders it, as it ordered the ``statx``: a buffered
``O_APPEND`` write, a ``chmod`` and an ``unlink`` of the file each take it):
- a fencer bumps *before* its act, which holds the inode lock; so a write that comes after the act in
  that lock's order comes after the bump too, and the counter read after the write sees it. A write
  before the act is read by the compaction (it reads after its seal) or, for an unlink, was made to a
  journal the writer would lose anyway under the ``statx`` rule too (it re-appends on "changed" as it
  did on ``nlink == 0``).
- the value a writer trusts is taken under the fence's *shared* flock, the counter first, then the
  ``statx`` of its descriptor (``shared``): a fencer holds the flock exclusively from its bump to the
  end of its act, so a value that already counts a bump is only taken once that act is visible to the
  ``statx``, which then says "sealed" or "deleted" and nothing is trusted. (Without the flock a value
  read between a bump and its seal would be trusted past the seal.)
- a purge removes the manifest directory, fence file included: it first *withdraws* the fence (a bit no
  bump clears), so nobody trusts that file again; a writer that sees it changed finds, on its slow path,
  the file the path names now (a new manifest's) and maps that.
- kill -9: a fencer killed after its bump, before its act, only makes writers re-check; the flock goes
  with the process.
- Concurrent fencers (a roll beside a compaction, a purge) are serialised by the flock: no bump is lost.
Limits: an operator's ``rm`` of the manifest beside running servers is not fenced (it was seen by the
``statx``); every tool of ours fences (``journal.seal``, ``journal.open_current``, ``erasure.purge_site``,
fsck through ``journal.seal``).

SIGBUS rule (``shared_map``): the fence is mapped only once the file holds ``SIZE`` bytes (a fencer's
first bump writes them) and it is never shortened (nothing opens it ``O_TRUNC`` or truncates it; a purge
unlinks it under its flock, ``locking``'s rule for lock files).

    offset size
    0      8    counter, little-endian u64; bit 63: withdrawn (the file is about to be removed)
"""

from __future__ import annotations

import errno
import fcntl
import os
import struct
from collections.abc import Iterator
from contextlib import contextmanager

from ...core.errors import LogstoreError
from .. import layout
from ..fileio import FileOps
from ..locking import PathLock
from ..shared_map import SharedMap

__all__ = ["SIZE", "fencing", "withdraw", "FenceView"]

SIZE = 8
WITHDRAWN = 1 << 63
LOCK_TIMEOUT = 5.0  # seconds a fencer waits for another (each holds it for a bump and a few chmods)
_U64 = struct.Struct("<Q")


@contextmanager
def fencing(ops: FileOps, directory: str, *, withdrawing: bool = False) -> Iterator[None]:
    """Bump the counter under the fence's exclusive flock and hold it for the block (the act: seal,
    unlink). Raises ``OSError`` (the act must not happen unfenced)."""
    lock = PathLock(layout.manifest_fence(directory))
    try:
        try:
            lock.acquire(LOCK_TIMEOUT)
        except LogstoreError as exc:
            raise OSError(getattr(exc, "errno", None) or errno.EWOULDBLOCK, str(exc)) from exc
        fd = ops.open(lock.path, os.O_RDWR)
        try:
            old = ops.pread(fd, SIZE, 0)
            value = _U64.unpack(old)[0] if len(old) == SIZE else 0
            value = (value & WITHDRAWN) | ((value + 1) & ~WITHDRAWN)
            ops.pwrite(fd, _U64.pack(value | WITHDRAWN if withdrawing else value), 0)
        finally:
            ops.close(fd)
        yield
    finally:
        lock.close()


def withdraw(ops: FileOps, directory: str) -> None:
    """Before a purge removes the manifest directory: nobody trusts its fence again (module docstring)."""
    if not ops.exists(directory):
        return
    with fencing(ops, directory, withdrawing=True):
        pass


class FenceView:
    """One writer's view of the fence: the counter mapped shared. Used under the owner's lock (the
    site manifest's), which also serialises ``close``."""

    __slots__ = ("ops", "path", "_fd", "_id", "_map", "_counter")

    def __init__(self, ops: FileOps, directory: str) -> None:
        self.ops = ops
        self.path = layout.manifest_fence(directory)
        self._fd: int | None = None
        self._id: tuple[int, int, int] | None = None
        self._map: SharedMap | None = None
        self._counter: object = None

    def unchanged(self, value: int | None) -> bool:
        """The fast path: the counter still reads ``value`` (no syscall)."""
        counter = self._counter
        return value is not None and counter is not None and counter.value == value  # type: ignore[attr-defined]

    @contextmanager
    def shared(self) -> Iterator[int | None]:
        """The counter, read under the fence's shared flock (not waiting for it), held for the block (the
        caller's ``statx``): a value to trust if that ``statx`` says current. None when there is no fence
        to trust (busy, withdrawn, not mapped, an error)."""
        fd = self._mapped()
        if fd is None:
            yield None
            return
        locked = False
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
                locked = True
            except OSError:  # a fencer is between its bump and the end of its act (or an error)
                pass
            value = self._counter.value if locked else WITHDRAWN  # type: ignore[attr-defined]
            yield None if value & WITHDRAWN else value
        finally:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)  # unconditional: an interrupt may follow the flock
            except OSError:
                self.close()  # closing drops the flock; the counter reads as changed from then on

    def _mapped(self) -> int | None:
        """The descriptor of the fence the path names, mapped (opened and mapped again if the path names
        another file now: a purge removed the old one); None if there is none to map."""
        try:
            named = self.ops.ident_at(self.path)
            if named is None:
                self.close()
                with fencing(self.ops, os.path.dirname(self.path)):  # creates it, SIZE bytes long
                    pass
                named = self.ops.ident_at(self.path)
            if named is None or named.size < SIZE:
                return None
            if self._fd is not None and self._id == named.file_id:
                return self._fd
            self.close()
            fd = self.ops.open(self.path, os.O_RDONLY)
            held = self.ops.ident(fd)
            mapped = self.ops.map_shared(fd, SIZE) if held.size >= SIZE else None
            if mapped is None:
                self.ops.close(fd)
                return None
            self._fd, self._id, self._map, self._counter = fd, held.file_id, mapped, mapped.u64(0)
            return fd
        except OSError:
            self.close()
            return None

    def close(self) -> None:
        mapped, self._map, self._counter = self._map, None, None
        if mapped is not None:
            mapped.close()
        fd, self._fd, self._id = self._fd, None, None
        if fd is not None:
            try:
                self.ops.close(fd)
            except OSError:
                pass
