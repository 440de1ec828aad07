"""The manifest's pure parts: the v2 snapshot codec (one CRC, packed columns, the id hash table), v1
snapshots of release 41344b8, session marks in the journal, and the packed table's listing against a
sorted model."""

from __future__ import annotations

import random
import struct

import pytest
from crc32c import crc32c
from hypothesis import given, settings
from hypothesis import strategies as st

from logstore.file.manifest.codec import (
    MARK_CLOSE,
    MARK_OPEN,
    Entry,
    Session,
    decode_journal,
    encode_mark,
    encode_record,
    erased_entry,
    first_gap,
    merged,
)
from logstore.file.manifest.snapshot import (
    MAGIC_V1,
    decode_snapshot,
    encode_snapshot,
    listing_key,
    merge_snapshot,
)
from logstore.file.manifest.table import ManifestTable

SESSION = Session(b"\x01" * 16, 4242, 987654, 2**63 + 5)


def _entries(n: int, rng: random.Random) -> dict[str, Entry]:
    out = {}
    for i in range(n):
        last = rng.randrange(1_000, 1_050)  # many ties: the id breaks them
        seq = rng.choice([0, 0, 1, 5, 2**32 - 1])
        out[f"conv-{rng.randrange(10**8):08d}-{i}"] = (
            Entry(-1, -1, 0, 0) if seq == 0 else Entry(last - 7, last, rng.randrange(2**40), seq)
        )
    return out


def test_snapshot_v2_roundtrip_listing_order_lookup_and_sessions():
    rng = random.Random(1)
    entries = _entries(500, rng)
    data = encode_snapshot(entries.items(), [SESSION])
    snap = decode_snapshot(data)
    assert snap is not None and snap.version == 2 and snap.sessions == (SESSION,)
    assert dict(snap.items()) == entries
    listed = sorted((listing_key(c, e), c) for c, e in entries.items() if e.next_seq)
    assert [snap.id_at(i) for i in range(snap.listed)] == [c for _, c in listed]
    for cid, entry in entries.items():
        assert snap.get(cid) == entry
    assert snap.get("conv-not-there") is None
    assert struct.unpack("<I", data[-4:])[0] == crc32c(data[8:-4])  # the one CRC, over everything
    assert decode_snapshot(encode_snapshot([])) is not None


@pytest.mark.parametrize("where", [0, 3, 8, 20, -5, -1])
def test_snapshot_v2_damage_is_detected(where):
    data = bytearray(encode_snapshot(_entries(50, random.Random(2)).items(), [SESSION]))
    data[where] ^= 0x40
    assert decode_snapshot(bytes(data)) is None
    assert decode_snapshot(bytes(data[:-9])) is None


def test_snapshot_v2_whose_sizes_disagree_is_damaged_even_with_a_valid_crc():
    data = encode_snapshot(_entries(10, random.Random(3)).items())
    body = bytearray(data[8:-4])
    struct.pack_into("<I", body, 0, 11)  # count says 11
    forged = data[:8] + bytes(body) + struct.pack("<I", crc32c(bytes(body)))
    assert decode_snapshot(forged) is None


def test_v1_snapshot_of_release_41344b8_is_read():
    """The v1 layout, spelled out: magic 01, one CRC-framed record per conversation, crc32c of them."""
    entries = _entries(40, random.Random(4))
    records = b"".join(encode_record(cid, e) for cid, e in entries.items())
    v1 = MAGIC_V1 + records + struct.pack("<I", crc32c(records))
    snap = decode_snapshot(v1)
    assert snap is not None and snap.version == 1 and dict(snap.items()) == entries
    assert decode_snapshot(v1[:-1] + bytes([v1[-1] ^ 1])) is None


