"""The fast lane (``server.mcp.fast_lane``) against the SDK path, in process, request by request.

Two apps are built from the same code over two stores with the same history: one with the lane, one
without (every request through the SDK and jsonschema). Each case is sent to both, and the answers must
be the same: HTTP status, content type, and the JSON-RPC message (the error name and message of a tool
error included; timestamps, which differ between the stores, are masked). Each case also says whether the
lane takes it or hands it to the SDK, and the lane's counter must agree, so the table cannot pass by the
lane handing everything over.
"""

from __future__ import annotations

import base64
import json
import logging
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
from starlette.testclient import TestClient

from logstore import Store
from logstore.core.factory import file_url, open_registry, open_store
from logstore.core.limits import MAX_BATCH_ITEMS, MAX_INT_DIGITS, MAX_PAYLOAD_DEPTH
from logstore.file import layout
from logstore.file.credentials import CredentialsFile
from logstore.file.log.frame import Frame, decode_frame
from server.http_app import build_http_app
from server.mcp.fast_lane import FastLane
from server.transport.access_log import ACCESS_LOGGER
from server.transport.log_guard import RateLimitFilter
from tests.helpers import initialize_body

SITE, PASSWORD = "alpha", "alpha-password"
CID = "conv-fast-lane-1"
AUTH = "Basic " + base64.b64encode(f"{SITE}:{PASSWORD}".encode()).decode()
META = {
    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
    "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
    "io.modelcontextprotocol/clientCapabilities": {},
}
META_TEXT = json.dumps(META)
_MASKED = {"recorded_at", "created_at", "last_appended_at"}


def _lane_of(app: Any) -> FastLane:
    """The lane inside the app's /mcp route (auth -> body guard -> lane)."""
    stack = [route.endpoint for route in app.routes if getattr(route, "path", None) == "/mcp"]
    while stack:
        node = stack.pop()
        if isinstance(node, FastLane):
            return node
        stack.extend(v for k, v in vars(node).items() if k == "app")
    raise AssertionError("no fast lane in the app")


class Pair:
    """The same requests to the app with the lane and the one without."""

    def __init__(self, lane: TestClient, sdk: TestClient, lane_app: FastLane, dirs: tuple[str, str]) -> None:
        self.lane, self.sdk, self.lane_app, self.dirs = lane, sdk, lane_app, dirs

    def both(self, body: bytes, headers: dict[str, str]) -> tuple[Any, Any, bool]:
        """(lane app's answer, SDK app's answer, whether the lane served it); answers normalised."""
        before = self.lane_app.served
        a = self.lane.post("/mcp", content=body, headers=headers)
        served = self.lane_app.served > before
        b = self.sdk.post("/mcp", content=body, headers=headers)
        return _answer(a), _answer(b), served


def _mask(node: Any) -> Any:
    if isinstance(node, dict):
        return {k: ("T" if k in _MASKED else _mask(v)) for k, v in node.items()}
    if isinstance(node, list):
        return [_mask(v) for v in node]
    return node


def _answer(response: Any) -> tuple[int, str | None, Any]:
    ctype = response.headers.get("content-type")
    try:
        body = json.loads(response.content)
    except ValueError:
        return response.status_code, ctype, response.content
    result = body.get("result") if isinstance(body, dict) else None
    if isinstance(result, dict):
        for block in result.get("content", []):
            if block.get("type") == "text":  # the text block is JSON too: compared as a document
                block["text"] = json.loads(block["text"])
    return response.status_code, ctype, _mask(body)


@pytest.fixture(scope="module")
def pair() -> Iterator[Pair]:
    with _pair() as made:
        yield made


@contextmanager
def _pair() -> Iterator[Pair]:
    with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
        apps = []
        for d, lane in ((a, True), (b, False)):
            CredentialsFile(d).add(SITE, PASSWORD)
            apps.append(
                build_http_app(open_store(file_url(d)), open_registry(file_url(d)), fast_lane=lane, ui=False)
            )
        base = "http://127.0.0.1:8000"
        before = _log_filters()
        try:
            with TestClient(apps[0], base_url=base) as lane, TestClient(apps[1], base_url=base) as sdk:
                yield Pair(lane, sdk, _lane_of(apps[0]), (a, b))
        finally:
            _drop_log_filters_since(before)


