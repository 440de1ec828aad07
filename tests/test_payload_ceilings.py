"""The depth ceilings that ``MAX_PAYLOAD_DEPTH`` is chosen under, re-measured with the SDK's own code.

Each ceiling is the deepest payload (item object = level 1) that one step on the way between a client and
the store handles, found by bisection in-process, calling the very functions the SDK calls (the same
numbers came out over real HTTP: see logstore/limits.py). If an SDK upgrade lowers one below the limit,
this fails before a user finds an item they can append but never read. The TypeScript client's ceiling
(>100,000) is not re-measured here; tests/test_server_ts_client.py round-trips an item at the limit.
"""

from __future__ import annotations

import json
from collections.abc import Callable

import mcp_types as types
import pydantic_core
import pytest
from mcp.client.streamable_http import jsonrpc_message_adapter

from logstore.core.limits import MAX_PAYLOAD_DEPTH
from tests.test_batch import nested_list


def nested_text(depth: int) -> str:
    return '{"d":' + "[" * (depth - 1) + "]" * (depth - 1) + "}"


def ceiling(works: Callable[[int], object], *, high: int = 3000) -> int:
    """The largest depth in [2, high] for which ``works`` does not raise (each step fails beyond its own)."""
    low = 2
    while low < high:
        mid = (low + high + 1) // 2
        try:
            works(mid)
        except (ValueError, RecursionError):  # pydantic's ValidationError is a ValueError
            high = mid - 1
        else:
            low = mid
    return low


def server_serialises_result(depth: int) -> None:
    """mcp.server.runner._dump_result on a recall result holding the payload."""
    item = {"seq": 0, "recorded_at": "2026-01-01T00:00:00.000000Z", "payload": nested_list(depth)}
    result = types.CallToolResult(
        content=[types.TextContent(type="text", text="-")], structured_content={"items": [item]}
    )
    result.model_dump(by_alias=True, mode="json", exclude_none=True)


def client_parses_response(depth: int) -> None:
    """What mcp.client.streamable_http does with a JSON response body."""
    body = (
        '{"jsonrpc":"2.0","id":1,"result":{"content":[{"type":"text","text":"-"}],"structuredContent":'
        f'{{"items":[{{"seq":0,"recorded_at":"-","payload":{nested_text(depth)}}}]}}}}}}'
    )
    jsonrpc_message_adapter.validate_json(body.encode(), by_name=False)


def request(depth: int) -> bytes:
    return (
        '{"jsonrpc":"2.0","id":1,"method":"tools/call","params":{"name":"append_memory","arguments":'
        f'{{"conversation_id":"conv-0001","items":[{nested_text(depth)}]}}}}}}'
    ).encode()


def legacy_server_parses_request(depth: int) -> None:
    """mcp.server.streamable_http (the legacy era) parses bodies with pydantic_core.from_json."""
    pydantic_core.from_json(request(depth))


def modern_server_parses_request(depth: int) -> None:
    """mcp.server._streamable_http_modern parses bodies with json.loads."""
    json.loads(request(depth))


def client_serialises_request(depth: int) -> None:
    arguments = {"conversation_id": "conv-0001", "items": [nested_list(depth)]}
    call = types.CallToolRequest(
        params=types.CallToolRequestParams(name="append_memory", arguments=arguments)
    )
    call.model_dump(by_alias=True, mode="json", exclude_unset=True)


@pytest.mark.parametrize(
    ("step", "measured"),
    [
        (client_parses_response, 196),
        (legacy_server_parses_request, 197),
        (server_serialises_result, 252),
        (client_serialises_request, 254),
        (modern_server_parses_request, None),  # ~960-990: the recursion limit less the stack in use
    ],
)
def test_every_step_handles_the_limit_with_margin(step, measured):
    found = ceiling(step)
    # The lowest ceiling (196) less the limit (128): levels an SDK envelope could grow by unnoticed.
    assert found >= MAX_PAYLOAD_DEPTH + 64, (step.__name__, found)
    if measured is not None:  # the figures documented in logstore/limits.py are still the true ones
        assert found == measured, (step.__name__, found)
