"""``serve --workers N`` (issue 33 §5): a worker that does not take its connections (``SIGSTOP``ped) is
skipped by the acceptor after at most ``_MAX_UNACKED`` of them, and used again once it takes them.

The server test reads which worker holds a connection from the kernel (``bench.procfs``); the unit tests
drive ``Supervisor._hand_off`` over real socketpairs with stand-in workers, so the age bound is shown
without waiting for it, and the worker's ``_Inbox`` with its channel full.
"""

from __future__ import annotations

import asyncio
import os
import signal
import socket
import sys
import time
from types import SimpleNamespace
from typing import Any

import pytest

from bench.load import LightClient
from bench.procfs import worker_pids
from logstore.file.credentials import CredentialsFile
from server.transport.handoff import _ACK, _ACK_CHUNK, _CONN, _READY, _Inbox
from server.transport.workers import _ACK_TIMEOUT, _MAX_UNACKED, Supervisor, _Worker
from tests.server_support import serve
from tests.test_server_workers import CALLS, CLIENTS, _trial

NEW_CONNECTIONS = 24
CALL_BOUND = 60.0  # generous: on an idle machine every call here takes milliseconds


async def _new_connection_call(url: str) -> None:
    async with LightClient(url, "alpha", "pw") as client:
        await client.call("list_conversations", {})


async def _until_done(tasks: list[asyncio.Task[None]], count: int, timeout: float) -> set[asyncio.Task[None]]:
    """Wait until ``count`` of ``tasks`` are done (or ``timeout``); the done ones."""
    deadline = time.monotonic() + timeout
    done = {t for t in tasks if t.done()}
    while len(done) < count and time.monotonic() < deadline:
        pending = [t for t in tasks if t not in done]
        newly, _ = await asyncio.wait(
            pending, timeout=deadline - time.monotonic(), return_when=asyncio.FIRST_COMPLETED
        )
        done |= newly
    return done


