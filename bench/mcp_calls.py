"""P6: tool calls/s over MCP streamable HTTP, ``append_memory`` against a trivial tool on the same stack.

The server is ``server.bench_app`` (the production HTTP app, Basic auth and MCP server, plus a ``noop``
tool that touches neither storage nor a worker thread), started as a subprocess on a scratch data dir.
The load comes from a second process (``python -m bench.mcp_calls --drive ...``): ``clients`` SDK clients,
each with its own HTTP connection pool, session and conversation, all connected and warmed up before a
common start; calls completed inside the timed window are counted. Rounds alternate which tool goes first.
Client and server share this machine's cores, as they would on one host.
"""

from __future__ import annotations

import argparse
import asyncio
import importlib.util
import os
import secrets
import socket
import subprocess
import sys
import time
import urllib.request
import uuid
from typing import Any

from .config import Profile
from .stats import Goal, Row, fig, paired_ratio

__all__ = ["measure_mcp", "drive", "main"]

SITE = "bench"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_healthy(base: str, proc: subprocess.Popen, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"bench server exited early with {proc.returncode}")
        try:
            with urllib.request.urlopen(f"{base}/healthz", timeout=1) as r:
                if r.status == 200:
                    return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError("bench server did not become healthy")


async def drive(url: str, password: str, tool: str, clients: int, seconds: float) -> float:
    """Calls/s summed over ``clients`` concurrent sessions (connect + one warm-up call untimed)."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    ready = 0
    all_ready = asyncio.Event()
    start = asyncio.Event()
    window: dict[str, float] = {}
    counts = [0] * clients

    async def one(i: int) -> None:
        nonlocal ready
        args: dict[str, Any] = {}
        if tool == "append_memory":
            args = {
                "conversation_id": f"mcp-{uuid.uuid4().hex[:16]}",
                "items": [{"role": "user", "text": "x" * 170}],
            }
        async with httpx2.AsyncClient(auth=httpx2.BasicAuth(SITE, password)) as http:
            async with Client(streamable_http_client(url, http_client=http), mode="legacy") as client:
                await client.call_tool(tool, args)
                ready += 1
                if ready == clients:
                    all_ready.set()
                await start.wait()
                deadline = window["end"]
                while True:
                    result = await client.call_tool(tool, args)
                    if result.is_error:
                        raise RuntimeError(f"{tool} failed: {result.structured_content}")
                    if time.perf_counter() > deadline:
                        break
                    counts[i] += 1

    async def timer() -> None:
        await all_ready.wait()
        window["start"] = time.perf_counter()
        window["end"] = window["start"] + seconds
        start.set()

    await asyncio.gather(timer(), *(one(i) for i in range(clients)))
    return sum(counts) / seconds


def _drive_subprocess(url: str, password: str, tool: str, clients: int, seconds: float) -> float:
    proc = subprocess.run(
        [sys.executable, "-m", "bench.mcp_calls", "--drive", url, tool, str(clients), str(seconds)],
        env={**os.environ, "LOGSTORE_BENCH_PASSWORD": password},
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=120 + seconds,
        check=False,
    )
    if proc.returncode != 0:
        raise RuntimeError(f"MCP load driver failed: {proc.stderr[-2000:]}")
    return float(proc.stdout.strip().splitlines()[-1])


def measure_mcp(profile: Profile, directory: str) -> list[Row]:
    label = f"{profile.mcp_clients} clients over streamable HTTP: append_memory calls/s vs noop tool"
    if importlib.util.find_spec("server.bench_app") is None:
        return [Row("P6", label, "calls/s", note="not available: server/bench_app.py is missing")]
    from server.credentials import CredentialsFile

    data_dir = os.path.join(directory, "mcp")
    password = secrets.token_urlsafe(16)
    CredentialsFile(data_dir).add(SITE, password)
    port = _free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "server.bench_app", "serve", "--data-dir", data_dir, "--port", str(port)],
        cwd=_ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    rates: dict[str, list[float]] = {"noop": [], "append_memory": []}
    try:
        _wait_healthy(f"http://127.0.0.1:{port}", server)
        url = f"http://127.0.0.1:{port}/mcp"
        for r in range(profile.runs):
            order = ["noop", "append_memory"] if r % 2 == 0 else ["append_memory", "noop"]
            for tool in order:
                rates[tool].append(
                    _drive_subprocess(url, password, tool, profile.mcp_clients, profile.mcp_seconds)
                )
    finally:
        server.terminate()
        try:
            server.wait(timeout=15)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()
    return [
        Row(
            "P6",
            label,
            "calls/s",
            value=fig(rates["append_memory"]),
            baseline=fig(rates["noop"]),
            baseline_name="noop tool",
            ratio=paired_ratio(rates["append_memory"], rates["noop"]),
            goal=Goal(">=", 0.8, ">= 0.8x trivial tool"),
            note="1 item of ~200 B per call; each client its own session and conversation; legacy protocol",
        )
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.mcp_calls")
    parser.add_argument("--drive", nargs=4, metavar=("URL", "TOOL", "CLIENTS", "SECONDS"), required=True)
    args = parser.parse_args(argv)
    url, tool, clients, seconds = args.drive
    rate = asyncio.run(drive(url, os.environ["LOGSTORE_BENCH_PASSWORD"], tool, int(clients), float(seconds)))
    print(rate)
    return 0


if __name__ == "__main__":
    sys.exit(main())
