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
from typing import Any

from httptools import HttpParserError
from uvicorn._types import ASGI3Application, ASGISendEvent
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol, RequestResponseCycle

from .connection_rules import GuardedConnection, Phase

__all__ = ["GuardedHttpToolsProtocol"]


class _Reading(enum.Enum):
    HEADERS = "headers"  # the next request's header block (none of it yet, or part of it)
    BODY = "body"  # its header block is complete, its body is not


# A body up to this size is copied after its head, to be written with it; a larger one is written on its
# own (a copy of a large body costs more than the second write it saves).
_JOIN_MAX = 64 * 1024


class _Joined:
    """The cycle's transport while it writes a held response head and then a body message: the first
    write (the head) is kept and sent with the second (the body), in one ``write`` of the real transport;
    ``flush`` sends a head no body followed (a write uvicorn skipped: the client disconnected)."""

    __slots__ = ("transport", "head")

    def __init__(self, transport: Any) -> None:
        self.transport = transport
        self.head: bytes | None = None

    def write(self, data: bytes) -> None:
        head, self.head = self.head, b""
        if head is None:
            self.head = data
        elif head and len(data) <= _JOIN_MAX:
            self.transport.write(head + data)
        else:
            if head:
                self.transport.write(head)
            self.transport.write(data)

    def flush(self) -> None:
        head, self.head = self.head, b""
        if head:
            self.transport.write(head)

    def close(self) -> None:
        self.flush()
        self.transport.close()

    def is_closing(self) -> bool:
        return bool(self.transport.is_closing())


def _declares_length(message: ASGISendEvent) -> bool:
    headers: Any = message.get("headers", ())
    return any(name.lower() == b"content-length" for name, _ in headers)


class _OneWrite:
    """The app of one request/response cycle of uvicorn's, writing a response with a ``Content-Length``
    (which a client cannot use before its body anyway) in one socket write, head and first body message
    together, instead of two: one ``send`` syscall less per call (each one a release of the GIL that the
    engine threads wait for, and one more segment for the client to wake up for; docs/PERFORMANCE.md).
    The head is held from its ``http.response.start`` to the app's next message or its end, whichever
    comes first, and then goes through uvicorn's own ``send`` (every check and header rule unchanged).
    The cycle stays uvicorn's own class: only its ``transport`` attribute is swapped while it writes."""

    __slots__ = ("app", "cycle", "head")

    def __init__(self, app: ASGI3Application, cycle: RequestResponseCycle) -> None:
        self.app, self.cycle = app, cycle
        self.head: ASGISendEvent | None = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        try:
            await self.app(scope, receive, self.send)
        finally:  # an app that ends after its head, without a body: the head goes out as before
            head, self.head = self.head, None
            if head is not None:
                await self.cycle.send(head)

    async def send(self, message: ASGISendEvent) -> None:
        cycle, head = self.cycle, self.head
        if head is None:
            if (
                message["type"] == "http.response.start"
                and not cycle.response_started
                and not cycle.disconnected
                and _declares_length(message)
            ):
                self.head, cycle.waiting_for_100_continue = message, False  # as uvicorn's send does
                return
            await cycle.send(message)
            return
        self.head = None
        if message["type"] != "http.response.body":
            await cycle.send(head)
            await cycle.send(message)
            return
        transport = cycle.transport
        cycle.transport = joined = _Joined(transport)  # type: ignore[assignment]
        try:
            await cycle.send(head)
            await cycle.send(message)
        finally:
            cycle.transport = transport
            joined.flush()


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

    def _start_asgi_task(self, cycle: RequestResponseCycle, app: ASGI3Application) -> None:
        super()._start_asgi_task(cycle, _OneWrite(app, cycle))

    def on_message_complete(self) -> None:
        super().on_message_complete()
        self._reading = _Reading.HEADERS

    def on_response_complete(self) -> None:
        # uvicorn's, except for its keep-alive timer (one ``call_later`` per response, cancelled by the
        # next request's first bytes): the connection's one timer keeps that timeout (``_idle``).
        self.server_state.total_requests += 1
        if self.transport.is_closing():
            return
        self._unset_keepalive_if_required()
        self.flow.resume_reading()
        if self.pipeline:
            cycle, app = self.pipeline.pop()
            self._start_asgi_task(cycle, app)
        else:
            self._idle()
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
        self._busy()
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
