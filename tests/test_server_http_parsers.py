"""The HTTP/1.1 parser under uvicorn (``--http``, server/transport/connections.py): httptools by default,
h11 as the fallback, with the same connection rules on both.

- request smuggling and malformed framing are refused (400 and the connection closed, nothing after the
  bad request served) by either parser, as are header blocks over the limit (431 before parsing);
- a header block is measured across reads, and legitimate keep-alive and pipelined traffic is served;
- without httptools, ``auto`` serves with h11 and says so, and ``--http httptools`` refuses to start.

The hostile-client suite (tests/test_server_hostile.py) runs on both parsers too.
"""

from __future__ import annotations

import os
import re
import socket
import time

import pytest

from server.transport.connection_rules import head_overflows
from server.transport.connections import resolve_parser
from tests.server_support import serve

PARSERS = ["auto", "h11"]  # auto is httptools (a declared dependency): checked below
# The header deadline stays under uvicorn's 5 s keep-alive timeout: see the kept-alive deadline test.
LIMITS = {"LOGSTORE_MAX_HEADER_BYTES": "4096", "LOGSTORE_HEADER_TIMEOUT": "4.5"}
HOST = b"Host: 127.0.0.1\r\n"


def test_auto_is_httptools_here():
    assert resolve_parser("auto") == "httptools"


@pytest.mark.parametrize(
    ("seen", "tail", "data", "overflows"),
    [
        (0, b"", b"GET / HTTP/1.1\r\n\r\n", False),
        (0, b"", b"x" * 100 + b"\r\n\r\n", False),  # ends at exactly the limit
        (0, b"", b"x" * 101 + b"\r\n\r\n", True),  # one byte over
        (0, b"", b"x" * 100, False),  # incomplete, at the limit
        (0, b"", b"x" * 101, True),  # incomplete, over it
        (60, b"xxx", b"x" * 40, False),
        (60, b"xxx", b"x" * 41, True),  # incomplete: counted across reads
        (60, b"xxx", b"x" * 40 + b"\r\n\r\n", False),
        (60, b"x\r\n", b"\r\n" + b"x" * 500, False),  # ends across the reads, at 60 bytes
        (100, b"x\r\n", b"\r\n", False),  # (an incomplete block over the limit was refused already)
        (0, b"", b"x" * 10 + b"\r\n\r\n" + b"y" * 500, False),  # a body after the block is not counted
    ],
)
def test_head_overflows_measures_the_header_block_across_reads(seen, tail, data, overflows):
    assert head_overflows(seen, tail, data, 100) is overflows


@pytest.fixture(scope="module", params=PARSERS)
def server(request, tmp_path_factory):
    with serve(tmp_path_factory.mktemp("parser"), "--http", request.param, env=LIMITS) as running:
        yield running


def exchange(port: int, *writes: bytes, answers: int | None = None) -> tuple[list[int], bool]:
    """Send ``writes`` (0.2 s apart, so that each is a read of its own), then read until the server closes
    the connection, or until ``answers`` responses have begun: (their statuses, in order; whether the
    server closed the connection). A server that neither answers nor closes fails the test at the
    header deadline (4.5 s: 408), at the latest at the socket's 30 s timeout."""
    sock = socket.create_connection(("127.0.0.1", port))
    sock.settimeout(30)
    answer, closed = b"", False
    statuses: list[int] = []
    try:
        for i, data in enumerate(writes):
            if i:
                time.sleep(0.2)
            try:
                sock.sendall(data)
            except (BrokenPipeError, ConnectionResetError):
                closed = True
                break
        while not closed and (answers is None or len(statuses) < answers):
            try:
                chunk = sock.recv(65536)
            except ConnectionResetError:
                chunk = b""
            answer += chunk
            closed = not chunk
            statuses = [int(s) for s in re.findall(rb"HTTP/1\.1 (\d{3}) ", answer)]
    finally:
        sock.close()
    return statuses, closed