_GUARDED = ("", "uvicorn", "uvicorn.error", "asyncio")


def _filterers() -> list[logging.Filterer]:
    loggers = [logging.getLogger(name) for name in _GUARDED]
    return [*loggers, *(h for lg in loggers for h in lg.handlers)]


def _log_filters() -> set[int]:
    return {id(f) for node in _filterers() for f in node.filters}


def _drop_log_filters_since(before: set[int]) -> None:
    """The app's lifespan installs the server's log guard on this process's handlers (as uvicorn's process
    would); in a test process it would outlive the fixture and drop later tests' tracebacks."""
    for node in _filterers():
        for f in [f for f in node.filters if isinstance(f, RateLimitFilter) and id(f) not in before]:
            node.removeFilter(f)


def headers(tool: str = "append_memory", **extra: str) -> dict[str, str]:
    out = {
        "authorization": AUTH,
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": "2026-07-28",
        "mcp-method": "tools/call",
        "mcp-name": tool,
    }
    out.update({k.replace("_", "-"): v for k, v in extra.items()})
    return out


def call_body(tool: str, arguments: str, *, rid: str = "1", meta: str = META_TEXT) -> bytes:
    return (
        f'{{"jsonrpc":"2.0","id":{rid},"method":"tools/call",'
        f'"params":{{"name":"{tool}","arguments":{arguments},"_meta":{meta}}}}}'
    ).encode()


def nested(depth: int) -> str:
    return '{"d":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def _append(items: str, cid: str = CID) -> tuple[str, str]:
    return "append_memory", f'{{"conversation_id":"{cid}","items":{items}}}'


ITEM = '{"role":"user","text":"hello"}'

