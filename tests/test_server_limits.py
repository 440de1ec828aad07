"""The hostile-client guards in-process: KDF admission order, large-parse bound, log rate limit, body cap."""

from __future__ import annotations

import json
import logging
import threading
import time

import anyio
import pytest

from logstore.core.limits import MAX_BATCH_BYTES, MAX_BATCH_ITEMS
from server.auth.kdf_gate import ADDRESS_FACTOR, AuthShed, AuthThrottled, FailureThrottle, KdfGate
from server.config import ServeConfig
from server.transport.http_limits import MAX_REQUEST_BODY, HttpLimits
from server.transport.log_guard import RateLimitFilter
from server.transport.request_guard import BodyGuard

pytestmark = pytest.mark.anyio


def test_the_body_cap_carries_every_valid_batch_however_escaped():
    # The worst expansion JSON escaping allows: 4-byte characters as 12-byte surrogate-pair escapes.
    per_item = MAX_BATCH_BYTES // MAX_BATCH_ITEMS
    item = {"t": "\U0001f600" * ((per_item - 20) // 4)}
    batch = [item] * MAX_BATCH_ITEMS
    compact = sum(len(json.dumps(i, ensure_ascii=False, separators=(",", ":")).encode()) for i in batch)
    assert compact <= MAX_BATCH_BYTES
    call = {
        "jsonrpc": "2.0",
        "id": 1,
        "method": "tools/call",
        "params": {"name": "append_memory", "arguments": {"conversation_id": "x" * 64, "items": batch}},
    }
    assert len(json.dumps(call, ensure_ascii=True).encode()) <= MAX_REQUEST_BODY
    assert MAX_REQUEST_BODY < 8 * 1024 * 1024  # half the old cap: half the parse amplification


def test_limits_come_from_the_environment_and_are_validated():
    env = {
        "LOGSTORE_MAX_SESSIONS": "7",
        "LOGSTORE_MAX_SESSIONS_PER_SITE": "2",
        "LOGSTORE_HEADER_TIMEOUT": "2.5",
    }
    limits = ServeConfig.from_env(env).http_limits
    assert (limits.max_sessions, limits.max_sessions_per_site, limits.header_timeout) == (7, 2, 2.5)
    with pytest.raises(ValueError, match="max_sessions_per_site"):
        ServeConfig.from_env({"LOGSTORE_MAX_SESSIONS": "5", "LOGSTORE_MAX_SESSIONS_PER_SITE": "6"})
    with pytest.raises(ValueError, match="body_timeout"):
        ServeConfig.from_env({"LOGSTORE_BODY_TIMEOUT": "0"})


class GateProbe:
    """Submits named jobs to a one-thread gate; the job "blocker" holds the thread until ``release``."""

    def __init__(self, queue: int) -> None:
        self.gate = KdfGate(HttpLimits(kdf_threads=1, kdf_queue=queue))
        self.release = threading.Event()
        self.order: list[str] = []
        self.outcomes: dict[str, str] = {}

    def _work(self, name: str) -> str:
        if name == "blocker":
            self.release.wait(10)
        self.order.append(name)
        return name

    async def submit(self, name: str, suspect: bool = False, share: str = "") -> None:
        try:
            self.outcomes[name] = await self.gate.run(self._work, name, share=share, suspect=suspect)
        except AuthShed:
            self.outcomes[name] = "shed"


async def test_kdf_gate_serves_clean_addresses_before_suspect_ones_and_sheds_suspects_first():
    probe = GateProbe(queue=3)
    submit, release, order, outcomes = probe.submit, probe.release, probe.order, probe.outcomes

    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, "blocker", False)
        await anyio.sleep(0.05)
        for name in ("s1", "s2", "s3"):  # the queue (3) fills with suspects
            tg.start_soon(submit, name, True)
            await anyio.sleep(0.01)
        tg.start_soon(submit, "s4", True)  # full, suspect: shed itself
        await anyio.sleep(0.01)
        tg.start_soon(submit, "clean", False)  # full, clean: sheds the newest suspect (s3), jumps the queue
        await anyio.sleep(0.05)
        release.set()
    assert outcomes["s4"] == "shed" and outcomes["s3"] == "shed"
    assert order == ["blocker", "clean", "s1", "s2"]


async def test_kdf_gate_gives_each_share_its_turn_so_one_flooded_share_cannot_take_every_slot():
    probe = GateProbe(queue=4)
    release, order, outcomes = probe.release, probe.order, probe.outcomes

    async def submit(name: str, share: str) -> None:
        await probe.submit(name, share=share)

    async with anyio.create_task_group() as tg:
        tg.start_soon(submit, "blocker", "flood")
        await anyio.sleep(0.05)
        for name in ("f1", "f2", "f3", "f4", "f5"):  # clean, fresh sources: f5 finds the queue full
            tg.start_soon(submit, name, "flood")
            await anyio.sleep(0.01)
        tg.start_soon(submit, "alpha", "alpha")  # full: the largest share gives up its newest (f4)
        await anyio.sleep(0.01)
        tg.start_soon(submit, "f6", "flood")  # full, and its share is the largest: shed itself
        await anyio.sleep(0.05)
        release.set()
    assert outcomes["f5"] == outcomes["f4"] == outcomes["f6"] == "shed"
    assert order == ["blocker", "f1", "alpha", "f2", "f3"]  # alpha's share had its turn after one flood run


def test_failure_throttle_is_per_address_and_site_with_a_wider_cap_per_address():
    throttle = FailureThrottle(HttpLimits(auth_failures=2, auth_failure_window=60))
    for _ in range(2):
        throttle.begin("a", "gamma")
        throttle.end("a", "gamma", failed=True)
    with pytest.raises(AuthThrottled):
        throttle.begin("a", "gamma")
    assert throttle.begin("a", "alpha") is False  # a neighbour's site on the same address: clean
    throttle.end("a", "alpha", failed=False)
    for k in range(2 * ADDRESS_FACTOR - 2):  # spraying site names: the address-wide cap (2 x factor)
        throttle.begin("a", f"s{k}")
        throttle.end("a", f"s{k}", failed=True)
    with pytest.raises(AuthThrottled):
        throttle.begin("a", "alpha")
    assert throttle.begin("b", "alpha") is False


def test_failure_throttle_counts_in_flight_and_failed_per_address_per_window():
    now = [0.0]
    throttle = FailureThrottle(HttpLimits(auth_failures=2, auth_failure_window=60), clock=lambda: now[0])
    assert throttle.begin("a") is False  # clean
    assert throttle.begin("a") is False
    with pytest.raises(AuthThrottled):  # two in flight use the window up
        throttle.begin("a")
    throttle.begin("b")  # another address is unaffected
    throttle.end("a", failed=True)
    throttle.end("a", failed=False)  # refused or right: not a failure
    assert throttle.begin("a") is True  # one failure: suspect, but room for one more
    with pytest.raises(AuthThrottled) as refused:
        throttle.begin("a")
    assert refused.value.retry_after == 60
    now[0] = 61.0
    throttle.end("a", failed=False)
    assert throttle.begin("a") is False  # a new window: the old failures are forgotten


async def test_at_most_max_large_bodies_are_parsed_at_once():
    limits = HttpLimits(large_body_bytes=100, max_large_bodies=2)
    running, peak = [0], [0]

    async def app(scope, receive, send):
        message = await receive()
        assert len(message["body"]) == 1000 and not message["more_body"]
        running[0] += 1
        peak[0] = max(peak[0], running[0])
        await anyio.sleep(0.02)
        running[0] -= 1
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})

    guard = BodyGuard(app, limits)

    async def one() -> None:
        chunks = [{"type": "http.request", "body": b"x" * 500, "more_body": more} for more in (True, False)]

        async def receive():
            return chunks.pop(0) if chunks else {"type": "http.disconnect"}

        async def send(message):
            pass

        scope = {"type": "http", "method": "POST", "headers": [], "client": ("127.0.0.1", 1)}
        await guard(scope, receive, send)

    async with anyio.create_task_group() as tg:
        for _ in range(8):
            tg.start_soon(one)
    assert peak[0] == 2


