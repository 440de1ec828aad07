"""Recovery scanner: walks a log file's frames and classifies what follows the last good one.

Rules (docs/FORMAT.md, "Recovery"):
- Frames must be valid (magic, length, CRC32C, item structure) and continue the seq: frame k+1 starts
  at frame k's last seq + 1. The first frame that is not both is the *stop point* ``p``.
- Torn tail (never acknowledged; recovery truncates at ``p``): the bytes from ``p`` are an incomplete
  frame, zeros or garbage, and every valid frame found after ``p`` belongs to the same unfinished write,
  i.e. has ``write_start <= p`` (a group commit whose fsync never returned).
- Corruption (reported with the file and byte offset ``p``, never dropped): anything else, i.e. a valid
  frame of a *later* write after ``p``, or a seq gap/overlap between two valid frames.
- A frame of a format version this build does not know (``unsupported-version``) is judged like any other
  bad frame: corruption if a valid frame of a later write follows (or the index proves it acknowledged),
  else a torn tail. It is not evidence by itself: a write torn between sectors leaves the new ``LSF``
  before an old, zero or garbage version byte (the power-loss torture produced one at a frame that began
  3 bytes before a sector boundary). A newer format protects its data from older builds with the index
  (which covers every frame after a clean close) and must mark the data dir, not rely on this byte.
- Zeros from ``p`` to the end of the file are reported as such (``zero_tail``), still as a torn tail
  here: whether they are the preallocated unused tail of a v2 log is ``recovery.judge``'s decision (the
  one rule), and callers that know a frame at or after ``p`` was acknowledged (it is in the index)
  treat ``p`` as corruption regardless.

The scanner reads through ``FileOps`` and never writes: truncation is the caller's decision, taken under
the conversation lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from enum import Enum

from ..fileio import FileOps
from .frame import MAGIC_FAMILY, PREFIX_SIZE, Frame, FrameDecoder, Invalid, NeedMore, decode_frame

__all__ = [
    "ScanState",
    "FrameMeta",
    "ScanResult",
    "scan_log",
    "first_valid_frame_after",
    "zeros_to_end",
    "read_frame_at",
    "frame_at",
]

_CHUNK = 4 * 1024 * 1024


class ScanState(Enum):
    """What follows the last good frame of a scan."""

    CLEAN = "clean"  # nothing: the file ends at a frame boundary
    TORN = "torn"  # a write that never completed (never acknowledged): recovery truncates it
    CORRUPT = "corrupt"  # damage with acknowledged data after it: reported, never dropped


@dataclass(frozen=True, slots=True)
class FrameMeta:
    offset: int
    size: int
    first_seq: int
    count: int
    recorded_at: int
    version: int

    @property
    def end(self) -> int:
        return self.offset + self.size


@dataclass(slots=True)
class ScanResult:
    frames: list[FrameMeta] = field(default_factory=list)
    end: int = 0  # end of the last good frame: where the next frame goes
    next_seq: int = 0
    last_recorded_at: int | None = None
    state: ScanState = ScanState.CLEAN
    stop_offset: int | None = None  # p, for torn and corrupt
    reason: str | None = (
        None  # why the frame at p is not good (bad-magic, crc-mismatch, incomplete, seq-gap...)
    )
    file_size: int = 0
    timestamp_regressions: list[int] = field(
        default_factory=list
    )  # offsets of frames older than the previous
    last_version: int | None = None  # format version of the last good frame (None: no frame yet)
    zero_tail: bool = False  # torn, and every byte from the stop point to the end of file is zero

    @property
    def bytes_after_end(self) -> int:
        return self.file_size - self.end

    def continued_by(self, tail: ScanResult) -> ScanResult:
        """This scan and ``tail`` as one: ``tail`` scanned on from this one's end (``start=end``,
        ``expected_seq=next_seq``, ``last_recorded_at``, ``last_version``). Its frames and timestamp
        regressions come after these; the rest (where it stopped, why, the file size) is ``tail``'s."""
        return replace(
            tail,
            frames=self.frames + tail.frames,
            timestamp_regressions=self.timestamp_regressions + tail.timestamp_regressions,
        )


