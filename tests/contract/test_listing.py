"""Listing: order (last_appended_at desc, ties by id asc), summaries, keyset pagination and its cursors,
site isolation."""

from __future__ import annotations

import itertools
import threading

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from logstore import InvalidArgument, InvalidCursor
from logstore.core.limits import DEFAULT_LIST_LIMIT, MAX_READ_COUNT

from .support import CID, SITE, all_pages, expected_order, listing_key, rejected


def test_order_most_recent_first_with_timestamps(store):
    for cid in ["conv-c001", "conv-a001", "conv-b001"]:
        store.append(SITE, cid, [{"x": cid}])
    store.append(SITE, "conv-a001", [{"again": True}])
    page = store.list_conversations(SITE)
    assert [c.conversation_id for c in page.conversations] == ["conv-a001", "conv-b001", "conv-c001"]
    assert page.next_cursor is None
    for summary in page.conversations:
        items = store.replay(SITE, summary.conversation_id, 0, 10)
        assert summary.created_at == items[0].recorded_at
        assert summary.last_appended_at == items[-1].recorded_at
    assert page.conversations[0].created_at < page.conversations[0].last_appended_at


def test_ties_broken_by_ascending_id_across_pages(store, clock):
    clock.freeze(1_800_000_000_000_000)
    ids = [f"tie-{n:04d}x" for n in (5, 3, 9, 1, 7, 2, 8, 4, 6, 0)]
    for cid in ids:
        store.append(SITE, cid, [{"n": cid}])
    for limit in (1, 3, 4, 10, 50):
        assert all_pages(store, SITE, limit) == sorted(ids)


def test_pagination_returns_each_conversation_once_in_order(store):
    ids = [f"page-{n:05d}" for n in range(57)]
    for n, cid in enumerate(ids):
        store.append(SITE, cid, [{"n": n}])
    store.append(SITE, ids[10], [{"bump": 1}])
    want = expected_order(store, SITE, ids)
    assert want[0] == ids[10]
    for limit in (1, 2, 7, 56, 57, 58, MAX_READ_COUNT):
        assert all_pages(store, SITE, limit) == want
    default = store.list_conversations(SITE)
    assert [c.conversation_id for c in default.conversations] == want[:DEFAULT_LIST_LIMIT]
    rest = store.list_conversations(SITE, default.next_cursor)
    assert [c.conversation_id for c in rest.conversations] == want[DEFAULT_LIST_LIMIT:]
    assert rest.next_cursor is None


def test_limit_zero_and_empty_site(store):
    empty = store.list_conversations("empty-site")
    assert empty.conversations == [] and empty.next_cursor is None
    store.append(SITE, CID, [{"a": 1}])
    page = store.list_conversations(SITE, None, 0)
    assert page.conversations == [] and page.next_cursor is not None  # something remains
    following = store.list_conversations(SITE, page.next_cursor, 5)
    assert [c.conversation_id for c in following.conversations] == [CID]
    assert following.next_cursor is None


def test_a_full_last_page_may_carry_a_cursor_to_an_empty_end(store):
    for n in range(4):
        store.append(SITE, f"conv-{n:04d}", [{"n": n}])
    page = store.list_conversations(SITE, None, 2)
    page = store.list_conversations(SITE, page.next_cursor, 2)
    assert len(page.conversations) == 2
    if page.next_cursor is not None:  # allowed; the page after it must then be empty and final
        end = store.list_conversations(SITE, page.next_cursor, 2)
        assert end.conversations == [] and end.next_cursor is None


def _one_cursor(store) -> str:
    for n in range(3):
        store.append(SITE, f"conv-{n:04d}", [{"n": n}])
    cursor = store.list_conversations(SITE, None, 1).next_cursor
    assert cursor
    return cursor


def test_malformed_and_tampered_cursors_are_invalid_cursor(store):
    cursor = _one_cursor(store)
    bad = [
        "",
        "not base64 !!",
        "AAAA",
        cursor[:-2],
        cursor + "AA",
        "é" * 10,
        cursor[:5] + ("A" if cursor[5] != "A" else "B") + cursor[6:],
        cursor[::-1],
    ]
    for value in bad:
        with rejected(store, SITE, CID, InvalidCursor, field="cursor") as info:
            store.list_conversations(SITE, value, 5)
        assert isinstance(info.value, InvalidArgument)  # clients that only know InvalidArgument still match


def test_another_sites_cursor_is_invalid_cursor(store):
    cursor = _one_cursor(store)
    store.append("site-b", "conv-0000", [{"b": 1}])
    with rejected(store, "site-b", "conv-0000", InvalidCursor, field="cursor"):
        store.list_conversations("site-b", cursor, 5)


