"""The single seam between logstore and the operating system's file API.

Rules:
- Every engine call that creates, writes, syncs, renames, truncates or removes a file goes through a
  ``FileOps`` instance (``Store(..., file_ops=...)``). The torture suite swaps in a fault-injecting or
  power-loss-simulating subclass; the engine itself has no fault-injection branches.
- Log files are written with ``pwrite`` at offsets the engine tracks; they are never opened O_APPEND.
  The manifest journal is the one file opened O_APPEND (many processes append small records to it) and it
  is only ever written with ``append`` (plain ``write``). One model per file, never mixed.
- Everything is created private (files 0600, directories 0700, whatever the umask): payloads are people's
  conversations, and any local user could read 0644 files. fsck warns about looser modes.
- ``OSError`` propagates; mapping to ``logstore.core.errors.Io`` happens in the engine, where the handle that
  saw the failure can be poisoned.
"""

from __future__ import annotations

import errno as errno_mod
import os

from .shared_map import SharedMap, map_shared
from .statx import Ident, fstat_ident, stat_ident

__all__ = ["FileOps", "OS_FILE_OPS", "NoSyncOps", "FILE_MODE", "DIR_MODE", "READ_ONLY_ERRNOS"]

FILE_MODE = 0o600
DIR_MODE = 0o700
# Opening for write fails with these where this process may read but not write (a read-only snapshot or
# bind mount, another user's data dir): readers then open read-only (``open_writable``).
READ_ONLY_ERRNOS = frozenset({errno_mod.EROFS, errno_mod.EACCES, errno_mod.EPERM})


