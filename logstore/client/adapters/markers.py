"""The adapters' shared reading of a conversation: data items, and the markers that undo them.

A conversation written by an adapter holds the framework's items verbatim, plus two marker items:

- ``{"type": "logstore.clear"}``: everything before it is cleared;
- ``{"type": "logstore.pop"}``: the most recent live item is removed.

(No LangChain message dict or OpenAI input item has a ``type`` starting with ``logstore.``.) ``MarkerLog``
folds the log into the live items, and keeps the fold: the log is append-only, so the next read replays
only what was appended since (``iter_replay(start=next_seq)``).

Writes go through the client's background writer (``append_nowait``: never blocks the agent) unless
``wait_for_ack``; a read first flushes the writer (up to ``flush_timeout``) so an agent reads its own
writes.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Mapping, Sequence
from typing import Any

from logstore.core.ids import validate_conversation_id
from logstore.core.limits import MAX_BATCH_ITEMS

from ..sync import Client

__all__ = ["MarkerLog", "CLEAR", "POP", "new_session_id"]

CLEAR: dict[str, Any] = {"type": "logstore.clear"}
POP: dict[str, Any] = {"type": "logstore.pop"}


def new_session_id() -> str:
    """A fresh conversation id (a UUID): mint ids, never derive them from user data."""
    return uuid.uuid4().hex


def is_marker(payload: Mapping[str, Any]) -> bool:
    kind = payload.get("type")
    return isinstance(kind, str) and kind.startswith("logstore.")


class MarkerLog:
    def __init__(
        self, client: Client, conversation_id: str, *, wait_for_ack: bool = False, flush_timeout: float = 10.0
    ) -> None:
        self.client = client
        self.conversation_id = validate_conversation_id(conversation_id)
        self.wait_for_ack = wait_for_ack
        self.flush_timeout = flush_timeout
        self._lock = threading.Lock()
        self._live: list[dict[str, Any]] = []
        self._next_seq = 0

    def append(self, items: Sequence[Mapping[str, Any]]) -> None:
        for start in range(0, len(items), MAX_BATCH_ITEMS):
            chunk = list(items[start : start + MAX_BATCH_ITEMS])
            if self.wait_for_ack:
                self.client.append(self.conversation_id, chunk)
            else:
                self.client.append_nowait(self.conversation_id, chunk)

    def live(self) -> list[dict[str, Any]]:
        """The items not cleared or popped, oldest first (a copy)."""
        self.client.flush(self.flush_timeout)
        with self._lock:
            for item in self.client.iter_replay(self.conversation_id, start=self._next_seq):
                payload = item.payload
                if payload.get("type") == CLEAR["type"]:
                    self._live.clear()
                elif payload.get("type") == POP["type"]:
                    if self._live:
                        self._live.pop()
                elif not is_marker(payload):
                    self._live.append(payload)
                self._next_seq = item.seq + 1
            return list(self._live)

    def pop(self) -> dict[str, Any] | None:
        live = self.live()
        if not live:
            return None
        self.append([POP])
        return live[-1]

    def clear(self) -> None:
        self.append([CLEAR])
