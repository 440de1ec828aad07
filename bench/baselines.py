"""Same-run baselines: the raw ``write + fdatasync`` ceiling and SQLite (WAL, ``synchronous=FULL``).

- Raw ceiling: each thread owns one file and loops ``os.write(frame) ; os.fdatasync``, where ``frame`` is
  byte for byte what the engine would write for the batch (``file.log.frame.encode_frame``). Nothing else:
  no locks, no encoding, no index. One thread = the single-writer ceiling; N threads on N files = the
  ceiling for N independent conversations.
- Preallocated: one thread loops ``os.pwrite(frame) ; os.fdatasync`` into a file that was zero-filled and
  fsynced beforehand (``PREALLOC_BYTES``, wrapping around at its end), so no write changes the file's size
  or allocates a block: the fdatasync carries no inode update. The disk's real ceiling for a log that grows
  in preallocated chunks (issue 12), against which the engine's log format v2 is judged.
- SQLite: stdlib ``sqlite3``, ``journal_mode=WAL``, ``synchronous=FULL``, one ``BEGIN IMMEDIATE ...
  COMMIT`` per batch inserting one row per item (conversation id, seq, recorded_at, JSON payload) into a
  ``WITHOUT ROWID`` table keyed by (conversation_id, seq). JSON encoding is inside the loop, as it is for
  the engine.
"""

from __future__ import annotations

import os
import sqlite3
import time
from collections.abc import Callable
from typing import Any

import msgspec

from logstore.core.batch import prepare_batch
from logstore.file.log.frame import encode_frame, encode_items

from .stats import run_threads

__all__ = ["frame_bytes", "raw_fdatasync", "prealloc_fdatasync", "sqlite_wal", "PREALLOC_BYTES"]

_encode = msgspec.json.Encoder().encode


def frame_bytes(items: list[dict[str, Any]]) -> bytes:
    """The exact frame the engine writes for this batch (timestamps and seqs do not change its size)."""
    batch = prepare_batch(items)
    return encode_frame(
        first_seq=0,
        count=batch.count,
        recorded_at=time.time_ns() // 1000,
        write_start=0,
        encoded_items=encode_items(batch.items),
    )


def raw_fdatasync(directory: str, data: bytes, threads: int, duration: float) -> float:
    """Writes/s summed over ``threads`` threads, each appending ``data`` to its own file + fdatasync."""
    fds: list[int] = []

    def setup(i: int) -> Callable[[], None]:
        fd = os.open(
            os.path.join(directory, f"raw-{i}-{time.monotonic_ns()}.bin"),
            os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC,
            0o644,
        )
        fds.append(fd)
        os.write(fd, data)
        os.fdatasync(fd)

        def step() -> None:
            os.write(fd, data)
            os.fdatasync(fd)

        return step

    try:
        count, elapsed = run_threads(threads, setup, duration)
    finally:
        for fd in fds:
            os.close(fd)
        for name in os.listdir(directory):
            if name.startswith("raw-"):
                os.unlink(os.path.join(directory, name))
    return count / elapsed


PREALLOC_BYTES = 16 * 1024 * 1024  # written with zeros and fsynced before the timed loop
_ZEROS = bytes(1024 * 1024)


def prealloc_fdatasync(directory: str, data: bytes, duration: float) -> float:
    """Writes/s of one thread writing ``data`` + fdatasync into an already written, synced file."""
    path = os.path.join(directory, f"prealloc-{time.monotonic_ns()}.bin")
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, 0o600)
    try:
        for offset in range(0, PREALLOC_BYTES, len(_ZEROS)):
            os.pwrite(fd, _ZEROS, offset)
        os.fsync(fd)  # size and extents durable: from here on a write changes only data blocks
        limit = PREALLOC_BYTES - len(data)
        state = {"offset": 0}

        def step() -> None:
            offset = state["offset"]
            os.pwrite(fd, data, offset)
            os.fdatasync(fd)
            offset += len(data)
            state["offset"] = offset if offset <= limit else 0

        count, elapsed = run_threads(1, lambda _i: step, duration)
    finally:
        os.close(fd)
        os.unlink(path)
    return count / elapsed


_SCHEMA = """
CREATE TABLE IF NOT EXISTS items (
    conversation_id TEXT NOT NULL,
    seq INTEGER NOT NULL,
    recorded_at INTEGER NOT NULL,
    payload TEXT NOT NULL,
    PRIMARY KEY (conversation_id, seq)
) WITHOUT ROWID
"""


def sqlite_wal(directory: str, items: list[dict[str, Any]], duration: float) -> float:
    """Batches/s for one writer: one transaction per batch, ``synchronous=FULL`` in WAL mode."""
    path = os.path.join(directory, f"sqlite-{time.monotonic_ns()}.db")
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False)
    try:
        mode = conn.execute("PRAGMA journal_mode=WAL").fetchone()[0]
        if mode.lower() != "wal":
            raise RuntimeError(f"sqlite refused WAL mode ({mode})")
        conn.execute("PRAGMA synchronous=FULL")
        conn.execute(_SCHEMA)
        state = {"seq": 0}

        def step() -> None:
            seq = state["seq"]
            now = time.time_ns() // 1000
            rows = [
                ("bench-conversation", seq + k, now, _encode(item).decode()) for k, item in enumerate(items)
            ]
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany("INSERT INTO items VALUES (?, ?, ?, ?)", rows)
            conn.execute("COMMIT")
            state["seq"] = seq + len(items)

        def setup(_i: int) -> Callable[[], None]:
            step()  # warm: creates the WAL and the table's first pages
            return step

        count, elapsed = run_threads(1, setup, duration)
    finally:
        conn.close()
        for suffix in ("", "-wal", "-shm"):
            try:
                os.unlink(path + suffix)
            except FileNotFoundError:
                pass
    return count / elapsed
