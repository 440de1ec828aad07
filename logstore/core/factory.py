"""``open_store(url)`` / ``open_registry(url)``: the one place a store URL becomes a backend.

URLs: ``file:PATH`` (the file engine on the data dir PATH) and ``postgresql://...`` or ``postgres://...``
(the PostgreSQL backend, docs/SCALING.md; a libpq URL, passed to psycopg as given). A backend module is
imported only when a URL names it, so code that depends on ``logstore.core`` alone (the server) never loads
an engine it does not use. Adding a backend = one branch in each function (and its entry in the contract
suite's parameters).
"""

from __future__ import annotations

import os

from .backend import Backend
from .registry import SiteRegistry

__all__ = ["SCHEMES", "file_url", "parse_store_url", "open_store", "open_registry"]

SCHEMES = ("file", "postgresql", "postgres")
_POSTGRES = ("postgresql", "postgres")
# The operator accepts that a database crash can lose acknowledged batches (synchronous_commit=off).
ALLOW_ASYNC_COMMIT_ENV = "LOGSTORE_ALLOW_ASYNC_COMMIT"


def file_url(data_dir: str) -> str:
    """The store URL of a file-engine data dir (``--data-dir D`` is shorthand for this)."""
    return f"file:{data_dir}"


def parse_store_url(url: str) -> tuple[str, str]:
    """(scheme, rest) of a store URL; ValueError names the accepted forms."""
    scheme, sep, rest = url.partition(":")
    if not sep or scheme not in SCHEMES or not rest or (scheme in _POSTGRES and not rest.startswith("//")):
        raise ValueError(f"store URL {url!r} is not one of: file:PATH, postgresql://[user@]host[:port]/db")
    if scheme in _POSTGRES:
        try:
            from ..postgres.settings import split_url
        except ImportError:  # no postgres extra: open_store says so
            pass
        else:
            split_url(url)  # ValueError for a bad parameter (call_timeout...), before any connection
    return scheme, rest


def open_store(url: str, *, lock_timeout: float = 5.0) -> Backend:
    scheme, rest = parse_store_url(url)
    if scheme in _POSTGRES:
        from ..postgres.store import PostgresStore

        allow = os.environ.get(ALLOW_ASYNC_COMMIT_ENV) == "1"
        return PostgresStore(url, lock_timeout=lock_timeout, allow_async_commit=allow)
    assert scheme == "file"
    from ..file.store import Store

    return Store(rest, lock_timeout=lock_timeout)


def open_registry(url: str) -> SiteRegistry:
    scheme, rest = parse_store_url(url)
    if scheme in _POSTGRES:
        from ..postgres.registry import PostgresRegistry

        return PostgresRegistry(url)
    assert scheme == "file"
    from ..file.credentials import CredentialsFile

    return CredentialsFile(rest)
