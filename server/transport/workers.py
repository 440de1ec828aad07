"""``--workers N``: one acceptor process hands each new connection to the next worker, round robin.

Why not a shared listening socket (what ``uvicorn --workers`` does): every worker waits on it and the first
to wake accepts everything queued, so 16 clients connecting at once often all landed on one worker, and
keep-alive kept them there (issue 15: per-worker CPU 16.5 s / 0.0 s). Why not one ``SO_REUSEPORT`` socket
per worker: the kernel spreads connections by a hash of the 4-tuple, i.e. at random, and 16 connections
over 2 sockets split worse than 35/65 in 43 of 200 trials on this kernel (binomial: 21%), so ten clean
trials out of ten happen only ~9% of the time. Round robin from one acceptor is exact, the way Node's
``cluster`` module distributes by default. The acceptor only accepts and passes the descriptor
(``SCM_RIGHTS`` over a per-worker ``AF_UNIX`` socketpair); requests never go through it.

This module is the acceptor and supervisor; ``handoff.py`` the worker's side and the channel's messages.

The supervisor keeps uvicorn's behaviour: a worker that dies after it started serving is replaced; one that
dies before (broken app, unreadable data dir) stops the server, since a restart would fail the same way;
SIGINT/SIGTERM stop accepting, ask every worker to shut down gracefully and wait for them. A worker whose
acceptor disappears (``kill -9`` of the parent) sees its channel close and shuts down too.

A worker that does not take its connections (``SIGSTOP``ped, its event loop stuck) must not keep receiving
every N-th one (issue 33: 12 of 24 new connections hung). A descriptor already sent cannot be taken back,
so the acceptor bounds how many it risks: the worker acknowledges each descriptor it receives (one byte
back on the channel), and a worker with ``_MAX_UNACKED`` hand-offs unacknowledged, or whose oldest one is
older than ``_ACK_TIMEOUT``, is skipped until it acknowledges again. A stalled worker thus holds at most
``_MAX_UNACKED`` connections (they are served if it resumes); workers that keep up see exact round robin.
"""

from __future__ import annotations

import logging
import multiprocessing
import os
import selectors
import signal
import socket
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from multiprocessing.process import BaseProcess

from uvicorn.config import STARTUP_FAILURE

from .handoff import _ACK, _ACK_CHUNK, _CONN, _READY, HandoffServer

__all__ = ["HandoffServer", "Supervisor"]  # HandoffServer: the worker's side, in handoff.py

log = logging.getLogger("logstore.server")

# A worker is skipped while this many hand-offs are unacknowledged: the most connections a stalled worker
# can hold. Above the 8 per worker that 16 clients connecting at once put on each of 2 workers in one
# accept burst, so a worker that keeps up never reaches it (tests/test_server_workers.py checks the spread).
_MAX_UNACKED = 8
# ...or while its oldest unacknowledged hand-off is older than this (seconds): a healthy worker acknowledges
# within its next event loop turn; this is far above that on a loaded machine, and it stops a stalled worker
# from taking connections that arrive one by one long before it holds _MAX_UNACKED of them.
_ACK_TIMEOUT = 1.0
_ACCEPT_BURST = 64  # connections accepted per wake-up before the loop looks at its other sources
_ACCEPT_BACKOFF = 0.25  # seconds without accepting after accept() failed (out of descriptors)


@dataclass
class _Worker:
    process: BaseProcess
    channel: socket.socket
    ready: bool = False  # takes connections now
    served: bool = False  # finished its startup once (a later death is not a startup failure)
    # When each hand-off not yet acknowledged was sent (monotonic), oldest first: the channel keeps order.
    unacked: deque[float] = field(default_factory=deque)
    stalled: bool = False  # skipped for not acknowledging in time (logged once per episode)

    def takes_connections(self, now: float) -> bool:
        if not self.ready or len(self.unacked) >= _MAX_UNACKED:
            return False
        return not self.unacked or now - self.unacked[0] < _ACK_TIMEOUT


