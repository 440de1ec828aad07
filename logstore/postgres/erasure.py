"""Erasure on PostgreSQL (``logstore conversation delete`` / ``site remove --purge`` with ``--store
postgresql://...``): the same right to erasure as the file engine's ``logstore.file.erasure``.

One conversation is erased in one transaction: its listing row first (``DELETE ... logstore_conversations``
takes the row lock every append of it takes, so an append in flight either committed before, and its items
are deleted too, or waits and then starts a new, empty conversation at seq 0), then its items. A crash or a
lost connection before the commit leaves all of it; after, none of it. A site is purged one conversation
(one transaction) at a time, after its credentials were revoked (``tools/sites.py``), so a purge never holds
a long transaction over a big site; rerunning it finishes an interrupted one.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TypeVar

import psycopg

from ..core.errors import Unavailable
from ..core.ids import validate_conversation_id, validate_site
from .pgerrors import translate
from .schema import connect_checked

__all__ = ["erase_conversation", "purge_site"]

_DELETE_CONVERSATION = (
    "DELETE FROM logstore_conversations WHERE site = %s AND conversation_id = %s RETURNING 1"
)
_DELETE_ITEMS = "DELETE FROM logstore_items WHERE site = %s AND conversation_id = %s"
_SITE_CONVERSATIONS = """SELECT conversation_id FROM logstore_conversations WHERE site = %s
UNION SELECT DISTINCT conversation_id FROM logstore_items WHERE site = %s
ORDER BY 1 LIMIT %s"""
T = TypeVar("T")
_BATCH = 1000
_MAX_PASSES = 1000  # a site that keeps getting new conversations (credentials not revoked?) stops the purge


def erase_conversation(conninfo: str, site: str, conversation_id: str, *, lock_timeout: float = 5.0) -> bool:
    """Erase one conversation; False if there was nothing to erase. Raises ``Timeout`` (an append held its
    row lock past ``lock_timeout``), ``Unavailable``/``Io`` (database), ``StartupRefused`` (no schema)."""
    site = validate_site(site)
    conversation_id = validate_conversation_id(conversation_id)
    with _connect(conninfo, lock_timeout) as conn:
        return _run(lambda: _erase(conn, site, conversation_id))


def purge_site(conninfo: str, site: str, *, lock_timeout: float = 5.0) -> int:
    """Erase every conversation of ``site``, one transaction each; returns how many were erased."""
    site = validate_site(site)
    erased = 0
    with _connect(conninfo, lock_timeout) as conn:
        for _ in range(_MAX_PASSES):
            rows = _run(lambda: conn.execute(_SITE_CONVERSATIONS, (site, site, _BATCH)).fetchall())
            if not rows:
                return erased
            for (cid,) in rows:
                erased += _run(partial(_erase, conn, site, cid))
    raise Unavailable(f"conversations of site {site!r} kept appearing during the purge; run it again")


def _erase(conn: psycopg.Connection, site: str, cid: str) -> bool:
    with conn.transaction():
        listed = conn.execute(_DELETE_CONVERSATION, (site, cid)).fetchone() is not None
        items = conn.execute(_DELETE_ITEMS, (site, cid)).rowcount
    return listed or items > 0


def _connect(conninfo: str, lock_timeout: float) -> psycopg.Connection:
    conn = connect_checked(conninfo, autocommit=True, connect_timeout=max(1, int(lock_timeout) + 1))
    try:
        for name, ms in (("lock_timeout", lock_timeout), ("statement_timeout", max(lock_timeout, 30.0))):
            conn.execute("SELECT set_config(%s, %s, false)", (name, f"{int(ms * 1000)}ms"))
    except BaseException as exc:
        conn.close()
        if isinstance(exc, psycopg.Error):
            raise translate(exc, writing=False) or exc from exc
        raise
    return conn


def _run(work: Callable[[], T]) -> T:
    try:
        return work()
    except psycopg.Error as exc:
        raise translate(exc, writing=True) or exc from exc
