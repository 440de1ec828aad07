"""fsck of one conversation: its log (through the recovery scanner, ``scanner.scan_log``) and its index.

How a conversation is checked (docs/FSCK.md):
1. Unlocked pass: scan the whole log as recovery does, continuing past each corruption (from the next valid
   frame, found by its magic) so that every damaged region and the seqs it affects are listed. Long scans
   never block the server's appends.
2. Locked pass, under the conversation's flock (the lock appends take): re-scan from the end of the last
   good frame to the current end of file. A good prefix is immutable (the log is append-only; only a repair
   cuts it, and a log it cuts is corrupt, which is rescanned whole), so this sees exactly what recovery
   would see now, and an append in flight during pass 1 is never mistaken for a torn tail.
3. Torn tail vs corruption: the engine's own rule, ``file.log.recovery`` (index anchor and evidence, then
   ``judge``): a checked index entry at or past the scanner's stop point proves that bytes there were
   acknowledged: that is corruption (``missing-frames`` if the log simply ends), never a torn tail.
4. Index, both directions: entry i must equal frame i of the good prefix (offset, first seq, check);
   fewer entries is lag (``index-stale``), any other disagreement ``index-wrong``. A corrupt log's index is
   left alone: it may be the only evidence that the damaged bytes were acknowledged.
5. Repair, still under the lock: removed bytes are first copied to ``<log>.broken-<timestamp>`` (file and
   directory fsynced), then the log is cut and fsynced, then the index is replaced (temp + fsync + rename +
   directory fsync). A torn tail is cut with ``repair``; corruption only with ``truncate_corrupt``.
"""

from __future__ import annotations

import errno
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from ..core.errors import Io, Timeout
from ..file.fileio import FILE_MODE, FileOps
from ..file.layout import ConversationPaths
from ..file.locking import PathLock
from ..file.log.commit_point import invalidate
from ..file.log.frame import Frame
from ..file.log.index_codec import INDEX_HEADER, INDEX_HEADER_SIZE, encode_entry, header_ok, index_entries
from ..file.log.recovery import anchor_index, judge
from ..file.log.scanner import (
    FrameMeta,
    ScanState,
    read_frame_at,
)
from ..file.manifest.codec import Entry
from .check_index import index_evidence, index_problem
from .check_report import CheckContext, Finding
from .segments import LogScan, locked_rescan, scan_segments

__all__ = ["ConversationOutcome", "check_conversation", "current_entry", "save_broken"]

_COPY_CHUNK = 4 * 1024 * 1024
_REASON_KIND = {"incomplete": "truncated-frame"}  # other scanner reasons are kinds already


@dataclass(slots=True)
class ConversationOutcome:
    """What the site-level checks need to know about a conversation after its check."""

    checked: bool  # False: it could not be locked or read (a finding says why)
    corrupt: bool = False
    entry: Entry | None = None  # manifest entry implied by the log (after repairs)
    size: int = 0  # file size after repairs
    frames: int = 0
    items: int = 0


def broken_target(ops: FileOps, path: str) -> str:
    """A new ``<path>.broken-<UTC timestamp>`` name (a repair keeps what it removes there)."""
    now = time.time()
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now)) + f"{int(now % 1 * 1e6):06d}Z"
    target, n = f"{path}.broken-{stamp}", 0
    while ops.exists(target):
        n += 1
        target = f"{path}.broken-{stamp}-{n}"
    return target


def save_broken(ops: FileOps, path: str, fd: int, start: int, size: int) -> str:
    """Copy bytes [start, size) of ``fd`` to a new ``<path>.broken-<UTC timestamp>``; fsync it and its
    directory before returning, so the bytes a repair is about to remove are durable elsewhere first."""
    target = broken_target(ops, path)
    out = ops.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL, FILE_MODE)
    try:
        pos = start
        while pos < size:
            chunk = ops.pread(fd, min(_COPY_CHUNK, size - pos), pos)
            if not chunk:
                raise OSError(f"{path} shrank while saving bytes {start}..{size}")
            ops.pwrite(out, chunk, pos - start)
            pos += len(chunk)
        ops.fsync(out)
    finally:
        ops.close(out)
    ops.fsync_dir(os.path.dirname(target))
    return target