class Supervisor:
    """Owns the listening socket and ``count`` worker processes running ``target(channel)``."""

    def __init__(
        self,
        listener: socket.socket,
        count: int,
        target: Callable[[socket.socket], None],
        *,
        shutdown_timeout: float,
        on_exit: Callable[[int], None] | None = None,
    ) -> None:
        self._listener = listener
        self._on_worker_exit = on_exit  # hears each exited worker's pid (metrics: server.metrics.mark_dead)
        self._count = count
        self._target = target
        self._shutdown_timeout = shutdown_timeout
        self._ctx = multiprocessing.get_context("spawn")
        self._selector = selectors.DefaultSelector()
        self._workers: list[_Worker] = []
        self._next = 0
        self._held: deque[socket.socket] = deque()  # accepted, not yet taken by a worker
        self._accepting = False  # the listener is in the selector
        self._started = False  # every initial worker was ready once: accepting may begin
        self._accept_paused_until = 0.0
        self._last_accept_warning = -1e9
        self._stopping = False
        self._exit_code = 0
        self._signals: list[int] = []

    # -- workers -----------------------------------------------------------------------------------
    def _spawn(self) -> _Worker:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        process = self._ctx.Process(target=self._target, args=(theirs,), name="logstore-worker")
        process.start()
        theirs.close()
        mine.setblocking(False)
        worker = _Worker(process, mine)
        self._selector.register(mine, selectors.EVENT_READ, ("channel", worker))
        self._selector.register(process.sentinel, selectors.EVENT_READ, ("exit", worker))
        self._workers.append(worker)
        return worker

    def _close_channel(self, worker: _Worker) -> None:
        if worker.channel.fileno() != -1:
            self._selector.unregister(worker.channel)
            worker.channel.close()
        worker.ready = False

    def _on_channel(self, worker: _Worker) -> None:
        """Read everything the worker sent: its ready message, acknowledgements, or the end."""
        while worker.channel.fileno() != -1:  # -1: closed by an exit event earlier in the same batch
            try:
                data = worker.channel.recv(_ACK_CHUNK)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data = b""
            if data == _READY:
                worker.ready = worker.served = True
                log.info("worker %d ready", worker.process.pid)
            elif data and data == _ACK * len(data):
                for _ in range(min(len(data), len(worker.unacked))):
                    worker.unacked.popleft()
                if worker.stalled and worker.takes_connections(time.monotonic()):
                    worker.stalled = False
                    log.warning("worker %d takes connections again", worker.process.pid)
            elif not data:  # the worker is exiting; its sentinel tells when it is gone
                self._close_channel(worker)

    def _on_exit(self, worker: _Worker) -> None:
        if worker not in self._workers:  # already handled earlier in the same batch
            return
        worker.process.join()
        self._selector.unregister(worker.process.sentinel)
        self._close_channel(worker)
        self._workers.remove(worker)
        if self._on_worker_exit is not None and worker.process.pid is not None:
            self._on_worker_exit(worker.process.pid)
        code = worker.process.exitcode
        if self._stopping:
            return
        if code == STARTUP_FAILURE or (not worker.served and code != 0):
            log.error("worker %d failed to start (exit %s); stopping", worker.process.pid, code)
            self._exit_code = STARTUP_FAILURE
            self._stop()
            return
        log.warning("worker %d died (exit %s); starting a replacement", worker.process.pid, code)
        self._spawn()

    # -- connections ---------------------------------------------------------------------------------
    def _accept(self) -> None:
        for _ in range(_ACCEPT_BURST):
            if self._held:  # no worker took the last one: leave the rest in the kernel's backlog
                return
            try:
                conn, _ = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # EMFILE and friends: keep serving the connections we have, and stop polling a listener
                # that stays readable (a tight accept-fail loop would burn a core and flood the log).
                self._accept_paused_until = time.monotonic() + _ACCEPT_BACKOFF
                if time.monotonic() - self._last_accept_warning > 10:
                    self._last_accept_warning = time.monotonic()
                    log.warning("accept failed: %s; retrying every %.2f s", exc, _ACCEPT_BACKOFF)
                return
            self._held.append(conn)
            self._flush_held()

    def _flush_held(self) -> None:
        while self._held:
            conn = self._held[0]
            if not self._hand_off(conn):
                return
            self._held.popleft()
            conn.close()  # the worker has its own descriptor now

    def _hand_off(self, conn: socket.socket) -> bool:
        """Send ``conn`` to the next worker that takes connections; False if none took it."""
        n = len(self._workers)
        now = time.monotonic()
        for i in range(n):
            worker = self._workers[(self._next + i) % n]
            if worker.ready and not worker.takes_connections(now):
                self._on_channel(worker)  # judge it on the acknowledgements it has sent so far
                if not worker.takes_connections(now):
                    self._note_stall(worker, now)
                    continue
            if not worker.ready:
                continue
            try:
                socket.send_fds(worker.channel, [_CONN], [conn.fileno()])
            except (BlockingIOError, InterruptedError):
                continue  # this worker is not draining its channel: give the connection to another
            except OSError:
                worker.ready = False
                continue
            worker.unacked.append(now)
            self._next = (self._next + i + 1) % n
            return True
        return False

    def _note_stall(self, worker: _Worker, now: float) -> None:
        if worker.stalled or not worker.unacked or now - worker.unacked[0] < _ACK_TIMEOUT:
            return  # a worker momentarily _MAX_UNACKED behind in a burst is not news
        worker.stalled = True
        log.warning(
            "worker %d has not taken %d connection(s) handed to it %.1f s ago; skipping it until it does",
            worker.process.pid,
            len(worker.unacked),
            now - worker.unacked[0],
        )

    def _reconcile(self) -> None:
        """Accept only when a worker can take connections: at first once every worker is ready (so the
        first clients spread over all of them), later whenever nothing is held back. While paused, new
        connections wait in the listen backlog instead of piling up as descriptors here."""
        if self._held:
            self._flush_held()
        if not self._started and self._workers and all(w.ready for w in self._workers):
            self._started = True
        want = (
            self._started
            and not self._stopping
            and not self._held
            and time.monotonic() >= self._accept_paused_until
        )
        if want and not self._accepting:
            self._selector.register(self._listener, selectors.EVENT_READ, ("accept", None))
        elif not want and self._accepting:
            self._selector.unregister(self._listener)
        self._accepting = want

    # -- lifecycle -----------------------------------------------------------------------------------
    def _stop(self) -> None:
        if self._stopping:
            return
        self._stopping = True
        if self._accepting:
            self._selector.unregister(self._listener)
            self._accepting = False
        self._listener.close()
        while self._held:
            self._held.popleft().close()
        for worker in self._workers:
            pid = worker.process.pid  # set by start(), which _spawn always calls
            if worker.process.exitcode is None and pid is not None:
                os.kill(pid, signal.SIGTERM)  # uvicorn's graceful shutdown in the worker

    def run(self) -> int:
        self._listener.setblocking(False)
        wake_r, wake_w = socket.socketpair()
        wake_r.setblocking(False)
        wake_w.setblocking(False)
        self._selector.register(wake_r, selectors.EVENT_READ, ("signal", None))
        previous_fd = signal.set_wakeup_fd(wake_w.fileno(), warn_on_full_buffer=False)
        previous = {
            sig: signal.signal(sig, lambda s, _f: self._signals.append(s))
            for sig in (signal.SIGINT, signal.SIGTERM)
        }
        try:
            for _ in range(self._count):
                self._spawn()
            deadline: float | None = None
            while self._workers:
                timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
                if not self._stopping and (self._held or (self._started and not self._accepting)):
                    # retrying a full channel, or accept() after it failed
                    timeout = 0.05 if timeout is None else min(timeout, 0.05)
                events = self._selector.select(timeout)
                # Signals first: on Ctrl-C the workers get SIGINT too, and one that exits before the
                # signal is seen must not be taken for a dead worker and replaced.
                if self._signals and not self._stopping:
                    log.info("received %s; stopping workers", signal.Signals(self._signals[-1]).name)
                    self._stop()
                for key, _ in events:
                    kind, worker = key.data
                    if kind == "accept":
                        self._accept()
                    elif kind == "channel":
                        self._on_channel(worker)
                    elif kind == "exit":
                        self._on_exit(worker)
                    else:
                        while True:
                            try:
                                if not wake_r.recv(64):
                                    break
                            except BlockingIOError:
                                break
                if not self._stopping:
                    self._reconcile()
                if self._stopping and deadline is None:
                    deadline = time.monotonic() + self._shutdown_timeout + 5
                if deadline is not None and time.monotonic() >= deadline:
                    for worker in self._workers:
                        log.error("worker %d did not stop in time; killing it", worker.process.pid)
                        worker.process.kill()
                    deadline = time.monotonic() + 5
            return self._exit_code
        finally:
            signal.set_wakeup_fd(previous_fd)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
            self._stop()
            for worker in self._workers:
                worker.process.kill()
                worker.process.join()
            self._selector.close()
            wake_r.close()
            wake_w.close()