# (case name, tool, arguments JSON text, the lane takes it). The arguments cover the input schemas' rules
# (types, required, bounds, defaults, extra members), the engine's argument rules, and the payload-rules
# corpus of tests/test_server_payload_rules.py; "False" rows are what msgspec cannot read as the stdlib
# parser does, which the lane hands to the SDK.
ARGUMENT_CASES: list[tuple[str, str, str, bool]] = [
    ("append ok", *_append(f"[{ITEM},{ITEM}]"), True),
    ("append extra member", "append_memory", f'{{"conversation_id":"{CID}","items":[{ITEM}],"x":1}}', True),
    ("append empty batch", *_append("[]"), True),
    ("append 251 items", *_append("[" + ",".join(["{}"] * (MAX_BATCH_ITEMS + 1)) + "]"), True),
    ("append 250 items", *_append("[" + ",".join(["{}"] * MAX_BATCH_ITEMS) + "]"), True),
    ("items a string", *_append('"abc"'), True),
    ("items an object", *_append("{}"), True),
    ("items null", *_append("null"), True),
    ("item a number", *_append("[1]"), True),
    ("item a string", *_append('["s"]'), True),
    ("item an array", *_append("[[]]"), True),
    ("item null", *_append(f"[{ITEM},null]"), True),
    ("items missing", "append_memory", f'{{"conversation_id":"{CID}"}}', True),
    ("id missing", "append_memory", f'{{"items":[{ITEM}]}}', True),
    ("nothing", "append_memory", "{}", True),
    ("id a number", "append_memory", f'{{"conversation_id":5,"items":[{ITEM}]}}', True),
    ("id null", "append_memory", f'{{"conversation_id":null,"items":[{ITEM}]}}', True),
    ("id a list", "append_memory", f'{{"conversation_id":["a"],"items":[{ITEM}]}}', True),
    ("id empty", *_append(f"[{ITEM}]", cid=""), True),
    ("id short", *_append(f"[{ITEM}]", cid="short"), True),
    ("id bad characters", *_append(f"[{ITEM}]", cid="conv bad id!"), True),
    ("id too long", *_append(f"[{ITEM}]", cid="c" * 65), True),
    ("id non-ascii", *_append(f"[{ITEM}]", cid="conv-\u00e9t\u00e9-12"), True),
    ("both wrong", "append_memory", '{"conversation_id":5,"items":5}', True),
    ("depth at the limit", *_append(f"[{nested(MAX_PAYLOAD_DEPTH)}]"), True),
    ("depth over the limit", *_append(f"[{nested(MAX_PAYLOAD_DEPTH + 1)}]"), True),
    ("depth 197", *_append(f"[{nested(197)}]"), True),
    ("depth 300", *_append(f"[{nested(300)}]"), True),
    ("depth 800", *_append(f"[{nested(800)}]"), True),
    *[
        (f"non-finite {lit}", *_append(f'[{{"ok":1}},{{"a":[1,{{"x":{lit}}}]}}]'), False)
        for lit in ("1e400", "-1e400", "1e309", "NaN", "Infinity", "-Infinity")
    ],
    ("ints beyond 64 bits", *_append(f'[{{"v":[{2**64},{-(2**64) - 1},{2**70},{-(2**200)}]}}]'), True),
    ("int of MAX_INT_DIGITS", *_append(f'[{{"n":{"9" * MAX_INT_DIGITS}}}]'), True),
    ("int one digit more", *_append(f'[{{"n":-1{"0" * MAX_INT_DIGITS}}}]'), False),
    ("int two digits more", *_append(f'[{{"n":1{"0" * (MAX_INT_DIGITS + 1)}}}]'), False),
    ("lone surrogate", *_append('[{"t":["ok","a\\ud800b"]}]'), False),
    ("surrogate pair", *_append('[{"e":"\\ud83d\\ude00"}]'), True),
    ("duplicate keys in an item", *_append('[{"a":1,"a":2}]'), True),
    ("unicode text", *_append('[{"t":"caf\u00e9 \u2603 \U0001f600"}]'), True),
    ("item too large", *_append('[{"t":"' + "x" * (256 * 1024 + 1) + '"}]'), True),
    ("floats", *_append('[{"f":[0.1,-0.0,1e-300,1.7976931348623157e308,5e-324]}]'), True),
    ("item with whitespace and escapes", *_append('[ { "t" : "caf\\u00e9 \\/ \\n" , "f" : 1.50 } ]'), True),
    ("not an object, and a bad id", *_append('[{"a":1},5]', cid="bad id!"), True),
    ("too deep, and a bad id", *_append(f"[{nested(MAX_PAYLOAD_DEPTH + 1)}]", cid="short"), True),
    ("non-finite, and a bad id", *_append('[{"a":1e400}]', cid="short"), False),
    ("non-finite after a non-object", *_append('[5,{"a":1e400}]'), False),
    ("251 items, one not an object", *_append("[" + ",".join(["{}"] * MAX_BATCH_ITEMS + ["5"]) + "]"), True),
    ("recall default", "recall_memory", f'{{"conversation_id":"{CID}"}}', True),
    ("recall count 0", "recall_memory", f'{{"conversation_id":"{CID}","count":0}}', True),
    ("recall count 1000", "recall_memory", f'{{"conversation_id":"{CID}","count":1000}}', True),
    ("recall count 1001", "recall_memory", f'{{"conversation_id":"{CID}","count":1001}}', True),
    ("recall count -1", "recall_memory", f'{{"conversation_id":"{CID}","count":-1}}', True),
    ("recall count 5.0", "recall_memory", f'{{"conversation_id":"{CID}","count":5.0}}', True),
    ("recall count 5.5", "recall_memory", f'{{"conversation_id":"{CID}","count":5.5}}', True),
    ("recall count a string", "recall_memory", f'{{"conversation_id":"{CID}","count":"5"}}', True),
    ("recall count true", "recall_memory", f'{{"conversation_id":"{CID}","count":true}}', True),
    ("recall count null", "recall_memory", f'{{"conversation_id":"{CID}","count":null}}', True),
    ("recall count huge", "recall_memory", f'{{"conversation_id":"{CID}","count":{10**30}}}', True),
    ("recall count 1e3", "recall_memory", f'{{"conversation_id":"{CID}","count":1e3}}', True),
    ("recall unknown conversation", "recall_memory", '{"conversation_id":"conv-never-seen"}', True),
    ("replay ok", "replay_memory", f'{{"conversation_id":"{CID}","offset":1,"limit":2}}', True),
    ("replay limit missing", "replay_memory", f'{{"conversation_id":"{CID}"}}', True),
    ("replay offset -1", "replay_memory", f'{{"conversation_id":"{CID}","offset":-1,"limit":2}}', True),
    (
        "replay offset huge",
        "replay_memory",
        f'{{"conversation_id":"{CID}","offset":{2**70},"limit":2}}',
        True,
    ),
    ("replay limit 1001", "replay_memory", f'{{"conversation_id":"{CID}","limit":1001}}', True),
    ("list default", "list_conversations", "{}", True),
    ("list limit 1", "list_conversations", '{"limit":1}', True),
    ("list cursor null", "list_conversations", '{"cursor":null}', True),
    ("list cursor number", "list_conversations", '{"cursor":5}', True),
    ("list cursor garbage", "list_conversations", '{"cursor":"not-a-cursor"}', True),
    ("list limit -5", "list_conversations", '{"limit":-5}', True),
    ("arguments an array", "append_memory", "[]", False),
    ("arguments a string", "append_memory", '"x"', False),
    ("arguments null", "append_memory", "null", False),
    ("unknown tool", "nope", "{}", False),
]


