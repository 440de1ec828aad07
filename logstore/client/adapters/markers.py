"""The adapters' shared reading of a conversation: data items, and the markers that undo them.

A conversation written by an adapter holds the framework's items verbatim, plus two marker items:

- ``{"type": "logstore.clear"}``: everything before it is cleared;
- ``{"type": "logstore.pop"}``: the most recent live item is removed.

(No LangChain message dict or OpenAI input item has a ``type`` starting with ``logstore.``.) ``MarkerLog``
folds the log into the live items, and keeps the fold: the log is append-only, so the next read replays
only what was appended since (``iter_replay(start=next_seq)``). A read of the last ``limit`` items before
any full read takes the tail instead (``recall``, folded backwards), not the whole log.

Writes go through the client's background writer (``append_nowait``: never blocks the agent) unless
``wait_for_ack``; a read first flushes this conversation's batches (up to ``flush_timeout``; other
conversations' are not waited for) so an agent reads its own writes. When that flush does not settle or
the server cannot be reached, the read serves the fold it holds plus what this log appended since, and
logs a warning: the agent's turn goes on (the spec: memory must never block the conversation).

Works over a ``Client`` (sync and async faces; the async one runs the sync one in a worker thread) or an
``AsyncClient`` (async face only: its calls run on the caller's event loop).
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from logstore.core.errors import LogstoreError
from logstore.core.ids import validate_conversation_id
from logstore.core.limits import MAX_BATCH_ITEMS, MAX_READ_COUNT
from logstore.core.models import MemoryItem

from ..aio import AsyncClient
from ..sync import Client

__all__ = ["MarkerLog", "CLEAR", "POP", "new_session_id", "session_and_client"]

log = logging.getLogger("logstore.client")

CLEAR: dict[str, Any] = {"type": "logstore.clear"}
POP: dict[str, Any] = {"type": "logstore.pop"}
Payloads = list[dict[str, Any]]


def new_session_id() -> str:
    """A fresh conversation id (a UUID): mint ids, never derive them from user data."""
    return uuid.uuid4().hex


def is_marker(payload: Mapping[str, Any]) -> bool:
    kind = payload.get("type")
    return isinstance(kind, str) and kind.startswith("logstore.")


def session_and_client(first: Any, second: Any) -> tuple[str, Client | AsyncClient]:
    """``(session_id, client)`` - the frameworks' order - or the older ``(client, session_id)``."""
    if isinstance(first, Client | AsyncClient):
        first, second = second, first
    if not isinstance(second, Client | AsyncClient):
        raise TypeError(f"expected a logstore Client or AsyncClient, got {type(second).__name__}")
    return first, second


def fold(live: Payloads, payloads: Sequence[Mapping[str, Any]]) -> None:
    """Apply ``payloads`` (oldest first) to ``live`` in place."""
    for payload in payloads:
        if payload.get("type") == CLEAR["type"]:
            live.clear()
        elif payload.get("type") == POP["type"]:
            if live:
                live.pop()
        elif not is_marker(payload):
            live.append(dict(payload))


def _last(live: Payloads, limit: int | None) -> Payloads:
    if limit is None:
        return list(live)
    return live[-limit:] if limit > 0 else []


