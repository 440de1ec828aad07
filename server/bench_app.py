"""Bench-only server variant: the production stack plus one trivial tool, and a small load driver.

``logstore serve`` never uses this module. It exists so that the cost of ``append_memory`` can be put next
to the cost of the HTTP/MCP stack itself: the ``noop`` tool goes through the same uvicorn, Basic auth,
session manager, argument validation and error funnel, but returns a constant without touching storage
or a worker thread.

    python -m server.bench_app serve --data-dir D --port P          # the bench server
    python -m server.bench_app measure --url URL --site S --password PW --clients 16 --seconds 12
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
import uuid
from collections.abc import Sequence
from typing import Any

from .config import ServeConfig
from .handlers import StoreLike
from .http_app import build_http_app
from .mcp_app import ToolBinding, spec_bindings
from .runtime import open_store, uvicorn_config
from .spec_tools import ToolDef
from .validation import ArgumentValidator

__all__ = ["NOOP_TOOL", "bench_bindings", "measure"]

NOOP_TOOL = ToolDef(
    name="noop",
    description='Bench only: returns {"ok": true} without touching storage.',
    input_schema={"type": "object", "properties": {}},
    output_schema={"type": "object", "properties": {"ok": {"type": "boolean"}}, "required": ["ok"]},
)


def bench_bindings(store: StoreLike) -> dict[str, ToolBinding]:
    bindings = spec_bindings(store)
    bindings["noop"] = ToolBinding(
        NOOP_TOOL, lambda site, args: {"ok": True}, ArgumentValidator(NOOP_TOOL), blocking=False
    )
    return bindings


def _serve(args: argparse.Namespace) -> None:
    import uvicorn

    config = ServeConfig(data_dir=args.data_dir, port=args.port, log_level="warning")
    app = build_http_app(open_store(config), config.data_dir, bindings_factory=bench_bindings)
    uvicorn.Server(uvicorn_config(config, app)).run()


def _arguments(tool: str, conversation_id: str) -> dict[str, Any]:
    if tool == "append_memory":
        return {"conversation_id": conversation_id, "items": [{"role": "user", "text": "x" * 200}]}
    return {}


async def _drive(
    client: Any, tool: str, arguments: dict[str, Any], deadline: float, count: list[int]
) -> None:
    while time.monotonic() < deadline:
        result = await client.call_tool(tool, arguments)
        if result.is_error:
            raise RuntimeError(f"{tool} failed: {result.content[0].text}")
        count[0] += 1


async def measure(
    url: str,
    site: str,
    password: str,
    *,
    tools: Sequence[str] = ("noop", "append_memory"),
    clients: int = 16,
    seconds: float = 6.0,
    rounds: int = 3,
    mode: str = "auto",
) -> dict[str, float]:
    """Tool calls per second, summed over ``clients`` concurrent clients (one connection each, one
    conversation each for appends). The tools alternate in ``rounds`` phases, so that load drift on a shared
    machine affects them alike; each tool's rate is the median over its phases."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    rates: dict[str, list[float]] = {tool: [] for tool in tools}
    async with contextlib.AsyncExitStack() as stack:
        sessions = []
        for _ in range(clients):
            http = await stack.enter_async_context(httpx2.AsyncClient(auth=httpx2.BasicAuth(site, password)))
            client = Client(streamable_http_client(url, http_client=http), mode=mode)
            sessions.append((await stack.enter_async_context(client), f"bench-{uuid.uuid4().hex[:16]}"))
        for tool in tools:  # warm-up: credentials cached, conversation files created
            await asyncio.gather(*(c.call_tool(tool, _arguments(tool, cid)) for c, cid in sessions))
        phase = seconds / (rounds * len(tools))
        for _ in range(rounds):
            for tool in tools:
                count = [0]
                start = time.monotonic()
                await asyncio.gather(
                    *(_drive(c, tool, _arguments(tool, cid), start + phase, count) for c, cid in sessions)
                )
                rates[tool].append(count[0] / (time.monotonic() - start))
    return {tool: statistics.median(values) for tool, values in rates.items()}


def _measure(args: argparse.Namespace) -> None:
    rates = asyncio.run(
        measure(
            args.url,
            args.site,
            args.password,
            tools=args.tools,
            clients=args.clients,
            seconds=args.seconds,
            rounds=args.rounds,
            mode=args.mode,
        )
    )
    out: dict[str, Any] = {tool: round(rate, 1) for tool, rate in rates.items()}
    if "noop" in rates and "append_memory" in rates:
        out["append_over_noop"] = round(rates["append_memory"] / rates["noop"], 3)
    out.update(clients=args.clients, mode=args.mode)
    print(json.dumps(out))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m server.bench_app")
    sub = parser.add_subparsers(dest="command", required=True)
    s = sub.add_parser("serve")
    s.add_argument("--data-dir", required=True)
    s.add_argument("--port", type=int, required=True)
    s.set_defaults(func=_serve)
    m = sub.add_parser("measure")
    m.add_argument("--url", required=True)
    m.add_argument("--site", required=True)
    m.add_argument("--password", default=os.environ.get("LOGSTORE_BENCH_PASSWORD"))
    m.add_argument("--clients", type=int, default=16)
    m.add_argument("--seconds", type=float, default=6.0, help="total measuring time, all tools")
    m.add_argument("--rounds", type=int, default=3)
    m.add_argument("--mode", default="auto", help="client protocol mode: auto | legacy | 2026-07-28")
    m.add_argument("--tools", nargs="+", default=["noop", "append_memory"])
    m.set_defaults(func=_measure)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
