"""What recovery under the file lock finds in a log, by mode (``LogFiles.load_locked`` then makes it
durable and moves the commit point).

Three modes, chosen by what the caller knows:
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
from .commit_point import CommitPoint
from .recovery import LogState, Recovered, recover, recovered_state, rescanned_state
from .scanner import scan_log
from .seq_index import SidecarIndex

__all__ = ["Mode", "mode_of", "state_under_lock"]

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
