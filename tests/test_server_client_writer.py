"""The background writer against a real ``logstore serve``: kill -9 and restarts of the server, permanent
errors, a full buffer, and kill -9 of the agent with a spool. The oracle: each conversation holds exactly
the batches handed over (minus those reported to on_error), each once, in hand-over order."""

from __future__ import annotations

import subprocess
import sys
import uuid

import pytest

from logstore.client import Disposition, WriterOptions
from logstore.core import errors
from tests.client_support import REPO, Restartable, add_site, batch_for, stored_payloads
from tests.helpers import LONG, wait_until
from tests.server_support import free_port

# kill -9s of the server mid-stream: 3 in the default run (its ~10-minute budget), 5 with LOGSTORE_LONG=1.
CONVERSATIONS, BATCHES, KILLS = 10, 1000, 5 if LONG else 3


@pytest.fixture(params=["file", "postgres"])
def server(request, tmp_path):
    store = None
    if request.param == "postgres":
        from tests.postgres_support import fresh_url, shared_server

        store = fresh_url(shared_server())
    add_site(tmp_path, store)
    running = Restartable(tmp_path, store)
    yield running
    running.stop()


def fast_retries(**kwargs) -> WriterOptions:
    return WriterOptions(backoff_initial=0.01, backoff_max=0.25, retry_for=None, **kwargs)


