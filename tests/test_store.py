"""Store API semantics from the spec: seqs, reads, limits at max and max+1, every error name."""

from __future__ import annotations

import datetime as dt

import pytest

from logstore import (
    BatchTooLarge,
    ConversationFull,
    EmptyBatch,
    InvalidArgument,
    InvalidConversationId,
    PayloadTooLarge,
    SeqRange,
    Store,
    Unavailable,
)
from logstore.limits import MAX_BATCH_BYTES, MAX_CONVERSATION_ITEMS, MAX_ITEM_BYTES

SITE = "site-a"
CID = "conv-0001"


def item_of_size(size: int) -> dict:
    """A dict whose compact JSON encoding is exactly ``size`` bytes: {"p":"..."} is 8 bytes + payload."""
    return {"p": "x" * (size - 8)}


def test_seqs_are_gapless_and_zero_based(store):
    assert store.append(SITE, CID, [{"a": 1}]) == SeqRange(0, 0)
    assert store.append(SITE, CID, [{"a": 2}, {"a": 3}, {"a": 4}]) == SeqRange(1, 3)
    assert [i.seq for i in store.replay(SITE, CID, 0, 1000)] == [0, 1, 2, 3]


def test_recall_tail_order_and_counts(store):
    for n in range(10):
        store.append(SITE, CID, [{"n": n}])
    assert [i.payload["n"] for i in store.recall(SITE, CID, 3)] == [7, 8, 9]
    assert len(store.recall(SITE, CID)) == 10  # default 50, fewer stored
    assert store.recall(SITE, CID, 0) == []
    assert len(store.recall(SITE, CID, 1000)) == 10


def test_replay_pages_and_end(store):
    store.append(SITE, CID, [{"n": n} for n in range(25)])
    assert [i.seq for i in store.replay(SITE, CID, 20, 10)] == [20, 21, 22, 23, 24]
    assert store.replay(SITE, CID, 25, 10) == []
    assert store.replay(SITE, CID, 10_000, 10) == []
    assert store.replay(SITE, CID, 3, 0) == []
    assert [i.seq for i in store.replay(SITE, CID, limit=2)] == [0, 1]


def test_unknown_conversation_reads_empty_and_creates_nothing(store, data_dir):
    assert store.recall(SITE, "never-seen-1") == []
    assert store.replay(SITE, "never-seen-1", 0, 10) == []
    assert not list((data_dir / "sites").rglob("never-seen-1*"))


def test_batch_shares_recorded_at_and_it_never_decreases(store, monkeypatch):
    store.append(SITE, CID, [{"a": 1}, {"b": 2}])
    import logstore.conversation as conversation

    real = conversation._now_us
    monkeypatch.setattr(conversation, "_now_us", lambda: real() - 3_600_000_000)  # clock steps back 1 h
    store.append(SITE, CID, [{"c": 3}])
    items = store.replay(SITE, CID, 0, 10)
    assert items[0].recorded_at == items[1].recorded_at
    assert items[2].recorded_at >= items[1].recorded_at
    assert items[0].recorded_at.tzinfo is not None and items[0].recorded_at.utcoffset() == dt.timedelta(0)


def test_payload_verbatim_key_order(store):
    payload = {"z": 1, "a": {"y": [1, 2.5, None, True, "é"], "b": {}}, "m": 10**30}
    store.append(SITE, CID, [payload])
    got = store.recall(SITE, CID, 1)[0].payload
    assert got == payload and list(got) == ["z", "a", "m"] and list(got["a"]) == ["y", "b"]


def test_sites_are_isolated(store):
    store.append("site-a", CID, [{"who": "a"}])
    store.append("site-b", CID, [{"who": "b"}, {"who": "b2"}])
    assert [i.payload["who"] for i in store.recall("site-a", CID)] == ["a"]
    assert [i.payload["who"] for i in store.recall("site-b", CID)] == ["b", "b2"]


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("short", "TooShort"),
        ("a" * 7, "TooShort"),
        ("a" * 65, "TooLong"),
        ("has space", "InvalidCharacters"),
        ("ünïcode-id", "InvalidCharacters"),
        ("a/b/../cc", "InvalidCharacters"),
        ("", "TooShort"),
    ],
)
def test_invalid_conversation_id_reasons(store, bad, reason):
    for call in (
        lambda: store.append(SITE, bad, [{"a": 1}]),
        lambda: store.recall(SITE, bad),
        lambda: store.replay(SITE, bad, 0, 1),
    ):
        with pytest.raises(InvalidConversationId) as info:
            call()
        assert info.value.reason == reason and info.value.code == "InvalidConversationId"
        assert info.value.retryable is False


