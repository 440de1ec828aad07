"""The bench's one MCP load driver: ``clients`` concurrent clients calling one tool over streamable HTTP.

Two client kinds, both keep-alive with one connection per client, warmed up (one untimed call each) before
a common start; calls completed inside the timed window are counted:

- ``light``: raw HTTP/1.1 on asyncio streams sending byte for byte what the SDK sends for a stateless
  2026-07-28 ``tools/call`` (its headers and its ``_meta`` body), checking status and ``isError`` of each
  reply. About a tenth of the SDK client's CPU per call, so the server, not the client, is measured.
- ``sdk``: ``mcp.Client`` over httpx2, what an agent runs (``mode``: ``legacy`` sessions or ``2026-07-28``).

Run as ``python -m bench.load URL TOOL --clients 16 --seconds 2 --kind light`` (password in
``LOGSTORE_BENCH_PASSWORD``); prints one JSON line: calls/s, the driver's CPU seconds and its CPU share.
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import contextlib
import json
import os
import sys
import time
import uuid
from collections.abc import AsyncIterator
from typing import Any
from urllib.parse import urlsplit

import msgspec

from . import procfs
from .config import make_items

_BODY_START = b'{"jsonrpc":"2.0","id":'
_decode_any = msgspec.json.Decoder().decode


class _Result(msgspec.Struct):
    isError: bool = False  # noqa: N815 (the wire's name)


class _Reply(msgspec.Struct):
    result: _Result | None = None
    error: Any = None


_decode_reply = msgspec.json.Decoder(_Reply).decode

__all__ = ["tool_arguments", "LightClient", "run_load", "drive_subprocess", "run_driver", "SITE"]

SITE = "bench"
PROTOCOL = "2026-07-28"
ITEMS_PER_CALL, ITEM_SIZE = 10, 200


def tool_arguments(tool: str, conversation_id: str) -> dict[str, Any]:
    if tool == "append_memory":
        return {"conversation_id": conversation_id, "items": make_items(ITEMS_PER_CALL, ITEM_SIZE)}
    if tool == "recall_memory":
        return {"conversation_id": conversation_id, "limit": 50}
    return {}


class LightClient:
    """One keep-alive HTTP/1.1 connection speaking the SDK's stateless 2026-07-28 requests."""

    def __init__(self, url: str, site: str, password: str) -> None:
        parts = urlsplit(url)
        self._host, self._port, self._path = parts.hostname or "127.0.0.1", parts.port or 80, parts.path
        self._auth = base64.b64encode(f"{site}:{password}".encode()).decode("ascii")
        self._auth_tail = f"\r\nauthorization: Basic {self._auth}\r\n\r\n".encode()
        self._id = 0
        self._template: tuple[Any, ...] | None = None
        self.full_results = True  # the decoded result for the caller; the load loop needs only the verdict
        self._reader: asyncio.StreamReader | None = None
        self._writer: asyncio.StreamWriter | None = None

    async def __aenter__(self) -> LightClient:
        self._reader, self._writer = await asyncio.open_connection(self._host, self._port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._writer is not None:
            self._writer.close()

    @property
    def local_port(self) -> int:
        assert self._writer is not None
        return self._writer.get_extra_info("sockname")[1]

    def request_bytes(self, tool: str, arguments: dict[str, Any]) -> bytes:
        """The SDK's request, byte for byte (``json.dumps`` compact, the id first). Everything but the id
        is encoded once per (tool, arguments) and kept, and replies are checked with msgspec: the driver's
        CPU per append call fell 0.107 -> 0.076 ms (same-run A/B, 6 alternating rounds, docs/PERFORMANCE.md
        "P6-w2"), so that with client and server on the same cores more of them go to the server."""
        self._id += 1
        if self._template is None or self._template[0] != tool or self._template[1] != arguments:
            self._template = (tool, arguments, *self._encode(tool, arguments))
        head, middle, tail = self._template[2:]
        body_rest = middle + tail
        rid = str(self._id).encode()
        length = str(len(_BODY_START) + len(rid) + len(body_rest)).encode()
        return b"".join((head, length, self._auth_tail, _BODY_START, rid, body_rest))

    def _encode(self, tool: str, arguments: dict[str, Any]) -> tuple[bytes, bytes, bytes]:
        rest = json.dumps(
            {
                "method": "tools/call",
                "params": {
                    "name": tool,
                    "arguments": arguments,
                    "_meta": {
                        "io.modelcontextprotocol/protocolVersion": PROTOCOL,
                        "io.modelcontextprotocol/clientInfo": {"name": "mcp", "version": "0.1.0"},
                        "io.modelcontextprotocol/clientCapabilities": {},
                    },
                },
            },
            separators=(",", ":"),
        ).encode()
        head = (
            f"POST {self._path} HTTP/1.1\r\nhost: {self._host}:{self._port}\r\n"
            "accept-encoding: gzip, deflate\r\nconnection: keep-alive\r\nuser-agent: python-httpx2/2.16.2\r\n"
            "accept: application/json, text/event-stream\r\ncontent-type: application/json\r\n"
            f"mcp-protocol-version: {PROTOCOL}\r\nmcp-method: tools/call\r\nmcp-name: {tool}\r\n"
            "content-length: "
        ).encode()
        return head, b",", rest[1:]  # rest[1:]: '"method":...' after the envelope's opening brace

    async def call(self, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
        assert self._reader is not None and self._writer is not None
        self._writer.write(self.request_bytes(tool, arguments))
        head = await self._reader.readuntil(b"\r\n\r\n")
        status = int(head[9:12])
        at = head.lower().find(b"\r\ncontent-length:")
        if at < 0:
            raise RuntimeError(f"reply without content-length: {head!r}")
        body = await self._reader.readexactly(int(head[at + 17 : head.index(b"\r\n", at + 2)]))
        if status != 200:
            raise RuntimeError(f"HTTP {status}: {body[:300]!r}")
        reply = _decode_reply(body)
        if reply.error is not None or reply.result is None or reply.result.isError:
            raise RuntimeError(f"{tool} failed: {body[:300]!r}")
        return _decode_any(body)["result"] if self.full_results else {}


@contextlib.asynccontextmanager
async def _sdk_session(url: str, site: str, password: str, mode: str) -> AsyncIterator[Any]:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    async with httpx2.AsyncClient(auth=httpx2.BasicAuth(site, password)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:

            async def call(tool: str, arguments: dict[str, Any]) -> Any:
                result = await client.call_tool(tool, arguments)
                if result.is_error:
                    raise RuntimeError(f"{tool} failed: {result.content[0].text}")
                return result

            yield call


async def run_load(
    url: str,
    password: str,
    tool: str,
    *,
    clients: int,
    seconds: float,
    kind: str = "light",
    mode: str = PROTOCOL,
    site: str = SITE,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """Calls/s summed over ``clients`` (connect + one warm-up call each untimed), and the driver's CPU.

    With ``server_pid`` (a server on this machine): also the server's CPU seconds over the window (all its
    processes) and, for light clients, the calls served by each worker process."""
    counts = [0] * clients
    ports: list[int] = [0] * clients
    warmed, done = asyncio.Semaphore(0), asyncio.Semaphore(0)
    start, measured = asyncio.Event(), asyncio.Event()
    window: dict[str, float] = {}

    async def client(i: int) -> None:
        # Each client lives in one task: the SDK's sessions must be left in the task that entered them.
        args = tool_arguments(tool, f"load-{uuid.uuid4().hex[:16]}")
        if kind == "light":
            session: Any = LightClient(url, site, password)
            session.full_results = False  # only the verdict (status, error, isError) is checked
        else:
            session = _sdk_session(url, site, password, mode)
        async with session as entered:
            call = entered.call if kind == "light" else entered
            ports[i] = entered.local_port if kind == "light" else 0
            await call(tool, args)
            warmed.release()
            await start.wait()
            try:
                while True:
                    await call(tool, args)
                    if time.perf_counter() > window["end"]:
                        break
                    counts[i] += 1
            finally:
                done.release()
            await measured.wait()  # connections stay open until the server side has been read

    async def conductor() -> dict[str, Any]:
        for _ in range(clients):
            await warmed.acquire()
        server_cpu0 = procfs.tree_cpu_seconds(server_pid) if server_pid else 0.0
        cpu0, t0 = time.process_time(), time.perf_counter()
        window["end"] = t0 + seconds
        start.set()
        for _ in range(clients):
            await done.acquire()
        cpu, wall = time.process_time() - cpu0, time.perf_counter() - t0
        out: dict[str, Any] = {"client_cpu_s": cpu, "client_cores": cpu / wall}
        if server_pid:
            out["server_cpu_s"] = procfs.tree_cpu_seconds(server_pid) - server_cpu0
            if kind == "light":
                pids = procfs.worker_pids(server_pid)
                owners = procfs.connection_owners(urlsplit(url).port or 80, ports, pids)
                per_worker = dict.fromkeys(pids, 0)
                for owner, n in zip(owners, counts, strict=True):
                    if owner is not None:
                        per_worker[owner] += n
                out["calls_per_worker"] = list(per_worker.values())
        measured.set()
        return out

    tasks = [asyncio.create_task(client(i)) for i in range(clients)]  # all connect at once
    conductor_task = asyncio.create_task(conductor())
    try:
        await asyncio.gather(*tasks)
    finally:
        conductor_task.cancel()  # no-op once it is done; stops it if a client failed
    return {"rate": sum(counts) / seconds, "calls": sum(counts), "kind": kind, **conductor_task.result()}


def drive_subprocess(
    url: str,
    password: str,
    tool: str,
    *,
    clients: int,
    seconds: float,
    kind: str,
    mode: str = PROTOCOL,
    server_pid: int | None = None,
) -> dict[str, Any]:
    """``run_load`` in a fresh process (the driver's CPU is then its own, apart from the caller's)."""
    args = [url, tool, f"--clients={clients}", f"--seconds={seconds}", f"--kind={kind}", f"--mode={mode}"]
    env = {**os.environ, "LOGSTORE_BENCH_PASSWORD": password}
    return run_driver("bench.load", [*args, f"--server-pid={server_pid or 0}"], seconds=seconds, env=env)


def run_driver(module: str, args: list[str], *, seconds: float, env: dict[str, str] | None = None) -> Any:
    """``python -m module args`` from this tree; its last stdout line, decoded from JSON."""
    import subprocess

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    proc = subprocess.run(
        [sys.executable, "-m", module, *args],
        env=env,
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120 + seconds,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"{module} load driver failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.load")
    parser.add_argument("url")
    parser.add_argument("tool")
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=2.0)
    parser.add_argument("--kind", choices=["light", "sdk"], default="light")
    parser.add_argument("--mode", default=PROTOCOL, help="sdk client: legacy | 2026-07-28")
    parser.add_argument("--site", default=SITE)
    parser.add_argument("--server-pid", type=int, default=0, help="also measure this local server")
    args = parser.parse_args(argv)
    result = asyncio.run(
        run_load(
            args.url,
            os.environ["LOGSTORE_BENCH_PASSWORD"],
            args.tool,
            clients=args.clients,
            seconds=args.seconds,
            kind=args.kind,
            mode=args.mode,
            site=args.site,
            server_pid=args.server_pid or None,
        )
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
