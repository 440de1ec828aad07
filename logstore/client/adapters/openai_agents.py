"""The OpenAI Agents SDK's ``Session`` on a logstore conversation (``pip install 'logstore[openai-agents]'``).

    from agents import Agent, Runner
    from logstore.client import Client
    from logstore.client.adapters.openai_agents import LogstoreSession

    client = Client.http("http://127.0.0.1:8080/mcp", site="alpha", password="...")
    session = LogstoreSession(client, session_id)             # session_id: minted, e.g. uuid4().hex
    result = await Runner.run(agent, "hello", session=session)

Input items are stored verbatim, one item each, each ``add_items`` call one batch (250 items at most per
batch). ``pop_item`` and ``clear_session`` append markers (``markers``). Blocking work runs in a worker
thread, never on the agent's event loop.
"""

from __future__ import annotations

from typing import Any

import anyio
from agents.memory.session import SessionABC
from agents.memory.session_settings import SessionSettings

from ..sync import Client
from .markers import MarkerLog

__all__ = ["LogstoreSession"]


class LogstoreSession(SessionABC):
    def __init__(
        self,
        client: Client,
        session_id: str,
        *,
        wait_for_ack: bool = False,
        flush_timeout: float = 10.0,
        session_settings: SessionSettings | None = None,
    ) -> None:
        self.log = MarkerLog(client, session_id, wait_for_ack=wait_for_ack, flush_timeout=flush_timeout)
        self.session_id = self.log.conversation_id
        self.session_settings = session_settings or SessionSettings()

    async def get_items(self, limit: int | None = None) -> list[Any]:
        if limit is None and self.session_settings is not None:
            limit = self.session_settings.limit
        live = await anyio.to_thread.run_sync(self.log.live)
        if limit is None:
            return live
        return live[-limit:] if limit > 0 else []

    async def add_items(self, items: list[Any]) -> None:
        if items:
            await anyio.to_thread.run_sync(self.log.append, items)

    async def pop_item(self) -> Any | None:
        return await anyio.to_thread.run_sync(self.log.pop)

    async def clear_session(self) -> None:
        await anyio.to_thread.run_sync(self.log.clear)
