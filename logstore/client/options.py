"""The background writer's options, its reports to ``on_error`` and its counters (``client.writer``)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from logstore.core import errors

__all__ = ["Disposition", "SpoolSync", "BufferFull", "Closed", "Failure", "WriterOptions", "WriterStats"]


class Disposition(enum.Enum):
    REJECTED = "rejected"  # the server refused the batch with a permanent error
    GAVE_UP = "gave-up"  # retryable failures until retry_for ran out
    REFUSED = "refused"  # not accepted at hand-over: buffer full, invalid id, not JSON, writer closed
    ABANDONED = "abandoned"  # still unsent when close() timed out, and no spool to keep it


class SpoolSync(enum.Enum):
    BACKGROUND = "background"  # fdatasync every sync_interval: survives a process crash at once
    ALWAYS = "always"  # fdatasync before append returns: survives power loss, costs a disk flush


class BufferFull(errors.LogstoreError):
    code = "BufferFull"


class Closed(errors.LogstoreError):
    code = "Closed"


@dataclass(frozen=True)
class Failure:
    conversation_id: str
    items_json: bytes
    disposition: Disposition
    error: BaseException | None

    @property
    def items(self) -> list[dict[str, Any]]:
        return msgspec.json.decode(self.items_json) if self.items_json else []


@dataclass(frozen=True, kw_only=True)
class WriterOptions:
    max_batches: int = 10_000
    max_bytes: int = 64 << 20
    retry_for: float | None = 600.0
    backoff_initial: float = 0.05
    backoff_max: float = 5.0
    concurrency: int = 16
    on_error: Callable[[Failure], None] | None = None
    spool: str | None = None
    spool_sync: SpoolSync = SpoolSync.BACKGROUND
    sync_interval: float = 0.02
    spool_reset_bytes: int = 1 << 20  # rewritten when it passes this and nothing is pending (cheap)
    spool_max_bytes: int = 256 << 20  # rewritten with what is pending when it passes this (outside the lock)
    exit_timeout: float = 5.0  # how long interpreter exit waits to drain a writer never closed


@dataclass
class WriterStats:
    """Counters since start (read them for metrics or tests; written on the writer's thread)."""

    stored: int = 0  # batches acknowledged
    found_stored: int = 0  # batches of unknown outcome found already stored, so not sent again
    unknown: int = 0  # attempts whose outcome was unknown
    retries: int = 0  # failed attempts that were retried
    failed: int = 0  # batches reported to on_error (rejected, given up, refused, abandoned)