def check_conversation(
    ctx: CheckContext,
    site: str,
    conversation: str,
    paths: ConversationPaths,
    on_locked: Callable[[ConversationOutcome], None] | None = None,
) -> ConversationOutcome:
    """Check (and with ``ctx.repair`` repair) one conversation; ``on_locked`` runs while its lock is
    still held (the manifest comparison, which must not race the conversation's writers)."""
    ops = ctx.ops
    counted = 0
    size = 0

    def count(frame: Frame) -> None:
        nonlocal counted
        counted += frame.size
        ctx.advance(frame.size)

    on_frame = count if ctx.progress is not None else None  # a call per frame costs ~5% on small frames

    def problem(kind: str, path: str, message: str) -> ConversationOutcome:
        ctx.found(kind, path, message, site=site, conversation=conversation)
        return ConversationOutcome(False)

    try:
        fd = ops.open(paths.log, os.O_RDONLY)
    except OSError as exc:
        return problem("io-error", paths.log, f"cannot open the log: {exc.strerror or exc}")
    try:
        try:
            size = ops.size(fd)
            scan = LogScan(size, scan_segments(ops, fd, size=size, on_frame=on_frame))
        except OSError as exc:
            return problem("io-error", paths.log, f"cannot read the log: {exc.strerror or exc}")
        lock = PathLock(paths.lock)
        try:
            lock.acquire(ctx.lock_timeout)
        except Timeout:
            lock.close()
            return problem(
                "lock-timeout",
                paths.lock,
                f"conversation lock not acquired within {ctx.lock_timeout:g}s: not checked "
                "(a writer holds it; retry, or raise --lock-timeout)",
            )
        except Io as exc:
            lock.close()
            return problem("io-error", paths.lock, f"cannot take the conversation lock: {exc.message}")
        try:
            outcome = _check_locked(ctx, site, conversation, paths, fd, scan, on_frame)
            if on_locked is not None:
                on_locked(outcome)
            return outcome
        except OSError as exc:
            return problem("io-error", paths.log, f"I/O error during the check: {exc.strerror or exc}")
        finally:
            lock.close()
    finally:
        ops.close(fd)
        ctx.advance(max(0, size - counted))  # bytes of damaged regions were looked at too


