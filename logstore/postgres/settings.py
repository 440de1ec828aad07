"""Client-side bounds of the PostgreSQL backend, read from the store URL (docs/SCALING.md, Bad networks).

A store URL is a libpq URL plus four query parameters that are logstore's own (taken out before libpq sees
the URL; seconds, decimals allowed)::

    postgresql://logstore@db.internal/logstore?call_timeout=10&pool_size=20

    call_timeout        35    every store call (waiting for a connection, retries and the statement
                              included) returns or fails within it: past it the call's connection is
                              closed under it and the call raises Unavailable ("outcome unknown" for an
                              append whose request was sent)
    statement_timeout   30    PostgreSQL's statement_timeout (-> Timeout, nothing written); keep it below
                              call_timeout so that a slow statement is cancelled by the database first
    pool_size           10    connections per store (per server worker process)
    pool_timeout        5     longest wait for a free connection (-> Unavailable, nothing sent)

and libpq's own parameters, which logstore sets when the URL does not (the URL's values win):

    connect_timeout     5     a connection attempt, TLS and authentication included
    keepalives          1     TCP keepalives on every connection: an idle connection to a host that
    keepalives_idle     10    went away is found dead after about idle + interval x count = 25 s
    keepalives_interval 5
    keepalives_count    3
    tcp_user_timeout    20000 ms: data sent and not acknowledged for this long closes the connection

(libpq ignores the TCP ones for Unix-socket connections.) Every module that connects from a store URL
calls ``libpq_conninfo`` (or ``split_url``), so each connection gets the same bounds.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import unquote, urlsplit, urlunsplit

import psycopg
from psycopg.conninfo import conninfo_to_dict, make_conninfo

__all__ = ["ClientSettings", "LIBPQ_DEFAULTS", "client_settings", "libpq_conninfo", "split_url"]

LIBPQ_DEFAULTS = {
    "connect_timeout": "5",
    "keepalives": "1",
    "keepalives_idle": "10",
    "keepalives_interval": "5",
    "keepalives_count": "3",
    "tcp_user_timeout": "20000",
}


@dataclass(frozen=True)
class ClientSettings:
    call_timeout: float = 35.0
    statement_timeout: float = 30.0
    pool_size: int = 10
    pool_timeout: float = 5.0


_OWN = {"call_timeout": float, "statement_timeout": float, "pool_size": int, "pool_timeout": float}


def split_url(url: str) -> tuple[str, dict[str, float | int]]:
    """(the libpq conninfo with logstore's defaults, logstore's own parameters found in the URL).
    ValueError for a bad value of one of logstore's parameters."""
    own: dict[str, float | int] = {}
    if "://" in url:
        parts = urlsplit(url)
        kept = []
        for piece in parts.query.split("&") if parts.query else ():
            key, _, value = piece.partition("=")
            if key not in _OWN:
                kept.append(piece)  # verbatim: libpq decodes its own parameters
                continue
            value = unquote(value)
            try:
                number = _OWN[key](value)
            except ValueError:
                raise ValueError(f"store URL parameter {key}={value!r} is not a number") from None
            if not number > 0:
                raise ValueError(f"store URL parameter {key}={value!r} must be positive")
            own[key] = number
        url = urlunsplit(parts._replace(query="&".join(kept)))
    try:
        params = conninfo_to_dict(url)
    except psycopg.Error as exc:
        raise ValueError(f"invalid PostgreSQL URL: {str(exc).strip()}") from None
    for key, value in LIBPQ_DEFAULTS.items():
        params.setdefault(key, value)
    return make_conninfo("", **params), own


def libpq_conninfo(url: str) -> str:
    """What ``psycopg.connect`` is given for a store URL: logstore's parameters out, the bounds in."""
    return split_url(url)[0]


def client_settings(url: str, **explicit: float | int | None) -> tuple[str, ClientSettings]:
    """The conninfo and the settings: an explicit (not None) argument, else the URL's, else the default."""
    conninfo, own = split_url(url)
    chosen = {**own, **{key: value for key, value in explicit.items() if value is not None}}
    return conninfo, ClientSettings(**chosen)  # type: ignore[arg-type]
