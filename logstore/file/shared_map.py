"""A few bytes at the start of a file, mapped ``MAP_SHARED``: read and written as memory, without a
syscall, and seen at once by every process that maps or ``pread``s the same file (one page cache).

Strategy: the conversation's lock file holds its commit point and change counter (``commit_point``);
SQLite's wal-index header is the model. ``libc`` ``mmap`` through ``ctypes`` (as ``statx``), not the
``mmap`` module: on 3.11 that one ``dup``s the descriptor (one more per open conversation, against the
server's descriptor budget) and ``fstat``s it (the caller already knows the file is long enough).

Rules:
- Map only a file already at least ``size`` bytes long, and never shorten one that is mapped: a page
  wholly past the end of the file raises SIGBUS when touched. (Lock files are never truncated: nothing
  in logstore opens them ``O_TRUNC`` or truncates them.)
- Lifetime: the mapping is closed (``munmap``) only when no thread can reach it; its owner closes it
  with its descriptors (``LogFiles.close``, behind the reader guard and the I/O lock). A read after
  ``close`` would be a read of unmapped memory, so every read goes through an owner that checks.
- Where libc has no ``mmap`` (or the kernel refuses: ``vm.max_map_count``, a file system without
  shared mappings) ``map_shared`` returns None and callers use ``pread``/``pwrite``.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
from typing import Any

__all__ = ["SharedMap", "map_shared"]


def _load() -> tuple[Any, Any] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        mmap_fn, munmap_fn = libc.mmap, libc.munmap
    except (OSError, AttributeError):  # pragma: no cover - every Linux libc has both
        return None
    mmap_fn.restype = ctypes.c_void_p
    c_int = ctypes.c_int
    mmap_fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t, c_int, c_int, c_int, ctypes.c_long)
    munmap_fn.restype = ctypes.c_int
    munmap_fn.argtypes = (ctypes.c_void_p, ctypes.c_size_t)
    return mmap_fn, munmap_fn


_FNS = _load()
_MAP_FAILED = ctypes.c_void_p(-1).value


class SharedMap:
    """The first ``size`` bytes of a file, seen through ctypes objects (``view``, ``u64``) that stay valid
    until ``close``. Not thread-safe to close: see the rules."""

    __slots__ = ("size", "writable", "_addr")

    def __init__(self, addr: int, size: int, writable: bool) -> None:
        self.size = size
        self.writable = writable
        self._addr: int | None = addr

    def view(self, length: int) -> Any:
        """The first ``length`` bytes as a ctypes array: ``.raw`` copies them out (a concurrent writer may
        tear them: callers check a CRC or compare)."""
        assert self._addr is not None and length <= self.size
        return (ctypes.c_char * length).from_address(self._addr)

    def u64(self, offset: int) -> ctypes.c_uint64:
        """The 8-aligned little-endian word at ``offset`` (x86-64 and aarch64 Linux are little-endian)."""
        assert self._addr is not None and offset % 8 == 0 and offset + 8 <= self.size
        return ctypes.c_uint64.from_address(self._addr + offset)

    def close(self) -> None:
        addr, self._addr = self._addr, None
        if addr is not None and _FNS is not None:
            _FNS[1](addr, self.size)


def map_shared(fd: int, size: int) -> SharedMap | None:
    """Map the first ``size`` bytes of the file open as ``fd`` (which must hold at least that many),
    writable if the descriptor allows it; None if it cannot be mapped."""
    if _FNS is None:
        return None
    for prot, writable in ((mmap.PROT_READ | mmap.PROT_WRITE, True), (mmap.PROT_READ, False)):
        addr = _FNS[0](None, size, prot, mmap.MAP_SHARED, fd, 0)
        if addr is not None and addr != _MAP_FAILED:
            return SharedMap(addr, size, writable)
        if ctypes.get_errno() != errno.EACCES:  # a read-only descriptor: try read-only
            return None
    return None