class FileOps:
    """Thin, overridable wrappers over ``os``. Methods take and return plain fds and bytes."""

    # --- descriptors -------------------------------------------------------------------------------
    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        return os.open(path, flags | os.O_CLOEXEC, mode)

    def close(self, fd: int) -> None:
        os.close(fd)

    def open_writable(self, path: str, flags: int) -> int:
        """``open(path, flags)`` (flags asking for write), or, where the file system or the permissions
        refuse writing (``READ_ONLY_ERRNOS``), the existing file opened ``O_RDONLY``: reads of a read-only
        data dir work, and a write through the descriptor fails (EBADF) like any other I/O error."""
        try:
            return self.open(path, flags)
        except OSError as exc:
            if exc.errno not in READ_ONLY_ERRNOS:
                raise
            try:
                return self.open(path, os.O_RDONLY)
            except FileNotFoundError:
                raise exc from None

    # --- data --------------------------------------------------------------------------------------
    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        """Write all of ``data`` at ``offset`` (short writes are continued; ENOSPC surfaces)."""
        written = os.pwrite(fd, data, offset)  # one call in the usual case: no memoryview, no loop
        if written == len(data):
            return
        view = memoryview(data)[written:]
        offset += written
        while view:
            written = os.pwrite(fd, view, offset)
            if written <= 0:  # pragma: no cover - a zero-byte write of non-empty data means a full disk
                raise OSError(errno_mod.ENOSPC, "short write")
            view = view[written:]
            offset += written

    def append(self, fd: int, data: bytes) -> None:
        """Append to an O_APPEND descriptor in one ``write`` (small records stay contiguous)."""
        written = os.write(fd, data)
        if written != len(data):
            raise OSError(errno_mod.EIO, f"short append: {written} of {len(data)} bytes")

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        """Read up to ``size`` bytes at ``offset``; fewer only at end of file."""
        first = os.pread(fd, size, offset) if size > 0 else b""  # one call in the usual case
        if len(first) == size or not first:
            return first
        chunks = [first]
        size -= len(first)
        offset += len(first)
        while size > 0:
            chunk = os.pread(fd, size, offset)
            if not chunk:
                break
            chunks.append(chunk)
            size -= len(chunk)
            offset += len(chunk)
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    # Every stat below goes through ``statx`` without timestamps: a stat that asks for mtime/ctime makes
    # the next write dirty the inode on kernels with multigrain timestamps, and the append's fdatasync
    # then costs ~50% more (logstore/file/statx.py has the figures).
    def size(self, fd: int) -> int:
        return fstat_ident(fd).size

    def ident(self, fd: int) -> Ident:
        """Size, link count and mode of the open file ``fd`` (one ``statx``): the manifest journal's
        per-record "still the current journal?" (manifest.journal)."""
        return fstat_ident(fd)

    def ident_at(self, path: str) -> Ident | None:
        """The same for the file ``path`` names, or None if it does not exist."""
        try:
            return stat_ident(path)
        except FileNotFoundError:
            return None

    def map_shared(self, fd: int, size: int) -> SharedMap | None:
        """The first ``size`` bytes of the open file ``fd`` (at least that long), mapped ``MAP_SHARED``
        (``shared_map``: a lock file's header, read and bumped without a syscall); None where it cannot
        be mapped (the caller uses ``pread``/``pwrite``)."""
        return map_shared(fd, size)

    # --- durability --------------------------------------------------------------------------------
    def fdatasync(self, fd: int) -> None:
        os.fdatasync(fd)

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def fsync_dir(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)

    # --- namespace ---------------------------------------------------------------------------------
    def rename(self, src: str, dst: str) -> None:
        os.replace(src, dst)

    def link(self, src: str, dst: str) -> None:
        """Give the file ``src`` the new name ``dst``; ``FileExistsError`` if ``dst`` exists. The atomic
        "create unless present" of a file written whole first (the cursor key, the store id)."""
        os.link(src, dst)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def chmod(self, path: str, mode: int) -> None:
        os.chmod(path, mode)

    def mkdir(self, path: str) -> None:
        os.mkdir(path, DIR_MODE)

    def rmdir(self, path: str) -> None:
        os.rmdir(path)

    def exists(self, path: str) -> bool:
        # access(F_OK), not os.path.exists: no stat result and, for a missing file (the manifest's
        # per-commit "has a compactor started the next journal?"), no exception built and dropped (a
        # third of the CPU: docs/PERFORMANCE.md). Same answer (symlinks followed, a dangling one is False).
        return os.access(path, os.F_OK)

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def scandir(self, path: str) -> list[os.DirEntry[str]]:
        """The entries of the directory ``path``, in no order: ``listdir`` with each entry's type as the
        directory gave it (no stat per entry), for the data dir walkers (``layout.iter_leaves``)."""
        with os.scandir(path) as entries:
            return list(entries)

    def file_id(self, fd: int) -> tuple[int, int, int]:
        """Which file ``fd`` is (device, inode): fixed for the descriptor's life, so callers keep it."""
        return fstat_ident(fd).file_id

    def size_if_named(self, fd: int, path: str, file_id: tuple[int, int, int] | None = None) -> int | None:
        """``size(fd)`` if ``path`` still names the file open as ``fd``, else None (replaced, removed):
        ``size`` and ``same_file`` in two syscalls instead of three (the append path's freshness check),
        or in one given ``fd``'s ``file_id``: the path's own stat then says both which file it names and,
        when that is ``fd``'s, its size (an inode number cannot be reused while ``fd`` holds it open)."""
        named = _named(fd, path, file_id)
        return None if named is None else named.size

    def same_file(self, fd: int, path: str) -> bool:
        """Whether ``path`` still names the file open as ``fd`` (False if it was replaced or removed)."""
        return _named(fd, path, None) is not None

    def stat_size(self, path: str) -> int | None:
        """Size of the file at ``path``, or None if it does not exist."""
        try:
            return stat_ident(path).size
        except FileNotFoundError:
            return None

    # --- compound operations (built only from the primitives above) -------------------------------
    def makedirs_durable(self, path: str, proven: set[str] | None = None) -> None:
        """Create ``path`` and missing parents so that, when this returns, every entry on the way survives
        a crash.

        A directory's existence says nothing about its entry being durable: the attempt that created it
        may have failed at the parent fsync (or its process died just before it). So besides the parent of
        every directory created here, the parent of the deepest directory that already existed is fsynced
        too. A failed attempt stops at its first failure, leaving at most that one level unsynced, and a
        retry makes it durable. Cost: one extra directory fsync per call (callers call it rarely).

        ``proven``: absolute paths whose entries this process already made durable (``DurableDirs``): the
        walk stops at one without the extra fsync, and every directory made durable here is added."""
        path = os.path.abspath(path)
        missing = []
        existing = path
        while (proven is None or existing not in proven) and not self.exists(existing):
            missing.append(existing)
            parent = os.path.dirname(existing)
            if parent == existing:
                break
            existing = parent
        if (proven is None or existing not in proven) and existing != os.path.dirname(existing):
            self.fsync_dir(os.path.dirname(existing))
            if proven is not None:
                proven.add(existing)
        for directory in reversed(missing):
            try:
                self.mkdir(directory)
            except FileExistsError:
                pass  # created concurrently; still fsync its parent below
            self.fsync_dir(os.path.dirname(directory))
            if proven is not None:
                proven.add(directory)

    def atomic_write(self, path: str, data: bytes) -> None:
        """Replace ``path`` with ``data``: temp file + fsync + rename + directory fsync."""
        directory = os.path.dirname(os.path.abspath(path))
        tmp = f"{path}.tmp-{os.getpid()}"
        fd = self.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            self.pwrite(fd, data, 0)
            self.fsync(fd)
        finally:
            self.close(fd)
        self.rename(tmp, path)
        self.fsync_dir(directory)

    def read_file(self, path: str) -> bytes | None:
        """Whole contents of ``path``, or None if it does not exist."""
        try:
            fd = self.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            return self.pread(fd, self.size(fd), 0)
        finally:
            self.close(fd)


OS_FILE_OPS = FileOps()


def _named(fd: int, path: str, file_id: tuple[int, int, int] | None) -> Ident | None:
    """The stat of ``path`` if it names the file open as ``fd`` (whose ``file_id``, if known), else None."""
    if file_id is None:
        file_id = fstat_ident(fd).file_id
    try:
        named = stat_ident(path)
    except FileNotFoundError:
        return None
    return named if named.file_id == file_id else None


class NoSyncOps(FileOps):
    """The real file operations, except that nothing is made durable: for the bench's CPU row and the
    verifying side of the torture suite, where fsyncs would be most of the time and durability does not
    matter. Never a production store's ops (nothing in logstore/ or server/ passes it)."""

    def fdatasync(self, fd: int) -> None:
        pass

    def fsync(self, fd: int) -> None:
        pass

    def fsync_dir(self, path: str) -> None:
        pass
