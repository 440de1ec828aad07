"""Where acknowledged data ends: the ONE rule, used by the engine (``ConversationLog`` on open), fsck
(``fsck.check_log``) and export (``fsck.logdump``), so all three give the same verdict on any log.

The rule (docs/FORMAT.md, "Recovery"):
1. Index anchor. Walk the index back from its last entry. Unchecked entries (torn or zeroed: the index
   is not fsynced) are dropped. The first entry whose frame is good and has the entry's seq is the
   anchor: everything up to its frame is acknowledged and is not rescanned. A checked entry whose frame
   is bad or missing is *evidence*: entries are written only after their frame's fdatasync, so the bytes
   it points at were acknowledged. A good frame with another seq means the index is wrong, not the log:
   no anchor, no evidence (scan from byte 0).
2. Scan from the anchor (``scanner.scan_log``): clean end, torn tail, or corruption.
3. Verdict. Corruption stays corruption. Otherwise let ``stop`` be where the good frames stop (the torn
   tail's start, or the end of a clean scan). If evidence points at or past ``stop``, acknowledged bytes
   are damaged or gone: corruption at ``stop`` (``missing-frames`` when the log simply ends early).
   Else a torn tail is never-acknowledged bytes (truncate at ``stop``), and a clean scan is clean.

Everything here only reads; truncation is the caller's decision, taken under the conversation lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from .fileio import FileOps
from .frame import Frame, Invalid, NeedMore
from .index_codec import ENTRY_SIZE, decode_entry
from .scanner import ScanResult, ScanState, read_frame_at, scan_log

__all__ = ["NO_ANCHOR", "Evidence", "IndexAnchor", "Verdict", "Recovered", "anchor_index", "judge", "recover"]

FrameReader = Callable[[int], Frame | NeedMore | Invalid]  # offset -> what is there


@dataclass(frozen=True, slots=True)
class Evidence:
    """A checked index entry past the anchor: the frame at ``offset`` was acknowledged, yet it is bad
    (``reason``) or missing (``offset`` is then the file size)."""

    offset: int
    reason: str


@dataclass(frozen=True, slots=True)
class IndexAnchor:
    kept: int  # leading index entries that stay valid (the last one is the anchor's)
    frame: Frame | None  # the anchor frame; None: scan from byte 0
    evidence: Evidence | None  # the lowest offset a checked entry past the anchor points at
    wrong: bool = False  # an entry named a good frame with another seq: the index is wrong

    @property
    def start(self) -> int:
        return self.frame.end if self.frame is not None else 0

    @property
    def next_seq(self) -> int:
        return self.frame.last_seq + 1 if self.frame is not None else 0

    @property
    def last_recorded_at(self) -> int | None:
        return self.frame.recorded_at if self.frame is not None else None


NO_ANCHOR = IndexAnchor(0, None, None)  # a scan from byte 0 without an index


@dataclass(frozen=True, slots=True)
class Verdict:
    state: ScanState
    end: int  # end of the last good frame: the acknowledged end unless corrupt
    stop: int | None  # torn: truncate here; corrupt: the damage is reported here; clean: None
    reason: str | None  # why the bytes at ``stop`` are not good (a frame reason or missing-frames)


@dataclass(frozen=True, slots=True)
class Recovered:
    anchor: IndexAnchor
    scan: ScanResult
    verdict: Verdict


def anchor_index(entries: bytes | bytearray, size: int, read_frame: FrameReader) -> IndexAnchor:
    """Step 1 of the rule over the index ``entries`` (header stripped) of a log of ``size`` bytes."""
    n = len(entries) // ENTRY_SIZE
    evidence: Evidence | None = None
    while n > 0:
        entry = decode_entry(entries, n - 1)
        if entry is None:  # torn or zeroed entry: just drop it
            n -= 1
            continue
        offset, first_seq = entry
        frame = read_frame(offset) if offset < size else None
        if isinstance(frame, Frame) and frame.first_seq == first_seq:
            return IndexAnchor(n, frame, evidence)
        if isinstance(frame, Frame):  # a good frame with another seq: the index is wrong, not the log
            return IndexAnchor(0, None, None, wrong=True)
        reason = frame.reason if isinstance(frame, Invalid) else "missing" if offset >= size else "incomplete"
        evidence = Evidence(min(offset, size), reason)
        n -= 1
    return IndexAnchor(0, None, evidence)


def judge(scan: ScanResult, evidence: Evidence | None) -> Verdict:
    """Step 3 of the rule: the verdict on a scan given the index's evidence."""
    if scan.state is ScanState.CORRUPT:
        stop = scan.stop_offset if scan.stop_offset is not None else scan.end
        return Verdict(ScanState.CORRUPT, scan.end, stop, scan.reason or "corrupt")
    stop = scan.stop_offset if scan.state is ScanState.TORN and scan.stop_offset is not None else scan.end
    if evidence is not None and stop <= evidence.offset:
        return Verdict(ScanState.CORRUPT, scan.end, stop, scan.reason or "missing-frames")
    if scan.state is ScanState.TORN:
        return Verdict(ScanState.TORN, scan.end, stop, scan.reason)
    return Verdict(ScanState.CLEAN, scan.end, None, None)


def recover(
    ops: FileOps,
    fd: int,
    entries: bytes | bytearray,
    size: int,
    *,
    keep_frames: bool = True,
) -> Recovered:
    """The whole rule on an open log of ``size`` bytes and its index entries (header stripped)."""
    anchor = anchor_index(entries, size, lambda offset: read_frame_at(ops, fd, offset, size))
    scan = scan_log(
        ops,
        fd,
        start=anchor.start,
        expected_seq=anchor.next_seq,
        last_recorded_at=anchor.last_recorded_at,
        file_size=size,
        keep_frames=keep_frames,
    )
    return Recovered(anchor, scan, judge(scan, anchor.evidence))