SMUGGLED = b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n"  # served only if the framing was misread
REFUSED = {
    "length and chunked": b"Content-Length: 4\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\n",
    "chunked and length": b"Transfer-Encoding: chunked\r\nContent-Length: 4\r\n\r\n0\r\n\r\n",
    "two content-lengths": b"Content-Length: 4\r\nContent-Length: 40\r\n\r\nabcd",
    "a content-length list": b"Content-Length: 4, 40\r\n\r\nabcd",
    "a signed content-length": b"Content-Length: +4\r\n\r\nabcd",
    "transfer-encoding identity": b"Transfer-Encoding: identity\r\nContent-Length: 4\r\n\r\nabcd",
    "chunked not last": b"Transfer-Encoding: chunked, identity\r\n\r\n0\r\n\r\n",
    "an unknown coding": b"Transfer-Encoding: xchunked\r\n\r\n0\r\n\r\n",
    "a space before the colon": b"Transfer-Encoding : chunked\r\n\r\n0\r\n\r\n",
    "a bad chunk size": b"Transfer-Encoding: chunked\r\n\r\nzz\r\n\r\n",
    "a NUL in a value": b"X-A: a\x00b\r\n\r\n",
    "a space in a name": b"X A: b\r\n\r\n",
}


@pytest.mark.parametrize("case", REFUSED)
def test_ambiguous_or_malformed_framing_is_refused_and_nothing_after_it_is_served(server, case):
    request = b"POST /healthz HTTP/1.1\r\n" + HOST + REFUSED[case]
    statuses, closed = exchange(server.port, request + SMUGGLED)
    assert statuses == [400] and closed


@pytest.mark.parametrize(
    "head",
    [
        b"GET /healthz HTTP/1.1\r\n\r\n",  # HTTP/1.1 requires a Host
        b"GET /healthz HTTP/1.1\r\n" + HOST + b"Host: other\r\n\r\n",  # which one would be checked?
    ],
)
def test_a_request_without_exactly_one_host_is_refused(server, head):
    assert exchange(server.port, head + SMUGGLED) == ([400], True)


def test_a_target_that_is_not_a_path_is_never_served(server):
    statuses, _ = exchange(server.port, b"GET http://other/healthz HTTP/1.1\r\n" + HOST + b"\r\n", answers=1)
    assert len(statuses) == 1 and 400 <= statuses[0] < 500  # h11 routes it as a path: 404


def test_a_header_block_over_the_limit_gets_431_before_parsing_in_one_read_or_several(server):
    big = b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-A: " + b"a" * 5000 + b"\r\n\r\n"
    assert exchange(server.port, big) == ([431], True)
    # 1,500 bytes a write (0.2 s apart, so a read each), never complete: refused at the one that takes it
    # over 4,096 bytes, the last (a write after the server closed could reset the connection before its
    # answer is read). Counted per read instead, it would wait for the header deadline: 408.
    start = b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-A: "
    statuses, closed = exchange(server.port, start, *[b"a" * 1500] * 3)
    assert statuses == [431] and closed


def test_a_pipelined_header_block_over_the_limit_is_refused_before_the_app(server):
    # It arrives in the read of the request before it: the parser reads it whole (a gap both parsers
    # have, see httptools_connection.py), then HeaderGuard answers 431 and closes.
    get = b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n"
    big = b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-A: " + b"a" * 5000 + b"\r\n\r\n"
    assert exchange(server.port, get + big) == ([200, 431], True)


def test_keep_alive_and_pipelined_requests_are_served_in_order(server):
    get = b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n"
    body = b"x" * 60_000  # larger than the header limit: must not be counted as header bytes
    post = b"POST /healthz HTTP/1.1\r\n" + HOST + b"Content-Length: %d\r\n\r\n" % len(body) + body
    # A body, then the next request's header block split across the end of that read and the next one.
    statuses, closed = exchange(server.port, get, post + get[:20], get[20:] + get, get, answers=5)
    assert statuses == [200, 405, 200, 200, 200] and not closed


