"""``logstore.client`` against a real ``logstore serve``: the four tools typed, the spec's loops, the
engine's error classes, Basic auth, stdio; and the transport's verdict on a failed request (never sent,
or outcome unknown)."""

from __future__ import annotations

import asyncio
import socket
import sys
import threading
import uuid
from datetime import datetime

import pytest

from logstore.client import AsyncClient, Client, Unauthorized, outcome_of
from logstore.client.errors import error_from_body
from logstore.core import errors
from logstore.core.models import MemoryItem, SeqRange
from tests.client_support import PASSWORD, SITE, Restartable, add_site, running
from tests.server_support import REPO, free_port


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running(tmp_path_factory.mktemp("client")) as server:
        yield server


def new_id() -> str:
    return f"client-{uuid.uuid4().hex}"


def test_tools_round_trip_typed(server):
    cid = new_id()
    with server.client() as c:
        assert c.append(
            cid, [{"role": "user", "content": "héllo"}, {"n": 1.5, "l": [1, None, True]}]
        ) == SeqRange(0, 1)
        assert c.append(cid, [{"k": "v"}]) == SeqRange(2, 2)
        items = c.recall(cid, 2)
        assert [i.seq for i in items] == [1, 2] and all(isinstance(i, MemoryItem) for i in items)
        assert isinstance(items[0].recorded_at, datetime) and items[0].recorded_at.tzinfo is not None
        assert items[0].payload == {"n": 1.5, "l": [1, None, True]}
        assert [i.seq for i in c.replay(cid, 1, 5)] == [1, 2]
        assert c.recall(new_id()) == []


def test_iter_replay_pages_until_a_short_page(server):
    cid = new_id()
    with server.client() as c:
        for k in range(7):
            c.append(cid, [{"k": k, "j": j} for j in range(3)])
        for page in (1, 3, 7, 21, 1000):  # 21 items: page 3 and 7 end on a page boundary, then an empty page
            got = list(c.iter_replay(cid, page=page))
            assert [i.seq for i in got] == list(range(21))
        assert [i.payload["k"] for i in c.iter_replay(cid, start=18, page=2)] == [6, 6, 6]


def test_iter_conversations_follows_cursors(tmp_path):
    add_site(tmp_path, None)
    server = Restartable(tmp_path)
    server.start()
    try:
        cids = [new_id() for _ in range(5)]
        with server.client() as c:
            for cid in cids:
                c.append(cid, [{"a": 1}])
            listed = [s.conversation_id for s in c.iter_conversations(page=2)]
        assert listed == cids[::-1]  # most recently active first
    finally:
        server.stop()


def test_spec_errors_are_the_engine_classes(server):
    with server.client() as c:
        with pytest.raises(errors.EmptyBatch) as e:
            c.append(new_id(), [])
        assert e.value.code == "EmptyBatch" and e.value.retryable is False
        with pytest.raises(errors.InvalidConversationId) as e2:
            c.append("x", [{"a": 1}])
        assert e2.value.reason == "TooShort"
        with pytest.raises(errors.PayloadTooLarge) as e3:
            c.append(new_id(), [{"a": 1}, {"big": "x" * (257 * 1024)}])
        assert e3.value.index == 1 and e3.value.limit == 256 * 1024
        with pytest.raises(errors.InvalidArgument):
            c.recall(new_id(), 1001)
        with pytest.raises(errors.InvalidCursor):
            c.list_conversations("not-a-cursor")


def test_wrong_password_is_unauthorized(server):
    with Client.http(server.url, site=SITE, password="wrong") as c, pytest.raises(Unauthorized) as e:
        c.recall(new_id())
    assert e.value.retryable is False


def test_async_client_and_stdio(tmp_path):
    add_site(tmp_path, None)
    cid = new_id()
    cmd = [
        sys.executable,
        ["-m", "tools.cli", "serve", "--stdio", "--data-dir", str(tmp_path), "--site", SITE],
    ]

    async def main():
        async with AsyncClient.stdio(cmd[0], cmd[1], env={"PYTHONPATH": str(REPO)}) as c:
            assert await c.append(cid, [{"via": "stdio"}]) == SeqRange(0, 0)
            assert [i.payload async for i in c.iter_replay(cid)] == [{"via": "stdio"}]

    asyncio.run(main())


def test_error_body_carries_the_unknown_outcome():
    body = {"error": {"code": "Unavailable", "message": "m", "retryable": True, "outcome": "unknown"}}
    exc = error_from_body(body)
    assert isinstance(exc, errors.Unavailable) and outcome_of(exc) == "unknown"
    plain = error_from_body({"error": {"code": "Unavailable", "message": "m", "retryable": True}})
    assert isinstance(plain, errors.Unavailable) and outcome_of(plain) is None and plain.retryable
    other = error_from_body({"error": {"code": "SomethingNew", "message": "m", "retryable": True}})
    assert other.code == "SomethingNew" and other.retryable


def _drop_after_request(listener: socket.socket) -> None:
    conn, _ = listener.accept()
    with conn:
        conn.recv(65536)  # the request arrived; the "server" dies before answering


def test_transport_tells_unsent_from_unknown():
    with Client.http(f"http://127.0.0.1:{free_port()}/mcp", site=SITE, password=PASSWORD) as c:
        with pytest.raises(errors.Unavailable) as refused:
            c.append(new_id(), [{"a": 1}])
        assert outcome_of(refused.value) is None  # nothing listened: never sent
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        thread = threading.Thread(target=_drop_after_request, args=(listener,))
        thread.start()
        url = f"http://127.0.0.1:{listener.getsockname()[1]}/mcp"
        with (
            Client.http(url, site=SITE, password=PASSWORD) as c,
            pytest.raises(errors.Unavailable) as dropped,
        ):
            c.append(new_id(), [{"a": 1}])
        thread.join()
    assert outcome_of(dropped.value) == "unknown"


def test_append_waits_for_earlier_append_nowait_of_its_conversation(server):
    cid = new_id()
    with server.client() as c:
        for i in range(20):
            assert c.append_nowait(cid, [{"i": i}])
        assert c.append(cid, [{"i": 20}]) == SeqRange(20, 20)  # after the 20 handed over before it
        assert [i.payload["i"] for i in c.iter_replay(cid)] == list(range(21))
