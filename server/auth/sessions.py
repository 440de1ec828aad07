"""Legacy-protocol (2025-11-25) sessions with per-site and global caps, so one site cannot lock out another.

The SDK's session manager has one global cap (10,000 by default): a site that opens that many sessions
gets every other site's ``initialize`` answered 503 until its sessions idle out (30 min) — issue 10 saw
exactly that, with RSS 73 -> 464 MiB. ``SitedSessionManager`` keeps the SDK's machinery and replaces the
admission rule:

- a site at ``max_sessions_per_site`` makes room by closing **its own** session idle longest;
- at ``max_sessions`` (all sites) the session idle longest **of the site holding the most sessions** is
  closed, so a newcomer always gets in while any session anywhere is idle;
- only when every candidate has a request in flight is the new session refused (503, Retry-After).

A closed session's ID answers 404, which tells a client to initialize again (MCP spec). Sessions idle for
``session_idle_timeout`` seconds are closed by the SDK. After sessions are closed the freed memory is handed
back to the OS (``malloc_trim``), at most once per ``TRIM_INTERVAL``: without it, glibc keeps the peak.
"""

from __future__ import annotations

import contextvars
import ctypes
import ctypes.util
import logging
import time
from dataclasses import dataclass
from typing import Any

import anyio
from mcp.server.auth.middleware.bearer_auth import AuthorizationContext
from mcp.server.streamable_http import MCP_SESSION_ID_HEADER, StreamableHTTPServerTransport
from mcp.server.streamable_http_manager import StreamableHTTPSessionManager
from mcp.shared.inbound import MCP_PROTOCOL_VERSION_HEADER
from mcp.shared.message import SessionMessage
from mcp_types import JSONRPCNotification
from mcp_types.version import HANDSHAKE_PROTOCOL_VERSIONS
from starlette.types import Receive, Scope, Send

from ..transport.http_limits import HttpLimits
from ..transport.request_guard import BODY_BYTES, json_error
from .basic import SiteUser

__all__ = ["SitedSessionManager"]

log = logging.getLogger("logstore.server.sessions")

TRIM_INTERVAL = 5.0  # seconds between malloc_trim calls after sessions closed
_SESSION_HEADER = MCP_SESSION_ID_HEADER.lower().encode("ascii")
_VERSION_HEADER = MCP_PROTOCOL_VERSION_HEADER.lower().encode("ascii")
# A notification no handler exists for: the SDK drops it (debug log). Sent into a session after a large
# request so that the session's read loop lets go of that request: the SDK's dispatcher keeps the last
# message it received in its loop variable, and a parsed 4 MiB body of `{}` is ~120 MiB of objects — held
# per session until the session's next message (measured: 12 sessions kept 1.3 GiB; released after this).
_RELEASE = SessionMessage(JSONRPCNotification(jsonrpc="2.0", method="notifications/logstore/release"))
# Sessions admitted by the request running in this context (the opening request is in flight on them).
_opening: contextvars.ContextVar[list[str] | None] = contextvars.ContextVar("_opening", default=None)


def _malloc_trim() -> None:
    name = ctypes.util.find_library("c")
    try:
        trim = ctypes.CDLL(name).malloc_trim if name else None
    except (OSError, AttributeError):
        trim = None
    if trim is not None:
        trim(0)


@dataclass
class _Session:
    site: str
    last_used: float
    in_flight: int = 0


