"""The bench-only server variant (``bench.bench_app``: same stack plus a ``noop`` tool) and the bench's one
load driver (``bench.load``, light raw-HTTP and SDK clients) work together."""

from __future__ import annotations

import asyncio
import subprocess
import sys

import pytest

from bench.load import run_load
from logstore.file.credentials import CredentialsFile
from tests.server_support import REPO, free_port, wait_healthy


def test_bench_variant_serves_noop_and_the_spec_tools(tmp_path):
    CredentialsFile(str(tmp_path)).add("bench", "pw")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "bench.bench_app", "--data-dir", str(tmp_path), "--port", str(port)],
        cwd=REPO,
        text=True,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        url = f"http://127.0.0.1:{port}/mcp"
        for kind, mode in (("light", "2026-07-28"), ("sdk", "legacy"), ("sdk", "2026-07-28")):
            for tool in ("noop", "append_memory"):
                load = run_load(
                    url, "pw", tool, clients=2, seconds=0.3, kind=kind, mode=mode, server_pid=proc.pid
                )
                result = asyncio.run(load)
                assert result["calls"] > 0 and result["server_cpu_s"] > 0, result
                if kind == "light":
                    assert sum(result["calls_per_worker"]) == result["calls"]
        with pytest.raises(RuntimeError, match="unknown tool"):  # the light client sees tool errors
            asyncio.run(run_load(url, "pw", "no_such_tool", clients=1, seconds=0.1))
    finally:
        proc.terminate()
        proc.wait(timeout=10)
