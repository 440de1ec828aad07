"""The one error hierarchy of logstore.

Leaves are named exactly as the spec's MemoryError variants, so that the server can map them to MCP
tool errors by ``.code`` in one place. ``.retryable`` is True only for Unavailable, Timeout and Io.

    LogstoreError                      (base; never raised itself)
    ├── InvalidArgument                permanent: count > 1000, non-object item, bad offset, bad site...;
    │                                  a payload rule (depth, non-finite number...): .index, .path
    │   ├── InvalidCursor              permanent: malformed or tampered list cursor
    │   └── ItemNotAnObject            (still InvalidArgument) an item given as JSON text that is not an
    │                                  object, or not JSON this store reads (``append_json``)
    ├── InvalidConversationId          permanent; .reason: TooShort | TooLong | InvalidCharacters
    ├── EmptyBatch                     permanent
    ├── PayloadTooLarge                permanent; .index, .size
    ├── BatchTooLarge                  permanent; .size
    ├── ConversationFull               permanent; .stored, .requested
    ├── Corrupted                      permanent; .path, .offset (byte offset of the bad frame)
    ├── Unreadable                     permanent; .seq, .reason: a stored item no client could parse
    ├── Unavailable                    retryable: store closed, handle poisoned and not yet reopened,
    │                                  database unreachable; .outcome "unknown" if the batch may be stored
    ├── Timeout                        retryable: conversation lock not acquired within lock_timeout
    └── Io                             retryable: a write, fsync, read or rename failed (.errno)
"""

from __future__ import annotations

__all__ = [
    "LogstoreError",
    "InvalidArgument",
    "InvalidCursor",
    "ItemNotAnObject",
    "InvalidConversationId",
    "EmptyBatch",
    "PayloadTooLarge",
    "BatchTooLarge",
    "ConversationFull",
    "Corrupted",
    "Unreadable",
    "Unavailable",
    "Timeout",
    "Io",
]


class LogstoreError(Exception):
    """Base of every error logstore raises on purpose."""

    code: str = "LogstoreError"
    retryable: bool = False

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def details(self) -> dict[str, object]:
        """Structured, client-safe fields beyond code/message/retryable (for the MCP error body)."""
        return {}


class InvalidArgument(LogstoreError):
    code = "InvalidArgument"

    def __init__(
        self, message: str, *, field: str | None = None, index: int | None = None, path: str | None = None
    ) -> None:
        super().__init__(message)
        self.field = field
        self.index, self.path = index, path  # which item, and where inside it (e.g. "$.a[2]")

    def details(self) -> dict[str, object]:
        out: dict[str, object] = {"field": self.field} if self.field else {}
        if self.index is not None:
            out["index"] = self.index
        if self.path is not None:
            out["path"] = self.path
        return out


class ItemNotAnObject(InvalidArgument):
    """``append_json``: an item's JSON text is not an object, or not JSON msgspec reads (invalid UTF-8, a
    number out of its range such as ``1e400``). The code stays ``InvalidArgument``; the class lets the
    server's fast lane tell this schema-level refusal from the payload rules (it words it as the SDK path
    does: ``server.mcp.fast_lane``)."""

    def __init__(self, message: str, *, index: int) -> None:
        super().__init__(message, field="items", index=index)


class InvalidCursor(InvalidArgument):
    code = "InvalidCursor"

    def __init__(self, message: str) -> None:
        super().__init__(message, field="cursor")


class InvalidConversationId(LogstoreError):
    code = "InvalidConversationId"
    REASONS = ("TooShort", "TooLong", "InvalidCharacters")

    def __init__(self, reason: str, message: str) -> None:
        assert reason in self.REASONS, reason
        super().__init__(message)
        self.reason = reason

    def details(self) -> dict[str, object]:
        return {"reason": self.reason}


class EmptyBatch(LogstoreError):
    code = "EmptyBatch"


class PayloadTooLarge(LogstoreError):
    code = "PayloadTooLarge"

    def __init__(self, message: str, *, index: int, size: int, limit: int) -> None:
        super().__init__(message)
        self.index, self.size, self.limit = index, size, limit

    def details(self) -> dict[str, object]:
        return {"index": self.index, "size": self.size, "limit": self.limit}


class BatchTooLarge(LogstoreError):
    code = "BatchTooLarge"

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size, self.limit = size, limit

    def details(self) -> dict[str, object]:
        return {"size": self.size, "limit": self.limit}


class ConversationFull(LogstoreError):
    code = "ConversationFull"

    def __init__(self, message: str, *, stored: int, requested: int, limit: int) -> None:
        super().__init__(message)
        self.stored, self.requested, self.limit = stored, requested, limit

    def details(self) -> dict[str, object]:
        return {"stored": self.stored, "requested": self.requested, "limit": self.limit}


class Corrupted(LogstoreError):
    code = "Corrupted"

    def __init__(self, message: str, *, path: str, offset: int) -> None:
        super().__init__(message)
        self.path, self.offset = path, offset

    def details(self) -> dict[str, object]:
        # The file name is operator information; the offset is what the spec promises clients.
        return {"offset": self.offset}


class Unreadable(LogstoreError):
    """A stored item that cannot be returned, because no client could parse it: data written before a
    payload rule existed (e.g. nested deeper than ``MAX_PAYLOAD_DEPTH``). The log itself is intact
    (``logstore export`` still reads it); reading past ``seq`` works."""

    code = "Unreadable"
    REASONS = ("TooDeep", "NumberOutOfRange")

    def __init__(self, message: str, *, seq: int, reason: str) -> None:
        assert reason in self.REASONS, reason
        super().__init__(message)
        self.seq, self.reason = seq, reason

    def details(self) -> dict[str, object]:
        return {"seq": self.seq, "reason": self.reason}


class Unavailable(LogstoreError):
    """``outcome="unknown"``: the request may have been applied (the connection to the database went after
    an append was sent), so a blind retry can store the batch twice; None: nothing was applied."""

    code = "Unavailable"
    retryable = True
    OUTCOMES = ("unknown",)

    def __init__(self, message: str, *, outcome: str | None = None) -> None:
        assert outcome is None or outcome in self.OUTCOMES, outcome
        super().__init__(message)
        self.outcome = outcome

    def details(self) -> dict[str, object]:
        return {"outcome": self.outcome} if self.outcome is not None else {}


class Timeout(LogstoreError):
    code = "Timeout"
    retryable = True


class Io(LogstoreError):
    code = "Io"
    retryable = True

    def __init__(self, message: str, *, errno: int | None = None) -> None:
        super().__init__(message)
        self.errno = errno
