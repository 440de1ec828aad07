"""End to end over real HTTP, both protocol eras: the payload rules (depth, numbers, strings) and reads of
stored items that break them.

Payloads that matter here cannot all be sent through the Python SDK client: it turns NaN and +-Infinity
into ``null`` before sending and cannot serialise a request nested deeper than 254 levels. Those cases go
over the wire as raw JSON-RPC text (``RawClient``), exactly as a hostile or non-Python client would send
them; the SDK client reads results back where it can, proving they parse.
"""

from __future__ import annotations

import json
import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx2
import pytest

from logstore import Store
from logstore.core.limits import MAX_INT_DIGITS, MAX_PAYLOAD_DEPTH
from logstore.file.credentials import CredentialsFile
from tests.server_support import MODES, call, connect, error_of, rpc_headers, serve
from tests.test_batch import nested_dict, nested_list, store_unchecked

pytestmark = pytest.mark.anyio

SITE, PASSWORD = "alpha", "alpha-password"
OLD_DEEP = "conv-old-deep-item"  # holds {"n": 0}, a 300-deep item (seq 1), {"n": 2}: written before the rules


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("payload-rules")
    CredentialsFile(str(data_dir)).add(SITE, PASSWORD)
    with Store(data_dir) as store:
        store.append(SITE, OLD_DEEP, [{"n": 0}])
        store_unchecked(store, SITE, OLD_DEEP, [nested_list(300)])
        store.append(SITE, OLD_DEEP, [{"n": 2}])
    with serve(data_dir) as running:
        yield running


@pytest.fixture(params=MODES)
def mode(request):
    return request.param


def new_id() -> str:
    return f"conv-{uuid.uuid4().hex}"


def nested_text(depth: int) -> str:
    """The JSON text of ``nested_list(depth)``, built as text (a Python client could not send it)."""
    return '{"d":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


class RawClient:
    """JSON-RPC ``tools/call`` with arguments given as JSON *text*, in either protocol era."""

    _META = {
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientInfo": {"name": "raw", "version": "0"},
        "io.modelcontextprotocol/clientCapabilities": {},
    }

    def __init__(self, http: httpx2.AsyncClient, url: str, mode: str) -> None:
        self.http, self.url, self.mode, self.headers, self.next_id = http, url, mode, rpc_headers(), 1

    async def open(self) -> None:
        if self.mode == "legacy":
            init = {
                "jsonrpc": "2.0",
                "id": 0,
                "method": "initialize",
                "params": {
                    "protocolVersion": "2025-11-25",
                    "capabilities": {},
                    "clientInfo": {"name": "raw", "version": "0"},
                },
            }
            r = await self.http.post(self.url, json=init, headers=self.headers)
            self.headers |= {
                "mcp-session-id": r.headers["mcp-session-id"],
                "mcp-protocol-version": "2025-11-25",
            }
            initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
            await self.http.post(self.url, json=initialized, headers=self.headers)
        else:
            self.headers |= {"mcp-protocol-version": "2026-07-28", "mcp-method": "tools/call"}

    async def call(self, tool: str, arguments: str) -> dict[str, Any]:
        """The JSON-RPC response message (result or error)."""
        self.next_id += 1
        meta = "" if self.mode == "legacy" else ',"_meta":' + json.dumps(self._META)
        body = (
            f'{{"jsonrpc":"2.0","id":{self.next_id},"method":"tools/call",'
            f'"params":{{"name":"{tool}","arguments":{arguments}{meta}}}}}'
        )
        headers = self.headers | ({} if self.mode == "legacy" else {"mcp-name": tool})
        r = await self.http.post(self.url, content=body.encode(), headers=headers)
        return json.loads(r.text)

    async def append(self, cid: str, items_text: str) -> dict[str, Any]:
        return await self.call("append_memory", f'{{"conversation_id":"{cid}","items":{items_text}}}')

    async def recall(self, cid: str) -> dict[str, Any]:
        return await self.call("recall_memory", f'{{"conversation_id":"{cid}","count":1000}}')


