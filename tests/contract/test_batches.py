"""One batch: stored whole or not at all, one shared recorded_at, payloads back exactly as given."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings

from logstore import (
    BatchTooLarge,
    EmptyBatch,
    InvalidArgument,
    InvalidConversationId,
    PayloadTooLarge,
    SeqRange,
)
from logstore.core.limits import MAX_BATCH_ITEMS, MAX_ITEM_BYTES
from tests.helpers import examples

from .strategies import json_batches
from .support import CID, SITE, item_of_size, rejected

HOUR_US = 3_600_000_000


@pytest.mark.parametrize(
    "items, error",
    [
        ([], EmptyBatch),
        ([{"ok": 1}, {"ok": 2}, 5], InvalidArgument),
        ([{"ok": 1}, item_of_size(MAX_ITEM_BYTES + 1)], PayloadTooLarge),
        ([item_of_size(MAX_ITEM_BYTES)] * 4 + [{}], BatchTooLarge),
        ([{"ok": 1}] * (MAX_BATCH_ITEMS + 1), InvalidArgument),
        ([{"ok": 1}, {"bad": object()}], InvalidArgument),
    ],
    ids=["empty", "non-object", "item-too-large", "batch-too-large", "too-many-items", "not-json"],
)
def test_rejected_batch_stores_nothing(store, items, error):
    store.append(SITE, CID, [{"before": 1}])
    with rejected(store, SITE, CID, error):
        store.append(SITE, CID, items)
    assert store.append(SITE, CID, [{"after": 1}]) == SeqRange(1, 1)  # no seq was consumed


def test_invalid_conversation_id_creates_nothing(store):
    store.append(SITE, CID, [{"before": 1}])
    with rejected(store, SITE, CID, InvalidConversationId):
        store.append(SITE, "bad id!", [{"a": 1}])


def test_batch_shares_one_utc_recorded_at_close_to_now(store):
    before = dt.datetime.now(dt.UTC)
    store.append(SITE, CID, [{"n": n} for n in range(5)])
    after = dt.datetime.now(dt.UTC)
    items = store.replay(SITE, CID, 0, 10)
    stamps = {i.recorded_at for i in items}
    assert len(stamps) == 1
    (stamp,) = stamps
    assert stamp.tzinfo is not None and stamp.utcoffset() == dt.timedelta(0)
    slack = dt.timedelta(seconds=60)  # a database clock may differ a little from ours
    assert before - slack <= stamp <= after + slack


def test_recorded_at_has_microsecond_precision(store):
    for n in range(20):
        store.append(SITE, CID, [{"n": n}])
    stamps = [i.recorded_at for i in store.replay(SITE, CID, 0, 100)]
    assert stamps == sorted(stamps)
    # Truncation to milliseconds would leave all 20 at a multiple of 1000 us: chance 1e-60 otherwise.
    assert any(s.microsecond % 1000 for s in stamps)


def test_recorded_at_never_decreases_when_the_clock_steps_back(store, clock):
    store.append(SITE, CID, [{"a": 1}, {"b": 2}])
    clock.shift(-HOUR_US)
    store.append(SITE, CID, [{"c": 3}])
    clock.freeze(0)  # far in the past
    store.append(SITE, CID, [{"d": 4}])
    items = store.replay(SITE, CID, 0, 10)
    assert items[0].recorded_at == items[1].recorded_at
    assert items[1].recorded_at <= items[2].recorded_at <= items[3].recorded_at
    listed = store.list_conversations(SITE).conversations[0]
    assert (listed.created_at, listed.last_appended_at) == (items[0].recorded_at, items[3].recorded_at)


def test_recorded_at_is_stored_to_the_microsecond(store, clock):
    clock.freeze(1_800_000_000_123_457)
    store.append(SITE, CID, [{"a": 1}])
    (item,) = store.recall(SITE, CID)
    assert item.recorded_at == dt.datetime(2027, 1, 15, 8, 0, 0, 123_457, tzinfo=dt.UTC)


VERBATIM = {
    "z": 1,
    "a": {"y": [1, 2.5, None, True, False, "é"], "b": {}, "": []},
    "ints": [0, -1, 2**31, 2**53 + 1, -(2**53) - 1, 2**63 - 1, -(2**63)],
    "floats": [0.1, 1.0, -2.5e-7, 1e300, 5e-324, 1.7976931348623157e308, 123456789.123456789],
    "text": ["", "é", "日本語", "🦀 crab", 'quote " and \\ slash', "\u0000\n\t\x1f", "</script>"],
    "ключ": "unicode key",
    "nested": {"l1": {"l2": {"l3": {"l4": {"l5": [[[[{"deep": True}]]]]}}}}},
    "dup-looking": {"a": 1, "A": 2},
}


def test_payloads_come_back_verbatim(store):
    store.append(SITE, CID, [VERBATIM, {"b": 1, "a": 2}, {}])
    got = [i.payload for i in store.recall(SITE, CID, 5)]
    assert got == [VERBATIM, {"b": 1, "a": 2}, {}]
    assert list(got[0]) == list(VERBATIM) and list(got[0]["a"]) == ["y", "b", ""]
    assert list(got[1]) == ["b", "a"]
    # Types survive, not only values: 1.0 stays a float, 1 an int, True a bool.
    assert [type(v) for v in got[0]["floats"]] == [float] * len(VERBATIM["floats"])
    assert [type(v) for v in got[0]["ints"]] == [int] * len(VERBATIM["ints"])
    assert type(got[0]["a"]["y"][3]) is bool


@settings(
    max_examples=examples(20, 40), deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(batch=json_batches)
def test_arbitrary_json_objects_round_trip_verbatim(store, batch):
    first = store.append(SITE, "roundtrip-01", batch).first
    got = store.replay(SITE, "roundtrip-01", first, len(batch))
    assert [i.payload for i in got] == batch
    for stored, original in zip(got, batch, strict=True):
        assert list(stored.payload) == list(original)  # key order kept
