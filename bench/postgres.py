"""P9/P10: ``PostgresStore.append`` against a raw psycopg loop on the same database, same run; P11: one
``list_conversations(limit=50)`` page at the profile's largest P5 size (1M conversations in the full
profile), first and deep pages from cursors at random positions.

The baseline is the least any client must do for the same durable rows: one connection per writer, one
transaction per batch inserting the batch's rows (same table, same pre-encoded payload bytes, seqs from a
local counter) with ``executemany`` (pipelined), committed with synchronous_commit on. The engine adds
validation and JSON encoding, the seq allocation under the conversation row's lock, ``recorded_at`` and the
listing columns, and the pool; it runs the whole batch as one statement (one round trip).

P6-pg: P6 rerun on PostgreSQL: ``logstore serve --store postgresql://...`` against ``logstore serve
--data-dir`` (the file engine), 1 worker each, the same light MCP client load (``bench.load``, 16 clients
appending 10 x 200 B items), rounds alternating the order.

The database: ``$LOGSTORE_BENCH_POSTGRES_URL`` (loopback only), else a bundled ``pgserver`` started in the
scratch directory (PostgreSQL 16 on a Unix socket).
"""

from __future__ import annotations

import contextlib
import itertools
import os
import shutil
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from typing import Any

from logstore.core.limits import MAX_CONVERSATION_ITEMS

from .config import Profile, make_items
from .stats import Goal, Row, fig, p50, paired_ratio, run_threads

__all__ = ["measure_postgres", "measure_mcp_postgres", "postgres_url", "raw_writer"]

SITE = "bench"
_ITEM, _BATCH = 200, 10
_RAW_INSERT = (
    "INSERT INTO logstore_items (site, conversation_id, seq, recorded_at, payload) "
    "VALUES (%s, %s, %s, statement_timestamp(), %b)"
)
_runs = itertools.count()


