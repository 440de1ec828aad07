"""A conversation's commit point: the durable end of its log, the one thing readers trust.

Strategy (issue 20; SQLite's wal-index and Kafka's high watermark are the models). A writer stores, after
each ``fdatasync`` and before it acknowledges, a small record at the start of the conversation's ``.lock``
file (the file every writer already flocks; its content was unused): which log (inode), how far its
frames are durable (``end``, ``next_seq``), in which *epoch*, on which boot. A reader in any process reads
that record with one ``pread`` and serves frames up to ``end`` only: never bytes still being written,
never a batch whose ``fdatasync`` has not returned, and always every batch acknowledged before the read
started (the record was written before the acknowledgement).

Rules:
- The record is written only under the conversation's file lock, and only for frames that are durable:
  after the commit's own ``fdatasync``, or after recovery took in frames a crashed writer left and
  fdatasynced them (recovery's frames beyond the old record are not known to be durable until then).
- Within one epoch a log only grows: frames at or before ``end`` never change. Anything that cuts or
  replaces frames a record vouched for (a repair, an erasure) first *invalidates* the record (zeros;
  ``invalidate``), then changes the log; the next locked recovery starts a new, random epoch. A reader
  that scanned while that happened sees another record when it reads it again after its scan (a
  seqlock), and starts over. A writer never cuts what a record vouches for, not even its own failed
  write (``tail.cut_own_failed_write``).
- The record is never fsynced: after a power loss it may be stale, so a record from another boot is not
  trusted (the reader recovers under the file lock instead, and writes a new one). After a process crash
  the page cache keeps it, and it still tells the truth: the dead writer wrote it after an ``fdatasync``.
- Damage: recovery under the lock (or a full rescan under it) found corruption after ``end``. The record
  then carries its offset and reason, so every process reports the same ``Corrupted`` (one verdict),
  whichever found it, and serves the frames before it; only a repair (which invalidates) clears it.

The change counter (issue 35; SQLite's wal-index header change counter is the model). After the record,
at byte 88, a u64 that every holder of the flock bumps *before* it changes the log without moving the
record first: before a commit's frames are written (a writer killed before its record leaves them past
it), before a trim, a torn-tail cut or the cut of its own failed write. A holder that leaves the flock
notes the header (record + counter) as it left it, with its state agreeing with every file
(``LogFiles.unchanged``). At its next flock, the same header means nothing changed: no other process
appended, trimmed, died mid-commit, invalidated the record (every tool that cuts, replaces or removes
a log, or unlinks the lock file, invalidates it first), so the lock path still names the file it locks
and its state is the truth: no ``statx`` of either path, no ``pread``. The header is read through a
shared mapping of the first page (``shared_map``): no syscall. A lock file shorter than the header (an
older release's, 84 bytes) is not mapped: reads ``pread`` the record and the first bump writes the
counter with ``pwrite`` (the file is then long enough to map).

Sans-IO codec plus a small file object (``PointFile``); ``FileOps`` does the I/O.

    offset size
    0      4    magic "LSCP"
    4      1    version (1)
    5      3    zero
    8      16   boot id (logstore.file.boot)
    24     8    epoch (random; changes whenever frames a record vouched for may have changed)
    32     8    inode of the log file
    40     8    end: offset just past the last durable frame
    48     8    next_seq: the seq after that frame's last item
    56     8    damage offset (meaningful when the reason is not empty)
    64     16   damage reason, ASCII, NUL-padded (empty: no damage)
    80     4    CRC32C of bytes 0..79
    84     4    zero
    88     8    change counter (not covered by the CRC; a torn value only reads as "changed")
"""

from __future__ import annotations

import os
import secrets
import struct
from typing import Any, NamedTuple

from crc32c import crc32c

from .. import boot
from ..fileio import FileOps
from ..shared_map import SharedMap

__all__ = [
    "RECORD_SIZE",
    "NO_RECORD",
    "CommitPoint",
    "encode",
    "commit_prefix",
    "encode_commit",
    "decode",
    "new_epoch",
    "read_raw",
    "write_raw",
    "invalidate",
    "HEADER_SIZE",
    "PointFile",
]

