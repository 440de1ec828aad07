"""The manifest's journal codec (docs/FORMAT.md, "Site manifest"): records, session marks, the merge
rule, generations. Pure, no I/O; used by the engine's ``SiteManifest``, fsck's ``ManifestView``, backup and
the bench builder alike. Snapshots are ``snapshot``.

    record    u32 body length | u32 crc32c(body) | body
    body      u8 id length | id (ASCII) | i64 created_at | i64 last_appended_at | u64 log_size | u32 next_seq
    mark      body = u8 0 | u8 kind (1 open, 2 close) | boot id (16) | u32 pid | u64 start | u64 nonce
    journal   records and marks, appended (O_APPEND) by every process
    names     snapshot.<gen>, journal.<gen> (``layout.manifest_file``); the newest snapshot plus every
              journal of its generation or later is the state

Records merge by max (``Entry.newer_than``), so duplicates and reordering are harmless. A session mark is
38 bytes of body, inside the record length range, and its first byte (0) can never be an id length (ids
have 8-64 characters), so the v1 decoder's framing and resync apply unchanged.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable
from dataclasses import dataclass
from typing import NamedTuple

from crc32c import crc32c

from ...core.ids import is_valid_id
from ..layout import parse_manifest_name

__all__ = [
    "Entry",
    "ERASED",
    "erased_entry",
    "Session",
    "Mark",
    "Decoded",
    "Generations",
    "encode_record",
    "encode_mark",
    "decode_journal",
    "decode_records",
    "first_gap",
    "record_offsets",
    "merged",
    "merge_record",
    "generations",
]

_RECORD = struct.Struct("<qqQI")  # created_at (-1: none yet), last_appended_at (-1), log_size, next_seq
_FRAME = struct.Struct("<II")  # body length, crc32c(body)
_MARK = struct.Struct("<BB16sIQQ")  # 0, kind, boot id, pid, process start (clock ticks), nonce
MARK_OPEN, MARK_CLOSE = 1, 2


class Entry(NamedTuple):
    """A conversation's listing state. Immutable; a NamedTuple, not a frozen dataclass: one is built per
    commit record, and the frozen ``__init__`` cost ~3x as much (docs/PERFORMANCE.md)."""

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
    body = b"".join((_ID_LENGTH[len(cid)], cid, _RECORD.pack(*entry)))  # (created, last, size, next_seq)
    return _FRAME.pack(len(body), crc32c(body)) + body


_ID_LENGTH = [bytes([n]) for n in range(256)]  # the u8 id length, without a list and bytes() per record


@dataclass(frozen=True, slots=True)
class Session:
    """One writer's session: a ``SiteManifest`` of one process (pid and its start time, in clock ticks
    since boot, name the process; the nonce tells two stores of one process apart)."""

    boot_id: bytes  # 16 bytes: /proc/sys/kernel/random/boot_id
    pid: int
    start: int
    nonce: int


@dataclass(frozen=True, slots=True)
class Mark:
    kind: int  # MARK_OPEN or MARK_CLOSE
    session: Session


@dataclass(frozen=True, slots=True)
class Decoded:
    records: list[tuple[str, Entry]]
    marks: list[Mark]
    pos: int  # after the last record decoded
    damaged: bool  # bytes were skipped before a valid record


def encode_mark(kind: int, session: Session) -> bytes:
    body = _MARK.pack(0, kind, session.boot_id, session.pid, session.start, session.nonce)
    return _FRAME.pack(len(body), crc32c(body)) + body


def decode_records(buf: bytes, pos: int = 0) -> tuple[list[tuple[str, Entry]], int, bool]:
    """``decode_journal`` without the session marks: (records, position, damaged?)."""
    decoded = decode_journal(buf, pos)
    return decoded.records, decoded.pos, decoded.damaged


def decode_journal(buf: bytes, pos: int = 0) -> Decoded:
    """Records and marks from ``buf[pos:]``.

    Damaged bytes (a record torn by a power loss: zeros, garbage, a partial write) are skipped when a
    valid record follows them: after a crash, the next boot appends its records (including fdatasynced
    creation records) *after* the torn tail, and they must not be hidden behind it. Bytes with no valid
    record after them are left unconsumed (the returned position points at them): they may be a record
    another process is still writing, or a torn tail that later records will skip."""
    out: list[tuple[str, Entry]] = []
    marks: list[Mark] = []
    damaged = False
    while pos + _FRAME.size <= len(buf):
        record = _record_at(buf, pos)
        if record is None:
            resume = _next_record(buf, pos + 1)
            if resume is None:
                return Decoded(out, marks, pos, damaged or _definitely_bad(buf, pos))
            damaged, pos = True, resume
            continue
        cid, entry, pos = record
        if isinstance(entry, Mark):
            marks.append(entry)
        else:
            out.append((cid, entry))
    return Decoded(out, marks, pos, damaged)


_MIN_BODY = 1 + 8 + _RECORD.size  # the shortest conversation id is 8 characters
_MAX_BODY = 1 + 64 + _RECORD.size


def _record_at(buf: bytes, pos: int) -> tuple[str, Entry | Mark, int] | None:
    """The complete, valid record or mark at ``pos`` as (id, entry or mark, end), or None."""
    if pos + _FRAME.size > len(buf):
        return None
    length, crc = _FRAME.unpack_from(buf, pos)
    end = pos + _FRAME.size + length
    if not _MIN_BODY <= length <= _MAX_BODY or end > len(buf):
        return None
    body = buf[pos + _FRAME.size : end]
    if crc32c(body) != crc:
        return None
    if body[0] == 0:
        if length != _MARK.size or body[1] not in (MARK_OPEN, MARK_CLOSE):
            return None
        _, kind, boot, pid, start, nonce = _MARK.unpack(body)
        return "", Mark(kind, Session(boot, pid, start, nonce)), end
    if body[0] + 1 + _RECORD.size != length:
        return None
    cid = body[1 : 1 + body[0]].decode("ascii", "replace")
    if not is_valid_id(cid):
        return None
    return cid, Entry(*_RECORD.unpack_from(body, 1 + body[0])), end


def record_offsets(buf: bytes) -> list[int]:
    """Start of each record or mark from the beginning of ``buf``, up to the first bytes that are not
    one; that offset (``len(buf)`` if none) comes last."""
    offsets = [0]
    while (found := _record_at(buf, offsets[-1])) is not None:
        offsets.append(found[2])
    return offsets


def first_gap(buf: bytes) -> int:
    """Offset of the first bytes of ``buf`` that are not a valid record or mark (``len(buf)``: none)."""
    return record_offsets(buf)[-1]


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


def merged(current: Entry | None, entry: Entry) -> Entry | None:
    """THE merge rule: the state after applying record ``entry`` to ``current`` (None: not known). The
    higher (next_seq, last_appended_at, log_size) wins, a record without created_at (-1) keeps the known
    one, and an erasure record (``ERASED``) drops the conversation (None). Returns ``current`` itself
    when the record changes nothing."""
    if entry.created_at == ERASED:
        return None
    if current is not None and not entry.newer_than(current):
        return current
    if current is not None and entry.created_at < 0:
        return entry._replace(created_at=current.created_at)
    return entry


def merge_record(entries: dict[str, Entry], cid: str, entry: Entry) -> tuple[bool, Entry | None]:
    """``merged`` on a dict (fsck's view, backup). Returns (changed?, the entry it replaced or removed)."""
    current = entries.get(cid)
    new = merged(current, entry)
    if new is current:
        return False, current
    if new is None:
        del entries[cid]
    else:
        entries[cid] = new
    return True, current


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
