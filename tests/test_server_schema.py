"""The tools the server lists are the spec's, byte for byte: names, descriptions, input and output schemas.

Two links are checked: spec markdown -> ``server/mcp/tools.json`` (when the spec file is available), and
``server/mcp/tools.json`` -> the raw JSON of a ``tools/list`` response on the wire, in both protocol eras.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import httpx2
import pytest
from mcp import Client
from mcp.client.streamable_http import streamable_http_client

from logstore.file.credentials import CredentialsFile
from server.mcp.spec_tools import TOOL_HINTS, TOOL_NAMES, extract_tools, load_tools, tools_json_text
from tests.server_support import MODES, REPO, serve

pytestmark = pytest.mark.anyio

TOOLS_JSON = REPO / "server" / "mcp" / "tools.json"


def spec_path() -> Path | None:
    candidates = [os.environ.get("LOGSTORE_SPEC"), REPO.parent / "shared" / "spec" / "conversation-memory.md"]
    return next((Path(c) for c in candidates if c and Path(c).is_file()), None)


def reference_tools() -> list[dict]:
    return json.loads(TOOLS_JSON.read_text(encoding="utf-8"))


def test_tools_json_is_exactly_what_the_spec_says():
    path = spec_path()
    if path is None:
        pytest.skip("spec not found: set LOGSTORE_SPEC or check out ../shared/spec/conversation-memory.md")
    extracted = extract_tools(path.read_text(encoding="utf-8"))
    assert extracted == reference_tools()
    # Regenerating gives the same bytes, so the file never drifts from its generator.
    assert tools_json_text(extracted) == TOOLS_JSON.read_text(encoding="utf-8")


def test_reference_is_sane():
    """Guards the extractor itself: a parse that grabbed the wrong paragraph or blob would fail here."""
    tools = {t.name: t for t in load_tools()}
    assert tuple(tools) == TOOL_NAMES
    assert tools["append_memory"].description.startswith(
        "Append a batch of items to a conversation’s durable"
    )
    assert tools["append_memory"].input_schema["properties"]["items"]["maxItems"] == 250
    assert tools["recall_memory"].input_schema["properties"]["count"]["default"] == 50
    assert tools["replay_memory"].input_schema["required"] == ["conversation_id", "limit"]
    assert tools["list_conversations"].output_schema["title"] == "ListConversationsResponse"
    for tool in tools.values():
        assert tool.description.endswith("duplicates from retries are tolerated.")
        assert tool.input_schema["title"].endswith("Request") and tool.output_schema["title"].endswith(
            "Response"
        )


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    data_dir = tmp_path_factory.mktemp("schema")
    CredentialsFile(str(data_dir)).add("alpha", "pw")
    with serve(data_dir) as running:
        yield running


@pytest.mark.parametrize("mode", MODES)
async def test_tools_list_on_the_wire_equals_the_spec(server, mode):
    bodies: list[dict] = []

    async def capture(response: httpx2.Response) -> None:
        await response.aread()
        if response.content and response.headers.get("content-type", "").startswith("application/json"):
            bodies.append(response.json())

    async with httpx2.AsyncClient(
        auth=httpx2.BasicAuth("alpha", "pw"), event_hooks={"response": [capture]}
    ) as http:
        async with Client(streamable_http_client(server.url, http_client=http), mode=mode) as client:
            listed = await client.list_tools()
    wire = [
        b["result"]["tools"] for b in bodies if isinstance(b.get("result"), dict) and "tools" in b["result"]
    ]
    assert wire, "no tools/list response seen"
    # Exactly the four tools; the spec's four fields each, every string and schema identical; plus only
    # the title and annotations of TOOL_HINTS (not in the spec).
    spec_fields = ("name", "description", "inputSchema", "outputSchema")
    assert [{k: t[k] for k in spec_fields} for t in wire[-1]] == reference_tools()
    assert [set(t) - set(spec_fields) for t in wire[-1]] == [{"title", "annotations"}] * 4
    assert [{"title": t["title"], "annotations": t["annotations"]} for t in wire[-1]] == [
        TOOL_HINTS[name] for name in TOOL_NAMES
    ]
    assert [t.name for t in listed.tools] == list(TOOL_NAMES)
    # What a client decides on: the three read tools are read-only; nothing is destructive or open-world.
    hints = {t.name: t.annotations for t in listed.tools}
    assert [n for n, h in hints.items() if h.read_only_hint] == [
        "recall_memory",
        "replay_memory",
        "list_conversations",
    ]
    assert all(h.destructive_hint is False and h.open_world_hint is False for h in hints.values())
    assert {n: h.idempotent_hint for n, h in hints.items()} == {
        "append_memory": False,
        "recall_memory": True,
        "replay_memory": True,
        "list_conversations": True,
    }
    assert all(t.title and t.title == t.annotations.title for t in listed.tools)