@asynccontextmanager
async def raw_client(server, mode: str) -> AsyncIterator[RawClient]:
    async with httpx2.AsyncClient(auth=httpx2.BasicAuth(SITE, PASSWORD), timeout=30) as http:
        raw = RawClient(http, server.url, mode)
        await raw.open()
        yield raw


def tool_error(message: dict[str, Any]) -> dict[str, Any]:
    """The structured error of a tool result with isError (never a JSON-RPC error)."""
    assert "error" not in message, message
    result = message["result"]
    assert result["isError"] is True and "structuredContent" not in result
    return error_of(json.loads(result["content"][0]["text"]))


def payloads(message: dict[str, Any]) -> list[Any]:
    result = message["result"]
    assert not result.get("isError"), result
    return [item["payload"] for item in json.loads(result["content"][0]["text"])["items"]]


async def test_depth_at_the_limit_round_trips_through_the_sdk_client(server, mode):
    cid = new_id()
    async with connect(server.url, SITE, PASSWORD, mode) as c:
        items = [nested_list(MAX_PAYLOAD_DEPTH), nested_dict(MAX_PAYLOAD_DEPTH)]
        is_error, ack = await call(c, "append_memory", {"conversation_id": cid, "items": items})
        assert not is_error and ack == {"first_seq": 0, "last_seq": 1}
        is_error, out = await call(c, "recall_memory", {"conversation_id": cid})
        assert not is_error and [i["payload"] for i in out["items"]] == items
        # One level more: rejected, naming the item and where the limit is passed.
        over = [{"fine": 1}, nested_dict(MAX_PAYLOAD_DEPTH + 1)]
        is_error, out = await call(c, "append_memory", {"conversation_id": cid, "items": over})
        err = error_of(out)
        assert is_error and (err["code"], err["retryable"], err["field"], err["index"]) == (
            "InvalidArgument",
            False,
            "items",
            1,
        )
        assert err["path"] == "$.d" + ".k" * (MAX_PAYLOAD_DEPTH - 1)
        assert f"deeper than {MAX_PAYLOAD_DEPTH} levels" in err["message"]


@pytest.mark.parametrize("depth", [MAX_PAYLOAD_DEPTH + 1, 197, 300, 800])
async def test_deeper_payloads_are_rejected_in_both_eras(server, mode, depth):
    """Before the limit the 2026-07-28 era acknowledged depths up to 965 that no client could read back."""
    cid = new_id()
    async with raw_client(server, mode) as raw:
        out = await raw.append(cid, f"[{nested_text(depth)}]")
        if mode == "legacy" and depth > 197:
            # The legacy transport's parser refuses the request itself (pydantic-core: 200 levels in all).
            assert out["error"]["code"] == -32700
        else:
            err = tool_error(out)
            assert (err["code"], err["index"]) == ("InvalidArgument", 0)
            assert err["path"] == "$.d" + "[0]" * (MAX_PAYLOAD_DEPTH - 1)
        assert payloads(await raw.recall(cid)) == []


@pytest.mark.parametrize("literal", ["1e400", "-1e400", "1e309", "NaN", "Infinity", "-Infinity"])
async def test_non_finite_numbers_are_rejected_not_stored_as_null(server, mode, literal):
    cid = new_id()
    async with raw_client(server, mode) as raw:
        out = await raw.append(cid, f'[{{"ok":1}},{{"a":[1,{{"x":{literal}}}]}}]')
        err = tool_error(out)
        assert (err["code"], err["retryable"], err["index"], err["path"]) == (
            "InvalidArgument",
            False,
            1,
            "$.a[1].x",
        )
        assert "non-finite number" in err["message"]
        assert payloads(await raw.recall(cid)) == []


