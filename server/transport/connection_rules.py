"""The HTTP/1.1 connection rules under uvicorn: read deadlines and a connection cap, before any ASGI code.

uvicorn's protocols (httptools and h11 alike) have no deadline for a request's headers or body: a
connection that sends nothing, or one byte a second, stays open forever (the keep-alive timer is reset by
every byte and only runs between requests), and enough of them exhaust the process's file descriptors,
after which ``accept()`` fails for everyone. ``connections.guarded_protocol`` returns a uvicorn protocol
class whose connections also get:

- a **header deadline**: complete request headers within ``header_timeout`` seconds of the connection
  opening (or of the previous response);
- a **body deadline**: the whole body within ``body_timeout`` seconds of its headers (also bounding an
  unread body a client keeps dripping after its response, e.g. after a 401);
- a **connection cap**: at ``max_connections`` the connection that has waited longest for its headers is
  closed to make room (slow-loris connections are the ones that go), and only when every connection has
  a request in flight is the new one refused with 503;
- a header block over ``max_header_bytes`` answered 431 before the parser buffers it (the header *count*
  is checked by ``server.transport.request_guard.HeaderGuard`` once parsed).

On a deadline the server answers 408 if no response was started, and closes the connection.

These rules live here once, in ``GuardedConnection``, in terms of a ``Phase`` of the client's side of the
connection. Each parser's subclass (``h11_connection``, ``httptools_connection``) only says which phase
its parser is in and how much of a header block it has read; ``connections`` picks one (``--http``).
"""

from __future__ import annotations

import asyncio
import enum
import logging
import resource
from typing import Any, ClassVar

from .http_limits import HttpLimits

__all__ = ["GuardedConnection", "Phase", "fd_capped_connections", "head_overflows"]

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


class Phase(enum.Enum):
    """What the connection waits for from its client, which decides its deadline."""

    HEADERS = "headers"  # a request's headers (none yet, or part of them); no response in flight
    BODY = "body"  # the rest of a request body (whether or not it was already answered)
    SERVER = "server"  # nothing: the server owes a response (no deadline on the client)


def head_overflows(seen: int, tail: bytes, data: bytes, limit: int) -> bool:
    """Whether a header block of which ``seen`` bytes arrived (the last of them ``tail``, up to 3 bytes)
    goes over ``limit`` bytes with ``data``: it ends (CRLF CRLF) past the limit, or has not ended and
    already holds more. Decided before the parser sees ``data``: a complete header block arriving in one
    read is otherwise parsed whatever its size."""
    window = tail + data[: limit + 4]
    end = window.find(b"\r\n\r\n")
    if end == -1:
        return seen + len(data) > limit
    return seen - len(tail) + end > limit


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


