"""Hostile-load figures for docs/SECURITY.md (by hand, never in the default tests; loopback only).

    python -m bench.hostile wrongpw  [--src DIR]   # a correct new client's first call under a password flood
        [--flood-addr spread:256] [--stale] [--workers N]   # the two shapes of issue 22 (hostile_flood)
    python -m bench.hostile bodies   [--src DIR]   # peak RSS and /healthz stalls under 12 maximum-size bodies
    python -m bench.hostile mixed --workers N      # 64 clients, mixed tools: calls/s, p50/p99, errors, RSS
    python -m bench.hostile sessions [--src DIR]   # one site opening many legacy sessions; another site after
    python -m bench.hostile headers  [--src DIR]   # one request with 2,500 / 5,000 / 10,000 tiny headers

Each scenario starts its own ``logstore serve`` on 127.0.0.1 with a fresh data dir and prints one JSON line.
``--src DIR`` runs the server from another source tree (e.g. ``git archive <commit>`` unpacked), which is
how the before/after pairs are measured on the same machine in the same hour. Every loop is bounded in
count and time. The server harness and request shapes are ``hostile_server``; the wrongpw scenario is
``hostile_flood``; the others are here.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import multiprocessing
import random
import statistics
import sys
import time
from collections import Counter
from pathlib import Path
from typing import Any

import httpx2

from .hostile_flood import cmd_wrongpw
from .hostile_server import (
    INIT,
    REPO,
    basic,
    modern_headers,
    outcome,
    peak_rss_mib,
    rss_mib,
    server,
    tool_call,
)

# --- maximum-size hostile bodies -----------------------------------------------------------------


def hostile_body(size: int) -> bytes:
    """An append whose items are ``{}`` repeated to exactly ``size`` bytes: the most objects per byte."""
    head = json.dumps(tool_call("append_memory", {"conversation_id": "conversation-1", "items": []}))
    prefix, suffix = head.split('"items": []')
    prefix += '"items": ['
    suffix = "]" + suffix
    room = size - len(prefix) - len(suffix)
    count = (room + 1) // 3
    body = prefix + ",".join(["{}"] * count) + suffix
    return body.encode() + b" " * (size - len(body))


async def _legacy_session(http: httpx2.AsyncClient, base: str, authorization: str) -> dict[str, str]:
    """Open a 2025-11-25 session; the headers its requests carry."""
    headers = {"Authorization": authorization, "Content-Type": "application/json"}
    headers["Accept"] = "application/json, text/event-stream"
    r = await http.post(base + "/mcp", json=INIT, headers=headers)
    headers |= {"Mcp-Session-Id": r.headers["mcp-session-id"], "MCP-Protocol-Version": "2025-11-25"}
    await http.post(
        base + "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=headers
    )
    return headers


async def _bodies(base: str, size: int, parallel: int, pid: int, era: str) -> dict[str, Any]:
    body = hostile_body(size)
    if era == "legacy":
        body = body.replace(b'"_meta"', b'"_mex_"', 1)  # no 2026 envelope; same size
    headers = modern_headers(basic("alpha", "alpha-pw"), "append_memory")
    stalls: list[float] = []
    done = asyncio.Event()

    async def probe() -> None:
        async with httpx2.AsyncClient(timeout=30) as http:
            while not done.is_set():
                start = time.perf_counter()
                await http.get(base + "/healthz")
                stalls.append(time.perf_counter() - start)
                await asyncio.sleep(0.02)

    async with httpx2.AsyncClient(timeout=300, limits=httpx2.Limits(max_connections=parallel + 2)) as http:
        await http.post(
            base + "/mcp",
            json=tool_call("recall_memory", {"conversation_id": "conversation-1"}),
            headers=modern_headers(basic("alpha", "alpha-pw"), "recall_memory"),
        )  # auth cached
        if era == "legacy":
            sessions = [
                await _legacy_session(http, base, basic("alpha", "alpha-pw")) for _ in range(parallel)
            ]
        else:
            sessions = [headers] * parallel
        rss_before = rss_mib(pid)
        prober = asyncio.create_task(probe())
        start = time.perf_counter()
        results = await asyncio.gather(
            *(http.post(base + "/mcp", content=body, headers=h) for h in sessions),
            return_exceptions=True,
        )
        elapsed = time.perf_counter() - start
        done.set()
        await prober
    codes = Counter(outcome(r) if isinstance(r, httpx2.Response) else type(r).__name__ for r in results)
    return {
        "body_bytes": size,
        "parallel": parallel,
        "rss_before_mib": round(rss_before, 1),
        "peak_rss_mib": round(peak_rss_mib(pid), 1),
        "rss_after_mib": round(rss_mib(pid), 1),
        "seconds": round(elapsed, 2),
        "healthz_max_ms": round(max(stalls) * 1000, 1),
        "healthz_p50_ms": round(statistics.median(stalls) * 1000, 1),
        "outcomes": dict(codes),
    }


def cmd_bodies(args: argparse.Namespace) -> None:
    with server(args.src, {"alpha": "alpha-pw"}) as (base, proc):
        out = asyncio.run(_bodies(base, args.size, args.parallel, proc.pid, args.era))
    out.update(scenario="bodies", era=args.era, src=str(args.src))
    print(json.dumps(out))


# --- legacy session storm ------------------------------------------------------------------------


async def _sessions(base: str, count: int, pid: int) -> dict[str, Any]:
    headers = {"Content-Type": "application/json", "Accept": "application/json, text/event-stream"}
    codes: Counter = Counter()
    rss_before = rss_mib(pid)
    async with httpx2.AsyncClient(timeout=60, limits=httpx2.Limits(max_connections=32)) as http:
        sem = asyncio.Semaphore(32)

        async def one(site: str, password: str) -> str:
            async with sem:
                r = await http.post(
                    base + "/mcp", json=INIT, headers=headers | {"Authorization": basic(site, password)}
                )
                return f"http-{r.status_code}"

        start = time.perf_counter()
        for outcome in await asyncio.gather(*(one("alpha", "alpha-pw") for _ in range(count))):
            codes[outcome] += 1
        elapsed = time.perf_counter() - start
        rss_storm = rss_mib(pid)
        other = await one("beta", "beta-pw")
    return {
        "sessions_attempted": count,
        "seconds": round(elapsed, 1),
        "outcomes": dict(codes),
        "other_site_initialize": other,
        "rss_before_mib": round(rss_before, 1),
        "rss_after_storm_mib": round(rss_storm, 1),
        "peak_rss_mib": round(peak_rss_mib(pid), 1),
    }


def cmd_sessions(args: argparse.Namespace) -> None:
    with server(args.src, {"alpha": "alpha-pw", "beta": "beta-pw"}) as (base, proc):
        out = asyncio.run(_sessions(base, args.count, proc.pid))
        time.sleep(args.settle)
        out["rss_after_settle_mib"] = round(rss_mib(proc.pid), 1)
    out.update(scenario="sessions", src=str(args.src), settle_s=args.settle)
    print(json.dumps(out))


# --- header count -------------------------------------------------------------------------------


async def _headers(base: str, count: int) -> dict[str, Any]:
    """One request whose header block (``count`` lines ``xN:v``) arrives in one write; its answer time."""
    auth = basic("alpha", "alpha-pw")
    body = json.dumps(tool_call("recall_memory", {"conversation_id": "conversation-1"})).encode()
    async with httpx2.AsyncClient(timeout=60) as http:
        await http.post(
            base + "/mcp", content=body, headers=modern_headers(auth, "recall_memory")
        )  # cache auth
    host, port = base.removeprefix("http://").split(":")
    lines = [f"{k}: {v}" for k, v in modern_headers(auth, "recall_memory").items()]
    lines += [f"x{i}:v" for i in range(count)] + [f"Content-Length: {len(body)}", f"Host: {host}"]
    request = ("POST /mcp HTTP/1.1\r\n" + "\r\n".join(lines) + "\r\n\r\n").encode() + body
    reader, writer = await asyncio.open_connection(host, int(port))
    start = time.perf_counter()
    writer.write(request)
    status = await asyncio.wait_for(reader.readline(), 60)
    elapsed = time.perf_counter() - start
    writer.close()
    return {
        "headers": count,
        "bytes": len(request),
        "status": status.decode().strip(),
        "ms": round(elapsed * 1000, 1),
    }


def cmd_headers(args: argparse.Namespace) -> None:
    with server(args.src, {"alpha": "alpha-pw"}) as (base, _proc):
        runs = [asyncio.run(_headers(base, n)) for n in (2500, 5000, 10_000)]
    print(json.dumps({"scenario": "headers", "runs": runs, "src": str(args.src)}))


# --- 64-client mixed run -------------------------------------------------------------------------

_MIX = ["append_memory"] * 5 + ["recall_memory"] * 3 + ["replay_memory", "list_conversations"]


def _arguments(tool: str, cid: str) -> dict[str, Any]:
    if tool == "append_memory":
        return {"conversation_id": cid, "items": [{"role": "user", "text": "x" * 200}]}
    if tool == "recall_memory":
        return {"conversation_id": cid, "count": 20}
    if tool == "replay_memory":
        return {"conversation_id": cid, "offset": 0, "limit": 20}
    return {"limit": 20}


async def _mixed_clients(base: str, clients: int, seconds: float, seed: int) -> dict[str, Any]:
    auth = basic("alpha", "alpha-pw")
    latencies: list[float] = []
    codes: Counter = Counter()
    rng = random.Random(seed)
    limits = httpx2.Limits(max_connections=clients, max_keepalive_connections=clients)
    async with httpx2.AsyncClient(timeout=60, limits=limits) as http:

        async def one(k: int) -> None:
            cid = f"mixed-{seed}-{k:04d}"
            deadline = time.monotonic() + seconds
            for n in range(1_000_000):
                if time.monotonic() >= deadline:
                    return
                tool = "append_memory" if n == 0 else rng.choice(_MIX)
                start = time.perf_counter()
                try:
                    r = await http.post(
                        base + "/mcp",
                        json=tool_call(tool, _arguments(tool, cid), n),
                        headers=modern_headers(auth, tool),
                    )
                    codes[outcome(r)] += 1
                except httpx2.HTTPError as exc:
                    codes[type(exc).__name__] += 1
                latencies.append(time.perf_counter() - start)

        await asyncio.gather(*(one(k) for k in range(clients)))
    return {"latencies": latencies, "codes": dict(codes)}


def _mixed_process(args: tuple[Any, ...], out: Any) -> None:
    out.put(asyncio.run(_mixed_clients(*args)))


def cmd_mixed(args: argparse.Namespace) -> None:
    with server(args.src, {"alpha": "alpha-pw"}, workers=args.workers) as (base, proc):
        # Warm the credential cache in every worker (each runs its own scrypt once).
        for _ in range(4 * args.workers):
            httpx2.post(
                base + "/mcp",
                json=tool_call("list_conversations", {}),
                headers=modern_headers(basic("alpha", "alpha-pw"), "list_conversations"),
                timeout=30,
            )
        rss_before = rss_mib(proc.pid)
        ctx = multiprocessing.get_context("spawn")
        out = ctx.Queue()
        shares = [args.clients // args.processes] * args.processes
        procs = [
            ctx.Process(target=_mixed_process, args=((base, n, args.seconds, i), out))
            for i, n in enumerate(shares)
        ]
        start = time.monotonic()
        for p in procs:
            p.start()
        samples = []
        results = []
        while len(results) < len(procs):
            with contextlib.suppress(Exception):
                results.append(out.get(timeout=0.5))
            samples.append(rss_mib(proc.pid))
            if time.monotonic() - start > args.seconds + 120:
                raise RuntimeError("mixed run did not finish")
        for p in procs:
            p.join()
        elapsed = time.monotonic() - start
    latencies = sorted(x for r in results for x in r["latencies"])
    codes: Counter = Counter()
    for r in results:
        codes.update(r["codes"])
    print(
        json.dumps(
            {
                "scenario": "mixed",
                "workers": args.workers,
                "clients": args.clients,
                "client_processes": args.processes,
                "seconds": round(elapsed, 1),
                "calls": len(latencies),
                "calls_per_s": round(len(latencies) / args.seconds, 1),
                "p50_ms": round(latencies[len(latencies) // 2] * 1000, 1),
                "p99_ms": round(latencies[int(len(latencies) * 0.99)] * 1000, 1),
                "outcomes": dict(codes),
                "rss_before_mib": round(rss_before, 1),
                "rss_max_during_mib": round(max(samples), 1),
                "src": str(args.src),
            }
        )
    )


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.hostile")
    sub = parser.add_subparsers(dest="command", required=True)

    def add(name: str, func: Any) -> argparse.ArgumentParser:
        p = sub.add_parser(name)
        p.add_argument("--src", type=Path, default=REPO, help="source tree to run the server from")
        p.set_defaults(func=func)
        return p

    p = add("wrongpw", cmd_wrongpw)
    p.add_argument("--flood", type=int, default=256, help="concurrent wrong-password requests")
    p.add_argument(
        "--flood-addr",
        default="127.0.0.2",
        help="loopback address the flood comes from, or spread:N for N addresses (127.0.150.x)",
    )
    p.add_argument(
        "--stale",
        action="store_true",
        help="the flood repeats one stale password per timed client's site, from the timed clients' address",
    )
    p.add_argument("--workers", type=int, default=1)
    p.add_argument(
        "--same-site",
        action="store_true",
        help="fresh wrong passwords for the timed clients' own sites (the shape fair shares cannot defend)",
    )
    p.add_argument("--samples", type=int, default=5, help="new correct clients timed (idle, then flooded)")
    p = add("bodies", cmd_bodies)
    p.add_argument("--size", type=int, default=4 * 1024 * 1024, help="body bytes")
    p.add_argument("--parallel", type=int, default=12)
    p.add_argument("--era", choices=["modern", "legacy"], default="legacy")
    p = add("sessions", cmd_sessions)
    p.add_argument("--count", type=int, default=3000)
    p.add_argument("--settle", type=float, default=10.0, help="seconds to wait before the last RSS sample")
    add("headers", cmd_headers)
    p = add("mixed", cmd_mixed)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--clients", type=int, default=64)
    p.add_argument("--processes", type=int, default=2, help="client processes")
    p.add_argument("--seconds", type=float, default=15.0)
    args = parser.parse_args(argv)
    if args.src != REPO and not (args.src / "server").is_dir():
        parser.error(f"{args.src} is not a logstore source tree")
    args.func(args)


if __name__ == "__main__":
    main(sys.argv[1:])
