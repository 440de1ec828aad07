"""What a load of a conversation log finds (``LogFiles`` installs it): without the file lock, only what
the commit point vouches for (``vouched_state``); under it, recovery's whole rule, by mode
(``state_under_lock``; ``LogFiles.load_locked`` then makes what it found durable and moves the record).

Without the lock: the record (read again if a concurrent ``pwrite`` tore it) must be this boot's, for
this log, and the log must agree with it up to its ``end`` (a clean scan, the same next seq), and the
record must not have moved meanwhile (a seqlock: a tool invalidates it before it cuts). Anything else
is None: only recovery under the lock can tell.

Under the lock, three modes, chosen by what the caller knows:
- ``RESCAN``: the index disagreed with the log while frames up to ``believed_end`` were served: ignore
  the index, scan from byte 0 (``rescanned_state`` says whether the scan stops inside what was served).
- ``VOUCHED_DAMAGE``: the record (this boot's, this log's) carries damage found by an earlier scan that
  this one may not repeat (the index anchors past it): keep that verdict with the frames before it, if
  the log still holds them; else judge the whole log again (``INDEXED``).
- ``INDEXED``: the usual one: anchor on the index, scan from its last entry to the end of the file.
"""

from __future__ import annotations

import enum
import logging
from dataclasses import replace

from ..fileio import FileOps
from .commit_point import CommitPoint, PointFile, decode
from .recovery import LogState, Recovered, recover, recovered_state, rescanned_state, with_created_at
from .scanner import ScanState, scan_log
from .seq_index import SidecarIndex

__all__ = ["Mode", "mode_of", "state_under_lock", "vouched_state"]

log = logging.getLogger("logstore")


class Mode(enum.Enum):
    INDEXED = "indexed"
    VOUCHED_DAMAGE = "vouched damage"
    RESCAN = "rescan"


def mode_of(point: CommitPoint | None, *, same_log: bool, believed_end: int | None) -> Mode:
    if believed_end is not None:
        return Mode.RESCAN
    if same_log and point is not None and point.damage is not None:
        return Mode.VOUCHED_DAMAGE
    return Mode.INDEXED


def state_under_lock(
    ops: FileOps,
    fd: int,
    index: SidecarIndex,
    point: CommitPoint | None,
    *,
    mode: Mode,
    size: int,
    believed_end: int | None,
) -> LogState:
    """The log's state as recovery judges it (torn tail and damage included: the caller acts on them),
    ``size`` the log's size. Raises ``OSError``."""
    if mode is Mode.RESCAN:
        assert believed_end is not None
        scan = scan_log(ops, fd, start=0, expected_seq=0, file_size=size)
        index.open_and_read()  # open, and valid = 0: rewritten whole from the rescan
        return rescanned_state(scan, believed_end)
    if mode is Mode.VOUCHED_DAMAGE:
        assert point is not None and point.damage is not None
        entries = index.open_and_read()
        recovered = _recover(ops, fd, index, entries, point.end)
        if recovered.verdict.end == point.end:  # the good prefix it vouched for
            return replace(recovered_state(recovered, entries), corrupt=point.damage)
        # not what the record says: judge the whole log again
    entries = index.open_and_read()
    return recovered_state(_recover(ops, fd, index, entries, size), entries)


def _recover(ops: FileOps, fd: int, index: SidecarIndex, entries: bytearray, bound: int) -> Recovered:
    recovered = recover(ops, fd, entries, bound)
    if recovered.anchor.wrong:
        log.warning("index %s disagrees with the log; rebuilding", index.path)
    index.valid = recovered.anchor.kept
    return recovered


def vouched_state(
    ops: FileOps, fd: int, point_file: PointFile, index: SidecarIndex, *, ino: int
) -> tuple[LogState, bytes] | None:
    """The state of the log open as ``fd`` (inode ``ino``) up to what its commit point vouches for, and
    the record's epoch; None when only recovery under the lock can tell (no record, another boot's,
    another file, damage it does not name, a log that disagrees, a record that moved). Raises
    ``OSError``."""
    raw = point_file.load()
    point = decode(raw)
    for _again in range(2):  # a read racing the record's pwrite may see it half written
        if point is not None:
            break
        raw = point_file.read()
        point = decode(raw)
    if point is None or not point.trusted_for(ino):
        return None
    entries = index.open_and_read()
    recovered = recover(ops, fd, entries, point.end)
    verdict = recovered.verdict
    # With damage, index entries past ``end`` make the bounded scan's verdict "missing-frames" at
    # ``end``: the same good prefix, which is all that has to agree.
    if verdict.end != point.end or (verdict.state is not ScanState.CLEAN and point.damage is None):
        return None
    if recovered.scan.next_seq != point.next_seq or point_file.read() != raw:
        return None  # the record moved while we read: start over
    # Damage past ``end`` was judged under the lock by whoever wrote the record: the same verdict.
    size = ops.size(fd)  # with a v2 log's preallocated tail (trimmed on close)
    state = recovered_state(recovered, entries)
    state = replace(state, point=raw, corrupt=point.damage, size=max(size, point.end))
    index.valid = recovered.anchor.kept
    return with_created_at(ops, fd, state), point.epoch
