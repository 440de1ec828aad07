"""fsync + fdatasync calls per acknowledged batch of a running server, counted by ``strace`` attached to
its processes (``-f``: every thread, and children forked while attached, such as a PostgreSQL backend).

One writer, one batch at a time, so every batch is acknowledged alone: a server that syncs before it
acknowledges shows >= 1 per batch; one that does not (Redis with ``appendfsync everysec``, a database with
``synchronous_commit off``) shows ~0. Under concurrent load a server may share one sync between batches
(group commit), which this does not measure.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import time
from collections.abc import Callable, Iterable

__all__ = ["fsyncs_per_batch"]

_CALL = re.compile(r"\b(fsync|fdatasync)\(")
_ATTACH_TIMEOUT = 30.0


def _count(path: str) -> int:
    try:
        with open(path) as f:
            return len(_CALL.findall(f.read()))
    except FileNotFoundError:
        return 0


def _tracer(task_status: str) -> int | None:
    try:
        with open(task_status) as f:
            for line in f:
                if line.startswith("TracerPid:"):
                    return int(line.split()[1])
    except OSError:
        return None  # the thread has exited
    return None


def _threads(pid: int) -> list[str]:
    try:
        return os.listdir(f"/proc/{pid}/task")
    except FileNotFoundError:
        return []  # the process has exited (a server's short-lived child)


def _wait_attached(proc: subprocess.Popen[bytes], pids: list[int]) -> None:
    """Until the kernel names strace as the tracer of every thread of ``pids`` (``TracerPid`` in
    /proc; strace's own "attached" messages are buffered when its stderr is not a terminal)."""
    deadline = time.monotonic() + _ATTACH_TIMEOUT
    while True:
        tasks = [f"/proc/{pid}/task/{tid}/status" for pid in pids for tid in _threads(pid)]
        if all(_tracer(task) in (proc.pid, None) for task in tasks):
            return
        if proc.poll() is not None:
            raise RuntimeError(f"strace exited with {proc.returncode} before attaching to {pids}")
        if time.monotonic() > deadline:
            raise RuntimeError(f"strace did not attach to {pids} in {_ATTACH_TIMEOUT:.0f} s")
        time.sleep(0.01)


def fsyncs_per_batch(
    pids: Iterable[int], step: Callable[[], object], batches: int, directory: str
) -> float | None:
    """Syncs per ``step()`` over ``batches`` steps, strace attached to ``pids`` first; None without
    strace. Syncs the server's background processes make meanwhile are counted too."""
    strace = shutil.which("strace")
    if strace is None:
        return None
    pids = list(pids)
    out = os.path.join(directory, f"strace-fsync-{pids[0]}.txt")
    args = [strace, "-f", "-e", "trace=fsync,fdatasync", "-o", out]
    for pid in pids:
        args += ["-p", str(pid)]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        _wait_attached(proc, pids)
        before = _count(out)
        for _ in range(batches):
            step()
    finally:
        proc.terminate()  # strace detaches and flushes its output on SIGTERM
        proc.wait(timeout=20)
    return (_count(out) - before) / batches
