"""A fault-injecting TCP proxy for the network tests: listens on 127.0.0.1, forwards each connection to the
test PostgreSQL (its Unix socket, or a loopback host:port), and does to the traffic what the test says:

    PASS        forward both ways
    LATENCY     hold every chunk ``latency`` seconds before forwarding it (each direction in order)
    BLACKHOLE   forward nothing, accept new connections and forward nothing on them either; what was read
                is delivered when the black-hole ends (as TCP retransmission would: the stream stays whole)
    DROP        reset (RST) every open connection and every new one
    cut_after   the next client->server chunk holding a marker is forwarded; the database's reply is held
                until its ReadyForQuery (the statement has committed), then both sides are cut (RST to the
                client): the request reached the database, the answer never reaches the client

Bounded: at most ``max_connections`` open pairs (more are reset), one event-loop thread, ``close()``
resets everything and joins the thread. Loopback only.
"""

from __future__ import annotations

import asyncio
import contextlib
import enum
import socket
import struct
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from urllib.parse import urlsplit, urlunsplit

from psycopg.conninfo import conninfo_to_dict

__all__ = ["Fault", "FaultProxy", "proxied_url", "running_proxy"]


class Fault(enum.Enum):
    PASS = "pass"
    LATENCY = "latency"
    BLACKHOLE = "blackhole"
    DROP = "drop"


_LINGER_RST = struct.pack("ii", 1, 0)


@dataclass(eq=False)
class _Pair:
    client: asyncio.StreamWriter
    server: asyncio.StreamWriter
    cut_pending: bool = False
    reply: bytearray = field(default_factory=bytearray)
    closed: bool = False


