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
   Else, if the last good frame is v2 and every byte from ``stop`` to the end of the file is zero, that
   is the preallocated, unused tail: clean (``unused`` bytes). Else a torn tail is never-acknowledged
   bytes (truncate at ``stop``), and a clean scan is clean. A hole (zeros or garbage) followed by a valid
   frame of a later write is corruption (the scanner's step): each group is one in-order pwrite and
   one fdatasync, so a later write proves the bytes before it were acknowledged. Zeros after a *v1*
   frame stay a torn tail, as in v1.

Everything here only reads; truncation is the caller's decision, taken under the conversation lock.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

from ..fileio import FileOps
from .commit_point import PointFile, decode
from .frame import FORMAT_VERSION, Frame, Invalid, NeedMore, decode_header
from .index_codec import ENTRY_SIZE, decode_entry, encode_entry
from .scanner import ScanResult, ScanState, read_frame_at, scan_log

__all__ = [
    "NO_ANCHOR",
    "EMPTY_STATE",
    "Evidence",
    "IndexAnchor",
    "Verdict",
    "Recovered",
    "LogState",
    "anchor_index",
    "judge",
    "recover",
    "with_created_at",
    "recovered_state",
    "rescanned_state",
    "absorb",
]

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
    unused: int = 0  # clean: preallocated zero bytes after ``end`` (a v2 log's unused tail)


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
    if scan.state is ScanState.TORN and scan.zero_tail and (scan.last_version or 0) >= 2:
        return Verdict(ScanState.CLEAN, scan.end, None, None, unused=scan.file_size - scan.end)
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
        last_version=anchor.frame.version if anchor.frame is not None else None,
        file_size=size,
        keep_frames=keep_frames,
    )
    return Recovered(anchor, scan, judge(scan, anchor.evidence))


@dataclass(frozen=True, slots=True)
class LogState:
    """A conversation's published state: what recovery found, then replaced whole by every commit and
    refresh (``dataclasses.replace``). Readers take the reference once and use it without a lock; it
    names the descriptors it was read through (``generation``), the only ones its frames are read by.

    ``entries`` is shared, append-only storage: a state owns its first ``frames`` entries, and a newer
    state only ever appends after them (a rebuild starts a new buffer), so an older reference stays
    valid while it is read."""

    entries: bytearray  # index entries (offset, first seq, check) of every good frame, in log order
    frames: int = 0
    end: int = 0  # end of the last good frame: where the next frame goes
    next_seq: int = 0
    created_at: int | None = None  # recorded_at of frame 0
    last_at: int | None = None  # max recorded_at so far
    corrupt: tuple[int, str] | None = None  # (offset, reason): appends refused, reads stop there
    torn_at: int | None = None  # a torn tail starts here (truncated by the next locked refresh)
    version: int = FORMAT_VERSION  # of the last good frame: what the log is appended in (v1 stays v1)
    size: int = 0  # the file's size as last seen: ``end`` plus a v2 log's preallocated zero tail
    point: bytes = b""  # the commit point record (logstore.file.log.commit_point) this state agrees with
    generation: int = 0  # the descriptors it was read through (``LogFiles``): readers pread only those


EMPTY_STATE = LogState(bytearray())
_new = object.__new__
(_SET_ENTRIES, _SET_FRAMES, _SET_END, _SET_NEXT, _SET_CREATED, _SET_LAST, _SET_CORRUPT, _SET_TORN,
 _SET_VERSION, _SET_SIZE, _SET_POINT, _SET_GENERATION) = (
    getattr(LogState, name).__set__ for name in LogState.__slots__
)
assert LogState.__slots__ == tuple(f for f in LogState.__dataclass_fields__), "state_of's order"


def state_of(
    entries: bytearray,
    frames: int,
    end: int,
    next_seq: int,
    created_at: int | None,
    last_at: int | None,
    corrupt: tuple[int, str] | None,
    torn_at: int | None,
    version: int,
    size: int,
    point: bytes,
    generation: int,
) -> LogState:
    """``LogState(...)`` with every field, in field order, for the one built on every commit: the frozen
    dataclass's ``__init__`` sets each field through ``object.__setattr__``; the slots' own descriptors
    do the same in a third of the time (docs/PERFORMANCE.md, issue 35)."""
    state = _new(LogState)
    _SET_ENTRIES(state, entries)
    _SET_FRAMES(state, frames)
    _SET_END(state, end)
    _SET_NEXT(state, next_seq)
    _SET_CREATED(state, created_at)
    _SET_LAST(state, last_at)
    _SET_CORRUPT(state, corrupt)
    _SET_TORN(state, torn_at)
    _SET_VERSION(state, version)
    _SET_SIZE(state, size)
    _SET_POINT(state, point)
    _SET_GENERATION(state, generation)
    return state