MAGIC = b"LSCP"
VERSION = 1
_BODY = struct.Struct("<4sBxxx16s8sQQQQ16s")
# A commit's record in two parts: what every record of one log in one epoch shares (magic .. inode), and
# the rest with no damage (``encode_commit``: the same bytes as ``encode``, without building a record).
_PREFIX = struct.Struct("<4sBxxx16s8sQ")
_CLEAN = struct.Struct("<QQ24x")
assert _PREFIX.size + _CLEAN.size == _BODY.size
_CRC = struct.Struct("<I")
RECORD_SIZE = _BODY.size + _CRC.size  # 84
NO_RECORD = bytes(RECORD_SIZE)  # what ``invalidate`` writes: decodes to None, trusted by nobody
_COUNTER = 88
HEADER_SIZE = _COUNTER + 8  # the record, padding, the change counter
_PAD = bytes(_COUNTER - RECORD_SIZE)
_U64 = struct.Struct("<Q")


class CommitPoint(NamedTuple):
    boot: bytes
    epoch: bytes
    ino: int
    end: int
    next_seq: int
    damage: tuple[int, str] | None = None  # (offset, reason) judged under the lock

    def trusted_for(self, ino: int) -> bool:
        """Whether a reader of the log with inode ``ino`` may serve frames up to ``end`` without the lock.
        A record at 0 vouches for nothing, so it holds for any file: a writer writes one before it creates
        a log (``LogFiles.create``), and readers of a log being created need no lock."""
        return (self.ino == ino or self.end == 0) and self.boot == boot.boot_id()


def new_epoch() -> bytes:
    return secrets.token_bytes(8)


def encode(point: CommitPoint) -> bytes:
    offset, reason = point.damage if point.damage is not None else (0, "")
    body = _BODY.pack(
        MAGIC,
        VERSION,
        point.boot,
        point.epoch,
        point.ino,
        point.end,
        point.next_seq,
        offset,
        reason.encode("ascii", "replace")[:16],
    )
    return body + _CRC.pack(crc32c(body))


def commit_prefix(boot_id: bytes, epoch: bytes, ino: int) -> bytes:
    """The part of ``encode_commit``'s record that stays the same within one epoch of one log."""
    return _PREFIX.pack(MAGIC, VERSION, boot_id, epoch, ino)


def encode_commit(prefix: bytes, end: int, next_seq: int) -> bytes:
    """``encode(CommitPoint(boot_id, epoch, ino, end, next_seq))`` for ``prefix = commit_prefix(boot_id,
    epoch, ino)``: a commit's record, written once per commit (a third of ``encode``'s instructions)."""
    body = prefix + _CLEAN.pack(end, next_seq)
    return body + _CRC.pack(crc32c(body))


def decode(raw: bytes) -> CommitPoint | None:
    """The record in ``raw`` (the first ``RECORD_SIZE`` bytes of a lock file), or None: absent (an empty
    lock file, an older release's), invalidated, torn (a concurrent write), or of an unknown version."""
    if len(raw) < RECORD_SIZE or raw[:4] != MAGIC:
        return None
    body = raw[: _BODY.size]
    if _CRC.unpack_from(raw, _BODY.size)[0] != crc32c(body):
        return None
    _magic, version, boot_id, epoch, ino, end, next_seq, offset, reason = _BODY.unpack(body)
    if version != VERSION:
        return None
    text = reason.rstrip(b"\0").decode("ascii", "replace")
    return CommitPoint(boot_id, epoch, ino, end, next_seq, (offset, text) if text else None)


def read_raw(ops: FileOps, fd: int) -> bytes:
    return ops.pread(fd, RECORD_SIZE, 0)


def write_raw(ops: FileOps, fd: int, raw: bytes) -> None:
    ops.pwrite(fd, raw, 0)


def invalidate(ops: FileOps, lock_path: str) -> None:
    """Before a tool cuts, replaces or removes a log (holding its file lock): no reader may trust the old
    record any more. Raises ``OSError``. A missing lock file has no record to invalidate."""
    try:
        fd = ops.open(lock_path, os.O_RDWR)
    except FileNotFoundError:
        return
    try:
        write_raw(ops, fd, NO_RECORD)
    finally:
        ops.close(fd)


