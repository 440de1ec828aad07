"""One client must not exhaust the server (issue 10 §5, §6): each limit of docs/SECURITY.md, on a real server.

The server runs with scaled-down limits (``LOGSTORE_*`` variables) so every case takes about a second.
Hostile traffic comes from 127.0.0.2 where it could trip the per-address throttle; well-behaved clients use
127.0.0.1.
"""

from __future__ import annotations

import base64
import json
import select
import socket
import time
import uuid

import anyio
import httpx2
import pytest

from logstore.file.credentials import CredentialsFile
from tests.server_support import rpc_headers, serve

pytestmark = pytest.mark.anyio

PASSWORDS = {"alpha": "alpha-pw", "beta": "beta-pw", "gamma": "gamma-pw"}
LIMITS = {
    "LOGSTORE_HEADER_TIMEOUT": "0.6",
    "LOGSTORE_BODY_TIMEOUT": "0.6",
    "LOGSTORE_MAX_CONNECTIONS": "24",
    "LOGSTORE_MAX_HEADER_COUNT": "40",
    "LOGSTORE_MAX_HEADER_BYTES": "4096",
    "LOGSTORE_MAX_BODY_BYTES": "65536",
    "LOGSTORE_LARGE_BODY_BYTES": "16384",
    "LOGSTORE_AUTH_FAILURES": "3",
}
INIT = {
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "hostile", "version": "0"},
    },
}


# Each connection rule is the parser's as much as ours: every test runs on both (--http, connections.py).
PARSERS = ["auto", "h11"]  # auto: httptools (tests/test_server_http_parsers.py checks it imports)