class MarkerLog:
    def __init__(
        self,
        client: Client | AsyncClient,
        conversation_id: str,
        *,
        wait_for_ack: bool = False,
        flush_timeout: float = 10.0,
        owns_client: bool = False,
    ) -> None:
        self.client = client
        self.conversation_id = validate_conversation_id(conversation_id)
        self.wait_for_ack = wait_for_ack
        self.flush_timeout = flush_timeout
        self.owns_client = owns_client
        self._lock = threading.Lock()
        self._live: Payloads = []
        self._next_seq = 0
        self._mine: Payloads = []  # appended by this log since its last read of the server

    @classmethod
    def open(
        cls, first: Any, second: Any, wait_for_ack: bool, flush_timeout: float, owns_client: bool
    ) -> MarkerLog:
        """An adapter's log: ``(session_id, client)`` or ``(client, session_id)``."""
        session_id, client = session_and_client(first, second)
        return cls(
            client,
            session_id,
            wait_for_ack=wait_for_ack,
            flush_timeout=flush_timeout,
            owns_client=owns_client,
        )

    # -- the sync face (a Client) -----------------------------------------------------------------

    def _sync_client(self) -> Client:
        if not isinstance(self.client, Client):
            raise TypeError("this adapter has an AsyncClient: use its async methods, or pass a Client")
        return self.client

    def append(self, items: Sequence[Mapping[str, Any]]) -> None:
        client = self._sync_client()
        with self._lock:
            self._mine.extend(dict(i) for i in items)
        for start in range(0, len(items), MAX_BATCH_ITEMS):
            chunk = list(items[start : start + MAX_BATCH_ITEMS])
            if self.wait_for_ack:
                client.append(self.conversation_id, chunk)
            else:
                client.append_nowait(self.conversation_id, chunk)

    def live(self, limit: int | None = None) -> Payloads:
        """The items not cleared or popped, oldest first (a copy); the last ``limit`` of them if given."""
        client = self._sync_client()
        mine = len(self._mine)
        if not client.flush(self.flush_timeout, conversation_id=self.conversation_id, until_failing=True):
            return self._offline(limit, self._unsettled(client.aio))
        try:
            return client._run(self._read, client.aio, limit, mine)  # type: ignore[no-any-return]
        except LogstoreError as exc:
            if not exc.retryable:
                raise
            return self._offline(limit, exc)

    def pop(self) -> dict[str, Any] | None:
        live = self.live(1)
        if not live:
            return None
        self.append([POP])
        return live[-1]

    def clear(self) -> None:
        self.append([CLEAR])

    def close(self) -> None:
        if self.owns_client:
            self._sync_client().close()

    # -- the async face ----------------------------------------------------------------------------

    async def aappend(self, items: Sequence[Mapping[str, Any]]) -> None:
        client = self.client
        if isinstance(client, Client):
            await anyio.to_thread.run_sync(self.append, items)
            return
        with self._lock:
            self._mine.extend(dict(i) for i in items)
        for start in range(0, len(items), MAX_BATCH_ITEMS):
            chunk = list(items[start : start + MAX_BATCH_ITEMS])
            if self.wait_for_ack:
                await client.append(self.conversation_id, chunk)
            else:
                client.append_nowait(self.conversation_id, chunk)

    async def alive(self, limit: int | None = None) -> Payloads:
        client = self.client
        if isinstance(client, Client):
            return await anyio.to_thread.run_sync(self.live, limit)
        mine = len(self._mine)
        if not await client.flush(
            self.flush_timeout, conversation_id=self.conversation_id, until_failing=True
        ):
            return self._offline(limit, self._unsettled(client))
        try:
            return await self._read(client, limit, mine)
        except LogstoreError as exc:
            if not exc.retryable:
                raise
            return self._offline(limit, exc)

    async def apop(self) -> dict[str, Any] | None:
        live = await self.alive(1)
        if not live:
            return None
        await self.aappend([POP])
        return live[-1]

    async def aclear(self) -> None:
        await self.aappend([CLEAR])

    async def aclose(self) -> None:
        if not self.owns_client:
            return
        if isinstance(self.client, Client):
            await anyio.to_thread.run_sync(self.client.close)
        else:
            await self.client.aclose()

    # -- reading ----------------------------------------------------------------------------------

    def _unsettled(self, aio: AsyncClient) -> str:
        """Why this conversation's writes did not settle before a read (its flush returned False)."""
        writer = aio._writer
        if writer is not None and writer.failing(self.conversation_id):
            return "the server is unreachable: this conversation's writes are retried"
        return "this conversation's writes did not settle within flush_timeout"

    # -- reading the server --------------------------------------------------------------------------

    async def _read(self, aio: AsyncClient, limit: int | None, mine: int) -> Payloads:
        """Catch the fold up (or, before any full read, fold the tail backwards); ``mine``: how many of
        this log's own appends the read is known to include (they were flushed before it)."""
        with self._lock:
            start = self._next_seq
        if start == 0 and limit is not None:
            tail = await self._tail(aio, limit)
        else:
            items: list[MemoryItem] = [
                item async for item in aio.iter_replay(self.conversation_id, start=start)
            ]
        with self._lock:
            del self._mine[:mine]
            if start == 0 and limit is not None:
                return tail
            fresh = [i for i in items if i.seq >= self._next_seq]
            fold(self._live, [i.payload for i in fresh])
            if fresh:
                self._next_seq = fresh[-1].seq + 1
            return _last(self._live, limit)

    async def _tail(self, aio: AsyncClient, limit: int) -> Payloads:
        """The last ``limit`` live items, read from the end: a CLEAR ends the walk, each POP removes the
        next live item met (the pops pair with the latest items as they did going forward)."""
        if limit <= 0:
            return []
        found: Payloads = []
        pops = 0
        page = await aio.recall(self.conversation_id, min(MAX_READ_COUNT, max(2 * limit, 50)))
        while True:
            for item in reversed(page):
                kind = item.payload.get("type")
                if kind == CLEAR["type"]:
                    return found[::-1]
                if kind == POP["type"]:
                    pops += 1
                elif not is_marker(item.payload):
                    if pops:
                        pops -= 1
                        continue
                    found.append(item.payload)
                    if len(found) == limit:
                        return found[::-1]
            if not page or page[0].seq == 0:
                return found[::-1]
            first = page[0].seq
            page = await aio.replay(
                self.conversation_id, max(0, first - MAX_READ_COUNT), min(first, MAX_READ_COUNT)
            )

    def _offline(self, limit: int | None, why: object) -> Payloads:
        with self._lock:
            live = list(self._live)
            fold(live, self._mine)
        log.warning(
            "memory read of %s served from this process (%d items held, %d not confirmed stored): %s",
            self.conversation_id,
            len(self._live),
            len(self._mine),
            why,
        )
        return _last(live, limit)