def test_session_marks_travel_with_records_and_resync_skips_damage():
    rec = encode_record("conv-00000001", Entry(1, 2, 3, 4))
    data = encode_mark(MARK_OPEN, SESSION) + rec + b"\x00" * 7 + encode_mark(MARK_CLOSE, SESSION) + rec
    decoded = decode_journal(data)
    assert [m.kind for m in decoded.marks] == [MARK_OPEN, MARK_CLOSE]
    assert decoded.marks[0].session == SESSION
    assert [c for c, _ in decoded.records] == ["conv-00000001"] * 2
    assert decoded.damaged and decoded.pos == len(data)
    assert first_gap(data) == len(encode_mark(MARK_OPEN, SESSION)) + len(rec)


def _model_pages(model: dict[str, Entry], after, limit):
    keys = sorted(listing_key(c, e) for c, e in model.items() if e.next_seq > 0)
    if after is not None:
        keys = [k for k in keys if k > after]
    return [k[1] for k in keys[:limit]], len(keys) > limit


def test_table_listing_equals_a_sorted_model_under_updates_erasures_and_new_ids():
    rng = random.Random(5)
    model = _entries(300, rng)
    table = ManifestTable(decode_snapshot(encode_snapshot(model.items())))
    ids = list(model)
    for step in range(600):
        cid = rng.choice(ids) if rng.random() < 0.8 else f"conv-new-{step:05d}"
        ids.append(cid)
        kind = rng.random()
        if kind < 0.1:
            record = erased_entry()
        elif kind < 0.2:
            record = Entry(-1, -1, 0, 0)  # creation record
        else:
            current = model.get(cid)
            seq = (current.next_seq if current else 0) + rng.choice([-1, 0, 1, 3])
            last = rng.randrange(1_000, 1_080)
            record = Entry(rng.choice([-1, last - 3]), last, rng.randrange(2**20), max(seq, 0))
        table.apply(cid, record)
        new = _merged_model(model.get(cid), record)
        if new is None:
            model.pop(cid, None)
        else:
            model[cid] = new
        if step % 50 == 0 or rng.random() < 0.1:  # pages after 1 to ~50 changes (the order is lazy)
            assert dict(table.items()) == model
            assert len(table) == len(model)
            assert set(table.added()) == {c for c in model if table.base.find(c) is None}
            keys = [None] + sorted(listing_key(c, e) for c, e in model.items() if e.next_seq)
            for after in rng.sample(keys, min(5, len(keys))):
                limit = rng.choice([1, 3, 50, 1000])
                rows, more = table.page(after, limit)
                assert ([c for c, _, _ in rows], more) == _model_pages(model, after, limit)
                assert all((model[c].created_at, model[c].last_appended_at) == (f, t) for c, f, t in rows)


_IDS = ("conv-base-0001", "conv-base-0002", "conv-new-00001")
_RECORDS = st.tuples(
    st.sampled_from(_IDS),
    st.one_of(
        st.just(erased_entry()),
        st.builds(
            Entry,
            st.sampled_from([-2, -1, 0, 5, 7]),  # equal created_at often: the commit's fast path
            st.integers(0, 4),
            st.integers(0, 4),
            st.integers(0, 4),
        ),
    ),
    st.booleans(),  # read a page after it (clears what the table marked stale)
)


@settings(max_examples=400, deadline=None)
@given(st.lists(_RECORDS, max_size=25))
def test_table_apply_is_merged_record_by_record_fast_path_included(steps):
    """``ManifestTable.apply`` (its fast path for a commit's plain advance too) against ``codec.merged``:
    the entry, the changed flag and the listing after every record, pages read in between."""
    base = {"conv-base-0001": Entry(5, 2, 3, 2), "conv-base-0002": Entry(-1, -1, 0, 0)}
    table = ManifestTable(decode_snapshot(encode_snapshot(base.items())))
    model: dict[str, Entry] = dict(base)
    for cid, record, page in steps:
        current = model.get(cid)
        new = merged(current, record)
        assert table.apply(cid, record) is (new is not current)
        if new is None:
            model.pop(cid, None)
        else:
            model[cid] = new
        assert table.get(cid) == new
        if page:
            assert dict(table.items()) == model
            rows, more = table.page(None, 10)
            assert ([c for c, _, _ in rows], more) == _model_pages(model, None, 10)


