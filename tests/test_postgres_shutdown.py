"""A SIGINT'd ``logstore serve`` on PostgreSQL exits without waiting out psycopg_pool's close timeout
(issue 22 §2: "stays alive another 3-8 s").

The shape that held it: a pool maintenance thread opening a connection to a database that does not
answer. ``ConnectionPool.close()`` joins each such thread for its ``timeout`` (5 s by default, per thread)
and logs "couldn't stop thread ... within N seconds" when it gives up: that line is the event the test
reads, so no wall-clock figure is asserted. The connection attempt is held in a black-hole for far longer
(``connect_timeout``) than any wait, so it is certainly pending when the pool closes.
"""

from __future__ import annotations

import re
import signal
import subprocess

import anyio
import pytest

from logstore.postgres.registry import PostgresRegistry
from tests.faultproxy import Fault, proxied_url, running_proxy
from tests.postgres_support import fresh_url
from tests.server_support import call, connect, error_of, serve

SITE, PASSWORD = "shutsite", "shutdown-password"
POOL_DEFAULT_CLOSE_TIMEOUT = 5.0  # psycopg_pool's ConnectionPool.close(timeout=5.0)
EXIT_BOUND = 120.0  # generous: only a server that never exits fails on it


@pytest.mark.parametrize("workers", [1, 2])
def test_sigint_does_not_wait_for_a_pool_connecting_to_a_silent_database(postgres_server, tmp_path, workers):
    url = fresh_url(postgres_server)
    PostgresRegistry(url).add(SITE, PASSWORD)
    args = {"conversation_id": "conv-shutdown-01"}
    with running_proxy(url) as proxy:
        # Calls bounded in seconds; a new connection's attempt bounded only by a long connect_timeout.
        store = proxied_url(url, proxy.port) + "&call_timeout=3&pool_timeout=1&connect_timeout=600"
        with serve(tmp_path, "--workers", str(workers), store=store) as srv:

            async def stall_the_pool() -> None:
                async with connect(srv.url, SITE, PASSWORD, "2026-07-28") as client:
                    is_error, ack = await call(client, "append_memory", {**args, "items": [{"n": 0}]})
                    assert not is_error, ack
                    proxy.set(Fault.BLACKHOLE)
                    assert proxy.reset_all() >= 1
                    # The pool finds its connection dead, discards it and starts a replacement, which the
                    # black-hole holds; this call gets no connection: the attempt is pending.
                    is_error, out = await call(client, "recall_memory", {**args, "count": 1})
                    assert is_error and error_of(out)["code"] == "Unavailable", out

            try:
                anyio.run(stall_the_pool)
                srv.proc.send_signal(signal.SIGINT)
                try:
                    code = srv.proc.wait(timeout=EXIT_BOUND)
                except subprocess.TimeoutExpired:
                    pytest.fail(f"serve still running {EXIT_BOUND} s after SIGINT:\n{srv.stdout()[-3000:]}")
            finally:
                proxy.set(Fault.PASS)
            output = srv.stdout()

    assert code in (0, 130), output[-3000:]  # 130: the single-process server's exit on Ctrl-C
    assert "Traceback" not in output, output[-3000:]
    waits = [float(w) for w in re.findall(r"couldn't stop thread '[^']*' within ([\d.]+) seconds", output)]
    assert waits, f"no pool thread was still connecting when the store closed:\n{output[-3000:]}"
    assert all(w < POOL_DEFAULT_CLOSE_TIMEOUT for w in waits), waits
