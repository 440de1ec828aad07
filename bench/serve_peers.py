"""P6-redis, P6-psql, P6-engine: ``logstore serve --workers 2`` against the stores an agent platform would
otherwise run, same run, same machine, 16 writers each appending 10 x 200 B items to its own conversation
as fast as each batch is acknowledged, rounds rotating the order of the four:

- ``serve --workers 2`` (file engine; auth, limits, metrics, access log on), light MCP clients
  (``bench.load``);
- Redis Streams, ``appendfsync always``, redis-py, a MULTI/EXEC of 10 XADDs per batch
  (``bench.redis_peer``: the bench's own redis-server on loopback);
- PostgreSQL INSERTs via psycopg, 10 rows in one transaction per batch, synchronous_commit on
  (``bench.postgres``: its pgserver in its own pgdata, or ``$LOGSTORE_BENCH_POSTGRES_URL``);
- the embedded engine: 16 threads calling ``Store.append`` in one process (reference, no goal).

Each load runs in a process of its own (``bench.load``, ``bench.peer_load``), so its CPU is measured apart
from the server's: CPU per batch of each server (all its processes and threads, from /proc) and of each
client. Before the rounds, one writer's batches run alone under strace on each server to show that every
acknowledgement waits for an fsync (``bench.fsync_trace``); during the rounds, perf counts each server's
syncs per batch under load (``bench.perf_syncs``: how many batches share one). docs/PERFORMANCE.md
("Peers and --workers 2") reads the figures, and why a loaded machine flatters some sides.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import uuid
from collections.abc import Callable
from typing import Any

from .config import Profile, make_items
from .fsync_trace import fsyncs_per_batch
from .load import SITE, LightClient, drive_subprocess, tool_arguments
from .mcp_calls import _free_port, _new_site, running_server
from .peer_load import ITEMS, SIZE, drive_peer
from .perf_syncs import counting_syncs
from .postgres import postgres_url, raw_writer
from .procfs import children
from .redis_peer import redis_missing, redis_writer, running_redis
from .stats import Figure, Goal, Row, fig, paired_ratio

__all__ = ["measure_serve_peers"]

_TRACED_BATCHES = 20
Result = dict[str, Any]


def _serve_writer(url: str, password: str) -> tuple[Callable[[], None], Callable[[], None]]:
    """(close, step): one light MCP client on a loop of its own, one append per step."""
    loop = asyncio.new_event_loop()
    client = LightClient(url, SITE, password)
    loop.run_until_complete(client.__aenter__())
    args = tool_arguments("append_memory", f"fsync-{uuid.uuid4().hex[:12]}")

    def close() -> None:
        loop.run_until_complete(client.__aexit__(None, None, None))
        loop.close()

    def step() -> None:
        loop.run_until_complete(client.call("append_memory", args))

    return close, step


def _traced(
    pids: Callable[[], list[int]],
    setup: Callable[[], tuple[Callable[[], object], Callable[[], object]]],
    directory: str,
) -> float | None:
    """fsyncs per batch of one writer alone; ``pids`` is read once its connection exists (a PostgreSQL
    backend is forked for it)."""
    close, step = setup()
    try:
        step()  # connection and conversation exist before strace attaches
        return fsyncs_per_batch(pids(), step, _TRACED_BATCHES, directory)
    finally:
        close()


def _tree(pid: int) -> Callable[[], list[int]]:
    return lambda: [pid, *children(pid)]


def _postgres_facts(url: str) -> tuple[int | None, str]:
    """(postmaster pid if this machine's data directory can be read, durability settings)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        settings = {
            name: conn.execute(f"SHOW {name}").fetchone()[0]  # type: ignore[index]
            for name in ("server_version", "synchronous_commit", "fsync", "wal_sync_method")
        }
        try:
            data_dir = conn.execute("SHOW data_directory").fetchone()[0]  # type: ignore[index]
            with open(os.path.join(data_dir, "postmaster.pid")) as f:
                pid: int | None = int(f.readline())
        except (psycopg.Error, OSError, ValueError):
            pid = None
    version = settings.pop("server_version").split()[0]
    return pid, f"PostgreSQL {version}, " + ", ".join(f"{k}={v}" for k, v in settings.items())


def _ms(results: list[Result], key: str) -> Figure:
    return fig([1000 * r[key] / max(r["calls"], 1) for r in results if key in r])


def _fsyncs(value: float | None) -> str:
    return "fsyncs not counted (no strace)" if value is None else f"{value:.2f} fsync/batch alone (strace)"


