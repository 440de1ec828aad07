"""Stateless servers over one database: several ``logstore serve --store postgresql://...`` processes,
MCP clients spread over them appending to shared conversations. Every acknowledged item is present once,
each conversation gapless; a cursor from one server pages on another; sites live in the database.

Default: 3 servers x 12 clients; ``LOGSTORE_LONG=1``: 3 servers x 48 clients (the issue's figure)."""

from __future__ import annotations

import contextlib
import os

import anyio
import pytest

from logstore.postgres import PostgresStore
from logstore.postgres.registry import PostgresRegistry
from tests.postgres_support import fresh_url
from tests.server_support import call, connect, serve

pytestmark = pytest.mark.anyio

LONG = os.environ.get("LOGSTORE_LONG") == "1"
SITE, PASSWORD = "fleet", "fleet-password"


@pytest.fixture
def anyio_backend():
    return "asyncio"


async def test_servers_share_one_database(postgres_server, tmp_path):
    url = fresh_url(postgres_server)
    PostgresRegistry(url).add(SITE, PASSWORD)
    clients, batches = (48, 20) if LONG else (12, 8)
    shared = ["fleet-conv-0001", "fleet-conv-0002", "fleet-conv-0003"]
    with contextlib.ExitStack() as stack:
        servers = [
            stack.enter_context(serve(tmp_path / f"s{k}", store=url, passwords={SITE: PASSWORD}))
            for k in range(3)
        ]
        acked: dict[str, tuple[str, int]] = {}

        async def client(n: int) -> None:
            server = servers[n % len(servers)]
            async with connect(server.url, SITE, PASSWORD, "2026-07-28") as c:
                for b in range(batches):
                    cid = shared[(n + b) % len(shared)]
                    ids = [f"{n}.{b}.{k}" for k in range(b % 3 + 1)]
                    is_error, ack = await call(
                        c, "append_memory", {"conversation_id": cid, "items": [{"id": i} for i in ids]}
                    )
                    assert not is_error, ack
                    assert ack["last_seq"] - ack["first_seq"] == len(ids) - 1
                    for k, i in enumerate(ids):
                        acked[i] = (cid, ack["first_seq"] + k)

        async with anyio.create_task_group() as tg:
            for n in range(clients):
                tg.start_soon(client, n)

        # A cursor issued by one server is accepted by another (the secret is in the database).
        async with connect(servers[0].url, SITE, PASSWORD, "legacy") as c:
            is_error, first = await call(c, "list_conversations", {"limit": 1})
            assert not is_error and first["next_cursor"]
        async with connect(servers[1].url, SITE, PASSWORD, "legacy") as c:
            is_error, rest = await call(
                c, "list_conversations", {"limit": 10, "cursor": first["next_cursor"]}
            )
            assert not is_error
        listed = [x["conversation_id"] for x in first["conversations"] + rest["conversations"]]
        assert sorted(listed) == sorted(shared)

    with PostgresStore(url) as store:
        seen: dict[str, tuple[str, int]] = {}
        for cid in shared:
            items = store.replay(SITE, cid, 0, 1000)
            assert [i.seq for i in items] == list(range(len(items)))  # gapless, 0-based
            for item in items:
                assert item.payload["id"] not in seen  # nothing stored twice
                seen[item.payload["id"]] = (cid, item.seq)
    assert seen == acked  # every acknowledged item, at the acknowledged seq; nothing else
    assert len(acked) == sum(b % 3 + 1 for _ in range(clients) for b in range(batches))
