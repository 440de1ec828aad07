"""P12: logstore against the official MCP memory server (``@modelcontextprotocol/server-memory``), over stdio.

Both servers are driven by the same SDK client (``mcp.Client``, one session, calls one at a time) with the
same payloads: a write is 10 items of 200 B (logstore: one ``append_memory``; the peer: one
``add_observations`` of the 10 items' JSON texts to one entity, its model of a conversation), a read is
logstore's ``recall_memory(50)`` against the peer's ``read_graph`` (the peer has no "last N"; agents read
its whole graph). Each server is measured empty and holding 50,000 items in that conversation, rounds
alternating between the servers. Whether a write reaches the disk before the call returns is measured,
not assumed: a separate short session per server runs under ``strace -f`` and counts fsync/fdatasync calls
per write.

The peer is installed with npm into a cache directory on first use (``$LOGSTORE_BENCH_NPM``, default
``~/.cache/logstore-bench/npm``); without ``node``/``npm`` (or the registry) the row says why it skipped.
"""

from __future__ import annotations

import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from .config import Profile, make_item
from .stats import Goal, Row, fig, paired_ratio

__all__ = ["measure_peer", "peer_entry", "npm_cache"]

PACKAGE = "@modelcontextprotocol/server-memory"
CONVERSATION = "peer-conversation-1"
_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def npm_cache() -> str:
    return os.environ.get("LOGSTORE_BENCH_NPM") or os.path.expanduser("~/.cache/logstore-bench/npm")