def test_kill9_restarts_store_every_batch_once_in_order(server):
    failures = []
    cids = [f"kill-{k}-{uuid.uuid4().hex[:12]}" for k in range(CONVERSATIONS)]
    expected: dict[str, list[dict]] = {cid: [] for cid in cids}
    server.start()
    client = server.client(writer_options=fast_retries(on_error=failures.append))
    writer = client.writer
    chunk = BATCHES // (KILLS + 1) + 1
    handed = 0

    def hand(count: int) -> None:
        nonlocal handed
        for i in range(handed, min(handed + count, BATCHES)):
            cid = cids[i % CONVERSATIONS]
            batch = batch_for(cid, i)
            assert client.append_nowait(cid, batch)
            expected[cid] += batch
        handed = min(handed + count, BATCHES)

    try:
        for k in range(KILLS + 1):
            hand(chunk // 2)  # after a kill: handed over while the server is down
            if k:
                server.start()
            hand(chunk - chunk // 2)
            if k < KILLS:
                done = writer.stats.stored + writer.stats.found_stored
                wait_until(
                    lambda d=done: (
                        writer.stats.stored + writer.stats.found_stored >= d + 20 or not writer.pending
                    ),
                    timeout=60.0,
                    poll=0.005,
                    what="writer progress",
                )
                server.kill()  # mid-stream: appends in flight
        assert handed == BATCHES
        assert client.flush(180), f"{writer.pending} batches still pending"
    finally:
        client.close(10)
    assert failures == []
    for cid in cids:
        assert stored_payloads(server, cid) == expected[cid]
    assert writer.stats.stored + writer.stats.found_stored == BATCHES
    assert writer.stats.retries > 0  # the kills were seen
    print(f"stats: {writer.stats}")


def test_permanent_errors_reach_the_callback_and_nothing_else_is_dropped(tmp_path):
    add_site(tmp_path, None)
    server = Restartable(tmp_path)
    server.start()
    failures = []
    cid = f"perm-{uuid.uuid4().hex}"
    expected: list[dict] = []
    bad = {
        3: (cid, []),  # EmptyBatch
        7: (cid, [{"big": "x" * (300 * 1024)}]),  # PayloadTooLarge
        11: (cid, [1]),  # not an object: the server's InvalidArgument
        13: ("bad id!", [{"a": 1}]),  # refused at hand-over: not a conversation id
        17: (cid, [{"a": object()}]),  # refused at hand-over: not JSON
    }
    try:
        with server.client(writer_options=fast_retries(on_error=failures.append)) as client:
            for i in range(20):
                if i in bad:
                    client.append_nowait(*bad[i])
                else:
                    batch = batch_for(cid, i)
                    assert client.append_nowait(cid, batch)
                    expected += batch
            assert client.flush(60)
        got = sorted((f.disposition.value, type(f.error).__name__) for f in failures)
        assert got == sorted(
            [
                (Disposition.REJECTED.value, errors.EmptyBatch.__name__),
                (Disposition.REJECTED.value, errors.PayloadTooLarge.__name__),
                (Disposition.REJECTED.value, errors.InvalidArgument.__name__),
                (Disposition.REFUSED.value, errors.InvalidConversationId.__name__),
                (Disposition.REFUSED.value, TypeError.__name__),
            ]
        )
        rejected = [f for f in failures if f.disposition is Disposition.REJECTED]
        assert [f.items for f in rejected] == [bad[3][1], bad[7][1], bad[11][1]]  # in order, as handed
        assert stored_payloads(server, cid) == expected
    finally:
        server.stop()


def test_full_buffer_refuses_the_newest_batch_and_close_reports_the_rest(tmp_path):
    failures = []
    options = WriterOptions(max_batches=5, on_error=failures.append, backoff_initial=0.01, backoff_max=0.05)
    server = Restartable(tmp_path)  # never started: nothing listens on its port
    client = server.client(writer_options=options)
    accepted = [client.append_nowait(f"full-{i:04d}-conversation", [{"i": i}]) for i in range(6)]
    assert accepted == [True] * 5 + [False]
    assert [f.disposition for f in failures] == [Disposition.REFUSED]
    assert failures[0].items == [{"i": 5}]
    assert not client.flush(0.2)
    client.close(0.2)
    assert sorted(f.items[0]["i"] for f in failures if f.disposition is Disposition.ABANDONED) == [
        0,
        1,
        2,
        3,
        4,
    ]


def test_retry_for_gives_up_and_reports(tmp_path):
    failures = []
    options = WriterOptions(retry_for=0.3, backoff_initial=0.01, backoff_max=0.05, on_error=failures.append)
    server = Restartable(tmp_path)  # never started
    with server.client(writer_options=options) as client:
        assert client.append_nowait("giveup-conversation", [{"a": 1}])
        assert client.append_nowait("giveup-conversation", [{"a": 2}])
        assert client.flush(30)
    assert [(f.disposition, f.items) for f in failures] == [
        (Disposition.GAVE_UP, [{"a": 1}]),
        (Disposition.GAVE_UP, [{"a": 2}]),
    ]
    assert all(isinstance(f.error, errors.Unavailable) for f in failures)


def _agent(url: str, spool: str, cid: str, count: int) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.client_agent", url, spool, cid, str(count)],
        cwd=REPO,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    assert proc.stdout.readline() == "handed\n", "the agent did not hand its batches over"
    return proc


@pytest.mark.parametrize("server_up", [False, True], ids=["server-down", "server-up"])
def test_spool_survives_kill9_of_the_agent(tmp_path, server_up):
    add_site(tmp_path, None)
    server = Restartable(tmp_path)
    spool = str(tmp_path / "agent.spool")
    cid = f"spool-{uuid.uuid4().hex}"
    count = 200
    try:
        if server_up:
            server.start()
        agent = _agent(server.url if server_up else f"http://127.0.0.1:{free_port()}/mcp", spool, cid, count)
        if server_up:  # kill -9 mid-stream: once the first batches are stored
            with server.client() as probe:
                wait_until(
                    lambda: probe.recall(cid, 1),
                    timeout=60.0,
                    poll=0.005,
                    what="the agent's first batch stored",
                )
        agent.kill()  # kill -9, after append_nowait returned for every batch
        agent.wait()
        if not server_up:
            server.start()
        before = len(stored_payloads(server, cid))
        failures = []
        with server.client(writer_options=fast_retries(spool=spool, on_error=failures.append)) as client:
            if not server_up:
                assert client.writer.pending == count  # every batch was replayed from the spool
            assert client.flush(60)
        assert failures == []
        expected = [item for i in range(count) for item in batch_for(cid, i)]
        assert stored_payloads(server, cid) == expected
        print(f"stored before the replay: {before} items of {len(expected)}")
    finally:
        server.stop()
