"""Helpers shared by the tests (one home each): reading a log's frames, the long-mode switch, the MCP
``initialize`` request body, waiting for an event no one can signal."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

from logstore.file.log.frame import Frame, FrameDecoder

__all__ = ["LONG", "examples", "log_frames", "frames_in", "initialize_body", "wait_until"]

# LOGSTORE_LONG=1 enables the long torture/soak modes (marker ``slow``).
LONG = os.environ.get("LOGSTORE_LONG") == "1"


def examples(default: int, long: int) -> int:
    """A property test's example count: ``default`` in the default run (its ~10-minute budget), ``long``
    with LOGSTORE_LONG=1 (the count it had before the budget)."""
    return long if LONG else default


def log_frames(path: str | os.PathLike[str]) -> list[Frame]:
    """The good frames at the start of the log at ``path``, in order (stops at the first bad one)."""
    with open(path, "rb") as f:
        return frames_in(f.read())


def frames_in(data: bytes) -> list[Frame]:
    """The good frames at the start of ``data`` (a log's bytes), in order."""
    decoder = FrameDecoder()
    decoder.feed(data)
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


def wait_until(
    condition: Callable[[], object], *, timeout: float, what: str = "the awaited event", poll: float = 0.01
) -> None:
    """Poll ``condition`` until it holds: for events no one can signal (another process's progress). The
    deadline is a guard against a hang, never the point of a test: give a generous one."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what}: not reached in {timeout} s")
        time.sleep(poll)