async def _stopped_then_resumed(url: str, port: int, stopped: int, pids: list[int]) -> dict[str, Any]:
    calls = [asyncio.create_task(_new_connection_call(url)) for _ in range(NEW_CONNECTIONS)]
    try:
        done = await _until_done(calls, NEW_CONNECTIONS - _MAX_UNACKED, CALL_BOUND)
        served_while_stopped = len(done)
        for task in done:
            task.result()  # a failed call fails the test
        os.kill(stopped, signal.SIGCONT)
        # The connections the stopped worker holds are served once it runs again: none is lost.
        done = await _until_done(calls, NEW_CONNECTIONS, CALL_BOUND)
        for task in done:
            task.result()
        all_served = len(done)
        # ...and it is handed new connections again: 16 clients at once split exactly (a trial during which
        # its acknowledgements were still on the way may split unevenly; the next one round robin).
        even, deadline = [CLIENTS * CALLS // 2] * 2, time.monotonic() + CALL_BOUND
        while True:
            served = await _trial(url, port, pids)
            if sorted(served.values()) == even or time.monotonic() > deadline:
                break
        return {"while_stopped": served_while_stopped, "all": all_served, "after": dict(served)}
    finally:
        for task in calls:
            task.cancel()
        await asyncio.gather(*calls, return_exceptions=True)


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")
def test_a_stopped_worker_gets_at_most_max_unacked_connections_and_gets_them_again_when_it_resumes(tmp_path):
    CredentialsFile(str(tmp_path)).add("alpha", "pw")
    with serve(tmp_path, "--workers", "2") as server:
        pids = worker_pids(server.proc.pid)
        assert len(pids) == 2
        stopped = pids[0]
        os.kill(stopped, signal.SIGSTOP)
        try:
            scenario = _stopped_then_resumed(server.url, server.port, stopped, pids)
            result = asyncio.run(asyncio.wait_for(scenario, 4 * CALL_BOUND))  # each phase is bounded too
        finally:
            os.kill(stopped, signal.SIGCONT)
    print(f"\n[serve --workers 2, one SIGSTOPped] {result}")
    # Before: round robin gave the stopped worker every other connection, 12 of the 24 calls hung.
    assert result["while_stopped"] >= NEW_CONNECTIONS - _MAX_UNACKED, result
    assert result["all"] == NEW_CONNECTIONS, result
    assert sorted(result["after"].values()) == [CLIENTS * CALLS // 2] * 2, result


# -- the acceptor's choice, over real channels --------------------------------------------------------------
class _Channels:
    """``count`` stand-in workers, each a real ``SOCK_SEQPACKET`` pair: the acceptor's end in a ``_Worker``,
    the worker's end here (to see what was handed over, and to acknowledge it)."""

    def __init__(self, count: int) -> None:
        listener = socket.socket()
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        self.listener = listener
        self.supervisor = Supervisor(listener, 0, print, shutdown_timeout=1)
        self.theirs: list[socket.socket] = []
        for pid in range(count):
            mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            mine.setblocking(False)
            theirs.setblocking(False)
            worker = _Worker(SimpleNamespace(pid=1000 + pid), mine, ready=True, served=True)  # type: ignore[arg-type]
            self.supervisor._workers.append(worker)
            self.theirs.append(theirs)

    def hand_off(self) -> int | None:
        """Hand one connection over; the index of the worker that received it, or None if none took it."""
        with socket.socket() as conn:
            if not self.supervisor._hand_off(conn):
                return None
        got = []
        for i, theirs in enumerate(self.theirs):
            try:
                _, fds, _, _ = socket.recv_fds(theirs, 16, 1)
            except BlockingIOError:
                continue
            for fd in fds:
                os.close(fd)
            got.append(i)
        assert len(got) == 1, got
        return got[0]

    def acknowledge(self, i: int, count: int) -> None:
        self.theirs[i].send(_ACK * count)

    def close(self) -> None:
        for theirs in self.theirs:
            theirs.close()
        for worker in self.supervisor._workers:
            worker.channel.close()
        self.listener.close()


@pytest.fixture
def channels():
    made: list[_Channels] = []
    yield lambda count: made.append(_Channels(count)) or made[-1]
    for c in made:
        c.close()


def test_workers_that_acknowledge_get_exact_round_robin(channels):
    c = channels(3)
    order = []
    for _ in range(30):
        i = c.hand_off()
        assert i is not None
        order.append(i)
        c.acknowledge(i, 1)
    assert order == [0, 1, 2] * 10


def test_a_worker_max_unacked_behind_is_skipped_until_it_acknowledges(channels):
    c = channels(2)
    order = []
    for _ in range(3 * _MAX_UNACKED):  # worker 0 never acknowledges, worker 1 each connection at once
        order.append(c.hand_off())
        if order[-1] == 1:
            c.acknowledge(1, 1)
    assert order == [0, 1] * _MAX_UNACKED + [1] * _MAX_UNACKED
    c.acknowledge(0, _MAX_UNACKED)  # it takes its connections again: round robin resumes
    order = []
    for _ in range(6):
        order.append(c.hand_off())
        c.acknowledge(order[-1], 1)
    assert sorted(order) == [0, 0, 0, 1, 1, 1] and order[0::2] in ([0, 0, 0], [1, 1, 1]), order


def test_a_worker_whose_oldest_hand_off_is_older_than_the_bound_is_skipped(channels):
    c = channels(2)
    assert [c.hand_off(), c.hand_off()] == [0, 1]
    c.acknowledge(1, 1)
    # Worker 0's one hand-off is made older than the bound (its send time moved back instead of waiting):
    # it is skipped long before it holds _MAX_UNACKED.
    c.supervisor._workers[0].unacked[0] -= _ACK_TIMEOUT
    got = []
    for _ in range(4):
        got.append(c.hand_off())
        c.acknowledge(1, 1)
    assert got == [1] * 4
    assert c.supervisor._workers[0].stalled
    c.acknowledge(0, 1)
    assert sorted(c.hand_off() for _ in range(2)) == [0, 1]
    assert not c.supervisor._workers[0].stalled


def test_when_no_worker_takes_connections_the_connection_is_held_and_nothing_is_sent(channels):
    c = channels(2)
    for _ in range(2 * _MAX_UNACKED):
        assert c.hand_off() is not None
    assert c.hand_off() is None  # the acceptor holds it and stops accepting (see _reconcile)
    c.acknowledge(1, 1)
    assert c.hand_off() == 1
    for i, worker in enumerate(c.supervisor._workers):  # neither is full now, but both are stalled:
        c.acknowledge(i, _MAX_UNACKED - 1)
        c.supervisor._on_channel(worker)
        assert len(worker.unacked) == 1
        worker.unacked[0] -= _ACK_TIMEOUT
    assert c.hand_off() is None


def test_a_worker_acknowledges_what_it_received_even_when_its_channel_was_full():
    """The worker's side: every descriptor is acknowledged; with the channel full (the acceptor not
    reading), the acknowledgements wait for room instead of being lost or blocking the worker's loop."""

    async def scenario() -> tuple[int, int]:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        mine.setblocking(False)
        theirs.setblocking(False)
        filler = 0
        while True:  # fill the worker -> acceptor direction
            try:
                theirs.send(_READY)
            except BlockingIOError:
                break
            filler += 1
        started: list[asyncio.BaseTransport] = []

        class Protocol(asyncio.Protocol):
            def connection_made(self, transport: asyncio.BaseTransport) -> None:
                started.append(transport)

        inbox = _Inbox(theirs, Protocol, None, lambda: None)
        pairs = [socket.socketpair() for _ in range(3)]
        for a, _b in pairs:
            socket.send_fds(mine, [_CONN], [a.fileno()])
        while len(started) < 3:  # the worker takes them although it cannot acknowledge yet
            await asyncio.sleep(0.01)
        acks = 0
        while acks < 3:  # the acceptor reads again: the filler, then the acknowledgements
            try:
                data = mine.recv(_ACK_CHUNK)
            except BlockingIOError:
                await asyncio.sleep(0.01)
                continue
            if data != _READY:
                assert data == _ACK * len(data), data
                acks += len(data)
        inbox.close()
        for transport in started:
            transport.close()
        for a, b in pairs:
            a.close()
            b.close()
        mine.close()
        return filler, acks

    filler, acks = asyncio.run(asyncio.wait_for(scenario(), CALL_BOUND))
    assert filler > 0 and acks == 3
