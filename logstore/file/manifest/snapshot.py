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
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace

from crc32c import crc32c

from .codec import Entry, Session, decode_records, merge_record

__all__ = [
    "MAGIC_V1",
    "MAGIC_V2",
    "Snapshot",
    "encode_snapshot",
    "merge_snapshot",
    "decode_snapshot",
    "listing_key",
]

MAGIC_V1 = b"LSMS\x01\x00\x00\x00"
MAGIC_V2 = b"LSMS\x02\x00\x00\x00"
_HEADER = struct.Struct("<5I")
_SESSION = struct.Struct("<16sIQQ")
_CRC = struct.Struct("<I")
_CHUNK = 1 << 16  # elements per C-level loop of a merge, between which other threads may run
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
    slots = _slots_for(raw_ids)
    columns = [
        array("q", [e.created_at for _, e in pairs]),
        array("q", [e.last_appended_at for _, e in pairs]),
        array("Q", [e.log_size for _, e in pairs]),
        array("I", [e.next_seq for _, e in pairs]),
        slots,
    ]
    return _file(count, listed, sessions, offsets, b"".join(raw_ids), [_little(c) for c in columns])


def _file(
    count: int,
    listed: int,
    sessions: Iterable[Session],
    offsets: array[int],
    ids: bytes,
    columns: list[bytes],  # created, last, size, next_seq, slots: little-endian bytes
) -> bytes:
    session_list = list(sessions)
    parts = [_HEADER.pack(count, listed, len(columns[-1]) // 4, len(ids), len(session_list))]
    parts += [_SESSION.pack(s.boot_id, s.pid, s.start, s.nonce) for s in session_list]
    parts += [_little(offsets), ids, *columns]
    body = b"".join(parts)
    return MAGIC_V2 + body + _CRC.pack(crc32c(body))


def _slot_count(count: int) -> int:
    """THE slot count rule: the smallest power of two >= 2 x count (at least 8)."""
    n_slots = 8
    while n_slots < 2 * count:
        n_slots *= 2
    return n_slots


def _place(slots: array[int], raw: bytes, value: int) -> None:
    """THE slot rule: ``value`` into the first empty slot from the id's home (linear probing)."""
    mask = len(slots) - 1
    slot = crc32c(raw) & mask
    while slots[slot]:
        slot = (slot + 1) & mask
    slots[slot] = value


def _slots_for(raw_ids: Sequence[bytes]) -> array[int]:
    slots = array("I", bytes(4 * _slot_count(len(raw_ids))))
    for i, raw in enumerate(raw_ids):
        _place(slots, raw, i + 1)
    return slots


def merge_snapshot(
    base: Snapshot, changes: Iterable[tuple[str, Entry | None]], sessions: Iterable[Session] = ()
) -> bytes:
    """The snapshot file of ``base`` with ``changes`` applied ((id, entry) pairs, ids unique; None: gone),
    equal entry for entry and in listing order to ``encode_snapshot`` of the merged entries, in time
    proportional to the changes plus a copy of the base: its sorted runs are copied as they are between
    the changed entries, and its slot table is kept, renumbered, while the slot count stays the same
    (docs/PERFORMANCE.md, "Manifest compaction at scale")."""
    if not _NATIVE:  # the columns are byte-swapped copies: write them the plain way
        merged = dict(base.items())
        for cid, entry in changes:
            if entry is None:
                merged.pop(cid, None)
            else:
                merged[cid] = entry
        return encode_snapshot(merged.items(), sessions)
    find, id_at, listed = base.find, base.id_at, base.listed
    removed: list[int] = []  # base indices that change place or go
    erased: list[int] = []
    fresh: tuple[list[tuple[str, Entry, int | None]], list[tuple[str, Entry, int | None]]] = ([], [])
    for cid, entry in changes:
        i = find(cid)
        if i is not None:
            removed.append(i)
        if entry is None:
            if i is not None:
                erased.append(i)
        else:
            fresh[entry.next_seq == 0].append((cid, entry, i))
    removed.sort()
    now_listed, unlisted = fresh
    now_listed.sort(key=lambda f: listing_key(f[0], f[1]))
    unlisted.sort(key=lambda f: f[0])
    rev_last = base.last[:listed][::-1]  # non-decreasing: bisect on it, no key function

    def listed_at(cid: str, entry: Entry) -> int:
        """How many listed base entries sort before (cid, entry)."""
        t = entry.last_appended_at
        lo, hi = listed - bisect_right(rev_last, t), listed - bisect_left(rev_last, t)
        return lo + bisect_left(range(lo, hi), cid, key=id_at)  # ties on the instant: by id

    def unlisted_at(cid: str) -> int:
        return listed + bisect_left(range(listed, base.count), cid, key=id_at)

    plan: list[tuple[int, int] | tuple[str, Entry, int | None]] = []  # base runs [a, b), fresh entries
    r = pos = 0

    def copy_to(stop: int) -> None:  # the base entries before ``stop``, less the removed ones
        nonlocal r, pos
        while r < len(removed) and removed[r] < stop:
            if removed[r] > pos:
                plan.append((pos, removed[r]))
            pos, r = removed[r] + 1, r + 1
        if stop > pos:
            plan.append((pos, stop))
            pos = stop

    for item in now_listed:
        copy_to(listed_at(item[0], item[1]))
        plan.append(item)
    copy_to(listed)
    for item in unlisted:
        copy_to(unlisted_at(item[0]))
        plan.append(item)
    copy_to(base.count)
    new_listed = len(now_listed) + listed - sum(1 for i in removed if i < listed)
    return _assemble(base, plan, erased, new_listed, sessions)


def _assemble(
    base: Snapshot,
    plan: list[tuple[int, int] | tuple[str, Entry, int | None]],
    erased: list[int],
    listed: int,
    sessions: Iterable[Session],
) -> bytes:
    old_offsets, old_ids = base.offsets, base.ids
    old_columns = (base.created, base.last, base.size, base.next_seq)
    created, last, size, next_seq = columns = (array("q"), array("q"), array("Q"), array("I"))
    ids: list[bytes | memoryview] = []
    offsets = array("I", [0])
    remap = array("I", bytes(4 * (base.count + 1)))  # old index + 1 -> new index + 1 (0: gone)
    added: list[bytes] = []  # new index + 1 -> id, for entries the base did not have
    new_ids: list[int] = []
    count = total = 0
    for step in plan:
        if len(step) == 2:
            a, b = step
            for column, old in zip(columns, old_columns, strict=True):
                column.frombytes(memoryview(old)[a:b].cast("B"))  # type: ignore[arg-type]
            ids.append(old_ids[old_offsets[a] : old_offsets[b]])
            shift = (total - old_offsets[a]).__add__
            for c in range(a + 1, b + 1, _CHUNK):  # chunks: the GIL can change hands in between
                offsets.extend(map(shift, old_offsets[c : min(c + _CHUNK, b + 1)]))
            remap[a + 1 : b + 1] = array("I", range(count + 1, count + 1 + b - a))
            total += old_offsets[b] - old_offsets[a]
            count += b - a
            continue
        cid, entry, i = step
        raw = cid.encode("ascii")
        created.append(entry.created_at)
        last.append(entry.last_appended_at)
        size.append(entry.log_size)
        next_seq.append(entry.next_seq)
        ids.append(raw)
        total += len(raw)
        offsets.append(total)
        count += 1
        if i is None:
            added.append(raw)
            new_ids.append(count)
        else:
            remap[i + 1] = count
    id_bytes = b"".join(ids)
    if _slot_count(count) != len(base.slots):
        slots = _slots_for([id_bytes[offsets[k] : offsets[k + 1]] for k in range(count)])
    else:
        slots, renumber, old_slots = array("I"), remap.__getitem__, base.slots
        for c in range(0, len(old_slots), _CHUNK):
            slots.extend(map(renumber, old_slots[c : c + _CHUNK]))
        if erased:
            _close_holes(slots, base, erased, lambda v: id_bytes[offsets[v - 1] : offsets[v]])
        for raw, value in zip(added, new_ids, strict=True):
            _place(slots, raw, value)
    packed = [column.tobytes() for column in (*columns, slots)]
    return _file(count, listed, sessions, offsets, id_bytes, packed)


def _close_holes(
    slots: array[int], base: Snapshot, erased: list[int], raw_of: Callable[[int], bytes]
) -> None:
    """Make every entry reachable again after the erased ones left holes (zeros) in the slot table: the
    entries after each hole, up to the next empty slot, are taken out and placed again."""
    mask = len(slots) - 1
    for i in erased:
        raw = bytes(base.ids[base.offsets[i] : base.offsets[i + 1]])
        slot = crc32c(raw) & mask
        while base.slots[slot] != i + 1:  # where it was: the old table has the same layout
            slot = (slot + 1) & mask
        taken = []
        slot = (slot + 1) & mask
        while slots[slot]:
            taken.append(slots[slot])
            slots[slot] = 0
            slot = (slot + 1) & mask
        for value in taken:
            _place(slots, raw_of(value), value)


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
