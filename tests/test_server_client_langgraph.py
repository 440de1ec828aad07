"""The LangGraph checkpointer (``logstore.client.adapters.langgraph``) against a real ``logstore serve``,
file and PostgreSQL backends: LangGraph's own conformance suite (``langgraph-checkpoint-conformance``), a
graph that survives a server kill -9 mid-run, and what a step reads and appends."""

from __future__ import annotations

import asyncio

import pytest

pytest.importorskip("langgraph.checkpoint.conformance")

from logstore.client import AsyncClient, Client  # noqa: E402
from logstore.client.adapters.langgraph import LogstoreSaver  # noqa: E402
from tests.client_support import PASSWORD, SITE, CountingReads, Restartable, add_site  # noqa: E402


@pytest.fixture(scope="module", params=["file", "postgres"])
def server(request, tmp_path_factory):
    store = None
    if request.param == "postgres":
        from tests.postgres_support import fresh_url, shared_server

        store = fresh_url(shared_server())
    data_dir = tmp_path_factory.mktemp(f"langgraph-{request.param}")
    add_site(data_dir, store)
    running = Restartable(data_dir, store)
    running.start()
    yield running
    running.stop()


def _conformance(make_saver) -> None:
    from langgraph.checkpoint.conformance import checkpointer_test, validate

    @checkpointer_test(name="LogstoreSaver")
    async def factory():
        saver, close = await make_saver()
        try:
            yield saver
        finally:
            await close()

    report = asyncio.run(validate(factory))
    failures = {cap: r.failures for cap, r in report.results.items() if r.failures}
    assert report.passed_all_base(), failures
    assert not failures


def test_conformance_suite(server):
    """The whole suite once per backend: over a blocking ``Client`` on the file backend (the saver's async
    methods in a worker thread), over an ``AsyncClient`` on PostgreSQL (on the suite's event loop)."""
    if server.store is None:

        async def make():
            client = server.client()
            return LogstoreSaver(client), lambda: asyncio.to_thread(client.close)

    else:

        async def make():
            client = AsyncClient.http(server.url, site=SITE, password=PASSWORD)
            return LogstoreSaver(client), client.aclose

    _conformance(make)


def _file_only(server) -> None:
    if server.store is not None:
        pytest.skip("the saver's own logic: run on the file backend only")


def _chat_graph(saver, on_step=None):
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph

    def chat(state):
        if on_step is not None:
            on_step(state)
        return {"messages": [AIMessage(f"reply to {state['messages'][-1].content}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    return builder.compile(checkpointer=saver)


def test_a_step_appends_its_new_messages(server):
    """40 turns: the last 15 append about the history's size in all; rewriting the state each step would
    append it 30 times (2 checkpoints a turn). The conversation id does not show the thread id."""
    _file_only(server)
    from uuid import uuid4

    config = {"configurable": {"thread_id": f"user-{uuid4()}@example.com"}}  # a thread id that is personal
    text = "x" * 1000
    with server.client() as client:
        saver = LogstoreSaver(client, id_key=b"k" * 32)
        graph = _chat_graph(saver)
        for turn in range(25):
            graph.invoke({"messages": [("user", f"message {turn} {text}")]}, config)
        conv = saver.conversation_of(config)
        assert conv in _conversations(client) and "example" not in conv
        before = client.recall(conv, 1)[0].seq + 1
        for turn in range(25, 40):
            graph.invoke({"messages": [("user", f"message {turn} {text}")]}, config)
        total = client.recall(conv, 1)[0].seq + 1
        appended = sum(len(str(i.payload)) for i in client.replay(conv, before, total - before))
        full = len(str(graph.get_state(config).values["messages"]))
        assert appended < 3 * full, (appended, full)


def test_a_cold_read_takes_the_tail(server):
    """A fresh saver's first read of a 30-turn thread takes the tail plus the items its newest values point
    to (``max_chain`` links at most), not the thread; and its next step goes on from there."""
    _file_only(server)
    from uuid import uuid4

    config = {"configurable": {"thread_id": str(uuid4())}}
    with server.client() as client:
        graph = _chat_graph(LogstoreSaver(client, max_chain=4))
        for turn in range(30):
            graph.invoke({"messages": [("user", f"message {turn}")]}, config)
        total = sum(1 for _ in client.iter_replay(LogstoreSaver(client).conversation_of(config)))

    with server.client() as client:
        counting = CountingReads(client.aio)
        graph = _chat_graph(LogstoreSaver(client, max_chain=4))
        messages = graph.get_state(config).values["messages"]
        assert [m.content for m in messages[:2]] == ["message 0", "reply to message 0"]
        assert len(messages) == 60
        assert counting.items_read < total / 3, (counting.items_read, total)
        graph.invoke({"messages": [("user", "one more")]}, config)  # and the cold saver's next step works
        assert [m.content for m in graph.get_state(config).values["messages"][-3:]] == [
            "reply to message 29", "one more", "reply to one more"]  # fmt: skip


def _conversations(client: Client) -> list[str]:
    return [s.conversation_id for s in client.iter_conversations()]


def test_a_graph_survives_a_server_kill_mid_run(server):
    """The server is killed -9 inside a node; the step's checkpoint waits (retried) until the server is
    back, and the thread goes on: a fresh client reads every message once, in order."""
    import threading
    from uuid import uuid4

    restarts: list[threading.Thread] = []

    def kill_once(state):
        if len(state["messages"]) == 3 and not restarts:
            server.kill()
            restarts.append(threading.Thread(target=server.start))
            restarts[0].start()

    config = {"configurable": {"thread_id": str(uuid4())}}
    with server.client() as client:
        graph = _chat_graph(LogstoreSaver(client, retry_for=300), on_step=kill_once)
        for turn in range(4):
            graph.invoke({"messages": [("user", f"turn {turn}")]}, config)
        restarts[0].join()
    expected = [text for t in range(4) for text in (f"turn {t}", f"reply to turn {t}")]
    with server.client() as client:
        graph = _chat_graph(LogstoreSaver(client))
        assert [m.content for m in graph.get_state(config).values["messages"]] == expected


def test_values_larger_than_an_item_round_trip(server):
    """A channel value and a pending write each larger than the 256 KiB item limit are stored as chunk
    items and read back whole by a fresh saver."""
    _file_only(server)
    from uuid import uuid4

    from langgraph.checkpoint.base import empty_checkpoint

    big = "y" * 700_000
    config = {"configurable": {"thread_id": str(uuid4()), "checkpoint_ns": ""}}
    checkpoint = empty_checkpoint()
    checkpoint["channel_values"] = {"blob": big, "small": 1}
    checkpoint["channel_versions"] = {"blob": 1, "small": 1}
    with server.client() as client:
        stored = LogstoreSaver(client).put(config, checkpoint, {"step": 0}, {"blob": 1, "small": 1})
        LogstoreSaver(client).put_writes(stored, [("blob", big + "z")], "task-1")
    with server.client() as client:
        found = LogstoreSaver(client).get_tuple(config)
    assert found is not None
    assert found.checkpoint["channel_values"] == {"blob": big, "small": 1}
    assert found.pending_writes == [("task-1", "blob", big + "z")]
