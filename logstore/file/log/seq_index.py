"""The in-memory seq index of one conversation and its sidecar file: locating frames by seq, writing the
file. Pure over its arguments (descriptors and ``FileOps`` are passed in), so the conversation keeps the
one copy of the entries under its state lock and this module owns the rules:

- ``entries`` holds one ``index_codec`` entry (offset, first seq, check) per good frame, in log order;
- ``locate`` finds the frames covering ``[first, stop)`` by bisection, and raises ``IndexMismatch`` for
  anything inconsistent (the caller rescans the log: the index is never trusted over the log);
- ``write_index`` brings the file up to the entries after a commit (never before its fdatasync: the index
  may lag the log, never lead it), rewriting from the first entry not known to match.
"""

from __future__ import annotations

import logging
import os
from bisect import bisect_right

from ..fileio import FileOps
from .index_codec import (
    ENTRY_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    decode_entry,
    entry_first_seq,
    index_entries,
)

__all__ = ["LAG_BYTES", "LAG_FRAMES", "IndexMismatch", "SidecarIndex", "locate", "write_index"]

log = logging.getLogger("logstore")

LAG_FRAMES = 64  # the index is written on the append path once it lags by this many frames...
LAG_BYTES = 1024 * 1024  # ...or this much log (and always on close): off the append path otherwise


class IndexMismatch(Exception):
    """The index disagreed with the log; rescan and retry."""


def locate(entries: bytearray, n: int, first: int, stop: int, end: int) -> tuple[list[tuple[int, int]], int]:
    """``([(offset, first_seq)] of the frames holding seqs [first, stop), end of the last one)`` among
    the first ``n`` entries (the rest belong to a newer state). ``end`` is the end of the log, used when
    the last frame is the last entry."""
    lo = bisect_right(range(n), first, key=lambda i: entry_first_seq(entries, i)) - 1
    hi = bisect_right(range(n), stop - 1, key=lambda i: entry_first_seq(entries, i)) - 1
    if lo < 0 or hi < lo:
        raise IndexMismatch
    bounds: list[tuple[int, int]] = []
    for i in range(lo, min(hi + 2, n)):
        entry = decode_entry(entries, i)
        if entry is None or (bounds and entry[0] <= bounds[-1][0]):
            raise IndexMismatch
        bounds.append(entry)
    region_end = bounds[hi - lo + 1][0] if hi + 1 < n else end
    return bounds[: hi - lo + 1], region_end


def write_index(ops: FileOps, fd: int, entries: bytearray, n: int, valid: int, *, name: str) -> int:
    """Bring the index file up to the first ``n`` ``entries``: rewrite from entry ``valid`` (the first
    not known to match the file), cut anything beyond. Returns the new count of matching entries.
    Failures only cost a later rescan, never an error to the client (logged; the count returned is then
    the old one)."""
    have = n * ENTRY_SIZE
    try:
        size = ops.size(fd)  # one fstat: the write below never extends past have
        if size < INDEX_HEADER_SIZE:
            valid = 0
        start = valid * ENTRY_SIZE
        if start < have:
            chunk = bytes(entries[start:have])
            if start == 0:
                ops.pwrite(fd, INDEX_HEADER + chunk, 0)
            else:
                ops.pwrite(fd, chunk, INDEX_HEADER_SIZE + start)
        if size > INDEX_HEADER_SIZE + have:
            ops.ftruncate(fd, INDEX_HEADER_SIZE + have)
    except OSError as exc:
        log.warning("index write failed for %s (will be rebuilt from the log): %s", name, exc)
        return valid
    return have // ENTRY_SIZE


class SidecarIndex:
    """A conversation's ``.idx`` file: its descriptor and how many of its leading entries are known to
    equal the state's. Owned by the conversation and used only under its I/O lock (readers never touch
    it: they use the in-memory entries)."""

    def __init__(self, ops: FileOps, path: str) -> None:
        self.ops = ops
        self.path = path
        self.fd: int | None = None
        self.valid = 0  # leading file entries known to equal the state's entries
        # The log offset of entry ``valid`` (the first not in the file) of the ``_lag_of`` buffer,
        # decoded once per lag instead of on every append; buffers are append-only, a rebuild
        # starts a new one, so (buffer, valid) names the entry.
        self._lag_of: tuple[bytearray, int] | None = None
        self._lag_from: int | None = None

    def open_and_read(self) -> bytearray:
        """Open (creating it) and return its checked-header entries; empty if it cannot be opened (the
        index is a hint: run without one rather than fail reads). Raises ``OSError`` on a failed read."""
        self.valid = 0
        try:
            self.fd = self.ops.open(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            log.warning("cannot open index %s: %s", self.path, exc)
            return bytearray()
        return bytearray(index_entries(self.ops.pread(self.fd, self.ops.size(self.fd), 0)))

    def open_new(self) -> None:
        """Open it for a log just created (empty): any entries left by an earlier log of that name (an
        erasure stopped before removing its index) are cut, unread. A failure is logged, as above."""
        self.valid = 0
        try:
            self.fd = self.ops.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC)
        except OSError as exc:
            log.warning("cannot open index %s: %s", self.path, exc)

    def close(self) -> None:
        if self.fd is not None:
            try:
                self.ops.close(self.fd)
            except OSError:
                pass
        self.fd, self.valid, self._lag_of = None, 0, None

    def write(self, entries: bytearray, n: int, end: int, *, force: bool = False) -> None:
        """Bring the file up to the first ``n`` entries of a log ending at ``end`` - but on the append
        path only once it lags by ``LAG_FRAMES`` frames or ``LAG_BYTES`` of log (``force``: on close).
        The index is a hint (recovery scans from its last good entry), so a lag costs a longer scan
        after a crash, bounded by those two figures, and saves a write per append."""
        if self.fd is None or n <= self.valid:
            return
        if not force and n - self.valid < LAG_FRAMES:
            lag_of = self._lag_of
            if lag_of is None or lag_of[0] is not entries or lag_of[1] != self.valid:
                first = decode_entry(entries, self.valid)  # the first entry not in the file yet
                self._lag_of, self._lag_from = (entries, self.valid), None if first is None else first[0]
            if self._lag_from is not None and end - self._lag_from < LAG_BYTES:
                return
        self.follow_replaced()
        if self.fd is not None:
            self.valid = write_index(self.ops, self.fd, entries, n, self.valid, name=self.path)

    def sync(self) -> None:
        if self.fd is not None:
            try:
                self.ops.fdatasync(self.fd)
            except OSError as exc:
                log.warning("index sync failed for %s: %s", self.path, exc)

    def follow_replaced(self) -> None:
        """fsck --repair replaces an index by rename: write to the new file, not the orphaned inode."""
        if self.fd is None:
            return
        try:
            if self.ops.same_file(self.fd, self.path):
                return
            fd = self.ops.open(self.path, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            log.warning("cannot reopen replaced index %s: %s", self.path, exc)
            return
        self.close()
        self.fd = fd  # valid stays 0: rewritten whole from the log-verified entries at the next commit
