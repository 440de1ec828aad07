"""Helpers for the server tests: run ``logstore serve`` as a subprocess and talk to it over real HTTP."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx2
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

__all__ = [
    "REPO",
    "MODES",
    "RunningServer",
    "free_port",
    "logstore_cmd",
    "serve",
    "connect",
    "call",
    "wait_healthy",
    "error_of",
    "rpc_headers",
]

REPO = Path(__file__).resolve().parent.parent
# The two protocol eras the server must speak: the legacy initialize handshake (what the TypeScript SDK
# 1.x and other older clients use) and the 2026-07-28 per-request protocol.
MODES = ("legacy", "2026-07-28")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def logstore_cmd() -> list[str]:
    """The installed console script when present (what users run), else the module."""
    script = Path(sys.executable).parent / "logstore"
    return [str(script)] if script.exists() else [sys.executable, "-m", "tools.cli"]


@dataclass
class RunningServer:
    url: str
    port: int
    data_dir: str
    proc: subprocess.Popen[str]
    passwords: dict[str, str] = field(default_factory=dict)
    stdout_path: str = ""

    @property
    def base(self) -> str:
        return self.url.removesuffix("/mcp")

    def stdout(self) -> str:
        return Path(self.stdout_path).read_text()


def wait_healthy(base: str, proc: subprocess.Popen[str], timeout: float = 90.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited early with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.05)
    raise TimeoutError("server did not become healthy")


@contextlib.contextmanager
def serve(
    data_dir: str | os.PathLike[str],
    *extra: str,
    env: dict[str, str] | None = None,
    passwords: dict[str, str] | None = None,
    store: str | None = None,
) -> Iterator[RunningServer]:
    """Start ``logstore serve`` on a free 127.0.0.1 port; stop it (SIGTERM, then SIGKILL) afterwards.
    ``store``: a store URL served instead of ``data_dir`` (which then only holds the server's output)."""
    data_dir = str(data_dir)
    out_path = os.path.join(data_dir, f"serve-{os.getpid()}-{time.monotonic_ns()}.out")
    os.makedirs(data_dir, exist_ok=True)
    for attempt in range(3):  # a free port can be taken between probing and binding
        port = free_port()
        cmd = [
            *logstore_cmd(),
            "serve",
            *(("--store", store) if store else ("--data-dir", data_dir)),
            "--port",
            str(port),
            "--log-level",
            "warning",
        ]
        with open(out_path, "w") as out:
            proc = subprocess.Popen(
                [*cmd, *extra],
                stdout=out,
                stderr=subprocess.STDOUT,
                text=True,
                cwd=REPO,
                env={**os.environ, **(env or {})},
            )
        server = RunningServer(
            f"http://127.0.0.1:{port}/mcp", port, data_dir, proc, dict(passwords or {}), out_path
        )
        try:
            wait_healthy(server.base, proc)
            break
        except RuntimeError:
            if attempt == 2:
                raise RuntimeError(f"server failed to start:\n{server.stdout()}") from None
    try:
        yield server
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextlib.asynccontextmanager
async def connect(url: str, site: str, password: str, mode: str) -> AsyncIterator[Client]:
    async with httpx2.AsyncClient(auth=httpx2.BasicAuth(site, password)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            yield client


async def call(client: Client, tool: str, arguments: dict[str, Any]) -> tuple[bool, dict[str, Any]]:
    """(is_error, the result JSON).

    Success: ``structuredContent``, after checking the text content carries the same JSON. Error: the JSON
    of the text content, after checking there is no ``structuredContent`` (see server/mcp/tool_errors.py).
    """
    result = await client.call_tool(tool, arguments)
    assert len(result.content) == 1 and result.content[0].type == "text"
    body = json.loads(result.content[0].text)
    if result.is_error:
        assert result.structured_content is None
        return True, body
    assert body == result.structured_content
    return False, result.structured_content


def error_of(structured: dict[str, Any]) -> dict[str, Any]:
    assert set(structured) == {"error"}, structured
    return structured["error"]


def rpc_headers(*pairs: Sequence[str]) -> dict[str, str]:
    return {
        "Accept": "application/json, text/event-stream",
        "Content-Type": "application/json",
        **dict(pairs),
    }
