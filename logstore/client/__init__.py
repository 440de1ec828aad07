"""logstore's client library: the four MCP tools, typed, and a background writer that never blocks the
agent (docs/CLIENT.md).

- ``AsyncClient`` / ``Client`` (blocking): ``append`` (waits for the durable ack), ``recall``, ``replay``,
  ``list_conversations``, ``iter_replay`` (the restore loop), ``iter_conversations``, and
  ``append_nowait`` / ``flush`` / ``close`` (the background writer).
- ``BackgroundWriter`` + ``WriterOptions``: retries, buffer, spool, ``on_error`` (``Failure``).
- Errors are ``logstore.core.errors`` classes; ``client.errors`` adds ``Unauthorized``, ``ProtocolError``.

The names load on first access (a package that imported its modules would be a cycle with each of them).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the real names for type checkers; at run time they load on first access
    from .aio import AsyncClient
    from .errors import ProtocolError, Unauthorized, outcome_of
    from .options import Disposition, Failure, SpoolSync, WriterOptions, WriterStats
    from .sync import Client
    from .writer import BackgroundWriter

__all__ = [
    "AsyncClient",
    "Client",
    "BackgroundWriter",
    "WriterOptions",
    "WriterStats",
    "Failure",
    "Disposition",
    "SpoolSync",
    "Unauthorized",
    "ProtocolError",
    "outcome_of",
]

_HOMES = {
    "AsyncClient": "aio",
    "Client": "sync",
    "BackgroundWriter": "writer",
    "WriterOptions": "options",
    "WriterStats": "options",
    "Failure": "options",
    "Disposition": "options",
    "SpoolSync": "options",
    "Unauthorized": "errors",
    "ProtocolError": "errors",
    "outcome_of": "errors",
}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'logstore.client' has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{home}"), name)


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
