"""End to end over real HTTP: ``logstore serve`` in a subprocess, the SDK client, both protocol eras.

Every tool, the spec's read semantics, and every argument error a client can provoke. Storage errors that
need a prepared data dir (ConversationFull, Timeout, Corrupted) are in test_server_storage_errors.py.
"""

from __future__ import annotations

import json
import re
import uuid

import pytest

from logstore.core import errors
from logstore.core.limits import MAX_BATCH_ITEMS
from logstore.file.credentials import CredentialsFile
from server.mcp.spec_tools import tools_by_name
from server.mcp.validation import ArgumentValidator
from tests.helpers import initialize_body
from tests.server_support import MODES, call, connect, error_of, serve

pytestmark = pytest.mark.anyio

RFC3339 = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}\.\d{6}Z$")


@pytest.fixture(scope="module", params=["file", "postgres"])
def server(request, tmp_path_factory):
    """The same tests against each backend: a data dir, or a fresh schema on the session's PostgreSQL."""
    data_dir = tmp_path_factory.mktemp("tools")
    store = None
    if request.param == "postgres":
        from logstore.postgres.registry import PostgresRegistry
        from tests.postgres_support import fresh_url, shared_server

        store = fresh_url(shared_server())
        creds = PostgresRegistry(store)
    else:
        creds = CredentialsFile(str(data_dir))
    creds.add("alpha", "alpha-password")
    for mode in MODES:  # one site per listing test, so each listing holds exactly what the test wrote
        creds.add(list_site(mode), "pw")
    with serve(data_dir, store=store, passwords={"alpha": "alpha-password"}) as running:
        yield running


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


def list_site(mode: str) -> str:
    return f"list-{mode.replace('-', '')}"


def client(server, mode):
    return connect(server.url, "alpha", server.passwords["alpha"], mode)


def new_id() -> str:
    return f"conv-{uuid.uuid4().hex}"


@pytest.mark.parametrize(
    ("mode", "expected"), [("legacy", "2025-11-25"), ("2026-07-28", "2026-07-28"), ("auto", "2026-07-28")]
)
async def test_protocol_versions(server, mode, expected):
    async with client(server, mode) as c:
        assert c.protocol_version == expected
        assert [t.name for t in (await c.list_tools()).tools] == [
            "append_memory",
            "recall_memory",
            "replay_memory",
            "list_conversations",
        ]


async def test_append_then_read_back_verbatim(server, mode):
    cid = new_id()
    payloads = [
        {"role": "user", "text": "héllo ✓ 😀", "nested": {"a": [1, 2.5, None, True, {"b": []}]}},
        {},
        {"big": 2**70, "neg": -(2**63), "float": 1e-7, "z": "", "order": {"z": 1, "a": 2}},
    ]
    async with client(server, mode) as c:
        is_error, ack = await call(c, "append_memory", {"conversation_id": cid, "items": payloads})
        assert not is_error and ack == {"first_seq": 0, "last_seq": 2}
        is_error, ack = await call(c, "append_memory", {"conversation_id": cid, "items": [{"n": 3}]})
        assert not is_error and ack == {"first_seq": 3, "last_seq": 3}

        is_error, out = await call(c, "recall_memory", {"conversation_id": cid})
        assert not is_error
        items = out["items"]
        assert [i["seq"] for i in items] == [0, 1, 2, 3]
        assert [i["payload"] for i in items] == [*payloads, {"n": 3}]
        assert list(items[2]["payload"]["order"]) == ["z", "a"]  # key order kept
        assert all(RFC3339.match(i["recorded_at"]) for i in items)
        # One batch, one commit time; never decreasing.
        assert items[0]["recorded_at"] == items[1]["recorded_at"] == items[2]["recorded_at"]
        assert items[3]["recorded_at"] >= items[2]["recorded_at"]


