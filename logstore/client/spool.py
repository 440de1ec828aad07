"""The writer's optional spool: an append-only local file of the batches handed over and not yet settled.

``BackgroundWriter.append`` writes each batch here (one ``write``, in the caller's thread, before it
returns): from then on a crash of the agent process loses nothing, since the page cache outlives the
process. An fdatasync makes it survive power loss too: in the background every ``sync_interval`` seconds
(``SpoolSync.BACKGROUND``), or before ``append`` returns (``SpoolSync.ALWAYS``, a disk flush per batch).

Records, each ``<u32 length><u32 crc32c(kind + body)><u8 kind><body: msgpack>``:

- ``B`` [id, conversation_id, items JSON]: a batch handed over;
- ``D`` [id, conversation_id, next_seq | None]: that batch is settled (stored at ..next_seq - 1, or
  reported to the callback); written before the conversation's next batch is sent;
- ``P`` [conversation_id, next_seq]: where the writer knew the conversation's log to end.

On open the file is read up to its first bad record (a torn tail: everything after it is dropped,
logged), the batches without a ``D`` are returned in order, and the file is rewritten with only them
and the positions (temp + fsync + rename + directory fsync). One process owns a spool: ``flock``.
"""

from __future__ import annotations

import fcntl
import logging
import os
import struct
import threading
from dataclasses import dataclass

import crc32c
import msgspec

__all__ = ["Spool", "SpooledBatch", "SpoolLocked"]

log = logging.getLogger("logstore.client")
_HEAD = struct.Struct("<IIB")
_BATCH, _DONE, _POS = b"B"[0], b"D"[0], b"P"[0]
_MAX_RECORD = 64 << 20


class SpoolLocked(RuntimeError):
    """Another writer (this process or another) holds the spool."""


@dataclass(frozen=True)
class SpooledBatch:
    conversation_id: str
    items_json: bytes


def _record(kind: int, body: object) -> bytes:
    data = msgspec.msgpack.encode(body)
    crc = crc32c.crc32c(bytes([kind]) + data)
    return _HEAD.pack(len(data), crc, kind) + data


def _durable(fd: int) -> None:
    """The rewrite's fsync of its new file (one place, for the tests that hold it)."""
    os.fsync(fd)


