"""``serve --workers 2`` (issue 20): an append on a connection served by one worker is seen by a read on a
connection served by the other, at once, while both workers are busy appending to the same conversation.

Which worker holds a connection is read from the kernel (``bench.procfs``); a connection stays with the
worker that accepted it, so each client below is pinned. Every call goes into the history checker
(tests/history.py); the figures are printed (``-s``). ``LOGSTORE_LONG=1``: 5,000 reads instead of 300.
"""

from __future__ import annotations

import asyncio
import os
import sys
import time
from collections import defaultdict
from typing import Any

import pytest

from bench.load import LightClient
from bench.procfs import connection_owners, worker_pids
from logstore import Store
from logstore.file.credentials import CredentialsFile
from tests.helpers import LONG
from tests.history import Append, Recorder, check, conversation_key, final_state
from tests.server_support import serve

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

SITE, PASSWORD = "alpha", "pw"
X = "conv-shared-x"
READS = int(os.environ.get("LOGSTORE_SERVER_READS", "5000" if LONG else "300"))
PAUSE = 0.002


async def _pinned(url: str, port: int, pids: list[int], per_worker: int) -> dict[int, list[LightClient]]:
    """Open connections until each worker holds ``per_worker`` of them; the extra ones are closed."""
    by_worker: dict[int, list[LightClient]] = defaultdict(list)
    spare: list[LightClient] = []
    for _ in range(40):
        if all(len(by_worker[pid]) >= per_worker for pid in pids):
            break
        client = LightClient(url, SITE, PASSWORD)
        await client.__aenter__()
        await client.call("list_conversations", {})  # served: the worker holds the connection now
        (owner,) = connection_owners(port, [client.local_port], pids)
        if owner is not None and len(by_worker[owner]) < per_worker:
            by_worker[owner].append(client)
        else:
            spare.append(client)
    for client in spare:
        await client.__aexit__()
    assert all(len(by_worker[pid]) >= per_worker for pid in pids), {p: len(c) for p, c in by_worker.items()}
    return by_worker


async def _append(rec: Recorder, client: LightClient, item_id: str) -> int:
    invoked = time.monotonic()
    result = await client.call("append_memory", {"conversation_id": X, "items": [{"id": item_id}]})
    acked = time.monotonic()
    first, last = result["structuredContent"]["first_seq"], result["structuredContent"]["last_seq"]
    rec.add(Append(conversation_key(SITE, X), (item_id,), invoked, acked, first, last, rec.who))
    return int(first)


async def _read(rec: Recorder, client: LightClient, tool: str, args: dict[str, Any]) -> list[dict[str, Any]]:
    started = time.monotonic()
    result = await client.call(tool, {"conversation_id": X, **args})
    items = result["structuredContent"]["items"]
    offset = args.get("offset") if tool == "replay_memory" else None
    limit = args["limit"] if tool == "replay_memory" else args["count"]
    rec.read_result(SITE, X, offset, limit, items, started)
    return items


async def _workload(url: str, port: int, pids: list[int]) -> tuple[list[str], Recorder, int]:
    clients = await _pinned(url, port, pids, per_worker=2)
    rec = Recorder(who="client")
    stop = asyncio.Event()
    busy_count = [0]

    async def busy(client: LightClient, name: str) -> None:
        k = 0
        while not stop.is_set():
            await _append(rec, client, f"{name}-{k}")
            k += 1
            busy_count[0] += 1
            await asyncio.sleep(PAUSE)  # a busy worker, not one that starves the other of the file lock

    busy_tasks = [asyncio.create_task(busy(clients[pid][1], f"busy{n}")) for n, pid in enumerate(pids)]
    misses: list[str] = []
    try:
        await asyncio.sleep(0)
        for k in range(READS):
            writer_pid, reader_pid = (pids[0], pids[1]) if k % 2 == 0 else (pids[1], pids[0])
            seq = await _append(rec, clients[writer_pid][0], f"b{k}")
            if k % 4 < 2:  # the read: the acknowledged seq, one item
                got = await _read(rec, clients[reader_pid][0], "replay_memory", {"offset": seq, "limit": 1})
                if [item["payload"].get("id") for item in got] != [f"b{k}"]:
                    misses.append(f"replay {seq}: {[item['seq'] for item in got]}")
            else:  # the tail: it reaches at least the acknowledged seq
                got = await _read(rec, clients[reader_pid][0], "recall_memory", {"count": 5})
                if not got or got[-1]["seq"] < seq:
                    misses.append(f"recall after {seq}: {[item['seq'] for item in got]}")
    finally:
        stop.set()
        await asyncio.gather(*busy_tasks, return_exceptions=True)
        for group in clients.values():
            for client in group:
                await client.__aexit__()
    for task in busy_tasks:
        if task.exception() is not None:
            raise task.exception()  # type: ignore[misc]
    return misses, rec, busy_count[0]


def test_an_append_on_one_worker_is_seen_by_a_read_on_the_other(tmp_path):
    CredentialsFile(str(tmp_path)).add(SITE, PASSWORD)
    started = time.monotonic()
    with serve(tmp_path, "--workers", "2") as server:
        pids = worker_pids(server.proc.pid)
        assert len(pids) == 2
        misses, rec, busy = asyncio.run(_workload(server.url, server.port, pids))
    elapsed = time.monotonic() - started
    with Store(tmp_path) as store:
        final = final_state(store, [conversation_key(SITE, X)])
    report = check(rec.records, final)
    print(
        f"\n[serve --workers 2] {READS} reads on the other worker after an acknowledgement: "
        f"{len(misses)} missed; {busy} busy appends meanwhile; {elapsed:.1f} s; {report.summary()}"
    )
    assert busy > 0
    assert not misses, f"{len(misses)} of {READS} reads missed the acknowledged item: {misses[:5]}"
    assert report.reads_checked == READS and report.total == 0, report.examples
