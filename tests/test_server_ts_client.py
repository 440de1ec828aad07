"""A client no one here wrote: the official TypeScript MCP SDK (1.x, from npm) against ``logstore serve``.

Skipped only when ``node`` or ``npm`` is missing. Dependencies are installed once into
``tests/ts_client/node_modules`` (gitignored) from the committed lock file and reused until
``package.json`` or ``package-lock.json`` change, so after the first run this test takes about a second.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess

import pytest
from filelock import FileLock

from logstore.core.limits import MAX_PAYLOAD_DEPTH
from logstore.file.credentials import CredentialsFile
from logstore.postgres.registry import PostgresRegistry
from tests.postgres_support import fresh_url
from tests.server_support import REPO, serve

TS_DIR = REPO / "tests" / "ts_client"
NODE, NPM = shutil.which("node"), shutil.which("npm")

pytestmark = pytest.mark.skipif(
    NODE is None or NPM is None, reason="node and npm are needed for the TypeScript SDK client test"
)


def ensure_installed() -> None:
    manifest = (TS_DIR / "package.json").read_bytes() + (TS_DIR / "package-lock.json").read_bytes()
    stamp = TS_DIR / f".installed-{hashlib.sha256(manifest).hexdigest()[:16]}"
    with FileLock(str(TS_DIR / ".install.lock")):  # concurrent test runs must not install over each other
        if stamp.exists() and (TS_DIR / "node_modules").is_dir():
            return
        for old in TS_DIR.glob(".installed-*"):
            old.unlink()
        subprocess.run(
            [NPM, "ci", "--no-audit", "--no-fund", "--loglevel=error"],
            cwd=TS_DIR,
            check=True,
            capture_output=True,
            timeout=300,
        )
        stamp.touch()


@pytest.mark.parametrize("backend", ["file", "postgres"])
def test_typescript_sdk_calls_all_four_tools(tmp_path, backend, request):
    """The same client, the same assertions, over both backends: the server serves them alike."""
    ensure_installed()
    store = None
    if backend == "postgres":
        store = fresh_url(request.getfixturevalue("postgres_server"))
        PostgresRegistry(store).add("alpha", "alpha pw: with colon")
    else:
        CredentialsFile(str(tmp_path)).add("alpha", "alpha pw: with colon")
    with serve(tmp_path, store=store) as server:
        ran = subprocess.run(
            [NODE, "client.mjs", server.url, "alpha", "alpha pw: with colon", str(MAX_PAYLOAD_DEPTH)],
            cwd=TS_DIR,
            capture_output=True,
            text=True,
            timeout=60,
        )
    assert ran.returncode == 0, ran.stderr
    out = json.loads(ran.stdout)
    reference = json.loads((REPO / "server" / "mcp" / "tools.json").read_text(encoding="utf-8"))

    assert out["protocolVersion"] == "2025-11-25" and out["sessionId"]  # the legacy era, with a session
    assert [
        {k: t[k] for k in ("name", "description", "inputSchema", "outputSchema")} for t in out["tools"]
    ] == reference
    # The tool hints reach the TypeScript client too: a title each, the three reads read-only.
    assert [t["title"] for t in out["tools"]] == [t["annotations"]["title"] for t in out["tools"]]
    assert [t["annotations"]["readOnlyHint"] for t in out["tools"]] == [False, True, True, True]
    assert {
        (t["annotations"]["destructiveHint"], t["annotations"]["openWorldHint"]) for t in out["tools"]
    } == {(False, False)}
    assert [t["annotations"]["idempotentHint"] for t in out["tools"]] == [False, True, True, True]

    cid = out["conversation_id"]
    assert out["append"] == {
        "isError": False,
        "structuredContent": {"first_seq": 0, "last_seq": 1},
        "text": '{"first_seq":0,"last_seq":1}',
    }
    recalled = out["recall"]["structuredContent"]["items"]
    assert [(i["seq"], i["payload"]) for i in recalled] == [
        (0, {"role": "user", "text": "héllo"}),
        (1, {"n": 2}),
    ]
    assert json.loads(out["recall"]["text"]) == out["recall"]["structuredContent"]
    assert [i["seq"] for i in out["replay"]["structuredContent"]["items"]] == [1]
    listed = out["list"]["structuredContent"]
    assert [s["conversation_id"] for s in listed["conversations"]] == [cid] and listed["next_cursor"] is None

    # A tool error reaches the TS client as a tool error (not a schema-mismatch exception).
    assert out["error"]["isError"] is True
    err = json.loads(out["error"]["text"])["error"]
    assert (err["code"], err["reason"], err["retryable"]) == ("InvalidConversationId", "TooShort", False)

    # An item at the depth limit round-trips through this client too; one level more is rejected.
    deep = out["deep"]
    assert deep["append"]["structuredContent"] == {"first_seq": 0, "last_seq": 0}
    level, depth = deep["recall"]["structuredContent"]["items"][0]["payload"]["d"], 2
    while level:
        level, depth = level[0], depth + 1
    assert depth == MAX_PAYLOAD_DEPTH
    err = json.loads(deep["over"]["text"])["error"]
    assert deep["over"]["isError"] and (err["code"], err["index"]) == ("InvalidArgument", 1)
    assert err["path"] == "$.d" + "[0]" * (MAX_PAYLOAD_DEPTH - 1)
