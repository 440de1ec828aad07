"""The storage backend protocol: what the server (and anything else) may call on a store.

Every backend (the file engine's ``logstore.file.store.Store`` today) provides these calls with the
semantics the contract suite (tests/contract/) pins down: seq rules, batch atomicity, verbatim payloads,
limits and their errors (``logstore.core.errors``), listing order and signed cursors
(``logstore.core.cursor``). Calls are blocking; the server runs them in worker threads.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from .json_batch import JsonText
from .models import ConversationListing, MemoryItem, SeqRange

__all__ = ["Backend"]


class Backend(Protocol):
    def append(self, site: str, conversation_id: str, items: Sequence[dict[str, Any]]) -> SeqRange:
        """Append one batch atomically; return its seq range once it is durable."""
        ...

    def append_json(self, site: str, conversation_id: str, items: Sequence[JsonText]) -> SeqRange:
        """``append`` of items given as JSON text each (``core.json_batch``): the same rules, the same stored
        bytes; a text that is not an object is ``ItemNotAnObject``."""
        ...

    def recall(self, site: str, conversation_id: str, count: int = ...) -> list[MemoryItem]:
        """The last ``count`` items in ascending seq order."""
        ...

    def replay(
        self, site: str, conversation_id: str, offset: int = ..., limit: int = ...
    ) -> list[MemoryItem]:
        """Up to ``limit`` items from seq ``offset`` on; a short page means the end of the log."""
        ...

    def list_conversations(
        self, site: str, cursor: str | None = ..., limit: int = ...
    ) -> ConversationListing:
        """One page of the site's conversations, most recently appended first."""
        ...

    def close(self) -> None: ...
