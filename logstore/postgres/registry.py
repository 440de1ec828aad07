"""The site registry (sites and their scrypt password entries) in PostgreSQL, shared by every server.

The ``logstore.core.registry.SiteRegistry`` protocol with the file registry's entry format:
``location / identity / load / sites / add / set_password / remove``. Each change runs in one
transaction that also bumps ``logstore_schema.registry_version``; ``identity()`` is that counter, so a
server notices any change (from any process) by reading one row.

``identity()`` and ``load()`` are called by the server's authenticator on the event loop, so they must not
block on the network: once ``identity()`` has been called, a daemon thread polls the counter every
``poll_interval`` seconds (reloading the entries when it moved) and both methods answer from that snapshot.
Only the very first call reads synchronously. The CLI's calls (``add`` and the rest) are plain blocking
calls on their own short connection.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg

from ..core.registry import RegistryEdits, SiteEntry
from .schema import connect_checked
from .settings import ClientSettings, split_url
from .watchdog import Watchdog, fileno

__all__ = ["PostgresRegistry"]

_BUMP = "UPDATE logstore_schema SET registry_version = registry_version + 1 WHERE id"


class PostgresRegistry(RegistryEdits):
    def __init__(self, conninfo: str, *, poll_interval: float = 1.0) -> None:
        self.conninfo = conninfo
        self._libpq, own = split_url(conninfo)  # the store URL's bounds (settings.py)
        self._call_timeout = float(own.get("call_timeout", ClientSettings.call_timeout))
        self._deadlines = Watchdog("logstore-registry-deadlines")
        self.poll_interval = poll_interval
        self._lock = threading.Lock()
        self._snapshot: tuple[int, dict[str, dict[str, Any]]] | None = None
        self._poller: threading.Thread | None = None
        self._stop = threading.Event()

    @property
    def location(self) -> str:
        """What messages name: the database (without credentials) and the table."""
        return "postgresql logstore_sites"

    # --- reading (served from a polled snapshot once identity() was called) --------------------------
    def identity(self) -> int | None:
        return self._current()[0]

    def load(self) -> dict[str, dict[str, Any]]:
        snapshot = self._snapshot
        return dict(snapshot[1]) if snapshot is not None else self._read()[1]

    def sites(self) -> list[str]:
        return sorted(self._read()[1])

    def close(self) -> None:
        self._stop.set()

    def _current(self) -> tuple[int, dict[str, dict[str, Any]]]:
        with self._lock:
            if self._snapshot is None:
                self._snapshot = self._read()
            if self._poller is None:
                self._poller = threading.Thread(target=self._poll, name="logstore-registry", daemon=True)
                self._poller.start()
            return self._snapshot

    def _poll(self) -> None:
        conn: psycopg.Connection | None = None
        while not self._stop.wait(self.poll_interval):
            try:
                if conn is None or conn.closed:
                    conn = psycopg.connect(self._libpq, autocommit=True)
                # A silent network must not freeze the snapshot for good: the poll has a deadline too.
                armed = self._deadlines.arm(fileno(conn), time.monotonic() + self._call_timeout)
                try:
                    row = conn.execute("SELECT registry_version FROM logstore_schema WHERE id").fetchone()
                    if row is not None and self._snapshot is not None and row[0] == self._snapshot[0]:
                        continue
                    self._snapshot = self._read(conn)
                finally:
                    self._deadlines.disarm(armed)
            except psycopg.Error:  # keep serving the last snapshot; the next poll reconnects
                if conn is not None:
                    conn.close()
                conn = None
        if conn is not None:
            conn.close()
        self._deadlines.stop()

    def _read(self, conn: psycopg.Connection | None = None) -> tuple[int, dict[str, dict[str, Any]]]:
        if conn is None:
            with connect_checked(self._libpq, autocommit=True) as own:
                return self._read(own)
        with conn.transaction():  # the counter and the rows from one snapshot
            conn.execute("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ")
            version = conn.execute("SELECT registry_version FROM logstore_schema WHERE id").fetchone()
            rows = conn.execute("SELECT site, credential FROM logstore_sites").fetchall()
        return (version[0] if version else 0), {site: json.loads(entry) for site, entry in rows}

    # --- writing (the rules: ``RegistryEdits``) ----------------------------------------------------
    def _edit(self, sql: str, params: tuple[object, ...]) -> int:
        with connect_checked(self._libpq) as conn, conn.transaction():
            changed = conn.execute(sql, params).rowcount
            if changed:
                conn.execute(_BUMP)
            return changed

    def _insert(self, site: str, entry: SiteEntry) -> bool:
        return bool(
            self._edit(
                "INSERT INTO logstore_sites (site, credential) VALUES (%s, %s) ON CONFLICT (site) DO NOTHING",
                (site, json.dumps(entry)),
            )
        )

    def _change(self, site: str, change: Callable[[SiteEntry], SiteEntry]) -> bool:
        with connect_checked(self._libpq) as conn, conn.transaction():
            row = conn.execute(
                "SELECT credential FROM logstore_sites WHERE site = %s FOR UPDATE", (site,)
            ).fetchone()
            if row is None:
                return False
            entry = change(json.loads(row[0]))
            conn.execute(
                "UPDATE logstore_sites SET credential = %s WHERE site = %s", (json.dumps(entry), site)
            )
            conn.execute(_BUMP)
        return True

    def _delete(self, site: str) -> bool:
        return bool(self._edit("DELETE FROM logstore_sites WHERE site = %s", (site,)))
