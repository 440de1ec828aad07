"""A real PostgreSQL for the tests: the bundled ``pgserver`` (PostgreSQL 16, Unix socket only, started
once per session in a temporary directory), or an external database named by
``LOGSTORE_TEST_POSTGRES_URL`` (loopback only; the restart tests then skip).

Each test gets its own schema (``fresh_url``): the same tables in a new namespace selected with
``search_path``, so tests never see each other's rows and need no cleanup.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import secrets
import shutil
import signal
import tempfile
import threading
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

import psycopg
import pytest

from logstore.postgres import migrate

__all__ = [
    "shared_server",
    "PgServer",
    "postgres_server",
    "fresh_url",
    "with_search_path",
    "ReplicatedPair",
    "replicated_pair",
]

ENV_URL = "LOGSTORE_TEST_POSTGRES_URL"


@dataclass
class PgServer:
    url: str
    pgdata: Path | None  # None for an external database (cannot be restarted from here)
    system_user: str | None = None

    def pg_ctl(self, *args: str) -> None:
        if self.pgdata is None:
            pytest.skip(f"{ENV_URL} names an external database: cannot restart it")
        from pgserver._commands import pg_ctl

        pg_ctl(list(args), pgdata=self.pgdata, user=self.system_user, timeout=60)

    def stop(self, mode: str = "fast") -> None:
        self.pg_ctl("-m", mode, "-w", "stop")

    def start(self) -> None:
        # postmaster.opts keeps the socket options pgserver started it with; restart reuses them.
        self.pg_ctl("-w", "-t", "30", "restart")

    def restart(self, mode: str = "fast") -> None:
        self.pg_ctl("-m", mode, "-w", "-t", "30", "restart")


def with_search_path(url: str, schema: str) -> str:
    return f"{url}{'&' if '?' in url else '?'}options={quote(f'-csearch_path={schema}')}"


def fresh_url(server: PgServer, *, migrated: bool = True) -> str:
    """A URL whose tables live in a new, empty schema (migrated unless told otherwise)."""
    schema = "t_" + secrets.token_hex(6)
    with psycopg.connect(server.url, autocommit=True) as conn:
        conn.execute(f"CREATE SCHEMA {schema}")
    url = with_search_path(server.url, schema)
    if migrated:
        migrate(url)
    return url


_shared: list[PgServer] = []
_shared_lock = threading.Lock()


def shared_server() -> PgServer:
    """The session's database, started on first use (by the fixture or a contract-suite factory) and
    stopped when the test process exits."""
    with _shared_lock:
        if not _shared:
            _shared.append(_start_shared())
        return _shared[0]


def _start_shared() -> PgServer:
    external = os.environ.get(ENV_URL)
    if external:
        return PgServer(external, None)
    # Not under pytest's basetemp: concurrent pytest runs of the same user prune each other's old numbered
    # directories, which once removed a data directory while initdb was filling it.
    pgdata = Path(tempfile.mkdtemp(prefix="logstore-test-pg-")) / "data"
    with warnings.catch_warnings():  # platformdirs: "XDG_RUNTIME_DIR is not set" (it falls back to /tmp)
        warnings.simplefilter("ignore")
        import pgserver

        server = pgserver.get_server(pgdata, cleanup_mode=None)
    started = PgServer(server.get_uri(), pgdata, server.system_user)

    def stop() -> None:
        # Our own stop: a test's restart gave the postmaster a new pid that pgserver's cleanup misses.
        try:
            started.stop("immediate")
        except Exception:  # already stopped
            pass
        shutil.rmtree(pgdata.parent, ignore_errors=True)

    atexit.register(stop)
    return started


@pytest.fixture(scope="session")
def postgres_server() -> PgServer:
    return shared_server()


@dataclass
class ReplicatedPair:
    """A primary with one synchronous standby (``synchronous_standby_names = 'standby1'``)."""

    primary: PgServer
    standby: PgServer
    primary_pid: int

    def kill_primary(self) -> None:
        os.kill(self.primary_pid, signal.SIGKILL)  # the postmaster; its backends exit on its death

    def promote_standby(self) -> None:
        self.standby.pg_ctl("-w", "-t", "30", "promote")


@contextlib.contextmanager
def replicated_pair() -> Iterator[ReplicatedPair]:
    """pgserver's binaries: a fresh primary, ``pg_basebackup -R`` into a standby, both on Unix sockets
    in their own data directories; the primary waits for the standby's flush on every commit."""
    if os.environ.get(ENV_URL):
        pytest.skip(f"{ENV_URL} names an external database: the failover test needs its own servers")
    base = Path(tempfile.mkdtemp(prefix="logstore-test-pgpair-"))
    base.chmod(0o777)  # the server runs as its own user when we are root
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import pgserver
        from pgserver._commands import pg_basebackup

        server = pgserver.get_server(base / "primary", cleanup_mode=None)
    info = server.get_postmaster_info()
    primary = PgServer(server.get_uri(), base / "primary", server.system_user)
    standby_dir = base / "standby"
    standby = PgServer(
        f"postgresql://postgres:@/postgres?host={standby_dir}", standby_dir, server.system_user
    )
    try:
        pg_basebackup(
            [
                "-D",
                str(standby_dir),
                "-R",
                "-X",
                "stream",
                "-d",
                f"host={info.socket_dir} user=postgres application_name=standby1",
            ],
            user=server.system_user,
            timeout=60,
        )
        for leftover in standby_dir.glob(".s.PGSQL.*"):  # the primary's socket lock, copied with its dir
            leftover.unlink()
        standby.pg_ctl(
            "-w", "-t", "30", "-l", str(base / "standby.log"), "-o", f"-h '' -k {standby_dir}", "start"
        )
        with psycopg.connect(primary.url, autocommit=True) as conn:
            conn.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby1'")
            conn.execute("SELECT pg_reload_conf()")
            deadline = time.monotonic() + 30
            while (
                conn.execute("SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'").fetchone()[
                    0
                ]
                < 1
            ):
                assert time.monotonic() < deadline, "standby never became synchronous"
                time.sleep(0.05)
        yield ReplicatedPair(primary, standby, info.pid)
    finally:
        for node in (standby, primary):
            try:
                node.stop("immediate")
            except Exception:  # killed by the test, or never started
                pass
        shutil.rmtree(base, ignore_errors=True)