def scan_log(
    ops: FileOps,
    fd: int,
    *,
    start: int = 0,
    expected_seq: int = 0,
    last_recorded_at: int | None = None,
    last_version: int | None = None,
    file_size: int | None = None,
    keep_frames: bool = True,
    keep_items: bool = False,
    on_frame: Callable[[Frame], None] | None = None,
) -> ScanResult:
    """Scan from ``start`` (a frame boundary whose frame must begin at ``expected_seq``) to end of file.

    ``on_frame`` is called with every good frame, in order, as it is decoded (with its items if
    ``keep_items``): fsck's progress and ``logstore export``'s streaming use it, so they classify the log
    exactly as recovery does without holding every frame in memory."""
    size = ops.size(fd) if file_size is None else file_size
    result = ScanResult(
        end=start,
        next_seq=expected_seq,
        last_recorded_at=last_recorded_at,
        file_size=size,
        last_version=last_version,
    )
    decoder = FrameDecoder(start, keep_items=keep_items)
    pos = start
    while True:
        event = decoder.next_event()
        if isinstance(event, Frame):
            if event.first_seq != result.next_seq:
                _stop(ops, fd, result, event.offset, "seq-gap", size)
                return result
            if result.last_recorded_at is not None and event.recorded_at < result.last_recorded_at:
                result.timestamp_regressions.append(event.offset)
            if keep_frames:
                result.frames.append(
                    FrameMeta(
                        event.offset,
                        event.size,
                        event.first_seq,
                        event.count,
                        event.recorded_at,
                        event.version,
                    )
                )
            if on_frame is not None:
                on_frame(event)
            result.end = event.end
            result.last_version = event.version
            result.next_seq = event.first_seq + event.count
            result.last_recorded_at = max(event.recorded_at, result.last_recorded_at or event.recorded_at)
            continue
        if isinstance(event, NeedMore) and pos < size:
            want = max(_CHUNK, event.needed - decoder.buffered)
            chunk = ops.pread(fd, min(want, size - pos), pos)
            if not chunk:
                break
            decoder.feed(chunk)
            pos += len(chunk)
            continue
        if isinstance(event, NeedMore):
            if decoder.buffered == 0:
                return result  # clean end of file
            _stop(ops, fd, result, event.offset, "incomplete", size)
            return result
        assert isinstance(event, Invalid)
        _stop(ops, fd, result, event.offset, event.reason, size)
        return result
    return result


def _stop(ops: FileOps, fd: int, result: ScanResult, offset: int, reason: str, size: int) -> None:
    result.stop_offset = offset
    result.reason = reason
    if reason == "seq-gap":
        result.state = ScanState.CORRUPT
        return
    if reason == "bad-magic" and zeros_to_end(ops, fd, offset, size):
        result.state, result.zero_tail = ScanState.TORN, True  # nothing can follow: no frame, no damage
        return
    later = first_valid_frame_after(ops, fd, offset, size, later_write_only=True)
    result.state = ScanState.CORRUPT if later is not None else ScanState.TORN


def first_valid_frame_after(
    ops: FileOps, fd: int, offset: int, size: int, *, later_write_only: bool = False
) -> Frame | None:
    """The first valid frame starting after ``offset`` (found by its magic), or None.

    With ``later_write_only``, frames with ``write_start <= offset`` (same unfinished write as the bytes at
    ``offset``) are skipped: they do not make the bytes at ``offset`` corruption.
    """
    pos = offset + 1
    carry = b""
    while pos < size:
        chunk = ops.pread(fd, min(_CHUNK, size - pos), pos)
        if not chunk:
            return None
        window = carry + chunk
        window_base = pos - len(carry)
        hit = window.find(MAGIC_FAMILY)  # every version: a newer frame after p is not a torn tail
        while hit != -1:
            candidate = window_base + hit
            frame = frame_at(ops, fd, candidate, size)
            if frame is not None and not (later_write_only and frame.write_start <= offset):
                return frame
            hit = window.find(MAGIC_FAMILY, hit + 1)
        carry = window[-(len(MAGIC_FAMILY) - 1) :]
        pos += len(chunk)
    return None


def zeros_to_end(ops: FileOps, fd: int, offset: int, size: int) -> bool:
    """Whether every byte of ``[offset, size)`` is zero (read in 4 MiB chunks; stops at the first other)."""
    pos = offset
    while pos < size:
        chunk = ops.pread(fd, min(_CHUNK, size - pos), pos)
        if not chunk:
            return True
        if chunk.count(0) != len(chunk):
            return False
        pos += len(chunk)
    return True


def read_frame_at(
    ops: FileOps, fd: int, offset: int, size: int, *, keep_items: bool = False
) -> Frame | NeedMore | Invalid:
    """Decode the frame at ``offset`` of a file of ``size`` bytes: two preads (prefix, then the frame).
    NeedMore means the frame would extend past the end of the file."""
    probe = decode_frame(ops.pread(fd, PREFIX_SIZE, offset), 0, offset, keep_items=False)
    if not isinstance(probe, NeedMore) or probe.needed > size - offset:
        return probe
    return decode_frame(ops.pread(fd, probe.needed, offset), 0, offset, keep_items=keep_items)


def frame_at(ops: FileOps, fd: int, offset: int, size: int, *, keep_items: bool = False) -> Frame | None:
    """The valid frame at ``offset``, or None."""
    event = read_frame_at(ops, fd, offset, size, keep_items=keep_items)
    return event if isinstance(event, Frame) else None
