"""Every error the browser can meet is an HTML page: the 401 of a wrong password or a Cancel, the 429/503
of the shared authenticator, the router's 404/405, the Host check's 421. Those are written by layers the
UI shares with ``/mcp`` (JSON bodies there); ``HtmlErrors`` rewrites them, on the way out, into the UI's
error page, keeping the status and every header that matters (``WWW-Authenticate``, ``Retry-After``) and
leaving the security headers to ``SecurityHeaders`` outside it. Pages the UI renders itself are HTML
already and pass untouched; so does every success.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from http import HTTPStatus

from starlette.types import ASGIApp, Message, Receive, Scope, Send

__all__ = ["HtmlErrors", "describe"]

MAX_ERROR_BODY = 64 * 1024  # what a rewritten error body may be; beyond it the message is the status phrase

# What the page tells a person, per status, besides the layer's own message.
_HINTS = {
    401: "Sign in with the site's name and password (reload the page to see the browser's sign-in prompt).",
    421: "This address is not one the server answers for; use the address it was started with.",
    429: "Too many failed sign-ins from this address: wait a little and reload.",
    503: "The server is busy: reload in a moment.",
}


def describe(status: int, body: bytes) -> tuple[str, str, str]:
    """(code, message, hint) for an error response's status and (JSON, text or empty) body."""
    try:
        phrase = HTTPStatus(status).phrase
    except ValueError:
        phrase = "Error"
    code, message = phrase, ""
    if body and len(body) <= MAX_ERROR_BODY:
        try:
            error = json.loads(body).get("error", {})
            code, message = str(error.get("code", phrase)), str(error.get("message", ""))
        except (ValueError, AttributeError):
            message = body.decode("utf-8", "replace").strip()
    return code, message or phrase, _HINTS.get(status, "")


class HtmlErrors:
    """Rewrites error responses (status >= 400) that are not HTML into ``render(status, code, message,
    hint)``'s page."""

    def __init__(self, app: ASGIApp, render: Callable[[int, str, str, str], bytes]) -> None:
        self.app, self.render = app, render

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        held: Message | None = None
        chunks: list[bytes] = []
        size = 0

        async def rewrite(message: Message) -> None:
            nonlocal held, size
            if message["type"] == "http.response.start":
                headers = message.get("headers", [])
                ctype = next((v for k, v in headers if k.lower() == b"content-type"), b"")
                if message["status"] >= 400 and not ctype.startswith(b"text/html"):
                    held = message
                    return
                await send(message)
                return
            if held is None or message["type"] != "http.response.body":
                await send(message)
                return
            if size <= MAX_ERROR_BODY:
                chunks.append(message.get("body", b""))
                size += len(chunks[-1])
            if message.get("more_body"):
                return
            status = held["status"]
            body = b"".join(chunks) if size <= MAX_ERROR_BODY else b""
            page = self.render(status, *describe(status, body))
            kept = [
                (k, v)
                for k, v in held.get("headers", [])
                if k.lower() not in (b"content-type", b"content-length")
            ]
            kept += [
                (b"content-type", b"text/html; charset=utf-8"),
                (b"content-length", str(len(page)).encode("ascii")),
            ]
            await send({**held, "headers": kept})
            await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else page})

        await self.app(scope, receive, rewrite)