async def test_recall_tail_semantics(server, mode):
    cid = new_id()
    async with client(server, mode) as c:
        for start in range(0, 60, 20):
            batch = [{"i": i} for i in range(start, start + 20)]
            assert not (await call(c, "append_memory", {"conversation_id": cid, "items": batch}))[0]
        _, out = await call(c, "recall_memory", {"conversation_id": cid})
        assert [i["seq"] for i in out["items"]] == list(range(10, 60))  # default count 50, oldest first
        _, out = await call(c, "recall_memory", {"conversation_id": cid, "count": 3})
        assert [i["payload"]["i"] for i in out["items"]] == [57, 58, 59]
        _, out = await call(c, "recall_memory", {"conversation_id": cid, "count": 0})
        assert out == {"items": []}
        _, out = await call(c, "recall_memory", {"conversation_id": cid, "count": 1000})
        assert len(out["items"]) == 60
        # Never appended to: empty, not an error.
        assert await call(c, "recall_memory", {"conversation_id": new_id()}) == (False, {"items": []})


async def test_replay_pages_through_the_whole_log(server, mode):
    cid = new_id()
    async with client(server, mode) as c:
        await call(c, "append_memory", {"conversation_id": cid, "items": [{"i": i} for i in range(25)]})
        # The spec's restore loop: start at 0, continue at last seq + 1, stop at the first short page.
        seen, offset = [], 0
        while True:
            is_error, out = await call(
                c, "replay_memory", {"conversation_id": cid, "offset": offset, "limit": 10}
            )
            assert not is_error
            seen += [i["payload"]["i"] for i in out["items"]]
            if len(out["items"]) < 10:
                break
            offset = out["items"][-1]["seq"] + 1
        assert seen == list(range(25))
        _, out = await call(c, "replay_memory", {"conversation_id": cid, "limit": 2})  # offset defaults to 0
        assert [i["seq"] for i in out["items"]] == [0, 1]
        assert (await call(c, "replay_memory", {"conversation_id": cid, "offset": 25, "limit": 5}))[1] == {
            "items": []
        }
        assert (await call(c, "replay_memory", {"conversation_id": cid, "offset": 10**12, "limit": 5}))[
            1
        ] == {"items": []}
        assert (await call(c, "replay_memory", {"conversation_id": cid, "limit": 0}))[1] == {"items": []}
        assert (await call(c, "replay_memory", {"conversation_id": new_id(), "limit": 5}))[1] == {"items": []}


async def test_list_conversations_pages_most_recent_first(server, mode):
    site = list_site(mode)
    ids = [new_id() for _ in range(5)]
    async with connect(server.url, site, "pw", mode) as c:
        assert await call(c, "list_conversations", {}) == (False, {"conversations": [], "next_cursor": None})
        for cid in ids:
            await call(c, "append_memory", {"conversation_id": cid, "items": [{"first": True}]})
        await call(c, "append_memory", {"conversation_id": ids[1], "items": [{"again": True}]})
        expected = [ids[1], ids[4], ids[3], ids[2], ids[0]]

        _, page = await call(c, "list_conversations", {})
        assert [s["conversation_id"] for s in page["conversations"]] == expected
        assert page["next_cursor"] is None
        for s in page["conversations"]:
            assert RFC3339.match(s["created_at"]) and RFC3339.match(s["last_appended_at"])
            assert set(s) == {"conversation_id", "created_at", "last_appended_at"}
        first = page["conversations"][0]
        assert first["last_appended_at"] > first["created_at"]

        listed, cursor = [], None
        while True:
            _, page = await call(c, "list_conversations", {"cursor": cursor, "limit": 2})
            listed += [s["conversation_id"] for s in page["conversations"]]
            cursor = page["next_cursor"]
            if cursor is None:
                break
        assert listed == expected
        assert (await call(c, "list_conversations", {"limit": 0}))[1]["conversations"] == []


# --- errors a client can provoke ---------------------------------------------------------------------

ID_ERRORS = [
    ("short-7", "TooShort"),
    ("x" * 65, "TooLong"),
    ("conv 0001", "InvalidCharacters"),
    ("conv/../0001", "InvalidCharacters"),
    ("", "TooShort"),
    (12345678, "InvalidCharacters"),
]


@pytest.mark.parametrize(("conversation_id", "reason"), ID_ERRORS)
async def test_invalid_conversation_id_on_every_tool(server, mode, conversation_id, reason):
    async with client(server, mode) as c:
        for tool, extra in [
            ("append_memory", {"items": [{"a": 1}]}),
            ("recall_memory", {}),
            ("replay_memory", {"limit": 5}),
        ]:
            is_error, out = await call(c, tool, {"conversation_id": conversation_id, **extra})
            assert is_error
            err = error_of(out)
            assert (err["code"], err["reason"], err["retryable"]) == ("InvalidConversationId", reason, False)
            assert err["message"]


