"""Bench-only server variant: the production stack plus one trivial tool, and a small load driver.

``logstore serve`` never uses this module. It exists so that the cost of ``append_memory`` can be put next
to the cost of the HTTP/MCP stack itself: the ``noop`` tool goes through the same uvicorn, Basic auth,
session manager, argument validation and error funnel, but returns a constant without touching storage
or a worker thread.

    python -m server.bench_app serve --data-dir D --port P          # the bench server
    python -m server.bench_app measure --url URL --site S --password PW --clients 16 --seconds 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
import uuid
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


async def _client_loop(
    url: str, auth: tuple[str, str], tool: str, mode: str, deadline: float, counts: list[int]
) -> None:
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    conversation = f"bench-{uuid.uuid4().hex[:16]}"
    payload: dict[str, Any] = (
        {"conversation_id": conversation, "items": [{"role": "user", "text": "x" * 200}]}
        if tool == "append_memory"
        else {}
    )
    async with httpx2.AsyncClient(auth=httpx2.BasicAuth(*auth)) as http:
        async with Client(streamable_http_client(url, http_client=http), mode=mode) as client:
            while time.monotonic() < deadline:
                result = await client.call_tool(tool, payload)
                if result.is_error:
                    raise RuntimeError(f"{tool} failed: {result.structured_content}")
                counts[0] += 1


async def measure(
    url: str, site: str, password: str, *, tool: str, clients: int, seconds: float, mode: str = "auto"
) -> float:
    """Tool calls per second summed over ``clients`` concurrent clients, each its own session."""
    counts = [0]
    deadline = time.monotonic() + seconds
    start = time.monotonic()
    await asyncio.gather(
        *(_client_loop(url, (site, password), tool, mode, deadline, counts) for _ in range(clients))
    )
    return counts[0] / (time.monotonic() - start)


def _measure(args: argparse.Namespace) -> None:
    out = {}
    for tool in args.tools:
        rate = asyncio.run(
            measure(
                args.url,
                args.site,
                args.password,
                tool=tool,
                clients=args.clients,
                seconds=args.seconds,
                mode=args.mode,
            )
        )
        out[tool] = round(rate, 1)
    if "noop" in out and "append_memory" in out:
        out["append_over_noop"] = round(out["append_memory"] / out["noop"], 3)
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
    m.add_argument("--seconds", type=float, default=5.0)
    m.add_argument("--mode", default="auto", help="client protocol mode: auto | legacy | 2026-07-28")
    m.add_argument("--tools", nargs="+", default=["noop", "append_memory"])
    m.set_defaults(func=_measure)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
