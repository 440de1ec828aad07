"""``AsyncClient``: the four tools, typed, with the spec's restore and listing loops.

    async with AsyncClient.http("http://127.0.0.1:8080/mcp", site="alpha", password="...") as memory:
        seqs = await memory.append(conversation_id, [{"role": "user", "content": "hi"}])  # waits for the ack
        async for item in memory.iter_replay(conversation_id):                           # the restore loop
            ...
        memory.append_nowait(conversation_id, [{"role": "assistant", "content": "hello"}])  # never waits

Results are the engine's models (``SeqRange``, ``MemoryItem``, ``ConversationListing``); errors the
engine's exception classes (``logstore.core.errors``, ``.code`` / ``.retryable``), see ``client.errors``.
``append_nowait`` hands the batch to a ``BackgroundWriter`` (its own thread, loop and connection), created
on first use from ``writer_options``.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import msgspec

from logstore.core.limits import MAX_READ_COUNT
from logstore.core.models import ConversationListing, ConversationSummary, MemoryItem, SeqRange

from .errors import ProtocolError
from .transport import HttpTransport, StdioTransport, Transport

__all__ = ["AsyncClient", "TransportFactory", "encode_items", "decode_items"]

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


class AsyncClient:
    """One connection to a logstore server. ``factory`` builds the transport (the background writer
    builds its own from the same factory, on its own loop)."""

    def __init__(self, factory: TransportFactory, *, writer_options: Any = None) -> None:
        self._factory = factory
        self._transport: Transport | None = None
        self._writer_options = writer_options
        self._writer: Any = None

    @classmethod
    def http(
        cls, url: str, *, site: str, password: str, timeout: float = 30.0, writer_options: Any = None
    ) -> AsyncClient:
        return cls(
            lambda: HttpTransport(url, site=site, password=password, timeout=timeout),
            writer_options=writer_options,
        )

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        writer_options: Any = None,
    ) -> AsyncClient:
        """A client of ``command`` over stdin/stdout (e.g. ``logstore serve --stdio --data-dir D``). The
        background writer starts a second server process of its own."""
        return cls(lambda: StdioTransport(command, args, env=env), writer_options=writer_options)

    @property
    def factory(self) -> TransportFactory:
        return self._factory

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

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

    # -- the background writer --------------------------------------------------------------------

    @property
    def writer(self) -> Any:
        """The ``BackgroundWriter`` (started on first use)."""
        if self._writer is None:
            from .writer import BackgroundWriter

            self._writer = BackgroundWriter(self._factory, self._writer_options)
        return self._writer

    def append_nowait(self, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> bool:
        """Hand the batch to the background writer and return at once (see ``BackgroundWriter.append``)."""
        return bool(self.writer.append(conversation_id, items))

    async def flush(self, timeout: float | None = None) -> bool:
        """Wait (without blocking this loop) until every batch handed over is settled; False on timeout."""
        if self._writer is None:
            return True
        import anyio

        writer = self._writer
        return bool(await anyio.to_thread.run_sync(lambda: writer.flush(timeout)))

    async def aclose(self, timeout: float | None = 30.0) -> None:
        """Drain the background writer (up to ``timeout``), then close the connections."""
        if self._writer is not None:
            import anyio

            writer, self._writer = self._writer, None
            await anyio.to_thread.run_sync(lambda: writer.close(timeout))
        transport, self._transport = self._transport, None
        if transport is not None:
            await transport.aclose()
