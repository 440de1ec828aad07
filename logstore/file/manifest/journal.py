"""The active journal (``journal.<gen>``) as one process holds it: the descriptor it appends through and
which file it read or opened under that name, so that a path that names another file is noticed.

Why (issue 33): ``site remove --purge`` deletes the site's manifest while running stores hold its
journal open. Records appended to the unlinked file are lost to every process, and a store that reads
"journal.0" again after a ``site add`` of the same name would read another file from its old position.
The rule is the lock file's (``locking.py``): a process proves that what it holds is still what the path
names. ``SiteManifest`` asks ``holds`` before each record (one ``statx``), ``check`` at each listing
(the stat it made anyway), and ``open`` when it opens the journal; a mismatch that no compaction explains
(no newer journal) makes it load the manifest again (``SiteManifest._replaced``).
"""

from __future__ import annotations

import os

from ..fileio import FileOps
from ..statx import PathId

__all__ = ["ActiveJournal", "read_tail"]


class ActiveJournal:
    __slots__ = ("ops", "fd", "path", "file_id", "_named")

    def __init__(self, ops: FileOps) -> None:
        self.ops = ops
        self.fd: int | None = None  # open for appending (O_APPEND), once this process writes
        self.path = ""
        self.file_id: tuple[int, int, int] | None = None  # None: not known (no such file when read)
        self._named: PathId | None = None  # ``path``'s statx, once open (``holds``)

    def seen(self, path: str) -> None:
        """``path`` is the active journal now, about to be read: note which file it is. Taken before the
        read, so a file replaced meanwhile is seen as replaced at the next check."""
        self.close()  # (callers have closed it already: another journal, or a reload)
        named = self.ops.identify(path)
        self.path, self.file_id = path, None if named is None else named[0]

    def track(self, path: str) -> None:
        """``seen(path)`` unless ``path`` is the file already known (a new site's first journal: once)."""
        if path != self.path or self.file_id is None:
            self.seen(path)

    def check(self) -> tuple[bool, int | None]:
        """(whether the path still names the file we know, or we knew none; its size, None if absent)."""
        named = self.ops.identify(self.path)
        if named is None:
            return self.file_id is None, None
        return self.file_id is None or named[0] == self.file_id, named[1]

    def holds(self) -> bool:
        """Whether the descriptor is open and still the file its path names: one ``statx`` of the path,
        the inode alone (``PathId``: ~6,500 instructions against ~15,300 for ``FileOps.size_if_named``)."""
        return self.fd is not None and self._named is not None and self._named.file_id() == self.file_id

    def open(self, path: str) -> int | None:
        """Open (create) ``path``, the active journal, for appending. None (nothing left open) if it is
        not the file read as the active journal: whoever replaced it wrote records this process has not
        read."""
        if path != self.path:  # positioned without a read (the erasure tool's manifest)
            self.seen(path)
        fd = self.ops.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
        file_id = self.ops.file_id(fd)
        if self.file_id is not None and file_id != self.file_id:
            self.ops.close(fd)
            return None
        self.fd, self.file_id = fd, file_id
        if self._named is None or self._named.path != self.path:
            self._named = PathId(self.path)
        return fd

    def close(self) -> None:
        fd, self.fd = self.fd, None
        if fd is not None:
            try:
                self.ops.close(fd)
            except OSError:
                pass


def read_tail(ops: FileOps, path: str, pos: int) -> bytes:
    """Bytes of ``path`` from ``pos`` to its end (empty if it does not exist)."""
    try:
        fd = ops.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    try:
        size = ops.size(fd)
        return ops.pread(fd, size - pos, pos) if size > pos else b""
    finally:
        ops.close(fd)
