"""The OpenAI Agents SDK's ``Session`` on a logstore conversation (extra ``logstore-memory[openai-agents]``).

    from agents import Agent, Runner
    from logstore.client.adapters.openai_agents import LogstoreSession

    session = LogstoreSession.from_url(session_id, "http://127.0.0.1:8080/mcp", site="alpha", password="...")
    # or LogstoreSession(session_id, client) with an AsyncClient (on your loop) or a Client
    result = await Runner.run(agent, "hello", session=session)
    await session.aclose()                                    # closes the client from_url opened

Input items are stored verbatim, one item each, each ``add_items`` call one batch (250 items at most per
batch). ``pop_item`` and ``clear_session`` append markers (``markers``). ``get_items(limit)`` before any
full read takes the conversation's tail, not the whole log. With a ``Client`` blocking work runs in a
worker thread, never on the agent's event loop. With the server down, reads serve what the session holds
plus its unconfirmed writes (a warning is logged) instead of failing the turn.
"""

from __future__ import annotations

from typing import Any

from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings

from ..aio import AsyncClient
from .markers import MarkerLog

__all__ = ["LogstoreSession"]


class LogstoreSession(SessionABC):
    def __init__(
        self,
        session_id: Any,
        client: Any = None,
        *,
        wait_for_ack: bool = False,
        flush_timeout: float = 10.0,
        session_settings: SessionSettings | None = None,
        owns_client: bool = False,
    ) -> None:
        """``(session_id, client)``, the order of the SDK's sessions (``(client, session_id)`` too)."""
        self.log = MarkerLog.open(session_id, client, wait_for_ack, flush_timeout, owns_client)
        self.session_id = self.log.conversation_id
        self.session_settings = session_settings or SessionSettings()

    @classmethod
    def from_url(
        cls, session_id: str, url: str, *, site: str, password: str, timeout: float = 30.0, **kwargs: Any
    ) -> LogstoreSession:
        """A session with an ``AsyncClient`` of its own (closed by ``aclose()``)."""
        client = AsyncClient.http(url, site=site, password=password, timeout=timeout)
        return cls(session_id, client, owns_client=True, **kwargs)

    async def get_items(self, limit: int | None = None) -> list[Any]:
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        return await self.log.alive(limit)

    async def add_items(self, items: list[Any]) -> None:
        if items:
            await self.log.aappend(items)

    async def pop_item(self) -> Any | None:
        return await self.log.apop()

    async def clear_session(self) -> None:
        await self.log.aclear()

    async def aclose(self) -> None:
        """Close the client if this session opened it (``from_url``)."""
        await self.log.aclose()

    def close(self) -> None:
        self.log.close()
