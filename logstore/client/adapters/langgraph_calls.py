"""The LangGraph checkpointer's calls to the server (``langgraph``): retried while the server is
unreachable, the fetch of the items a value points to, and the append of an item whose records are too
large for it (chunk items first)."""

from __future__ import annotations

import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import anyio

from logstore.core.models import MemoryItem, SeqRange

from ..aio import AsyncClient
from . import langgraph_items as lg
from .langgraph_items import Items, MissingItems

__all__ = ["ServerCalls"]

log = logging.getLogger("logstore.client.adapters.langgraph")

Payloads = list[dict[str, Any]]
Pieces = list[tuple[dict[str, Any], list[str]]]  # a record, and its data cut into chunks


class ServerCalls:
    """What ``LogstoreSaver`` asks of the server. A call that fails with a retryable error (the server
    unreachable, restarting, overloaded) is tried again, backing off to 1 s, for up to ``retry_for`` s."""

    retry_for: float = 30.0

    async def _retrying(self, fn: Callable[..., Awaitable[Any]], *args: Any) -> Any:
        deadline = time.monotonic() + self.retry_for
        delay = 0.05
        while True:
            try:
                return await fn(*args)
            except Exception as exc:
                if not getattr(exc, "retryable", False) or time.monotonic() + delay > deadline:
                    raise
                log.warning("logstore checkpointer: %s; retrying in %.2f s", exc, delay)
                await anyio.sleep(delay)
                delay = min(delay * 2, 1.0)

    async def _append(self, aio: AsyncClient, conv: str, items: Payloads) -> SeqRange:
        # A retried append whose first try was stored stores its items twice: readers keep the first copy
        return await self._retrying(aio.append, conv, items)  # type: ignore[no-any-return]

    async def _replay(self, aio: AsyncClient, conv: str, offset: int, limit: int) -> Sequence[MemoryItem]:
        return await self._retrying(aio.replay, conv, offset, limit)  # type: ignore[no-any-return]

    async def _fetch(self, aio: AsyncClient, conv: str, items: Items, seqs: set[int]) -> None:
        """Fetch the items ``seqs`` into ``items``: one replay per run of up to 1000 seqs."""
        wanted = sorted(s for s in seqs if s not in items.by_seq)
        while wanted:
            start = wanted[0]
            stop = max(s for s in wanted if s - start < 1000)
            page = await self._replay(aio, conv, start, stop - start + 1)
            for item in page:
                items.add(item.seq, item.payload)
            if start not in items.by_seq:
                raise RuntimeError(f"checkpoint conversation {conv}: item {start} named but not stored")
            wanted = [s for s in wanted if s not in items.by_seq]

    async def _decode(self, aio: AsyncClient, conv: str, items: Items, build: Callable[[], Any]) -> Any:
        while True:
            try:
                return build()
            except MissingItems as missing:
                await self._fetch(aio, conv, items, missing.seqs)

    async def _store(self, aio: AsyncClient, conv: str, item: dict[str, Any], records: Payloads) -> int:
        """Append ``item``; records too large to stay inside it go first, as chunk items."""
        total = sum(len(r["d"]) for r in records)
        pieces: Pieces = []
        for record in sorted(records, key=lambda r: len(r["d"]), reverse=True):
            if total <= lg.INLINE_CHARS:
                break
            data = record.pop("d")
            total -= len(data)
            pieces.append(
                (record, [data[i : i + lg.CHUNK_CHARS] for i in range(0, len(data), lg.CHUNK_CHARS)])
            )
        chunks = [{"type": lg.CHUNK, "d": piece} for _, parts in pieces for piece in parts]
        seqs: Sequence[int] = ()
        for start in range(0, len(chunks), lg.CHUNKS_PER_BATCH):
            acked = await self._append(aio, conv, chunks[start : start + lg.CHUNKS_PER_BATCH])
            seqs = (*seqs, *range(acked.first, acked.last + 1))
        for record, parts in pieces:
            record["chunks"], seqs = list(seqs[: len(parts)]), seqs[len(parts) :]
        return (await self._append(aio, conv, [item])).first
