"""``python -m bench.hostile wrongpw``: a correct new client's first call, idle and then under a flood of
wrong passwords from another process (issue 22's two shapes: a fresh password each time, to a site of its
own or with ``--same-site`` to the timed clients' sites; or with ``--stale`` one stale password per timed
client's site, from the timed clients' address).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import statistics
import time
import uuid
from collections import Counter
from typing import Any

import httpx2

from .hostile_server import basic, modern_headers, outcome, server, tool_call


def flood_addresses(spec: str) -> list[str]:
    """``127.0.0.2`` (one address) or ``spread:N`` (N loopback addresses 127.0.150.1, 127.0.150.2, ...)."""
    if spec.startswith("spread:"):
        n = int(spec.split(":")[1])
        return [f"127.0.{150 + i // 250}.{1 + i % 250}" for i in range(n)]
    return [spec]


async def _flood(
    base: str, sites: list[str], spec: str, clients: int, stop: asyncio.Event, codes: Counter, *, stale: bool
) -> None:
    """``clients`` concurrent request loops over ``sites``: a fresh wrong password each time (no cache can
    answer it), or with ``stale`` the same wrong password per site every time (a misconfigured agent)."""
    addresses = flood_addresses(spec)
    body = tool_call("recall_memory", {"conversation_id": "conversation-1"})
    turn = iter(range(10**9))

    async def one(http: httpx2.AsyncClient) -> None:
        for _ in range(100_000):  # bounded; ends on stop
            if stop.is_set():
                return
            site = sites[next(turn) % len(sites)]
            auth = basic(site, "stale-" + site if stale else uuid.uuid4().hex)
            try:
                r = await http.post(base + "/mcp", json=body, headers=modern_headers(auth, "recall_memory"))
                codes[f"http-{r.status_code}"] += 1
            except httpx2.HTTPError as exc:
                codes[type(exc).__name__] += 1
                await asyncio.sleep(0.05)

    async with contextlib.AsyncExitStack() as stack:
        https = []
        for k, addr in enumerate(addresses):
            n = clients // len(addresses) + (1 if k < clients % len(addresses) else 0)
            if n:
                limits = httpx2.Limits(max_connections=n, max_keepalive_connections=n)
                # verify=False: plain http, and loading the CA bundle 256 times would take seconds.
                transport = httpx2.AsyncHTTPTransport(local_address=addr, limits=limits, verify=False)
                http = await stack.enter_async_context(httpx2.AsyncClient(transport=transport, timeout=60))
                https += [http] * n
        await asyncio.gather(*(one(http) for http in https))


async def _first_call(base: str, site: str, password: str, local_address: str = "127.0.0.1") -> float:
    body = tool_call("recall_memory", {"conversation_id": "conversation-1"})
    transport = httpx2.AsyncHTTPTransport(local_address=local_address)
    async with httpx2.AsyncClient(transport=transport, timeout=120) as http:
        start = time.perf_counter()
        r = await http.post(
            base + "/mcp", json=body, headers=modern_headers(basic(site, password), "recall_memory")
        )
        elapsed = time.perf_counter() - start
    return elapsed if outcome(r) == "ok" else -r.status_code  # negative: refused (its HTTP status)


def _flood_process(
    base: str, sites: list[str], addr: str, clients: int, stale: bool, ready: Any, done: Any, out: Any
) -> None:
    async def main() -> dict[str, int]:
        stop, codes = asyncio.Event(), Counter()

        async def watch() -> None:
            await asyncio.to_thread(done.wait, 300)  # bounded: the flood never outlives 5 minutes
            stop.set()

        async def full() -> None:
            for _ in range(6000):  # bounded: 60 s
                if codes.total() >= 2 * clients:  # every loop is past its first round trip
                    break
                await asyncio.sleep(0.01)
            ready.set()

        watcher = asyncio.create_task(watch())
        _ready = asyncio.create_task(full())
        await _flood(base, sites, addr, clients, stop, codes, stale=stale)
        await watcher
        return dict(codes)

    out.put(asyncio.run(main()))


async def _wrongpw(
    base: str, sites: dict[str, str], flood: int, flood_addr: str, samples: int, stale: bool, same_site: bool
) -> dict[str, Any]:
    names = list(sites)
    idle = [await _first_call(base, s, sites[s]) for s in names[:samples]]
    # The flood runs in its own process, so that its client-side work does not delay the timed client.
    # Fresh passwords go to a site of their own; stale ones to the timed clients' sites, from their address.
    flooded, client_addr = (names[samples : 2 * samples], flood_addr) if stale else (["flooded"], "127.0.0.1")
    if same_site and not stale:  # fresh wrong passwords aimed at the timed clients' own sites
        flooded = names[samples : 2 * samples]
    ctx = multiprocessing.get_context("spawn")
    out, ready, done = ctx.Queue(), ctx.Event(), ctx.Event()
    args = (base, flooded, flood_addr, flood, stale, ready, done, out)
    proc = ctx.Process(target=_flood_process, args=args)
    proc.start()
    await asyncio.to_thread(ready.wait, 90)  # the flood is at full strength
    started = time.monotonic()
    loaded = []
    for s in names[samples : 2 * samples]:
        loaded.append(await _first_call(base, s, sites[s], client_addr))
        await asyncio.sleep(1.0)
    flood_seconds = time.monotonic() - started
    served = [x for x in loaded if x > 0]
    done.set()
    codes = await asyncio.to_thread(out.get, True, 120)
    proc.join()
    return {
        "idle_first_call_ms": [round(x * 1000, 1) for x in idle],
        "flooded_first_call_ms": [round(x * 1000, 1) if x > 0 else f"HTTP {-x:.0f}" for x in loaded],
        "flooded_median_ms": round(statistics.median(served) * 1000, 1) if served else None,
        "flooded_max_ms": round(max(served) * 1000, 1) if served else None,
        "refused": len(loaded) - len(served),
        "flood_responses": codes,
        "flooded_for_s": round(flood_seconds, 1),
    }


def cmd_wrongpw(args: argparse.Namespace) -> None:
    sites = {f"client{i}": f"pw-{i}" for i in range(2 * args.samples)} | {"flooded": "right"}
    with server(args.src, sites, workers=args.workers) as (base, _proc):
        out = asyncio.run(
            _wrongpw(base, sites, args.flood, args.flood_addr, args.samples, args.stale, args.same_site)
        )
    out.update(
        scenario="wrongpw",
        flood=args.flood,
        flood_addr=args.flood_addr,
        stale=args.stale,
        same_site=args.same_site,
        workers=args.workers,
        src=str(args.src),
    )
    print(json.dumps(out))
