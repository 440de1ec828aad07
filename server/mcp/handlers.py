"""The four spec tools: arguments in, the output schema's JSON out, one engine call each.

Handlers are plain blocking functions ``(store, site, args) -> dict``; the MCP layer runs them in a worker
thread. They receive arguments already validated against the input schema (defaults applied), and return
exactly the shape of the tool's output schema with RFC3339 timestamps. Engine errors propagate unchanged to
``server.mcp.tool_errors``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from logstore.core.backend import Backend
from logstore.core.models import MemoryItem, rfc3339

__all__ = ["StoreLike", "Handler", "SPEC_HANDLERS", "append_memory_json"]


StoreLike = Backend  # the server's name for the backend protocol (logstore.core.backend)

Handler = Callable[[StoreLike, str, dict[str, Any]], dict[str, Any]]


def _items(items: list[MemoryItem]) -> list[dict[str, Any]]:
    return [{"seq": m.seq, "recorded_at": rfc3339(m.recorded_at), "payload": m.payload} for m in items]


def append_memory(store: StoreLike, site: str, args: dict[str, Any]) -> dict[str, Any]:
    r = store.append(site, args["conversation_id"], args["items"])
    return {"first_seq": r.first, "last_seq": r.last}


def append_memory_json(store: StoreLike, site: str, args: dict[str, Any]) -> dict[str, Any]:
    """``append_memory`` with each item as its JSON text (the fast lane: ``Backend.append_json``)."""
    r = store.append_json(site, args["conversation_id"], args["items"])
    return {"first_seq": r.first, "last_seq": r.last}


def recall_memory(store: StoreLike, site: str, args: dict[str, Any]) -> dict[str, Any]:
    return {"items": _items(store.recall(site, args["conversation_id"], count=args["count"]))}


def replay_memory(store: StoreLike, site: str, args: dict[str, Any]) -> dict[str, Any]:
    items = store.replay(site, args["conversation_id"], offset=args["offset"], limit=args["limit"])
    return {"items": _items(items)}


def list_conversations(store: StoreLike, site: str, args: dict[str, Any]) -> dict[str, Any]:
    page = store.list_conversations(site, cursor=args["cursor"], limit=args["limit"])
    return {
        "conversations": [
            {
                "conversation_id": s.conversation_id,
                "created_at": rfc3339(s.created_at),
                "last_appended_at": rfc3339(s.last_appended_at),
            }
            for s in page.conversations
        ],
        # Always present: null is how the spec marks the end of the listing.
        "next_cursor": page.next_cursor,
    }


SPEC_HANDLERS: dict[str, Handler] = {
    "append_memory": append_memory,
    "recall_memory": recall_memory,
    "replay_memory": replay_memory,
    "list_conversations": list_conversations,
}
