"""One log of a backup or restore: bring the destination's copy up to the source's acknowledged end
(``backup`` has the whole procedure), never writing a copy that has another name in place, and compute
the copy's content digest (``backup_manifest.log_digest``) as it goes. Every path in the destination and
in a restore's source is opened ``O_NOFOLLOW``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from crc32c import crc32c

from ..file.fileio import FileOps
from ..file.layout import ConversationPaths, conversation_paths
from ..file.locking import held
from ..file.log.frame import decode_header
from ..file.log.index_codec import (
    ENTRY_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    decode_entry,
    encode_entry,
    header_ok,
)
from ..file.log.scanner import ScanState, frame_at, scan_log
from ..file.manifest.codec import Entry
from ..file.statx import fstat_ident
from .backup_manifest import LogRecord, log_digest, scan_counting
from .logdump import acknowledged_end

__all__ = ["Copied", "copy_log", "copy_kept"]

_CHUNK = 1 << 20


@dataclass(frozen=True, slots=True)
class Copied:
    entry: Entry | None  # None: nothing acknowledged to copy, or corrupt
    frames: int = 0  # frames the copy holds
    copied: int = 0
    whole: bool = False
    corrupt: str | None = None
    crc: int | None = None  # of the whole copy (backup_manifest.log_digest)


def copy_log(
    ops: FileOps,
    src: str,
    dst: str,
    site: str,
    cid: str,
    *,
    lock_timeout: float,
    known: dict[str, LogRecord],
    restoring: bool,
) -> Copied:
    """Bring the destination's copy of one log up to the source's acknowledged end. The source of a
    restore is a verified backup nobody writes (its data dir lock is held): no conversation lock there."""
    sp, dp = conversation_paths(src, site, cid), conversation_paths(dst, site, cid)
    record = known.get(f"{site}/{cid}")
    try:
        sfd = ops.open(sp.log, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:  # erased since the listing
        return Copied(None)
    try:
        if restoring:
            verdict = acknowledged_end(ops, sp, sfd)
        else:
            with held(sp.lock, lock_timeout):
                verdict = acknowledged_end(ops, sp, sfd)
        end = verdict.end
        if verdict.state is ScanState.CORRUPT:
            return Copied(None, corrupt=f"{site}/{cid}: {verdict.reason} at byte {verdict.stop}")
        if end == 0:
            return Copied(None)
        ops.makedirs_durable(dp.directory)
        try:
            dfd: int | None = ops.open(dp.log, os.O_RDWR | os.O_NOFOLLOW)
        except FileNotFoundError:
            dfd = None
        try:
            start, seq, last_at, index = _reusable_prefix(ops, sfd, dp, dfd, end)
            result = scan_log(
                ops, sfd, start=start, expected_seq=seq, last_recorded_at=last_at, file_size=end
            )
            # Cannot be: the end was found the same way.
            if result.state is not ScanState.CLEAN or result.end != end:
                return Copied(None, corrupt=f"{site}/{cid}: {result.reason} at byte {result.stop_offset}")
            if record is not None and record.size == start and record.crc32c is not None:
                crc = record.crc32c  # the digest of the copy's prefix, as the manifest vouched for it
            else:
                crc = log_digest(ops, dfd, start) if dfd is not None else 0
            if start < end:  # else the copy is complete already (its index is written after its sync)
                crc = _write_log(ops, sfd, dfd, dp, start, end, crc)
            header = decode_header(ops.pread(sfd, 64, 0))
        finally:
            if dfd is not None:
                ops.close(dfd)
        if restoring and record is not None and (end, crc) != (record.size, record.crc32c or crc):
            return Copied(None, corrupt=f"{site}/{cid}: not what the backup manifest lists (changed since?)")
        if start < end:
            _write_index(ops, dp, index, b"".join(encode_entry(f.offset, f.first_seq) for f in result.frames))
        assert header is not None and result.last_recorded_at is not None
        entry = Entry(header.recorded_at, result.last_recorded_at, end, result.next_seq)
        frames = len(index) // ENTRY_SIZE + len(result.frames)
        return Copied(entry, frames, end - start, start == 0, crc=crc)
    finally:
        ops.close(sfd)


def _write_log(
    ops: FileOps, sfd: int, dfd: int | None, dp: ConversationPaths, start: int, end: int, crc: int
) -> int:
    """Copy the source's bytes [start, end) after the copy's first ``start`` bytes, fdatasynced; returns
    the digest of the whole copy. In place only when the copy has no other name (``st_nlink`` 1): a copy
    that is also another backup's file (``cp -al DEST DEST.1`` rotation) or anybody's is never written;
    it is copied beside it and renamed over it, so the other name keeps its bytes."""
    if dfd is not None and start > 0 and fstat_ident(dfd).nlink == 1:
        fd, tmp = dfd, None
    else:
        tmp = f"{dp.log}.tmp-{os.getpid()}"
        try:
            ops.unlink(tmp)  # left by a killed run
        except FileNotFoundError:
            pass
        fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW)
    try:
        if tmp is not None and dfd is not None:
            for pos in range(0, start, _CHUNK):
                ops.pwrite(fd, ops.pread(dfd, min(_CHUNK, start - pos), pos), pos)
        for pos in range(start, end, _CHUNK):
            chunk = ops.pread(sfd, min(_CHUNK, end - pos), pos)
            crc = crc32c(chunk, crc)
            ops.pwrite(fd, chunk, pos)
        if ops.size(fd) != end:
            ops.ftruncate(fd, end)
        ops.fdatasync(fd)
    finally:
        if tmp is not None:
            ops.close(fd)
    if tmp is not None:
        ops.rename(tmp, dp.log)
        ops.fsync_dir(dp.directory)
    return crc


def _reusable_prefix(
    ops: FileOps, sfd: int, dp: ConversationPaths, dfd: int | None, end: int
) -> tuple[int, int, int | None, bytes]:
    """(offset, next seq, last recorded_at, index entries) of the destination's copy when it is a prefix
    of the source: its index is whole and its last frame is byte-identical in the source. Else a fresh
    start."""
    fresh = (0, 0, None, b"")
    if dfd is None:
        return fresh
    data = _read_nofollow(ops, dp.index)
    if not header_ok(data) or (len(data) - INDEX_HEADER_SIZE) % ENTRY_SIZE:
        return fresh
    entries = data[INDEX_HEADER_SIZE:]
    n = len(entries) // ENTRY_SIZE
    last = decode_entry(entries, n - 1) if n else None
    size = ops.size(dfd)
    if last is None or size > end:
        return fresh
    frame = frame_at(ops, dfd, last[0], size)
    if frame is None or frame.first_seq != last[1] or frame.end != size:
        return fresh
    if ops.pread(sfd, frame.size, frame.offset) != ops.pread(dfd, frame.size, frame.offset):
        return fresh
    return frame.end, frame.first_seq + frame.count, frame.recorded_at, entries


def copy_kept(ops: FileOps, dp: ConversationPaths, record: LogRecord | None) -> Copied:
    """The destination's existing copy, kept when the source log is corrupt: its manifest entry, frame
    count and digest (entry None if there is no clean copy, or none the last manifest vouched for)."""
    try:
        fd = ops.open(dp.log, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return Copied(None)
    try:
        result, frames = scan_counting(ops, fd)
        header = decode_header(ops.pread(fd, 64, 0))
        if result.state is not ScanState.CLEAN or result.last_recorded_at is None or header is None:
            return Copied(None)
        crc = log_digest(ops, fd, result.end)
        if record is not None and record.crc32c not in (None, crc):
            return Copied(None)  # not the copy the last backup vouched for
        entry = Entry(header.recorded_at, result.last_recorded_at, result.end, result.next_seq)
        return Copied(entry, frames, crc=crc)
    finally:
        ops.close(fd)


def _read_nofollow(ops: FileOps, path: str) -> bytes:
    try:
        fd = ops.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return b""
    try:
        return ops.pread(fd, ops.size(fd), 0)
    finally:
        ops.close(fd)


def _write_index(ops: FileOps, dp: ConversationPaths, kept: bytes, new: bytes) -> None:
    """The copy's index: extended in place when it has no other name, else written beside and renamed
    (as ``_write_log``)."""
    try:
        fd: int | None = ops.open(dp.index, os.O_RDWR | os.O_NOFOLLOW)
    except FileNotFoundError:
        fd = None
    if fd is None or fstat_ident(fd).nlink != 1 or not kept:
        if fd is not None:
            ops.close(fd)
        ops.atomic_write(dp.index, INDEX_HEADER + kept + new)
        return
    try:
        ops.pwrite(fd, new, INDEX_HEADER_SIZE + len(kept))
        ops.ftruncate(fd, INDEX_HEADER_SIZE + len(kept) + len(new))
        ops.fdatasync(fd)
    finally:
        ops.close(fd)
