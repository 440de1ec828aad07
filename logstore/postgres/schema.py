"""The PostgreSQL schema, its version, and the start-up checks a server runs before serving.

Every table is keyed by ``site`` first and every statement the backend runs names one site (and one
conversation, except listing), so a Citus deployment can distribute all of them by ``site`` (co-located)
and CockroachDB or YugabyteDB can run them unchanged: no sequences, no advisory locks, no LISTEN, no jsonb.

    logstore_schema          one row: schema version, the cursor-signing secret, and a counter bumped by
                             every change to the site registry (servers poll it; a reference table)
    logstore_sites           the site registry: scrypt hash entry (JSON text) per site
    logstore_conversations   per conversation: next_seq (the seq allocator), created_at, last_appended_at
    logstore_items           per item: seq, recorded_at, payload (the exact stored JSON bytes, bytea)

``next_seq`` is updated in the same statement (hence transaction) that inserts the batch's rows, under the
conversation row's lock: seqs are gapless under any number of servers. Payloads are ``bytea`` rather than
``text`` so that no client or server encoding setting can convert a byte of them; ids are ``COLLATE "C"``
so that the listing's tie order is by code point, as in the file engine, whatever the database's locale.

Migrations are a list of steps; ``migrate`` applies the missing ones, each in its own transaction with the
version bump, and is idempotent (concurrent runs serialise on the version row).
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

import psycopg

from ..core.errors import Unavailable
from .settings import libpq_conninfo

__all__ = [
    "SCHEMA_VERSION",
    "StartupRefused",
    "migrate",
    "schema_version",
    "check_schema",
    "check_durability",
]

# Each step moves the schema from version i to i + 1 (index i). Append only: never edit a released step.
_STEPS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE logstore_schema (
            id boolean PRIMARY KEY DEFAULT true CHECK (id),
            version integer NOT NULL,
            cursor_secret bytea NOT NULL CHECK (length(cursor_secret) = 32),
            registry_version bigint NOT NULL DEFAULT 0
        )""",
        """CREATE TABLE logstore_sites (
            site text COLLATE "C" NOT NULL,
            credential text NOT NULL,
            PRIMARY KEY (site)
        )""",
        """CREATE TABLE logstore_conversations (
            site text COLLATE "C" NOT NULL,
            conversation_id text COLLATE "C" NOT NULL,
            next_seq bigint NOT NULL CHECK (next_seq > 0),
            created_at timestamptz NOT NULL,
            last_appended_at timestamptz NOT NULL,
            PRIMARY KEY (site, conversation_id)
        )""",
        # The listing order (most recently appended first, ties by id): O(limit) per page.
        """CREATE INDEX logstore_conversations_listing
            ON logstore_conversations (site, last_appended_at DESC, conversation_id)""",
        """CREATE TABLE logstore_items (
            site text COLLATE "C" NOT NULL,
            conversation_id text COLLATE "C" NOT NULL,
            seq bigint NOT NULL CHECK (seq >= 0),
            recorded_at timestamptz NOT NULL,
            payload bytea NOT NULL,
            PRIMARY KEY (site, conversation_id, seq)
        )""",
    ),
)
SCHEMA_VERSION = len(_STEPS)


class StartupRefused(Exception):
    """This database cannot be served as it is (schema missing, older or newer; durability off); the
    message says what to do."""


@dataclass(frozen=True, slots=True)
class SchemaState:
    version: int
    cursor_secret: bytes


def _read(conn: psycopg.Connection, *, lock: bool = False) -> SchemaState | None:
    exists = conn.execute("SELECT to_regclass('logstore_schema') IS NOT NULL").fetchone()
    if not exists or not exists[0]:
        return None
    row = conn.execute(
        "SELECT version, cursor_secret FROM logstore_schema WHERE id" + (" FOR UPDATE" if lock else "")
    ).fetchone()
    return None if row is None else SchemaState(row[0], bytes(row[1]))


def schema_version(conn: psycopg.Connection) -> int:
    """0 for an empty database."""
    state = _read(conn)
    return 0 if state is None else state.version


