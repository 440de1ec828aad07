"""``PostgresStore``: the engine API (``logstore.Store``'s methods, site first) over PostgreSQL.

Any number of servers may share one database: all state is in it (schema.py), and every call is one
statement run in autocommit, so one batch is one transaction, committed before ``append`` returns:

    append   one statement: upsert the conversation row (``next_seq += n``, ``last_appended_at =
             greatest(last, now)``, refused past the item limit) and insert the batch's rows with the seqs
             and the one ``recorded_at`` it returned. The row lock orders concurrent batches, so seqs are
             gapless 0-based in commit order; the new ``last_appended_at`` never decreases.
    recall   the last ``count`` rows by primary key, newest first, reversed
    replay   ``seq >= offset`` by primary key, ``limit`` rows
    list     the listing index ``(site, last_appended_at DESC, conversation_id)``, keyset from the cursor

Validation (ids, items, limits) is the engine's own and runs before a connection is taken. Failures map to
logstore's errors in pgerrors.py; serialization failures and deadlocks are retried there a bounded number
of times. The clock is the database's (``statement_timestamp()``), so servers' clocks do not matter.
"""

from __future__ import annotations

import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import msgspec
import psycopg
import psycopg_pool

from ..core.arguments import append_args, append_json_args, import_args, list_args, recall_args, replay_args
from ..core.batch import PreparedBatch, decode_item, stored_not_json
from ..core.cursor import BEFORE_ALL, CursorCodec, CursorKey
from ..core.errors import Unavailable
from ..core.imported import ImportedBatch, import_refusal
from ..core.json_batch import JsonText
from ..core.limits import (
    DEFAULT_LIST_LIMIT,
    DEFAULT_RECALL_COUNT,
    MAX_CONVERSATION_ITEMS,
    MAX_READ_COUNT,
    conversation_full,
)
from ..core.models import (
    ConversationListing,
    ConversationSummary,
    MemoryItem,
    SeqRange,
    datetime_to_micros,
    micros_to_datetime,
)
from .pgerrors import (
    SERIALIZATION_RETRIES,
    deadline_passed,
    is_serialization_failure,
    is_stale_connection,
    retry_delay,
    translate,
)
from .schema import check_durability, check_schema
from .settings import client_settings
from .watchdog import Watchdog, fileno

__all__ = ["PostgresStore"]

T = TypeVar("T")

RECONNECT_TIMEOUT = 10.0  # seconds (psycopg_pool's reconnect_timeout)

_APPEND = """
WITH conv AS (
    INSERT INTO logstore_conversations AS c (site, conversation_id, next_seq, created_at, last_appended_at)
    SELECT %(site)s, %(cid)s, %(n)s, clock.t, clock.t
    FROM (SELECT coalesce(%(now)s::timestamptz, statement_timestamp()) AS t) AS clock
    ON CONFLICT (site, conversation_id) DO UPDATE
        SET next_seq = c.next_seq + EXCLUDED.next_seq,
            last_appended_at = greatest(c.last_appended_at, EXCLUDED.last_appended_at)
        WHERE c.next_seq + EXCLUDED.next_seq <= %(max)s
    RETURNING c.next_seq, c.last_appended_at
), batch AS (
    INSERT INTO logstore_items (site, conversation_id, seq, recorded_at, payload)
    SELECT %(site)s, %(cid)s, conv.next_seq - %(n)s + item.ord - 1, conv.last_appended_at, item.payload
    FROM conv, unnest(%(payloads)b::bytea[]) WITH ORDINALITY AS item(payload, ord)
)
SELECT next_seq FROM conv
"""
# logstore migrate: a batch at the seq and time it had in the source store. The conversation row is created
# only by a batch at seq 0 and moved on only from exactly ``first`` and never back in time (core.imported);
# no row back means refused, nothing written.
_IMPORT_ITEMS = """, batch AS (
    INSERT INTO logstore_items (site, conversation_id, seq, recorded_at, payload)
    SELECT %(site)s, %(cid)s, %(first)s + item.ord - 1, %(at)s, item.payload
    FROM conv, unnest(%(payloads)b::bytea[]) WITH ORDINALITY AS item(payload, ord)
)
SELECT next_seq FROM conv"""
_IMPORT_FIRST = (
    """WITH conv AS (
    INSERT INTO logstore_conversations (site, conversation_id, next_seq, created_at, last_appended_at)
    VALUES (%(site)s, %(cid)s, %(next)s, %(at)s, %(at)s)
    ON CONFLICT (site, conversation_id) DO NOTHING
    RETURNING next_seq
)"""
    + _IMPORT_ITEMS
)
_IMPORT_NEXT = (
    """WITH conv AS (
    UPDATE logstore_conversations SET next_seq = %(next)s, last_appended_at = %(at)s
    WHERE site = %(site)s AND conversation_id = %(cid)s AND next_seq = %(first)s
        AND last_appended_at <= %(at)s
    RETURNING next_seq
)"""
    + _IMPORT_ITEMS
)
_STORED = "SELECT next_seq FROM logstore_conversations WHERE site = %s AND conversation_id = %s"
_STATE = """SELECT next_seq, last_appended_at FROM logstore_conversations
WHERE site = %s AND conversation_id = %s"""
_RECALL = """SELECT seq, recorded_at, payload FROM logstore_items
WHERE site = %s AND conversation_id = %s ORDER BY seq DESC LIMIT %s"""
_REPLAY = """SELECT seq, recorded_at, payload FROM logstore_items
WHERE site = %s AND conversation_id = %s AND seq >= %s ORDER BY seq LIMIT %s"""
_LIST_FIRST = """SELECT conversation_id, created_at, last_appended_at FROM logstore_conversations
WHERE site = %s ORDER BY last_appended_at DESC, conversation_id LIMIT %s"""
_LIST_AFTER = """SELECT conversation_id, created_at, last_appended_at FROM logstore_conversations
WHERE site = %s AND last_appended_at <= %s AND (last_appended_at < %s OR conversation_id > %s)
ORDER BY last_appended_at DESC, conversation_id LIMIT %s"""


