"""Limits at max and max+1, every validation error with the spec's name and fields, and the
retryable/permanent split on every error class."""

from __future__ import annotations

import pytest

import logstore.core.errors as errors
from logstore import (
    BatchTooLarge,
    ConversationFull,
    EmptyBatch,
    InvalidArgument,
    InvalidConversationId,
    PayloadTooLarge,
    SeqRange,
    Unavailable,
)
from logstore.core.limits import (
    ID_MAX_LEN,
    ID_MIN_LEN,
    MAX_BATCH_BYTES,
    MAX_BATCH_ITEMS,
    MAX_CONVERSATION_ITEMS,
    MAX_ITEM_BYTES,
    MAX_READ_COUNT,
)

from .support import CID, SITE, item_of_size, rejected


def test_the_spec_limits():
    assert (ID_MIN_LEN, ID_MAX_LEN) == (8, 64)
    assert (MAX_ITEM_BYTES, MAX_BATCH_BYTES) == (256 * 1024, 1024 * 1024)
    assert (MAX_BATCH_ITEMS, MAX_CONVERSATION_ITEMS, MAX_READ_COUNT) == (250, 100_000, 1000)


@pytest.mark.parametrize(
    "bad, reason",
    [
        ("", "TooShort"),
        ("short", "TooShort"),
        ("a" * (ID_MIN_LEN - 1), "TooShort"),
        ("a" * (ID_MAX_LEN + 1), "TooLong"),
        ("has space", "InvalidCharacters"),
        ("ünïcode-id", "InvalidCharacters"),
        ("a/b/../cc", "InvalidCharacters"),
        ("dotted.name", "InvalidCharacters"),
        ("trailing-nl\n", "InvalidCharacters"),
        (12345678, "InvalidCharacters"),
        (None, "InvalidCharacters"),
    ],
)
def test_invalid_conversation_id_reasons(store, bad, reason):
    for call in (
        lambda: store.append(SITE, bad, [{"a": 1}]),
        lambda: store.recall(SITE, bad),
        lambda: store.replay(SITE, bad, 0, 1),
    ):
        with rejected(store, SITE, CID, InvalidConversationId, reason=reason) as info:
            call()
        assert info.value.details() == {"reason": reason}


def test_id_length_and_charset_boundaries(store):
    for cid in ("a" * ID_MIN_LEN, "b" * ID_MAX_LEN, "A-z_0-9-", "________", "--------"):
        assert store.append(SITE, cid, [{"id": cid}]) == SeqRange(0, 0)
        assert store.recall(SITE, cid)[0].payload == {"id": cid}


def test_empty_batch(store):
    with rejected(store, SITE, CID, EmptyBatch):
        store.append(SITE, CID, [])


def test_item_size_boundary(store):
    assert store.append(SITE, CID, [item_of_size(MAX_ITEM_BYTES)]) == SeqRange(0, 0)
    with rejected(store, SITE, CID, PayloadTooLarge, index=1, size=MAX_ITEM_BYTES + 1) as info:
        store.append(SITE, CID, [{"ok": 1}, item_of_size(MAX_ITEM_BYTES + 1)])
    assert info.value.details() == {"index": 1, "size": MAX_ITEM_BYTES + 1, "limit": MAX_ITEM_BYTES}
    assert store.recall(SITE, CID) == store.replay(SITE, CID, 0, 5)
    assert [i.payload for i in store.recall(SITE, CID)] == [item_of_size(MAX_ITEM_BYTES)]


