"""The worker's side of ``--workers N`` (``workers.py`` is the acceptor's) and the channel between them.

The channel is a per-worker ``AF_UNIX`` ``SOCK_SEQPACKET`` socketpair, so every message arrives whole:

- acceptor -> worker: ``_CONN`` with one connection's descriptor (``SCM_RIGHTS``);
- worker -> acceptor: ``_READY`` once startup is done; ``_ACK * n`` (n <= ``_ACK_CHUNK``) when n more
  descriptors arrived, which is how the acceptor knows the worker takes its connections (issue 33);
- either side closing it: the other is gone.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
import sys
from collections.abc import Callable
from typing import Any

import uvicorn
from uvicorn.config import STARTUP_FAILURE

__all__ = ["HandoffServer"]

log = logging.getLogger("logstore.server")

_READY = b"R"
_CONN = b"C"
_ACK = b"A"
_ACK_CHUNK = 64  # the acceptor reads messages of up to this many bytes


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
        self._unsent_acks = 0
        self._ack_writer = False  # waiting for room in the channel to send _unsent_acks
        channel.setblocking(False)
        self._loop.add_reader(channel.fileno(), self._receive)

    def _receive(self) -> None:
        received = 0
        try:
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
                received += len(fds)
                self._start(fds)
        finally:
            if received and self._channel.fileno() != -1:
                self._acknowledge(received)

    def _acknowledge(self, count: int) -> None:
        """Tell the acceptor ``count`` more descriptors arrived (it skips workers that do not say so). A
        full channel (the acceptor is itself stalled) keeps the count for when it has room again."""
        self._unsent_acks += count
        while self._unsent_acks:
            chunk = min(self._unsent_acks, _ACK_CHUNK)
            try:
                self._channel.send(_ACK * chunk)
            except (BlockingIOError, InterruptedError):
                if not self._ack_writer:
                    self._loop.add_writer(self._channel.fileno(), self._acknowledge, 0)
                    self._ack_writer = True
                return
            except OSError:  # the acceptor is gone; the receive side sees the end and shuts down
                self._unsent_acks = 0
                break
            self._unsent_acks -= chunk
        if self._ack_writer:
            self._loop.remove_writer(self._channel.fileno())
            self._ack_writer = False

    def _start(self, fds: list[int]) -> None:
        for fd in fds:
            conn = socket.socket(fileno=fd)
            conn.setblocking(False)
            started = self._loop.connect_accepted_socket(self._factory, conn, ssl=self._ssl)
            task = self._loop.create_task(started)
            self._pending.add(task)
            task.add_done_callback(self._started)

    def _started(self, task: asyncio.Task[Any]) -> None:
        self._pending.discard(task)
        if not task.cancelled() and task.exception() is not None:  # e.g. a failed TLS handshake
            log.debug("connection not started: %r", task.exception())

    def close(self) -> None:
        if self._channel.fileno() != -1:
            if self._ack_writer:
                self._loop.remove_writer(self._channel.fileno())
                self._ack_writer = False
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
