"""Manifest snapshots (docs/FORMAT.md, "Site manifest"): the packed v2 layout, and v1 read for upgrades.
Pure, no I/O. ``Snapshot`` is also the engine's in-memory base: its columns are views over the file's
bytes, so loading a million conversations costs one read, one CRC and no object per conversation.

    v1  "LSMS" 01 00 00 00 | records (codec) | u32 crc32c(records)        release 41344b8
    v2  "LSMS" 02 00 00 00 | header | sessions | offsets | ids | columns | slots | u32 crc32c(all after magic)
        header   u32 count | u32 listed | u32 slot count | u32 id bytes | u32 sessions
        sessions 36 bytes each: boot id (16) | u32 pid | u64 start | u64 nonce   (open at the cut)
        offsets  u32 x (count + 1): id i is ids[offsets[i]:offsets[i + 1]]
        ids      ASCII, concatenated
        columns  i64 created_at x count | i64 last_appended_at x count | u64 log_size x count |
                 u32 next_seq x count
        slots    u32 x slot count (a power of two >= 2 x count): 0 empty, else index + 1; an id's home
                 slot is crc32c(id) & (slot count - 1), then linear probing
    Entries 0..listed-1 are listed (next_seq > 0) in listing order: last_appended_at descending, then id
    ascending. Entries listed..count-1 have no items yet, by id.
"""

from __future__ import annotations

import struct
import sys
from array import array
from bisect import bisect_right
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from crc32c import crc32c

from .codec import Entry, Session, decode_records, merge_record

__all__ = ["MAGIC_V1", "MAGIC_V2", "Snapshot", "encode_snapshot", "decode_snapshot", "listing_key"]

MAGIC_V1 = b"LSMS\x01\x00\x00\x00"
MAGIC_V2 = b"LSMS\x02\x00\x00\x00"
_HEADER = struct.Struct("<5I")
_SESSION = struct.Struct("<16sIQQ")
_CRC = struct.Struct("<I")
# Columns are read in place as native arrays: that needs a little-endian host (else they are copied).
_NATIVE = sys.byteorder == "little"
Column = Sequence[int]  # a memoryview over the file's bytes (or an array where bytes are swapped)


def listing_key(conversation_id: str, entry: Entry) -> tuple[int, str]:
    """The listing order's key: most recently appended first, then by id."""
    return (-entry.last_appended_at, conversation_id)


@dataclass(frozen=True, slots=True)
class Snapshot:
    """Decoded snapshot: packed, immutable. ``version`` is the file's (1 or 2)."""

    version: int
    count: int
    listed: int
    sessions: tuple[Session, ...]
    offsets: Column  # u32 x (count + 1)
    ids: bytes | memoryview
    created: Column
    last: Column
    size: Column
    next_seq: Column
    slots: Column

    def id_at(self, i: int) -> str:
        offsets = self.offsets
        return str(self.ids[offsets[i] : offsets[i + 1]], "ascii")

    def entry_at(self, i: int) -> Entry:
        return Entry(self.created[i], self.last[i], self.size[i], self.next_seq[i])

    def key_at(self, i: int) -> tuple[int, str]:
        return (-self.last[i], self.id_at(i))

    def find(self, conversation_id: str) -> int | None:
        """Index of ``conversation_id``, or None."""
        slots = self.slots
        if not slots:
            return None
        raw = conversation_id.encode()
        mask = len(slots) - 1
        slot = crc32c(raw) & mask
        offsets, ids = self.offsets, self.ids
        while True:
            value = slots[slot]
            if value == 0:
                return None
            i = value - 1
            if ids[offsets[i] : offsets[i + 1]] == raw:
                return i
            slot = (slot + 1) & mask

    def get(self, conversation_id: str) -> Entry | None:
        i = self.find(conversation_id)
        return None if i is None else self.entry_at(i)

    def first_listed_after(self, key: tuple[int, str]) -> int:
        """Index of the first listed entry whose key sorts after ``key``."""
        return bisect_right(range(self.listed), key, key=self.key_at)

    def items(self) -> Iterator[tuple[str, Entry]]:
        for i in range(self.count):
            yield self.id_at(i), self.entry_at(i)


EMPTY = Snapshot(
    2, 0, 0, (), array("I", [0]), b"", array("q"), array("q"), array("Q"), array("I"), array("I")
)