@pytest.mark.parametrize(
    ("case", "tool", "arguments", "lane"), ARGUMENT_CASES, ids=[c[0] for c in ARGUMENT_CASES]
)
def test_lane_and_sdk_path_agree_on_every_argument(pair, case, tool, arguments, lane):
    got, expected, served = pair.both(call_body(tool, arguments), headers(tool))
    assert got == expected
    assert served is lane


@pytest.mark.parametrize(
    ("rid", "lane"),
    [
        ("0", True),
        ("-1", True),
        (str(2**70), True),
        ('""', True),
        ('"abc"', True),
        ('"\\u00e9"', True),
        ("1.5", False),
        ("1.0", False),
        ("true", False),
        ("null", False),
        ("[1]", False),
        ("{}", False),
    ],
)
def test_lane_and_sdk_path_agree_on_request_ids(pair, rid, lane):
    got, expected, served = pair.both(
        call_body("recall_memory", f'{{"conversation_id":"{CID}"}}', rid=rid), headers("recall_memory")
    )
    assert got == expected
    assert served is lane


_OK_ARGS = f'{{"conversation_id":"{CID}","count":2}}'


def _meta(**changes: Any) -> str:
    meta = dict(META)
    for key, value in changes.items():
        if value is None:
            meta.pop(key, None)
        else:
            meta[key] = value
    return json.dumps(meta)


_PV = "io.modelcontextprotocol/protocolVersion"
_INFO = "io.modelcontextprotocol/clientInfo"
_CAPS = "io.modelcontextprotocol/clientCapabilities"
_RECALL = call_body("recall_memory", _OK_ARGS)