def recovered_state(recovered: Recovered, entries: bytearray) -> LogState:
    """The state a recovery describes: the index ``entries`` (header stripped) cut to the anchor, then
    the frames scanned after it, then the verdict. ``entries`` becomes the state's storage."""
    anchor = recovered.anchor
    if anchor.frame is None:
        return absorb(LogState(bytearray()), recovered.scan, recovered.verdict)
    del entries[anchor.kept * ENTRY_SIZE :]
    state = LogState(
        entries,
        frames=anchor.kept,
        end=anchor.frame.end,
        next_seq=anchor.next_seq,
        last_at=anchor.frame.recorded_at,
        version=anchor.frame.version,
    )
    return absorb(state, recovered.scan, recovered.verdict)


def absorb(state: LogState, scan: ScanResult, verdict: Verdict) -> LogState:
    """``state`` followed by a scan's frames (scanned from ``state.end``) and its verdict."""
    entries = state.entries
    del entries[state.frames * ENTRY_SIZE :]  # never more than the state owns (defensive: a no-op)
    frames, end, next_seq, last_at = state.frames, state.end, state.next_seq, state.last_at
    version = state.version
    for meta in scan.frames:
        entries += encode_entry(meta.offset, meta.first_seq)
        frames += 1
        end, next_seq, version = meta.end, meta.first_seq + meta.count, meta.version
        last_at = meta.recorded_at if last_at is None else max(meta.recorded_at, last_at)
    corrupt, torn_at = state.corrupt, state.torn_at
    if verdict.state is ScanState.CORRUPT:
        assert verdict.stop is not None and verdict.reason is not None
        corrupt = (verdict.stop, verdict.reason)
    elif verdict.state is ScanState.TORN:
        torn_at = verdict.stop
    return replace(
        state,
        frames=frames,
        end=end,
        next_seq=next_seq,
        last_at=last_at,
        corrupt=corrupt,
        torn_at=torn_at,
        version=version,
        size=max(scan.file_size, end),
    )


def rescanned_state(scan: ScanResult, believed_end: int) -> LogState:
    """The state after a full rescan (``scan`` from byte 0) of a log whose frames up to ``believed_end``
    were served as acknowledged: a scan stopping inside them is corruption, never a torn tail (a clean
    shorter log was cut back by a repair: take it)."""
    evidence = None
    if scan.state is not ScanState.CLEAN and believed_end > 0:
        evidence = Evidence(believed_end - 1, "corrupt")
    return recovered_state(Recovered(NO_ANCHOR, scan, judge(scan, evidence)), bytearray())


def with_created_at(ops: FileOps, fd: int | None, state: LogState) -> LogState:
    """``state`` with the conversation's creation time (its first frame's) if it lacks one."""
    if state.created_at is not None or state.next_seq == 0 or fd is None:
        return state
    header = decode_header(ops.pread(fd, 64, 0))
    return replace(state, created_at=header.recorded_at if header else state.last_at)


def extended(
    ops: FileOps, fd: int, point_file: PointFile, state: LogState, raw: bytes, *, epoch: bytes, ino: int
) -> LogState | None:
    """``state`` (of the log open as ``fd``, inode ``ino``, in ``epoch``) with the frames the commit point
    ``raw`` vouches for past it taken in (durable, so no verdict to make), agreeing with ``raw``; None if
    the record does not simply extend ``state`` in the same epoch (the caller reloads). Without the file
    lock, the record is read again through ``point_file`` after the scan (a seqlock: a tool invalidates it
    before it cuts)."""
    point = decode(raw)
    if (
        point is None
        or point.epoch != epoch
        or not point.trusted_for(ino)
        or point.end < state.end
        or point.damage is not None
        or state.corrupt is not None
    ):
        return None
    if point.end > state.end:
        result = scan_log(
            ops,
            fd,
            start=state.end,
            expected_seq=state.next_seq,
            last_recorded_at=state.last_at,
            last_version=state.version,
            file_size=point.end,
        )
        if result.state is not ScanState.CLEAN or result.end != point.end:
            return None
        again = decode(point_file.read())
        if again is None or again.epoch != point.epoch or again.ino != point.ino:
            return None
        state = replace(absorb(state, result, judge(result, None)), size=max(state.size, point.end))
    if state.next_seq != point.next_seq:
        return None
    return with_created_at(ops, fd, replace(state, point=raw))
