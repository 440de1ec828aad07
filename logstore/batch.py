"""Validation and encoding of an append batch, done before any lock is taken (pure, no I/O)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import msgspec

from .errors import BatchTooLarge, EmptyBatch, InvalidArgument, PayloadTooLarge
from .frame import encode_items
from .limits import MAX_BATCH_BYTES, MAX_BATCH_ITEMS, MAX_ITEM_BYTES

__all__ = ["encode_batch", "encode_item"]

_encode = msgspec.json.Encoder().encode


def encode_item(item: Any, index: int) -> bytes:
    """Compact UTF-8 JSON of one item, exactly the bytes stored (and the size the limits count)."""
    if not isinstance(item, dict):
        raise InvalidArgument(
            f"items[{index}] must be a JSON object, got {type(item).__name__}", field="items"
        )
    for key in item:
        if not isinstance(key, str):
            raise InvalidArgument(f"items[{index}] has a non-string key {key!r}", field="items")
    try:
        return _encode(item)
    except (TypeError, OverflowError, ValueError) as exc:
        raise InvalidArgument(f"items[{index}] is not JSON-serialisable: {exc}", field="items") from exc


def encode_batch(items: Sequence[Any]) -> tuple[bytes, int]:
    """Validate a batch against the spec's limits; return (encoded item section, item count)."""
    if isinstance(items, (str, bytes, dict)) or not isinstance(items, Sequence):
        raise InvalidArgument("items must be a list of JSON objects", field="items")
    if not items:
        raise EmptyBatch("an append batch must contain at least one item")
    if len(items) > MAX_BATCH_ITEMS:
        raise InvalidArgument(
            f"a batch holds at most {MAX_BATCH_ITEMS} items, got {len(items)}", field="items"
        )
    encoded = []
    total = 0
    for index, item in enumerate(items):
        raw = encode_item(item, index)
        if len(raw) > MAX_ITEM_BYTES:
            raise PayloadTooLarge(
                f"items[{index}] is {len(raw)} bytes as compact JSON; the limit is {MAX_ITEM_BYTES}",
                index=index,
                size=len(raw),
                limit=MAX_ITEM_BYTES,
            )
        total += len(raw)
        encoded.append(raw)
    if total > MAX_BATCH_BYTES:
        raise BatchTooLarge(
            f"the batch is {total} bytes as compact JSON; the limit is {MAX_BATCH_BYTES}",
            size=total,
            limit=MAX_BATCH_BYTES,
        )
    return encode_items(encoded), len(encoded)
