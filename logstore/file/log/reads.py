"""Serving reads from a conversation log: the frames covering a seq range (located through the in-memory
index, every one CRC-checked and matched against its entry) and the items in them.

Pure over its arguments: the conversation passes the bytes it read and the state they belong to. Any
disagreement between the index and the log raises ``IndexMismatch`` (the caller rescans the log and
retries: the index is never trusted over the log); an item that is CRC-valid but not JSON is
``Corrupted`` at its frame's offset (``core.batch.stored_not_json``: written wrong, not rotted).
"""

from __future__ import annotations

import msgspec

from ...core.batch import decode_item, stored_not_json
from ...core.errors import Corrupted
from ...core.models import MemoryItem, micros_to_datetime
from .frame import Frame, decode_frame
from .seq_index import IndexMismatch

__all__ = ["corrupted", "decode_region", "items_of"]


def corrupted(path: str, offset: int, reason: str) -> Corrupted:
    return Corrupted(
        f"conversation log {path} is corrupted at byte {offset} ({reason})", path=path, offset=offset
    )


def decode_region(
    data: bytes, region_start: int, bounds: list[tuple[int, int]], stop: int, *, size: int | None = None
) -> list[Frame]:
    """The frames ``bounds`` (``(offset, first_seq)`` from ``seq_index.locate``) in ``data``, the bytes of
    the log from ``region_start``: each must be valid, carry its entry's seq, and together they must
    tile the first ``size`` bytes of ``data`` (all of it by default) and reach seq ``stop``."""
    frames: list[Frame] = []
    pos = 0
    for offset, first_seq in bounds:
        event = decode_frame(data, offset - region_start, region_start)
        if not isinstance(event, Frame) or event.first_seq != first_seq:
            raise IndexMismatch
        frames.append(event)
        pos = event.end - region_start
    if pos != (len(data) if size is None else size) or frames[-1].first_seq + frames[-1].count < stop:
        raise IndexMismatch
    return frames


def items_of(frames: list[Frame], first: int, stop: int, *, path: str) -> list[MemoryItem]:
    """Items ``[first, stop)`` of ``frames``, each with its frame's ``recorded_at``."""
    out: list[MemoryItem] = []
    for frame in frames:
        at = micros_to_datetime(frame.recorded_at)
        lo = max(first - frame.first_seq, 0)
        hi = min(stop - frame.first_seq, frame.count)
        for k in range(lo, hi):
            try:
                payload = decode_item(frame.items[k], seq=frame.first_seq + k)  # or Unreadable
            except msgspec.DecodeError as exc:
                raise stored_not_json(frame.first_seq + k, path=path, offset=frame.offset) from exc
            out.append(MemoryItem(frame.first_seq + k, at, payload))
    return out
