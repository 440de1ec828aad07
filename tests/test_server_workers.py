"""``logstore serve --workers N``: connections spread evenly, dead workers replaced, clean shutdown.

Which worker served a connection is read from the kernel, not from the server (``bench.procfs``): the
server-side socket of each client connection and the worker process holding it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bench.load import LightClient
from bench.procfs import connection_owners, worker_pids
from logstore.file.credentials import CredentialsFile
from tests.server_support import serve

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CLIENTS, CALLS, TRIALS = 16, 3, 10


async def _trial(url: str, port: int, pids: list[int]) -> Counter[int]:
    """16 clients connect at once, each makes CALLS calls on its connection; calls per worker pid."""
    clients = [LightClient(url, "alpha", "pw") for _ in range(CLIENTS)]
    await asyncio.gather(*(c.__aenter__() for c in clients))
    try:
        await asyncio.gather(*(_calls(c) for c in clients))
        owners = connection_owners(port, [c.local_port for c in clients], pids)
        assert None not in owners
        return Counter({pid: n * CALLS for pid, n in Counter(owners).items()})
    finally:
        await asyncio.gather(*(c.__aexit__() for c in clients))


async def _calls(client: LightClient) -> None:
    for _ in range(CALLS):
        await client.call("list_conversations", {})


def test_sixteen_clients_connecting_at_once_spread_over_two_workers(tmp_path):
    CredentialsFile(str(tmp_path)).add("alpha", "pw")
    with serve(tmp_path, "--workers", "2") as server:
        pids = worker_pids(server.proc.pid)
        assert len(pids) == 2
        shares = []
        for _ in range(TRIALS):
            served = asyncio.run(_trial(server.url, server.port, pids))
            assert sum(served.values()) == CLIENTS * CALLS
            shares.append(served[pids[0]] / (CLIENTS * CALLS))
        assert all(0.35 <= s <= 0.65 for s in shares), shares


def test_a_dead_worker_is_replaced_and_signals_stop_everything(tmp_path):
    CredentialsFile(str(tmp_path)).add("alpha", "pw")
    for sig in (signal.SIGTERM, signal.SIGINT):
        with serve(tmp_path, "--workers", "2") as server:
            before = worker_pids(server.proc.pid)
            os.kill(before[0], signal.SIGKILL)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline:
                now = worker_pids(server.proc.pid)
                if len(now) == 2 and before[0] not in now:
                    break
                time.sleep(0.1)
            assert len(now) == 2 and before[0] not in now and before[1] in now
            # The replacement joins the rotation once its startup is done (meanwhile the survivor serves):
            # a trial during which it joined splits unevenly, the next one round robin exactly.
            even = [CLIENTS * CALLS // 2] * 2
            while time.monotonic() < deadline:
                served = asyncio.run(_trial(server.url, server.port, now))
                if sorted(served.values()) == even:
                    break
                time.sleep(0.2)
            assert sorted(served.values()) == even
            server.proc.send_signal(sig)
            assert server.proc.wait(timeout=20) == 0
            for pid in now:  # every worker exited (and was reaped by the supervisor)
                assert not Path(f"/proc/{pid}").exists()
        assert "died" in server.stdout()


def test_accept_failing_for_lack_of_descriptors_pauses_instead_of_spinning():
    import errno
    import socket as socket_module

    from server.transport.workers import Supervisor

    listener = socket_module.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    client = socket_module.create_connection(listener.getsockname())  # the listener is readable
    calls = []

    class Exhausted:  # a listener whose accept() fails the way it does at the descriptor limit
        def __getattr__(self, name):
            return getattr(listener, name)

        def accept(self):
            calls.append(1)
            raise OSError(errno.EMFILE, "Too many open files")

    supervisor = Supervisor(Exhausted(), 0, print, shutdown_timeout=1)
    supervisor._started = True
    supervisor._reconcile()
    assert supervisor._accepting
    supervisor._accept()
    supervisor._reconcile()
    assert len(calls) == 1 and not supervisor._accepting  # one try, then the listener is left alone
    supervisor._accept_paused_until = 0  # the back-off elapsed: accepting resumes
    supervisor._reconcile()
    assert supervisor._accepting
    client.close()
    listener.close()
