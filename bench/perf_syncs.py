"""fsync + fdatasync calls a server makes under load, counted by ``perf stat`` on the syscall tracepoints
of its processes (threads and children forked meanwhile included; far cheaper than strace, so the load
runs at its own pace). Divided by the batches acknowledged, it shows how many batches share one sync:
group commit across writers (PostgreSQL's WAL flush, Redis's one fsync per event-loop turn) against one
sync per batch and file.

Optional: without ``perf``, or where the tracepoints cannot be opened (``perf_event_paranoid``, no
tracefs), ``counting_syncs`` yields a counter that stays None.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator

__all__ = ["SyncCount", "counting_syncs"]

_EVENTS = ("syscalls:sys_enter_fsync", "syscalls:sys_enter_fdatasync")
_OPEN_TIMEOUT = 10.0


class SyncCount:
    value: int | None = None


def _perf_fds(pid: int) -> int:
    n = 0
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            with contextlib.suppress(OSError):
                n += "perf_event" in os.readlink(f"/proc/{pid}/fd/{fd}")
    except OSError:
        pass
    return n


@contextlib.contextmanager
def counting_syncs(pids: list[int]) -> Iterator[SyncCount]:
    """Counts the syncs of ``pids`` (and what they fork meanwhile) over the ``with`` block."""
    count = SyncCount()
    perf = shutil.which("perf")
    if perf is None or not pids:
        yield count
        return
    with tempfile.NamedTemporaryFile(prefix="perf-syncs-", suffix=".csv") as out:
        args = [perf, "stat", "-x,", "-o", out.name, "-e", ",".join(_EVENTS), "-p", ",".join(map(str, pids))]
        proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + _OPEN_TIMEOUT
        # Counting starts once perf holds its counters (one per event and thread).
        while _perf_fds(proc.pid) < len(_EVENTS) * len(pids):
            if proc.poll() is not None or time.monotonic() > deadline:
                break
            time.sleep(0.01)
        opened = proc.poll() is None
        try:
            yield count
        finally:
            proc.send_signal(signal.SIGINT)  # perf prints its counts on SIGINT
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if opened:  # perf exits 130 after SIGINT, its counts written
            count.value = _parse(out.read().decode())


def _parse(text: str) -> int | None:
    total, seen = 0, 0
    for line in text.splitlines():
        fields = line.split(",")
        if len(fields) > 2 and fields[2] in _EVENTS:
            if fields[0] == "<not counted>":  # no thread ran while counting: no syscall either
                fields[0] = "0"
            if not fields[0].isdigit():  # "<not supported>"
                return None
            total += int(fields[0])
            seen += 1
    return total if seen == len(_EVENTS) else None
