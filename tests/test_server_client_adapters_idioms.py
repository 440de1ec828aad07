"""The adapters' idioms (issue 36 §3: session_id first, ``from_url``, ``close``/``aclose``, an
``AsyncClient`` accepted, a first ``get_items(limit)`` that reads the tail) and their reads' promises (§2:
a turn completes from the held history while the server is down; a read flushes only its conversation)."""

from __future__ import annotations

import asyncio
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import logstore.client
from logstore.client import AsyncClient, Client
from logstore.client.adapters.markers import CLEAR, POP, MarkerLog, fold, new_session_id
from logstore.core.models import MemoryItem
from tests.client_support import PASSWORD, SITE, CountingReads, running


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running(tmp_path_factory.mktemp("idioms")) as server:
        yield server


def test_dir_lists_the_client_names():
    names = dir(logstore.client)
    assert {"Client", "AsyncClient", "BackgroundWriter", "WriterOptions", "Failure"} <= set(names)


def test_langchain_history_takes_session_id_first_from_url_and_closes(server):
    pytest.importorskip("langchain_core")
    from langchain_core.messages import HumanMessage

    from logstore.client.adapters.langchain import LogstoreChatMessageHistory

    sid = new_session_id()
    history = LogstoreChatMessageHistory.from_url(sid, server.url, site=SITE, password=PASSWORD)
    history.add_messages([HumanMessage("hi")])
    assert [m.content for m in history.messages] == ["hi"]
    client = history.log.client
    assert isinstance(client, Client) and client._portal is not None
    history.close()
    assert client._portal is None and client.aio._transport is None  # from_url's client is closed
    with Client.http(server.url, site=SITE, password=PASSWORD) as c:
        assert [m.content for m in LogstoreChatMessageHistory(sid, c).messages] == ["hi"]  # session_id first
        assert [m.content for m in LogstoreChatMessageHistory(c, sid).messages] == ["hi"]  # the older order
        LogstoreChatMessageHistory(sid, c).close()  # a client passed in is the caller's: still usable
        assert c.recall(sid, 10)[0].payload["type"] == "human"


def test_openai_session_on_an_async_client(server):
    pytest.importorskip("agents")
    from logstore.client.adapters.openai_agents import LogstoreSession

    async def use() -> None:
        async with AsyncClient.http(server.url, site=SITE, password=PASSWORD) as client:
            session = LogstoreSession(new_session_id(), client)
            await session.add_items([{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}])
            assert await session.get_items() == [
                {"role": "user", "content": "a"},
                {"role": "assistant", "content": "b"},
            ]
            assert await session.pop_item() == {"role": "assistant", "content": "b"}
            assert await session.get_items(1) == [{"role": "user", "content": "a"}]
            await session.clear_session()
            assert await session.get_items() == []
            with pytest.raises(TypeError):  # the sync face needs a Client
                session.log.live()
        own = LogstoreSession.from_url(new_session_id(), server.url, site=SITE, password=PASSWORD)
        await own.add_items([{"role": "user", "content": "x"}])
        assert await own.get_items() == [{"role": "user", "content": "x"}]
        await own.aclose()
        assert own.log.client._transport is None  # type: ignore[union-attr]

    asyncio.run(use())


def test_the_first_get_items_with_a_limit_reads_the_tail(server):
    pytest.importorskip("agents")
    from logstore.client.adapters.openai_agents import LogstoreSession

    sid = new_session_id()
    with server.client() as c:
        for start in range(0, 3000, 250):
            c.append(sid, [{"role": "user", "content": str(i)} for i in range(start, start + 250)])
        c.append(sid, [POP])

    async def read() -> tuple[list, int]:
        async with AsyncClient.http(server.url, site=SITE, password=PASSWORD) as client:
            counting = CountingReads(client)
            items = await LogstoreSession(sid, client).get_items(3)
            return items, counting.items_read

    items, read_count = asyncio.run(read())
    assert [i["content"] for i in items] == ["2996", "2997", "2998"]
    assert read_count <= 50, read_count  # the whole log is 3001 items


