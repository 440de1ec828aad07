"""``Client``: the blocking face of ``AsyncClient``, for agents without an event loop.

Every call runs on one private event loop thread (an anyio blocking portal) and waits for it; the
background writer (``append_nowait``) has its own thread as in the async client.

    with Client.http("http://127.0.0.1:8080/mcp", site="alpha", password="...") as memory:
        memory.append_nowait(conversation_id, [{"role": "user", "content": "hi"}])
        for item in memory.iter_replay(conversation_id):
            ...
"""

from __future__ import annotations

import threading
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Any, TypeVar

from anyio.from_thread import BlockingPortal, start_blocking_portal

from logstore.core.limits import MAX_READ_COUNT
from logstore.core.models import ConversationListing, ConversationSummary, MemoryItem, SeqRange

from .aio import AsyncClient

__all__ = ["Client"]

T = TypeVar("T")


class Client:
    def __init__(self, inner: AsyncClient) -> None:
        self.aio = inner
        self._portal_cm: AbstractContextManager[BlockingPortal] | None = None
        self._portal: BlockingPortal | None = None
        self._portal_lock = threading.Lock()

    @classmethod
    def http(
        cls, url: str, *, site: str, password: str, timeout: float = 30.0, writer_options: Any = None
    ) -> Client:
        return cls(
            AsyncClient.http(
                url, site=site, password=password, timeout=timeout, writer_options=writer_options
            )
        )

    @classmethod
    def stdio(
        cls,
        command: str,
        args: Sequence[str] = (),
        *,
        env: Mapping[str, str] | None = None,
        writer_options: Any = None,
    ) -> Client:
        return cls(AsyncClient.stdio(command, args, env=env, writer_options=writer_options))

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _run(self, fn: Callable[..., Any], *args: Any) -> Any:
        portal = self._portal
        if portal is None:
            with self._portal_lock:  # two threads' first calls start one portal
                if self._portal is None:
                    self._portal_cm = start_blocking_portal()
                    self._portal = self._portal_cm.__enter__()
                portal = self._portal
        return portal.call(fn, *args)

    def append(self, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> SeqRange:
        result: SeqRange = self._run(self.aio.append, conversation_id, items)
        return result

    def recall(self, conversation_id: str, count: int = 50) -> list[MemoryItem]:
        result: list[MemoryItem] = self._run(self.aio.recall, conversation_id, count)
        return result

    def replay(self, conversation_id: str, offset: int = 0, limit: int = MAX_READ_COUNT) -> list[MemoryItem]:
        result: list[MemoryItem] = self._run(self.aio.replay, conversation_id, offset, limit)
        return result

    def list_conversations(self, cursor: str | None = None, limit: int = 50) -> ConversationListing:
        result: ConversationListing = self._run(self.aio.list_conversations, cursor, limit)
        return result

    def _iterate(self, agen: AsyncIterator[T]) -> Iterator[T]:
        async def step() -> tuple[bool, Any]:
            try:
                return True, await agen.__anext__()
            except StopAsyncIteration:
                return False, None

        while True:
            more, value = self._run(step)
            if not more:
                return
            yield value

    def iter_replay(
        self, conversation_id: str, *, start: int = 0, page: int = MAX_READ_COUNT
    ) -> Iterator[MemoryItem]:
        return self._iterate(self.aio.iter_replay(conversation_id, start=start, page=page))

    def iter_conversations(self, *, page: int = 100) -> Iterator[ConversationSummary]:
        return self._iterate(self.aio.iter_conversations(page=page))

    @property
    def writer(self) -> Any:
        return self.aio.writer

    def append_nowait(self, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> bool:
        """Hand the batch to the background writer; returns at once (see ``BackgroundWriter.append``)."""
        return self.aio.append_nowait(conversation_id, items)

    def flush(
        self, timeout: float | None = None, conversation_id: str | None = None, *, until_failing: bool = False
    ) -> bool:
        """Wait until the batches handed to ``append_nowait`` (of ``conversation_id`` only, if given) are
        settled: stored or reported. False on timeout (``until_failing``: ``BackgroundWriter.flush``)."""
        writer = self.aio._writer
        return (
            True
            if writer is None
            else bool(writer.flush(timeout, conversation_id, until_failing=until_failing))
        )

    def close(self, timeout: float | None = 30.0) -> None:
        """Drain the background writer (up to ``timeout``), then close the connection."""
        try:
            if self.aio._writer is not None:
                writer, self.aio._writer = self.aio._writer, None
                writer.close(timeout)
            if self._portal is not None:
                self._portal.call(self.aio.aclose)
        finally:
            if self._portal_cm is not None:
                cm, self._portal_cm, self._portal = self._portal_cm, None, None
                cm.__exit__(None, None, None)
