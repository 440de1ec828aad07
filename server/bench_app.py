"""Bench-only server variant: the production stack plus one trivial tool, and a small load driver.

``logstore serve`` never uses this module. It exists so that the cost of ``append_memory`` can be put next
to the cost of the HTTP/MCP stack itself: the ``noop`` tool goes through the same uvicorn, Basic auth,
session manager, argument validation and error funnel, but returns a constant without touching storage
or a worker thread.

    python -m server.bench_app serve --data-dir D --port P          # the bench server
    python -m server.bench_app measure --url URL --site S --password PW --processes 4   # 16 clients
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import os
import statistics
import sys
import time
import uuid
from collections.abc import Callable, Sequence
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


async def _run_schedule(
    url: str,
    site: str,
    password: str,
    tools: Sequence[str],
    clients: int,
    phase: float,
    rounds: int,
    mode: str,
    ready: Callable[[], None],
) -> list[int]:
    """Connect ``clients`` clients, warm up, call ``ready()``, then run the phases; calls per phase."""
    import httpx2
    from mcp import Client
    from mcp.client.streamable_http import streamable_http_client

    counts = []
    async with contextlib.AsyncExitStack() as stack:
        sessions = []
        for _ in range(clients):
            http = await stack.enter_async_context(httpx2.AsyncClient(auth=httpx2.BasicAuth(site, password)))
            client = Client(streamable_http_client(url, http_client=http), mode=mode)
            sessions.append((await stack.enter_async_context(client), f"bench-{uuid.uuid4().hex[:16]}"))
        for tool in tools:  # warm-up: credentials cached, conversation files created
            await asyncio.gather(*(c.call_tool(tool, _arguments(tool, cid)) for c, cid in sessions))
        await asyncio.to_thread(ready)
        start = time.monotonic()
        for k in range(rounds * len(tools)):
            tool, count = tools[k % len(tools)], [0]
            deadline = start + (k + 1) * phase
            await asyncio.gather(
                *(_drive(c, tool, _arguments(tool, cid), deadline, count) for c, cid in sessions)
            )
            counts.append(count[0])
    return counts


def _process_main(args: tuple[Any, ...], barrier: Any, out: Any) -> None:
    out.put(asyncio.run(_run_schedule(*args, ready=barrier.wait)))


def measure(
    url: str,
    site: str,
    password: str,
    *,
    tools: Sequence[str] = ("noop", "append_memory"),
    clients: int = 16,
    processes: int = 1,
    seconds: float = 6.0,
    rounds: int = 3,
    mode: str = "auto",
) -> dict[str, float]:
    """Tool calls per second, summed over ``clients`` concurrent clients (one connection each, one
    conversation each for appends), spread over ``processes`` client processes so the Python client side
    is not the bottleneck. The tools alternate in ``rounds`` phases, so that load drift on a shared machine
    affects them alike; each tool's rate is the median over its phases."""
    phase = seconds / (rounds * len(tools))
    shares = [clients // processes + (1 if i < clients % processes else 0) for i in range(processes)]
    if processes == 1:
        per_phase = asyncio.run(
            _run_schedule(url, site, password, tools, clients, phase, rounds, mode, ready=lambda: None)
        )
    else:
        ctx = multiprocessing.get_context("spawn")
        barrier, out = ctx.Barrier(processes), ctx.Queue()
        procs = [
            ctx.Process(
                target=_process_main,
                args=((url, site, password, tuple(tools), n, phase, rounds, mode), barrier, out),
            )
            for n in shares
        ]
        for proc in procs:
            proc.start()
        results = [out.get(timeout=120 + seconds) for _ in procs]
        for proc in procs:
            proc.join()
        per_phase = [sum(column) for column in zip(*results, strict=True)]
    rates: dict[str, list[float]] = {tool: [] for tool in tools}
    for k, count in enumerate(per_phase):
        rates[tools[k % len(tools)]].append(count / phase)
    return {tool: statistics.median(values) for tool, values in rates.items()}


def _measure(args: argparse.Namespace) -> None:
    rates = measure(
        args.url,
        args.site,
        args.password,
        tools=args.tools,
        clients=args.clients,
        processes=args.processes,
        seconds=args.seconds,
        rounds=args.rounds,
        mode=args.mode,
    )
    out: dict[str, Any] = {tool: round(rate, 1) for tool, rate in rates.items()}
    if "noop" in rates and "append_memory" in rates:
        out["append_over_noop"] = round(rates["append_memory"] / rates["noop"], 3)
    out.update(clients=args.clients, processes=args.processes, mode=args.mode)
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
    m.add_argument("--processes", type=int, default=1, help="client processes the clients are spread over")
    m.add_argument("--seconds", type=float, default=6.0, help="total measuring time, all tools")
    m.add_argument("--rounds", type=int, default=3)
    m.add_argument("--mode", default="auto", help="client protocol mode: auto | legacy | 2026-07-28")
    m.add_argument("--tools", nargs="+", default=["noop", "append_memory"])
    m.set_defaults(func=_measure)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
