"""The client-side deadline of a call: a watchdog thread that shuts down the socket of a connection still
in use past its deadline.

PostgreSQL's ``statement_timeout`` is enforced by the database, which never hears of a statement lost in a
silent network; TCP keepalives and ``tcp_user_timeout`` take tens of seconds and do nothing against a peer
whose kernel still acknowledges. A blocked psycopg call wakes only when its socket does, so the watchdog
``shutdown()``s the socket: the call's wait returns at once with a lost connection (libpq marks it broken,
so the pool replaces it), and the caller learns from ``Armed.fired`` that its deadline, not the peer, ended
it. A cancel request would not do: it needs a new connection over the same silent network.

The watchdog works on its own duplicate of the connection's descriptor, taken when the call is armed and
closed when it is disarmed, so it can never touch a descriptor number that libpq closed and the process
reused meanwhile. One thread per store; it sleeps until the earliest deadline, and arming a call whose
deadline is not earlier than that (the usual case: every call gets the same budget) does not wake it.
"""

from __future__ import annotations

import os
import socket
import threading
import time
from dataclasses import dataclass

import psycopg

__all__ = ["Armed", "Watchdog", "fileno"]

_IDLE_TICK = 1.0  # seconds


@dataclass(eq=False)
class Armed:
    deadline: float
    fd: int  # our duplicate of the connection's descriptor, -1 if none
    fired: bool = False


class Watchdog:
    def __init__(self, name: str) -> None:
        self._name = name
        self._cond = threading.Condition(threading.Lock())
        self._armed: set[Armed] = set()
        self._wake_at = 0.0
        self._stopped = False
        self._running = False  # the thread is in its loop (set and cleared under the lock)
        self._thread: threading.Thread | None = None

    def arm(self, fileno: int, deadline: float) -> Armed:
        """Watch the socket ``fileno`` until ``disarm``; shut it down if ``deadline`` (monotonic) passes.
        A descriptor that is already gone (-1, or closed) gives an entry that only reports the deadline."""
        try:
            fd = os.dup(fileno) if fileno >= 0 else -1
        except OSError:
            fd = -1
        entry = Armed(deadline, fd)
        with self._cond:
            self._armed.add(entry)
            if not self._running:  # first use, or a call armed while its store closes: still bounded
                self._running = True
                self._thread = threading.Thread(target=self._run, name=self._name, daemon=True)
                self._thread.start()
            elif deadline < self._wake_at:
                self._cond.notify()
        return entry

    def disarm(self, entry: Armed) -> bool:
        """Stop watching; True if the deadline had passed and the socket was shut down."""
        with self._cond:
            self._armed.discard(entry)
            fd, entry.fd = entry.fd, -1
            if self._stopped and not self._armed:
                self._cond.notify()  # the last call of a stopped watchdog: let the thread end
        if fd >= 0:
            os.close(fd)  # our duplicate only: the connection's own descriptor stays libpq's
        return entry.fired

    def stop(self) -> None:
        """End the thread once no call is armed: calls still in flight (a store closing under them) keep
        their deadlines. Joins the thread when none is."""
        with self._cond:
            self._stopped = True
            self._cond.notify()
            thread = None if self._armed else self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _run(self) -> None:
        with self._cond:
            try:
                self._loop()
            finally:
                self._running = False

    def _loop(self) -> None:  # under the lock
        while not (self._stopped and not self._armed):
            now = time.monotonic()
            for entry in [e for e in self._armed if e.deadline <= now]:
                self._armed.discard(entry)
                entry.fired = True
                if entry.fd >= 0:
                    _shutdown(entry.fd)
            # Idle: look again after a tick, so that arming the next call need not wake this thread.
            self._wake_at = min((e.deadline for e in self._armed), default=now + _IDLE_TICK)
            self._cond.wait(self._wake_at - now)


def _shutdown(fd: int) -> None:
    sock = socket.socket(fileno=fd)
    try:
        sock.shutdown(socket.SHUT_RDWR)
    except OSError:  # already disconnected
        pass
    finally:
        sock.detach()  # the descriptor stays open until disarm closes it


def fileno(conn: psycopg.Connection) -> int:
    """The connection's socket, -1 if libpq has none (closed or lost)."""
    try:
        return -1 if conn.closed else conn.pgconn.socket
    except psycopg.Error:
        return -1