class SitedSessionManager(StreamableHTTPSessionManager):
    def __init__(self, app: Any, *, limits: HttpLimits, **kwargs: Any) -> None:
        # The SDK's own cap is turned off: admission is decided here, per site.
        super().__init__(app, max_sessions=None, session_idle_timeout=limits.session_idle_timeout, **kwargs)
        self.limits = limits
        self._book: dict[str, _Session] = {}
        self._last_trim = 0.0
        self._trim_pending = False

    # --- what the SDK calls -----------------------------------------------------------------------

    async def _handle_request(self, scope: Scope, receive: Receive, send: Send) -> None:
        if self.stateless or scope["type"] != "http":
            await super()._handle_request(scope, receive, send)
            return
        sid = next((v for k, v in scope["headers"] if k == _SESSION_HEADER), b"").decode("latin-1")
        session = self._book.get(sid)
        refusal = self._refusal(_site_of_scope(scope)) if not sid and _may_open_session(scope) else None
        if refusal is not None:
            log.warning("refusing a new session: %s", refusal)
            await json_error(send, 503, "Unavailable", refusal, headers=[(b"retry-after", b"1")])
            return
        opened: list[str] = []
        token = _opening.set(opened)
        if session is not None:
            session.in_flight += 1
        try:
            await super()._handle_request(scope, receive, send)
            if session is not None and scope.get(BODY_BYTES, 0) > self.limits.large_body_bytes:
                await self._release_last_message(sid)
        finally:
            _opening.reset(token)
            now = time.monotonic()
            for s in [session, *(self._book.get(o) for o in opened)]:
                if s is not None:
                    s.in_flight -= 1
                    s.last_used = now

    async def _release_last_message(self, sid: str) -> None:
        transport = self._server_instances.get(sid)
        writer = getattr(transport, "_read_stream_writer", None)  # SDK internal; absent: nothing to do
        if writer is None:
            return
        try:
            await writer.send(_RELEASE)
        except (anyio.ClosedResourceError, anyio.BrokenResourceError):
            pass  # the session ended meanwhile

    def _admit_session(self, requestor: AuthorizationContext | None) -> StreamableHTTPServerTransport | None:
        site = requestor["client_id"] if requestor is not None else ""
        victims = self._victims(site)
        if victims is None:
            return None
        for victim in victims:
            self._evict(victim)
        transport = super()._admit_session(requestor)
        if transport is not None and transport.mcp_session_id is not None:
            sid = transport.mcp_session_id
            self._book[sid] = _Session(site, time.monotonic(), in_flight=1)
            opened = _opening.get()
            if opened is not None:
                opened.append(sid)
        return transport

    async def _discard_session(self, session_id: str, transport: StreamableHTTPServerTransport) -> None:
        if self._book.pop(session_id, None) is not None:
            self._schedule_trim()
        await super()._discard_session(session_id, transport)

    # --- the admission rule -----------------------------------------------------------------------

    def _idle(self, site: str | None = None) -> list[tuple[str, _Session]]:
        return [
            (sid, s) for sid, s in self._book.items() if s.in_flight == 0 and (site is None or s.site == site)
        ]

    def _victims(self, site: str) -> list[str] | None:
        """Sessions to close so that one more session of ``site`` fits (empty: it fits; None: it cannot)."""
        victims: list[str] = []
        own = sum(1 for s in self._book.values() if s.site == site)
        if own >= self.limits.max_sessions_per_site:
            idle = self._idle(site)
            if not idle:
                return None
            victims.append(min(idle, key=lambda e: e[1].last_used)[0])
        if len(self._book) - len(victims) >= self.limits.max_sessions:
            counts: dict[str, int] = {}
            for s in self._book.values():
                counts[s.site] = counts.get(s.site, 0) + 1
            idle = [e for e in self._idle() if e[0] not in victims]
            if not idle:
                return None
            sid, _ = min(idle, key=lambda e: (-counts[e[1].site], e[1].last_used))
            victims.append(sid)
        return victims

    def _refusal(self, site: str) -> str | None:
        """Why a new session for ``site`` cannot be opened now, or None if it can (maybe by eviction)."""
        if self._victims(site) is not None:
            return None
        own = sum(1 for s in self._book.values() if s.site == site)
        if own >= self.limits.max_sessions_per_site:
            return (
                f"this site has {own} sessions open, all busy (limit {self.limits.max_sessions_per_site}); "
                "close one (HTTP DELETE) or retry shortly"
            )
        return f"{len(self._book)} sessions open, all busy; retry shortly"

    def _evict(self, sid: str) -> None:
        transport = self._server_instances.get(sid)
        session = self._book.get(sid)
        log.info("closing session %s of site %s to make room", sid[:8], session.site if session else "?")
        # Forgotten now (its ID answers 404 at once); the transport is terminated by the task group.
        self._server_instances.pop(sid, None)
        self._session_owners.pop(sid, None)
        self._book.pop(sid, None)
        if transport is not None and self._task_group is not None:
            self._task_group.start_soon(self._discard_session, sid, transport)
        self._schedule_trim()

    def _schedule_trim(self) -> None:
        if self._trim_pending or self._task_group is None:
            return
        self._trim_pending = True
        self._task_group.start_soon(self._trim_later)

    async def _trim_later(self) -> None:
        await anyio.sleep(max(0.0, self._last_trim + TRIM_INTERVAL - time.monotonic()))
        self._trim_pending = False
        self._last_trim = time.monotonic()
        await anyio.to_thread.run_sync(_malloc_trim)


def _may_open_session(scope: Scope) -> bool:
    """A POST the SDK routes to the legacy (session) path, as it does: by the protocol-version header."""
    pv = next((v for k, v in scope["headers"] if k == _VERSION_HEADER), None)
    return scope["method"] == "POST" and (pv is None or pv.decode("latin-1") in HANDSHAKE_PROTOCOL_VERSIONS)


def _site_of_scope(scope: Scope) -> str:
    user = scope.get("user")
    return user.site if isinstance(user, SiteUser) else ""