def _check_locked(
    ctx: CheckContext,
    site: str,
    conversation: str,
    paths: ConversationPaths,
    fd: int,
    scan: LogScan,
    on_frame: Callable[[Frame], None] | None,
) -> ConversationOutcome:
    ops = ctx.ops
    scan = locked_rescan(ops, fd, scan, on_frame)
    ctx.report.bytes += scan.size
    index = ops.read_file(paths.index)
    ctx.report.index_bytes += len(index or b"")
    body = index[INDEX_HEADER_SIZE:] if index and header_ok(index) else b""
    expected = b"".join(encode_entry(meta.offset, meta.first_seq) for meta in scan.prefix.frames)

    # Step 3: the engine's own rule (file.log.recovery) decides between torn tail and corruption.
    last = scan.last
    anchor = anchor_index(index_entries(index), scan.size, lambda at: read_frame_at(ops, fd, at, scan.size))
    verdict = judge(last, anchor.evidence)
    if verdict.state is ScanState.CLEAN and last.state is ScanState.TORN:  # a v2 log's unused zero tail
        last.state, last.stop_offset, last.reason = ScanState.CLEAN, None, None
        ctx.report.preallocated_bytes += verdict.unused
    evidence: list[tuple[int, int]] = []
    if verdict.state is ScanState.CORRUPT and last.state is not ScanState.CORRUPT:
        assert verdict.stop is not None
        evidence = index_evidence(body, expected, verdict.stop)  # the acknowledged seqs, for the report
        last.state, last.stop_offset, last.reason = ScanState.CORRUPT, verdict.stop, verdict.reason

    def add(kind: str, path: str, message: str, **fields: Any) -> Finding:
        return ctx.found(kind, path, message, site=site, conversation=conversation, **fields)

    # Repairs first (their results go into the findings), bytes saved before anything is cut.
    cut: int | None = None
    saved: str | None = None
    lost: tuple[int, int | None] | None = None
    if scan.corrupt and ctx.truncate_corrupt:
        cut = scan.prefix.stop_offset
        lost = _lost_seqs(scan, evidence)
    elif last.state is ScanState.TORN and ctx.repair:
        cut = last.stop_offset
    if cut is not None:
        saved = _cut_log(ctx, paths, cut, scan.size)

    frames_by_offset: dict[int, FrameMeta] | None = None
    for i, seg in enumerate(scan.segments):
        for off in seg.timestamp_regressions:
            if frames_by_offset is None:
                frames_by_offset = {meta.offset: meta for meta in scan.all_frames()}
            meta = frames_by_offset[off]
            gone = cut is not None and off >= cut
            add(
                "timestamp-regression",
                paths.log,
                "recorded_at goes back in time at this frame (the engine never writes that)"
                + (" (removed with the corrupt region)" if gone else ""),
                offset=off,
                seqs=(meta.first_seq, meta.first_seq + meta.count - 1),
                fixed=gone,
            )
        if seg.state is ScanState.CLEAN or seg.stop_offset is None:
            continue
        fixed = cut is not None and cut <= seg.stop_offset
        if seg.state is ScanState.TORN:
            add(
                "torn-tail",
                paths.log,
                f"{seg.file_size - seg.stop_offset} unacknowledged byte(s) after the last good frame "
                f"({seg.reason}): a write that never completed"
                + (f"; truncated, bytes saved to {ctx.rel(saved)}" if fixed and saved else ""),
                offset=seg.stop_offset,
                fixed=fixed,
                saved_to=ctx.rel(saved) if fixed and saved else None,
            )
            continue
        kind = _REASON_KIND.get(seg.reason or "", seg.reason or "crc-mismatch")
        if seg.reason == "incomplete" and i < len(scan.segments) - 1:
            # The frame "runs past the end of the file", yet valid frames follow it: the file does not
            # end inside it, its length field is damaged (a flipped byte). Not truncated-frame.
            kind = "bad-length"
        seqs = lost if fixed and i == 0 else _affected(scan, i, evidence)
        if kind == "missing-frames":
            message = "the index proves acknowledged frames past the end of the log: they are gone"
        elif kind == "bad-length" and seg.reason == "incomplete":
            message = "a frame whose length runs past the end of the file, with valid frames after it"
        elif seg.reason == "seq-gap":
            message = "valid frames whose seqs do not follow each other"
        else:
            message = f"bad frame ({seg.reason}) with acknowledged data after it"
        if fixed:
            span = f"{lost[0]}..{'end' if lost[1] is None else lost[1]}" if lost else "none"
            where = f"bytes saved to {ctx.rel(saved)}" if saved else "no bytes left to save"
            message += f"; truncated at byte {cut}, seqs lost: {span}, {where}"
        else:
            message += "; left in place (only --truncate-corrupt removes it)"
        add(
            kind,
            paths.log,
            message,
            offset=seg.stop_offset,
            seqs=seqs,
            fixed=fixed,
            saved_to=ctx.rel(saved) if fixed and saved else None,
        )

    if cut is not None:  # what is left ends cleanly at the cut
        keep = next(k for k, seg in enumerate(scan.segments) if seg.stop_offset == cut)
        head = scan.segments[keep]
        head.state, head.stop_offset, head.reason, head.file_size = ScanState.CLEAN, None, None, cut
        scan = LogScan(cut, scan.segments[: keep + 1])

    if not scan.corrupt:
        found = index_problem(index, body, expected, scan.prefix.frames, log_end=scan.prefix.end)
        rebuilt = cut is not None and lost is not None  # a truncated corrupt log gets a fresh index anyway
        if found is not None or rebuilt:
            if ctx.repair:
                ops.atomic_write(paths.index, INDEX_HEADER + expected)
            if found is not None and not rebuilt:
                add(
                    found.kind,
                    paths.index,
                    found.message + ("; rebuilt from the log" if ctx.repair else ""),
                    offset=found.offset,
                    seqs=found.seqs,
                    fixed=ctx.repair,
                )

    frames = scan.all_frames()
    ctx.report.frames += len(frames)
    ctx.report.items += sum(meta.count for meta in frames)
    return ConversationOutcome(
        True, scan.corrupt, scan.entry(), scan.size, len(frames), sum(meta.count for meta in frames)
    )