def _merged_model(current: Entry | None, record: Entry) -> Entry | None:
    """The merge rule written out again, independently of manifest.codec.merged."""
    if record.created_at == -2:
        return None
    if current is None:
        return record
    if (record.next_seq, record.last_appended_at, record.log_size) <= (
        current.next_seq,
        current.last_appended_at,
        current.log_size,
    ):
        return current
    created = current.created_at if record.created_at < 0 else record.created_at
    return Entry(created, record.last_appended_at, record.log_size, record.next_seq)


def _changes(model: dict[str, Entry], n: int, rng: random.Random) -> dict[str, Entry | None]:
    """``n`` changes to ``model``: updates (listed or not, ties on the instant), erasures, new ids."""
    out: dict[str, Entry | None] = {}
    ids = list(model)
    for step in range(n):
        cid = rng.choice(ids) if ids and rng.random() < 0.6 else f"conv-{rng.randrange(10**8):08d}-n{step}"
        kind = rng.random()
        if kind < 0.15:
            out[cid] = None
        elif kind < 0.25:
            out[cid] = Entry(-1, -1, 0, 0)
        else:
            last = rng.randrange(1_000, 1_060)  # ties with the base's instants and among themselves
            out[cid] = Entry(last - 7, last, rng.randrange(2**40), rng.randrange(1, 9))
    return out


@pytest.mark.parametrize("seed", range(40))
def test_a_merged_snapshot_equals_the_snapshot_encoded_afresh(seed):
    """``merge_snapshot`` (what a compaction writes) against ``encode_snapshot`` of the merged entries:
    the same entries in the same order, every id found through the kept and renumbered slot table (holes
    left by erasures closed), nothing erased found, the sessions kept."""
    rng = random.Random(seed)
    model = _entries(rng.choice([0, 1, 7, 40, 300]), rng)
    base = decode_snapshot(encode_snapshot(model.items()))
    assert base is not None
    changes = _changes(model, rng.choice([0, 1, 5, 30, 200]), rng)
    want = dict(model)
    for cid, entry in changes.items():
        if entry is None:
            want.pop(cid, None)
        else:
            want[cid] = entry
    merged = decode_snapshot(merge_snapshot(base, changes.items(), [SESSION]))
    fresh = decode_snapshot(encode_snapshot(want.items(), [SESSION]))
    assert merged is not None and fresh is not None
    assert list(merged.items()) == list(fresh.items())
    assert (merged.count, merged.listed, merged.sessions) == (fresh.count, fresh.listed, fresh.sessions)
    for cid, entry in want.items():
        assert merged.get(cid) == entry
    for cid, entry in changes.items():
        if entry is None:
            assert merged.find(cid) is None


def test_a_merge_keeps_the_slot_table_and_a_merge_past_its_size_rebuilds_it():
    """Same slot count: only renumbered (a merge that only changes entries in place keeps every slot
    where it was); past the size's power of two: a table of the new size, every id found."""
    rng = random.Random(7)
    model = {f"conv-{i:08d}": Entry(i, 2_000 + i, 10, 1) for i in range(100)}  # 256 slots
    base = decode_snapshot(encode_snapshot(model.items()))
    assert base is not None
    update = {cid: Entry(e.created_at, e.last_appended_at + 10_000, 20, 2) for cid, e in model.items()}
    moved = decode_snapshot(merge_snapshot(base, rng.sample(sorted(update.items()), 10)))
    assert moved is not None and len(moved.slots) == len(base.slots)
    assert [moved.slots[s] == 0 for s in range(len(base.slots))] == [v == 0 for v in base.slots]
    grown = {f"conv-new-{i:04d}": Entry(1, 1, 1, 1) for i in range(60)}
    bigger = decode_snapshot(merge_snapshot(base, grown.items()))
    assert bigger is not None and len(bigger.slots) == 2 * len(base.slots)
    assert all(bigger.get(cid) == entry for cid, entry in {**model, **grown}.items())
