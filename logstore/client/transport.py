"""How a tool call reaches the server: streamable HTTP (stateless 2026-07-28 requests) or stdio.

HTTP is spoken directly over ``httpx2`` rather than through ``mcp.Client``, for one reason the SDK does not
expose: whether a failed request may have reached the server. A connection that could not be opened
means the request was never sent (safe to resend); a connection that dropped after the request went out
means its outcome is unknown, and an append must not be resent blindly (``errors.outcome_of``). The
request is byte for byte what the SDK sends for a stateless ``tools/call``: the ``_meta`` protocol
fields, and the ``mcp-protocol-version`` / ``mcp-method`` / ``mcp-name`` headers.

stdio goes through the SDK (``mcp.Client`` over ``StdioServerParameters``): there is one local server
process, and any failure of it mid-call is an unknown outcome.
"""

from __future__ import annotations

import asyncio
import base64
import itertools
from collections.abc import Mapping, Sequence
from typing import Any, Protocol

import httpx2
import msgspec

from .errors import UNKNOWN, ProtocolError, Unauthorized, error_from_body, unavailable

__all__ = ["Transport", "HttpTransport", "StdioTransport", "PROTOCOL", "parse_tool_result"]

PROTOCOL = "2026-07-28"
CLIENT_INFO = {"name": "logstore-client", "version": "0.1.0"}
_META = msgspec.json.encode(
    {
        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
        "io.modelcontextprotocol/clientInfo": CLIENT_INFO,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
)
_decode = msgspec.json.decode


class Transport(Protocol):
    async def call(self, tool: str, arguments: bytes) -> dict[str, Any]:
        """Call ``tool`` with ``arguments`` (a JSON object, encoded); the result's structured content, or
        raise the tool's error as a ``LogstoreError``."""
        ...

    async def aclose(self) -> None: ...


def parse_tool_result(result: Any) -> dict[str, Any]:
    """A ``CallToolResult`` as JSON: its ``structuredContent``, or raise the error its text carries."""
    if not isinstance(result, dict):
        raise ProtocolError("tool result is not an object")
    if result.get("isError"):
        content = result.get("content") or [{}]
        text = content[0].get("text") if isinstance(content[0], dict) else None
        try:
            body = _decode(text) if isinstance(text, str) else None
        except msgspec.DecodeError:
            body = None
        raise error_from_body(body)
    structured = result.get("structuredContent")
    if not isinstance(structured, dict):
        raise ProtocolError("tool result carries no structured content")
    return structured


def _sse_message(text: str) -> Any:
    """The last JSON-RPC message of a ``text/event-stream`` body (its ``data:`` lines)."""
    found: Any = None
    data: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.startswith("data:"):
            data.append(line[5:].lstrip())
        elif not line and data:
            message = _decode("\n".join(data))
            if isinstance(message, dict) and ("result" in message or "error" in message):
                found = message
            data = []
    return found


class HttpTransport:
    """Streamable HTTP with Basic auth; one ``httpx2.AsyncClient`` (keep-alive pool) per transport."""

    def __init__(
        self,
        url: str,
        *,
        site: str,
        password: str,
        timeout: float = 30.0,
        connect_timeout: float = 5.0,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        self.url = url
        token = base64.b64encode(f"{site}:{password}".encode()).decode("ascii")
        self._headers = {
            "accept": "application/json, text/event-stream",
            "content-type": "application/json",
            "mcp-protocol-version": PROTOCOL,
            "mcp-method": "tools/call",
            "authorization": f"Basic {token}",
            **(headers or {}),
        }
        self._http = httpx2.AsyncClient(
            timeout=httpx2.Timeout(timeout, connect=connect_timeout, pool=connect_timeout)
        )
        self._ids = itertools.count(1)

    def _body(self, tool: str, arguments: bytes) -> bytes:
        return b"".join(
            (
                b'{"jsonrpc":"2.0","id":',
                str(next(self._ids)).encode(),
                b',"method":"tools/call","params":{"name":',
                msgspec.json.encode(tool),
                b',"arguments":',
                arguments,
                b',"_meta":',
                _META,
                b"}}",
            )
        )

    async def call(self, tool: str, arguments: bytes) -> dict[str, Any]:
        try:
            response = await self._http.post(
                self.url, content=self._body(tool, arguments), headers={**self._headers, "mcp-name": tool}
            )
        except (httpx2.ConnectError, httpx2.ConnectTimeout, httpx2.PoolTimeout) as exc:
            # No connection, so nothing was sent: the request was not applied.
            raise unavailable(f"cannot reach the server: {type(exc).__name__}: {exc}") from exc
        except httpx2.TransportError as exc:
            raise unavailable(
                f"the connection failed after the request was sent ({type(exc).__name__}: {exc}); "
                "its outcome is unknown",
                outcome=UNKNOWN,
            ) from exc
        return self._reply(response)

    def _reply(self, response: httpx2.Response) -> dict[str, Any]:
        status = response.status_code
        if status in (401, 403):
            raise Unauthorized(f"the server refused the credentials (HTTP {status})")
        if status in (429, 503):  # shed before the request was handled
            raise unavailable(f"the server is overloaded or starting (HTTP {status})")
        if status >= 500:
            raise unavailable(f"server error (HTTP {status}); outcome unknown", outcome=UNKNOWN)
        try:
            if response.headers.get("content-type", "").startswith("text/event-stream"):
                message = _sse_message(response.text)
            else:
                message = _decode(response.content)
        except msgspec.DecodeError as exc:
            raise ProtocolError(f"HTTP {status}: reply is not JSON: {response.text[:200]!r}") from exc
        if not isinstance(message, dict):
            raise ProtocolError(f"HTTP {status}: no JSON-RPC reply")
        if "error" in message:
            error = message["error"] if isinstance(message["error"], dict) else {}
            raise ProtocolError(f"HTTP {status}: JSON-RPC error {error.get('code')}: {error.get('message')}")
        return parse_tool_result(message.get("result"))

    async def aclose(self) -> None:
        await self._http.aclose()


class StdioTransport:
    """``logstore serve --stdio`` (or any command speaking MCP on stdin/stdout), through the SDK client.

    The SDK's client must be left in the task that entered it, so one owner task holds it and serves the
    calls of every other task through a queue."""

    def __init__(self, command: str, args: Sequence[str] = (), *, env: Mapping[str, str] | None = None):
        self._params = (command, list(args), dict(env) if env is not None else None)
        self._queue: asyncio.Queue[tuple[str, bytes, asyncio.Future[Any]] | None] | None = None
        self._owner: asyncio.Task[None] | None = None

    async def _serve(self, queue: asyncio.Queue[Any], ready: asyncio.Future[None]) -> None:
        from mcp import Client, StdioServerParameters

        command, args, env = self._params
        try:
            async with Client(StdioServerParameters(command=command, args=args, env=env)) as client:
                ready.set_result(None)
                while (job := await queue.get()) is not None:
                    tool, arguments, future = job
                    try:
                        result = await client.call_tool(tool, _decode(arguments))
                    except Exception as exc:
                        if not future.done():
                            future.set_exception(exc)
                        raise
                    if not future.done():
                        future.set_result(result)
        except Exception as exc:
            if not ready.done():
                ready.set_exception(exc)
            while not queue.empty():  # calls queued behind a failure fail with it
                job = queue.get_nowait()
                if job is not None and not job[2].done():
                    job[2].set_exception(exc)

    async def call(self, tool: str, arguments: bytes) -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        if self._owner is None or self._owner.done():
            self._queue = asyncio.Queue()
            ready: asyncio.Future[None] = loop.create_future()
            self._owner = loop.create_task(self._serve(self._queue, ready))
            try:
                await ready
            except Exception as exc:
                raise unavailable(f"cannot start the stdio server: {type(exc).__name__}: {exc}") from exc
        assert self._queue is not None
        future: asyncio.Future[Any] = loop.create_future()
        await self._queue.put((tool, arguments, future))
        try:
            result = await future
        except Exception as exc:
            raise unavailable(
                f"stdio server failed mid-call: {exc}; outcome unknown", outcome=UNKNOWN
            ) from exc
        return parse_tool_result(result.model_dump(by_alias=True, mode="json"))

    async def aclose(self) -> None:
        owner, queue, self._owner = self._owner, self._queue, None
        if owner is not None and queue is not None and not owner.done():
            await queue.put(None)
            await owner