def test_id_length_boundaries(store):
    store.append(SITE, "a" * 8, [{"a": 1}])
    store.append(SITE, "b" * 64, [{"a": 1}])
    store.append(SITE, "A-z_0-9-", [{"a": 1}])


def test_empty_batch(store):
    with pytest.raises(EmptyBatch):
        store.append(SITE, CID, [])


def test_item_size_boundary(store):
    assert store.append(SITE, CID, [item_of_size(MAX_ITEM_BYTES)]) == SeqRange(0, 0)
    with pytest.raises(PayloadTooLarge) as info:
        store.append(SITE, CID, [{"ok": 1}, item_of_size(MAX_ITEM_BYTES + 1)])
    assert info.value.index == 1 and info.value.size == MAX_ITEM_BYTES + 1
    assert store.recall(SITE, CID, 5)[0].payload == item_of_size(MAX_ITEM_BYTES)
    assert len(store.recall(SITE, CID)) == 1  # the rejected batch stored nothing


def test_batch_size_boundary(store):
    exact = [item_of_size(MAX_ITEM_BYTES)] * 4  # 4 x 256 KiB = 1 MiB exactly
    assert sum(len(str(i)) for i in exact) > 0
    assert store.append(SITE, CID, exact) == SeqRange(0, 3)
    with pytest.raises(BatchTooLarge) as info:
        store.append(SITE, CID, exact[:3] + [item_of_size(MAX_ITEM_BYTES)] + [item_of_size(9)])
    assert info.value.size == MAX_BATCH_BYTES + 9
    assert store.replay(SITE, CID, 0, 10)[-1].seq == 3


def test_batch_item_count_boundary(store):
    assert store.append(SITE, CID, [{}] * 250) == SeqRange(0, 249)
    with pytest.raises(InvalidArgument):
        store.append(SITE, CID, [{}] * 251)


def test_conversation_full_boundary(store):
    for _ in range(399):  # 99,750 items
        store.append(SITE, CID, [{}] * 250)
    store.append(SITE, CID, [{}] * 150)  # 99,900
    with pytest.raises(ConversationFull) as info:
        store.append(SITE, CID, [{}] * 101)  # would be 100,001: rejected whole
    assert (info.value.stored, info.value.requested) == (99_900, 101)
    assert store.append(SITE, CID, [{}] * 100).last == MAX_CONVERSATION_ITEMS - 1  # exactly at the limit
    with pytest.raises(ConversationFull):
        store.append(SITE, CID, [{}])
    assert store.recall(SITE, CID, 1)[0].seq == MAX_CONVERSATION_ITEMS - 1
    assert [i.seq for i in store.replay(SITE, CID, 99_995, 1000)] == list(range(99_995, 100_000))


@pytest.mark.parametrize("items", [[1], ["x"], [[1]], [None], "notalist", {"a": 1}, [{1: "int key"}]])
def test_non_object_items_rejected(store, items):
    with pytest.raises(InvalidArgument):
        store.append(SITE, CID, items)
    assert store.recall(SITE, CID) == []


@pytest.mark.parametrize("count", [-1, 1001, 2.5, True, "3"])
def test_bad_counts(store, count):
    with pytest.raises(InvalidArgument):
        store.recall(SITE, CID, count)
    with pytest.raises(InvalidArgument):
        store.replay(SITE, CID, 0, count)
    with pytest.raises(InvalidArgument):
        store.list_conversations(SITE, None, count)


def test_bad_offset_and_site(store):
    with pytest.raises(InvalidArgument):
        store.replay(SITE, CID, -1, 10)
    with pytest.raises(InvalidArgument):
        store.append("bad site", CID, [{"a": 1}])
    with pytest.raises(InvalidArgument):
        store.recall("../etc", CID)


def test_closed_store_is_unavailable(data_dir):
    s = Store(data_dir)
    s.append(SITE, CID, [{"a": 1}])
    s.close()
    with pytest.raises(Unavailable) as info:
        s.recall(SITE, CID)
    assert info.value.retryable


def test_reopen_sees_everything(data_dir):
    with Store(data_dir) as s:
        for n in range(30):
            s.append(SITE, CID, [{"n": n}] * (n % 3 + 1))
        before = s.replay(SITE, CID, 0, 1000)
    with Store(data_dir) as s:
        assert s.replay(SITE, CID, 0, 1000) == before
        assert s.append(SITE, CID, [{"after": True}]).first == len(before)


def test_handle_cache_is_bounded(data_dir):
    with Store(data_dir, max_open_conversations=4) as s:
        for n in range(20):
            s.append(SITE, f"conv-{n:05d}", [{"n": n}])
        assert len(s._handles) <= 4
        for n in range(20):
            assert s.recall(SITE, f"conv-{n:05d}")[0].payload == {"n": n}