class _FakeLog:
    """recall/replay over a list: the backward fold without a server."""

    def __init__(self, payloads: list[dict]) -> None:
        from datetime import UTC, datetime

        now = datetime.now(UTC)
        self.items = [MemoryItem(seq=i, recorded_at=now, payload=p) for i, p in enumerate(payloads)]

    async def recall(self, cid: str, count: int) -> list[MemoryItem]:
        return self.items[-count:] if count else []

    async def replay(self, cid: str, offset: int, limit: int) -> list[MemoryItem]:
        return self.items[offset : offset + limit]


@settings(max_examples=300, deadline=None)
@given(
    st.lists(st.sampled_from(["d", "d", "d", "pop", "clear"]), max_size=2500),
    st.integers(min_value=0, max_value=1200),
)
def test_the_tail_fold_equals_the_forward_fold(kinds, limit):
    payloads = [CLEAR if k == "clear" else POP if k == "pop" else {"n": i} for i, k in enumerate(kinds)]
    forward: list[dict] = []
    fold(forward, payloads)
    log = MarkerLog.__new__(MarkerLog)
    log.conversation_id = "fake-conversation"
    tail = asyncio.run(log._tail(_FakeLog(payloads), limit))  # type: ignore[arg-type]
    assert tail == (forward[-limit:] if limit else [])


def test_a_read_with_the_server_down_serves_the_held_history(server, caplog):
    """The server is killed: the next turn's read does not raise, it serves the history read before plus
    this history's writes not confirmed, and logs a warning."""
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage, HumanMessage

    from logstore.client import WriterOptions
    from logstore.client.adapters.langchain import LogstoreChatMessageHistory

    client = Client.http(
        server.url, site=SITE, password=PASSWORD, writer_options=WriterOptions(retry_for=None)
    )
    history = LogstoreChatMessageHistory(new_session_id(), client, flush_timeout=0.5)
    history.add_messages([HumanMessage("q1"), AIMessage("a1")])
    assert [m.content for m in history.messages] == ["q1", "a1"]
    server.kill()
    try:
        history.add_messages([HumanMessage("q2")])
        with caplog.at_level(logging.WARNING, logger="logstore.client"):
            assert [m.content for m in history.messages] == ["q1", "a1", "q2"]
        assert any("served from this process" in r.getMessage() for r in caplog.records)
    finally:
        server.start()
    assert client.flush(120, conversation_id=history.session_id)  # the writer delivers q2 once it is back
    assert [m.content for m in history.messages] == ["q1", "a1", "q2"]
    client.close()
    with server.client() as c:
        assert [i.payload["data"]["content"] for i in c.iter_replay(history.session_id)] == ["q1", "a1", "q2"]


def test_a_read_flushes_only_its_own_conversation(server):
    """A read waits for this conversation's batches only, and does not read past a flush that failed."""
    sid = new_session_id()
    with server.client() as client:
        writer = client.aio.writer
        calls: list[str | None] = []
        real = writer.flush

        def flush(timeout=None, conversation_id=None, **kwargs):
            calls.append(conversation_id)
            if conversation_id is None:  # another conversation's batch that never settles
                return False
            return real(timeout, conversation_id, **kwargs)

        writer.flush = flush  # type: ignore[method-assign]
        log = MarkerLog(client, sid, flush_timeout=30.0)
        log.append([{"n": 1}])
        assert log.live() == [{"n": 1}]
        assert calls == [sid]


def test_append_nowait_does_not_wait_for_the_spool_rewrite(server, tmp_path, monkeypatch):
    """The writer's spool rewrite is held inside its fsync: an append_nowait meanwhile returns (it waited
    for the writer's lock before), and its batch is stored once the rewrite goes on."""
    import threading

    from logstore.client import WriterOptions
    from logstore.client import spool as spool_module

    entered, release = threading.Event(), threading.Event()
    real = spool_module._durable

    def held(fd: int) -> None:
        if threading.current_thread().name == "logstore-writer" and not entered.is_set():
            entered.set()
            release.wait()
        real(fd)

    monkeypatch.setattr(spool_module, "_durable", held)
    options = WriterOptions(spool=str(tmp_path / "agent.spool"), spool_reset_bytes=1)
    client = Client.http(server.url, site=SITE, password=PASSWORD, writer_options=options)
    sid = new_session_id()
    try:
        client.append_nowait(sid, [{"n": 0}])  # settles, the spool passes 1 byte: the rewrite starts
        assert entered.wait(60)
        returned = threading.Event()
        threading.Thread(target=lambda: (client.append_nowait(sid, [{"n": 1}]), returned.set())).start()
        assert returned.wait(30), "append_nowait waited for the spool rewrite"
    finally:
        release.set()
    assert client.flush(60)
    client.close()
    with server.client() as c:
        assert [i.payload for i in c.iter_replay(sid)] == [{"n": 0}, {"n": 1}]


