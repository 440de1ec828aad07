"""The one place where failures become MCP tool errors.

Every tool call's exception ends here. The result is a ``CallToolResult`` with ``isError: true`` whose one
text content block is the JSON document::

    {"error": {"code": "PayloadTooLarge", "message": "...", "retryable": false, ...details}}

The body is deliberately *not* repeated as ``structuredContent``: the TypeScript SDK 1.x (and so every
client built on it) validates ``structuredContent`` against the tool's output schema even when ``isError``
is true, and an error body can never match ``AppendMemoryResponse`` and friends — such clients would throw a
schema-mismatch protocol error and never show the agent the real error. The Python SDK parses either way.

``code`` is the spec's error name (or ``InvalidArgument`` / ``InvalidCursor`` / ``UnknownTool`` for
argument errors the spec leaves unnamed, ``Unreadable`` for a stored item no client could parse),
``retryable`` follows the engine (true only for Unavailable, Timeout, Io). Details are the engine's
client-safe fields (``outcome: "unknown"`` for an Unavailable whose batch may have been stored, with a
message saying so instead of "safe to retry"; ``reason`` for InvalidConversationId, ``offset`` for
Corrupted, ``seq`` and ``reason`` for Unreadable, sizes and limits for the size errors, ``index`` and
``path`` for a payload rule broken inside an item).

For operational errors the engine's message may name files or OS errors, so clients get a fixed message
and the engine's text goes to the server log. Anything that is not a ``LogstoreError`` is a bug or an
environment failure: it is logged with its traceback and reported as a retryable ``Unavailable`` without
any exception text.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import mcp_types as types

from logstore.core import errors

__all__ = ["UnknownTool", "body_result", "body_text", "error_body", "error_result"]

log = logging.getLogger("logstore.server")


class UnknownTool(errors.LogstoreError):
    code = "UnknownTool"


# Client-facing messages for failures whose engine message is operator information.
_OPERATIONAL_MESSAGES = {
    "Unavailable": "memory storage is temporarily unavailable; safe to retry after buffering the batch",
    "Timeout": "timed out waiting for access to the conversation; safe to retry after buffering the batch",
    "Io": "memory storage I/O error; safe to retry after buffering the batch",
    "Corrupted": "the conversation log is corrupted at this byte offset; the read cannot be served",
}
# Unavailable with outcome "unknown" (errors.Unavailable): the request may have been applied, so the
# "safe to retry" above would be false; ``outcome`` is also in the body, for client libraries.
_UNKNOWN_OUTCOME_MESSAGE = (
    "memory storage became unavailable after the batch was sent; its outcome is unknown: it may have been "
    "stored, so a blind retry can store it twice (recall the conversation's tail and look for the batch "
    "before retrying)"
)


def error_body(exc: BaseException, *, tool: str | None = None) -> dict[str, Any]:
    """Map ``exc`` to the ``{"error": {...}}`` body; logs whatever the client is not told."""
    if isinstance(exc, errors.LogstoreError):
        fixed = _OPERATIONAL_MESSAGES.get(exc.code)
        if isinstance(exc, errors.Unavailable) and exc.outcome == "unknown":
            fixed = _UNKNOWN_OUTCOME_MESSAGE
        if fixed is not None:
            log.warning("tool %s failed: %s: %s", tool, exc.code, exc.message)
        body: dict[str, Any] = {
            "code": exc.code,
            "message": fixed or exc.message,
            "retryable": bool(exc.retryable),
        }
        for key, value in exc.details().items():
            body.setdefault(key, value)  # never let details shadow code/message/retryable
        return {"error": body}
    log.error("tool %s raised an unexpected error", tool, exc_info=exc)
    return {
        "error": {
            "code": "Unavailable",
            "message": "internal server error; safe to retry after buffering the batch",
            "retryable": True,
        }
    }


def error_result(exc: BaseException, *, tool: str | None = None) -> types.CallToolResult:
    return body_result(error_body(exc, tool=tool))


def body_result(body: dict[str, Any]) -> types.CallToolResult:
    """The ``CallToolResult`` carrying an ``error_body`` (callers that also need its code map once)."""
    return types.CallToolResult(content=[types.TextContent(type="text", text=body_text(body))], is_error=True)


def body_text(body: dict[str, Any]) -> str:
    """The text content block of an error result (the fast lane writes the same text)."""
    return json.dumps(body, ensure_ascii=False, separators=(",", ":"))