@pytest.mark.parametrize("cursor", [12345, b"bytes", ["list"]])
def test_non_string_cursor_is_invalid_argument(store, cursor):
    with rejected(store, SITE, CID, InvalidArgument, field="cursor"):
        store.list_conversations(SITE, cursor, 5)


def test_cursor_survives_a_reopen(backend):
    first = backend.open()
    try:
        ids = [f"conv-{n:04d}" for n in range(5)]
        for cid in ids:
            first.append(SITE, cid, [{"c": cid}])
        want = expected_order(first, SITE, ids)
        page = first.list_conversations(SITE, None, 2)
    finally:
        first.close()
    second = backend.open()
    try:
        rest = all_pages_from(second, SITE, page.next_cursor, 2)
        assert [c.conversation_id for c in page.conversations] + rest == want
    finally:
        second.close()


def all_pages_from(store, site: str, cursor: str | None, limit: int) -> list[str]:
    ids: list[str] = []
    while cursor is not None:
        page = store.list_conversations(site, cursor, limit)
        ids.extend(c.conversation_id for c in page.conversations)
        cursor = page.next_cursor
    return ids


def test_pagination_under_concurrent_appends_has_no_duplicates_or_gaps(store):
    """Conversations appended to while a client pages move to the front (behind its cursor): each is
    listed at most once; every conversation left alone is listed exactly once, in order."""
    cold = [f"cold-{n:04d}" for n in range(40)]
    hot = [f"hot-{n:05d}" for n in range(10)]
    for cid in hot[:5] + cold + hot[5:]:
        store.append(SITE, cid, [{"c": cid}])
    stop = threading.Event()
    errors: list[BaseException] = []
    appended = [0]

    def appender() -> None:
        try:
            n = 0
            while not stop.is_set() and n < 2000:  # bounded even if the reader stalls
                store.append(SITE, hot[n % len(hot)], [{"n": n}])
                if n % 5 == 0:
                    store.append(SITE, f"new-{n:06d}", [{"n": n}])  # brand-new conversations too
                n += 1
                appended[0] = n
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    worker = threading.Thread(target=appender)
    worker.start()
    try:
        listed, cursor, during = [], None, None
        for _ in range(1000):
            page = store.list_conversations(SITE, cursor, 3)
            listed.extend(page.conversations)
            if during is None:
                during = appended[0]
            if page.next_cursor is None:
                break
            cursor = page.next_cursor
            stop.wait(0.005)  # let appends interleave with the pages
        during = appended[0] - during
    finally:
        stop.set()
        worker.join()
    assert not errors
    assert during > 0, "no append landed between the first and last page: the test proved nothing"
    ids = [c.conversation_id for c in listed]
    assert len(ids) == len(set(ids)), "a conversation was listed twice"
    assert set(cold) <= set(ids), "a conversation nobody touched was skipped"
    keys = [listing_key(c.last_appended_at, c.conversation_id) for c in listed]
    assert keys == sorted(keys) and len(set(keys)) == len(keys)  # strictly after the previous page


def test_sites_are_isolated(store):
    store.append("site-a", "shared-id-1", [{"who": "a"}])
    store.append("site-b", "shared-id-1", [{"who": "b"}, {"who": "b2"}])
    store.append("site-b", "only-in-b-1", [{"who": "b3"}])
    assert [i.payload["who"] for i in store.recall("site-a", "shared-id-1")] == ["a"]
    assert [i.payload["who"] for i in store.replay("site-b", "shared-id-1", 0, 10)] == ["b", "b2"]
    assert store.recall("site-a", "only-in-b-1") == []
    assert all_pages(store, "site-a", 10) == ["shared-id-1"]
    assert all_pages(store, "site-b", 10) == ["only-in-b-1", "shared-id-1"]
    assert store.append("site-a", "shared-id-1", [{"who": "a2"}]).first == 1  # seqs per site too


_RUNS = itertools.count()


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(
    ops=st.lists(st.tuples(st.sampled_from(["s-one", "s-two"]), st.integers(0, 12)), min_size=1, max_size=30),
    limits=st.lists(st.integers(1, 9), min_size=1, max_size=4),
)
def test_pages_concatenate_to_model_order(store, ops, limits):
    run = next(_RUNS)  # examples share the store: each uses sites of its own
    touched: dict[str, set[str]] = {}
    for site, n in ops:
        site = f"{site}-{run}"
        cid = f"conv-{n:05d}"
        store.append(site, cid, [{"n": n}])
        touched.setdefault(site, set()).add(cid)
    for site, ids in touched.items():
        want = expected_order(store, site, ids)
        for limit in limits:
            assert all_pages(store, site, limit) == want