def encode_snapshot(entries: Iterable[tuple[str, Entry]], sessions: Iterable[Session] = ()) -> bytes:
    """A whole v2 snapshot file of ``entries`` ((id, entry) pairs, ids unique) and the open sessions."""
    pairs = sorted(entries, key=lambda p: (p[1].next_seq == 0, listing_key(*p) if p[1].next_seq else p[0]))
    count = len(pairs)
    listed = sum(1 for _, e in pairs if e.next_seq > 0)
    raw_ids = [cid.encode("ascii") for cid, _ in pairs]
    offsets = array("I", [0])
    total = 0
    for raw in raw_ids:
        total += len(raw)
        offsets.append(total)
    n_slots = 8
    while n_slots < 2 * count:
        n_slots *= 2
    slots = array("I", bytes(4 * n_slots))
    mask = n_slots - 1
    for i, raw in enumerate(raw_ids):
        slot = crc32c(raw) & mask
        while slots[slot]:
            slot = (slot + 1) & mask
        slots[slot] = i + 1
    columns = [
        array("q", [e.created_at for _, e in pairs]),
        array("q", [e.last_appended_at for _, e in pairs]),
        array("Q", [e.log_size for _, e in pairs]),
        array("I", [e.next_seq for _, e in pairs]),
        slots,
    ]
    session_list = list(sessions)
    parts = [_HEADER.pack(count, listed, n_slots, total, len(session_list))]
    parts += [_SESSION.pack(s.boot_id, s.pid, s.start, s.nonce) for s in session_list]
    parts += [_little(offsets), b"".join(raw_ids)] + [_little(column) for column in columns]
    body = b"".join(parts)
    return MAGIC_V2 + body + _CRC.pack(crc32c(body))


def _little(column: array[int]) -> bytes:
    if not _NATIVE:
        column = array(column.typecode, column)
        column.byteswap()
    return column.tobytes()


def decode_snapshot(data: bytes) -> Snapshot | None:
    """The snapshot in a file's bytes (v1 or v2), or None if its magic, checksum or layout is bad."""
    if len(data) < len(MAGIC_V2) + _CRC.size:
        return None
    magic, body = data[: len(MAGIC_V2)], memoryview(data)[len(MAGIC_V2) : -_CRC.size]
    if magic not in (MAGIC_V1, MAGIC_V2) or _CRC.unpack(data[-_CRC.size :])[0] != crc32c(body):
        return None
    if magic == MAGIC_V1:
        return _from_v1(bytes(body))
    try:
        return _decode_v2(body)
    except (struct.error, ValueError, TypeError):  # a CRC-valid file whose sizes disagree: damaged
        return None


def _decode_v2(body: memoryview) -> Snapshot | None:
    count, listed, n_slots, id_bytes, n_sessions = _HEADER.unpack_from(body, 0)
    pos = _HEADER.size
    sessions = tuple(Session(*_SESSION.unpack_from(body, pos + k * _SESSION.size)) for k in range(n_sessions))
    pos += n_sessions * _SESSION.size

    def take(typecode: str, n: int) -> Column:
        nonlocal pos
        width = array(typecode).itemsize
        chunk = body[pos : pos + width * n]
        if len(chunk) != width * n:
            raise ValueError("short snapshot")
        pos += width * n
        if _NATIVE:
            return chunk.cast(typecode)  # type: ignore[call-overload,no-any-return]
        column = array(typecode, bytes(chunk))
        column.byteswap()
        return column

    offsets = take("I", count + 1)
    ids = body[pos : pos + id_bytes]
    pos += id_bytes
    created, last, size, next_seq = (take(code, count) for code in ("q", "q", "Q", "I"))
    slots = take("I", n_slots)
    if pos != len(body) or listed > count or offsets[count] != id_bytes or n_slots & (n_slots - 1):
        return None
    return Snapshot(2, count, listed, sessions, offsets, ids, created, last, size, next_seq, slots)


def _from_v1(records_bytes: bytes) -> Snapshot | None:
    """A v1 snapshot (per-record CRCs), repacked: once after an upgrade, until the next compaction."""
    entries: dict[str, Entry] = {}
    records, pos, damaged = decode_records(records_bytes)
    if damaged or pos != len(records_bytes):
        return None
    for cid, entry in records:
        merge_record(entries, cid, entry)
    decoded = decode_snapshot(encode_snapshot(entries.items()))
    assert decoded is not None
    return replace(decoded, version=1)