class FaultProxy:
    def __init__(self, upstream_url: str, *, max_connections: int = 128) -> None:
        params = conninfo_to_dict(upstream_url)
        host, port = params.get("host") or "/tmp", int(params.get("port") or 5432)
        if str(host).startswith("/"):
            self._unix: str | None = f"{host}/.s.PGSQL.{port}"
            self._tcp: tuple[str, int] | None = None
        else:
            assert str(host).startswith("127.") or host == "localhost", "loopback only"
            self._unix, self._tcp = None, (str(host), port)
        self.upstream_url = upstream_url
        self.max_connections = max_connections
        self.fault = Fault.PASS
        self.latency = 0.0
        self.accepted = 0
        self.resets = 0
        self.cuts = 0
        self._marker: bytes | None = None
        self._cut_done: threading.Event | None = None
        self._pairs: set[_Pair] = set()
        self._loop = asyncio.new_event_loop()
        self._flowing = asyncio.Event()
        self._thread = threading.Thread(target=self._loop.run_forever, name="fault-proxy", daemon=True)
        self._server: asyncio.Server | None = None
        self.port = 0

    # --- control (from any thread) -------------------------------------------------------------------
    def start(self) -> FaultProxy:
        self._thread.start()
        self._call(self._start())
        return self

    def set(self, fault: Fault, *, latency: float = 0.0) -> None:
        self._call(self._set(fault, latency))

    def reset_all(self) -> int:
        """Reset every open connection now; how many there were."""
        return self._call(self._reset_all())

    def cut_after(self, marker: bytes) -> threading.Event:
        """Arm a cut on the next request carrying ``marker``; the event is set once it happened."""
        done = threading.Event()
        self._call(self._arm_cut(marker, done))
        return done

    def close(self) -> None:
        if self._thread.is_alive():
            self._call(self._stop())
            self._loop.call_soon_threadsafe(self._loop.stop)
            self._thread.join(timeout=30)
        if not self._thread.is_alive():
            self._loop.close()

    def _call(self, coro):  # type: ignore[no-untyped-def]
        return asyncio.run_coroutine_threadsafe(coro, self._loop).result(timeout=30)

    # --- the loop ------------------------------------------------------------------------------------
    async def _start(self) -> None:
        self._flowing.set()
        self._server = await asyncio.start_server(self._accept, "127.0.0.1", 0)
        self.port = self._server.sockets[0].getsockname()[1]

    async def _set(self, fault: Fault, latency: float) -> None:
        self.fault, self.latency = fault, latency
        if fault is Fault.BLACKHOLE:
            self._flowing.clear()
        else:
            self._flowing.set()
        if fault is Fault.DROP:
            await self._reset_all()

    async def _reset_all(self) -> int:
        pairs = list(self._pairs)
        for pair in pairs:
            self._abort(pair)
        for _ in range(3):  # the transports close their sockets on the next turns of the loop
            await asyncio.sleep(0)
        return len(pairs)

    async def _arm_cut(self, marker: bytes, done: threading.Event) -> None:
        self._marker, self._cut_done = marker, done

    async def _stop(self) -> None:
        if self._server is not None:
            self._server.close()
        await self._reset_all()
        self._flowing.set()
        others = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
        if others:
            _, pending = await asyncio.wait(others, timeout=5)
            for task in pending:
                task.cancel()

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.accepted += 1
        if self.fault is Fault.DROP or len(self._pairs) >= self.max_connections:
            _rst(writer)
            self.resets += 1
            return
        try:
            if self._unix is not None:
                up_reader, up_writer = await asyncio.open_unix_connection(self._unix)
            else:
                assert self._tcp is not None
                up_reader, up_writer = await asyncio.open_connection(*self._tcp)
        except OSError:
            _rst(writer)
            return
        pair = _Pair(writer, up_writer)
        self._pairs.add(pair)
        try:
            await asyncio.gather(
                self._pump(pair, reader, up_writer, True), self._pump(pair, up_reader, writer, False)
            )
        except asyncio.CancelledError:
            pass
        finally:
            self._abort(pair)

    async def _pump(
        self, pair: _Pair, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, to_server: bool
    ) -> None:
        tail = b""
        try:
            while not pair.closed:
                chunk = await reader.read(65536)
                if not chunk:
                    return
                if self.latency and self.fault is Fault.LATENCY:
                    await asyncio.sleep(self.latency)
                await self._flowing.wait()
                if pair.closed:
                    return
                if to_server:
                    if self._marker is not None and self._marker in tail + chunk:
                        self._marker = None
                        pair.cut_pending = True
                    tail = chunk[-64:]
                elif pair.cut_pending:
                    pair.reply += chunk
                    if _ready_for_query(pair.reply):  # committed; the client never hears it
                        self.cuts += 1
                        self._abort(pair)
                        if self._cut_done is not None:
                            self._cut_done.set()
                    continue
                writer.write(chunk)
                await writer.drain()
        except (OSError, asyncio.IncompleteReadError):
            return
        finally:
            pair.closed = True
            self._abort(pair)

    def _abort(self, pair: _Pair) -> None:
        if pair in self._pairs:
            self._pairs.discard(pair)
            self.resets += 1
        pair.closed = True
        _rst(pair.client)
        pair.server.transport.abort()


def _rst(writer: asyncio.StreamWriter) -> None:
    sock = writer.get_extra_info("socket")
    if sock is not None and sock.family == socket.AF_INET:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_RST)
    writer.transport.abort()


def _ready_for_query(data: bytes) -> bool:
    """Whether the backend messages in ``data`` (from a message boundary) include ReadyForQuery ('Z')."""
    at = 0
    while at + 5 <= len(data):
        kind, length = data[at : at + 1], struct.unpack("!i", data[at + 1 : at + 5])[0]
        if kind == b"Z":
            return True
        at += 1 + length
    return False


def proxied_url(url: str, port: int) -> str:
    """``url`` (a postgresql:// URL) pointed at 127.0.0.1:``port``, its other parameters kept."""
    parts = urlsplit(url)
    user = parts.netloc.rpartition("@")[0]
    query = "&".join(
        piece for piece in parts.query.split("&") if piece and piece.partition("=")[0] not in ("host", "port")
    )
    netloc = f"{user}@127.0.0.1:{port}" if user else f"127.0.0.1:{port}"
    return urlunsplit(parts._replace(netloc=netloc, query=query))


@contextlib.contextmanager
def running_proxy(upstream_url: str, **kwargs: int) -> Iterator[FaultProxy]:
    proxy = FaultProxy(upstream_url, **kwargs).start()
    try:
        yield proxy
    finally:
        proxy.close()
