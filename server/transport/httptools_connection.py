"""``connection_rules.GuardedConnection`` on uvicorn's httptools protocol (llhttp; ``--http auto`` when it
imports, or ``--http httptools``).

httptools has no state to ask, so the parser callbacks keep one (``_Reading``); and it keeps no buffer of
its own to measure a header block by (it parses as bytes arrive, buffering a header name or value it has
not seen the end of), so the bytes of the header block are counted here, read by read.

A pipelined request's header block that starts in the middle of a read (after the end of the
previous request, in the same read) is counted from the next read on, so it can reach
``max_header_bytes`` plus one read (asyncio reads at most 256 KiB at a time) before it is refused here.
h11 has the same gap in another shape: a pipelined block that arrived whole with the request before it
is parsed from h11's buffer whatever its size (its limit covers only a block still arriving). Either way
``request_guard.HeaderGuard`` then answers 431 before any application code
(tests/test_server_http_parsers.py); docs/SECURITY.md.

llhttp also accepts request targets h11 never served (``on_headers_complete``); a request without
exactly one Host header, which llhttp accepts too, is refused by ``request_guard.HeaderGuard``.
"""

from __future__ import annotations

import enum

from httptools import HttpParserError
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from .connection_rules import GuardedConnection, Phase

__all__ = ["GuardedHttpToolsProtocol"]


class _Reading(enum.Enum):
    HEADERS = "headers"  # the next request's header block (none of it yet, or part of it)
    BODY = "body"  # its header block is complete, its body is not


class GuardedHttpToolsProtocol(GuardedConnection, HttpToolsProtocol):
    _reading = _Reading.HEADERS
    _heads = 0  # header blocks completed on this connection
    _head_bytes = 0  # bytes of the current header block counted so far (see the module's docstring)
    _head_tail = b""

    # --- parser callbacks (called by httptools while it parses a read) --------------------------------
    def on_headers_complete(self) -> None:
        if not self.url.startswith(b"/"):
            # Not a path: absolute-form (``http://other/mcp``) or ``*``. uvicorn would keep only the
            # path, so the Host check would judge a Host the target overrides; h11 served these as
            # unknown paths (404). Raised in a parser callback, this makes uvicorn answer 400 and close,
            # as it does for any parse error.
            raise HttpParserError("request target is not a path")
        self._reading, self._heads = _Reading.BODY, self._heads + 1
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = _Reading.HEADERS

    def on_response_complete(self) -> None:
        super().on_response_complete()
        self._rearm()  # the next request's header deadline starts now

    # --- the connection rules ----------------------------------------------------------------------------
    def _client_phase(self) -> Phase:
        if self._reading is _Reading.BODY:
            return Phase.BODY
        # A request answered, or not yet started: as with h11, headers are awaited only once the
        # previous response is complete (a pipelined request's are not the client's delay).
        if self.cycle is not None and not self.cycle.response_complete:
            return Phase.SERVER
        return Phase.HEADERS

    def data_received(self, data: bytes) -> None:
        counting, heads = self._reading is _Reading.HEADERS, self._heads
        if counting and self._refused_head(self._head_bytes, self._head_tail, data):
            return
        super().data_received(data)
        if self._reading is _Reading.BODY:
            self._head_bytes, self._head_tail = 0, b""
        elif counting and heads == self._heads:  # one header block, begun at or before this read's start
            self._head_bytes += len(data)
            self._head_tail = (self._head_tail + data[-3:])[-3:]
        else:  # a request ended in this read: what follows it is counted from the next read on
            self._head_bytes, self._head_tail = 0, data[-3:]
        self._rearm()
