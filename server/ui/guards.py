"""The layers around the browser's pages: the security headers on every response (``SecurityHeaders``)
and the Host check against DNS rebinding (``HostGuard``), as ``/mcp`` has."""

from __future__ import annotations

from collections.abc import Sequence

from starlette.responses import Response
from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["SECURITY_HEADERS", "SecurityHeaders", "HostGuard"]

SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (
        b"content-security-policy",
        b"default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        b"form-action 'self'; base-uri 'none'; frame-ancestors 'none'",
    ),
    (b"cache-control", b"no-store"),
    (b"x-content-type-options", b"nosniff"),
    (b"x-frame-options", b"DENY"),
    (b"referrer-policy", b"no-referrer"),
    (b"cross-origin-opener-policy", b"same-origin"),
    (b"cross-origin-resource-policy", b"same-origin"),
)


class SecurityHeaders:
    """Adds ``SECURITY_HEADERS`` to every response of the wrapped app (replacing any of the same name)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._names = {name for name, _ in SECURITY_HEADERS}

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.lower() not in self._names]
                message = {**message, "headers": [*kept, *SECURITY_HEADERS]}
            await send(message)

        await self.app(scope, receive, with_headers)


class HostGuard:
    """421 for a request whose Host is not one of ``allowed`` (``name`` or ``name:*`` for any port): a page
    on another origin that rebinds its DNS name to 127.0.0.1 must not read this server's pages."""

    def __init__(self, app: ASGIApp, allowed: Sequence[str]) -> None:
        self.app = app
        self._exact = {a for a in allowed if not a.endswith(":*")}
        self._any_port = {a.removesuffix(":*") for a in allowed if a.endswith(":*")}

    def allows(self, host: str) -> bool:
        if host in self._exact:
            return True
        name, sep, port = host.rpartition(":")
        return bool(sep) and port.isdigit() and name in self._any_port

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            host = next((v for k, v in scope["headers"] if k == b"host"), b"").decode("latin-1")
            if not self.allows(host):
                response = Response("misdirected request: unexpected Host header\n", status_code=421)
                await response(scope, receive, send)
                return
        await self.app(scope, receive, send)
