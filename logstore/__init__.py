"""logstore: durable, append-only, per-conversation memory logs.

Layers (each module imports only from the ones above it in this list):
    limits, errors            constants and the error tree
    frame, index_codec        pure codecs: bytes in, values out, no I/O
    ids, models               validation and public value types
    fileio                    the one seam to the OS (fault injection plugs in here)
    locking                   per-path cross-process locks (flock) with timeouts
    scanner                   recovery scanner: classifies a log as clean / torn tail / corrupt
    conversation              one conversation's log + index: recovery, group commit, reads
    manifest                  per-site listing index, rebuildable from the logs
    store                     Store: sites, handle cache, the public API
    check                     verification and repair (fsck) over the same scanner
"""

from .errors import (
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
from .models import ConversationListing, ConversationSummary, MemoryItem, SeqRange
from .store import Store

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