def _item_of_size(size: int) -> dict[str, str]:
    """An item whose compact JSON encoding is exactly ``size`` bytes: {"x":"aaa..."} is 8 + n bytes."""
    return {"x": "a" * (size - 8)}


async def test_size_limits(server, mode):
    cid = new_id()
    async with client(server, mode) as c:
        # Exactly at the per-item limit: accepted.
        ok, ack = await call(
            c, "append_memory", {"conversation_id": cid, "items": [_item_of_size(256 * 1024)]}
        )
        assert not ok and ack == {"first_seq": 0, "last_seq": 0}
        is_error, out = await call(
            c, "append_memory", {"conversation_id": cid, "items": [_item_of_size(256 * 1024 + 1)]}
        )
        err = error_of(out)
        assert is_error and err["code"] == "PayloadTooLarge" and err["retryable"] is False
        assert err["size"] == 256 * 1024 + 1 and err["limit"] == 256 * 1024 and err["index"] == 0
        # Four items at the item limit are exactly 1 MiB: accepted; one byte more: BatchTooLarge.
        full = [_item_of_size(256 * 1024)] * 4
        assert not (await call(c, "append_memory", {"conversation_id": cid, "items": full}))[0]
        over = [*[_item_of_size(256 * 1024)] * 3, _item_of_size(256 * 1024 - 100), _item_of_size(101)]
        is_error, out = await call(c, "append_memory", {"conversation_id": cid, "items": over})
        err = error_of(out)
        assert is_error and err["code"] == "BatchTooLarge" and err["retryable"] is False
        assert err["size"] == 1024 * 1024 + 1
        # Nothing of the rejected batches was stored.
        _, out = await call(c, "recall_memory", {"conversation_id": cid, "count": 1000})
        assert [i["seq"] for i in out["items"]] == [0, 1, 2, 3, 4]


ARGUMENT_ERRORS = [
    ("append_memory", {"conversation_id": "conv-00001", "items": []}, "EmptyBatch", None),
    (
        "append_memory",
        {"conversation_id": "conv-00001", "items": [{"a": 1}] * 251},
        "InvalidArgument",
        "items",
    ),
    ("append_memory", {"conversation_id": "conv-00001", "items": [{"a": 1}, 5]}, "InvalidArgument", "items"),
    ("append_memory", {"conversation_id": "conv-00001", "items": {"a": 1}}, "InvalidArgument", "items"),
    ("append_memory", {"conversation_id": "conv-00001"}, "InvalidArgument", "items"),
    ("append_memory", {"items": [{"a": 1}]}, "InvalidArgument", "conversation_id"),
    ("recall_memory", {"conversation_id": "conv-00001", "count": 1001}, "InvalidArgument", "count"),
    ("recall_memory", {"conversation_id": "conv-00001", "count": -1}, "InvalidArgument", "count"),
    ("recall_memory", {"conversation_id": "conv-00001", "count": "5"}, "InvalidArgument", "count"),
    ("recall_memory", {"conversation_id": "conv-00001", "count": 2.5}, "InvalidArgument", "count"),
    ("recall_memory", {"conversation_id": "conv-00001", "count": True}, "InvalidArgument", "count"),
    ("replay_memory", {"conversation_id": "conv-00001"}, "InvalidArgument", "limit"),
    ("replay_memory", {"conversation_id": "conv-00001", "limit": 1001}, "InvalidArgument", "limit"),
    (
        "replay_memory",
        {"conversation_id": "conv-00001", "limit": 5, "offset": -1},
        "InvalidArgument",
        "offset",
    ),
    ("list_conversations", {"limit": 1001}, "InvalidArgument", "limit"),
    ("list_conversations", {"cursor": 7}, "InvalidArgument", "cursor"),
    ("list_conversations", {"cursor": "not-a-cursor"}, "InvalidCursor", "cursor"),
    (
        "list_conversations",
        {"cursor": "AAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAAA"},
        "InvalidCursor",
        "cursor",
    ),
    ("forget_everything", {}, "UnknownTool", None),
]