class PointFile:
    """A conversation's lock file as the holder of its commit point: one descriptor (not the flocked one:
    readers use it without the lock) and, once the file holds a whole header, the header mapped shared.
    ``map`` and ``close`` are called under the owner's I/O lock; ``read`` by any thread inside the owner's
    reader guard (the mapping is unmapped only behind it)."""

    __slots__ = ("ops", "fd", "_map", "_record", "_header", "_counter", "_writable")

    def __init__(self, ops: FileOps, fd: int) -> None:
        self.ops = ops
        self.fd = fd
        self._map: SharedMap | None = None
        self._record: Any = None  # ctypes arrays over the mapping (``.raw`` copies the bytes out)
        self._header: Any = None
        self._counter: Any = None
        self._writable: Any = None  # ``_record`` when the mapping is writable (``write``), else None

    @classmethod
    def open(cls, ops: FileOps, path: str) -> PointFile:
        return cls(ops, ops.open_writable(path, os.O_RDWR | os.O_CREAT))

    def read(self) -> bytes:
        """The record's bytes: from the mapping (no syscall), else one ``pread``."""
        record = self._record
        if record is not None:
            return record.raw  # type: ignore[no-any-return]
        return self.ops.pread(self.fd, RECORD_SIZE, 0)

    def header(self) -> bytes | None:
        """Record and change counter as one value, or None when not mapped."""
        header = self._header
        return None if header is None else header.raw

    def load(self) -> bytes:
        """``read`` for a (re)load: one ``pread`` of the header, and the mapping if the file holds it."""
        if self._record is not None:
            return self.read()
        data = self.ops.pread(self.fd, HEADER_SIZE, 0)
        if len(data) == HEADER_SIZE:
            self._map_header()
        return data[:RECORD_SIZE]

    def write(self, raw: bytes) -> None:
        """Move the record (the holder of the flock only). Raises ``OSError``. Through a writable mapping,
        a store into the page cache's page, which every ``pread`` and mapping of the file sees at once,
        as a ``pwrite``'s bytes (never fsynced either way): no syscall. A reader may see it torn, as it
        could a ``pwrite``'s: the CRC, or the comparison with a state's record, tells."""
        writable = self._writable
        if writable is not None:
            writable.raw = raw
            return
        self.ops.pwrite(self.fd, raw, 0)

    def write_new(self, raw: bytes) -> None:
        """A whole header (record, a zero counter), for a log about to be created. Raises ``OSError``."""
        self.ops.pwrite(self.fd, raw + _PAD + bytes(8), 0)
        self._map_header()

    def bump(self) -> None:
        """Change the counter (the holder of the flock, before it changes the log). Raises ``OSError``."""
        counter = self._counter
        if counter is not None and self._map is not None and self._map.writable:
            counter.value = (counter.value + 1) & 0xFFFFFFFFFFFFFFFF
            return
        old = self.ops.pread(self.fd, 8, _COUNTER)
        value = (_U64.unpack(old)[0] + 1) & 0xFFFFFFFFFFFFFFFF if len(old) == 8 else 1
        self.ops.pwrite(self.fd, _U64.pack(value), _COUNTER)
        if counter is None:
            self._map_header()  # the file holds a whole header now

    def _map_header(self) -> None:
        if self._map is not None:
            return
        mapped = self.ops.map_shared(self.fd, HEADER_SIZE)
        if mapped is not None:
            self._map = mapped
            self._record = mapped.view(RECORD_SIZE)
            self._header = mapped.view(HEADER_SIZE)
            self._counter = mapped.u64(_COUNTER)
            self._writable = self._record if mapped.writable else None

    def close(self) -> None:
        """Unmap and close (the owner, once no reader is inside its guard). Errors are dropped."""
        mapped, self._map = self._map, None
        self._record = self._header = self._counter = self._writable = None
        if mapped is not None:
            mapped.close()
        try:
            self.ops.close(self.fd)
        except OSError:
            pass
