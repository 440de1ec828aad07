"""Benchmark profiles (sizes and run counts), payload helpers and scratch directories.

Three profiles: ``full`` (the published table, ~10 minutes with the million-conversation listing),
``quick`` (about a minute: same measures, smaller sizes) and ``tiny`` (seconds: the smoke test's profile,
which exercises every code path but measures nothing meaningful).
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from typing import Any

import msgspec

__all__ = ["Profile", "PROFILES", "make_item", "make_items", "scratch_dir", "item_bytes"]


@dataclass(frozen=True)
class Profile:
    name: str
    runs: int  # rounds per measure; every figure is the median (min-max) over them
    duration: float  # seconds per throughput run
    sweep_duration: float
    threads: int  # P2/P3 writers and the N-file raw ceiling
    read_small: int  # P4: items in the small conversation
    read_large: int  # P4: items in the large conversation
    read_batch: int  # P4: items per append when filling
    read_calls: int  # P4: timed calls per run and size
    listing_sizes: tuple[int, ...]  # P5: conversations per site
    list_calls: int  # P5: timed list calls
    mcp_clients: int
    mcp_seconds: float
    crash_items: int  # P7: items in the conversation at the time of the kill
    fsck_mb: int  # P8: MB of log data verified
    peer_items: int  # P12: items in the conversation for the "full" state (0: P12 skipped)
    peer_seconds: float  # P12: seconds of writes per session
    peer_reads: int  # P12: timed reads per session
    langgraph_sizes: tuple[int, ...] = (100, 1_000, 10_000)  # C3: messages in the thread
    langgraph_steps: int = 5  # C3: timed turns per round and size
    new_conversations: int = 200  # P14: new conversations per round

    def scaled(self, **changes: Any) -> Profile:
        return replace(self, **changes)


PROFILES = {
    "full": Profile(
        name="full",
        runs=5,
        duration=2.0,
        sweep_duration=1.0,
        threads=16,
        read_small=1_000,
        read_large=100_000,
        read_batch=10,
        read_calls=300,
        listing_sizes=(10_000, 1_000_000),
        list_calls=500,
        mcp_clients=16,
        mcp_seconds=5.0,
        crash_items=100_000,
        fsck_mb=256,
        peer_items=50_000,
        peer_seconds=2.0,
        peer_reads=2,  # the peer's read_graph takes ~5 s at 50k items
        langgraph_steps=40,
    ),
    "quick": Profile(
        name="quick",
        runs=3,
        duration=0.5,
        sweep_duration=0.3,
        threads=16,
        read_small=1_000,
        read_large=100_000,
        read_batch=100,
        read_calls=200,
        listing_sizes=(10_000,),
        list_calls=300,
        mcp_clients=16,
        mcp_seconds=1.5,
        crash_items=100_000,
        fsck_mb=32,
        peer_items=50_000,
        peer_seconds=1.0,
        peer_reads=1,
    ),
    "tiny": Profile(
        name="tiny",
        runs=2,
        duration=0.05,
        sweep_duration=0.03,
        threads=4,
        read_small=100,
        read_large=2_000,
        read_batch=100,
        read_calls=20,
        listing_sizes=(300,),
        list_calls=20,
        mcp_clients=2,
        mcp_seconds=0.3,
        crash_items=2_000,
        fsck_mb=1,
        peer_items=0,  # starts node (and npm) processes: tests/test_bench_peer.py covers it instead
        peer_seconds=0.2,
        peer_reads=1,
        langgraph_sizes=(10, 100),
        langgraph_steps=2,
        new_conversations=20,
    ),
}

_encode = msgspec.json.Encoder().encode


def make_item(size: int, n: int = 0) -> dict[str, Any]:
    """A JSON object whose compact encoding is exactly ``size`` bytes (size >= 32)."""
    base = {"role": "user", "n": n, "text": ""}
    pad = size - len(_encode(base))
    if pad < 0:
        raise ValueError(f"item size {size} too small")
    base["text"] = "x" * pad
    return base


def make_items(count: int, size: int) -> list[dict[str, Any]]:
    return [make_item(size, i % 10) for i in range(count)]


def item_bytes(items: list[dict[str, Any]]) -> int:
    return sum(len(_encode(i)) for i in items)


@contextmanager
def scratch_dir(root: str | None, name: str) -> Iterator[str]:
    """A fresh directory under ``root`` (default: $LOGSTORE_BENCH_TMP or the system temp dir), removed
    afterwards whatever happens."""
    base = root or os.environ.get("LOGSTORE_BENCH_TMP") or None
    if base:
        os.makedirs(base, exist_ok=True)
    path = tempfile.mkdtemp(prefix=f"logstore-bench-{name}-", dir=base)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)
