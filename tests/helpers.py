"""Helpers shared by the tests (one home each): reading a log's frames, the long-mode switch, the MCP
``initialize`` request body."""

from __future__ import annotations

import os
from typing import Any

from logstore.file.frame import Frame, FrameDecoder

__all__ = ["LONG", "log_frames", "initialize_body", "INITIALIZE_HEADERS"]

# LOGSTORE_LONG=1 enables the long torture/soak modes (marker ``slow``).
LONG = os.environ.get("LOGSTORE_LONG") == "1"

INITIALIZE_HEADERS = {"Accept": "application/json, text/event-stream", "Content-Type": "application/json"}


def log_frames(path: str | os.PathLike[str], *, keep_items: bool = True) -> list[Frame]:
    """The good frames at the start of the log at ``path``, in order (stops at the first bad one)."""
    decoder = FrameDecoder(keep_items=keep_items)
    with open(path, "rb") as f:
        decoder.feed(f.read())
    out = []
    while isinstance(event := decoder.next_event(), Frame):
        out.append(event)
    return out


def initialize_body(
    request_id: int = 1, *, client: str = "t", protocol: str = "2025-11-25"
) -> dict[str, Any]:
    """A JSON-RPC ``initialize`` request, as the first POST of an MCP session."""
    return {
        "jsonrpc": "2.0",
        "id": request_id,
        "method": "initialize",
        "params": {
            "protocolVersion": protocol,
            "capabilities": {},
            "clientInfo": {"name": client, "version": "0"},
        },
    }
