"""LangChain's ``BaseChatMessageHistory`` on a logstore conversation (``pip install 'logstore[langchain]'``).

    from logstore.client import Client
    from logstore.client.adapters.langchain import LogstoreChatMessageHistory

    client = Client.http("http://127.0.0.1:8080/mcp", site="alpha", password="...")
    history = LogstoreChatMessageHistory(client, session_id)   # session_id: minted, e.g. uuid4().hex
    history.add_user_message("hi")                             # never waits on the network
    history.messages                                           # [HumanMessage("hi")]

Messages are stored as their LangChain dicts (``message_to_dict``: ``{"type": "human", "data": {...}}``),
one item per message, each ``add_messages`` call one batch (250 messages at most per batch). ``clear``
appends a marker (``markers``). The async methods run the blocking ones in a worker thread.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
from langchain_core.chat_history import BaseChatMessageHistory
from langchain_core.messages import BaseMessage, message_to_dict, messages_from_dict

from ..sync import Client
from .markers import MarkerLog

__all__ = ["LogstoreChatMessageHistory"]


class LogstoreChatMessageHistory(BaseChatMessageHistory):
    def __init__(
        self, client: Client, session_id: str, *, wait_for_ack: bool = False, flush_timeout: float = 10.0
    ) -> None:
        self.log = MarkerLog(client, session_id, wait_for_ack=wait_for_ack, flush_timeout=flush_timeout)
        self.session_id = self.log.conversation_id

    @property
    def messages(self) -> list[BaseMessage]:  # type: ignore[override]
        return messages_from_dict(self.log.live())

    async def aget_messages(self) -> list[BaseMessage]:
        return await anyio.to_thread.run_sync(lambda: self.messages)

    def add_messages(self, messages: Sequence[BaseMessage]) -> None:
        self.log.append([message_to_dict(m) for m in messages])

    async def aadd_messages(self, messages: Sequence[BaseMessage]) -> None:
        await anyio.to_thread.run_sync(self.add_messages, messages)

    def clear(self) -> None:
        self.log.clear()

    async def aclear(self) -> None:
        await anyio.to_thread.run_sync(self.clear)