def test_item_size_counts_utf8_bytes_of_compact_json(store):
    # "é" is one character but two bytes: 256 KiB of bytes is reached with fewer characters.
    exact = {"p": "é" * ((MAX_ITEM_BYTES - 8) // 2)}
    assert store.append(SITE, CID, [exact]).first == 0
    with rejected(store, SITE, CID, PayloadTooLarge, index=0, size=MAX_ITEM_BYTES + 2):
        store.append(SITE, CID, [{"p": exact["p"] + "é"}])


def test_batch_size_boundary(store):
    exact = [item_of_size(MAX_ITEM_BYTES)] * 4  # 4 x 256 KiB = 1 MiB exactly
    assert store.append(SITE, CID, exact) == SeqRange(0, 3)
    with rejected(store, SITE, CID, BatchTooLarge, size=MAX_BATCH_BYTES + 9) as info:
        store.append(SITE, CID, exact + [item_of_size(9)])
    assert info.value.details() == {"size": MAX_BATCH_BYTES + 9, "limit": MAX_BATCH_BYTES}


def test_batch_item_count_boundary(store):
    assert store.append(SITE, CID, [{}] * MAX_BATCH_ITEMS) == SeqRange(0, MAX_BATCH_ITEMS - 1)
    with rejected(store, SITE, CID, InvalidArgument, field="items"):
        store.append(SITE, CID, [{}] * (MAX_BATCH_ITEMS + 1))


def test_conversation_full_boundary(store):
    # Tiny items in full batches: 400 appends reach the limit in about a second.
    for _ in range(MAX_CONVERSATION_ITEMS // MAX_BATCH_ITEMS - 1):  # 99,750 items
        store.append(SITE, CID, [{}] * MAX_BATCH_ITEMS)
    assert store.append(SITE, CID, [{}] * 150).last == 99_899
    with rejected(store, SITE, CID, ConversationFull, stored=99_900, requested=101) as info:
        store.append(SITE, CID, [{}] * 101)  # would be 100,001: rejected whole
    assert info.value.details() == {"stored": 99_900, "requested": 101, "limit": MAX_CONVERSATION_ITEMS}
    assert store.append(SITE, CID, [{}] * 100) == SeqRange(99_900, MAX_CONVERSATION_ITEMS - 1)  # at the limit
    with rejected(store, SITE, CID, ConversationFull, stored=MAX_CONVERSATION_ITEMS, requested=1):
        store.append(SITE, CID, [{"one": "more"}])
    assert store.recall(SITE, CID, 1)[0].seq == MAX_CONVERSATION_ITEMS - 1
    assert [i.seq for i in store.replay(SITE, CID, 99_995, 1000)] == list(range(99_995, 100_000))
    assert store.append(SITE, "conv-other", [{"a": 1}]) == SeqRange(0, 0)  # the limit is per conversation


@pytest.mark.parametrize("items", [[1], ["x"], [[1]], [None], "notalist", {"a": 1}, [{1: "int key"}], None])
def test_non_object_items_rejected(store, items):
    with rejected(store, SITE, CID, InvalidArgument, field="items"):
        store.append(SITE, CID, items)


@pytest.mark.parametrize("count", [-1, MAX_READ_COUNT + 1, 2.5, True, "3", None])
def test_bad_counts(store, count):
    with rejected(store, SITE, CID, InvalidArgument, field="count"):
        store.recall(SITE, CID, count)
    with rejected(store, SITE, CID, InvalidArgument, field="limit"):
        store.replay(SITE, CID, 0, count)
    with rejected(store, SITE, CID, InvalidArgument, field="limit"):
        store.list_conversations(SITE, None, count)


@pytest.mark.parametrize("offset", [-1, 2.5, True, "0", None])
def test_bad_offset(store, offset):
    with rejected(store, SITE, CID, InvalidArgument, field="offset"):
        store.replay(SITE, CID, offset, 10)


@pytest.mark.parametrize("site", ["", "bad site", "../etc", "a" * (ID_MAX_LEN + 1), None])
def test_bad_site(store, site):
    with rejected(store, SITE, CID, InvalidArgument, field="site"):
        store.append(site, CID, [{"a": 1}])
    for call in (
        lambda: store.recall(site, CID),
        lambda: store.replay(site, CID, 0, 10),
        lambda: store.list_conversations(site),
    ):
        with rejected(store, SITE, CID, InvalidArgument, field="site"):
            call()


# The spec's split: validation errors are permanent (a retry fails the same way); the others are safe to
# retry. Timeout and Io are provoked in the engine's own tests (locks, injected faults).
RETRYABLE = {"Unavailable", "Timeout", "Io"}
PERMANENT = {
    "InvalidArgument",
    "InvalidCursor",
    "InvalidConversationId",
    "EmptyBatch",
    "PayloadTooLarge",
    "BatchTooLarge",
    "ConversationFull",
    "Corrupted",
    "Unreadable",
}
# Classes that refine another's cause and keep its spec code on the wire (placed here on purpose too).
REFINEMENTS = {"ItemNotAnObject": "InvalidArgument"}  # append_json: an item's text that is not an object


def test_every_error_class_says_whether_to_retry():
    classes = {name: getattr(errors, name) for name in errors.__all__ if name != "LogstoreError"}
    # a new error class must be placed here on purpose
    assert set(classes) == RETRYABLE | PERMANENT | set(REFINEMENTS)
    for name, cls in classes.items():
        assert issubclass(cls, errors.LogstoreError)
        code = REFINEMENTS.get(name, name)
        assert cls.code == code and issubclass(cls, classes[code])
        assert cls.retryable is (code in RETRYABLE), name
    assert issubclass(errors.InvalidCursor, errors.InvalidArgument)


def test_closed_store_is_unavailable_and_retryable(backend):
    s = backend.open()
    s.append(SITE, CID, [{"a": 1}])
    s.close()
    for call in (
        lambda: s.append(SITE, CID, [{"a": 2}]),
        lambda: s.recall(SITE, CID),
        lambda: s.replay(SITE, CID, 0, 10),
        lambda: s.list_conversations(SITE),
    ):
        with pytest.raises(Unavailable) as info:
            call()
        assert info.value.code == "Unavailable" and info.value.retryable is True
    s.close()  # closing twice is harmless
    reopened = backend.open()
    try:
        assert [i.payload for i in reopened.recall(SITE, CID)] == [{"a": 1}]
    finally:
        reopened.close()
