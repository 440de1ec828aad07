"""P13: the browser's conversation page against the MCP read of the same items, same server, same run.

``logstore serve`` on a fresh data dir holding one conversation of 100 items of 2 KB each (chat-shaped:
a text, a role, a tool call with arguments, a few metadata fields). One keep-alive HTTP/1.1 connection
per side, calls one after another: ``GET /ui/c/<id>?n=100`` (the whole page: two store reads, the
highlighted HTML of every payload, the template) against a stateless 2026-07-28 ``tools/call`` of
``replay_memory`` (offset 0, limit 100) through ``/mcp``. Each round times ``calls`` of each, in
alternating order; the row is the median latency and the per-round ratio page / replay (goal <= 2x).
"""

from __future__ import annotations

import base64
import http.client
import json
import os
import secrets
import time
from typing import Any

import msgspec

from .config import Profile
from .mcp_calls import running_server
from .stats import Goal, Row, fig, paired_ratio

__all__ = ["measure_ui_page", "chat_item"]

SITE, CONVERSATION = "bench", "bench-ui-conversation"
ITEMS, ITEM_SIZE = 100, 2048
_encode = msgspec.json.Encoder().encode


def chat_item(n: int, size: int = ITEM_SIZE) -> dict[str, Any]:
    """A chat-shaped JSON object whose compact encoding is exactly ``size`` bytes."""
    item: dict[str, Any] = {
        "role": "assistant" if n % 2 else "user",
        "n": n,
        "text": "",
        "tool_call": {"name": "search", "arguments": {"query": f"question {n}", "limit": 10, "exact": False}},
        "meta": {"model": "m-1", "tokens": [n, 2 * n, 3 * n], "latency_ms": 12.5, "cached": None},
    }
    pad = size - len(_encode(item))
    item["text"] = ("lorem ipsum dolor sit amet " * (pad // 27 + 1))[:pad]
    return item


def _mcp_body(n: int) -> bytes:
    return json.dumps(
        {
            "jsonrpc": "2.0",
            "id": n,
            "method": "tools/call",
            "params": {
                "name": "replay_memory",
                "arguments": {"conversation_id": CONVERSATION, "offset": 0, "limit": ITEMS},
                "_meta": {
                    "io.modelcontextprotocol/protocolVersion": "2026-07-28",
                    "io.modelcontextprotocol/clientInfo": {"name": "bench", "version": "0"},
                    "io.modelcontextprotocol/clientCapabilities": {},
                },
            },
        }
    ).encode()


class _Client:
    def __init__(self, port: int, password: str) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        self.auth = "Basic " + base64.b64encode(f"{SITE}:{password}".encode()).decode()
        self.port = port

    def page(self, raw: bool = False) -> int:
        """The page in the transcript view (the default; these items are chat-shaped) or, with the
        cookie ui.js sets for it, the raw JSON view."""
        headers = {"Authorization": self.auth}
        if raw:
            headers["Cookie"] = "logstore_view=raw"
        self.conn.request("GET", f"/ui/c/{CONVERSATION}?n={ITEMS}", headers=headers)
        return self._read(b'id="seq-99"')

    def replay(self, n: int) -> int:
        headers = {
            "Authorization": self.auth,
            "Accept": "application/json, text/event-stream",
            "Content-Type": "application/json",
            "MCP-Protocol-Version": "2026-07-28",
            "Mcp-Method": "tools/call",
            "Mcp-Name": "replay_memory",
        }
        self.conn.request("POST", "/mcp", body=_mcp_body(n), headers=headers)
        return self._read(b'"seq":99')

    def _read(self, must_hold: bytes) -> int:
        response = self.conn.getresponse()
        body = response.read()
        if response.status != 200 or must_hold not in body:
            raise RuntimeError(f"HTTP {response.status}: {body[:300]!r}")
        return len(body)


def measure_ui_page(profile: Profile, directory: str) -> list[Row]:
    from logstore.file.credentials import CredentialsFile
    from logstore.file.store import Store

    data_dir = os.path.join(directory, "ui")
    password = secrets.token_urlsafe(16)
    CredentialsFile(data_dir).add(SITE, password)
    with Store(data_dir) as store:
        store.append(SITE, CONVERSATION, [chat_item(n) for n in range(ITEMS)])
    calls = max(5, profile.read_calls // 6)
    pages: list[float] = []
    raws: list[float] = []
    replays: list[float] = []
    sizes: dict[str, int] = {}
    cmd = ["tools.cli", "serve", "--data-dir", data_dir, "--log-level", "warning", "--no-access-log"]
    with running_server(cmd) as (url, _pid):
        client = _Client(int(url.rsplit(":", 1)[1].split("/")[0]), password)
        sizes["page"], sizes["replay"] = client.page(), client.replay(0)  # warm: auth cache, handles
        sizes["raw"] = client.page(raw=True)
        sides = {"page": pages, "raw": raws, "replay": replays}
        for r in range(profile.runs):
            order = ("page", "raw", "replay") if r % 2 == 0 else ("replay", "raw", "page")
            for kind in order:
                t0 = time.perf_counter()
                for k in range(calls):
                    client.replay(k) if kind == "replay" else client.page(raw=kind == "raw")
                sides[kind].append(1000 * (time.perf_counter() - t0) / calls)
        client.conn.close()
    return [
        Row(
            "P13",
            f"browser page of {ITEMS} items x 2 KB (GET /ui/c/ID?n={ITEMS}) vs replay_memory of the same "
            "items through /mcp",
            "ms",
            value=fig(pages),
            baseline=fig(replays),
            baseline_name="replay_memory",
            ratio=paired_ratio(pages, replays),
            goal=Goal("<=", 2.0, "<= 2x replay_memory"),
            note=(
                f"transcript view (the default); the raw JSON view: {fig(raws).median:.3g} ms, "
                f"{paired_ratio(raws, replays).median:.3g}x replay_memory; one keep-alive connection, "
                f"{calls} calls per side per round, alternating; page {sizes['page'] / 1024:.0f} KiB "
                f"of HTML (raw {sizes['raw'] / 1024:.0f} KiB), replay "
                f"{sizes['replay'] / 1024:.0f} KiB of JSON"
            ),
        )
    ]
