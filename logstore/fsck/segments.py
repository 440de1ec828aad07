"""A log as fsck sees it: every segment of good frames, continuing past each corruption from the next valid
frame (found by its magic), so that every damaged region is listed. Built on ``file.log.scanner`` only."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ..file.fileio import FileOps
from ..file.log.frame import Frame
from ..file.log.scanner import FrameMeta, ScanResult, ScanState, first_valid_frame_after, frame_at, scan_log
from ..file.manifest.codec import Entry

__all__ = ["LogScan", "scan_segments", "locked_rescan"]


@dataclass(slots=True)
class LogScan:
    """A log as the scanner sees it: segments of good frames, each ended by a stop (or the clean end).
    Segment 0 starts at byte 0; segment k+1 starts at the first valid frame after segment k's stop."""

    size: int
    segments: list[ScanResult]

    @property
    def prefix(self) -> ScanResult:
        return self.segments[0]

    @property
    def last(self) -> ScanResult:
        return self.segments[-1]

    @property
    def corrupt(self) -> bool:
        return any(seg.state is ScanState.CORRUPT for seg in self.segments)

    def all_frames(self) -> list[FrameMeta]:
        return [meta for seg in self.segments for meta in seg.frames]

    def entry(self) -> Entry:
        """The manifest entry these frames imply (created_at from seq 0, newest recorded_at, good end)."""
        frames = self.all_frames()
        if not frames:
            return Entry(-1, -1, 0, 0)
        created = frames[0].recorded_at if frames[0].first_seq == 0 else -1
        last_good = self.segments[-1] if self.segments[-1].frames else self.segments[0]
        newest = max(meta.recorded_at for meta in frames)
        return Entry(created, newest, last_good.end, max(seg.next_seq for seg in self.segments))


def scan_segments(
    ops: FileOps,
    fd: int,
    *,
    size: int,
    start: int = 0,
    expected_seq: int = 0,
    last_at: int | None = None,
    last_version: int | None = None,
    on_frame: Callable[[Frame], None] | None = None,
) -> list[ScanResult]:
    """``scan_log`` from ``start``, then again after every corruption from the next valid frame."""
    segments: list[ScanResult] = []
    while True:
        result = scan_log(
            ops,
            fd,
            start=start,
            expected_seq=expected_seq,
            last_recorded_at=last_at,
            last_version=last_version,
            file_size=size,
            on_frame=on_frame,
        )
        segments.append(result)
        if result.state is not ScanState.CORRUPT or result.stop_offset is None:
            return segments
        if result.reason == "seq-gap":  # the frame at the stop point is valid; it starts the next segment
            nxt = frame_at(ops, fd, result.stop_offset, size)
        else:
            nxt = first_valid_frame_after(ops, fd, result.stop_offset, size)
        if nxt is None:
            return segments
        start, expected_seq, last_at, last_version = nxt.offset, nxt.first_seq, result.last_recorded_at, None


def locked_rescan(ops: FileOps, fd: int, scan: LogScan, on_frame: Callable[[Frame], None] | None) -> LogScan:
    """Bring an unlocked scan up to date under the lock (see the module docstring, step 2)."""
    size = ops.size(fd)
    last = scan.last
    if size == scan.size and last.state is ScanState.CLEAN:
        return scan  # nothing appended; a torn tail is re-read below (it may have been cut and rewritten)
    damaged = len(scan.segments) > 1 or last.state is ScanState.CORRUPT
    if size < scan.size or damaged:
        # Cut back (a repair elsewhere), or damage seen without the lock: start over. A writer fills a v2
        # log's preallocated tail without changing its size, so an unlocked scan can read a hole that
        # is being filled; damage counts only as seen under the lock.
        return LogScan(size, scan_segments(ops, fd, size=size, on_frame=on_frame))
    tail = scan_segments(
        ops,
        fd,
        size=size,
        start=last.end,
        expected_seq=last.next_seq,
        last_at=last.last_recorded_at,
        last_version=last.last_version,
        on_frame=on_frame,
    )
    return LogScan(size, [*scan.segments[:-1], last.continued_by(tail[0]), *tail[1:]])