async def test_integers_beyond_64_bits_round_trip_exactly(server, mode):
    values = [2**64, -(2**64) - 1, 2**70, -(2**200), 10**MAX_INT_DIGITS - 1, -(10**MAX_INT_DIGITS - 1)]
    cid = new_id()
    async with raw_client(server, mode) as raw:
        literals = ",".join(str(v) for v in values)
        out = await raw.append(cid, f'[{{"v":[{literals}]}}]')
        assert out["result"]["structuredContent"] == {"first_seq": 0, "last_seq": 0}
        # The wire text holds the same digits (json.loads keeps Python ints exact).
        assert payloads(await raw.recall(cid)) == [{"v": values}]
        # -(10**4299) has 4300 digits: the parsers take it, the payload rule does not (it could never be
        # read back); one digit more and the transport's parser refuses the request (-32700).
        err = tool_error(await raw.append(cid, f'[{{"n":-1{"0" * MAX_INT_DIGITS}}}]'))
        assert (err["code"], err["path"]) == ("InvalidArgument", "$.n")
        assert (await raw.append(cid, f'[{{"n":1{"0" * (MAX_INT_DIGITS + 1)}}}]'))["error"]["code"] == -32700
        assert payloads(await raw.recall(cid)) == [{"v": values}]
    async with connect(server.url, SITE, PASSWORD, mode) as c:  # the SDK client parses them exactly too
        is_error, out = await call(c, "recall_memory", {"conversation_id": cid})
        assert not is_error and out["items"][0]["payload"] == {"v": values}


async def test_lone_surrogates_are_rejected(server, mode):
    cid = new_id()
    async with raw_client(server, mode) as raw:
        out = await raw.append(cid, '[{"t":["ok","a\\ud800b"]}]')
        if mode == "legacy":
            assert out["error"]["code"] == -32700  # pydantic-core refuses lone surrogates while parsing
        else:
            err = tool_error(out)  # the stdlib parser keeps them; the payload rule does not
            assert (err["code"], err["index"], err["path"]) == ("InvalidArgument", 0, "$.t[1]")
        out = await raw.append(cid, '[{"e":"\\ud83d\\ude00"}]')  # a valid pair: one character
        assert payloads(await raw.recall(cid)) == [{"e": "\U0001f600"}]


async def test_old_too_deep_item_reads_as_unreadable_naming_its_seq(server, mode):
    """Written before the depth limit (the fixture): every read covering seq 1 is a structured tool error,
    never a JSON-RPC internal error or exception text; reads around it work."""
    async with connect(server.url, SITE, PASSWORD, mode) as c:
        for tool, args in [
            ("recall_memory", {"conversation_id": OLD_DEEP}),
            ("replay_memory", {"conversation_id": OLD_DEEP, "offset": 0, "limit": 1000}),
            ("replay_memory", {"conversation_id": OLD_DEEP, "offset": 1, "limit": 1}),
        ]:
            is_error, out = await call(c, tool, args)
            err = error_of(out)
            assert is_error and (err["code"], err["seq"], err["reason"], err["retryable"]) == (
                "Unreadable",
                1,
                "TooDeep",
                False,
            )
            assert "from seq 2" in err["message"] and "Traceback" not in err["message"]
        _, out = await call(c, "replay_memory", {"conversation_id": OLD_DEEP, "offset": 0, "limit": 1})
        assert [i["payload"] for i in out["items"]] == [{"n": 0}]
        _, out = await call(c, "replay_memory", {"conversation_id": OLD_DEEP, "offset": 2, "limit": 1000})
        assert [i["payload"] for i in out["items"]] == [{"n": 2}]
    async with raw_client(server, mode) as raw:  # on the wire: a tool result, not JSON-RPC code 0 / -32603
        assert tool_error(await raw.recall(OLD_DEEP))["code"] == "Unreadable"
    assert "Maximum serialization depth" not in server.stdout()
