"""The harness of ``bench.hostile``'s scenarios: ``logstore serve`` from a given source tree on a free
loopback port with a fresh data dir (``server``), the RSS of its processes, and the shapes of MCP requests
(Basic auth, the 2026 headers, a ``tools/call`` body, an ``initialize``) and of their outcome.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx2

REPO = Path(__file__).resolve().parent.parent
MODERN = "2026-07-28"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _add_site(src: Path, data_dir: str, site: str, password: str) -> None:
    subprocess.run(
        [sys.executable, "-m", "tools.cli", "site", "add", site, "--password-stdin", "--data-dir", data_dir],
        input=password,
        text=True,
        check=True,
        capture_output=True,
        cwd=src,
        env={**os.environ, "PYTHONPATH": str(src)},
    )


def _tree_pids(pid: int) -> list[int]:
    pids = [pid]
    for p in pids:
        for task in Path(f"/proc/{p}/task").glob("*"):
            with contextlib.suppress(OSError):
                pids += [int(c) for c in (task / "children").read_text().split()]
    return pids


def _status_kib(pid: int, field: str) -> int:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def rss_mib(pid: int) -> float:
    return sum(_status_kib(p, "VmRSS") for p in _tree_pids(pid)) / 1024


def peak_rss_mib(pid: int) -> float:
    """Sum over the server's processes of each one's high-water RSS (VmHWM)."""
    return sum(_status_kib(p, "VmHWM") for p in _tree_pids(pid)) / 1024


@contextlib.contextmanager
def server(
    src: Path, sites: dict[str, str], *, workers: int = 1, env: dict[str, str] | None = None
) -> Iterator[tuple[str, subprocess.Popen[bytes]]]:
    with tempfile.TemporaryDirectory(prefix="hostile-") as data_dir:
        for site, password in sites.items():
            _add_site(src, data_dir, site, password)
        port = _free_port()
        log = open(os.path.join(data_dir, "serve.log"), "wb")  # noqa: SIM115 - closed below
        proc = subprocess.Popen(
            [sys.executable, "-m", "tools.cli", "serve", "--data-dir", data_dir, "--port", str(port)]
            + ["--workers", str(workers), "--log-level", "warning"],
            cwd=src,
            env={**os.environ, "PYTHONPATH": str(src), **(env or {})},
            stdout=log,
            stderr=subprocess.STDOUT,
        )
        base = f"http://127.0.0.1:{port}"
        try:
            deadline = time.monotonic() + 30
            while True:
                try:
                    with urllib.request.urlopen(base + "/healthz", timeout=1):
                        break
                except OSError:
                    if time.monotonic() > deadline or proc.poll() is not None:
                        raise RuntimeError("server did not start") from None
                    time.sleep(0.1)
            yield base, proc
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
            log.close()
            lines = Path(data_dir, "serve.log").read_bytes().count(b"\n")
            print(f"# server log: {lines} lines", file=sys.stderr)


def basic(site: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{site}:{password}".encode()).decode()


def modern_headers(authorization: str, tool: str) -> dict[str, str]:
    return {
        "Authorization": authorization,
        "Content-Type": "application/json",
        "Accept": "application/json, text/event-stream",
        "MCP-Protocol-Version": MODERN,
        "Mcp-Method": "tools/call",
        "Mcp-Name": tool,
    }


def tool_call(tool: str, arguments: dict[str, Any], request_id: int = 1) -> dict[str, Any]:
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
    }
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "tools/call",
        "params": {"name": tool, "arguments": arguments, "_meta": meta},
    }


def outcome(r: httpx2.Response) -> str:
    if r.status_code != 200:
        return f"http-{r.status_code}"
    body = r.json()
    if "error" in body:
        return f"rpc-{body['error']['code']}"
    if body["result"].get("isError"):
        return json.loads(body["result"]["content"][0]["text"])["error"]["code"]
    return "ok"


INIT = {  # a 2025-11-25 client's initialize: opens a (legacy) session
    "jsonrpc": "2.0",
    "id": 1,
    "method": "initialize",
    "params": {
        "protocolVersion": "2025-11-25",
        "capabilities": {},
        "clientInfo": {"name": "h", "version": "0"},
    },
}
