"""``stat`` without timestamps: size, inode, link count and mode of a file, asking the kernel for nothing
else.

Strategy: Linux 6.13 gave ext4 (and a few other filesystems) *multigrain* timestamps. While nobody looks
at a file's mtime/ctime, a write stamps them with the coarse clock, so a burst of writes changes them
about once per tick. Once a ``stat`` has asked for them, the kernel flags the inode and the next write
takes a fine-grained timestamp, which always differs: that write dirties the inode, and the
``fdatasync`` after it costs ~50% more, unless the stat was a ``statx`` asking for no timestamps
(``python -m bench.stat_fdatasync``; docs/PERFORMANCE.md, "Figures behind the engine's small choices").

The append path must look at its log between writes (another process may have appended, trimmed,
replaced or erased it), so every stat the engine makes goes through here (``FileOps``; a test keeps
``os.stat`` out of ``logstore/file``). Python 3.11 has no ``os.statx``: libc's is called through
``ctypes`` (a little slower than ``os.fstat``: same section).
Where libc has no ``statx`` (or the kernel refuses it) the plain ``os`` calls are used: correct, only
slower to sync on kernels with multigrain timestamps.
"""

from __future__ import annotations

import ctypes
import errno
import os
import struct
import sys
import threading
from typing import Any, NamedTuple

__all__ = ["Ident", "PathId", "fstat_ident", "stat_ident", "STATX_AVAILABLE"]


class Ident(NamedTuple):
    """The fields of ``struct statx`` the engine reads, in its order (one unpack builds it)."""

    mask: int  # what the kernel filled in
    nlink: int
    mode: int  # st_mode (the manifest journal's seal is its owner-write bit: manifest/journal.py)
    ino: int
    size: int
    dev_major: int
    dev_minor: int

    @property
    def file_id(self) -> tuple[int, int, int]:
        """Which file this is: equal for two names (or descriptors) of one file, and only then."""
        return (self.dev_major, self.dev_minor, self.ino)


_AT_FDCWD = -100
_AT_EMPTY_PATH = 0x1000
_MASK = 0x002 | 0x004 | 0x100 | 0x200  # STATX_MODE | NLINK | INO | SIZE: no STATX_MTIME/CTIME/ATIME
# struct statx (include/uapi/linux/stat.h): stx_mask u32 @0, stx_nlink u32 @16, stx_mode u16 @28,
# stx_ino u64 @32, stx_size u64 @40, stx_dev_major u32 @136, stx_dev_minor u32 @140; 256 bytes in all.
_LAYOUT = struct.Struct("<I12xI8xH2xQQ88xII")  # mask, nlink, mode, ino, size, dev major, minor
_BUFSIZE = 256
_local = threading.local()  # one result buffer per thread (see below)


def _load() -> object | None:
    try:
        fn = ctypes.CDLL(None, use_errno=True).statx
    except (OSError, AttributeError):
        return None
    fn.restype = ctypes.c_int  # no argtypes: ctypes' own int/bytes/buffer conversion is the fast path
    probe = ctypes.create_string_buffer(_BUFSIZE)
    if fn(_AT_FDCWD, b"/", 0, _MASK, probe) != 0:  # ENOSYS on an old kernel, EPERM under some seccomp
        return None
    return fn


_statx: Any = _load()
_make = Ident._make
_unpack = _LAYOUT.unpack_from
_FS_ENCODING = sys.getfilesystemencoding()
STATX_AVAILABLE = _statx is not None


def _failed(path: bytes) -> OSError:
    err = ctypes.get_errno()
    return OSError(err, os.strerror(err), path.decode(errors="replace") if path else None)


def _from_stat(st: os.stat_result) -> Ident:
    return Ident(
        _MASK, st.st_nlink, st.st_mode, st.st_ino, st.st_size, os.major(st.st_dev), os.minor(st.st_dev)
    )


def _call(dirfd: int, name: bytes, flags: int) -> Ident:
    """One ``statx``. The thread's buffer is taken out while in use, so a signal handler that stats a
    file between the call and the unpack (same thread) gets a buffer of its own instead of overwriting
    this one."""
    buf = _local.__dict__.pop("buf", None) or ctypes.create_string_buffer(_BUFSIZE)
    try:
        if _statx(dirfd, name, flags, _MASK, buf) != 0:
            raise _failed(name)
        got = _make(_unpack(buf))
    finally:
        _local.buf = buf
    if got.mask & _MASK != _MASK:  # pragma: no cover - every local filesystem fills these three
        raise OSError(errno.EOPNOTSUPP, "statx did not return size, inode, link count and mode")
    return got


def fstat_ident(fd: int) -> Ident:
    """Link count, mode, inode, size and device of the open file ``fd``, without marking its times queried."""
    if _statx is None:
        return _from_stat(os.fstat(fd))
    return _call(fd, b"", _AT_EMPTY_PATH)


def stat_ident(path: str) -> Ident:
    """The same for the file ``path`` names (symlinks followed, as ``os.stat``); FileNotFoundError if none."""
    if _statx is None:
        return _from_stat(os.stat(path))
    return _call(_AT_FDCWD, path.encode(_FS_ENCODING, "surrogateescape"), 0)  # os.fsencode, inlined


_INO = 0x100  # STATX_INO (the device is always filled in)
_ID = struct.Struct("<32xQ96xII").unpack_from  # stx_ino, stx_dev_major, stx_dev_minor


class PathId:
    """Which file one fixed path names, asked again and again by its one owner (``PathLock``'s proof after
    each ``flock``): the path encoded once and a result buffer of its own (the owner serialises its calls),
    the inode alone asked for, None instead of an exception when nothing is there (less than half the
    instructions of ``FileOps.size_if_named``: figures in docs/PERFORMANCE.md)."""

    __slots__ = ("path", "_bpath", "_buf")

    def __init__(self, path: str) -> None:
        self.path = path
        self._bpath = path.encode(_FS_ENCODING, "surrogateescape")
        self._buf = ctypes.create_string_buffer(_BUFSIZE)

    def file_id(self) -> tuple[int, int, int] | None:
        """``stat_ident(path).file_id``, or None if the path names nothing (ENOENT, ENOTDIR)."""
        if _statx is None:
            try:
                return _from_stat(os.stat(self.path)).file_id
            except (FileNotFoundError, NotADirectoryError):
                return None
        if _statx(_AT_FDCWD, self._bpath, 0, _INO, self._buf) != 0:
            err = ctypes.get_errno()
            if err in (errno.ENOENT, errno.ENOTDIR):
                return None
            raise _failed(self._bpath)
        ino, major, minor = _ID(self._buf)
        return major, minor, ino
