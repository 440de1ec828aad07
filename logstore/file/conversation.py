"""One conversation: its log file, its sidecar index, recovery, group commit, and reads.

Strategy:
- State (index entries, end of log, next seq, timestamps) lives in memory and is rebuilt on open from
  the index tail plus a scan of the log after it; the log is the truth, the index a hint.
- Appends: callers queue requests; one thread at a time becomes the *leader*, takes every queued request,
  takes the cross-process lock, re-validates the cached state against the file, writes all frames with one
  ``pwrite`` and one ``fdatasync`` (group commit), then publishes the new state, appends index entries
  (no fsync: the index may lag, never lead) and wakes the followers. A request is acknowledged only after
  the fsync that covers its frame.
- Failure of a write or fsync poisons the handle: the un-acknowledged bytes are cut off (best effort), the
  descriptors are closed, and the next operation reopens with full recovery. Never retry an fsync.
- Reads never take the cross-process lock and never wait for an fsync in flight: they see the state last
  published, plus complete frames another process appended (picked up when the file grew).
- An index entry that disagrees with the log (wrong check, wrong offset, wrong seq) is never served: the
  log is rescanned and the index rewritten. A frame that fails its CRC inside the acknowledged region is
  corruption: ``Corrupted(path, offset)``; reads entirely before it still work, appends stop.

Modules: ``group_commit`` (queue, leader, parked followers), ``recovery`` (the acknowledged-end rule),
``seq_index`` (locating frames, writing the sidecar), ``locking`` (the cross-process flock).

Lock order (one name per lock; never take a lock to the left while holding one to its right):
  ``_io_lock`` (one thread touches descriptors and refreshes; held by the leader for a whole commit)
  -> ``_file_lock`` (the cross-process flock, only under ``_io_lock``)
  -> ``_state_lock`` (the published state; held briefly, no I/O under it except a reload)
  -> ``_fd_readers`` (readers mid-``pread``; closing descriptors waits for them).
  The group-commit queue lock is a leaf, taken with none of these held.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass

import msgspec

from ..core import observe
from ..core.batch import decode_item
from ..core.errors import ConversationFull, Corrupted, Io, Unavailable
from ..core.imported import import_refusal
from ..core.limits import MAX_CONVERSATION_ITEMS
from ..core.models import MemoryItem, SeqRange, micros_to_datetime
from .fileio import FileOps
from .frame import Frame, Invalid, NeedMore, decode_frame, decode_header, encode_frame
from .group_commit import AppendRequest, GroupCommit, ReaderGuard
from .index_codec import ENTRY_SIZE, encode_entry, index_entries
from .layout import ConversationPaths
from .locking import PathLock
from .recovery import NO_ANCHOR, Evidence, Recovered, Verdict, judge, recover
from .scanner import ScanResult, ScanState, read_frame_at, scan_log
from .seq_index import IndexMismatch, locate, write_index

__all__ = ["ConversationLog", "AppendRequest", "CommitInfo"]

log = logging.getLogger("logstore")


@dataclass(frozen=True, slots=True)
class CommitInfo:
    """What the manifest needs to know after a commit (all times in microseconds)."""

    conversation_id: str
    created_at: int
    last_appended_at: int
    log_size: int
    next_seq: int


def _now_us() -> int:
    return time.time_ns() // 1000


class ConversationLog:
    def __init__(
        self,
        ops: FileOps,
        conversation_id: str,
        paths: ConversationPaths,
        *,
        lock_timeout: float,
        on_create: Callable[[str], None] | None = None,
        on_commit: Callable[[CommitInfo], None] | None = None,
    ) -> None:
        self.ops = ops
        self.conversation_id = conversation_id
        self.paths = paths
        self.lock_timeout = lock_timeout
        self._on_create = on_create
        self._on_commit = on_commit
        # Owned by this object alone and closed only by ``close`` (under ``_io_lock``, after which no
        # commit can start): see logstore/locking.py for why there is no shared registry.
        self._file_lock = PathLock(paths.lock)
        self._directory_ready = ops.exists(paths.directory)
        self._state_lock = threading.Lock()  # guards the published state below; held only briefly
        self._io_lock = threading.Lock()  # one thread at a time touches descriptors/refreshes
        self._group = GroupCommit(self._commit_io)
        self._closed = False
        self._fd_readers = ReaderGuard()
        self._generation = 0  # bumped whenever descriptors are closed or state is rebuilt
        # Start of a failed write whose cleanup (truncate + fdatasync) failed too; survives reloads.
        self._unsafe_from: int | None = None
        self._reset_state()

    # ------------------------------------------------------------------ state
    def _reset_state(self) -> None:
        self._log_fd: int | None = None
        self._idx_fd: int | None = None
        self._loaded = False
        self._entries = bytearray()  # index entries for every good frame, in order
        self._end = 0
        self._next_seq = 0
        self._created_at: int | None = None
        self._last_at: int | None = None
        self._tail_offset: int | None = None  # offset of the last good frame
        self._tail_sig: tuple[int, bytes] | None = None  # (tail offset, its magic + CRC bytes)
        self._corrupt: tuple[int, str] | None = None  # (offset, reason)
        self._torn_at: int | None = None
        self._index_valid = 0  # leading index-file entries known to equal self._entries

    @property
    def next_seq(self) -> int:
        return self._next_seq

    def summary(self) -> CommitInfo | None:
        """Current created/last timestamps (loading the log if needed); None if it holds no items."""
        self._ensure_fresh()
        with self._state_lock:
            if self._created_at is None or self._last_at is None:
                return None
            return CommitInfo(
                self.conversation_id, self._created_at, self._last_at, self._end, self._next_seq
            )

    def close(self) -> None:
        with self._io_lock:
            self._closed = True
            self._close_fds()
            self._file_lock.close()

    def _close_fds(self) -> None:
        with self._fd_readers.exclusive():
            self._generation += 1
            for fd in (self._log_fd, self._idx_fd):
                if fd is not None:
                    try:
                        self.ops.close(fd)
                    except OSError:
                        pass
            self._log_fd = self._idx_fd = None
            self._loaded = False

    def _io_error(self, action: str, exc: OSError) -> Io:
        return Io(
            f"{action} failed for conversation log {self.paths.log}: {exc.strerror or exc}", errno=exc.errno
        )

    # ------------------------------------------------------------------ loading and recovery
    def _load_locked_io(self) -> None:
        """(Re)build state from disk. Caller holds ``_io_lock``. Never modifies files."""
        self._close_fds()
        self._reset_state()
        try:
            self._log_fd = self.ops.open(self.paths.log, os.O_RDWR)
        except FileNotFoundError:
            self._loaded = True
            return
        except OSError as exc:
            raise self._io_error("open", exc) from exc
        try:
            try:
                self._idx_fd = self.ops.open(self.paths.index, os.O_RDWR | os.O_CREAT)
            except OSError as exc:  # the index is a hint: run without one rather than fail reads
                log.warning("cannot open index %s: %s", self.paths.index, exc)
            # Index first, log size second: an entry is written only after its frame is fdatasynced,
            # so every entry read here is for a frame the later stat covers. The other order let an
            # append by another process in between look like a missing acknowledged frame (Corrupted).
            entries = self._read_index_entries()
            size = self.ops.size(self._log_fd)
            self._adopt(recover(self.ops, self._log_fd, entries, size), entries)
            self._load_created_at()
        except OSError as exc:
            self._close_fds()
            raise self._io_error("recovery read", exc) from exc
        self._loaded = True

    def _read_index_entries(self) -> bytearray:
        if self._idx_fd is None:
            return bytearray()
        return bytearray(index_entries(self.ops.pread(self._idx_fd, self.ops.size(self._idx_fd), 0)))

    def _adopt(self, recovered: Recovered, entries: bytearray) -> None:
        """Take in a recovery (``recovery.recover``, the one acknowledged-end rule): the index prefix up
        to its anchor, the frames scanned after it, and the verdict."""
        anchor = recovered.anchor
        if anchor.wrong:
            log.warning("index %s disagrees with the log; rebuilding", self.paths.index)
        if anchor.frame is not None:
            del entries[anchor.kept * ENTRY_SIZE :]
            self._entries = entries
            self._index_valid = anchor.kept
            self._end, self._next_seq = anchor.frame.end, anchor.next_seq
            self._last_at, self._tail_offset = anchor.frame.recorded_at, anchor.frame.offset
        else:
            self._entries = bytearray()
        self._absorb(recovered.scan, recovered.verdict)

    def _absorb(self, scan: ScanResult, verdict: Verdict) -> None:
        """Append a scan's frames to the state and take its verdict."""
        for meta in scan.frames:
            self._entries += encode_entry(meta.offset, meta.first_seq)
            self._end = meta.end
            self._next_seq = meta.first_seq + meta.count
            self._last_at = max(meta.recorded_at, self._last_at or meta.recorded_at)
            self._tail_offset = meta.offset
        if verdict.state is ScanState.CORRUPT:
            assert verdict.stop is not None and verdict.reason is not None
            self._corrupt = (verdict.stop, verdict.reason)
        elif verdict.state is ScanState.TORN:
            self._torn_at = verdict.stop

    def _load_created_at(self) -> None:
        if self._next_seq == 0 or self._log_fd is None:
            return
        header = decode_header(self.ops.pread(self._log_fd, 64, 0))
        self._created_at = header.recorded_at if header else self._last_at

    def _read_frame(self, offset: int, size: int) -> Frame | NeedMore | Invalid:
        assert self._log_fd is not None
        return read_frame_at(self.ops, self._log_fd, offset, size)

    # ------------------------------------------------------------------ freshness
    def _ensure_fresh(self) -> None:
        """Make the published state at least as new as the file, without waiting on a local writer."""
        if self._closed:
            raise Unavailable("store is closed")
        if self._loaded and self._log_fd is not None and not self._group.leader_active:
            try:
                if self.ops.linked_size(self._log_fd) == self._end:  # None once erased: never served
                    return
            except OSError:
                pass
        elif self._loaded and self._log_fd is None and not self.ops.exists(self.paths.log):
            return
        if self._loaded and self._io_lock.locked():
            return  # a local leader is mid-commit; the published state is a consistent snapshot
        with self._io_lock:  # ``with``, not acquire(): an interrupt cannot land between take and try
            self._refresh_io(locked=False)

    def _refresh_io(self, *, locked: bool) -> None:
        """Bring state up to the file. Caller holds ``_io_lock`` (and the file lock if ``locked``).

        Without the file lock, only complete frames are taken in; a torn tail may be another process's
        write in flight and is left alone. With it, a torn tail is truncated (never acknowledged)."""
        if self._closed:
            raise Unavailable("store is closed")
        if not self._loaded or self._log_fd is None:
            with self._state_lock:
                self._load_locked_io()
        else:
            try:
                size = self.ops.size(self._log_fd)
                tail_moved = size < self._end or not self._tail_matches()
                # Erased (logstore.file.erasure) or replaced: never append to a file the path no longer names.
                tail_moved = tail_moved or not self.ops.same_file(self._log_fd, self.paths.log)
            except OSError as exc:
                raise self._io_error("stat", exc) from exc
            if tail_moved:  # another process cut the log back (repair): start over
                with self._state_lock:
                    self._load_locked_io()
            elif size > self._end and self._corrupt is None:
                try:
                    result = scan_log(
                        self.ops,
                        self._log_fd,
                        start=self._end,
                        expected_seq=self._next_seq,
                        last_recorded_at=self._last_at,
                        file_size=size,
                    )
                except OSError as exc:
                    raise self._io_error("read", exc) from exc
                with self._state_lock:
                    self._torn_at = None
                    self._absorb(result, judge(result, None))
                    if self._created_at is None:
                        self._load_created_at()
        if locked and self._torn_at is not None and self._corrupt is None:
            self._truncate_torn_tail()
        if locked and self._idx_fd is not None:
            self._follow_replaced_index()

    def _follow_replaced_index(self) -> None:
        """fsck --repair replaces an index by rename: write to the new file, not the orphaned inode."""
        assert self._idx_fd is not None
        try:
            if self.ops.same_file(self._idx_fd, self.paths.index):
                return
            fd = self.ops.open(self.paths.index, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            log.warning("cannot reopen replaced index %s: %s", self.paths.index, exc)
            return
        with self._fd_readers.exclusive():
            old, self._idx_fd = self._idx_fd, fd
        try:
            self.ops.close(old)
        except OSError:
            pass
        self._index_valid = 0  # rewrite it whole from the log-verified entries at the next commit

    def _tail_matches(self) -> bool:
        """The last frame we know is still where we left it (cheap: its magic and CRC bytes)."""
        if self._tail_offset is None:
            return True
        assert self._log_fd is not None
        return self.ops.pread(self._log_fd, 8, self._tail_offset) == self._tail_signature

    @property
    def _tail_signature(self) -> bytes:
        # Cached per tail offset: set by each commit from the bytes written; read from the file otherwise.
        if self._tail_sig is None or self._tail_sig[0] != self._tail_offset:
            assert self._log_fd is not None and self._tail_offset is not None
            self._tail_sig = (self._tail_offset, self.ops.pread(self._log_fd, 8, self._tail_offset))
        return self._tail_sig[1]

    def _truncate_torn_tail(self) -> None:
        assert self._log_fd is not None and self._torn_at is not None
        try:
            log.warning(
                "truncating torn tail of %s at offset %d (%d unacknowledged bytes)",
                self.paths.log,
                self._end,
                self.ops.size(self._log_fd) - self._end,
            )
            self.ops.ftruncate(self._log_fd, self._end)
            self.ops.fdatasync(self._log_fd)
        except OSError as exc:
            self._poison()
            raise self._io_error("truncate torn tail", exc) from exc
        self._torn_at = None

    def _poison(self) -> None:
        """After a failed write/fsync: close everything; the next operation reopens with recovery.

        The failed write may sit in the page cache looking complete while the disk never got it
        (fsyncgate): cut the file back to the last acknowledged end so it is never served, and if even
        that fails, recovery on reopen still classifies whatever is there."""
        fd = self._log_fd
        if fd is not None:
            try:
                self.ops.ftruncate(fd, self._end)
                self.ops.fdatasync(fd)
            except OSError:
                # The cut did not happen or is not durable. After a failed fsync the kernel drops the
                # dirty pages' error state: the failed write can read back as valid frames from the page
                # cache although the disk never got them, and a later fsync will not write them. Remember
                # where it began: the next commit cuts it off before building on it.
                self._unsafe_from = self._end
        with self._state_lock:
            self._close_fds()

    def _drop_unsafe_tail(self) -> None:
        """Cut off what a failed write left behind (see ``_poison``) before appending after it, unless
        another writer already appended after those bytes (then it is too late: leave them). Caller holds
        the file lock, with state just refreshed."""
        cut, self._unsafe_from = self._unsafe_from, None
        assert cut is not None and self._log_fd is not None
        if self._end <= cut:
            return  # nothing of the failed write was taken in (a torn tail is truncated by the refresh)
        try:
            size = self.ops.size(self._log_fd)
            pos = cut
            while pos < self._end:
                frame = self._read_frame(pos, size)
                if not isinstance(frame, Frame) or frame.write_start != cut:
                    log.warning(
                        "log %s: frames after a failed write at offset %d were appended by another "
                        "writer; leaving them",
                        self.paths.log,
                        cut,
                    )
                    return
                pos = frame.end
            log.warning("log %s: cutting a failed write at offset %d before appending", self.paths.log, cut)
            self.ops.ftruncate(self._log_fd, cut)
            self.ops.fdatasync(self._log_fd)
        except OSError as exc:
            self._unsafe_from = cut  # still unsafe: try again at the next commit
            with self._state_lock:
                self._close_fds()
            raise self._io_error("truncate after a failed write", exc) from exc
        with self._state_lock:
            self._load_locked_io()

    # ------------------------------------------------------------------ appends
    def append(self, request: AppendRequest) -> SeqRange:
        """Commit one batch (group commit with concurrent callers). Blocks until durable or failed."""
        return self._group.submit(request)

    def _commit_io(self, group: list[AppendRequest]) -> None:
        with self._io_lock:
            self._commit_group(group)

    def _commit_group(self, group: list[AppendRequest]) -> None:
        if self._closed:  # checked under _io_lock: close() cannot have let go of the lock fd yet
            raise Unavailable("store is closed")
        if not self._directory_ready:
            try:
                self.ops.makedirs_durable(self.paths.directory)
            except OSError as exc:
                raise self._io_error("mkdir", exc) from exc
            self._directory_ready = True
        try:
            self._file_lock.acquire(self.lock_timeout)
            self._refresh_io(locked=True)
            if self._log_fd is None:
                self._create_log()
            if self._corrupt is not None:
                offset, reason = self._corrupt
                raise Corrupted(
                    f"conversation log {self.paths.log} is corrupted at byte {offset} ({reason}); "
                    "appends are refused until it is repaired (logstore fsck)",
                    path=self.paths.log,
                    offset=offset,
                )
            if self._unsafe_from is not None:
                self._drop_unsafe_tail()
            self._write_group(group)
        finally:
            self._file_lock.release()

    def _create_log(self) -> None:
        if self._on_create is not None:
            self._on_create(self.conversation_id)  # durable manifest record first: manifest ⊇ logs on disk
        try:
            # The directory entry is made durable by the first frame's commit (``_write_group``), which
            # also covers a log left by an attempt or a process that failed before syncing it.
            fd = self.ops.open(self.paths.log, os.O_RDWR | os.O_CREAT)
            self.ops.close(fd)
        except OSError as exc:
            raise self._io_error("create", exc) from exc
        with self._state_lock:
            self._load_locked_io()

    def _write_group(self, group: list[AppendRequest]) -> None:
        assert self._log_fd is not None
        now, last_at, first_at = _now_us(), self._last_at, 0
        write_start = self._end
        seq, offset = self._next_seq, write_start
        frames: list[bytes] = []
        accepted: list[tuple[AppendRequest, int, int]] = []  # request, frame offset, first seq
        for req in group:
            recorded_at = now if last_at is None else max(now, last_at)  # never goes back
            if req.imported is not None:  # logstore migrate: the source's seq and time, or refused
                req.error = import_refusal(req.imported, next_seq=seq, last_recorded_at=last_at)
                recorded_at = req.imported.recorded_at
            if req.error is None and seq + req.count > MAX_CONVERSATION_ITEMS:
                req.error = ConversationFull(
                    f"conversation holds {seq} items; appending {req.count} would pass the limit of "
                    f"{MAX_CONVERSATION_ITEMS}",
                    stored=seq,
                    requested=req.count,
                    limit=MAX_CONVERSATION_ITEMS,
                )
            if req.error is not None:
                req.done = True
                continue
            first_at = recorded_at if not accepted else first_at
            last_at = recorded_at
            frame = encode_frame(
                first_seq=seq,
                count=req.count,
                recorded_at=recorded_at,
                write_start=write_start,
                encoded_items=req.encoded,
            )
            frames.append(frame)
            accepted.append((req, offset, seq))
            offset += len(frame)
            seq += req.count
        if not accepted:
            return
        try:
            self.ops.pwrite(self._log_fd, b"".join(frames) if len(frames) > 1 else frames[0], write_start)
            synced_at = time.perf_counter()
            self.ops.fdatasync(self._log_fd)
            fsync_seconds = time.perf_counter() - synced_at
            if write_start == 0:
                # First frame: the log's own directory entry must be durable before anything in it is
                # acknowledged. Done here rather than at creation so that a failed directory fsync is
                # retried with the append (a retry finds the file and never creates it again).
                self.ops.fsync_dir(self.paths.directory)
        except OSError as exc:
            self._poison()
            error = self._io_error("write+fdatasync", exc)
            for req, _, _ in accepted:
                req.error, req.done = error, True
            return
        # Durable. Publish, then extend the index (a hint; after the fsync, so it never leads the log).
        new_entries = b"".join(encode_entry(off, first) for _, off, first in accepted)
        with self._state_lock:
            self._entries += new_entries
            self._end = offset
            self._next_seq = seq
            if self._created_at is None:
                self._created_at = first_at
            self._last_at = last_at
            self._tail_offset = accepted[-1][1]
            # The tail check's reference is what we wrote, not a re-read of the file (one pread less per
            # append, and a change by another process right after this commit is not taken as reference).
            self._tail_sig = (self._tail_offset, frames[-1][:8])
        self._write_index()
        for req, _, first in accepted:
            req.result, req.done = SeqRange(first, first + req.count - 1), True
        observer = observe.current()
        if observer is not None:
            observer.commit(requests=len(accepted), nbytes=offset - write_start, fsync_seconds=fsync_seconds)
        if self._on_commit is not None:
            assert self._created_at is not None and last_at is not None
            self._on_commit(CommitInfo(self.conversation_id, self._created_at, last_at, offset, seq))

    def _write_index(self) -> None:
        if self._idx_fd is not None:
            self._index_valid = write_index(
                self.ops, self._idx_fd, self._entries, self._index_valid, name=self.paths.index
            )

    def sync_index(self) -> None:
        """fdatasync the index (on clean close), so the next open scans less of the log."""
        with self._io_lock:
            if self._idx_fd is not None:
                try:
                    self.ops.fdatasync(self._idx_fd)
                except OSError as exc:
                    log.warning("index sync failed for %s: %s", self.paths.index, exc)

    # ------------------------------------------------------------------ reads
    def read(self, start: int | None, limit: int) -> list[MemoryItem]:
        """Items ``[start, start+limit)``; with ``start=None``, the last ``limit`` items."""
        if limit <= 0:
            return []
        self._ensure_fresh()
        for _attempt in range(3):
            with self._state_lock:
                entries, next_seq, end = self._entries, self._next_seq, self._end
                corrupt, generation = self._corrupt, self._generation
            first = max(0, next_seq - limit) if start is None else start
            if corrupt is not None and (start is None or first + limit > next_seq):
                # The tail is unknown past the damage, and a short page would wrongly say "end of log".
                raise self._corrupted(corrupt)
            stop = min(first + limit, next_seq)
            if first >= stop:
                return []
            try:
                frames = self._read_frames(entries, first, stop, end, generation)
            except IndexMismatch:
                self._verify_and_rebuild()
                continue
            except OSError as exc:
                raise self._io_error("read", exc) from exc
            if frames is None:  # descriptors were swapped under us (poison/reload): take a new snapshot
                self._ensure_fresh()
                continue
            return self._items(frames, first, stop)
        raise Unavailable(f"conversation {self.conversation_id} kept changing under a read; retry")

    def _corrupted(self, corrupt: tuple[int, str]) -> Corrupted:
        offset, reason = corrupt
        return Corrupted(
            f"conversation log {self.paths.log} is corrupted at byte {offset} ({reason})",
            path=self.paths.log,
            offset=offset,
        )

    def _read_frames(
        self, entries: bytearray, first: int, stop: int, end: int, generation: int
    ) -> list[Frame] | None:
        bounds, region_end = locate(entries, first, stop, end)
        region_start = bounds[0][0]
        with self._fd_readers:
            if self._generation != generation or self._log_fd is None:
                return None
            data = self.ops.pread(self._log_fd, region_end - region_start, region_start)
        frames: list[Frame] = []
        pos = 0
        for offset, first_seq in bounds:
            event = decode_frame(data, offset - region_start, region_start)
            if not isinstance(event, Frame) or event.first_seq != first_seq:
                raise IndexMismatch
            frames.append(event)
            pos = event.end - region_start
        if pos != len(data) or frames[-1].first_seq + frames[-1].count < stop:
            raise IndexMismatch
        return frames

    def _items(self, frames: list[Frame], first: int, stop: int) -> list[MemoryItem]:
        out: list[MemoryItem] = []
        for frame in frames:
            at = micros_to_datetime(frame.recorded_at)
            lo = max(first - frame.first_seq, 0)
            hi = min(stop - frame.first_seq, frame.count)
            for k in range(lo, hi):
                try:
                    payload = decode_item(frame.items[k], seq=frame.first_seq + k)  # or Unreadable
                except msgspec.DecodeError as exc:  # CRC-valid but not JSON: written wrong, not rotted
                    raise self._corrupted((frame.offset, "item-not-json")) from exc
                out.append(MemoryItem(frame.first_seq + k, at, payload))
        return out

    def _verify_and_rebuild(self) -> None:
        """The index disagreed with the log: rescan the whole log (the truth) and rebuild the index.
        If the scan stops inside what we believed was good, that is corruption at the stop point."""
        with self._io_lock:
            if self._log_fd is None:
                with self._state_lock:
                    self._load_locked_io()
                return
            believed_end = self._end
            try:
                result = scan_log(self.ops, self._log_fd, start=0, expected_seq=0)
            except OSError as exc:
                raise self._io_error("verify read", exc) from exc
            # Frames before believed_end were served as acknowledged: a scan stopping inside them is
            # corruption, never a torn tail (a clean shorter log was cut back by a repair: take it).
            evidence = None
            if result.state is not ScanState.CLEAN and believed_end > 0:
                evidence = Evidence(believed_end - 1, "corrupt")
            with self._state_lock:
                self._end, self._next_seq, self._last_at, self._tail_offset = 0, 0, None, None
                self._corrupt = self._torn_at = None
                self._index_valid = 0
                self._adopt(Recovered(NO_ANCHOR, result, judge(result, evidence)), bytearray())
                self._generation += 1
            log.warning(
                "rebuilt in-memory index of %s from the log (%d frames)", self.paths.log, len(result.frames)
            )
