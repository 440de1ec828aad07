"""``ToolCalls``: the four tools over a ``Transport``, typed, and the spec's restore and listing loops.

Results are the engine's models (``SeqRange``, ``MemoryItem``, ``ConversationListing``); errors the
engine's exception classes (``logstore.core.errors``, ``.code`` / ``.retryable``), see ``client.errors``.
``AsyncClient`` (client.aio) adds the background writer; the writer itself calls through a ``ToolCalls``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from logstore.core.limits import MAX_READ_COUNT
from logstore.core.models import ConversationListing, ConversationSummary, MemoryItem, SeqRange

from .errors import ProtocolError
from .transport import Transport

__all__ = ["ToolCalls", "TransportFactory", "encode_items", "decode_items"]

TransportFactory = Callable[[], Transport]
_encode = msgspec.json.encode


def encode_items(items: Sequence[Mapping[str, Any]]) -> bytes:
    """A batch as the JSON array sent to the server (a snapshot: later changes to the dicts are not seen)."""
    return _encode(items)


def _timestamp(value: Any) -> datetime:
    if not isinstance(value, str):
        raise ProtocolError(f"expected an RFC3339 timestamp, got {value!r}")
    return datetime.fromisoformat(value.replace("Z", "+00:00"))


def decode_items(result: dict[str, Any]) -> list[MemoryItem]:
    items = result.get("items")
    if not isinstance(items, list):
        raise ProtocolError("read result has no items list")
    return [
        MemoryItem(seq=i["seq"], recorded_at=_timestamp(i["recorded_at"]), payload=i["payload"])
        for i in items
    ]


class ToolCalls:
    """One connection (built by ``factory`` on first use) and the calls made over it."""

    def __init__(self, factory: TransportFactory) -> None:
        self._factory = factory
        self._transport: Transport | None = None

    @property
    def factory(self) -> TransportFactory:
        return self._factory

    async def _call(self, tool: str, arguments: bytes) -> dict[str, Any]:
        if self._transport is None:
            self._transport = self._factory()
        return await self._transport.call(tool, arguments)

    # -- the four tools ---------------------------------------------------------------------------

    async def append(self, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> SeqRange:
        """Append one batch and wait for its durable acknowledgement. Raises the spec's errors; nothing
        is retried (use ``append_nowait`` for that)."""
        return await self.append_encoded(conversation_id, encode_items(items))

    async def append_encoded(self, conversation_id: str, items_json: bytes) -> SeqRange:
        arguments = b'{"conversation_id":' + _encode(conversation_id) + b',"items":' + items_json + b"}"
        result = await self._call("append_memory", arguments)
        return SeqRange(first=result["first_seq"], last=result["last_seq"])

    async def recall(self, conversation_id: str, count: int = 50) -> list[MemoryItem]:
        """The last ``count`` items (max 1000), oldest first."""
        return decode_items(
            await self._call("recall_memory", _encode({"conversation_id": conversation_id, "count": count}))
        )

    async def replay(
        self, conversation_id: str, offset: int = 0, limit: int = MAX_READ_COUNT
    ) -> list[MemoryItem]:
        """Up to ``limit`` items from seq ``offset``; a page shorter than ``limit`` is the end."""
        arguments = {"conversation_id": conversation_id, "offset": offset, "limit": limit}
        return decode_items(await self._call("replay_memory", _encode(arguments)))

    async def list_conversations(self, cursor: str | None = None, limit: int = 50) -> ConversationListing:
        result = await self._call("list_conversations", _encode({"cursor": cursor, "limit": limit}))
        summaries = [
            ConversationSummary(
                conversation_id=s["conversation_id"],
                created_at=_timestamp(s["created_at"]),
                last_appended_at=_timestamp(s["last_appended_at"]),
            )
            for s in result.get("conversations", [])
        ]
        return ConversationListing(conversations=summaries, next_cursor=result.get("next_cursor"))

    # -- the spec's loops -------------------------------------------------------------------------

    async def iter_replay(
        self, conversation_id: str, *, start: int = 0, page: int = MAX_READ_COUNT
    ) -> AsyncIterator[MemoryItem]:
        """Every item from ``start`` on: pages of ``page`` items, each from the last seq + 1, until a short
        page (the spec's restore loop)."""
        if page < 1:
            raise ValueError("page must be at least 1")
        offset = start
        while True:
            items = await self.replay(conversation_id, offset, page)
            for item in items:
                yield item
            if len(items) < page:
                return
            offset = items[-1].seq + 1

    async def iter_conversations(self, *, page: int = 100) -> AsyncIterator[ConversationSummary]:
        """Every conversation of the site, most recently active first, page by page (cursor pages)."""
        cursor: str | None = None
        while True:
            listing = await self.list_conversations(cursor, page)
            for summary in listing.conversations:
                yield summary
            if listing.next_cursor is None:
                return
            cursor = listing.next_cursor

    async def aclose(self) -> None:
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()