def migrate(conninfo: str) -> tuple[int, int]:
    """Bring the schema to ``SCHEMA_VERSION``; returns (version before, version after)."""
    with psycopg.connect(libpq_conninfo(conninfo), autocommit=True) as conn:
        before = schema_version(conn)
        if before > SCHEMA_VERSION:
            raise StartupRefused(_newer(before))
        while True:
            with conn.transaction():
                state = _read(conn, lock=True)
                current = 0 if state is None else state.version
                if current >= SCHEMA_VERSION:
                    return before, current
                for statement in _STEPS[current]:
                    conn.execute(statement)
                if current == 0:
                    conn.execute(
                        "INSERT INTO logstore_schema (id, version, cursor_secret) VALUES (true, 1, %s)",
                        (secrets.token_bytes(32),),
                    )
                else:
                    conn.execute("UPDATE logstore_schema SET version = %s WHERE id", (current + 1,))


def _newer(version: int) -> str:
    return (
        f"the database schema is version {version}, newer than this logstore's {SCHEMA_VERSION}: "
        "upgrade logstore (never run an older release against a migrated database)"
    )


def check_schema(conn: psycopg.Connection) -> bytes:
    """The cursor secret, if the schema is exactly this code's version; else StartupRefused."""
    state = _read(conn)
    if state is None or state.version < SCHEMA_VERSION:
        found = "no logstore schema" if state is None else f"schema version {state.version}"
        raise StartupRefused(
            f"the database has {found}; this logstore needs version {SCHEMA_VERSION}: "
            "run `logstore db migrate --store URL` first"
        )
    if state.version > SCHEMA_VERSION:
        raise StartupRefused(_newer(state.version))
    return state.cursor_secret


def check_durability(conn: psycopg.Connection, *, allow_async_commit: bool) -> None:
    """Refuse a server that would acknowledge batches PostgreSQL may lose on a crash."""
    row = conn.execute("SELECT current_setting('synchronous_commit'), current_setting('fsync')").fetchone()
    assert row is not None
    unsafe = [
        f"{name}={value}"
        for name, value in zip(("synchronous_commit", "fsync"), row, strict=True)
        if value == "off"
    ]
    if unsafe and not allow_async_commit:
        raise StartupRefused(
            f"PostgreSQL runs with {', '.join(unsafe)}: a crash can lose batches already acknowledged to "
            "clients. Turn it on, or pass --allow-async-commit to accept that loss"
        )


def connect_checked(conninfo: str, **kwargs: object) -> psycopg.Connection:
    """A connection (libpq ``conninfo``) to a database whose schema is exactly this code's version, for
    the operator commands: a database that cannot be reached (down, wrong host, user or password) or whose
    schema is missing, older or newer is one ``Unavailable`` line saying what to do, never a traceback
    (issue 36 §5). The server checks the same once at start (``startup_check``)."""
    try:
        conn = psycopg.connect(conninfo, **kwargs)  # type: ignore[arg-type]
    except psycopg.Error as exc:
        raise Unavailable(
            f"cannot connect to the database: {_first_line(exc)} (check the URL's host, user and password, "
            "and that the server is running)"
        ) from None
    try:
        check_schema(conn)
    except BaseException as exc:
        conn.close()
        if isinstance(exc, StartupRefused):
            raise Unavailable(str(exc)) from None
        raise
    return conn


def _first_line(exc: BaseException) -> str:
    return (str(exc).strip().splitlines() or [type(exc).__name__])[0]


def startup_check(conninfo: str) -> None:
    """What a server checks before anything else on ``conninfo``: it connects and the schema is exactly
    this code's version. Every failure is one ``StartupRefused`` line saying what to do (never a
    traceback: issue 22 §2)."""
    try:
        # logstore's own URL parameters (call_timeout...) out, the client-side bounds in (settings.py).
        with psycopg.connect(libpq_conninfo(conninfo), autocommit=True) as conn:
            check_schema(conn)
    except (psycopg.Error, ValueError) as exc:
        raise StartupRefused(f"cannot use the database: {_first_line(exc)}") from None
