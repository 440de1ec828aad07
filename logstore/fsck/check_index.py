"""fsck of a conversation's index against its log: the index's side of ``check_log`` (pure, no I/O).

Entry i must equal frame i of the log's good prefix: offset, first seq and check, i.e. exactly the bytes
``index_codec.encode_entry`` gives for that frame, so the comparison is a byte comparison and only a
disagreement is decoded. A checked entry pointing at or past where the good frames stop is *evidence*:
entries are written only after their frame's fsync, so the bytes there were acknowledged.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..file.log.index_codec import ENTRY_SIZE, INDEX_HEADER_SIZE, decode_entry, header_ok
from ..file.log.scanner import FrameMeta
from ..file.log.seq_index import LAG_BYTES, LAG_FRAMES

__all__ = ["common_entries", "index_evidence", "index_problem", "IndexProblem"]


@dataclass(frozen=True, slots=True)
class IndexProblem:
    kind: str  # index-missing | index-stale | index-wrong
    offset: int | None  # byte offset in the index file
    seqs: tuple[int, int | None] | None  # the seqs whose entries are affected
    message: str


def common_entries(body: bytes, expected: bytes) -> int:
    """How many leading index entries equal the expected ones."""
    n = min(len(body), len(expected)) // ENTRY_SIZE
    if body[: n * ENTRY_SIZE] == expected[: n * ENTRY_SIZE]:
        return n
    view_a, view_b = memoryview(body), memoryview(expected)
    for i in range(n):
        pos = i * ENTRY_SIZE
        if view_a[pos : pos + ENTRY_SIZE] != view_b[pos : pos + ENTRY_SIZE]:
            return i
    return n  # pragma: no cover - unreachable: the slices differed


def index_evidence(body: bytes, expected: bytes, stop: int) -> list[tuple[int, int]]:
    """(offset, first_seq) of checked index entries pointing at or past ``stop``."""
    out = []
    for i in range(common_entries(body, expected), len(body) // ENTRY_SIZE):
        entry = decode_entry(body, i)
        if entry is not None and entry[0] >= stop:
            out.append(entry)
    return out


def index_problem(
    index: bytes | None, body: bytes, expected: bytes, frames: list[FrameMeta], *, log_end: int
) -> IndexProblem | None:
    """The first way the index disagrees with the good frames, or None: (kind, offset, seqs, message).
    An index that lags a log ending at ``log_end`` by less than the engine lets it lag on the append
    path (``seq_index.LAG_FRAMES`` frames and ``LAG_BYTES`` of log) is fine: it is written in batches."""
    n = len(expected) // ENTRY_SIZE

    def span(i: int) -> tuple[int, int]:
        return (frames[i].first_seq, frames[-1].first_seq + frames[-1].count - 1)

    if not index:
        # A live or crashed store may not have written it yet: missing within the lag bound is fine too.
        if n and (n >= LAG_FRAMES or log_end - frames[0].offset >= LAG_BYTES):
            return IndexProblem("index-missing", None, span(0), "no index for a log with frames")
        return None
    if not header_ok(index):
        return IndexProblem("index-wrong", 0, span(0) if n else None, "bad index header")
    m, partial = divmod(len(body), ENTRY_SIZE)
    i = common_entries(body, expected)
    off = INDEX_HEADER_SIZE + i * ENTRY_SIZE
    if i < min(m, n):
        if all(decode_entry(body, j) is None for j in range(i, m)):
            return IndexProblem(
                "index-stale", off, span(i), f"torn index tail from entry {i} (frame {i} not indexed)"
            )
        got = decode_entry(body, i)
        said = f"offset {got[0]}, seq {got[1]}" if got else "a bad check"
        return IndexProblem(
            "index-wrong",
            off,
            span(i),
            f"entry {i} says {said}; frame {i} is at offset {frames[i].offset}, seq {frames[i].first_seq}",
        )
    if m < n and not partial and (n - m >= LAG_FRAMES or log_end - frames[m].offset >= LAG_BYTES):
        return IndexProblem("index-stale", off, span(m), f"index lags the log: {n - m} frame(s) not indexed")
    if m > n:
        if any(decode_entry(body, j) is not None for j in range(n, m)):
            return IndexProblem(
                "index-wrong", off, None, f"index leads the log: {m - n} entry(ies) for frames it lacks"
            )
        return IndexProblem("index-stale", off, None, f"torn index tail: {m - n} entry(ies) fail their check")
    if partial:
        return IndexProblem(
            "index-stale", INDEX_HEADER_SIZE + m * ENTRY_SIZE, None, "torn index tail (partial entry)"
        )
    return None
