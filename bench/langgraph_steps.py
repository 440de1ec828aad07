"""C3: the LangGraph checkpointer (``logstore.client.adapters.langgraph``): seconds per chat turn of a
LangGraph graph (``MessagesState``; a turn = one user message in, one reply out: 3 checkpoints and their
writes) on a thread already holding 100 / 1,000 / 10,000 messages, against ``langgraph-checkpoint-sqlite``'s
``SqliteSaver`` (a file in the same directory, its default synchronous=FULL) in the same run, rounds
alternating. The logstore saver talks to a ``logstore serve`` (file backend) over HTTP and waits for each
acknowledgement (fdatasync'd); a turn appends its new messages, SQLite rewrites the state each checkpoint.
The timed turns include the periodic full copy of the list only in proportion: ``langgraph_steps`` turns
after a seed and one untimed turn.
"""

from __future__ import annotations

import os
import sqlite3
import time
import uuid
from collections.abc import Callable
from functools import partial
from typing import Any

from .config import Profile
from .load import SITE
from .mcp_calls import _new_site, running_server
from .stats import Goal, Row, fig, paired_ratio

__all__ = ["measure_langgraph", "row_id"]

TEXT = "lorem ipsum dolor sit amet " * 8  # ~220 characters per message


def row_id(size: int) -> str:
    return f"C3-{size // 1000}k" if size >= 1000 else f"C3-{size}"


def _graph(saver: Any) -> Any:
    from langchain_core.messages import AIMessage
    from langgraph.graph import START, MessagesState, StateGraph

    def chat(state: MessagesState) -> dict[str, Any]:
        return {"messages": [AIMessage(f"reply {len(state['messages'])} {TEXT}")]}

    builder = StateGraph(MessagesState)
    builder.add_node("chat", chat)
    builder.add_edge(START, "chat")
    return builder.compile(checkpointer=saver)


def _seconds_per_turn(saver: Any, size: int, steps: int) -> float:
    from langchain_core.messages import AIMessage, HumanMessage

    graph = _graph(saver)
    config = {"configurable": {"thread_id": uuid.uuid4().hex}}
    history = [
        (HumanMessage if i % 2 == 0 else AIMessage)(f"message {i} {TEXT}", id=f"m{i}") for i in range(size)
    ]
    graph.update_state(config, {"messages": history})
    graph.invoke({"messages": [("user", f"warm-up {TEXT}")]}, config)
    t0 = time.perf_counter()
    for turn in range(steps):
        graph.invoke({"messages": [("user", f"turn {turn} {TEXT}")]}, config)
    elapsed = time.perf_counter() - t0
    assert len(graph.get_state(config).values["messages"]) == size + 2 * (steps + 1)
    return elapsed / steps


def _logstore(client: Any, size: int, steps: int) -> float:
    from logstore.client.adapters.langgraph import LogstoreSaver

    return _seconds_per_turn(LogstoreSaver(client), size, steps)


def _sqlite(path: str, size: int, steps: int) -> float:
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    try:
        return _seconds_per_turn(SqliteSaver(conn), size, steps)
    finally:
        conn.close()


def measure_langgraph(profile: Profile, directory: str) -> list[Row]:
    from logstore.client import Client

    data_dir = os.path.join(directory, "langgraph")
    password = _new_site(data_dir)
    ours: dict[int, list[float]] = {size: [] for size in profile.langgraph_sizes}
    theirs: dict[int, list[float]] = {size: [] for size in profile.langgraph_sizes}
    with running_server(["tools.cli", "serve", "--data-dir", data_dir, "--log-level", "warning"]) as (
        url,
        _pid,
    ):
        with Client.http(url, site=SITE, password=password) as client:
            for run in range(profile.runs):
                for size in profile.langgraph_sizes:
                    path = os.path.join(directory, f"sqlite-{run}-{size}.db")
                    order: list[tuple[dict[int, list[float]], Callable[[], float]]] = [
                        (ours, partial(_logstore, client, size, profile.langgraph_steps)),
                        (theirs, partial(_sqlite, path, size, profile.langgraph_steps)),
                    ]
                    for into, measure in order if run % 2 == 0 else reversed(order):
                        into[size].append(1000 * measure())
    return [
        Row(
            row_id(size),
            f"LangGraph chat turn on a {size:,}-message thread: LogstoreSaver vs SqliteSaver",
            "ms/turn",
            value=fig(ours[size]),
            baseline=fig(theirs[size]),
            baseline_name="langgraph-checkpoint-sqlite SqliteSaver",
            ratio=paired_ratio(ours[size], theirs[size]),
            goal=Goal("<=", 1.0, "<= 1.0x SqliteSaver"),
            note=f"{profile.langgraph_steps} timed turns per round after a seed and a warm-up turn; "
            "logstore over HTTP, each append acknowledged after fdatasync",
        )
        for size in profile.langgraph_sizes
    ]
