"""What a ``stat`` between writes costs the next ``fdatasync`` (why ``logstore/file/statx.py`` exists).

One file, preallocated (zero-filled, fsynced), then rounds of ``pwrite(frame) ; fdatasync`` with, before
each write, nothing / ``os.fstat`` + ``os.stat`` (ask for every field, timestamps included) / the same two
calls through ``logstore.file.statx`` (size, inode and link count only). On a kernel with multigrain
timestamps (Linux >= 6.13 on ext4, xfs, btrfs, tmpfs) the second mode makes every write dirty the inode.

    python -m bench.stat_fdatasync --writes 2000 --rounds 3   # fdatasync p50 and writes/s per mode
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable

from logstore.file.statx import STATX_AVAILABLE, fstat_ident, stat_ident

__all__ = ["MODES", "measure", "main"]


def _none(fd: int, path: str) -> None:
    pass


def _os_stat(fd: int, path: str) -> None:
    os.fstat(fd)
    os.stat(path)


def _statx(fd: int, path: str) -> None:
    fstat_ident(fd)
    stat_ident(path)


MODES: dict[str, Callable[[int, str], None]] = {"no stat": _none, "os.stat": _os_stat, "statx": _statx}


def measure(directory: str, mode: str, *, writes: int, frame_size: int = 2300) -> tuple[float, float]:
    """(writes/s, fdatasync p50 in us) for ``writes`` preallocated writes with ``mode`` before each."""
    look = MODES[mode]
    frame = os.urandom(frame_size)
    path = os.path.join(directory, f"stat-fdatasync-{time.monotonic_ns()}.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, bytes(frame_size * writes))
        os.fsync(fd)
        syncs: list[int] = []
        start = time.perf_counter()
        for i in range(writes):
            look(fd, path)
            os.pwrite(fd, frame, i * frame_size)
            t0 = time.perf_counter_ns()
            os.fdatasync(fd)
            syncs.append(time.perf_counter_ns() - t0)
        elapsed = time.perf_counter() - start
    finally:
        os.close(fd)
        os.unlink(path)
    return writes / elapsed, statistics.median(syncs) / 1000


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.stat_fdatasync")
    parser.add_argument("--writes", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--dir", default=None, help="where to write (default: a temp dir under the cwd)")
    args = parser.parse_args(argv)
    print(f"kernel {os.uname().release}, statx {'via libc' if STATX_AVAILABLE else 'unavailable'}")
    with tempfile.TemporaryDirectory(dir=args.dir or os.getcwd()) as directory:
        for r in range(args.rounds):
            for mode in MODES:  # interleaved: the machine's noise hits every mode alike
                rate, p50 = measure(directory, mode, writes=args.writes)
                print(f"round {r}  {mode:8s} {rate:8.0f} writes/s   fdatasync p50 {p50:6.1f} us", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
