"""Capacity limits from the spec, in one place (sizes are bytes of the compact UTF-8 JSON as stored)."""

from __future__ import annotations

__all__ = [
    "ID_MIN_LEN",
    "ID_MAX_LEN",
    "MAX_ITEM_BYTES",
    "MAX_BATCH_BYTES",
    "MAX_BATCH_ITEMS",
    "MAX_CONVERSATION_ITEMS",
    "MAX_READ_COUNT",
    "DEFAULT_RECALL_COUNT",
    "DEFAULT_LIST_LIMIT",
]

ID_MIN_LEN = 8
ID_MAX_LEN = 64
MAX_ITEM_BYTES = 256 * 1024  # inclusive
MAX_BATCH_BYTES = 1024 * 1024  # inclusive, sum of item sizes
MAX_BATCH_ITEMS = 250  # the spec's maxItems
MAX_CONVERSATION_ITEMS = 100_000
MAX_READ_COUNT = 1000  # recall count, replay limit, list limit
DEFAULT_RECALL_COUNT = 50
DEFAULT_LIST_LIMIT = 50