# (case, body, headers, the lane takes it): what the lane does not understand goes to the SDK, and gets the
# SDK's answer; the few unusual-looking requests it does take get the same answer too.
ENVELOPE_CASES: list[tuple[str, bytes, Any, bool]] = [
    ("plain", _RECALL, headers("recall_memory"), True),
    (
        "unknown _meta member",
        call_body("recall_memory", _OK_ARGS, meta=_meta(x=1)),
        headers("recall_memory"),
        False,
    ),
    (
        "progress token",
        call_body("recall_memory", _OK_ARGS, meta=_meta(progressToken=7)),
        headers("recall_memory"),
        False,
    ),
    (
        "capabilities",
        call_body("recall_memory", _OK_ARGS, meta=_meta(**{_CAPS: {"roots": {}}})),
        headers("recall_memory"),
        False,
    ),
    (
        "client info title",
        call_body(
            "recall_memory", _OK_ARGS, meta=_meta(**{_INFO: {"name": "a", "version": "1", "title": "t"}})
        ),
        headers("recall_memory"),
        False,
    ),
    (
        "client info null",
        call_body("recall_memory", _OK_ARGS, meta=_meta(**{_INFO: 1}).replace("1}", "null}")),
        headers("recall_memory"),
        False,
    ),
    (
        "no client info",
        call_body("recall_memory", _OK_ARGS, meta=_meta(**{_INFO: None})),
        headers("recall_memory"),
        True,
    ),
    (
        "no capabilities",
        call_body("recall_memory", _OK_ARGS, meta=_meta(**{_CAPS: None})),
        headers("recall_memory"),
        False,
    ),
    (
        "no _meta version",
        call_body("recall_memory", _OK_ARGS, meta=_meta(**{_PV: None})),
        headers("recall_memory"),
        False,
    ),
    (
        "_meta version differs",
        call_body("recall_memory", _OK_ARGS, meta=_meta(**{_PV: "2026-01-01"})),
        headers("recall_memory"),
        False,
    ),
    ("batch", b"[" + _RECALL + b"]", headers("recall_memory"), False),
    (
        "notification",
        b'{"jsonrpc":"2.0","method":"notifications/cancelled","params":{"requestId":1}}',
        headers("recall_memory"),
        False,
    ),
    (
        "initialize",
        b'{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":"2026-07-28","capabilities":{},"clientInfo":{"name":"a","version":"1"}}}',
        headers("recall_memory", mcp_method="initialize"),
        False,
    ),
    (
        "tools/list with a cursor",
        json.dumps(
            {"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": META, "cursor": "x"}}
        ).encode(),
        {k: v for k, v in headers(mcp_method="tools/list").items() if k != "mcp-name"},
        False,
    ),
    (
        "tools/list with a name header",
        json.dumps({"jsonrpc": "2.0", "id": 3, "method": "tools/list", "params": {"_meta": META}}).encode(),
        headers(mcp_method="tools/list"),
        False,
    ),
    ("SSE-only accept", _RECALL, headers("recall_memory", accept="text/event-stream"), False),
    ("empty accept", _RECALL, headers("recall_memory", accept=""), False),
    ("accept */*", _RECALL, headers("recall_memory", accept="*/*"), True),
    ("accept json only", _RECALL, headers("recall_memory", accept="application/json"), True),
    ("text/plain body", _RECALL, headers("recall_memory", content_type="text/plain"), False),
    (
        "json with charset",
        _RECALL,
        headers("recall_memory", content_type="application/json; charset=utf-8"),
        True,
    ),
    ("name header differs", _RECALL, headers("append_memory"), False),
    (
        "no name header",
        _RECALL,
        {k: v for k, v in headers("recall_memory").items() if k != "mcp-name"},
        False,
    ),
    (
        "base64 name header",
        _RECALL,
        headers("recall_memory", mcp_name="=?base64?cmVjYWxsX21lbW9yeQ==?="),
        False,
    ),
    ("method header differs", _RECALL, headers("recall_memory", mcp_method="tools/list"), False),
    ("version header unknown", _RECALL, headers("recall_memory", mcp_protocol_version="2030-01-01"), False),
    ("version header old era", _RECALL, headers("recall_memory", mcp_protocol_version="2025-11-25"), False),
    (
        "no version header",
        _RECALL,
        {k: v for k, v in headers("recall_memory").items() if k != "mcp-protocol-version"},
        False,
    ),
    (
        "duplicated method header",
        _RECALL,
        [*headers("recall_memory").items(), ("mcp-method", "tools/call")],
        False,
    ),
    ("session header", _RECALL, headers("recall_memory", mcp_session_id="0123456789abcdef"), False),
    ("Mcp-Param header", _RECALL, headers("recall_memory", mcp_param_count="2"), False),
    ("foreign host", _RECALL, headers("recall_memory", host="evil.example"), False),
    ("foreign origin", _RECALL, headers("recall_memory", origin="http://evil.example"), False),
    ("loopback origin", _RECALL, headers("recall_memory", origin="http://localhost:3000"), True),
    ("envelope extra member", _RECALL[:-1] + b',"x":1}', headers("recall_memory"), False),
    (
        "params extra member",
        _RECALL.replace(b'"params":{', b'"params":{"task":{},'),
        headers("recall_memory"),
        False,
    ),
    ("jsonrpc 1.0", _RECALL.replace(b'"2.0"', b'"1.0"'), headers("recall_memory"), False),
    ("not JSON", b'{"jsonrpc":', headers("recall_memory"), False),
    (
        "invalid UTF-8 in an item",
        call_body(*_append('[{"t":"\u00ff"}]')).replace("\u00ff".encode(), b"\xff"),
        headers(),
        False,
    ),
    (
        "invalid UTF-8 in the id",
        call_body(*_append(f"[{ITEM}]", cid="conv-\u00ff-12345")).replace("\u00ff".encode(), b"\xff"),
        headers(),
        False,
    ),
    ("empty body", b"", headers("recall_memory"), False),
    (
        "no credentials",
        _RECALL,
        {k: v for k, v in headers("recall_memory").items() if k != "authorization"},
        False,
    ),
    (
        "wrong password",
        _RECALL,
        headers("recall_memory", authorization="Basic " + base64.b64encode(b"alpha:x").decode()),
        False,
    ),
]