def test_the_header_deadline_runs_from_the_last_response_on_a_kept_alive_connection(server):
    # Header deadline 4.5 s here. The request comes 3 s after the connection opened: the deadline that
    # matters is then 4.5 s after its response, not 1.5 s after it (when the connection's first one ran
    # out). Each side of the 3 s line has 1.5 s to spare, as does the request against the first deadline
    # (at a load of 4x the cores a sleep or a read can be late by a second). The deadline stays under
    # uvicorn's keep-alive timeout (5 s from the same response), which closes an idle connection silently.
    with socket.create_connection(("127.0.0.1", server.port)) as sock:
        time.sleep(3)
        sock.sendall(b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n")
        sock.settimeout(30)
        answer = b""
        while not answer.endswith(b"}"):  # the whole response: /healthz answers a JSON object
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        answered = time.monotonic()
        assert answer.startswith(b"HTTP/1.1 200")
        late = b""
        while chunk := sock.recv(65536):
            late += chunk
        idle = time.monotonic() - answered
    assert late.startswith(b"HTTP/1.1 408") and 3 <= idle < 20, (late, idle)  # a stale deadline: ~1.5 s


@pytest.fixture(scope="module", params=PARSERS)
def kept_alive_server(request, tmp_path_factory):
    """A header deadline (8 s) past uvicorn's keep-alive timeout (5 s from a response, ended by any byte)."""
    env = LIMITS | {"LOGSTORE_HEADER_TIMEOUT": "8"}
    with serve(tmp_path_factory.mktemp("keepalive"), "--http", request.param, env=env) as running:
        yield running


def _answered_then(port: int, then: bytes) -> bytes:
    """One /healthz call on a fresh connection, then ``then`` sent at once; what the server says after
    the response, until it closes the connection."""
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.settimeout(30)
        sock.sendall(b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n")
        answer = b""
        while not answer.endswith(b"}"):
            chunk = sock.recv(65536)
            assert chunk, answer
            answer += chunk
        assert answer.startswith(b"HTTP/1.1 200") and answer.count(b"HTTP/1.1") == 1
        if then:
            sock.sendall(then)
        late = b""
        while chunk := sock.recv(65536):
            late += chunk
    return late


def test_an_idle_kept_alive_connection_is_closed_silently_at_the_keep_alive_timeout(kept_alive_server):
    # The header deadline would answer 408 (at 8 s); the keep-alive timeout closes first, saying nothing.
    assert _answered_then(kept_alive_server.port, b"") == b""


def test_a_byte_after_the_response_ends_the_keep_alive_timeout(kept_alive_server):
    # Part of a next request: from then on only the header deadline counts (408), as with uvicorn's timer.
    late = _answered_then(kept_alive_server.port, b"GET /hea")
    assert late.startswith(b"HTTP/1.1 408"), late


@pytest.fixture
def without_httptools(tmp_path):
    """An environment in which ``import httptools`` fails (a package of that name that raises)."""
    (tmp_path / "httptools").mkdir()
    (tmp_path / "httptools" / "__init__.py").write_text("raise ImportError('blocked by the test')\n")
    path = os.pathsep.join(p for p in (str(tmp_path), os.environ.get("PYTHONPATH")) if p)
    return {"PYTHONPATH": path}


def test_without_httptools_auto_serves_with_h11_and_says_so(tmp_path, without_httptools):
    with serve(tmp_path / "data", "--log-level", "info", env=without_httptools | LIMITS) as running:
        assert exchange(running.port, b"GET /healthz HTTP/1.1\r\n" + HOST + b"\r\n", answers=1)[0] == [200]
        big = b"GET /healthz HTTP/1.1\r\n" + HOST + b"X-A: " + b"a" * 5000 + b"\r\n\r\n"
        assert exchange(running.port, big) == ([431], True)
        assert "httptools does not import" in running.stdout() and "serving HTTP with h11" in running.stdout()


def test_without_httptools_http_httptools_refuses_to_start(tmp_path, without_httptools):
    from tests.test_server_cli import logstore

    ran = logstore("serve", "--data-dir", str(tmp_path), "--http", "httptools", env=without_httptools)
    assert ran.returncode == 1 and "httptools does not import" in ran.stderr, ran.stderr


def test_a_websocket_upgrade_is_answered_as_plain_http_inside_the_connection_rules(server):
    # uvicorn's default would hand it to the websockets package's protocol, outside every guard (there:
    # 403 and closed). With ws="none" (server/runtime.py) it is a plain GET, and the connection stays
    # under our rules: kept alive, then idle past the header deadline (4.5 s here), it gets 408.
    upgrade = (
        b"GET /healthz HTTP/1.1\r\n" + HOST + b"Connection: Upgrade\r\nUpgrade: websocket\r\n"
        b"Sec-WebSocket-Version: 13\r\nSec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\n\r\n"
    )
    assert exchange(server.port, upgrade) == ([200, 408], True)