def test_log_guard_passes_a_burst_then_counts_what_it_dropped():
    guard = RateLimitFilter(burst=3, window=0.2)
    record = lambda: logging.LogRecord("x", logging.WARNING, __file__, 1, "refused %s", ("a",), None)  # noqa: E731
    passed = [guard.filter(record()) for _ in range(1000)]
    assert passed.count(True) == 3
    time.sleep(0.25)
    summary = record()
    assert guard.filter(summary) and "997 similar messages suppressed" in summary.getMessage()


def test_session_admission_evicts_idle_longest_and_refuses_only_when_all_are_busy():
    from server.auth.sessions import SitedSessionManager, _Session

    manager = SitedSessionManager(app=object(), limits=HttpLimits(max_sessions=4, max_sessions_per_site=2))
    book = manager._book
    book.update({"a1": _Session("a", 1.0), "a2": _Session("a", 2.0), "b1": _Session("b", 3.0)})
    assert manager._victims("a") == ["a1"]  # at its own cap: its own idle-longest goes
    assert manager._victims("b") == [] and manager._victims("c") == []
    book["b2"] = _Session("b", 0.5)
    # Global cap (4): the idle-longest session of a site holding the most (a and b hold 2; b2 is oldest).
    assert manager._victims("c") == ["b2"]
    for session in book.values():
        session.in_flight = 1
    assert manager._victims("c") is None and "all busy" in manager._refusal("c")
    assert "this site has 2 sessions open" in manager._refusal("a")
    book["a1"].in_flight = 0
    assert manager._victims("c") == ["a1"] and manager._refusal("c") is None
