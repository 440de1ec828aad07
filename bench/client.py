"""C1, C2: the client library (``logstore.client``, docs/CLIENT.md).

- C1 / C1-down: ``append_nowait`` latency (10 x 200 B items per batch), each call timed alone, p99 per
  round; with the server up (the writer sends in its thread meanwhile) and with nothing listening (the
  writer retries in its thread meanwhile). Goal <= 50 us: handing a batch over never waits on the network.
- C2: acknowledged appends/s over one connection, one call at a time: ``logstore.client.AsyncClient.append``
  against the raw SDK client (``mcp.Client``, 2026-07-28) on the same server, rounds alternating.
"""

from __future__ import annotations

import asyncio
import logging
import os
import statistics
import time
import uuid
from typing import Any

from .config import Profile, make_items
from .load import SITE
from .mcp_calls import _free_port, _new_site, running_server
from .stats import Goal, Row, fig, paired_ratio

__all__ = ["measure_client"]

ITEMS, SIZE = 10, 200


def _p(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def _nowait_latencies(url: str, password: str, batches: int) -> list[float]:
    """Seconds per ``append_nowait`` call, ``batches`` calls; the writer drains (or is abandoned) after."""
    from logstore.client import Client, WriterOptions

    logging.getLogger("logstore.client").setLevel(logging.CRITICAL)  # the abandoned batches at close
    items = make_items(ITEMS, SIZE)
    options = WriterOptions(max_batches=batches + 1, on_error=lambda failure: None)
    client = Client.http(url, site=SITE, password=password, writer_options=options)
    cid = f"c1-{uuid.uuid4().hex}"
    client.append_nowait(cid, items)  # the writer's thread is started outside the timed calls
    out = []
    clock = time.perf_counter
    for _ in range(batches):
        t0 = clock()
        client.append_nowait(cid, items)
        out.append(clock() - t0)
    client.close(0.0)  # what is still queued is abandoned (reported to the no-op on_error, not logged)
    return out


async def _ack_rate(url: str, password: str, seconds: float, kind: str) -> float:
    items = make_items(ITEMS, SIZE)
    cid = f"c2-{kind}-{uuid.uuid4().hex}"
    if kind == "client":
        from logstore.client import AsyncClient

        async with AsyncClient.http(url, site=SITE, password=password) as client:
            return await _count(lambda: client.append(cid, items), seconds)
    import httpx2
    from mcp import Client

    from .load import PROTOCOL

    async with httpx2.AsyncClient(auth=httpx2.BasicAuth(SITE, password)) as http:
        from mcp.client.streamable_http import streamable_http_client

        async with Client(streamable_http_client(url, http_client=http), mode=PROTOCOL) as sdk:

            async def call() -> Any:
                result = await sdk.call_tool("append_memory", {"conversation_id": cid, "items": items})
                assert not result.is_error, result
                return result

            return await _count(call, seconds)


async def _count(call: Any, seconds: float) -> float:
    await call()  # warm-up: connection and first append untimed
    calls, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        await call()
        calls += 1
    return calls / (time.perf_counter() - t0)


def measure_client(profile: Profile, directory: str) -> list[Row]:
    data_dir = os.path.join(directory, "client")
    password = _new_site(data_dir)
    batches = max(200, int(2000 * profile.mcp_seconds / 5.0))
    p99_up: list[float] = []
    p99_down: list[float] = []
    p50_up: list[float] = []
    p50_down: list[float] = []
    rates: dict[str, list[float]] = {"client": [], "sdk": []}
    dead = f"http://127.0.0.1:{_free_port()}/mcp"
    with running_server(["tools.cli", "serve", "--data-dir", data_dir, "--log-level", "warning"]) as (
        url,
        _pid,
    ):
        for r in range(profile.runs):
            up = _nowait_latencies(url, password, batches)
            down = _nowait_latencies(dead, password, batches)
            p99_up.append(1e6 * _p(up, 0.99))
            p99_down.append(1e6 * _p(down, 0.99))
            p50_up.append(1e6 * statistics.median(up))
            p50_down.append(1e6 * statistics.median(down))
            for kind in ("client", "sdk") if r % 2 == 0 else ("sdk", "client"):
                rates[kind].append(asyncio.run(_ack_rate(url, password, profile.mcp_seconds, kind)))
    goal = Goal("<=", 50.0, "<= 50 us, never waits on the network")
    batch = f"{ITEMS} x {SIZE} B items per batch, {batches} calls per round"
    return [
        Row(
            "C1",
            "append_nowait p99 latency, server up (the writer sending meanwhile)",
            "us",
            value=fig(p99_up),
            goal=goal,
            note=f"{batch}; p50 {fig(p50_up).median:.1f} us",
        ),
        Row(
            "C1-down",
            "append_nowait p99 latency, server down (the writer retrying meanwhile)",
            "us",
            value=fig(p99_down),
            goal=goal,
            note=f"{batch}; p50 {fig(p50_down).median:.1f} us; nothing listens on the port",
        ),
        Row(
            "C2",
            "acknowledged appends/s, one connection, one call at a time: logstore.client vs raw SDK client",
            "calls/s",
            value=fig(rates["client"]),
            baseline=fig(rates["sdk"]),
            baseline_name="mcp.Client 2026-07-28",
            ratio=paired_ratio(rates["client"], rates["sdk"]),
            goal=Goal(">=", 1.0, ">= 1.0x the SDK client"),
            note=f"AsyncClient.append (waits for the ack), {ITEMS} x {SIZE} B items; rounds alternate",
        ),
    ]