def measure_serve_peers(profile: Profile, directory: str) -> list[Row]:
    clients, seconds = profile.mcp_clients, profile.mcp_seconds
    runs: dict[str, Callable[[], Result]] = {}
    after: dict[str, Callable[[], None]] = {}
    sync_pids: dict[str, Callable[[], list[int]]] = {}  # whose fsyncs perf counts under load
    fsyncs: dict[str, float | None] = {}
    results: dict[str, list[Result]] = {}
    redis_skip = redis_missing()
    load0 = os.getloadavg()[0]
    with contextlib.ExitStack() as stack:
        serve_dir = os.path.join(directory, "serve")
        password = _new_site(serve_dir)
        cmd = ["tools.cli", "serve", "--data-dir", serve_dir, "--workers", "2", "--log-level", "warning"]
        url, pid = stack.enter_context(running_server(cmd, new_session=True))
        sync_pids["serve"] = _tree(pid)
        fsyncs["serve"] = _traced(sync_pids["serve"], lambda: _serve_writer(url, password), directory)
        runs["serve"] = lambda: drive_subprocess(
            url, password, "append_memory", clients=clients, seconds=seconds, kind="light", server_pid=pid
        )

        pg_url = stack.enter_context(postgres_url(directory))
        pg_pid, pg_facts = _postgres_facts(pg_url)
        payloads = _payloads()
        if pg_pid is not None:
            sync_pids["postgres"] = _tree(pg_pid)  # the postmaster and its children (backends, WAL writer)
            fsyncs["postgres"] = _traced(
                sync_pids["postgres"],
                lambda: _closing(raw_writer(pg_url, payloads, f"fsync-{uuid.uuid4().hex[:12]}")),
                directory,
            )
        runs["postgres"] = lambda: drive_peer(
            "postgres", pg_url, clients=clients, seconds=seconds, server_pid=pg_pid or 0
        )

        engine_dir = os.path.join(directory, "engine")
        runs["engine"] = lambda: drive_peer("engine", engine_dir, clients=clients, seconds=seconds)

        if redis_skip is None:
            redis = stack.enter_context(running_redis(directory, _free_port()))
            sync_pids["redis"] = _tree(redis.pid)
            fsyncs["redis"] = _traced(
                sync_pids["redis"],
                lambda: _closing(redis_writer(redis.address, payloads, "fsync")),
                directory,
            )
            redis.reset()

            runs["redis"] = lambda: drive_peer(
                "redis", redis.address, clients=clients, seconds=seconds, server_pid=redis.pid
            )
            after["redis"] = redis.reset  # untimed: drop the streams, rewrite the AOF
        names = list(runs)
        for r in range(profile.runs):
            k = r % len(names)
            for name in names[k:] + names[:k]:
                with counting_syncs(sync_pids[name]() if name in sync_pids else []) as syncs:
                    result = runs[name]()
                results.setdefault(name, []).append({**result, "syncs": syncs.value})
                if name in after:
                    after[name]()
    load = f"load average {load0:.1f} -> {os.getloadavg()[0]:.1f}"
    return _rows(
        clients, results, fsyncs, pg_facts, redis_skip, redis.version if redis_skip is None else "", load
    )


def _payloads() -> list[bytes]:
    from logstore.core.batch import prepare_batch

    return list(prepare_batch(make_items(ITEMS, SIZE)).items)


def _closing(pair: tuple[Any, Callable[[], None]]) -> tuple[Callable[[], object], Callable[[], None]]:
    conn, step = pair
    return conn.close, step


def _side(name: str, results: list[Result], fsync: float | None) -> str:
    server, client = _ms(results, "server_cpu_s"), _ms(results, "client_cpu_s")
    if name == "engine":
        return f"engine: {client.median:.3f} ms process CPU/batch (writers and engine)"
    cpu = f"server {server.median:.3f} ms CPU/batch, " if server.samples else "server CPU not measured, "
    counted = [r["syncs"] / max(r["calls"], 1) for r in results if r.get("syncs") is not None]
    loaded = f", {fig(counted).median:.2f} under load (perf)" if counted else ""
    return f"{name}: {cpu}client {client.median:.3f} ms; {_fsyncs(fsync)}{loaded}"


def _rows(
    clients: int,
    results: dict[str, list[Result]],
    fsyncs: dict[str, float | None],
    pg_facts: str,
    redis_skip: str | None,
    redis_version: str,
    load: str,
) -> list[Row]:
    serve = [r["rate"] for r in results["serve"]]
    serve_side = _side("serve", results["serve"], fsyncs.get("serve"))
    batch = f"{ITEMS} x {SIZE} B items per batch, {clients} writers, each its own conversation"

    def row(row_id: str, peer: str, label: str, goal: Goal | None, facts: str) -> Row:
        rates = [r["rate"] for r in results[peer]]
        return Row(
            row_id,
            f"{clients} writers, 10 x 200 B batches: logstore serve --workers 2 vs {label}",
            "batches/s",
            value=fig(serve),
            baseline=fig(rates),
            baseline_name=label,
            ratio=paired_ratio(serve, rates),
            goal=goal,
            note=f"{batch}; {facts}; {serve_side}; {_side(peer, results[peer], fsyncs.get(peer))}",
            extra={"fsyncs_per_batch_alone": {k: fsyncs.get(k) for k in ("serve", peer) if k != "engine"}},
        )

    redis_label = "Redis Streams (appendfsync always, redis-py MULTI/EXEC of 10 XADD)"
    rows = []
    if redis_skip is not None:
        rows.append(
            Row(
                "P6-redis",
                f"logstore serve --workers 2 vs {redis_label}",
                "batches/s",
                note=f"skipped: {redis_skip}",
            )
        )
    else:
        rows.append(
            row("P6-redis", "redis", redis_label, Goal(">=", 0.5, ">= 0.5x Redis"), f"redis {redis_version}")
        )
    rows.append(
        row(
            "P6-psql",
            "postgres",
            "PostgreSQL INSERTs (psycopg, 10 rows per transaction)",
            Goal(">=", 0.8, ">= 0.8x PostgreSQL"),
            pg_facts,
        )
    )
    rows.append(
        row("P6-engine", "engine", f"the embedded engine ({clients} threads, Store.append)", None, load)
    )
    return rows
