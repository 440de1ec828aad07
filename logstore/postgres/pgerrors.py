"""PostgreSQL failures -> logstore's errors, in one place (by SQLSTATE; the table is in docs/SCALING.md).

    retried here           40001 serialization_failure, 40P01 deadlock_detected (the statement rolled back:
                           running it again is safe), with jittered backoff, at most ``SERIALIZATION_RETRIES``
                           times and while the call is younger than its lock_timeout
    Timeout                55P03 lock_not_available (lock_timeout), 57014 query_canceled (statement_timeout),
                           and serialization failures still failing after the retries
    Unavailable            class 08 and a connection lost without SQLSTATE, 57P01-57P03 (shutdown, crash,
                           starting up), 53300 too_many_connections, 53200 out of memory, 25006 read-only
                           (a standby, e.g. mid-failover), no pooled connection within the pool timeout
    Io                     53100 disk_full, class 58 (the server's own I/O errors)
    anything else          propagates: a bug, not a condition a client can act on

A pooled connection that the server closed while it sat idle (restart, failover, idle timeout) is found
readable and replaced before use (store.py); if it still fails on its first statement and that failure
proves the statement did not run -- 57P01 or 57P03, which the server sends instead of running anything --
or the call only reads, the call is retried once on a fresh connection. 57P02 (crash of another server
process) is different: the server sends it from a signal handler, possibly after an append committed and
before its reply, so an append that gets it has an unknown outcome.

A batch whose connection was lost without an error for its statement has an *unknown* outcome: it may have
committed just before the connection went. It is reported as ``Unavailable(outcome="unknown")``
(retryable) with that said in the message, never as success; a client's retry may then store the batch
twice. So is an append whose call passed its client-side deadline (``call_timeout``, watchdog.py) after its
request was sent; before that (waiting for a connection), nothing was sent and the outcome is known.
"""

from __future__ import annotations

import random

import psycopg
import psycopg_pool

from ..core.errors import Io, LogstoreError, Timeout, Unavailable

__all__ = [
    "SERIALIZATION_RETRIES",
    "deadline_passed",
    "is_serialization_failure",
    "is_stale_connection",
    "retry_delay",
    "translate",
]

SERIALIZATION_RETRIES = 64  # under SERIALIZABLE, 8 writers on one conversation needed > 8 (measured)
_RETRY_STATES = frozenset({"40001", "40P01"})
_TIMEOUT_STATES = frozenset({"55P03", "57014"})
_TERMINATED_STATES = frozenset({"57P01", "57P03"})  # session ended by the server, nothing ran
_CRASH_STATE = "57P02"  # sent at any point, even after the commit: an append's outcome is unknown
_UNAVAILABLE_STATES = frozenset({"57P01", "57P02", "57P03", "53300", "53200", "25006"})
_UNKNOWN_OUTCOME = (
    "; the batch's outcome is unknown (it was sent, and no reply came): it may have been stored, so "
    "a retry can store it a second time (recall first to check)"
)


def is_serialization_failure(exc: BaseException) -> bool:
    return isinstance(exc, psycopg.Error) and exc.sqlstate in _RETRY_STATES


def is_stale_connection(exc: BaseException, *, writing: bool) -> bool:
    """The connection was dead before the call's statement could run (or the call only reads, so running
    it again is harmless): worth one retry on a fresh connection."""
    if not isinstance(exc, psycopg.OperationalError) or isinstance(exc, psycopg_pool.PoolTimeout):
        return False
    if exc.sqlstate in _TERMINATED_STATES or (exc.sqlstate == _CRASH_STATE and not writing):
        return True
    return not writing and (exc.sqlstate is None or exc.sqlstate.startswith("08"))


def retry_delay(attempt: int) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): jittered, doubling from 1 ms, capped at 50 ms."""
    return random.uniform(0, min(0.05, 0.001 * 2**attempt))


def translate(exc: psycopg.Error, *, writing: bool) -> LogstoreError | None:
    """The logstore error for ``exc``, or None if it is not a storage condition (let it propagate).
    ``writing``: the failed call was an append (a lost connection then leaves its outcome unknown)."""
    if isinstance(exc, (psycopg_pool.PoolTimeout, psycopg_pool.TooManyRequests)):
        return Unavailable(f"no database connection available: {exc}")
    if isinstance(exc, psycopg_pool.PoolClosed):
        return Unavailable("store is closed")
    state = exc.sqlstate
    summary = _summary(exc)
    if state in _TIMEOUT_STATES or state in _RETRY_STATES:
        return Timeout(f"database timeout ({state}): {summary}")
    if state == _CRASH_STATE and writing:
        return _lost(f"database unavailable ({state}): {summary}", writing=True)
    if state in _UNAVAILABLE_STATES:
        return Unavailable(f"database unavailable ({state}): {summary}")
    if state is not None and (state == "53100" or state.startswith("58")):
        return Io(f"database I/O error ({state}): {summary}")
    if (state is None and isinstance(exc, psycopg.OperationalError)) or (state or "").startswith("08"):
        return _lost(f"database connection lost: {summary}", writing=writing)
    return None


def deadline_passed(call_timeout: float, *, writing: bool, sent: bool) -> Unavailable:
    """The call ran out of its ``call_timeout``; ``sent``: a statement was on the wire when it did."""
    message = f"no reply from the database within the call's {call_timeout:g} s (call_timeout)"
    if not sent:
        return Unavailable(message + "; nothing was sent")
    return _lost(message + "; the connection was closed", writing=writing)


def _lost(message: str, *, writing: bool) -> Unavailable:
    if not writing:
        return Unavailable(message)
    return Unavailable(message + _UNKNOWN_OUTCOME, outcome="unknown")


def _summary(exc: psycopg.Error) -> str:
    text = str(exc).strip().splitlines()
    return text[0] if text else type(exc).__name__
