"""``--workers N``: one acceptor process hands each new connection to the next worker, round robin.

Why not a shared listening socket (what ``uvicorn --workers`` does): every worker waits on it and the first
to wake accepts everything queued, so 16 clients connecting at once often all landed on one worker, and
keep-alive kept them there (issue 15: per-worker CPU 16.5 s / 0.0 s). Why not one ``SO_REUSEPORT`` socket
per worker: the kernel spreads connections by a hash of the 4-tuple, i.e. at random, and 16 connections
over 2 sockets split worse than 35/65 in 43 of 200 trials on this kernel (binomial: 21%), so ten clean
trials out of ten happen only ~9% of the time. Round robin from one acceptor is exact, the way Node's
``cluster`` module distributes by default. The acceptor only accepts and passes the descriptor
(``SCM_RIGHTS`` over a per-worker ``AF_UNIX`` socketpair); requests never go through it.

The supervisor keeps uvicorn's behaviour: a worker that dies after it started serving is replaced; one that
dies before (broken app, unreadable data dir) stops the server, since a restart would fail the same way;
SIGINT/SIGTERM stop accepting, ask every worker to shut down gracefully and wait for them. A worker whose
acceptor disappears (``kill -9`` of the parent) sees its channel close and shuts down too.
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import os
import selectors
import signal
import socket
import sys
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.process import BaseProcess
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

__all__ = ["HandoffServer", "Supervisor"]

log = logging.getLogger("logstore.server")

_READY = b"R"  # worker -> acceptor: serving; acceptor -> worker messages carry one descriptor and b"C"
_CONN = b"C"
_ACCEPT_BURST = 64  # connections accepted per wake-up before the loop looks at its other sources
_ACCEPT_BACKOFF = 0.25  # seconds without accepting after accept() failed (out of descriptors)


class _Inbox:
    """The worker's side of the channel, standing where uvicorn keeps its listening ``asyncio.Server``s:
    ``close()``/``wait_closed()`` are what uvicorn's shutdown calls on them."""

    def __init__(
        self,
        channel: socket.socket,
        protocol_factory: Callable[[], asyncio.Protocol],
        ssl: Any,
        on_eof: Callable[[], None],
    ) -> None:
        self._channel = channel
        self._factory = protocol_factory
        self._ssl = ssl
        self._on_eof = on_eof
        self._loop = asyncio.get_running_loop()
        self._pending: set[asyncio.Task[Any]] = set()
        channel.setblocking(False)
        self._loop.add_reader(channel.fileno(), self._receive)

    def _receive(self) -> None:
        while True:
            try:
                data, fds, _, _ = socket.recv_fds(self._channel, 16, 1)
            except (BlockingIOError, InterruptedError):
                return
            except OSError:
                data, fds = b"", []
            if not data and not fds:  # the acceptor is gone: nothing new will arrive
                self.close()
                self._on_eof()
                return
            for fd in fds:
                conn = socket.socket(fileno=fd)
                conn.setblocking(False)
                task = self._loop.create_task(
                    self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl)
                )
                self._pending.add(task)
                task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:  # e.g. a failed TLS handshake
            log.debug("connection not started: %r", task.exception())

    def close(self) -> None:
        if self._channel.fileno() != -1:
            self._loop.remove_reader(self._channel.fileno())
            self._channel.close()

    async def wait_closed(self) -> None:
        return None


class HandoffServer(uvicorn.Server):
    """A uvicorn server that listens on nothing: its connections arrive over ``channel``."""

    def __init__(self, config: uvicorn.Config, channel: socket.socket) -> None:
        super().__init__(config)
        self._channel = channel

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        # Mirrors uvicorn.Server.startup minus the bind; the protocol is built exactly as it builds it.
        await self.lifespan.startup()
        if self.lifespan.should_exit:
            sys.exit(STARTUP_FAILURE)
        config = self.config

        def create_protocol(_loop: asyncio.AbstractEventLoop | None = None) -> asyncio.Protocol:
            return config.http_protocol_class(  # type: ignore[call-arg]
                config=config, server_state=self.server_state, app_state=self.lifespan.state, _loop=_loop
            )

        self.servers = [_Inbox(self._channel, create_protocol, config.ssl, self._acceptor_gone)]  # type: ignore[list-item]
        self.started = True
        self._channel.send(_READY)

    def _acceptor_gone(self) -> None:
        if not self.should_exit:
            log.warning("acceptor process is gone; worker %d shutting down", os.getpid())
            self.should_exit = True


@dataclass
class _Worker:
    process: BaseProcess
    channel: socket.socket
    ready: bool = False  # takes connections now
    served: bool = False  # finished its startup once (a later death is not a startup failure)


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
        if worker.channel.fileno() == -1:  # closed by an exit event earlier in the same batch
            return
        try:
            data = worker.channel.recv(16)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if data == _READY:
            worker.ready = worker.served = True
            log.info("worker %d ready", worker.process.pid)
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
        """Send ``conn`` to the next ready worker with room in its channel; False if none took it."""
        n = len(self._workers)
        for i in range(n):
            worker = self._workers[(self._next + i) % n]
            if not worker.ready:
                continue
            try:
                socket.send_fds(worker.channel, [_CONN], [conn.fileno()])
            except (BlockingIOError, InterruptedError):
                continue  # this worker is not draining its channel: give the connection to another
            except OSError:
                worker.ready = False
                continue
            self._next = (self._next + i + 1) % n
            return True
        return False

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
