"""Storage errors seen from outside: ConversationFull, Timeout and Corrupted over HTTP, against a data dir
prepared with the real engine; plus the error funnel for failures no client can provoke (Io, Unavailable,
unexpected exceptions), driven in-process through the same MCP server with the real ``Store``.
"""

from __future__ import annotations

import json
import os

import anyio
import pytest
from filelock import FileLock
from mcp import Client

from logstore import Store
from logstore.core import errors
from logstore.file.credentials import CredentialsFile
from logstore.file.layout import conversation_paths
from server.mcp.app import build_mcp_server, spec_bindings
from server.mcp.tool_errors import error_body
from tests.corruption import flip_byte
from tests.helpers import log_frames
from tests.server_support import MODES, call, connect, error_of, serve

pytestmark = pytest.mark.anyio

FULL = "full-conversation"
CORRUPT = "corrupt-conversation"
LOCKED = "locked-conversation"


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """A data dir with a full conversation and one whose middle frame is damaged; then the server."""
    data_dir = str(tmp_path_factory.mktemp("storage"))
    CredentialsFile(data_dir).add("alpha", "pw")
    log_path = conversation_paths(os.path.abspath(data_dir), "alpha", CORRUPT).log
    with Store(data_dir) as store:
        for b in range(400):  # 99,999 items: one below the spec's 100,000
            store.append("alpha", FULL, [{"i": b * 250 + i} for i in range(250 if b < 399 else 249)])
        store.append("alpha", CORRUPT, [{"frame": 1}])
        store.append("alpha", CORRUPT, [{"frame": 2}])
        store.append(
            "alpha", CORRUPT, [{"frame": 3}]
        )  # data after the bad frame: corruption, not a torn tail
    # The frames, not the file size: while a store has a log open, a v2 log has a preallocated tail.
    second = log_frames(log_path)[1]
    second_frame = second.offset
    flip_byte(log_path, second_frame + second.size // 2, 0x01)
    with serve(data_dir, "--lock-timeout", "0.3") as running:
        yield running, second_frame


@pytest.mark.parametrize("mode", MODES)
async def test_conversation_full(prepared, mode):
    server, _ = prepared
    async with connect(server.url, "alpha", "pw", mode) as c:
        is_error, out = await call(
            c, "append_memory", {"conversation_id": FULL, "items": [{"a": 1}, {"b": 2}]}
        )
        err = error_of(out)
        assert is_error and err["code"] == "ConversationFull" and err["retryable"] is False
        assert (err["stored"], err["requested"], err["limit"]) == (99_999, 2, 100_000)
        _, out = await call(c, "recall_memory", {"conversation_id": FULL, "count": 1})
        assert out["items"][0]["seq"] == 99_998  # nothing of the rejected batch was stored


@pytest.mark.parametrize("mode", MODES)
async def test_lock_held_elsewhere_is_a_retryable_timeout(prepared, mode):
    server, _ = prepared
    lock_path = conversation_paths(os.path.abspath(server.data_dir), "alpha", f"{LOCKED}-{mode[:2]}").lock
    os.makedirs(os.path.dirname(lock_path), exist_ok=True)
    async with connect(server.url, "alpha", "pw", mode) as c:
        with FileLock(lock_path):  # another process (this test) holds the conversation's flock
            is_error, out = await call(
                c, "append_memory", {"conversation_id": f"{LOCKED}-{mode[:2]}", "items": [{}]}
            )
        err = error_of(out)
        assert is_error and err["code"] == "Timeout" and err["retryable"] is True
        assert ".lock" not in err["message"]
        # Lock released: the retry the error invites succeeds.
        is_error, ack = await call(
            c, "append_memory", {"conversation_id": f"{LOCKED}-{mode[:2]}", "items": [{}]}
        )
        assert not is_error and ack == {"first_seq": 0, "last_seq": 0}


@pytest.mark.parametrize("mode", MODES)
async def test_corrupted_log_reports_the_offset_and_no_path(prepared, mode):
    server, second_frame = prepared
    async with connect(server.url, "alpha", "pw", mode) as c:
        is_error, out = await call(c, "recall_memory", {"conversation_id": CORRUPT})
        err = error_of(out)
        assert is_error and err["code"] == "Corrupted" and err["retryable"] is False
        assert err["offset"] == second_frame
        assert server.data_dir not in json.dumps(out) and ".log" not in json.dumps(out)
        # Reads that stay before the bad frame still work.
        is_error, out = await call(c, "replay_memory", {"conversation_id": CORRUPT, "offset": 0, "limit": 1})
        assert not is_error and [i["payload"] for i in out["items"]] == [{"frame": 1}]


# --- the funnel for failures a client cannot trigger -------------------------------------------------


class FailingStore:
    """The real Store, except that ``append`` raises what the test says."""

    def __init__(self, store: Store, exc: BaseException) -> None:
        self._store, self._exc = store, exc

    def append(self, *args, **kwargs):
        raise self._exc

    def __getattr__(self, name):
        return getattr(self._store, name)


SECRET = "/srv/secret/path/do-not-leak"


@pytest.mark.parametrize(
    ("exc", "code", "retryable"),
    [
        (errors.Io(f"fdatasync failed on {SECRET}: ENOSPC", errno=28), "Io", True),
        (errors.Unavailable(f"store closed ({SECRET})"), "Unavailable", True),
        (errors.Timeout(f"lock {SECRET} busy"), "Timeout", True),
        (RuntimeError(f"bug with {SECRET}"), "Unavailable", True),
        (KeyError(SECRET), "Unavailable", True),
    ],
)
async def test_operational_failures_are_retryable_and_leak_nothing(tmp_path, exc, code, retryable, caplog):
    with Store(tmp_path) as real:
        store = FailingStore(real, exc)
        mcp_server = build_mcp_server(
            spec_bindings(store), site_of=lambda ctx: "alpha", limiter=anyio.CapacityLimiter(4)
        )
        async with Client(mcp_server) as client:
            is_error, out = await call(
                client, "append_memory", {"conversation_id": "conv-00001", "items": [{}]}
            )
            # Reads still go to the real store.
            assert await call(client, "recall_memory", {"conversation_id": "conv-00001"}) == (
                False,
                {"items": []},
            )
    err = error_of(out)
    assert is_error and (err["code"], err["retryable"]) == (code, retryable)
    assert SECRET not in json.dumps(out) and "Traceback" not in json.dumps(out)
    assert SECRET in caplog.text  # ...but the operator sees it in the log


def test_error_body_details_cannot_override_the_envelope():
    class Sneaky(errors.InvalidArgument):
        def details(self):
            return {"code": "Fake", "retryable": True, "extra": 1}

    body = error_body(Sneaky("bad"))["error"]
    assert (body["code"], body["retryable"], body["extra"]) == ("InvalidArgument", False, 1)
