"""Reading a conversation log as an operator does: frame by frame (``logstore dump``) and item by item
(``logstore export``). Both only read; neither needs a server.

- ``dump_frames`` shows every frame as it is on disk, bad ones included (header fields without the CRC
  check, then a resync to the next valid frame found by its magic), like ``kafka-dump-log``. It takes no
  lock: it is a diagnostic and shows in-flight bytes as they are.
- ``export_items`` streams a consistent snapshot: under the conversation lock (held only briefly) it finds
  the end of the last acknowledged frame with the engine's own rule (``file.log.recovery.recover``); then,
  without the lock, the scanner streams every item before that end. Appends made meanwhile are not
  included. Corruption raises ``Corrupted`` (file and offset) after everything before it was
  written; memory stays constant (the scanner's read buffer).
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from typing import BinaryIO

import msgspec

from ..core.errors import Corrupted
from ..core.imported import export_line, export_time
from ..file.fileio import FileOps
from ..file.layout import ConversationPaths
from ..file.locking import held
from ..file.log.frame import MAX_FRAME_SIZE, Frame, NeedMore, decode_frame, decode_header
from ..file.log.index_codec import ENTRY_SIZE, decode_entry, index_entries
from ..file.log.recovery import Verdict, recover
from ..file.log.scanner import ScanState, first_valid_frame_after, frame_at, scan_log, zeros_to_end

__all__ = ["DumpRecord", "dump_frames", "export_items", "acknowledged_end"]


@dataclass(frozen=True, slots=True)
class DumpRecord:
    """One frame (``status`` "ok"), or a bad region: ``status`` is the reason, ``size`` the bytes up to
    the next valid frame (or the end of file), header fields as the unverified header says (or None)."""

    offset: int
    size: int
    status: str
    first_seq: int | None = None
    count: int | None = None
    recorded_at: int | None = None
    write_start: int | None = None
    items: tuple[bytes, ...] = ()

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    @property
    def unused(self) -> bool:
        """Zeros from here to the end of a log whose last frame is v2: preallocated, not damage."""
        return self.status == "unused"


def _index_entries(ops: FileOps, paths: ConversationPaths) -> bytes:
    return index_entries(ops.read_file(paths.index))


def _seek_seq(ops: FileOps, fd: int, entries: bytes, seq: int, size: int) -> int:
    """Offset of a frame at or before the one holding ``seq``, from the index if it checks out, else 0."""
    lo, hi = 0, len(entries) // ENTRY_SIZE
    while lo < hi:  # last entry with first_seq <= seq (entries are in seq order; each one is verified)
        mid = (lo + hi) // 2
        entry = decode_entry(entries, mid)
        if entry is None:
            return 0
        if entry[1] <= seq:
            lo = mid + 1
        else:
            hi = mid
    entry = decode_entry(entries, lo - 1) if lo else None
    if entry is None or entry[0] >= size:
        return 0
    frame = frame_at(ops, fd, entry[0], size)
    return entry[0] if frame is not None and frame.first_seq == entry[1] else 0


def dump_frames(
    ops: FileOps, paths: ConversationPaths, *, from_seq: int = 0, items: bool = False
) -> Iterator[DumpRecord]:
    """Every frame (and bad region) of the log, from the frame holding ``from_seq`` on."""
    fd = ops.open(paths.log, os.O_RDONLY)
    try:
        size = ops.size(fd)
        pos = _seek_seq(ops, fd, _index_entries(ops, paths), from_seq, size) if from_seq else 0
        version = 0  # of the last good frame
        while pos < size:
            frame = frame_at(ops, fd, pos, size, keep_items=items)
            if frame is not None:
                if frame.first_seq + frame.count > from_seq:
                    yield DumpRecord(
                        frame.offset,
                        frame.size,
                        "ok",
                        frame.first_seq,
                        frame.count,
                        frame.recorded_at,
                        frame.write_start,
                        frame.items,
                    )
                pos, version = frame.end, frame.version
                continue
            if version >= 2 and zeros_to_end(ops, fd, pos, size):  # the rule of recovery.judge
                yield DumpRecord(pos, size - pos, "unused")
                return
            buf = ops.pread(fd, min(size - pos, MAX_FRAME_SIZE), pos)
            event = decode_frame(buf, 0, pos, keep_items=False)
            reason = "incomplete" if isinstance(event, NeedMore) else getattr(event, "reason", "invalid")
            nxt = first_valid_frame_after(ops, fd, pos, size)
            end = nxt.offset if nxt is not None else size
            fields = decode_header(buf)
            if fields is not None:
                yield DumpRecord(pos, end - pos, reason, fields.first_seq, fields.count, fields.recorded_at)
            else:
                yield DumpRecord(pos, end - pos, reason)
            pos = end
    finally:
        ops.close(fd)


def acknowledged_end(ops: FileOps, paths: ConversationPaths, fd: int) -> Verdict:
    """Where acknowledged data ends in the open log ``fd`` and whether it is damaged: the engine's own
    rule (``file.log.recovery``), so export, backup and the engine agree on every log. Caller holds the
    lock."""
    return recover(ops, fd, _index_entries(ops, paths), ops.size(fd), keep_frames=False).verdict


def export_items(
    ops: FileOps,
    paths: ConversationPaths,
    out: BinaryIO,
    *,
    lock_timeout: float = 5.0,
) -> int:
    """Write the conversation as JSON Lines (``{"seq":..,"recorded_at":"..","payload":{..}}``, the payload
    verbatim) to ``out``; return the number of items. Raises ``Corrupted`` (after writing every item
    before the bad spot) and ``Timeout`` (lock). An unknown conversation writes nothing."""
    try:
        fd = ops.open(paths.log, os.O_RDONLY)
    except FileNotFoundError:
        return 0
    written = 0
    try:
        with held(paths.lock, lock_timeout):
            verdict = acknowledged_end(ops, paths, fd)

        def emit(frame: Frame) -> None:
            nonlocal written
            at = export_time(frame.recorded_at)
            lines: list[bytes] = []
            for k, raw in enumerate(frame.items):
                if not raw.startswith(b"{") or not _is_json(raw):
                    out.write(b"".join(lines))
                    written += len(lines)
                    raise _corrupted(paths, frame.offset, f"item {frame.first_seq + k} is not a JSON object")
                lines.append(export_line(frame.first_seq + k, at, raw))
            out.write(b"".join(lines))
            written += len(lines)

        result = scan_log(ops, fd, file_size=verdict.end, keep_frames=False, keep_items=True, on_frame=emit)
        if result.state is not ScanState.CLEAN:  # bytes before the acknowledged end must all be good
            raise _corrupted(paths, result.stop_offset or result.end, result.reason or "corrupt")
        if verdict.state is ScanState.CORRUPT:
            assert verdict.stop is not None and verdict.reason is not None
            raise _corrupted(paths, verdict.stop, verdict.reason)
        return written
    finally:
        ops.close(fd)


def _is_json(raw: bytes) -> bool:
    try:
        msgspec.json.decode(raw, type=msgspec.Raw)
    except msgspec.DecodeError:
        return False
    return True


def _corrupted(paths: ConversationPaths, offset: int, reason: str) -> Corrupted:
    return Corrupted(
        f"conversation log {paths.log} is corrupted at byte {offset} ({reason})",
        path=paths.log,
        offset=offset,
    )
