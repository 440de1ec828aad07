"""``GET /metrics`` (server/metrics.py) and the access log (server/transport/access_log.py), on real servers.

The figures are checked against what the client did: every call it made is counted once across the
workers, every append is one request in some group commit, every conversation a worker holds open is in
the gauge until that worker dies. No label may carry a site, a conversation id or a payload.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from bench.load import LightClient
from bench.procfs import worker_pids
from logstore.file.credentials import CredentialsFile
from tests.server_support import free_port, serve

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="reads /proc")

CLIENTS, APPENDS, BAD = 4, 6, 2
SECRET_PAYLOAD = "payload-text-that-must-never-show"
ALLOWED_LABELS = {"tool", "code", "kind", "le"}


def _get(url: str, token: str | None = None) -> tuple[int, str]:
    request = urllib.request.Request(url)
    if token is not None:
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=10) as reply:
            return reply.status, reply.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


def _samples(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    out = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            out[(s.name, tuple(sorted(s.labels.items())))] = s.value
    return out


def _value(samples: dict, name: str, **labels: str) -> float:
    return samples.get((name, tuple(sorted(labels.items()))), 0.0)


def _open_logs(pids: list[int]) -> int:
    """Conversation logs the workers hold open, counted from their descriptors (the engine keeps one per
    open conversation; a worker also opens conversations another appended to, when its listing catches up)."""
    total = 0
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        with contextlib.suppress(FileNotFoundError):
            for fd in os.listdir(fd_dir):
                with contextlib.suppress(OSError):
                    total += os.readlink(f"{fd_dir}/{fd}").endswith(".log")
    return total


def _gauge_matches_descriptors(server, pids: list[int]) -> float:
    """The open-conversations gauge, once it equals the descriptor count (a background catch-up of the
    listing may open one between the two readings)."""
    deadline = time.monotonic() + 10
    while True:
        before = _open_logs(pids)
        gauge = _value(_samples(_get(f"{server.base}/metrics")[1]), "logstore_open_conversations")
        if gauge == before == _open_logs(pids) or time.monotonic() > deadline:
            assert gauge == before, (gauge, before)
            return gauge
        time.sleep(0.2)


def _conversation(i: int) -> str:
    return f"metrics-conv-{i}"


async def _load(url: str) -> list[LightClient]:
    """CLIENTS keep-alive clients, each appending APPENDS batches to its own conversation, then BAD
    calls with an invalid conversation id. Returns the clients, still connected."""
    clients = [LightClient(url, "alpha", "pw") for _ in range(CLIENTS)]
    await asyncio.gather(*(c.__aenter__() for c in clients))

    async def work(i: int, client: LightClient) -> None:
        for _ in range(APPENDS):
            items = [{"text": SECRET_PAYLOAD}, {"n": 1}]
            await client.call("append_memory", {"conversation_id": _conversation(i), "items": items})
        for _ in range(BAD):
            with pytest.raises(RuntimeError, match="InvalidConversationId"):
                await client.call("recall_memory", {"conversation_id": "no spaces allowed"})

    await asyncio.gather(*(work(i, c) for i, c in enumerate(clients)))
    return clients


def test_metrics_add_up_over_two_workers_and_a_dead_worker_leaves_the_gauge(tmp_path):
    CredentialsFile(str(tmp_path)).add("alpha", "pw")
    with serve(tmp_path, "--workers", "2") as server:
        pids = worker_pids(server.proc.pid)
        assert len(pids) == 2

        async def scenario() -> str:
            clients = await _load(server.url)
            text = _get(f"{server.base}/metrics")[1]
            await asyncio.gather(*(c.__aexit__() for c in clients))
            return text

        text = asyncio.run(scenario())
        # two auth failures of known kinds: no credentials, wrong password
        assert _get(server.url)[0] == 401
        bad = urllib.request.Request(server.url, method="POST", data=b"{}")
        bad.add_header("Authorization", "Basic " + base64.b64encode(b"alpha:wrong").decode())
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(bad, timeout=10)
        samples = _samples(text)

        appends = CLIENTS * APPENDS
        assert _value(samples, "logstore_tool_calls_total", tool="append_memory", code="ok") == appends
        assert (
            _value(samples, "logstore_tool_calls_total", tool="recall_memory", code="InvalidConversationId")
            == CLIENTS * BAD
        )
        assert _value(samples, "logstore_tool_latency_seconds_count", tool="append_memory") == appends
        # every successful append is one request in exactly one group commit, whichever worker ran it
        assert _value(samples, "logstore_group_commit_requests_sum") == appends
        commits = _value(samples, "logstore_group_commit_requests_count")
        assert 0 < commits <= appends
        assert _value(samples, "logstore_fsync_seconds_count") == commits
        assert _value(samples, "logstore_appended_bytes_total") > appends * len(SECRET_PAYLOAD)
        assert _gauge_matches_descriptors(server, pids) >= CLIENTS  # each appended to by some worker

        later = _samples(_get(f"{server.base}/metrics")[1])
        assert _value(later, "logstore_auth_failures_total", kind="missing") == 1
        assert _value(later, "logstore_auth_failures_total", kind="invalid") == 1

        for (name, labels), _ in later.items():
            assert {k for k, _ in labels} <= ALLOWED_LABELS, (name, labels)
            for _, v in labels:
                assert "metrics-conv" not in v and "alpha" not in v and SECRET_PAYLOAD not in v

        # A worker dies: its open conversations leave the gauge, its calls stay counted.
        assert _open_logs([pids[0]]) > 0  # round robin gave it clients: it holds conversations open
        os.kill(pids[0], signal.SIGKILL)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline and pids[0] in worker_pids(server.proc.pid):
            time.sleep(0.1)
        time.sleep(0.3)  # the supervisor reaps it (and marks it dead) in its next loop turn
        alive = worker_pids(server.proc.pid)
        assert pids[0] not in alive and pids[1] in alive
        _gauge_matches_descriptors(server, alive)  # without the dead worker's share
        after = _samples(_get(f"{server.base}/metrics")[1])
        assert _value(after, "logstore_tool_calls_total", tool="append_memory", code="ok") == appends


def test_metrics_token_separate_bind_and_off(tmp_path):
    CredentialsFile(str(tmp_path)).add("alpha", "pw")
    with serve(tmp_path, "--metrics-token", "s3cret") as server:
        assert _get(f"{server.base}/metrics")[0] == 401
        assert _get(f"{server.base}/metrics", "wrong")[0] == 401
        status, text = _get(f"{server.base}/metrics", "s3cret")
        assert status == 200 and "logstore_tool_calls" in text
    bind = free_port()
    with serve(tmp_path, "--workers", "2", "--metrics-bind", f"127.0.0.1:{bind}") as server:
        assert _get(f"{server.base}/metrics")[0] == 404  # not on the main port
        status, text = _get(f"http://127.0.0.1:{bind}/metrics")
        assert status == 200 and "logstore_open_conversations" in text
    with serve(tmp_path, "--no-metrics") as server:
        assert _get(f"{server.base}/metrics")[0] == 404


@pytest.mark.parametrize("log_format", ["text", "json"])
def test_one_access_line_per_call_without_ids_or_payloads(tmp_path, log_format):
    CredentialsFile(str(tmp_path)).add("alpha", "pw")
    with serve(tmp_path, "--log-level", "info", "--log-format", log_format) as server:

        async def calls() -> None:
            async with LightClient(server.url, "alpha", "pw") as client:
                items = [{"text": SECRET_PAYLOAD}] * 3
                await client.call("append_memory", {"conversation_id": "metrics-conv-x", "items": items})
                with pytest.raises(RuntimeError):
                    await client.call("recall_memory", {"conversation_id": "no spaces allowed"})

        asyncio.run(calls())
        time.sleep(0.2)
        output = server.stdout()
    lines = [line for line in output.splitlines() if "logstore.access" in line]
    assert len(lines) == 2, output
    assert "metrics-conv-x" not in output and SECRET_PAYLOAD not in output
    if log_format == "json":
        docs = [json.loads(line) for line in lines]
        assert [d["code"] for d in docs] == ["ok", "InvalidConversationId"]
        assert docs[0]["site"] == "alpha" and docs[0]["tool"] == "append_memory" and docs[0]["items"] == 3
        assert docs[0]["logger"] == "logstore.access" and docs[0]["latency_ms"] >= 0
        for line in output.splitlines():  # every other record is JSON too (uvicorn's included)
            if line.startswith("{"):
                json.loads(line)
    else:
        assert "site=alpha tool=append_memory code=ok items=3 latency_ms=" in lines[0]
        assert "tool=recall_memory code=InvalidConversationId items=0" in lines[1]
