"""Bench-only fast builder: lays out a site with many conversations directly on disk, without fsync.

Creating a conversation through ``Store.append`` costs several fsyncs (new directories, the durable
manifest creation record, the new log), so a million of them would take hours. This writes the same files
the engine would, with the engine's own codecs, and skips every fsync (a crash mid-build just means
rebuilding the bench data):

    sites/<site>/conversations/<h1>/<h2>/<cid>.log   two frames (frame.encode_frame / encode_items)
    sites/<site>/conversations/<h1>/<h2>/<cid>.idx   index header + an entry per frame (optional)
    sites/<site>/manifest/snapshot.1                 every record (manifest.codec.encode_snapshot)

The manifest records carry each log's exact size, so opening the store finds nothing to reconcile; the
measuring side checks that (no journal appears) and reads a few conversations back through ``Store``.
Conversation ``i`` gets deterministic timestamps (a permutation of ``i``), so any process can recompute
the expected listing order.
"""

from __future__ import annotations

import heapq
import os
import time
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass

import msgspec

from logstore.file import layout
from logstore.file.layout import conversation_paths
from logstore.file.log.frame import encode_frame, encode_items
from logstore.file.log.index_codec import INDEX_HEADER, encode_entry
from logstore.file.manifest.codec import Entry
from logstore.file.manifest.snapshot import encode_snapshot

__all__ = ["BuildInfo", "build_site", "conversation_id", "conversation_times", "expected_payloads"]

_PRIME = 1_000_003  # coprime with every n we use (it is prime and larger than a million)
_encode = msgspec.json.Encoder().encode


@dataclass(frozen=True)
class BuildInfo:
    conversations: int
    seconds: float
    log_bytes: int
    first_page: list[str]  # expected first 50 ids of list_conversations
    samples: list[str]  # conversation ids to read back


def conversation_id(i: int) -> str:
    return f"conv-{i:08d}"


def conversation_times(i: int, n: int, base_us: int) -> tuple[int, int]:
    """(created_at, last_appended_at) in microseconds; last_appended_at is a permutation of i (ms apart),
    with every 7th conversation sharing its neighbour's instant to exercise the id tie-break."""
    rank = (i * _PRIME) % n
    last = base_us + (rank - rank % 7 * (rank % 7 == 1)) * 1000
    return last - (i % 997) * 1000 - 1, last


def expected_payloads(i: int) -> list[dict[str, object]]:
    return [{"role": "user", "text": f"hello from {conversation_id(i)}"}, {"role": "assistant", "n": i}]


def _log_bytes(i: int, n: int, base_us: int) -> tuple[bytes, int]:
    """The log file of conversation i and the offset of its second frame."""
    created, last = conversation_times(i, n, base_us)
    first, second = (_encode(p) for p in expected_payloads(i))
    f0 = encode_frame(
        first_seq=0, count=1, recorded_at=created, write_start=0, encoded_items=encode_items([first])
    )
    f1 = encode_frame(
        first_seq=1, count=1, recorded_at=last, write_start=len(f0), encoded_items=encode_items([second])
    )
    return f0 + f1, len(f0)


def _write_range(
    data_dir: str, site: str, start: int, stop: int, n: int, base_us: int, with_index: bool
) -> int:
    made: set[str] = set()
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC
    total = 0
    for i in range(start, stop):
        paths = conversation_paths(data_dir, site, conversation_id(i))
        if paths.directory not in made:
            os.makedirs(paths.directory, exist_ok=True)
            made.add(paths.directory)
        data, second = _log_bytes(i, n, base_us)
        files = [(paths.log, data)]
        if with_index:
            files.append((paths.index, INDEX_HEADER + encode_entry(0, 0) + encode_entry(second, 1)))
        for path, body in files:
            fd = os.open(path, flags, 0o644)
            try:
                os.write(fd, body)
            finally:
                os.close(fd)
        total += len(data)
    return total


def _snapshot(n: int, base_us: int) -> bytes:
    records = []
    for i in range(n):
        created, last = conversation_times(i, n, base_us)
        size = len(_log_bytes(i, n, base_us)[0])
        records.append((conversation_id(i), Entry(created, last, size, 2)))
    return encode_snapshot(records)


def build_site(
    data_dir: str, site: str, n: int, *, jobs: int = 1, base_us: int | None = None, with_index: bool = False
) -> BuildInfo:
    """Write ``n`` conversations for ``site`` under ``data_dir`` (which must not hold that site yet).

    ``with_index`` also writes each ``.idx``; off by default, since listing never opens a conversation and
    the index is an optional hint (the engine rebuilds it on first open), while it doubles the files to
    create and delete."""
    t0 = time.perf_counter()
    base_us = base_us if base_us is not None else time.time_ns() // 1000 - n * 1000 - 10**9
    site_dir = layout.site_dir(data_dir, site)
    if os.path.exists(site_dir):
        raise FileExistsError(site_dir)
    chunk = max(1000, n // (jobs * 8) + 1)
    ranges = [(s, min(s + chunk, n)) for s in range(0, n, chunk)]
    if jobs > 1 and len(ranges) > 1:
        with ProcessPoolExecutor(jobs) as pool:
            futures = [
                pool.submit(_write_range, data_dir, site, a, b, n, base_us, with_index) for a, b in ranges
            ]
            log_bytes = sum(f.result() for f in futures)
    else:
        log_bytes = sum(_write_range(data_dir, site, a, b, n, base_us, with_index) for a, b in ranges)
    manifest_dir = layout.manifest_dir(data_dir, site)
    os.makedirs(manifest_dir, exist_ok=True)
    with open(layout.manifest_file(manifest_dir, "snapshot", 1), "wb") as fh:
        fh.write(_snapshot(n, base_us))
    order = heapq.nsmallest(
        50, ((-conversation_times(i, n, base_us)[1], conversation_id(i)) for i in range(n))
    )
    step = max(1, n // 5)
    samples = [conversation_id(i) for i in range(0, n, step)][:5] + [conversation_id(n - 1)]
    return BuildInfo(n, time.perf_counter() - t0, log_bytes, [cid for _, cid in order], samples)