@contextlib.contextmanager
def postgres_url(directory: str) -> Iterator[str]:
    """A migrated database for one measure: a fresh schema on the external URL, or a pgserver in a
    scratch directory of its own (``directory`` is the caller's scratch space, not used for the server)."""
    import psycopg

    from logstore.postgres import migrate

    external = os.environ.get("LOGSTORE_BENCH_POSTGRES_URL")
    if external:
        schema = f"bench_{os.getpid()}_{next(_runs)}"
        with psycopg.connect(external, autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {schema}")
        try:
            url = f"{external}{'&' if '?' in external else '?'}options=-csearch_path%3D{schema}"
            migrate(url)
            yield url
        finally:
            with psycopg.connect(external, autocommit=True) as conn:
                conn.execute(f"DROP SCHEMA {schema} CASCADE")
        return
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # platformdirs: XDG_RUNTIME_DIR not set
        import pgserver
        from pgserver._commands import pg_ctl

        # Not under ``directory``: under pytest that is inside its 0700 base temp, which the server's own
        # user (pgserver runs it as another user when we are root) cannot enter once another pytest run
        # resets it. tests/postgres_support.py does the same.
        base = tempfile.mkdtemp(prefix="logstore-bench-pg-")
        os.chmod(base, 0o777)
        server = pgserver.get_server(os.path.join(base, "pgdata"), cleanup_mode=None)
    try:
        migrate(server.get_uri())
        yield server.get_uri()
    finally:
        try:
            pg_ctl(["-m", "immediate", "-w", "stop"], pgdata=server.pgdata, user=server.system_user)
        finally:
            shutil.rmtree(base, ignore_errors=True)


def raw_writer(url: str, payloads: list[bytes], cid: str) -> tuple[Any, Callable[[], None]]:
    """(connection, step): each step inserts ``payloads`` as the next rows of ``cid`` in one transaction
    (``executemany``, pipelined), committed with the server's synchronous_commit. The least a client does."""
    import psycopg

    conn = psycopg.connect(url)
    seq = itertools.count()

    def step() -> None:
        with conn.transaction(), conn.cursor() as cur:
            cur.executemany(_RAW_INSERT, [(SITE, cid, next(seq), p) for p in payloads])

    return conn, step


def _raw_loop(url: str, payloads: list[bytes], writers: int, duration: float) -> float:
    run = next(_runs)
    conns: list[Any] = []

    def setup(i: int) -> Callable[[], object]:
        conn, step = raw_writer(url, payloads, f"raw{run:04d}-w{i:02d}")
        conns.append(conn)
        return step

    try:
        count, elapsed = run_threads(writers, setup, duration)
    finally:
        for conn in conns:
            conn.close()
    return count / elapsed


def _engine(store: Any, items: list[dict[str, Any]], writers: int, duration: float) -> float:
    run = next(_runs)

    def setup(i: int) -> Callable[[], object]:
        cid = f"eng{run:04d}-w{i:02d}"
        return lambda: store.append(SITE, cid, items)

    count, elapsed = run_threads(writers, setup, duration, max_ops=MAX_CONVERSATION_ITEMS // _BATCH)
    return count / elapsed


_FILL = """INSERT INTO logstore_conversations
SELECT %s, 'conv-' || lpad(g::text, 8, '0'), 1, t, t FROM generate_series(1, %s) g,
    LATERAL (SELECT now() - g * interval '1 ms' - (g %% 7) * interval '1 us') AS x(t)"""


def _listing(store: Any, url: str, size: int, calls: int, runs: int) -> Row:
    import random

    import psycopg

    from logstore.core.cursor import CursorCodec, CursorKey
    from logstore.core.models import datetime_to_micros

    site = f"list{next(_runs)}"
    with psycopg.connect(url, autocommit=True) as conn:  # rows written directly: P9/P10 time appends
        conn.execute(_FILL, (site, size))
        conn.execute("ANALYZE logstore_conversations")
        keys = conn.execute(
            "SELECT last_appended_at, conversation_id FROM logstore_conversations WHERE site = %s"
            " ORDER BY random() LIMIT %s",
            (site, calls),
        ).fetchall()
    codec = CursorCodec(store._cursor_key, site)
    cursors = [None] + [codec.encode(CursorKey(datetime_to_micros(at), cid)) for at, cid in keys]
    medians, rows = [], 0
    for _ in range(runs):
        samples = []
        for cursor in random.sample(cursors, len(cursors)):
            t0 = time.perf_counter()
            page = store.list_conversations(site, cursor, 50)
            samples.append((time.perf_counter() - t0) * 1000)
            rows += len(page.conversations)
        medians.append(p50(samples))
    return Row(
        "P11",
        f"postgres: list_conversations(limit=50) p50 at {size:,} conversations",
        "ms",
        value=fig(medians),
        goal=Goal("<=", 2.0, "<= 2 ms"),
        note=f"{len(cursors)} pages/run (first + random cursors), {rows / runs / len(cursors):.1f} rows/page",
    )


def measure_postgres(profile: Profile, directory: str) -> list[Row]:
    from logstore.core.batch import prepare_batch
    from logstore.postgres import PostgresStore

    items = make_items(_BATCH, _ITEM)
    payloads = list(prepare_batch(items).items)
    n = profile.threads
    rates: dict[str, list[float]] = {k: [] for k in ("raw1", "eng1", "rawN", "engN")}
    with postgres_url(directory) as url, PostgresStore(url, pool_size=n) as store:
        for r in range(profile.runs):
            jobs: list[tuple[str, Callable[[], float]]] = [
                ("raw1", lambda: _raw_loop(url, payloads, 1, profile.duration)),
                ("eng1", lambda: _engine(store, items, 1, profile.duration)),
                ("rawN", lambda: _raw_loop(url, payloads, n, profile.duration)),
                ("engN", lambda: _engine(store, items, n, profile.duration)),
            ]
            k = r % len(jobs)
            for name, job in jobs[k:] + jobs[:k]:
                rates[name].append(job())
        listing = _listing(store, url, max(profile.listing_sizes), profile.list_calls, profile.runs)
    note = f"PostgreSQL, batches of {_BATCH} items x {_ITEM} B, one transaction per batch"
    return [
        Row(
            "P9",
            "postgres: 1 writer, batch 10 x 200 B vs raw psycopg loop",
            "batches/s",
            value=fig(rates["eng1"]),
            baseline=fig(rates["raw1"]),
            baseline_name="raw psycopg, 1 conn",
            ratio=paired_ratio(rates["eng1"], rates["raw1"]),
            goal=Goal(">=", 0.80, ">= 0.80x raw"),
            note=note,
        ),
        Row(
            "P10",
            f"postgres: {n} writers on {n} conversations vs raw {n}-connection loop",
            "batches/s",
            value=fig(rates["engN"]),
            baseline=fig(rates["rawN"]),
            baseline_name=f"raw psycopg, {n} conns",
            ratio=paired_ratio(rates["engN"], rates["rawN"]),
            goal=Goal(">=", 0.80, f">= 0.80x raw {n}-connection"),
            note=note,
        ),
        listing,
    ]


def measure_mcp_postgres(profile: Profile, directory: str) -> list[Row]:
    import secrets

    from logstore.file.credentials import CredentialsFile
    from logstore.postgres.registry import PostgresRegistry

    from .load import SITE as MCP_SITE
    from .load import drive_subprocess
    from .mcp_calls import running_server

    password = secrets.token_urlsafe(16)
    data_dir = os.path.join(directory, "mcp-file")
    rates: dict[str, list[float]] = {"postgres": [], "file": []}
    cores: dict[str, list[float]] = {"postgres": [], "file": []}
    with postgres_url(directory) as url, contextlib.ExitStack() as stack:
        PostgresRegistry(url).add(MCP_SITE, password)
        CredentialsFile(data_dir).add(MCP_SITE, password)
        servers = {
            name: stack.enter_context(
                running_server(["tools.cli", "serve", *where, "--log-level", "warning"])
            )
            for name, where in (("postgres", ["--store", url]), ("file", ["--data-dir", data_dir]))
        }
        for r in range(profile.runs):
            for name in ("postgres", "file") if r % 2 == 0 else ("file", "postgres"):
                mcp_url, pid = servers[name]
                result = drive_subprocess(
                    mcp_url,
                    password,
                    "append_memory",
                    clients=profile.mcp_clients,
                    seconds=profile.mcp_seconds,
                    kind="light",
                    server_pid=pid,
                )
                rates[name].append(result["rate"])
                cores[name].append(1000 * result["server_cpu_s"] / max(result["calls"], 1))
    return [
        Row(
            "P6-pg",
            f"{profile.mcp_clients} clients append_memory over streamable HTTP, 1 worker: "
            "serve --store postgresql:// vs --data-dir (file engine)",
            "calls/s",
            value=fig(rates["postgres"]),
            baseline=fig(rates["file"]),
            baseline_name="file engine, same run",
            ratio=paired_ratio(rates["postgres"], rates["file"]),
            note=(
                "10 x 200 B items per call, light client; server CPU per call "
                f"{fig(cores['postgres']).median:.2f} ms (postgres) vs {fig(cores['file']).median:.2f} ms "
                "(file); PostgreSQL 16 on the same machine and disk"
            ),
        )
    ]
