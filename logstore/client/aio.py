"""``AsyncClient``: the four tools, typed, with the spec's restore and listing loops.

    async with AsyncClient.http("http://127.0.0.1:8080/mcp", site="alpha", password="...") as memory:
        seqs = await memory.append(conversation_id, [{"role": "user", "content": "hi"}])  # waits for the ack
        async for item in memory.iter_replay(conversation_id):                           # the restore loop
            ...
        memory.append_nowait(conversation_id, [{"role": "assistant", "content": "hello"}])  # never waits

Results are the engine's models (``SeqRange``, ``MemoryItem``, ``ConversationListing``); errors the
engine's exception classes (``logstore.core.errors``, ``.code`` / ``.retryable``), see ``client.errors``.
``append_nowait`` hands the batch to a ``BackgroundWriter`` (its own thread, loop and connection), created
on first use from ``writer_options`` (at once when they name a spool: its batches are replayed at start).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import anyio

from logstore.core import errors
from logstore.core.models import SeqRange

from .calls import ToolCalls, TransportFactory
from .transport import HttpTransport, StdioTransport
from .writer import BackgroundWriter, WriterOptions

__all__ = ["AsyncClient", "ORDER_TIMEOUT"]

ORDER_TIMEOUT = 30.0


class AsyncClient(ToolCalls):
    """One connection to a logstore server (``ToolCalls``), and the background writer. ``factory`` builds
    the transport; the writer builds its own from the same factory, on its own loop."""

    def __init__(self, factory: TransportFactory, *, writer_options: WriterOptions | None = None) -> None:
        super().__init__(factory)
        self._writer_options = writer_options
        self._writer: BackgroundWriter | None = None
        if writer_options is not None and writer_options.spool:
            self.writer  # noqa: B018 - a spool is replayed at start, not at the first append_nowait

    @classmethod
    def http(
        cls,
        url: str,
        *,
        site: str,
        password: str,
        timeout: float = 30.0,
        writer_options: WriterOptions | None = None,
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
        writer_options: WriterOptions | None = None,
    ) -> AsyncClient:
        """A client of ``command`` over stdin/stdout (e.g. ``logstore serve --stdio --data-dir D``). The
        background writer starts a second server process of its own."""
        return cls(lambda: StdioTransport(command, args, env=env), writer_options=writer_options)

    async def __aenter__(self) -> AsyncClient:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def append(self, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> SeqRange:
        """Append one batch and wait for its durable acknowledgement, after the batches of this
        conversation handed to ``append_nowait`` before it (order is kept: up to ``ORDER_TIMEOUT`` s, then
        ``Timeout``). Raises the spec's errors; nothing is retried."""
        writer = self._writer
        if writer is not None and writer.has_pending(conversation_id):
            settled = await anyio.to_thread.run_sync(lambda: writer.flush(ORDER_TIMEOUT, conversation_id))
            if not settled:
                raise errors.Timeout(
                    "batches handed to append_nowait earlier for this conversation are not stored yet; "
                    "append() waits for them to keep the conversation's order"
                )
        return await super().append(conversation_id, items)

    # -- the background writer --------------------------------------------------------------------

    @property
    def writer(self) -> BackgroundWriter:
        """The ``BackgroundWriter`` (started on first use)."""
        if self._writer is None:
            self._writer = BackgroundWriter(self._factory, self._writer_options)
        return self._writer

    def append_nowait(self, conversation_id: str, items: Sequence[Mapping[str, Any]]) -> bool:
        """Hand the batch to the background writer and return at once (see ``BackgroundWriter.append``)."""
        return bool(self.writer.append(conversation_id, items))

    async def flush(
        self, timeout: float | None = None, conversation_id: str | None = None, *, until_failing: bool = False
    ) -> bool:
        """Wait (without blocking this loop) until every batch handed over (of ``conversation_id`` only,
        if given) is settled; False on timeout (``until_failing``: ``BackgroundWriter.flush``)."""
        if self._writer is None:
            return True
        writer = self._writer
        return bool(
            await anyio.to_thread.run_sync(
                lambda: writer.flush(timeout, conversation_id, until_failing=until_failing)
            )
        )

    async def aclose(self, timeout: float | None = 30.0) -> None:
        """Drain the background writer (up to ``timeout``), then close the connections."""
        if self._writer is not None:
            writer, self._writer = self._writer, None
            await anyio.to_thread.run_sync(lambda: writer.close(timeout))
        await super().aclose()