def _now_us() -> int | None:
    """The time that stamps an append's ``recorded_at``, in microseconds since the epoch; None (always, in
    production): the database's ``statement_timestamp()``. Tests replace this function (monkeypatch) to
    steer the clock, as they do the file engine's ``file.log.conversation._now_us``."""
    return None


class PostgresStore:
    """Thread-safe; one connection pool. ``lock_timeout``/``statement_timeout`` bound each statement in
    the database (-> ``Timeout``), ``pool_timeout`` the wait for a connection (-> ``Unavailable``), and
    ``call_timeout`` the whole call on this side, whatever the network does (-> ``Unavailable``, outcome
    unknown for an append already sent; watchdog.py). The last three, and ``pool_size``, can also be given
    as store URL parameters (settings.py); an argument given here wins over the URL."""

    def __init__(
        self,
        conninfo: str,
        *,
        lock_timeout: float = 5.0,
        statement_timeout: float | None = None,
        pool_size: int | None = None,
        pool_timeout: float | None = None,
        call_timeout: float | None = None,
        allow_async_commit: bool = False,
    ) -> None:
        self.conninfo = conninfo
        libpq, self.settings = client_settings(
            conninfo,
            statement_timeout=statement_timeout,
            pool_size=pool_size,
            pool_timeout=pool_timeout,
            call_timeout=call_timeout,
        )
        self.lock_timeout = float(lock_timeout)
        self._session = (
            f"{int(lock_timeout * 1000)}ms",
            f"{int(self.settings.statement_timeout * 1000)}ms",
        )
        self._watchdog = Watchdog("logstore-pg-deadlines")
        self._pool = psycopg_pool.ConnectionPool(
            libpq,
            min_size=1,
            max_size=max(1, self.settings.pool_size),
            timeout=self.settings.pool_timeout,
            # A connection attempt failing for this long gives its slot up; the next call that finds no
            # connection starts a new one at once (the backoff of a long-failing attempt grows past it).
            reconnect_timeout=RECONNECT_TIMEOUT,
            kwargs={"autocommit": True},
            configure=self._configure,
            open=False,
            name="logstore",
        )
        self._closed = False
        self._guard = threading.Lock()
        try:
            self._pool.open(wait=True, timeout=self.settings.pool_timeout)

            def check(conn: psycopg.Connection) -> bytes:
                key = check_schema(conn)
                check_durability(conn, allow_async_commit=allow_async_commit)
                return key

            self._cursor_key = self._run(check, writing=False)
        except psycopg.Error as exc:
            self.close()
            raise translate(exc, writing=False) or exc from exc
        except BaseException:
            self.close()
            raise

    def _configure(self, conn: psycopg.Connection) -> None:
        """A new connection's session settings, in one round trip bounded by the call deadline."""
        armed = self._watchdog.arm(fileno(conn), time.monotonic() + self.settings.call_timeout)
        try:
            conn.execute(
                "SELECT set_config('lock_timeout', %s, false), set_config('statement_timeout', %s, false),"
                " set_config('TimeZone', 'UTC', false)",  # timestamps come back as UTC datetimes
                self._session,
            )
        finally:
            self._watchdog.disarm(armed)

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ public API
    def append(self, site: str, conversation_id: str, items: Sequence[dict[str, Any]]) -> SeqRange:
        """Append one batch atomically; returns its seq range once PostgreSQL has committed it."""
        return self._append(*append_args(site, conversation_id, items))

    def append_json(self, site: str, conversation_id: str, items: Sequence[JsonText]) -> SeqRange:
        """``append`` of items given as JSON text each (``core.json_batch``): same rules, same bytes."""
        return self._append(*append_json_args(site, conversation_id, items))

    def _append(self, site: str, conversation_id: str, batch: PreparedBatch) -> SeqRange:
        payloads = list(batch.items)
        n = len(payloads)

        def run(conn: psycopg.Connection) -> SeqRange:
            clock = _now_us()
            now = None if clock is None else micros_to_datetime(clock)
            params = {
                "site": site,
                "cid": conversation_id,
                "n": n,
                "now": now,
                "max": MAX_CONVERSATION_ITEMS,
                "payloads": payloads,
            }
            row = conn.execute(_APPEND, params).fetchone()
            if row is None:  # the limit refused the update: nothing was written
                stored = conn.execute(_STORED, (site, conversation_id)).fetchone()
                count = stored[0] if stored else 0
                raise conversation_full(stored=count, requested=n)
            return SeqRange(row[0] - n, row[0] - 1)

        return self._run(run, writing=True)

    def import_batch(self, site: str, conversation_id: str, batch: ImportedBatch) -> SeqRange:
        """``logstore migrate``: append items copied verbatim from another store at the seq and time they
        had there, in one statement (``core.imported``: refused unless ``batch.first_seq`` is the next seq
        and its time is not before the conversation's last)."""
        site, conversation_id, batch = import_args(site, conversation_id, batch)
        params = {
            "site": site,
            "cid": conversation_id,
            "first": batch.first_seq,
            "next": batch.next_seq,
            "at": micros_to_datetime(batch.recorded_at),
            "payloads": list(batch.items),
        }

        def run(conn: psycopg.Connection) -> SeqRange:
            statement = _IMPORT_FIRST if batch.first_seq == 0 else _IMPORT_NEXT
            if conn.execute(statement, params).fetchone() is None:
                state = conn.execute(_STATE, (site, conversation_id)).fetchone()
                next_seq, last_at = (0, None) if state is None else (state[0], datetime_to_micros(state[1]))
                refusal = import_refusal(batch, next_seq=next_seq, last_recorded_at=last_at)
                raise refusal or Unavailable("the conversation changed during the import; retry")
            return SeqRange(batch.first_seq, batch.next_seq - 1)

        return self._run(run, writing=True)

    def recall(self, site: str, conversation_id: str, count: int = DEFAULT_RECALL_COUNT) -> list[MemoryItem]:
        """The last ``count`` items in ascending seq order (fewer if the log holds fewer)."""
        site, conversation_id, count = recall_args(site, conversation_id, count)
        if count == 0:
            self._check_open()
            return []
        rows = self._read(_RECALL, (site, conversation_id, count))
        rows.reverse()
        return self._items(site, conversation_id, rows)

    def replay(
        self, site: str, conversation_id: str, offset: int = 0, limit: int = MAX_READ_COUNT
    ) -> list[MemoryItem]:
        """Up to ``limit`` items from seq ``offset`` on; a short page means the end of the log."""
        site, conversation_id, offset, limit = replay_args(site, conversation_id, offset, limit)
        if limit == 0 or offset >= MAX_CONVERSATION_ITEMS:
            self._check_open()
            return []
        return self._items(site, conversation_id, self._read(_REPLAY, (site, conversation_id, offset, limit)))

    def list_conversations(
        self, site: str, cursor: str | None = None, limit: int = DEFAULT_LIST_LIMIT
    ) -> ConversationListing:
        """One page of the site's conversations, most recently appended first (keyset pagination)."""
        site, cursor, limit = list_args(site, cursor, limit)
        codec = CursorCodec(self._cursor_key, site)
        position = None if cursor is None else codec.decode(cursor)
        if position is None or position.last_appended_at >= BEFORE_ALL:
            rows = self._read(_LIST_FIRST, (site, limit + 1))
        else:
            at = micros_to_datetime(position.last_appended_at)
            rows = self._read(_LIST_AFTER, (site, at, at, position.conversation_id, limit + 1))
        page = [ConversationSummary(cid, created, last) for cid, created, last in rows[:limit]]
        last_key = None
        if page:
            last_key = CursorKey(datetime_to_micros(page[-1].last_appended_at), page[-1].conversation_id)
        return ConversationListing(page, codec.next_cursor(cursor, last_key, has_more=len(rows) > limit))

    def close(self) -> None:
        with self._guard:
            if self._closed:
                return
            self._closed = True
        # psycopg_pool joins each maintenance thread for up to ``timeout`` (default 5 s each): a worker
        # opening a connection to a slow or silent database held a SIGINT'd server 4-10 s (issue 22 §2).
        # Not waiting is safe: those threads (daemons) only open, replace and discard idle connections and
        # run no statement of ours; every acknowledged append had committed before its call returned;
        # idle connections are closed below whatever the timeout, one in use when it is returned, and
        # one a worker opens after this is closed by the pool as it arrives.
        self._pool.close(timeout=0.5)
        self._watchdog.stop()

    # ------------------------------------------------------------------ internals
    def _check_open(self) -> None:
        if self._closed:
            raise Unavailable("store is closed")

    def _read(self, query: str, params: tuple[object, ...]) -> list[tuple[Any, ...]]:
        def run(conn: psycopg.Connection) -> list[tuple[Any, ...]]:
            return conn.cursor(binary=True).execute(query, params).fetchall()

        return self._run(run, writing=False)

    def _run(self, work: Callable[[psycopg.Connection], T], *, writing: bool) -> T:
        """``work`` on a pooled connection, all of it within ``call_timeout``; errors translated;
        serialization failures retried, and a connection found dead retried once (pgerrors.py says when
        that is safe)."""
        start = time.monotonic()
        deadline = start + self.settings.call_timeout
        retry_until = min(deadline, start + self.lock_timeout)
        reconnected = False
        for attempt in range(SERIALIZATION_RETRIES + 1):
            self._check_open()
            conn = self._take(deadline, writing=writing)
            armed = self._watchdog.arm(fileno(conn), deadline)
            try:
                return work(conn)
            except psycopg.Error as exc:
                if self._watchdog.disarm(armed):
                    raise deadline_passed(self.settings.call_timeout, writing=writing, sent=True) from exc
                if is_serialization_failure(exc) and attempt < SERIALIZATION_RETRIES:
                    if time.monotonic() < retry_until:
                        time.sleep(retry_delay(attempt))
                        continue
                elif not reconnected and is_stale_connection(exc, writing=writing):
                    reconnected = True  # the pool drops the broken connection; take another
                    continue
                if self._closed:
                    raise Unavailable("store is closed") from exc
                error = translate(exc, writing=writing)
                if error is None:
                    raise
                raise error from exc
            finally:
                self._watchdog.disarm(armed)
                self._pool.putconn(conn)  # a broken one is closed and replaced by the pool
        raise AssertionError("unreachable")

    def _take(self, deadline: float, *, writing: bool) -> psycopg.Connection:
        """A pooled connection whose socket has nothing to say (an idle connection that the server or the
        network closed is readable: EOF, RST or the server's last FATAL message), within the deadline
        and ``pool_timeout``. Finding it dead now, before a statement is sent, keeps the outcome known."""
        for tried in range(self.settings.pool_size + 1):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise deadline_passed(self.settings.call_timeout, writing=writing, sent=False)
            try:
                conn = self._pool.getconn(timeout=min(self.settings.pool_timeout, remaining))
            except psycopg.Error as exc:
                if self._closed:
                    raise Unavailable("store is closed") from exc
                if isinstance(exc, psycopg_pool.PoolTimeout) and time.monotonic() >= deadline:
                    raise deadline_passed(self.settings.call_timeout, writing=writing, sent=False) from exc
                error = translate(exc, writing=False)  # nothing was sent
                if error is None:
                    raise
                raise error from exc
            if tried == self.settings.pool_size or not _has_input(conn):
                return conn
            conn.close()
            self._pool.putconn(conn)
        raise AssertionError("unreachable")

    @staticmethod
    def _items(site: str, conversation_id: str, rows: list[tuple[Any, ...]]) -> list[MemoryItem]:
        out = []
        for seq, recorded_at, payload in rows:
            try:
                out.append(MemoryItem(seq, recorded_at, decode_item(payload, seq=seq)))  # or Unreadable
            except msgspec.DecodeError as exc:  # the item's offset in the table is its seq
                raise stored_not_json(
                    seq, path=f"logstore_items/{site}/{conversation_id}", offset=seq
                ) from exc
        return out


def _has_input(conn: psycopg.Connection) -> bool:
    """The idle connection's socket is readable (or gone): the peer closed or reset it."""
    fd = fileno(conn)
    if fd < 0:
        return True
    poller = select.poll()
    poller.register(fd, select.POLLIN)
    return bool(poller.poll(0))
