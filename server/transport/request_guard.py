"""ASGI guards in front of the MCP SDK: header count/size, body size, concurrent large parses, disconnects.

- ``HeaderGuard`` (outermost, every route, before authentication): more than ``max_header_count`` header
  lines or ``max_header_bytes`` of them get 431. The 2026-07-28 request path in the SDK is quadratic in the
  number of headers (10,000 tiny headers held the event loop for 1.2-1.7 s); a real client sends about ten.
  A request with both ``Content-Length`` and ``Transfer-Encoding`` (request smuggling), or without exactly
  one ``Host`` (HTTP/1.1), gets 400 and the connection is closed, whichever parser read it.
- ``BodyGuard`` (on ``/mcp``, after authentication, so an anonymous client never makes the server buffer
  anything): a declared or actual body over ``max_body_bytes`` gets 413 before a byte of it is parsed;
  the body is read completely before the SDK sees it, and only ``max_large_bodies`` requests whose body
  is over ``large_body_bytes`` go on to be parsed at a time — parsing is what multiplies memory (an 8 MiB
  body of ``{}`` items became ~230 MiB of Python objects), so N hostile bodies cost at most
  ``max_large_bodies`` parses of memory, and the others wait (at most ``LARGE_WAIT`` seconds, then 503)
  holding only their raw bytes.
  A client that disconnects before its body is complete is logged as one line, not a traceback.
"""

from __future__ import annotations

import json
import logging

import anyio
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from .http_limits import HttpLimits

__all__ = ["HeaderGuard", "BodyGuard", "json_error", "replay", "BODY_BYTES"]

log = logging.getLogger("logstore.server.requests")

BODY_BYTES = "logstore.body_bytes"  # scope key: the size of the body BodyGuard read
LARGE_WAIT = 30.0  # seconds a large body may wait for its turn to be parsed


async def json_error(
    send: Send, status: int, code: str, message: str, *, headers: list[tuple[bytes, bytes]] | None = None
) -> None:
    """A plain JSON error response, the same shape as the 401s: ``{"error": {"code", "message"}}``."""
    body = json.dumps({"error": {"code": code, "message": message}}).encode("utf-8")
    await send(
        {
            "type": "http.response.start",
            "status": status,
            "headers": [
                (b"content-type", b"application/json"),
                (b"content-length", str(len(body)).encode("ascii")),
                *(headers or []),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})


class HeaderGuard:
    def __init__(self, app: ASGIApp, limits: HttpLimits) -> None:
        self.app, self.max_count, self.max_bytes = app, limits.max_header_count, limits.max_header_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            headers = scope["headers"]
            if len(headers) > self.max_count:
                await self._reject(send, f"{len(headers)} request headers; the limit is {self.max_count}")
                return
            size = hosts = 0
            length = chunked = False
            for name, value in headers:
                size += len(name) + len(value)
                if name == b"host":
                    hosts += 1
                elif name == b"content-length":
                    length = True
                elif name == b"transfer-encoding":
                    chunked = True
            if size > self.max_bytes:
                await self._reject(send, f"request headers are {size} bytes; the limit is {self.max_bytes}")
                return
            if length and chunked:
                # Two framings of one body: a proxy in front may have read the other one, so whatever
                # follows on this connection could be a smuggled request. httptools refuses this itself;
                # h11 lets Transfer-Encoding win and would serve what follows.
                message = "both Content-Length and Transfer-Encoding: the body's length is ambiguous"
                await self._reject(send, message, status=400, code="BadRequest")
                return
            if hosts > 1 or (hosts == 0 and scope.get("http_version") == "1.1"):
                # HTTP/1.1 needs exactly one (RFC 9112 3.2): with two, which would the Host check judge?
                # h11 refuses this itself; httptools does not.
                message = f"{hosts} Host headers; an HTTP/1.1 request has exactly one"
                await self._reject(send, message, status=400, code="BadRequest")
                return
        await self.app(scope, receive, send)

    async def _reject(
        self, send: Send, message: str, *, status: int = 431, code: str = "RequestHeaderFieldsTooLarge"
    ) -> None:
        log.warning("rejecting a request: %s", message)
        await json_error(send, status, code, message, headers=[(b"connection", b"close")])


class BodyGuard:
    def __init__(self, app: ASGIApp, limits: HttpLimits) -> None:
        self.app, self.max_body, self.large = app, limits.max_body_bytes, limits.large_body_bytes
        self._large = anyio.Semaphore(limits.max_large_bodies)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["method"] != "POST":
            await self.app(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and declared.isdigit() and int(declared) > self.max_body:
            await self._too_large(send)
            return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                client = scope.get("client") or ("?", 0)
                log.info("client %s disconnected after %d bytes of its request body", client[0], size)
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body:
                await self._too_large(send)
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        body = b"".join(chunks)
        del chunks
        scope = {**scope, BODY_BYTES: size}
        if size <= self.large:
            await self.app(scope, replay(_whole(body), receive), send)
            return
        with anyio.move_on_after(LARGE_WAIT) as waited:
            await self._large.acquire()
        if waited.cancelled_caught:
            await json_error(
                send,
                503,
                "Unavailable",
                "too many large requests in progress; retry shortly",
                headers=[(b"retry-after", b"1")],
            )
            return
        try:
            await self.app(scope, replay(_whole(body), receive), send)
        finally:
            self._large.release()

    async def _too_large(self, send: Send) -> None:
        message = (
            f"request body over {self.max_body} bytes: a valid call (a batch of at most 1 MiB of compact "
            "JSON, even fully escaped) is far smaller"
        )
        # No "connection: close": the client is likely still sending; uvicorn discards the rest (bounded by
        # the body deadline) so that the client reads this answer instead of a reset connection.
        await json_error(send, 413, "RequestTooLarge", message)


def _whole(body: bytes) -> Message:
    return {"type": "http.request", "body": body, "more_body": False}


def replay(message: Message, receive: Receive) -> Receive:
    """A ``receive`` that yields ``message`` (already received) once, then defers to the real one."""
    pending: list[Message] = [message]

    async def replayed() -> Message:
        if pending:
            return pending.pop()
        return await receive()

    return replayed
