"""P1-cpu: the engine's own CPU per append, with the fsync taken out (issue 12: <= 25 us).

``Store.append`` runs on a ``FileOps`` whose ``fdatasync``/``fsync``/``fsync_dir`` return at once (the
seam the torture suite uses, so nothing else in the engine changes), one thread, one conversation, and
the figure is ``time.thread_time()`` (user + system CPU of that thread) over the timed appends divided by
their number. Everything else an append does is in it: validation and encoding, the frame, locks, the
log and index writes, the manifest record, the syscalls' kernel time.

Baseline, same rounds: the raw loop's CPU per batch with the same stub: one ``os.write`` of the same frame
and the stubbed fdatasync call. It is the floor any engine pays to hand the bytes to the kernel.

``python -m bench.cpu_append`` prints the rows alone (``--appends``, ``--runs``).
"""

from __future__ import annotations

import argparse
import os
import time
from typing import Any

from logstore import Store
from logstore.file.fileio import NoSyncOps

from .baselines import frame_bytes
from .config import PROFILES, Profile, make_items, scratch_dir
from .report import format_table
from .stats import Goal, Row, fig

__all__ = ["engine_cpu_us", "raw_cpu_us", "measure_cpu", "BATCHES"]

BATCHES = (1, 10)  # items of 200 B per append
_ITEM = 200
_WARMUP = 200


def engine_cpu_us(store: Store, conversation_id: str, items: list[dict[str, Any]], appends: int) -> float:
    """CPU microseconds per ``store.append`` of ``items`` on one (warm) conversation."""
    for _ in range(_WARMUP):  # creates the conversation, opens its handle, fills the caches
        store.append("bench", conversation_id, items)
    t0 = time.thread_time()
    for _ in range(appends):
        store.append("bench", conversation_id, items)
    return (time.thread_time() - t0) / appends * 1e6


def raw_cpu_us(directory: str, frame: bytes, appends: int) -> float:
    """CPU microseconds per ``os.write(frame)`` + a stubbed fdatasync, appending to one file."""
    ops = NoSyncOps()
    path = os.path.join(directory, f"raw-cpu-{time.monotonic_ns()}.bin")
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        for _ in range(_WARMUP):
            os.write(fd, frame)
        t0 = time.thread_time()
        for _ in range(appends):
            os.write(fd, frame)
            ops.fdatasync(fd)
        return (time.thread_time() - t0) / appends * 1e6
    finally:
        os.close(fd)
        os.unlink(path)


def measure_cpu(profile: Profile, directory: str) -> list[Row]:
    """Per round and batch size: the engine (a fresh conversation) and the raw floor, back to back."""
    appends = max(100, round(profile.duration * 3000))  # 6,000 appends in the full profile
    engine: dict[int, list[float]] = {b: [] for b in BATCHES}
    raw: dict[int, list[float]] = {b: [] for b in BATCHES}
    with Store(os.path.join(directory, "store"), file_ops=NoSyncOps()) as store:
        for r in range(profile.runs):
            for batch in BATCHES:
                items = make_items(batch, _ITEM)
                # Each conversation holds at most 100,000 items: one per round and size stays under it.
                conversation_id = f"cpu-{batch:03d}-{r:04d}"
                if r % 2:
                    raw[batch].append(raw_cpu_us(directory, frame_bytes(items), appends))
                    engine[batch].append(engine_cpu_us(store, conversation_id, items, appends))
                else:
                    engine[batch].append(engine_cpu_us(store, conversation_id, items, appends))
                    raw[batch].append(raw_cpu_us(directory, frame_bytes(items), appends))
    return [
        Row(
            "P1-cpu",
            f"engine CPU per append, fsync stubbed: 1 writer, batch {batch} x {_ITEM} B",
            "us",
            value=fig(engine[batch]),
            baseline=fig(raw[batch]),
            baseline_name="raw write + stubbed fdatasync",
            goal=Goal("<=", 25.0, "<= 25 us"),
            note=f"time.thread_time over {appends:,} appends per round",
        )
        for batch in BATCHES
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.cpu_append", description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=2.0, help="x 3,000 appends per round")
    parser.add_argument("--tmp-dir", default=None)
    args = parser.parse_args(argv)
    profile = PROFILES["full"].scaled(runs=args.runs, duration=args.seconds)
    with scratch_dir(args.tmp_dir, "cpu") as directory:
        print(format_table(measure_cpu(profile, directory)))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
