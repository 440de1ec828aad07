"""logstore: durable, append-only, per-conversation memory logs.

Packages (docs/ARCHITECTURE.md): ``logstore.core`` is the backend-neutral contract (errors, limits, ids,
models, batch preparation, cursors, the backend and site-registry protocols, ``open_store``/
``open_registry``); ``logstore.file`` is the file engine; ``logstore.fsck`` checks and repairs it.

``from logstore import Store`` (the README's API) loads the file engine lazily, on first use, so that
importing an error class or a limit never loads the engine.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .core.errors import (
    BatchTooLarge,
    ConversationFull,
    Corrupted,
    EmptyBatch,
    InvalidArgument,
    InvalidConversationId,
    InvalidCursor,
    Io,
    LogstoreError,
    PayloadTooLarge,
    Timeout,
    Unavailable,
    Unreadable,
)
from .core.models import ConversationListing, ConversationSummary, MemoryItem, SeqRange

if TYPE_CHECKING:
    from .file.store import Store

__all__ = [
    "BatchTooLarge",
    "ConversationFull",
    "ConversationListing",
    "ConversationSummary",
    "Corrupted",
    "EmptyBatch",
    "InvalidArgument",
    "InvalidConversationId",
    "InvalidCursor",
    "Io",
    "LogstoreError",
    "MemoryItem",
    "PayloadTooLarge",
    "SeqRange",
    "Store",
    "Timeout",
    "Unavailable",
    "Unreadable",
]


def __getattr__(name: str) -> Any:
    if name == "Store":
        from .file.store import Store

        return Store
    raise AttributeError(f"module 'logstore' has no attribute {name!r}")
