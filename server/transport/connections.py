"""The HTTP/1.1 connection layer under uvicorn: read deadlines and a connection cap, before any ASGI code.

uvicorn (h11) has no deadline for a request's headers or body: a connection that sends nothing, or one
byte a second, stays open forever (its keep-alive timer is reset by every byte and only runs between
requests), and enough of them exhaust the process's file descriptors, after which ``accept()`` fails for
everyone. ``guarded_protocol`` returns an ``H11Protocol`` subclass that adds, per connection:

- a **header deadline**: complete request headers within ``header_timeout`` seconds of the connection
  opening (or of the previous response);
- a **body deadline**: the whole body within ``body_timeout`` seconds of its headers (also bounding an
  unread body a client keeps dripping after its response, e.g. after a 401);
- a **connection cap**: at ``max_connections`` the connection that has waited longest for its headers is
  closed to make room (slow-loris connections are the ones that go), and only when every connection has
  a request in flight is the new one refused with 503.

A header block over ``max_header_bytes`` is answered 431 before h11 parses it (the header *count* is
checked by ``server.transport.request_guard.HeaderGuard`` once parsed).

On a deadline the server answers 408 if no response was started, and closes the connection.
"""

from __future__ import annotations

import asyncio
import logging
import resource
import time
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol

from .http_limits import HttpLimits

__all__ = ["guarded_protocol", "fd_capped_connections"]

log = logging.getLogger("logstore.server.connections")

# File descriptors kept free for everything that is not a client connection: the engine's handle cache
# (256 conversations x log + index + lock + the lock file's commit point reader), credentials, logs, the
# listening sockets.
FD_RESERVE = 1280

_REFUSED = (
    b"HTTP/1.1 503 Service Unavailable\r\ncontent-length: 0\r\nretry-after: 1\r\nconnection: close\r\n\r\n"
)
_HEADERS_TOO_LARGE = (
    b"HTTP/1.1 431 Request Header Fields Too Large\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"
)
_TIMED_OUT = b"HTTP/1.1 408 Request Timeout\r\ncontent-length: 0\r\nconnection: close\r\n\r\n"


def fd_capped_connections(wanted: int) -> int:
    """``wanted``, or fewer if the fd limit cannot hold that many connections plus ``FD_RESERVE``.

    Raises the soft ``RLIMIT_NOFILE`` towards the hard limit first (what a server is expected to do).
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    need = wanted + FD_RESERVE
    if soft != resource.RLIM_INFINITY and soft < need:
        target = need if hard == resource.RLIM_INFINITY else min(need, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError):
            pass
    if soft == resource.RLIM_INFINITY or soft >= need:
        return wanted
    capped = max(16, soft - FD_RESERVE)
    log.warning(
        "max_connections lowered from %d to %d: the file descriptor limit is %d (raise `ulimit -n`)",
        wanted,
        capped,
        soft,
    )
    return capped


def guarded_protocol(limits: HttpLimits) -> type[H11Protocol]:
    """An ``H11Protocol`` class enforcing ``limits``' connection-level rules (pass as uvicorn ``http=``)."""
    max_connections = fd_capped_connections(limits.max_connections)

    class GuardedH11Protocol(H11Protocol):
        _deadline: asyncio.TimerHandle | None = None
        _phase: tuple[Any, Any] | None = None
        _phase_started = 0.0

        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            if len(self.connections) > max_connections and not self._make_room():
                log.warning(
                    "refusing a connection: %d open (limit %d)", len(self.connections), max_connections
                )
                transport.write(_REFUSED)
                transport.close()
                return
            self._rearm()

        def data_received(self, data: bytes) -> None:
            if self.conn.their_state is h11.IDLE and self._oversize_head(data):
                log.warning("refusing a request: header block over %d bytes", limits.max_header_bytes)
                self._cancel()
                self.transport.write(_HEADERS_TOO_LARGE)
                self.transport.close()
                return
            super().data_received(data)

        def _oversize_head(self, data: bytes) -> bool:
            # Refused before h11 parses it: a complete header block arriving in one read is otherwise
            # parsed whatever its size (h11's own limit applies only to an incomplete one).
            window = bytes(self.conn.trailing_data[0]) + data[: limits.max_header_bytes + 4]
            end = window.find(b"\r\n\r\n")
            return end > limits.max_header_bytes or (end == -1 and len(window) > limits.max_header_bytes)

        def handle_events(self) -> None:
            super().handle_events()
            self._rearm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._cancel()
            super().connection_lost(exc)

        def _awaiting_headers(self) -> bool:
            return self._phase is not None and self._phase[0] is h11.IDLE

        def _make_room(self) -> bool:
            """Close the connection that has waited longest for request headers; False if none is."""
            idle = [c for c in self.connections if isinstance(c, GuardedH11Protocol) and c is not self]
            idle = [c for c in idle if c._awaiting_headers() and not c.transport.is_closing()]
            if not idle:
                return False
            victim = min(idle, key=lambda c: c._phase_started)
            log.warning("closing the connection idle longest: %d connections open", len(self.connections))
            victim._cancel()
            victim.transport.close()
            return True

        def _cancel(self) -> None:
            if self._deadline is not None:
                self._deadline.cancel()
                self._deadline = None

        def _rearm(self) -> None:
            # The phase is the client's h11 state plus the request cycle: a new request, or the next one
            # on a kept-alive connection, starts a new deadline; more bytes of the same phase do not.
            if self.transport is None or self.transport.is_closing():
                return
            phase = (self.conn.their_state, self.cycle)
            if phase == self._phase:
                return
            self._cancel()
            self._phase, self._phase_started = phase, time.monotonic()
            if phase[0] is h11.IDLE:
                self._deadline = self.loop.call_later(limits.header_timeout, self._expire, "headers")
            elif phase[0] is h11.SEND_BODY:
                self._deadline = self.loop.call_later(limits.body_timeout, self._expire, "body")

        def _expire(self, what: str) -> None:
            self._deadline = None
            if self.transport.is_closing():
                return
            # Waiting for headers, no response is in flight; waiting for a body, one may already be sent
            # (a 401 to a client still dripping its body), and then there is nothing more to say.
            if what == "headers" or self.cycle is None or not self.cycle.response_started:
                self.transport.write(_TIMED_OUT)
            limit = limits.header_timeout if what == "headers" else limits.body_timeout
            log.warning("closing a connection: request %s not received within %g s", what, limit)
            self.transport.close()

    return GuardedH11Protocol
