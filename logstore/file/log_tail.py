"""The end of a conversation log: cutting off what was never acknowledged.

Three cases, all decided by the conversation under its I/O lock and the cross-process file lock, and
all only ever *remove* unacknowledged bytes:
- a torn tail found by recovery (``truncate_torn``);
- a failed write or fdatasync (``cut_back``, best effort: the handle is poisoned either way);
- a failed write whose cleanup failed too (``cut_failed_write``): after fsyncgate its bytes may read
  back as valid frames from the page cache although the disk never got them, so the next commit cuts
  them off before building on them - unless another writer already appended after them.
"""

from __future__ import annotations

import logging

from .fileio import FileOps
from .frame import Frame
from .scanner import read_frame_at

__all__ = ["truncate_torn", "cut_back", "cut_failed_write"]

log = logging.getLogger("logstore")


def truncate_torn(ops: FileOps, fd: int, end: int, *, path: str) -> None:
    """Cut a torn tail at ``end`` (the end of the last good frame) durably. Raises ``OSError``."""
    log.warning(
        "truncating torn tail of %s at offset %d (%d unacknowledged bytes)", path, end, ops.size(fd) - end
    )
    ops.ftruncate(fd, end)
    ops.fdatasync(fd)


def cut_back(ops: FileOps, fd: int, end: int) -> bool:
    """Best effort after a failed write: cut the file back to the acknowledged ``end``, durably.
    False if that failed (the caller then remembers ``end`` as unsafe: see ``cut_failed_write``)."""
    try:
        ops.ftruncate(fd, end)
        ops.fdatasync(fd)
    except OSError:
        return False
    return True


def cut_failed_write(ops: FileOps, fd: int, cut: int, end: int, *, path: str) -> bool:
    """Cut the log at ``cut`` (durably) if ``[cut, end)`` holds only frames of the failed write that
    began there; leave it (False) if another writer already appended after them. Raises ``OSError``."""
    size = ops.size(fd)
    pos = cut
    while pos < end:
        frame = read_frame_at(ops, fd, pos, size)
        if not isinstance(frame, Frame) or frame.write_start != cut:
            log.warning(
                "log %s: frames after a failed write at offset %d were appended by another writer; "
                "leaving them",
                path,
                cut,
            )
            return False
        pos = frame.end
    log.warning("log %s: cutting a failed write at offset %d before appending", path, cut)
    ops.ftruncate(fd, cut)
    ops.fdatasync(fd)
    return True
