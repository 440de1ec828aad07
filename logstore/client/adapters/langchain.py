"""LangChain's ``BaseChatMessageHistory`` on a logstore conversation (extra ``logstore-memory[langchain]``).

    from logstore.client.adapters.langchain import LogstoreChatMessageHistory

    history = LogstoreChatMessageHistory.from_url(session_id, "http://127.0.0.1:8080/mcp",
                                                  site="alpha", password="...")
    # or LogstoreChatMessageHistory(session_id, client) with a Client (or an AsyncClient: async methods)
    history.add_user_message("hi")                             # never waits on the network
    history.messages                                           # [HumanMessage("hi")]
    history.close()                                            # closes the client from_url opened

Messages are stored as their LangChain dicts (``message_to_dict``: ``{"type": "human", "data": {...}}``),
one item per message, each ``add_messages`` call one batch (250 messages at most per batch). ``clear``
appends a marker (``markers``). Reads flush this conversation's writes first, and with the server down
serve what this history holds plus its unconfirmed writes (a warning is logged).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from ..sync import Client
from .markers import MarkerLog

__all__ = ["LogstoreChatMessageHistory"]


class LogstoreChatMessageHistory(BaseChatMessageHistory):
    def __init__(
        self,
        session_id: Any,
        client: Any = None,
        *,
        wait_for_ack: bool = False,
        flush_timeout: float = 10.0,
        owns_client: bool = False,
    ) -> None:
        """``(session_id, client)``, the order of LangChain's histories (``(client, session_id)`` too).
        ``client``: a ``Client``, or an ``AsyncClient`` for the async methods only."""
        self.log = MarkerLog.open(session_id, client, wait_for_ack, flush_timeout, owns_client)
        self.session_id = self.log.conversation_id

    @classmethod
    def from_url(
        cls, session_id: str, url: str, *, site: str, password: str, timeout: float = 30.0, **kwargs: Any
    ) -> LogstoreChatMessageHistory:
        """A history with a ``Client`` of its own (closed by ``close()``)."""
        client = Client.http(url, site=site, password=password, timeout=timeout)
        return cls(session_id, client, owns_client=True, **kwargs)

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return messages_from_dict(self.log.live())

    async def aget_messages(self) -> list[BaseMessage]:
        return messages_from_dict(await self.log.alive())

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.log.append([message_to_dict(m) for m in messages])

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await self.log.aappend([message_to_dict(m) for m in messages])

    def clear(self) -> None:
        self.log.clear()

    async def aclear(self) -> None:
        await self.log.aclear()

    def close(self) -> None:
        """Close the client if this history opened it (``from_url``)."""
        self.log.close()

    async def aclose(self) -> None:
        await self.log.aclose()
