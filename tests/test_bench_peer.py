"""Smoke test of P12 (logstore vs the official MCP memory server over stdio) on toy sizes, when the peer is
already installed in the bench's npm cache (the test never downloads it). Asserts the bench works and that
the fsync count is measured, never a speed. ~8 s (six server processes), so only with LOGSTORE_LONG=1."""

from __future__ import annotations

import os
import shutil

import pytest

from bench.config import PROFILES
from bench.peer import PACKAGE, measure_peer, npm_cache

_ENTRY = os.path.join(npm_cache(), "node_modules", *PACKAGE.split("/"), "dist", "index.js")


@pytest.mark.slow
@pytest.mark.skipif(os.environ.get("LOGSTORE_LONG") != "1", reason="~8 s; LOGSTORE_LONG=1 runs it")
@pytest.mark.skipif(shutil.which("node") is None, reason="node not installed")
@pytest.mark.skipif(
    not os.path.exists(_ENTRY),
    reason=f"{PACKAGE} not in the bench's npm cache (python -m bench --only P12 installs it)",
)
def test_peer_bench_runs_on_toy_sizes(tmp_path):
    profile = PROFILES["tiny"].scaled(runs=1, peer_items=300, peer_seconds=0.2, peer_reads=1)
    rows = measure_peer(profile, str(tmp_path))
    assert [r.id for r in rows] == ["P12"] * 4
    for row in rows:
        assert row.value.samples and row.baseline.samples and row.ratio.samples, row
    assert "logstore 1.0 fsync/write" in rows[0].note or "no strace" in rows[0].note, rows[0].note
