"""The bench-only server variant: same stack plus a ``noop`` tool, and its load driver, still work."""

from __future__ import annotations

import subprocess
import sys

from server.bench_app import measure
from server.credentials import CredentialsFile
from tests.server_support import REPO, free_port, wait_healthy


def test_bench_variant_serves_noop_and_the_spec_tools(tmp_path):
    CredentialsFile(str(tmp_path)).add("bench", "pw")
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "server.bench_app", "serve", "--data-dir", str(tmp_path), "--port", str(port)],
        cwd=REPO,
    )
    try:
        wait_healthy(f"http://127.0.0.1:{port}", proc)
        url = f"http://127.0.0.1:{port}/mcp"
        for mode, processes in (("legacy", 1), ("2026-07-28", 2)):
            rates = measure(
                url, "bench", "pw", clients=2, processes=processes, seconds=0.4, rounds=1, mode=mode
            )
            assert set(rates) == {"noop", "append_memory"} and min(rates.values()) > 0
    finally:
        proc.terminate()
        proc.wait(timeout=10)
