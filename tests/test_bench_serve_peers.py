"""The P6-redis/psql/engine bench's own tools: the fsync counters tell a server that syncs each batch from
one that does not, and the rows say why Redis was skipped when it is not installed. The rows themselves
run in tests/test_bench_smoke.py (tiny profile). Nothing here measures a speed."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap

import pytest

from bench.config import PROFILES
from bench.fsync_trace import fsyncs_per_batch
from bench.perf_syncs import counting_syncs

# A toy server: one line in, one write (and an fdatasync when SYNC) and one line out per "batch".
_SERVER = textwrap.dedent(
    """
    import os, sys
    sync = sys.argv[2] == "sync"
    fd = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    for line in sys.stdin:
        os.write(fd, b"batch\\n")
        if sync:
            os.fdatasync(fd)
        sys.stdout.write("ok\\n")
        sys.stdout.flush()
    """
)


class _Toy:
    def __init__(self, tmp_path, mode: str) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _SERVER, str(tmp_path / "log"), mode],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )

    def step(self) -> None:
        assert self.proc.stdin is not None and self.proc.stdout is not None
        self.proc.stdin.write("append\n")
        self.proc.stdin.flush()
        assert self.proc.stdout.readline() == "ok\n"

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        self.proc.wait(timeout=30)


@pytest.mark.skipif(shutil.which("strace") is None, reason="strace not installed")
@pytest.mark.parametrize(("mode", "expected"), [("sync", 1.0), ("nosync", 0.0)])
def test_strace_count_tells_a_syncing_server_from_one_that_does_not(tmp_path, mode, expected):
    toy = _Toy(tmp_path, mode)
    try:
        toy.step()
        assert fsyncs_per_batch([toy.proc.pid], toy.step, 10, str(tmp_path)) == expected
    finally:
        toy.close()


def test_perf_count_under_load_is_exact_or_absent(tmp_path):
    toy = _Toy(tmp_path, "sync")
    try:
        toy.step()
        with counting_syncs([toy.proc.pid]) as syncs:
            for _ in range(25):
                toy.step()
    finally:
        toy.close()
    assert syncs.value in (25, None)  # None: no perf, or its tracepoints cannot be opened here


@pytest.mark.server
def test_rows_say_why_redis_is_skipped(tmp_path, monkeypatch):
    import bench.serve_peers as serve_peers

    monkeypatch.setattr(serve_peers, "redis_missing", lambda: "redis-server not installed (test)")
    profile = PROFILES["tiny"].scaled(runs=1)
    rows = {row.id: row for row in serve_peers.measure_serve_peers(profile, str(tmp_path))}
    assert rows["P6-redis"].value is None
    assert rows["P6-redis"].note == "skipped: redis-server not installed (test)"
    for row_id in ("P6-psql", "P6-engine"):
        assert rows[row_id].value is not None and rows[row_id].value.samples, rows[row_id]
        assert rows[row_id].ratio is not None and rows[row_id].ratio.samples, rows[row_id]