def _cut_log(ctx: CheckContext, paths: ConversationPaths, cut: int, size: int) -> str | None:
    """Save [cut, size) to a .broken file, then truncate the log at ``cut`` and fsync it."""
    ops = ctx.ops
    fd = ops.open(paths.log, os.O_RDWR)
    try:
        saved = save_broken(ops, paths.log, fd, cut, size) if size > cut else None
        invalidate(ops, paths.lock)  # before the cut: readers of every process reload under the lock
        ops.ftruncate(fd, cut)
        ops.fsync(fd)
    finally:
        ops.close(fd)
    return saved


def _affected(scan: LogScan, i: int, evidence: list[tuple[int, int]]) -> tuple[int, int | None] | None:
    """Seqs affected by the stop ending segment ``i``: between its last good seq and the next segment."""
    seg = scan.segments[i]
    first = seg.next_seq
    if i + 1 < len(scan.segments):
        nxt = scan.segments[i + 1].frames[0].first_seq
        if seg.reason == "seq-gap" and nxt < first:
            return (nxt, first - 1)  # seqs written twice
        return (first, nxt - 1) if nxt > first else None  # None: garbage between frames, no seq lost
    known = max((seq for _, seq in evidence), default=None)
    return (first, known if known is not None and known >= first else None)


def _lost_seqs(scan: LogScan, evidence: list[tuple[int, int]]) -> tuple[int, int | None]:
    """Seqs a truncation at the first stop removes: everything the log or the index knows after it."""
    first = scan.prefix.next_seq
    later = [meta.first_seq + meta.count - 1 for seg in scan.segments[1:] for meta in seg.frames]
    later += [seq for _, seq in evidence]
    last = max(later, default=None)
    return (first, last if last is not None and last >= first else None)


def current_entry(ctx: CheckContext, paths: ConversationPaths, known: Entry | None) -> Entry | None:
    """A conversation's manifest entry now (None: it has no log), under its lock. The log is append-only,
    so only what was appended after ``known`` is read. If the lock is busy, ``known`` stands: the writer
    holding it records its own commit in the manifest."""
    ops = ctx.ops
    lock = PathLock(paths.lock)
    try:
        lock.acquire(ctx.lock_timeout)
    except Timeout:
        lock.close()
        return known
    except Io as exc:
        lock.close()
        if exc.errno == errno.ENOENT:  # its directory is gone: no log (a lost one is ``missing-log``)
            return None
        raise
    try:
        try:
            fd = ops.open(paths.log, os.O_RDONLY)
        except FileNotFoundError:
            return None
        try:
            size = ops.size(fd)
            if known is not None and size == known.log_size:
                return known
            if known is None or known.next_seq == 0 or size < known.log_size:
                return LogScan(size, scan_segments(ops, fd, size=size)).entry()
            tail = LogScan(
                size,
                scan_segments(
                    ops,
                    fd,
                    size=size,
                    start=known.log_size,
                    expected_seq=known.next_seq,
                    last_at=known.last_appended_at,
                ),
            )
            if not tail.all_frames():
                return known
            latest = tail.entry()
            return Entry(
                known.created_at,
                max(latest.last_appended_at, known.last_appended_at),
                latest.log_size,
                latest.next_seq,
            )
        finally:
            ops.close(fd)
    finally:
        lock.close()
