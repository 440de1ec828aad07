"""The framework adapters, each through its framework's own interface, against a real ``logstore serve``:
every message/item type round-trips, order, ``limit``, clear and pop (markers read back), sync and async,
and a fresh adapter on the same conversation reads what another wrote."""

from __future__ import annotations

import asyncio

import pytest

from logstore.client import Client
from logstore.client.adapters.markers import new_session_id
from tests.client_support import PASSWORD, SITE, running


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    with running(tmp_path_factory.mktemp("adapters")) as server:
        yield server


@pytest.fixture
def client(server):
    with Client.http(server.url, site=SITE, password=PASSWORD) as c:
        yield c


def test_langchain_history(client):
    pytest.importorskip("langchain_core")
    from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

    from logstore.client.adapters.langchain import LogstoreChatMessageHistory

    sid = new_session_id()
    history = LogstoreChatMessageHistory(client, sid)
    assert history.messages == []
    sent = [
        SystemMessage("be brief"),
        HumanMessage("what is 2+2? ünïcode ✓"),
        AIMessage("", tool_calls=[{"name": "add", "args": {"a": 2, "b": 2}, "id": "call-1"}]),
        ToolMessage("4", tool_call_id="call-1"),
        AIMessage("4", response_metadata={"model": "m"}),
    ]
    history.add_messages(sent[:3])
    history.add_message(sent[3])
    history.add_ai_message("4")
    got = history.messages
    assert [type(m) for m in got] == [type(m) for m in sent]
    assert got[:4] == sent[:4] and got[4].content == "4"
    assert got[2].tool_calls[0]["args"] == {"a": 2, "b": 2}
    other = LogstoreChatMessageHistory(client, sid)  # a fresh reader: same conversation, same messages
    assert other.messages == got
    history.clear()
    assert history.messages == [] and other.messages == []
    history.add_user_message("after clear")
    assert [m.content for m in other.messages] == ["after clear"]

    async def use_async():
        await history.aadd_messages([HumanMessage("a1"), AIMessage("a2")])
        assert [m.content for m in await history.aget_messages()] == ["after clear", "a1", "a2"]
        await history.aclear()
        assert await history.aget_messages() == []

    asyncio.run(use_async())
    # Everything is still in the log: clear is a marker, erasure is the operator's
    assert len(client.recall(sid, 1000)) == 5 + 1 + 1 + 2 + 1  # messages, clear, 1, 2, clear


def test_langchain_rejects_a_derived_id(client):
    pytest.importorskip("langchain_core")
    from logstore.client.adapters.langchain import LogstoreChatMessageHistory
    from logstore.core.errors import InvalidConversationId

    with pytest.raises(InvalidConversationId):
        LogstoreChatMessageHistory(client, "alice@example.com")


def test_openai_agents_session(client):
    pytest.importorskip("agents")
    from agents.memory.session_settings import SessionSettings

    from logstore.client.adapters.openai_agents import LogstoreSession

    items = [
        {"role": "user", "content": "hi"},
        {
            "type": "message",
            "role": "assistant",
            "id": "msg_1",
            "status": "completed",
            "content": [{"type": "output_text", "text": "hello", "annotations": []}],
        },
        {"type": "function_call", "call_id": "c1", "name": "lookup", "arguments": '{"q": "x"}', "id": "fc_1"},
        {"type": "function_call_output", "call_id": "c1", "output": "42"},
        {"role": "system", "content": "note"},
    ]

    async def scenario():
        sid = new_session_id()
        session = LogstoreSession(client, sid)
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items(items[:2])
        await session.add_items(items[2:])
        assert await session.get_items() == items
        assert await session.get_items(limit=2) == items[-2:]
        assert await session.get_items(limit=0) == []
        assert await session.pop_item() == items[-1]
        assert await session.get_items() == items[:-1]
        fresh = LogstoreSession(client, sid, session_settings=SessionSettings(limit=3))
        assert await fresh.get_items() == items[1:4]  # the settings' limit
        assert await fresh.pop_item() == items[3]
        assert await session.get_items() == items[:3]
        await session.clear_session()
        assert await session.get_items() == [] and await fresh.get_items() == []
        await session.add_items([{"role": "user", "content": "again"}])
        assert await fresh.get_items() == [{"role": "user", "content": "again"}]

    asyncio.run(scenario())


def test_openai_agents_runner_uses_the_session(client):
    agents = pytest.importorskip("agents")
    from logstore.client.adapters.openai_agents import LogstoreSession
    from tests.fake_agents_model import EchoModel

    session = LogstoreSession(client, new_session_id())
    agent = agents.Agent(name="echo", instructions="echo", model=EchoModel())

    async def scenario():
        first = await agents.Runner.run(agent, "one", session=session)
        second = await agents.Runner.run(agent, "two", session=session)
        return first, second

    first, second = asyncio.run(scenario())
    assert first.final_output == "echo: one (1 inputs)"
    assert second.final_output == "echo: two (3 inputs)"  # the session gave the model the first turn
    stored = asyncio.run(session.get_items())
    assert [i.get("role") for i in stored] == ["user", "assistant", "user", "assistant"]


def test_the_examples_in_docs_client_md_run(server, tmp_path):
    """Every example in docs/CLIENT.md that talks to a server runs as printed."""
    import os
    import re
    import subprocess
    import sys

    from tests.server_support import REPO

    text = (REPO / "docs" / "CLIENT.md").read_text()
    examples = [b for b in re.findall(r"```python\n(.*?)```", text, re.S) if "LOGSTORE_PASSWORD" in b]
    assert len(examples) == 4
    env = {**os.environ, "LOGSTORE_URL": server.url, "LOGSTORE_SITE": SITE, "LOGSTORE_PASSWORD": PASSWORD}
    for n, code in enumerate(examples):
        script = tmp_path / f"example{n}.py"
        script.write_text(code)
        run = subprocess.run(
            [sys.executable, str(script)], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert run.returncode == 0, run.stderr
        assert "Traceback" not in run.stderr
