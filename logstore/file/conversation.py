"""One conversation: its log file, its sidecar index, recovery, group commit, and reads.

- State: ONE immutable ``recovery.LogState`` (entries, end, next seq, timestamps, tail, damage), built by
  recovery on open/refresh from the index tail plus a scan after it (the log is the truth, the index a
  hint), replaced whole by each commit and swapped under ``_state_lock``; readers take the reference once.
- Appends: one leader per group (``group_commit``) takes the cross-process lock, re-validates the state
  against the file, writes every frame with one ``pwrite`` and one ``fdatasync``, publishes the new
  state, extends the index (a hint: may lag, never lead) and wakes the followers. Acknowledged only after
  the fsync that covers the frame. A failed write or fsync poisons the handle (``log_tail``): the
  unacknowledged bytes are cut off, descriptors closed, the next operation reopens with recovery.
- Reads (``log_reads``) never take the cross-process lock nor wait for an fsync in flight. An index entry
  that disagrees with the log is never served: the log is rescanned and the index rewritten. A bad frame
  inside the acknowledged region is ``Corrupted(path, offset)``: reads before it work, appends stop.

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
from dataclasses import replace

from ..core import observe
from ..core.errors import Corrupted, Io, Unavailable
from ..core.models import MemoryItem, SeqRange
from .fileio import FileOps
from .frame import Frame, decode_header
from .group_commit import AppendRequest, GroupCommit, ReaderGuard
from .layout import ConversationPaths
from .locking import PathLock
from .log_reads import corrupted, decode_region, items_of
from .log_tail import cut_back, cut_failed_write, truncate_torn
from .log_writer import CommitInfo, encode_group
from .recovery import (
    EMPTY_STATE,
    LogState,
    absorb,
    judge,
    recover,
    recovered_state,
    rescanned_state,
)
from .scanner import scan_log
from .seq_index import IndexMismatch, SidecarIndex, locate

__all__ = ["ConversationLog", "AppendRequest", "CommitInfo"]

log = logging.getLogger("logstore")


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
        self._state_lock = threading.Lock()  # guards swapping ``_state`` and ``_generation``; brief
        self._io_lock = threading.Lock()  # one thread at a time touches descriptors/refreshes
        self._group = GroupCommit(self._commit_io)
        self._closed = False
        self._fd_readers = ReaderGuard()
        self._generation = 0  # bumped whenever descriptors are closed or state is rebuilt
        # Start of a failed write whose cleanup (truncate + fdatasync) failed too; survives reloads.
        self._unsafe_from: int | None = None
        self._state: LogState = EMPTY_STATE
        self._log_fd: int | None = None
        self._index = SidecarIndex(ops, paths.index)
        self._loaded = False

    @property
    def next_seq(self) -> int:
        return self._state.next_seq

    def summary(self) -> CommitInfo | None:
        """Current created/last timestamps (loading the log if needed); None if it holds no items."""
        self._ensure_fresh()
        state = self._state
        if state.created_at is None or state.last_at is None:
            return None
        return CommitInfo(self.conversation_id, state.created_at, state.last_at, state.end, state.next_seq)

    def close(self) -> None:
        with self._io_lock:
            self._closed = True
            self._close_fds()
            self._file_lock.close()

    def _close_fds(self) -> None:
        with self._fd_readers.exclusive():
            self._generation += 1
            if self._log_fd is not None:
                try:
                    self.ops.close(self._log_fd)
                except OSError:
                    pass
            self._log_fd = None
            self._index.close()
            self._loaded = False

    def _io_error(self, action: str, exc: OSError) -> Io:
        return Io(
            f"{action} failed for conversation log {self.paths.log}: {exc.strerror or exc}", errno=exc.errno
        )

    def _publish(self, state: LogState) -> None:
        with self._state_lock:
            self._state = state

    # ------------------------------------------------------------------ loading and recovery
    def _load_locked_io(self) -> None:
        """(Re)build state from disk. Caller holds ``_io_lock`` and ``_state_lock``. Never modifies files."""
        self._close_fds()  # the old state stays published until the new one replaces it whole
        try:
            self._log_fd = self.ops.open(self.paths.log, os.O_RDWR)
        except FileNotFoundError:
            self._state, self._loaded = EMPTY_STATE, True
            return
        except OSError as exc:
            self._state = EMPTY_STATE
            raise self._io_error("open", exc) from exc
        try:
            # Index first, log size second: an entry is written only after its frame is fdatasynced,
            # so every entry read here is for a frame the later stat covers. The other order let an
            # append by another process in between look like a missing acknowledged frame (Corrupted).
            entries = self._index.open_and_read()
            recovered = recover(self.ops, self._log_fd, entries, self.ops.size(self._log_fd))
            if recovered.anchor.wrong:
                log.warning("index %s disagrees with the log; rebuilding", self.paths.index)
            self._index.valid = recovered.anchor.kept
            self._state = self._with_created_at(recovered_state(recovered, entries))
        except OSError as exc:
            self._close_fds()
            self._state = EMPTY_STATE
            raise self._io_error("recovery read", exc) from exc
        self._loaded = True

    def _with_created_at(self, state: LogState) -> LogState:
        if state.created_at is not None or state.next_seq == 0 or self._log_fd is None:
            return state
        header = decode_header(self.ops.pread(self._log_fd, 64, 0))
        return replace(state, created_at=header.recorded_at if header else state.last_at)

    # ------------------------------------------------------------------ freshness
    def _ensure_fresh(self) -> None:
        """Make the published state at least as new as the file, without waiting on a local writer."""
        if self._closed:
            raise Unavailable("store is closed")
        if self._loaded and self._log_fd is not None and not self._group.leader_active:
            try:
                if self.ops.linked_size(self._log_fd) == self._state.end:  # None once erased: never served
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
            state = self._state
            try:
                size = self.ops.size(self._log_fd)
                tail_moved = size < state.end or not self._tail_matches()
                # Erased (logstore.file.erasure) or replaced: never append to a file the path no longer names.
                tail_moved = tail_moved or not self.ops.same_file(self._log_fd, self.paths.log)
            except OSError as exc:
                raise self._io_error("stat", exc) from exc
            if tail_moved:  # another process cut the log back (repair): start over
                with self._state_lock:
                    self._load_locked_io()
            elif size > state.end and state.corrupt is None:
                try:
                    result = scan_log(
                        self.ops,
                        self._log_fd,
                        start=state.end,
                        expected_seq=state.next_seq,
                        last_recorded_at=state.last_at,
                        file_size=size,
                    )
                except OSError as exc:
                    raise self._io_error("read", exc) from exc
                self._publish(
                    self._with_created_at(absorb(replace(state, torn_at=None), result, judge(result, None)))
                )
        state = self._state
        if locked and state.torn_at is not None and state.corrupt is None:
            assert self._log_fd is not None
            try:
                truncate_torn(self.ops, self._log_fd, state.end, path=self.paths.log)
            except OSError as exc:
                self._poison()
                raise self._io_error("truncate torn tail", exc) from exc
            self._publish(replace(state, torn_at=None))
        if locked:
            self._index.follow_replaced()

    def _tail_matches(self) -> bool:
        """The last frame we know is still where we left it (cheap: its magic and CRC bytes). The
        reference is taken from the bytes a commit wrote, or read once from the file."""
        state = self._state
        if state.tail_offset is None:
            return True
        assert self._log_fd is not None
        found = self.ops.pread(self._log_fd, 8, state.tail_offset)
        if state.tail_sig is None:
            self._publish(replace(state, tail_sig=found))
            return True
        return found == state.tail_sig

    def _poison(self) -> None:
        """After a failed write/fsync: close everything; the next operation reopens with recovery.

        The failed write may sit in the page cache looking complete while the disk never got it
        (fsyncgate): cut the file back to the last acknowledged end so it is never served, and if even
        that fails, remember where it began: the next commit cuts it off before building on it."""
        if self._log_fd is not None and not cut_back(self.ops, self._log_fd, self._state.end):
            self._unsafe_from = self._state.end
        with self._state_lock:
            self._close_fds()

    def _drop_unsafe_tail(self) -> None:
        """Cut off what a failed write left behind (see ``_poison``) before appending after it. Caller
        holds the file lock, with state just refreshed."""
        cut, self._unsafe_from = self._unsafe_from, None
        assert cut is not None and self._log_fd is not None
        if self._state.end <= cut:
            return  # nothing of the failed write was taken in (a torn tail is truncated by the refresh)
        try:
            if not cut_failed_write(self.ops, self._log_fd, cut, self._state.end, path=self.paths.log):
                return
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
            if self._state.corrupt is not None:
                offset, reason = self._state.corrupt
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
        state = self._state
        encoded = encode_group(
            group, next_seq=state.next_seq, write_start=state.end, now=_now_us(), last_at=state.last_at
        )
        if encoded is None:
            return
        try:
            self.ops.pwrite(self._log_fd, encoded.data, encoded.write_start)
            synced_at = time.perf_counter()
            self.ops.fdatasync(self._log_fd)
            fsync_seconds = time.perf_counter() - synced_at
            if encoded.write_start == 0:
                # First frame: the log's own directory entry must be durable before anything in it is
                # acknowledged. Done here rather than at creation so that a failed directory fsync is
                # retried with the append (a retry finds the file and never creates it again).
                self.ops.fsync_dir(self.paths.directory)
        except OSError as exc:
            self._poison()
            error = self._io_error("write+fdatasync", exc)
            for req, _ in encoded.accepted:
                req.error, req.done = error, True
            return
        # Durable. Publish, then extend the index (a hint; after the fsync, so it never leads the log).
        state.entries.extend(encoded.entries)
        created_at = encoded.first_at if state.created_at is None else state.created_at
        self._publish(
            replace(
                state,
                frames=state.frames + len(encoded.accepted),
                end=encoded.end,
                next_seq=encoded.next_seq,
                created_at=created_at,
                last_at=encoded.last_at,
                tail_offset=encoded.tail_offset,
                # The tail check's reference is what we wrote, not a re-read of the file (one pread less
                # per append, and a change by another process right after this commit is not taken in).
                tail_sig=encoded.tail_sig,
            )
        )
        self._index.write(state.entries, state.frames + len(encoded.accepted))
        for req, first in encoded.accepted:
            req.result, req.done = SeqRange(first, first + req.count - 1), True
        observer = observe.current()
        if observer is not None:
            nbytes = encoded.end - encoded.write_start
            observer.commit(requests=len(encoded.accepted), nbytes=nbytes, fsync_seconds=fsync_seconds)
        if self._on_commit is not None:
            self._on_commit(
                CommitInfo(self.conversation_id, created_at, encoded.last_at, encoded.end, encoded.next_seq)
            )

    def sync_index(self) -> None:
        """fdatasync the index (on clean close), so the next open scans less of the log."""
        with self._io_lock:
            self._index.sync()

    # ------------------------------------------------------------------ reads
    def read(self, start: int | None, limit: int) -> list[MemoryItem]:
        """Items ``[start, start+limit)``; with ``start=None``, the last ``limit`` items."""
        if limit <= 0:
            return []
        self._ensure_fresh()
        for _attempt in range(3):
            with self._state_lock:
                state, generation = self._state, self._generation
            first = max(0, state.next_seq - limit) if start is None else start
            if state.corrupt is not None and (start is None or first + limit > state.next_seq):
                # The tail is unknown past the damage, and a short page would wrongly say "end of log".
                raise corrupted(self.paths.log, *state.corrupt)
            stop = min(first + limit, state.next_seq)
            if first >= stop:
                return []
            try:
                frames = self._read_frames(state, first, stop, generation)
            except IndexMismatch:
                self._verify_and_rebuild()
                continue
            except OSError as exc:
                raise self._io_error("read", exc) from exc
            if frames is None:  # descriptors were swapped under us (poison/reload): take a new snapshot
                self._ensure_fresh()
                continue
            return items_of(frames, first, stop, path=self.paths.log)
        raise Unavailable(f"conversation {self.conversation_id} kept changing under a read; retry")

    def _read_frames(self, state: LogState, first: int, stop: int, generation: int) -> list[Frame] | None:
        bounds, region_end = locate(state.entries, state.frames, first, stop, state.end)
        region_start = bounds[0][0]
        with self._fd_readers:
            if self._generation != generation or self._log_fd is None:
                return None
            data = self.ops.pread(self._log_fd, region_end - region_start, region_start)
        return decode_region(data, region_start, bounds, stop)

    def _verify_and_rebuild(self) -> None:
        """The index disagreed with the log: rescan the whole log (the truth) and rebuild the index.
        If the scan stops inside what we believed was good, that is corruption at the stop point."""
        with self._io_lock:
            if self._log_fd is None:
                with self._state_lock:
                    self._load_locked_io()
                return
            believed_end = self._state.end
            try:
                result = scan_log(self.ops, self._log_fd, start=0, expected_seq=0)
            except OSError as exc:
                raise self._io_error("verify read", exc) from exc
            state = replace(rescanned_state(result, believed_end), created_at=self._state.created_at)
            with self._state_lock:
                self._state = self._with_created_at(state)
                self._index.valid = 0
                self._generation += 1
            log.warning(
                "rebuilt in-memory index of %s from the log (%d frames)", self.paths.log, len(result.frames)
            )
