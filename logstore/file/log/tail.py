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
- a failed write whose cleanup failed too (``cut_failed_write``): after fsyncgate its bytes may read
  back as valid frames from the page cache although the disk never got them, so the next commit cuts
  them off before building on them - unless another writer already appended after them.
"""

from __future__ import annotations

import logging

from ..fileio import FileOps
from .frame import Frame
from .scanner import read_frame_at

__all__ = [
    "FIRST_CHUNK",
    "MAX_CHUNK",
    "next_chunk",
    "UNPREALLOCATED_WRITE",
    "grown_size",
    "trim",
    "truncate_torn",
    "cut_back",
    "cut_failed_write",
]

FIRST_CHUNK = 64 * 1024
MAX_CHUNK = 4 * 1024 * 1024
# A commit this large past the preallocated end extends the file by its own bytes, without zeros: a
# chunk's zeros are written once and then again as data, a cost that grows with the commit, while the
# inode update preallocation saves is a fixed cost. Raw loop on this disk, growing the engine's way vs
# extending (3 rounds): 40 KiB commits 1.18-1.27x, 52 KB 1.06-1.16x, 96 KiB 0.62-0.87x, 640 KiB
# 0.30-0.73x. The engine, 5 rounds paired: 10 x 4 KiB +14-36%, 250 x 200 B +2-10% with 64 KiB
# instead of 32 KiB (docs/PERFORMANCE.md). The format allows both (no zeros = a clean end).
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