def test_the_readme_client_snippet_runs(server, tmp_path):
    """README's client snippet runs as printed, given a server's URL and password."""
    import re
    import subprocess
    import sys

    from tests.server_support import REPO

    text = (REPO / "README.md").read_text()
    [snippet] = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "logstore.client" in b]
    snippet = snippet.replace("http://127.0.0.1:8765/mcp", server.url).replace(
        'site="local"', f'site="{SITE}"'
    )
    snippet = snippet.replace('password="..."', f'password="{PASSWORD}"') + "\nprint(history)\n"
    script = tmp_path / "readme_client.py"
    script.write_text(snippet)
    run = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[{'role': 'user', 'text': 'hi'}]"


def test_a_read_does_not_wait_for_a_server_that_is_down(server):
    """Once the writer is retrying this conversation's batch (the server is down), a read serves the held
    history at once instead of waiting ``flush_timeout`` (an hour here) for the server."""
    import threading

    pytest.importorskip("agents")
    from logstore.client.adapters.openai_agents import LogstoreSession
    from tests.helpers import wait_until

    client = Client.http(server.url, site=SITE, password=PASSWORD)
    session = LogstoreSession(new_session_id(), client, flush_timeout=3600.0)
    asyncio.run(session.add_items([{"role": "user", "content": "q1"}]))
    assert asyncio.run(session.get_items()) == [{"role": "user", "content": "q1"}]
    server.kill()
    try:
        asyncio.run(session.add_items([{"role": "user", "content": "q2"}]))
        wait_until(lambda: client.writer.failing(session.session_id), timeout=60, what="the writer retrying")
        got: list = []
        reader = threading.Thread(target=lambda: got.append(asyncio.run(session.get_items())), daemon=True)
        reader.start()
        reader.join(60)
        assert got == [[{"role": "user", "content": "q1"}, {"role": "user", "content": "q2"}]]
    finally:
        server.start()
    client.close()
    with server.client() as c:
        assert [i.payload["content"] for i in c.iter_replay(session.session_id)] == ["q1", "q2"]


def test_a_runner_turn_completes_with_the_server_down(server):
    """The issue's symptom: ``Runner.run`` with the session, the server killed. The turn completes; the
    model is given the history held before plus the new input; the turn's items are stored once the
    server is back."""
    pytest.importorskip("agents")
    from agents import Agent, Runner, set_tracing_disabled
    from agents.items import ModelResponse
    from agents.models.interface import Model
    from agents.usage import Usage
    from openai.types.responses import ResponseOutputMessage, ResponseOutputText

    from logstore.client import WriterOptions
    from logstore.client.adapters.openai_agents import LogstoreSession

    seen: list[list] = []

    class Echo(Model):  # a model that needs no network: it answers with how many items it was given
        async def get_response(self, system_instructions, input, *args, **kwargs):  # noqa: A002
            seen.append(list(input))
            text = ResponseOutputText(type="output_text", text=f"saw {len(input)}", annotations=[])
            message = ResponseOutputMessage(
                id="m", type="message", role="assistant", status="completed", content=[text]
            )
            return ModelResponse(output=[message], usage=Usage(), response_id=None)

        def stream_response(self, *args, **kwargs):
            raise NotImplementedError

    set_tracing_disabled(True)
    agent = Agent(name="echo", model=Echo())
    options = WriterOptions(retry_for=None)  # retried until the server is back, however long it takes
    client = Client.http(server.url, site=SITE, password=PASSWORD, writer_options=options)
    session = LogstoreSession(new_session_id(), client, flush_timeout=3600.0)
    assert asyncio.run(Runner.run(agent, "first", session=session)).final_output == "saw 1"
    server.kill()
    try:
        result = asyncio.run(Runner.run(agent, "second", session=session))
        assert result.final_output == "saw 3"  # first, its answer, second: the held history plus the input
    finally:
        server.start()
    assert client.flush(120, conversation_id=session.session_id)
    client.close()
    with server.client() as c:
        assert len(list(c.iter_replay(session.session_id))) == 4