def peer_entry() -> tuple[str | None, str]:
    """(path of the peer's index.js, its version) or (None, why not)."""
    node, npm = shutil.which("node"), shutil.which("npm")
    if node is None or npm is None:
        return None, "node/npm not installed"
    cache = npm_cache()
    package_dir = os.path.join(cache, "node_modules", *PACKAGE.split("/"))
    entry = os.path.join(package_dir, "dist", "index.js")
    if not os.path.exists(entry):
        os.makedirs(cache, exist_ok=True)
        proc = subprocess.run(
            [npm, "install", "--prefix", cache, "--no-audit", "--no-fund", "--silent", PACKAGE],
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
        if proc.returncode != 0 or not os.path.exists(entry):
            return None, f"npm install {PACKAGE} failed: {proc.stderr.strip()[-300:]}"
    with open(os.path.join(package_dir, "package.json")) as f:
        return entry, json.load(f)["version"]


def _items(n: int) -> list[dict[str, Any]]:
    return [make_item(200, n + i) for i in range(10)]


def _texts(items: list[dict[str, Any]], tag: int) -> list[str]:
    # The peer drops an observation equal to one it holds, so every text carries a unique tag.
    return [json.dumps({**item, "tag": tag + i}, separators=(",", ":")) for i, item in enumerate(items)]


class _Server:
    """One stdio server: how to start it, and its write and read calls."""

    def __init__(self, name: str, command: list[str], env: dict[str, str], *, is_peer: bool) -> None:
        self.name, self.command, self.env, self.is_peer = name, command, env, is_peer
        self.tag = 0

    def params(self, wrap: list[str] | None = None) -> Any:
        from mcp import StdioServerParameters

        cmd = [*(wrap or []), *self.command]
        return StdioServerParameters(command=cmd[0], args=cmd[1:], env={**os.environ, **self.env}, cwd=_ROOT)

    async def write(self, client: Any) -> None:
        self.tag += 10
        items = _items(self.tag)
        if self.is_peer:
            args: dict[str, Any] = {
                "observations": [{"entityName": CONVERSATION, "contents": _texts(items, self.tag)}]
            }
            result = await client.call_tool("add_observations", args)
        else:
            args = {"conversation_id": CONVERSATION, "items": items}
            result = await client.call_tool("append_memory", args)
        if result.is_error:
            raise RuntimeError(f"{self.name} write failed: {result.content[0].text[:300]}")

    async def read(self, client: Any) -> None:
        if self.is_peer:
            result = await client.call_tool("read_graph", {})
        else:
            result = await client.call_tool("recall_memory", {"conversation_id": CONVERSATION, "limit": 50})
        if result.is_error:
            raise RuntimeError(f"{self.name} read failed: {result.content[0].text[:300]}")


def _prefill(data_dir: str, memory_file: str, count: int) -> None:
    """``count`` items in the conversation, in each server's own format (logstore through its engine)."""
    from logstore import Store

    with Store(data_dir) as store:
        for start in range(0, count, 250):
            store.append("local", CONVERSATION, [make_item(200, start + i) for i in range(250)])
    texts = _texts([make_item(200, i) for i in range(count)], -count - 10)
    entity = {"type": "entity", "name": CONVERSATION, "entityType": "conversation", "observations": texts}
    with open(memory_file, "w") as f:
        f.write(json.dumps(entity))


def _create_entity(memory_file: str) -> None:
    entity = {"type": "entity", "name": CONVERSATION, "entityType": "conversation", "observations": []}
    with open(memory_file, "w") as f:
        f.write(json.dumps(entity))


async def _session(server: _Server, seconds: float, reads: int) -> tuple[float, float]:
    """(writes/s over ``seconds``, median read latency in ms over ``reads`` calls)."""
    from mcp import Client

    async with Client(server.params(), mode="legacy") as client:
        await server.write(client)  # warm-up: process started, files open
        await server.read(client)
        n, t0 = 0, time.perf_counter()
        while time.perf_counter() - t0 < seconds:
            await server.write(client)
            n += 1
        rate = n / (time.perf_counter() - t0)
        latencies = []
        for _ in range(reads):
            t = time.perf_counter()
            await server.read(client)
            latencies.append(1000 * (time.perf_counter() - t))
    return rate, statistics.median(latencies)


async def _fsyncs_per_write(server: _Server, writes: int, directory: str) -> float | None:
    """fsync + fdatasync calls per write, counted by strace over a session of ``writes`` writes."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    from mcp import Client

    out = os.path.join(directory, f"strace-{server.name}.txt")
    wrap = [strace, "-f", "-qq", "-e", "trace=fsync,fdatasync", "-o", out]
    async with Client(server.params(wrap), mode="legacy") as client:
        await server.write(client)
        with open(out) as f:  # strace writes as calls happen; count what the warm-up did
            before = len(re.findall(r"\b(fsync|fdatasync)\(", f.read()))
        for _ in range(writes):
            await server.write(client)
        await asyncio.sleep(0.2)
        with open(out) as f:
            after = len(re.findall(r"\b(fsync|fdatasync)\(", f.read()))
    return (after - before) / writes


def measure_peer(profile: Profile, directory: str) -> list[Row]:
    label = "logstore vs official MCP memory server over stdio, 50k items"
    if not profile.peer_items:
        return [Row("P12", label, "writes/s", note=f"not run in the {profile.name} profile")]
    entry, version = peer_entry()
    if entry is None:
        return [Row("P12", label, "writes/s", note=f"skipped: {version}")]
    size, seconds, reads = profile.peer_items, profile.peer_seconds, profile.peer_reads
    results: dict[tuple[str, int], list[tuple[float, float]]] = {}
    fsyncs: dict[str, float | None] = {}
    for state in (0, size):
        base = tempfile.mkdtemp(prefix=f"peer-{state}-", dir=directory)
        data_dir, memory_file = os.path.join(base, "logstore"), os.path.join(base, "memory.jsonl")
        if state:
            _prefill(data_dir, memory_file, state)
        else:
            _create_entity(memory_file)
        servers = [
            _Server(
                "logstore",
                [sys.executable, "-m", "tools.cli", "serve", "--stdio", "--data-dir", data_dir],
                {"LOGSTORE_LOG_LEVEL": "warning"},
                is_peer=False,
            ),
            _Server("peer", ["node", entry], {"MEMORY_FILE_PATH": memory_file}, is_peer=True),
        ]
        for r in range(profile.runs):
            for server in servers if r % 2 == 0 else servers[::-1]:
                results.setdefault((server.name, state), []).append(
                    asyncio.run(_session(server, seconds, reads))
                )
        if not state:
            for server in servers:
                fsyncs[server.name] = asyncio.run(_fsyncs_per_write(server, 10, base))

    def writes(name: str, state: int) -> list[float]:
        return [w for w, _ in results[(name, state)]]

    def read_ms(name: str, state: int) -> list[float]:
        return [r for _, r in results[(name, state)]]

    def synced(name: str) -> str:
        f = fsyncs.get(name)
        return "not measured (no strace)" if f is None else f"{f:.1f} fsync/write"

    fsync_note = f"logstore {synced('logstore')}, peer {synced('peer')} (strace)"
    peer_name = f"{PACKAGE}@{version}"
    rows = []
    for state in (size, 0):
        tag = f"{state:,} items" if state else "0 items"
        rows.append(
            Row(
                "P12",
                f"stdio writes (10 x 200 B) at {tag}: logstore append_memory vs {peer_name} add_observations",
                "writes/s",
                value=fig(writes("logstore", state)),
                baseline=fig(writes("peer", state)),
                baseline_name="official memory server",
                ratio=paired_ratio(writes("logstore", state), writes("peer", state)),
                goal=Goal(">=", 20, ">= 20x") if state else None,
                note=fsync_note,
            )
        )
        rows.append(
            Row(
                "P12",
                f"stdio read at {tag}: peer read_graph latency / logstore recall_memory(50) latency",
                "ms",
                value=fig(read_ms("logstore", state)),
                baseline=fig(read_ms("peer", state)),
                baseline_name="official memory server read_graph",
                ratio=paired_ratio(read_ms("peer", state), read_ms("logstore", state)),
                goal=Goal(">=", 100, ">= 100x faster") if state else None,
                note="ratio = peer latency / logstore latency (higher: logstore faster)",
            )
        )
    return rows
