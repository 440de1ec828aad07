"""Public value types. Timestamps are timezone-aware UTC ``datetime`` objects with microsecond precision;
on disk and in the codec they are integer microseconds since the Unix epoch (see docs/FORMAT.md)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import msgspec

__all__ = [
    "SeqRange",
    "MemoryItem",
    "ConversationSummary",
    "ConversationListing",
    "micros_to_datetime",
    "datetime_to_micros",
    "rfc3339",
]

_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def micros_to_datetime(us: int) -> datetime:
    return _EPOCH + timedelta(microseconds=us)


def datetime_to_micros(dt: datetime) -> int:
    delta = dt - _EPOCH
    return (delta.days * 86_400 + delta.seconds) * 1_000_000 + delta.microseconds


def rfc3339(dt: datetime) -> str:
    """``2026-12-02T16:58:41.749212Z``: always UTC, always six fractional digits."""
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class SeqRange(msgspec.Struct, frozen=True):
    """Witness of a committed append: the inclusive range [first, last]."""

    first: int
    last: int


class MemoryItem(msgspec.Struct, frozen=True):
    seq: int
    recorded_at: datetime
    payload: dict[str, Any]


class ConversationSummary(msgspec.Struct, frozen=True):
    conversation_id: str
    created_at: datetime
    last_appended_at: datetime


class ConversationListing(msgspec.Struct, frozen=True):
    conversations: list[ConversationSummary]
    next_cursor: str | None
