"""The manifest's codec (docs/FORMAT.md, "Manifest"): records, snapshot framing, generations. Pure, no
I/O; used by the engine's ``SiteManifest``, fsck's ``ManifestView`` and the bench builder alike.

    record    u32 body length | u32 crc32c(body) | body
    body      u8 id length | id (ASCII) | i64 created_at | i64 last_appended_at | u64 log_size | u32 next_seq
    snapshot  SNAPSHOT_MAGIC | records | u32 crc32c(records)
    journal   records, appended (O_APPEND) by every process
    names     snapshot.<gen>, journal.<gen> (``layout.manifest_file``); the newest snapshot plus every
              journal of its generation or later is the state

Records merge by max (``Entry.newer_than``), so duplicates and reordering are harmless.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from crc32c import crc32c

from ..core.ids import is_valid_id
from .layout import parse_manifest_name

__all__ = [
    "SNAPSHOT_MAGIC",
    "Entry",
    "ERASED",
    "erased_entry",
    "Generations",
    "encode_record",
    "decode_records",
    "merge_record",
    "encode_snapshot",
    "snapshot_body",
    "generations",
]

_RECORD = struct.Struct("<qqQI")  # created_at (-1: none yet), last_appended_at (-1), log_size, next_seq
_FRAME = struct.Struct("<II")  # body length, crc32c(body)
SNAPSHOT_MAGIC = b"LSMS\x01\x00\x00\x00"
_CRC = struct.Struct("<I")


@dataclass(slots=True)
class Entry:
    created_at: int
    last_appended_at: int
    log_size: int
    next_seq: int

    def newer_than(self, other: Entry) -> bool:
        return (self.next_seq, self.last_appended_at, self.log_size) > (
            other.next_seq,
            other.last_appended_at,
            other.log_size,
        )


def encode_record(conversation_id: str, entry: Entry) -> bytes:
    cid = conversation_id.encode()
    body = (
        bytes([len(cid)])
        + cid
        + _RECORD.pack(entry.created_at, entry.last_appended_at, entry.log_size, entry.next_seq)
    )
    return _FRAME.pack(len(body), crc32c(body)) + body


def decode_records(buf: bytes, pos: int = 0) -> tuple[list[tuple[str, Entry]], int, bool]:
    """Records from ``buf[pos:]``: (records, position after the last one decoded, damaged?).

    Damaged bytes (a record torn by a power loss: zeros, garbage, a partial write) are skipped when a
    valid record follows them: after a crash, the next boot appends its records (including fdatasynced
    creation records) *after* the torn tail, and they must not be hidden behind it. Bytes with no valid
    record after them are left unconsumed (the returned position points at them): they may be a record
    another process is still writing, or a torn tail that later records will skip."""
    out: list[tuple[str, Entry]] = []
    damaged = False
    while pos + _FRAME.size <= len(buf):
        record = _record_at(buf, pos)
        if record is None:
            resume = _next_record(buf, pos + 1)
            if resume is None:
                return out, pos, damaged or _definitely_bad(buf, pos)
            damaged, pos = True, resume
            continue
        cid, entry, pos = record
        out.append((cid, entry))
    return out, pos, damaged


_MIN_BODY = 1 + 8 + _RECORD.size  # the shortest conversation id is 8 characters
_MAX_BODY = 1 + 64 + _RECORD.size


def _record_at(buf: bytes, pos: int) -> tuple[str, Entry, int] | None:
    """The complete, valid record at ``pos`` as (id, entry, end), or None."""
    if pos + _FRAME.size > len(buf):
        return None
    length, crc = _FRAME.unpack_from(buf, pos)
    end = pos + _FRAME.size + length
    if not _MIN_BODY <= length <= _MAX_BODY or end > len(buf):
        return None
    body = buf[pos + _FRAME.size : end]
    if crc32c(body) != crc or body[0] + 1 + _RECORD.size != length:
        return None
    cid = body[1 : 1 + body[0]].decode("ascii", "replace")
    if not is_valid_id(cid):
        return None
    return cid, Entry(*_RECORD.unpack_from(body, 1 + body[0])), end


def _next_record(buf: bytes, pos: int) -> int | None:
    """Offset of the first valid record at or after ``pos`` (a CRC-checked resync point), or None."""
    limit = len(buf) - _FRAME.size - _MIN_BODY
    while pos <= limit:
        (length,) = struct.unpack_from("<I", buf, pos)
        if _MIN_BODY <= length <= _MAX_BODY and _record_at(buf, pos) is not None:
            return pos
        pos += 1
    return None


def _definitely_bad(buf: bytes, pos: int) -> bool:
    """True if the bytes at ``pos`` can never become a valid record (not merely an incomplete one)."""
    length: int = _FRAME.unpack_from(buf, pos)[0]
    if not _MIN_BODY <= length <= _MAX_BODY:
        return True
    end = pos + _FRAME.size + length
    return end <= len(buf)  # complete yet invalid


ERASED = -2  # created_at of an erasure record (real ones are >= 0, or -1 for "none yet")


def erased_entry() -> Entry:
    return Entry(ERASED, -1, 0, 0)


def merge_record(entries: dict[str, Entry], cid: str, entry: Entry) -> tuple[bool, Entry | None]:
    """Apply one record to ``entries`` by the merge rule: the higher (next_seq, last_appended_at,
    log_size) wins, a record without created_at (-1) keeps the known one, and an erasure record
    (``ERASED``) drops the conversation. Returns (changed?, the entry it replaced or removed). The engine
    and fsck both load through this."""
    current = entries.get(cid)
    if entry.created_at == ERASED:
        if current is None:
            return False, None
        del entries[cid]
        return True, current
    if current is not None and not entry.newer_than(current):
        return False, current
    if current is not None and entry.created_at < 0:
        entry.created_at = current.created_at
    entries[cid] = entry
    return True, current


def encode_snapshot(entries: Mapping[str, Entry]) -> bytes:
    """A whole snapshot file: magic, one record per conversation, crc32c of the records."""
    body = b"".join(encode_record(cid, entry) for cid, entry in entries.items())
    return SNAPSHOT_MAGIC + body + _CRC.pack(crc32c(body))


def snapshot_body(data: bytes) -> bytes | None:
    """The records section of a snapshot file, or None if its magic or checksum fails."""
    if len(data) < len(SNAPSHOT_MAGIC) + _CRC.size or not data.startswith(SNAPSHOT_MAGIC):
        return None
    body = data[len(SNAPSHOT_MAGIC) : -_CRC.size]
    return body if _CRC.unpack(data[-_CRC.size :])[0] == crc32c(body) else None


@dataclass(frozen=True, slots=True)
class Generations:
    """The manifest files in a directory listing, by kind, generations ascending."""

    snapshots: tuple[int, ...]
    journals: tuple[int, ...]
    others: tuple[str, ...]  # names that are not manifest files

    @property
    def base(self) -> int:
        """The generation of the newest snapshot (0: none)."""
        return self.snapshots[-1] if self.snapshots else 0

    @property
    def newest(self) -> int:
        """The generation records are appended to now."""
        live = self.live_journals
        return live[-1] if live else self.base

    @property
    def live_journals(self) -> list[int]:
        """Journals the state is read from: those of the newest snapshot's generation or later."""
        return [g for g in self.journals if g >= self.base]


def generations(names: Iterable[str]) -> Generations:
    snaps, journals, others = [], [], []
    for name in names:
        parsed = parse_manifest_name(name)
        if parsed is None:
            others.append(name)
        elif parsed[0] == "snapshot":
            snaps.append(parsed[1])
        else:
            journals.append(parsed[1])
    return Generations(tuple(sorted(snaps)), tuple(sorted(journals)), tuple(others))