@pytest.fixture(scope="module", params=PARSERS)
def server(request, tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("hostile")
    creds = CredentialsFile(str(data_dir))
    for site, password in PASSWORDS.items():
        creds.add(site, password)
    extra = ("--log-level", "info", "--http", request.param)
    with serve(data_dir, *extra, env=LIMITS, passwords=PASSWORDS) as running:
        yield running


def basic(site: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


def auth(site: str) -> dict[str, str]:
    return rpc_headers(("Authorization", basic(site, PASSWORDS[site])))


def raw_connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    sock = socket.socket()
    sock.bind((source, 0))
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return sock


def closed_within(sock: socket.socket, seconds: float, drip: bytes = b"") -> tuple[float, bytes]:
    """Send ``drip`` one byte every 0.1 s until the server closes; (time it took, what it answered)."""
    start, answer = time.monotonic(), b""
    sock.settimeout(0.1)
    for i in range(int(seconds * 10)):
        try:
            chunk = sock.recv(4096)
            if not chunk:
                return time.monotonic() - start, answer
            answer += chunk
        except TimeoutError:
            pass
        except ConnectionResetError:
            return time.monotonic() - start, answer
        if drip:
            try:
                sock.sendall(drip[i % len(drip) : i % len(drip) + 1])
            except (BrokenPipeError, ConnectionResetError):
                return time.monotonic() - start, answer
    raise AssertionError(f"connection still open after {seconds} s")


# --- slow connections (unauthenticated) ---------------------------------------------------------


def test_silent_and_slow_header_connections_are_closed_at_the_header_deadline(server):
    with raw_connect(server.port) as silent, raw_connect(server.port) as slow:
        slow.sendall(b"POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n")
        took_silent, answer_silent = closed_within(silent, 5)
        took_slow, answer_slow = closed_within(slow, 5, drip=b"X-Drip: aaaaaaaaaaaaaaaa\r\n")
    assert answer_silent.startswith(b"HTTP/1.1 408") and answer_slow.startswith(b"HTTP/1.1 408")
    assert took_silent < 3 and took_slow < 3  # deadline 0.6 s; generous for a loaded machine


@pytest.mark.parametrize("authorization", [None, basic("alpha", "alpha-pw")])
def test_a_dripped_body_is_cut_at_the_body_deadline(server, authorization):
    head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += "Accept: application/json, text/event-stream\r\nContent-Length: 1000\r\n"
    head += f"Authorization: {authorization}\r\n" if authorization else ""
    with raw_connect(server.port) as sock:
        sock.sendall((head + "\r\n").encode())
        took, answer = closed_within(sock, 6, drip=b"{")
    # Anonymous: answered 401 at once (the body is never read), then cut. Authenticated: 408, cut.
    assert answer.startswith(b"HTTP/1.1 401" if authorization is None else b"HTTP/1.1 408")
    assert took < 4


@pytest.fixture(scope="module", params=PARSERS)
def capped(request, tmp_path_factory):
    """Default deadlines (10 s), so only the cap can close connections within the test."""
    data_dir, cap = tmp_path_factory.mktemp("capped"), {"LOGSTORE_MAX_CONNECTIONS": "24"}
    with serve(data_dir, "--http", request.param, env=cap) as running:
        yield running


def test_connection_cap_makes_room_by_closing_idle_connections(capped):
    idle = [raw_connect(capped.port, "127.0.0.2") for _ in range(40)]
    try:
        time.sleep(0.3)
        r = httpx2.get(capped.base + "/healthz", timeout=5)
        assert r.status_code == 200  # a newcomer gets in: the connections idle longest made room
        readable, _, _ = select.select(idle, [], [], 2.0)
        answers = [sock.recv(100) for sock in readable]  # closed (b"") or answered, by the server
        assert len(answers) >= 40 - 24 + 1
        assert all(a == b"" or a.startswith(b"HTTP/1.1 503") for a in answers)
        # The oldest went first.
        assert set(readable) >= set(idle[:16])
    finally:
        for sock in idle:
            sock.close()
    log = capped.stdout()
    # Evictions were logged, but not once per connection (the log guard's burst is 5 per 10 s).
    assert 1 <= log.count("closing the connection idle longest") <= 6, log
    assert "Traceback" not in log


# --- headers and bodies ---------------------------------------------------------------------------


async def test_absurd_header_counts_and_sizes_get_431_before_the_sdk(server):
    async with httpx2.AsyncClient() as http:
        many = auth("alpha") | {f"x{i}": "v" for i in range(50)}  # count limit 40, well under 4 KiB
        r = await http.post(server.url, json=INIT, headers=many)
        assert r.status_code == 431 and r.json()["error"]["code"] == "RequestHeaderFieldsTooLarge"
        assert "request headers; the limit is 40" in r.json()["error"]["message"]
        r = await http.post(server.url, json=INIT, headers=auth("alpha"))
        assert r.status_code == 200
    # 10,000 headers in one write (the SDK's quadratic case): refused before the parser even reads them.
    head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\n" + "".join(f"x{i}:v\r\n" for i in range(10_000))
    with raw_connect(server.port) as sock:
        sock.sendall(head.encode() + b"Content-Length: 0\r\n\r\n")
        took, answer = closed_within(sock, 5)
    assert answer.startswith(b"HTTP/1.1 431") and took < 2


async def test_oversize_bodies_get_413_declared_or_streamed(server):
    body = json.dumps({"jsonrpc": "2.0", "id": 1, "method": "ping", "pad": "x" * 70_000}).encode()
    async with httpx2.AsyncClient() as http:
        r = await http.post(server.url, content=body, headers=auth("alpha"))
        assert r.status_code == 413 and r.json()["error"]["code"] == "RequestTooLarge"

        async def chunks():  # no Content-Length: the limit is counted as the body arrives
            for _ in range(10):
                yield b"x" * 8192

        r = await http.post(server.url, content=chunks(), headers=auth("alpha"))
        assert r.status_code == 413
        r = await http.post(server.url, json=INIT, headers=auth("alpha"))
        assert r.status_code == 200


async def test_a_session_keeps_working_after_a_large_request(server):
    cid = f"large-{uuid.uuid4().hex[:8]}"
    async with httpx2.AsyncClient() as http:
        r = await http.post(server.url, json=INIT, headers=auth("gamma"))
        session = auth("gamma") | {
            "Mcp-Session-Id": r.headers["mcp-session-id"],
            "MCP-Protocol-Version": "2025-11-25",
        }
        note = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        assert (await http.post(server.url, json=note, headers=session)).status_code == 202
        # A large body (over LOGSTORE_LARGE_BODY_BYTES): gated, then the session lets go of it.
        for request_id, items in ((2, [{"t": "x" * 60_000}]), (3, [{"t": "y"}])):
            call = {
                "jsonrpc": "2.0",
                "id": request_id,
                "method": "tools/call",
                "params": {"name": "append_memory", "arguments": {"conversation_id": cid, "items": items}},
            }
            r = await http.post(server.url, json=call, headers=session)
            assert r.status_code == 200 and not r.json()["result"]["isError"]


# --- §6: a client leaving mid-body ---------------------------------------------------------------


def test_a_client_leaving_mid_body_is_one_log_line(server):
    head = "POST /mcp HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
    head += "Accept: application/json, text/event-stream\r\nContent-Length: 5000\r\n"
    head += f"Authorization: {basic('beta', 'beta-pw')}\r\n\r\n"
    with raw_connect(server.port) as sock:
        sock.sendall(head.encode() + b'{"jsonrpc": "2.0"')
        time.sleep(0.2)
    deadline = time.monotonic() + 5
    while "disconnected after" not in server.stdout():
        assert time.monotonic() < deadline, server.stdout()[-2000:]
        time.sleep(0.05)
    log = server.stdout()
    assert "Exception in ASGI application" not in log and "Traceback" not in log


# --- wrong-password flood (unauthenticated) -------------------------------------------------------


async def test_wrong_password_flood_is_throttled_per_address_and_a_correct_client_gets_in(server):
    flood_transport = httpx2.AsyncHTTPTransport(local_address="127.0.0.2")
    async with httpx2.AsyncClient(transport=flood_transport, timeout=30) as flood:
        statuses: list[int] = []

        async def wrong() -> None:
            headers = rpc_headers(("Authorization", basic("alpha", uuid.uuid4().hex)))
            r = await flood.post(server.url, json=INIT, headers=headers)
            statuses.append(r.status_code)
            if r.status_code == 429:
                assert int(r.headers["retry-after"]) >= 1
                assert r.json()["error"]["code"] == "TooManyRequests"

        async with anyio.create_task_group() as tg:
            for _ in range(12):
                tg.start_soon(wrong)
    # At most LOGSTORE_AUTH_FAILURES (3) scrypt runs for the address; the rest never reached the KDF.
    assert statuses.count(401) <= 3 and statuses.count(429) >= 9, statuses
    # Another address with correct (new) credentials is unaffected.
    async with httpx2.AsyncClient(timeout=30) as http:
        r = await http.post(server.url, json=INIT, headers=auth("beta"))
        assert r.status_code == 200


# --- sessions -------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def sessions_server(tmp_path_factory):
    """Its own server: the session counts below must not include other tests' sessions."""
    data_dir = tmp_path_factory.mktemp("sessions")
    creds = CredentialsFile(str(data_dir))
    for site, password in PASSWORDS.items():
        creds.add(site, password)
    env = {"LOGSTORE_MAX_SESSIONS": "6", "LOGSTORE_MAX_SESSIONS_PER_SITE": "3"}
    with serve(data_dir, env=env, passwords=PASSWORDS) as running:
        yield running


async def test_one_site_cannot_lock_out_another(sessions_server):
    server = sessions_server
    async with httpx2.AsyncClient(timeout=30) as http:

        async def open_session(site: str) -> str:
            r = await http.post(server.url, json=INIT, headers=auth(site))
            assert r.status_code == 200, r.text
            return r.headers["mcp-session-id"]

        async def ping(sid: str, site: str) -> int:
            headers = auth(site) | {"Mcp-Session-Id": sid, "MCP-Protocol-Version": "2025-11-25"}
            r = await http.post(
                server.url, json={"jsonrpc": "2.0", "id": 9, "method": "ping"}, headers=headers
            )
            return r.status_code

        alpha = [await open_session("alpha") for _ in range(10)]  # per-site cap 3: its own oldest go
        gone = [await ping(s, "alpha") for s in alpha]
        assert gone[:7] == [404] * 7 and gone[7:] == [200] * 3
        beta = [await open_session("beta") for _ in range(3)]  # global cap 6: now full
        gamma = await open_session("gamma")  # gets in: an idle session of a largest site made room
        survivors = [*((s, "alpha") for s in alpha[7:]), *((s, "beta") for s in beta), (gamma, "gamma")]
        alive = {s: await ping(s, site) for s, site in survivors}
        assert alive[gamma] == 200
        # Exactly one session went to make room for gamma: the idle-longest of alpha or beta (3 each).
        assert list(alive.values()).count(404) == 1 and len(alive) == 7
        assert alive[alpha[7]] == 404 or alive[beta[0]] == 404
