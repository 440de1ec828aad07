"""The two authentication floods of issue 22 §1, on a real server with ``--workers 1`` and ``--workers 2``.

A correct client's *first* call (credentials the server has never verified, so it needs a scrypt run)
must be served, not refused (503/429), while:

- **fresh sources** flood: every wrong-password request comes from a loopback address never used before
  (127.0.150.1, 127.0.150.2, ...), so no address ever looks suspect and the verification queue stays full
  of "clean" work;
- **one shared address** carries an agent repeating one stale password for ``alpha`` and another that has
  tried more distinct wrong passwords for ``gamma`` than ``auth_failures`` allows, while the correctly
  configured agents of ``alpha`` and ``beta`` on the same address make their first calls.

The floods are bounded in count and time and the assertions are about outcomes (status codes, counts),
never latency: the latencies are printed (``-s``) and measured properly by ``python -m bench.hostile
wrongpw`` for docs/SECURITY.md. Scaled-down limits (one scrypt thread, a queue of 8, 3 failures) make the
queue full and the throttle reachable within a second even on an idle machine.
"""

from __future__ import annotations

import json
import time
import uuid
from collections import Counter
from collections.abc import Iterator

import anyio
import httpx2
import pytest

from logstore.file.credentials import CredentialsFile
from server.auth.basic import REMEMBERED_FAILURE_HOLD
from tests.server_support import rpc_headers, serve
from tests.test_server_hostile import INIT, basic

pytestmark = pytest.mark.anyio

PASSWORDS = {"flooded": "flooded-pw", "alpha": "alpha-pw", "beta": "beta-pw", "gamma": "gamma-pw"}
LIMITS = {"LOGSTORE_KDF_THREADS": "1", "LOGSTORE_KDF_QUEUE": "8", "LOGSTORE_AUTH_FAILURES": "3"}
MAX_FLOOD_REQUESTS = 4000  # bounds both floods in count; fail_after bounds them in time
SHARED = "127.0.0.2"


@pytest.fixture(params=[1, 2], ids=["workers1", "workers2"])
def server(request, tmp_path):
    creds = CredentialsFile(str(tmp_path))
    for site, password in PASSWORDS.items():
        creds.add(site, password)
    with serve(tmp_path, "--workers", str(request.param), env=LIMITS, passwords=PASSWORDS) as running:
        running.workers = request.param  # type: ignore[attr-defined]
        yield running


async def status_of(port: int, source: str, authorization: str) -> int:
    """One raw ``POST /mcp`` from ``source`` on a fresh connection; the response's status code."""
    body = json.dumps(INIT).encode()
    head = (
        f"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nAuthorization: {authorization}\r\n"
        "Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n"
        f"Content-Length: {len(body)}\r\nConnection: close\r\n\r\n"
    )
    async with await anyio.connect_tcp("127.0.0.1", port, local_host=source) as stream:
        await stream.send(head.encode() + body)
        answer = b""
        while b"\r\n" not in answer:
            answer += await stream.receive()
    return int(answer.split()[1])


async def first_call(url: str, site: str, source: str) -> tuple[int, float]:
    """A correct client's first call from ``source``: (status, seconds)."""
    transport = httpx2.AsyncHTTPTransport(local_address=source)
    async with httpx2.AsyncClient(transport=transport, timeout=120) as http:
        headers = rpc_headers(("Authorization", basic(site, PASSWORDS[site])))
        start = time.monotonic()
        r = await http.post(url, json=INIT, headers=headers)
        return r.status_code, time.monotonic() - start


def fresh_addresses() -> Iterator[str]:
    for i in range(MAX_FLOOD_REQUESTS):
        yield f"127.0.{150 + i // 250}.{1 + i % 250}"


async def test_fresh_addresses_flooding_one_site_do_not_lock_out_a_new_client_of_another(server):
    codes: Counter[int] = Counter()
    addresses = fresh_addresses()
    stop = anyio.Event()

    async def loop() -> None:
        for address in addresses:  # shared: every request from an address never used before
            if stop.is_set():
                return
            codes[await status_of(server.port, address, basic("flooded", uuid.uuid4().hex))] += 1

    served = []
    with anyio.fail_after(240):
        async with anyio.create_task_group() as tg:
            for _ in range(40):
                tg.start_soon(loop)
            while codes[503] < 10:  # the queue has been full (and shedding) for a while
                assert sum(codes.values()) < MAX_FLOOD_REQUESTS, codes
                await anyio.sleep(0.05)
            shed_before = codes[503]
            for site in ("alpha", "beta", "gamma"):
                served.append((site, *await first_call(server.url, site, "127.0.0.1")))
            while codes[503] == shed_before:  # the flood was still at full strength after the calls
                await anyio.sleep(0.05)
            stop.set()
    print(f"first calls under a fresh-address flood: {served}; flood answered {dict(codes)}")
    assert [status for _, status, _ in served] == [200, 200, 200], (served, dict(codes))
    assert set(codes) <= {401, 503}, codes


async def test_agents_sharing_an_address_with_stale_and_wrong_passwords_do_not_lock_out_their_neighbours(
    server,
):
    # gamma's agent cycles through old passwords: more distinct failures than auth_failures (3) allows in
    # a worker (each worker counts its own; the kernel spreads connections, so 3 x workers + 1 tries).
    gamma = []
    for i in range(3 * server.workers + 1):
        gamma.append(await status_of(server.port, SHARED, basic("gamma", f"old-{i}")))
    assert set(gamma) == {401, 429}, gamma  # throttled: gamma from this address (and only gamma)
    codes: Counter[int] = Counter()
    stale = basic("alpha", "alpha-old-pw")
    stop = anyio.Event()

    async def loop() -> None:
        for _ in range(MAX_FLOOD_REQUESTS // 32):
            if stop.is_set():
                return
            codes[await status_of(server.port, SHARED, stale)] += 1

    with anyio.fail_after(240):
        started = time.monotonic()
        async with anyio.create_task_group() as tg:
            for _ in range(32):
                tg.start_soon(loop)
            while sum(codes.values()) < 64:  # every loop past its first answers: repeats from memory
                await anyio.sleep(0.05)
            served = [(site, *await first_call(server.url, site, SHARED)) for site in ("alpha", "beta")]
            stop.set()
        elapsed = time.monotonic() - started
    print(f"first calls beside a stale-password flood: {served}; flood answered {dict(codes)}")
    assert [status for _, status, _ in served] == [200, 200], (served, dict(codes))
    # The repeated stale password never counts as a new failure (no 429) and is answered from memory after
    # a hold, so each connection asks at most once per hold: the flood cannot spin the event loop.
    assert set(codes) == {401}, codes
    assert sum(codes.values()) <= 32 * (elapsed / REMEMBERED_FAILURE_HOLD + 1), (dict(codes), elapsed)