class GuardedConnection(asyncio.Protocol):
    """The connection rules, mixed in before a uvicorn protocol class (which provides ``transport``,
    ``loop``, ``connections``, ``cycle``). A subclass says which ``Phase`` its parser is in
    (``_client_phase``), asks ``_refused_head`` before feeding a read that may hold a header block, and
    calls ``_rearm`` whenever its parser may have changed phase.

    A deadline costs no timer per request: a phase change only notes the time, and one timer per
    connection, armed when none is, checks the phase it finds when it fires (re-arming itself for that
    phase's own deadline if the phase changed meanwhile). A keep-alive connection making 100 calls a
    second thus sets about one timer per ``header_timeout``, not two per call (~30k instructions each,
    docs/PERFORMANCE.md).

    A subclass whose parser's own keep-alive timer (uvicorn's: armed at every response, cancelled by the
    next byte) it replaces calls ``_idle`` where uvicorn would arm it and ``_busy`` where uvicorn would
    cancel it; the same timer then also closes the connection, silently as uvicorn does, once it has been
    idle ``timeout_keep_alive`` seconds. For that, no timer is set further ahead than that timeout."""

    limits: ClassVar[HttpLimits]  # set by connections.guarded_protocol
    max_connections: ClassVar[int]

    transport: asyncio.Transport
    loop: asyncio.AbstractEventLoop
    connections: set[Any]
    cycle: Any
    timeout_keep_alive: int  # seconds (uvicorn's --timeout-keep-alive)

    _deadline: asyncio.TimerHandle | None = None
    _phase: tuple[Phase, Any] | None = None  # (phase, request cycle): a new pair starts a new deadline
    _phase_started = 0.0  # loop.time()
    _idle_since: float | None = None  # loop.time() of the response after which nothing came (``_idle``)

    def _client_phase(self) -> Phase:
        raise NotImplementedError

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if len(self.connections) > self.max_connections and not self._make_room():
            log.warning(
                "refusing a connection: %d open (limit %d)", len(self.connections), self.max_connections
            )
            self.transport.write(_REFUSED)
            self.transport.close()
            return
        self._rearm()

    def _refused_head(self, seen: int, tail: bytes, data: bytes) -> bool:
        """Answer 431 and close if ``data`` takes the header block being read (``seen`` bytes so far,
        ending in ``tail``) over ``max_header_bytes``; True if it did."""
        limit = self.limits.max_header_bytes
        if not head_overflows(seen, tail, data, limit):
            return False
        log.warning("refusing a request: header block over %d bytes", limit)
        self._cancel()
        self.transport.write(_HEADERS_TOO_LARGE)
        self.transport.close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self._cancel()
        super().connection_lost(exc)

    def _awaiting_headers(self) -> bool:
        return self._phase is not None and self._phase[0] is Phase.HEADERS

    def _make_room(self) -> bool:
        """Close the connection that has waited longest for request headers; False if none is."""
        idle = [c for c in self.connections if isinstance(c, GuardedConnection) and c is not self]
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

    def _timeout(self, phase: Phase) -> float | None:
        if phase is Phase.HEADERS:
            return self.limits.header_timeout
        return self.limits.body_timeout if phase is Phase.BODY else None

    def _rearm(self) -> None:
        # A new request, or the next one on a kept-alive connection, starts a new deadline; more bytes of
        # the same phase do not.
        if self.transport is None or self.transport.is_closing():
            return
        phase = (self._client_phase(), self.cycle)
        if phase == self._phase:
            return
        self._phase, self._phase_started = phase, self.loop.time()
        if self._deadline is None:
            self._arm(self._phase_started)

    def _idle(self) -> None:
        """A response is complete and no other request is waiting: the keep-alive timeout runs from now."""
        self._idle_since = self.loop.time()

    def _busy(self) -> None:
        """Bytes arrived: no keep-alive timeout until the next ``_idle``."""
        self._idle_since = None

    def _arm(self, now: float) -> None:
        # The phase's deadline or the keep-alive timeout's, whichever is first; never further ahead than
        # the keep-alive timeout, so that one starting later (at any response) is never missed.
        timeout = self._timeout(self._phase[0]) if self._phase is not None else None
        due = now + self.timeout_keep_alive
        if timeout is not None:
            due = min(due, self._phase_started + timeout)
        if self._idle_since is not None:
            due = min(due, self._idle_since + self.timeout_keep_alive)
        self._deadline = self.loop.call_at(due, self._check)

    def _check(self) -> None:
        self._deadline = None
        if self._phase is None or self.transport.is_closing():
            return
        now = self.loop.time()
        if self._idle_since is not None and now >= self._idle_since + self.timeout_keep_alive:
            self.transport.close()  # as uvicorn's keep-alive timer: silently
            return
        timeout = self._timeout(self._phase[0])
        if timeout is not None and now >= self._phase_started + timeout:
            self._expire("headers" if self._phase[0] is Phase.HEADERS else "body")
            return
        if timeout is not None or self._idle_since is not None:
            self._arm(now)
        # else: the server owes a response and nothing is idle: no timer until that changes (_rearm)

    def _expire(self, what: str) -> None:
        # Waiting for headers, no response is in flight; waiting for a body, one may already be sent
        # (a 401 to a client still dripping its body), and then there is nothing more to say.
        if what == "headers" or self.cycle is None or not self.cycle.response_started:
            self.transport.write(_TIMED_OUT)
        limit = self.limits.header_timeout if what == "headers" else self.limits.body_timeout
        log.warning("closing a connection: request %s not received within %g s", what, limit)
        self.transport.close()
