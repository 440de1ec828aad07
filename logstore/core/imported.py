"""Imported batches: items copied verbatim from another store by ``logstore migrate`` (logstore/migrate/),
appended at the seq and with the ``recorded_at`` they had there. Every backend's import append calls the
rules here, so the file engine and PostgreSQL refuse the same batches with the same messages:

- the limits of an ordinary append, checked before anything is parsed: 1..``MAX_BATCH_ITEMS`` items, each
  at most ``MAX_ITEM_BYTES``, together at most ``MAX_BATCH_BYTES``; ``first_seq + count`` at most
  ``MAX_CONVERSATION_ITEMS`` (``ConversationFull``); then each item must be a JSON object (never decoded
  into values and re-encoded: ``1.00`` and key order stay as stored);
- gapless seqs: the batch must begin exactly at the conversation's next seq (``InvalidArgument``, field
  ``first_seq``), so a copy resumed after an interruption can neither leave a hole nor store a batch twice;
- time never goes back: ``recorded_at`` at least the conversation's last one (field ``recorded_at``).

Also the JSON Lines form of an item (``export_line``), which ``logstore export`` writes for every backend.
"""

from __future__ import annotations

from dataclasses import dataclass

import msgspec

from .errors import InvalidArgument
from .limits import (
    MAX_CONVERSATION_ITEMS,
    check_batch_count,
    check_batch_size,
    check_item_size,
    conversation_full,
)
from .models import MemoryItem, micros_to_datetime, rfc3339

__all__ = [
    "ImportedBatch",
    "check_imported",
    "import_refusal",
    "export_time",
    "export_line",
    "export_item",
]

_raw = msgspec.json.Decoder(msgspec.Raw).decode
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True, slots=True)
class ImportedBatch:
    """``items`` (each one item's stored JSON bytes) at seqs ``first_seq..``, all recorded at
    ``recorded_at`` (microseconds since the Unix epoch, as the source stored it)."""

    first_seq: int
    recorded_at: int
    items: tuple[bytes, ...]

    @property
    def next_seq(self) -> int:
        return self.first_seq + len(self.items)


def check_imported(batch: ImportedBatch) -> ImportedBatch:
    """``batch`` if it keeps every limit and holds JSON objects only; else the error an append gets."""
    count = len(batch.items)
    check_batch_count(count)
    if batch.first_seq < 0:
        raise InvalidArgument(f"first_seq must be >= 0, got {batch.first_seq}", field="first_seq")
    if batch.next_seq > MAX_CONVERSATION_ITEMS:
        raise conversation_full(stored=batch.first_seq, requested=count, importing=True)
    for index, raw in enumerate(batch.items):
        check_item_size(index, len(raw))
    check_batch_size(sum(map(len, batch.items)))
    for index, raw in enumerate(batch.items):
        if not raw.startswith(b"{") or not _is_json(raw):
            raise InvalidArgument(f"items[{index}] is not a JSON object", field="items", index=index)
    return batch


def _is_json(raw: bytes) -> bool:
    try:
        _raw(raw)
    except msgspec.DecodeError:
        return False
    return True


def import_refusal(
    batch: ImportedBatch, *, next_seq: int, last_recorded_at: int | None
) -> InvalidArgument | None:
    """Why ``batch`` cannot be appended to a conversation in this state (None: it can)."""
    if batch.first_seq != next_seq:
        return InvalidArgument(
            f"the imported batch begins at seq {batch.first_seq} but the conversation's next seq is "
            f"{next_seq}",
            field="first_seq",
        )
    if last_recorded_at is not None and batch.recorded_at < last_recorded_at:
        return InvalidArgument(
            f"the imported batch was recorded at {batch.recorded_at} us, before the conversation's last "
            f"batch ({last_recorded_at} us)",
            field="recorded_at",
        )
    return None


def export_time(recorded_at: int) -> bytes:
    """``recorded_at`` (microseconds) as ``export_line`` takes it: computed once per batch."""
    return rfc3339(micros_to_datetime(recorded_at)).encode()


def export_line(seq: int, at: bytes, raw: bytes) -> bytes:
    """One item as ``logstore export`` writes it for every backend:
    ``{"seq":..,"recorded_at":"..","payload":..}`` and a newline, the payload's stored bytes verbatim."""
    return b'{"seq":%d,"recorded_at":"%s","payload":%s}\n' % (seq, at, raw)


def export_item(item: MemoryItem) -> bytes:
    """``export_line`` for an item read back through ``Backend`` (the browser's download): the payload
    re-encoded with msgspec. Every backend stores an item as msgspec's encoding (``core.batch``), and that
    encoding is a fixed point of decoding and encoding again (key order, number and string forms), so the
    line is byte for byte the one ``logstore export`` writes from the stored bytes."""
    return export_line(item.seq, rfc3339(item.recorded_at).encode(), _encode(item.payload))