@pytest.mark.parametrize(("tool", "arguments", "code", "field"), ARGUMENT_ERRORS)
async def test_argument_errors_are_permanent_tool_errors(server, mode, tool, arguments, code, field):
    async with client(server, mode) as c:
        is_error, out = await call(c, tool, arguments)
        assert is_error
        err = error_of(out)
        assert err["code"] == code and err["retryable"] is False and err["message"]
        assert err.get("field") == field
        # Messages name the rule, never echo the client's value back.
        assert "[{'a': 1}" not in err["message"] and "not-a-cursor" not in err["message"]
        # The server is still fine afterwards.
        assert not (await call(c, "recall_memory", {"conversation_id": "conv-00001"}))[0]


async def test_huge_batch_is_rejected_and_the_session_goes_on(server):
    """Millions of tiny items fit in one request body: refused by the item-count bound (which is checked
    before anything walks them: the next test), nothing stored, and the same session is served after.
    (It asserted "< 3 s" once: a wall-clock guess that failed at load 6.)"""
    cid = new_id()
    async with client(server, "2026-07-28") as c:
        is_error, out = await call(c, "append_memory", {"conversation_id": cid, "items": [{}] * 1_000_000})
        assert is_error and error_of(out)["field"] == "items"
        assert f"at most {MAX_BATCH_ITEMS} entries" in error_of(out)["message"]
        is_error, out = await call(c, "recall_memory", {"conversation_id": cid})
        assert not is_error and out["items"] == []
        is_error, out = await call(c, "append_memory", {"conversation_id": cid, "items": [{}]})
        assert not is_error and out["first_seq"] == 0


class Unwalkable(list):
    """A list whose entries must not be looked at: its length is all the count bound may read."""

    def __iter__(self):
        raise AssertionError("an entry was walked before the count bound")

    def __getitem__(self, index):
        raise AssertionError("an entry was read before the count bound")


def test_item_count_bound_is_checked_before_walking_the_items():
    """jsonschema takes seconds to reach maxItems on a million entries (it type-checks each first): the
    bound is checked on the length alone, before jsonschema sees the list."""
    validate = ArgumentValidator(tools_by_name()["append_memory"])
    with pytest.raises(errors.InvalidArgument, match=f"at most {MAX_BATCH_ITEMS} entries"):
        validate({"conversation_id": "conv-00001", "items": Unwalkable([{}] * 1_000_000)})
    with pytest.raises(AssertionError, match="before the count bound"):  # the guard: jsonschema reads it
        validate({"conversation_id": "conv-00001", "items": Unwalkable([{}] * 3)})


async def test_float_integers_are_accepted(server, mode):
    """JSON Schema counts 2.0 as an integer; some clients send numbers that way."""
    cid = new_id()
    async with client(server, mode) as c:
        await call(c, "append_memory", {"conversation_id": cid, "items": [{"i": i} for i in range(5)]})
        is_error, out = await call(c, "recall_memory", {"conversation_id": cid, "count": 2.0})
        assert not is_error and [i["seq"] for i in out["items"]] == [3, 4]


async def test_raw_wire_legacy_session_reports_tool_error_shape(server):
    """The exact JSON on the wire for a tool error (no SDK model in between)."""
    import httpx2

    headers = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}
    auth = httpx2.BasicAuth("alpha", server.passwords["alpha"])
    async with httpx2.AsyncClient(auth=auth, headers=headers) as http:
        r = await http.post(server.url, json=initialize_body())
        assert r.status_code == 200
        sid = r.headers["mcp-session-id"]
        h = {"mcp-session-id": sid, "mcp-protocol-version": "2025-11-25"}
        await http.post(server.url, json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=h)
        body = {
            "jsonrpc": "2.0",
            "id": 2,
            "method": "tools/call",
            "params": {"name": "append_memory", "arguments": {"conversation_id": "bad", "items": [{"a": 1}]}},
        }
        r = await http.post(server.url, json=body, headers=h)
        result = r.json()["result"]
        assert result["isError"] is True
        assert "structuredContent" not in result  # see server/mcp/tool_errors.py: TS SDK 1.x compatibility
        assert json.loads(result["content"][0]["text"]) == {
            "error": {
                "code": "InvalidConversationId",
                "message": "conversation_id must be at least 8 characters, got 3",
                "retryable": False,
                "reason": "TooShort",
            }
        }
