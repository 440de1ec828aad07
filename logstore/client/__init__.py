"""logstore's client library: the four MCP tools, typed, and a background writer that never blocks the
agent (docs/CLIENT.md).

- ``AsyncClient`` / ``Client`` (blocking): ``append`` (waits for the durable ack), ``recall``, ``replay``,
  ``list_conversations``, ``iter_replay`` (the restore loop), ``iter_conversations``, and
  ``append_nowait`` / ``flush`` / ``close`` (the background writer).
- ``BackgroundWriter`` + ``WriterOptions``: retries, buffer, spool, ``on_error`` (``Failure``).
- Errors are ``logstore.core.errors`` classes; ``client.errors`` adds ``Unauthorized``, ``ProtocolError``.
"""

from .aio import AsyncClient
from .errors import ProtocolError, Unauthorized, outcome_of
from .sync import Client
from .writer import BackgroundWriter, Disposition, Failure, SpoolSync, WriterOptions

__all__ = [
    "AsyncClient",
    "Client",
    "BackgroundWriter",
    "WriterOptions",
    "Failure",
    "Disposition",
    "SpoolSync",
    "Unauthorized",
    "ProtocolError",
    "outcome_of",
]
