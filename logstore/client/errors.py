"""The server's error bodies, back into the engine's exception classes (``logstore.core.errors``).

A tool error arrives as ``{"error": {"code", "message", "retryable", ...details}}``
(server/mcp/tool_errors.py);
``error_from_body`` raises the same class the engine would have raised, with the same ``.code``,
``.retryable`` and detail attributes, so code written against ``Store`` handles the client's errors
unchanged. Two failures exist only on the client's side of the wire:

- the server refused the credentials (``Unauthorized``, permanent: retrying cannot help);
- the server answered something that is not an MCP tool result (``ProtocolError``, permanent).

Unknown outcome. ``Unavailable`` may carry ``outcome == "unknown"``: the request may have been applied
(the server says so in the body, or the connection dropped after the request was sent). It is the one
failure where a blind retry of an append can store the batch twice; ``outcome_of`` reads it whether or
not this build's ``Unavailable`` declares the attribute.
"""

from __future__ import annotations

from typing import Any

from logstore.core import errors

__all__ = [
    "UNKNOWN",
    "Unauthorized",
    "ProtocolError",
    "RemoteError",
    "error_from_body",
    "outcome_of",
    "unavailable",
]

UNKNOWN = "unknown"


class Unauthorized(errors.LogstoreError):
    """HTTP 401/403: the site or password was refused. Permanent."""

    code = "Unauthorized"


class ProtocolError(errors.LogstoreError):
    """The server's reply is not a tool result this client understands (a JSON-RPC error, a bad body)."""

    code = "ProtocolError"


class RemoteError(errors.LogstoreError):
    """An error code this client does not know (a newer server): ``.code`` and ``.retryable`` as sent."""

    def __init__(self, code: str, message: str, retryable: bool) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


def unavailable(message: str, *, outcome: str | None = None) -> errors.Unavailable:
    """An ``Unavailable`` with ``outcome`` set (``"unknown"`` when the request may have been applied)."""
    exc = errors.Unavailable(message)
    setattr(exc, "outcome", outcome)  # noqa: B010 - the attribute is declared by issue 26's Unavailable
    return exc


def outcome_of(exc: BaseException) -> str | None:
    """``"unknown"`` when ``exc`` says its request may have been applied; None otherwise."""
    value = getattr(exc, "outcome", None)
    return value if isinstance(value, str) else None


def _int(body: dict[str, Any], key: str) -> int:
    value = body.get(key)
    return value if isinstance(value, int) else -1


def error_from_body(body: Any) -> errors.LogstoreError:
    """The exception for one tool error body (the ``{"error": {...}}`` document, or its inner object)."""
    if isinstance(body, dict) and isinstance(body.get("error"), dict):
        body = body["error"]
    if not isinstance(body, dict) or not isinstance(body.get("code"), str):
        return ProtocolError(f"unrecognised tool error body: {str(body)[:200]}")
    code: str = body["code"]
    message = str(body.get("message", code))
    if code == "Unavailable":
        outcome = body.get("outcome")
        return unavailable(message, outcome=outcome if isinstance(outcome, str) else None)
    if code == "Timeout":
        return errors.Timeout(message)
    if code == "Io":
        return errors.Io(message)
    if code == "EmptyBatch":
        return errors.EmptyBatch(message)
    if code == "InvalidConversationId":
        reason = body.get("reason")
        if reason in errors.InvalidConversationId.REASONS:
            return errors.InvalidConversationId(str(reason), message)
    elif code == "PayloadTooLarge":
        return errors.PayloadTooLarge(
            message, index=_int(body, "index"), size=_int(body, "size"), limit=_int(body, "limit")
        )
    elif code == "BatchTooLarge":
        return errors.BatchTooLarge(message, size=_int(body, "size"), limit=_int(body, "limit"))
    elif code == "ConversationFull":
        return errors.ConversationFull(
            message, stored=_int(body, "stored"), requested=_int(body, "requested"), limit=_int(body, "limit")
        )
    elif code == "Corrupted":
        return errors.Corrupted(message, path="", offset=_int(body, "offset"))
    elif code == "Unreadable":
        reason = body.get("reason")
        if reason in errors.Unreadable.REASONS:
            return errors.Unreadable(message, seq=_int(body, "seq"), reason=str(reason))
    elif code == "InvalidCursor":
        return errors.InvalidCursor(message)
    elif code == "InvalidArgument":
        index, path, field = body.get("index"), body.get("path"), body.get("field")
        return errors.InvalidArgument(
            message,
            field=field if isinstance(field, str) else None,
            index=index if isinstance(index, int) else None,
            path=path if isinstance(path, str) else None,
        )
    return RemoteError(code, message, bool(body.get("retryable", False)))
