"""``--http``: which HTTP/1.1 parser serves, under the same connection rules (``connection_rules``).

``auto`` (the default) is httptools (llhttp, a C parser: 1.1-1.2x h11's calls/s for ``logstore serve``,
docs/PERFORMANCE.md) when it imports, else h11 with a warning: the same limits hold either way, only
slower. Naming httptools when it does not import fails at startup (``logstore serve`` exits 1).
"""

from __future__ import annotations

import asyncio
import logging

from .connection_rules import GuardedConnection, fd_capped_connections
from .http_limits import HttpLimits

__all__ = ["HTTP_PARSERS", "guarded_protocol", "resolve_parser"]

log = logging.getLogger("logstore.server.connections")

HTTP_PARSERS = ("auto", "httptools", "h11")


def resolve_parser(parser: str) -> str:
    """``parser`` (one of ``HTTP_PARSERS``) as the parser that will run: ``auto`` is httptools if it
    imports, else h11 (logged). Naming httptools when it does not import raises ``RuntimeError``."""
    if parser not in HTTP_PARSERS:
        raise ValueError(f"HTTP parser must be one of {', '.join(HTTP_PARSERS)}, got {parser!r}")
    if parser == "h11":
        return parser
    try:
        import httptools  # noqa: F401
    except ImportError as exc:
        if parser == "httptools":
            raise RuntimeError(f"--http httptools: httptools does not import ({exc})") from None
        log.warning("httptools does not import (%s); serving HTTP with h11 (slower, same limits)", exc)
        return "h11"
    return "httptools"


def guarded_protocol(limits: HttpLimits, *, parser: str = "auto") -> type[asyncio.Protocol]:
    """A uvicorn protocol class on ``parser`` enforcing ``limits``' connection rules (uvicorn ``http=``)."""
    base: type[GuardedConnection]
    if resolve_parser(parser) == "httptools":
        from .httptools_connection import GuardedHttpToolsProtocol

        base = GuardedHttpToolsProtocol
    else:
        from .h11_connection import GuardedH11Protocol

        base = GuardedH11Protocol
    rules = {"limits": limits, "max_connections": fd_capped_connections(limits.max_connections)}
    return type(base.__name__, (base,), rules)
