"""The end of a conversation log: the preallocated tail of a v2 log, and cutting off what was never
acknowledged.

Preallocation (v2 logs; docs/FORMAT.md "v1 and v2"): a commit that would write past the file's end
writes its frames *and* zeros up to a new chunk boundary in the same ``pwrite``, and the one
``fdatasync`` makes both durable, size change included. Every later commit until the chunk is full
writes into allocated, written, synced blocks: no inode change, so its ``fdatasync`` needs no journal
commit. Chunks start at 64 KiB and double with each growth of an open handle up to 4 MiB (a busy
conversation grows fast, an idle one stays small); a clean close or an eviction trims the unused tail
(``trim``), so 1M idle conversations cost no chunks and a crash leaves at most one per conversation.
Whether a frame starts at our end (zeros there, or a dead writer's frame) is ``freshness.past_end``.

Cutting, in three cases, all decided by the conversation under its I/O lock and the cross-process
file lock, and all only ever *remove* unacknowledged bytes:
- a torn tail found by recovery (``truncate_torn``);
- a failed write or fdatasync (``cut_back``, best effort: the handle is poisoned either way);
- a failed write whose cut-back truncate failed too (``cut_own_failed_write``): after fsyncgate its
  bytes may read back as valid frames from the page cache although the disk never got them, so its
  writer cuts them before recovery takes them in. It knows them by an identity only it has
  (``FailedWrite``: the commit point's epoch it wrote in, where it began, its exact bytes), never by
  an offset alone: another process may have cut them and appended its own acknowledged frames there
  (issue 33 §3). And it cuts only bytes no commit point vouches for: once any process took them in,
  readers may have been served them and frames may have been built on them, and an acknowledged frame
  can be byte for byte the same (the same items in the same microsecond) - the record cannot tell the
  two apart, so such frames are logged and left alone. Frames recovery failed to make durable before
  vouching for them (a dead writer's), whose cut back failed too, are such a failed write of the
  recovering process (``failed_write_at``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass

from ..fileio import FileOps
from .commit_point import CommitPoint

__all__ = [
    "FIRST_CHUNK",
    "MAX_CHUNK",
    "next_chunk",
    "UNPREALLOCATED_WRITE",
    "grown_size",
    "trim",
    "truncate_torn",
    "cut_back",
    "FailedWrite",
    "failed_write_at",
    "cut_own_failed_write",
]

FIRST_CHUNK = 64 * 1024
MAX_CHUNK = 4 * 1024 * 1024
# A commit this large past the preallocated end extends the file by its own bytes, without zeros: a
# chunk's zeros are written once and then again as data, a cost that grows with the commit, while the
# inode update preallocation saves is a fixed cost: the two cross between 52 KB and 96 KiB here
# (docs/PERFORMANCE.md, "Figures behind the engine's small choices"). The format allows both (no
# zeros = a clean end).
UNPREALLOCATED_WRITE = 64 * 1024
_PAGE = 4096


def next_chunk(previous: int) -> int:
    """The chunk to preallocate after one of ``previous`` bytes (0: none yet on this handle)."""
    return FIRST_CHUNK if previous <= 0 else min(MAX_CHUNK, previous * 2)


def grown_size(end: int, chunk: int) -> int:
    """The file size after preallocating ``chunk`` bytes past a log ending at ``end``: page-aligned."""
    return -(-(end + chunk) // _PAGE) * _PAGE


def trim(ops: FileOps, fd: int, end: int) -> None:
    """Give back the unused preallocated tail (clean close, idle handle). Caller holds the file lock,
    with state just refreshed, so ``end`` covers every other writer's frames. Raises ``OSError``."""
    ops.ftruncate(fd, end)
    ops.fdatasync(fd)


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
    False if the truncate itself failed: the failed write's bytes are still in the file (the caller
    remembers them: ``FailedWrite``). A truncate that took effect leaves nothing of them for any process
    of this boot to read, even if its fdatasync failed (True): only a power loss could bring them back,
    as after a crash mid-commit (never acknowledged, judged by recovery), and an acknowledged frame that
    another process writes there later is made durable, size included, by its own fdatasync."""
    try:
        ops.ftruncate(fd, end)
    except OSError:
        return False
    try:
        ops.fdatasync(fd)
    except OSError:
        pass
    return True


@dataclass(frozen=True, slots=True)
class FailedWrite:
    """A failed write still in the file (``cut_back`` returned False), as only its writer knows it."""

    epoch: bytes  # of the commit point it was written under, which ended at ``offset``
    offset: int  # where it began: the acknowledged end then
    frames: bytes  # its frames, byte for byte (not a v2 log's zeros after them)


def failed_write_at(ops: FileOps, fd: int, epoch: bytes, start: int, end: int) -> FailedWrite | None:
    """Recovery's ``fdatasync`` of frames past the record (``[start, end)``, a dead writer's) failed and
    so did the cut back to ``start``: they are a failed write of the recovering process now (it must not
    take them in with a later ``fdatasync`` that may succeed without writing them). None if there are
    none, or they cannot even be read (the next recovery judges them as it finds them)."""
    if end <= start:
        return None
    try:
        return FailedWrite(epoch, start, ops.pread(fd, end - start, start))
    except OSError:
        return None


def cut_own_failed_write(
    ops: FileOps, fd: int, failed: FailedWrite, point: CommitPoint | None, *, ino: int, end: int, path: str
) -> bool:
    """Under the file lock, before recovery takes in the good frames it found past the commit point
    ``point`` (up to ``end``): cut them (durably; True) if they are ``failed``'s own - the record, trusted
    for this log and in the failed write's epoch, still ends where that write began (no process vouched
    for anything since), and the frames are byte for byte that write's (all of them, or the complete ones
    of a torn write). Anything else is not ours to cut (False; the caller forgets ``failed``): another
    process's frames, or ours once a commit point vouches for them. Raises ``OSError``."""
    if point is None or not point.trusted_for(ino) or point.epoch != failed.epoch:
        return False  # another boot, file or epoch (a repair, an erasure): nothing of ours to know
    if point.end != failed.offset:
        taken = min(point.end, failed.offset + len(failed.frames)) - failed.offset
        if taken > 0 and ops.pread(fd, taken, failed.offset) == failed.frames[:taken]:
            log.warning(
                "log %s: a failed write at offset %d was taken in before its writer could cut it "
                "(the commit point vouches up to %d); leaving it",
                path,
                failed.offset,
                point.end,
            )
        return False
    length = end - failed.offset
    if length <= 0 or length > len(failed.frames):
        return False  # nothing good past the record (a torn tail: recovery cuts it), or more than ours
    if ops.pread(fd, length, failed.offset) != failed.frames[:length]:
        return False  # another writer's frames there, never vouched for (it died before its record)
    log.warning("log %s: cutting a failed write at offset %d (%d bytes)", path, failed.offset, length)
    ops.ftruncate(fd, failed.offset)
    ops.fdatasync(fd)
    return True
