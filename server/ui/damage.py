"""A damaged conversation on the page: the items that can still be read before the damage, the byte offset
the store reported, and the command an operator runs (docs/FSCK.md). The store never serves what it
cannot verify (``Corrupted`` from a read that reaches the bad frame), so the readable prefix of a page is
found by asking for fewer items: a bisection over the read's length, at most ~log2(page size) reads
(7 for a page of 100).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from logstore.core.errors import Corrupted
from logstore.core.models import MemoryItem

__all__ = ["Damage", "readable_prefix", "fsck_command"]


@dataclass(frozen=True, slots=True)
class Damage:
    offset: int  # the byte offset in the conversation's log the store reported
    first_unreadable: int  # the first seq of the page that could not be read
    command: str  # what the operator runs to check (and, with --repair, repair) it


def fsck_command(site: str, conversation_id: str | None) -> str:
    """The check an operator runs (``--data-dir``/``--store`` as the server was started)."""
    one = f" --conversation {conversation_id}" if conversation_id else ""
    return f"logstore fsck --data-dir DATA_DIR --site {site}{one}"


def readable_prefix(
    replay: Callable[[int, int], list[MemoryItem]], start: int, limit: int, exc: Corrupted
) -> tuple[list[MemoryItem], int]:
    """The longest run of items from ``start`` (at most ``limit``) that ``replay(offset, limit)`` returns
    without ``Corrupted``, and the offset of the damage that stopped it (``exc``'s, or a later read's)."""
    good: list[MemoryItem] = []
    low, high = 0, limit  # replay(start, low) is known good, replay(start, high) known bad
    offset = exc.offset
    while high - low > 1:
        middle = (low + high) // 2
        try:
            got = replay(start, middle)
        except Corrupted as again:
            high, offset = middle, again.offset
        else:
            good, low = got, middle
            if len(got) < middle:  # the conversation ends before the damage: nothing more to find
                break
    return good, offset