@pytest.mark.parametrize(("case", "body", "hdrs", "lane"), ENVELOPE_CASES, ids=[c[0] for c in ENVELOPE_CASES])
def test_what_the_lane_does_not_understand_is_served_by_the_sdk(pair, case, body, hdrs, lane):
    got, expected, served = pair.both(body, hdrs)
    assert got == expected
    assert served is lane


def test_old_era_sessions_are_the_sdks(pair):
    """A 2025-11-25 session (initialize, then calls carrying Mcp-Session-Id) never takes the lane."""
    answers = []
    for client in (pair.lane, pair.sdk):
        hdrs = headers("append_memory", mcp_protocol_version="2025-11-25")
        for key in ("mcp-method", "mcp-name"):
            hdrs.pop(key)
        r = client.post("/mcp", json=initialize_body(0), headers=hdrs)
        assert r.status_code == 200, r.text
        hdrs["mcp-session-id"] = r.headers["mcp-session-id"]
        assert (
            client.post(
                "/mcp", json={"jsonrpc": "2.0", "method": "notifications/initialized"}, headers=hdrs
            ).status_code
            == 202
        )
        before = pair.lane_app.served
        body = {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "tools/call",
            "params": {"name": "recall_memory", "arguments": {"conversation_id": CID, "count": 1}},
        }
        answers.append(_answer(client.post("/mcp", json=body, headers=hdrs)))
        assert pair.lane_app.served == before
    assert answers[0] == answers[1]
    assert answers[0][2]["result"]["isError"] is False