def _fsync_dir(path: str) -> None:
    fd = os.open(os.path.dirname(os.path.abspath(path)), os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class Spool:
    """Not thread-safe by itself: the writer calls it under its own lock (``sync`` excepted)."""

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = os.path.abspath(os.fspath(path))
        self._lock_fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(self._lock_fd)
            raise SpoolLocked(f"spool {self.path} is in use by another writer") from None
        self._fd = -1
        self.size = 0
        self._dirty = False
        self._since: list[bytes] | None = None  # records written while a reset runs
        self._tmp_fd = -1
        self._tmp_size = 0

    # -- open: replay and compact -----------------------------------------------------------------

    def load(self) -> tuple[list[SpooledBatch], dict[str, int]]:
        """The batches not settled, in hand-over order, and the known log ends; the file rewritten to hold
        only those."""
        try:
            with open(self.path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            data = b""
        pending: dict[int, SpooledBatch] = {}
        positions: dict[str, int] = {}
        offset = 0
        while offset + _HEAD.size <= len(data):
            length, crc, kind = _HEAD.unpack_from(data, offset)
            body = data[offset + _HEAD.size : offset + _HEAD.size + length]
            if length > _MAX_RECORD or len(body) < length or crc32c.crc32c(bytes([kind]) + body) != crc:
                break
            fields = msgspec.msgpack.decode(body)
            if kind == _BATCH:
                pending[fields[0]] = SpooledBatch(fields[1], fields[2])
            elif kind == _DONE:
                pending.pop(fields[0], None)
                if fields[2] is not None:
                    positions[fields[1]] = fields[2]
            elif kind == _POS:
                positions[fields[0]] = fields[1]
            offset += _HEAD.size + length
        if offset < len(data):
            log.warning(
                "spool %s: %d bytes after offset %d are torn or damaged; dropped",
                self.path,
                len(data) - offset,
                offset,
            )
        batches = list(pending.values())
        self._rewrite([(i + 1, b) for i, b in enumerate(batches)], positions)
        return batches, positions

    def _rewrite(self, batches: list[tuple[int, SpooledBatch]], positions: dict[str, int]) -> None:
        self.begin_reset()
        self.write_reset(batches, positions)
        self.finish_reset()
        _fsync_dir(self.path)

    # -- a reset in steps, so that the writer's lock is held only for the short ones ----------------
    #
    # begin_reset (under the lock): records written from now on are also kept aside;
    # write_reset (no lock): the temp file with the pending batches and positions, fsync'd;
    # take_since (under the lock) + append_reset (no lock): copy what was written meanwhile, fsync'd,
    #   until take_since finds nothing new, and then, still under the lock,
    # finish_reset: rename over the spool and write to the new file from then on;
    # fsync_dir (no lock). A crash at any point leaves the old file (every record went to it until the
    # rename) or the new one (its content fsync'd before the rename).

    def begin_reset(self) -> None:
        self._since = []

    def write_reset(self, batches: list[tuple[int, SpooledBatch]], positions: dict[str, int]) -> None:
        content = b"".join(
            [_record(_POS, [cid, seq]) for cid, seq in positions.items()]
            + [_record(_BATCH, [i, b.conversation_id, b.items_json]) for i, b in batches]
        )
        self._tmp_fd = os.open(self.path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
        self._tmp_size = 0
        self.append_reset([content])

    def take_since(self) -> list[bytes]:
        since, self._since = self._since or [], []
        return since

    def append_reset(self, records: list[bytes]) -> None:
        data = memoryview(b"".join(records))
        self._tmp_size += len(data)
        while data:
            data = data[os.write(self._tmp_fd, data) :]
        _durable(self._tmp_fd)

    def finish_reset(self) -> None:
        os.replace(self.path + ".tmp", self.path)
        if self._fd >= 0:
            os.close(self._fd)
        self._fd, self._tmp_fd = self._tmp_fd, -1
        self.size, self._since, self._dirty = self._tmp_size, None, False

    def abort_reset(self) -> None:
        """A reset that failed: the old file, which every record went to, stays the spool."""
        self._since = None
        if self._tmp_fd >= 0:
            os.close(self._tmp_fd)
            self._tmp_fd = -1

    def fsync_dir(self) -> None:
        _fsync_dir(self.path)

    def reset_beside(
        self, lock: threading.Lock, pending: list[tuple[int, SpooledBatch]], positions: dict[str, int]
    ) -> None:
        """The writer's reset, begun (``begin_reset``) under its ``lock``: the file I/O and fsyncs outside
        it, so an ``append`` meanwhile writes to the old file and is copied over. A failure leaves the old
        file in use (logged)."""
        try:
            self.write_reset(pending, positions)
            while True:
                with lock:
                    records = self.take_since()
                    if not records:
                        self.finish_reset()
                        break
                self.append_reset(records)
            self.fsync_dir()
        except OSError:
            log.exception("spool %s: rewrite failed; the old file stays in use", self.path)
            with lock:
                self.abort_reset()

    # -- the writer's calls -----------------------------------------------------------------------

    def _write(self, record: bytes) -> None:
        view = memoryview(record)
        while view:
            view = view[os.write(self._fd, view) :]
        self.size += len(record)
        self._dirty = True
        if self._since is not None:
            self._since.append(record)

    def add(self, batch_id: int, conversation_id: str, items_json: bytes) -> None:
        self._write(_record(_BATCH, [batch_id, conversation_id, items_json]))

    def done(self, batch_id: int, conversation_id: str, next_seq: int | None) -> None:
        self._write(_record(_DONE, [batch_id, conversation_id, next_seq]))

    def reset(self, pending: list[tuple[int, SpooledBatch]], positions: dict[str, int]) -> None:
        """Start the file again with only the ``pending`` batches (ids kept) and the positions: temp +
        fsync + rename, so a crash mid-way leaves the old file or the new one, each with every batch not
        settled."""
        self._rewrite(pending, positions)

    def sync(self) -> None:
        if self._dirty and self._fd >= 0:
            self._dirty = False
            os.fdatasync(self._fd)

    def sync_handle(self) -> int:
        """Under the writer's lock: a descriptor to fdatasync outside it (so ``append`` never waits on the
        disk behind a background sync), or -1 when nothing was written since the last one."""
        if not self._dirty or self._fd < 0:
            return -1
        self._dirty = False
        return os.dup(self._fd)

    def close(self) -> None:
        if self._fd >= 0:
            try:
                self.sync()
            finally:
                os.close(self._fd)
                self._fd = -1
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
