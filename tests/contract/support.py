"""Helpers shared by the contract tests (no fixtures here: those live in conftest.py)."""

from __future__ import annotations

import datetime as dt
from contextlib import contextmanager
from typing import Any

import pytest

from logstore import LogstoreError

SITE = "site-a"
CID = "conv-0001"


def item_of_size(size: int, fill: str = "x") -> dict[str, str]:
    """A dict whose compact UTF-8 JSON is exactly ``size`` bytes: ``{"p":"..."}`` is 8 bytes + the string
    (``fill`` must be one byte in UTF-8 and need no JSON escape)."""
    return {"p": fill * (size - 8)}


def all_pages(store: Any, site: str, limit: int) -> list[str]:
    """Every conversation id of a site's listing, following next_cursor to the end."""
    ids: list[str] = []
    cursor = None
    for _ in range(10_000):
        page = store.list_conversations(site, cursor, limit)
        assert len(page.conversations) <= limit
        ids.extend(c.conversation_id for c in page.conversations)
        if page.next_cursor is None:
            return ids
        cursor = page.next_cursor
    raise AssertionError("listing never ended")


_EPOCH = dt.datetime(1970, 1, 1, tzinfo=dt.UTC)


def listing_key(last_appended_at: dt.datetime, conversation_id: str) -> tuple[int, str]:
    """The spec's listing order as a sort key: last_appended_at desc, then id asc (exact integer
    microseconds: a float timestamp near 2026 cannot tell neighbouring microseconds apart)."""
    return (-((last_appended_at - _EPOCH) // dt.timedelta(microseconds=1)), conversation_id)


def expected_order(store: Any, site: str, ids: Any) -> list[str]:
    """The listing order computed from the items themselves."""
    last = {cid: store.recall(site, cid, 1)[0].recorded_at for cid in ids}
    return sorted(last, key=lambda cid: listing_key(last[cid], cid))


def snapshot(store: Any, site: str, *conversation_ids: str) -> tuple[object, ...]:
    """Everything a client can observe of these conversations and the site's listing."""
    items = tuple(  # head and tail: a conversation may hold more than one read returns
        (tuple(store.replay(site, cid, 0, 1000)), tuple(store.recall(site, cid, 1000)))
        for cid in conversation_ids
    )
    return items, tuple(store.list_conversations(site, None, 1000).conversations)


@contextmanager
def rejected(store: Any, site: str, conversation_id: str, error: type[LogstoreError], **fields: object):
    """The call inside raises ``error`` (its exact code, permanent, with ``fields``) and changes nothing
    a client can observe."""
    before = snapshot(store, site, conversation_id)
    with pytest.raises(error) as info:
        yield info
    exc = info.value
    assert exc.code == error.code and exc.retryable is False, (exc.code, exc.retryable)
    for name, value in fields.items():
        assert getattr(exc, name) == value, (name, getattr(exc, name), value)
    assert snapshot(store, site, conversation_id) == before