class _Calls(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.records: list[dict[str, Any]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = dict(getattr(record, "access", None) or {})
        fields.pop("latency_ms", None)
        self.records.append(fields)


def test_one_access_log_line_per_call_alike_on_both_paths(pair):
    access = logging.getLogger(ACCESS_LOGGER)
    level = access.level
    seen = []
    for client in (pair.lane, pair.sdk):
        calls = _Calls()
        access.addHandler(calls)
        access.setLevel(logging.DEBUG)
        try:
            for tool, arguments in [
                _append(f"[{ITEM},{ITEM},{ITEM}]"),
                _append("[]"),
                ("recall_memory", f'{{"conversation_id":"{CID}","count":2}}'),
                ("recall_memory", '{"conversation_id":5}'),
            ]:
                assert (
                    client.post("/mcp", content=call_body(tool, arguments), headers=headers(tool)).status_code
                    == 200
                )
        finally:
            access.removeHandler(calls)
            access.setLevel(level)
        seen.append(calls.records)
    assert len(seen[0]) == 4 and seen[0] == seen[1]
    assert [r["code"] for r in seen[0]] == ["ok", "EmptyBatch", "ok", "InvalidConversationId"]


def _stored_items(data_dir: str, cid: str) -> list[bytes]:
    """Every item's stored bytes, frame by frame, from the conversation's log."""
    with open(layout.conversation_paths(data_dir, SITE, cid).log, "rb") as f:
        buf = f.read()
    items, pos = [], 0
    while isinstance(frame := decode_frame(buf, pos), Frame):
        items.extend(frame.items)
        pos += frame.size
    return items


# Item texts as clients write them: the lane passes each text to the engine (``append_json``), which stores
# what the SDK path stores for the item the SDK decoded (tests/contract/test_json_items.py: every backend).
RAW_ITEMS = [
    ITEM,
    '{ "t" : "caf\\u00e9 \\/ \\n \\u0001" ,\n "k\\u00e9y" : [ 1 , 2 ] }',
    '{"f":[0.1,1.50,1E5,100.0,1e21,-0.0,5e-324],"i":[-0,18446744073709551616]}',
    '{"a":1,"a":{"b":1,"b":2}}',
    '{"e":"\\ud83d\\ude00","t":"caf\u00e9 \u2603"}',
    nested(MAX_PAYLOAD_DEPTH),
    '{"n":' + "9" * MAX_INT_DIGITS + ',"s":"' + "[" * 200 + '"}',
]


def test_the_lane_stores_exactly_what_the_sdk_path_stores(pair, monkeypatch):
    calls = {"append": 0, "append_json": 0}
    for name in calls:
        original = getattr(Store, name)

        def spy(self: Store, *args: Any, _name: str = name, _original: Any = original) -> Any:
            calls[_name] += 1
            return _original(self, *args)

        monkeypatch.setattr(Store, name, spy)
    for n, text in enumerate(RAW_ITEMS):
        cid = f"conv-raw-bytes-{n:03d}"
        got, expected, served = pair.both(call_body(*_append(f"[{text},{text}]", cid=cid)), headers())
        assert got == expected and served
        assert got[2]["result"]["isError"] is False
        lane_items, sdk_items = (_stored_items(d, cid) for d in pair.dirs)
        assert len(lane_items) == 2 and lane_items == sdk_items
    assert calls == {"append": len(RAW_ITEMS), "append_json": len(RAW_ITEMS)}  # one each: lane, SDK path


def _list_body(rid: str, meta: str = META_TEXT) -> bytes:
    return f'{{"jsonrpc":"2.0","id":{rid},"method":"tools/list","params":{{"_meta":{meta}}}}}'.encode()


def test_tools_list_is_the_sdks_answer_byte_for_byte():
    """The first plain tools/list goes to the SDK (its answer is kept: server.mcp.lane_listing), every later
    one is the lane's, and each answer is the SDK app's byte for byte, whatever the id."""
    hdrs = {k: v for k, v in headers(mcp_method="tools/list").items() if k != "mcp-name"}
    ids = ["1", "2", "0", "-7", str(2**70), '"abc"', '"a\\"b/\\u0001"', '""', '"\\u00e9"', "1.5", "null"]
    served_by_lane = ["2", "0", "-7", str(2**70), '"abc"', '"a\\"b/\\u0001"', '""']
    with _pair() as made:
        for rid in ids:
            before = made.lane_app.served
            a = made.lane.post("/mcp", content=_list_body(rid), headers=hdrs)
            b = made.sdk.post("/mcp", content=_list_body(rid), headers=hdrs)
            assert (made.lane_app.served > before) is (rid in served_by_lane), rid
            assert (a.status_code, a.headers.get("content-type"), a.content) == (
                b.status_code,
                b.headers.get("content-type"),
                b.content,
            ), rid
            if rid in served_by_lane:
                listing = a
        assert listing.status_code == 200 and [
            t["name"] for t in json.loads(listing.content)["result"]["tools"]
        ] == [
            "append_memory",
            "recall_memory",
            "replay_memory",
            "list_conversations",
        ]
        # A request the lane does not take is still the SDK's after the answer is kept.
        before = made.lane_app.served
        odd = made.lane.post("/mcp", content=_list_body("5", meta=_meta(x=1)), headers=hdrs)
        assert made.lane_app.served == before
        assert (
            odd.content
            == made.sdk.post("/mcp", content=_list_body("5", meta=_meta(x=1)), headers=hdrs).content
        )
