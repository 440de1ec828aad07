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
import time
from collections.abc import Callable
from dataclasses import replace

from ..core import observe
from ..core.errors import Corrupted, Io, Timeout, Unavailable
from ..core.models import MemoryItem, SeqRange
from .fileio import FileOps
from .frame import Frame
from .group_commit import AppendRequest, GroupCommit
from .layout import ConversationPaths
from .log_handle import LogHandle
from .log_reads import corrupted, decode_region, items_of
from .log_tail import (
    nothing_after,
    probe_tail,
    trim,
    truncate_torn,
    unchanged,
)
from .log_writer import CommitInfo, encode_group, write_group
from .recovery import (
    LogState,
    absorb,
    judge,
    rescanned_state,
)
from .scanner import scan_log
from .seq_index import IndexMismatch, locate

__all__ = ["ConversationLog", "AppendRequest", "CommitInfo"]

log = logging.getLogger("logstore")


def _now_us() -> int:
    return time.time_ns() // 1000


class ConversationLog(LogHandle):
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
        super().__init__(ops, conversation_id, paths, lock_timeout=lock_timeout)
        self._on_create = on_create
        self._on_commit = on_commit
        self._group = GroupCommit(self._commit_io)

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
        """Trim the unused tail (if the lock is free at once), write the index, close everything."""
        with self._io_lock:
            try:
                if not self._closed and self._loaded and self._log_fd is not None:
                    self._trim_io()
            finally:
                self._closed = True
                self._close_fds()
                self._file_lock.close()

    def _trim_io(self) -> None:
        """Clean close or eviction: give back the preallocated tail and bring the index up to the log,
        so a closed conversation costs no unused chunk and its next open scans nothing. Best effort."""
        try:
            if self._state.size <= self._state.end and self._index.valid >= self._state.frames:
                return  # nothing to give back, nothing to index: no lock taken
            try:
                self._file_lock.acquire(0.0)  # one try: closing never waits on another process
            except Timeout:
                return  # another process is appending: it owns the tail now
            try:
                self._refresh_io(locked=True)
                state = self._state
                if state.size > state.end and state.corrupt is None and self._log_fd is not None:
                    trim(self.ops, self._log_fd, state.end)
                    self._publish(replace(state, size=state.end))
                self._index.write(state.entries, state.frames, state.end, force=True)
            finally:
                self._file_lock.release()
        except (OSError, Io, Unavailable) as exc:
            log.warning("could not trim %s on close: %s", self.paths.log, exc)

    # ------------------------------------------------------------------ freshness
    def _ensure_fresh(self) -> None:
        """Make the published state at least as new as the file, without waiting on a local writer."""
        if self._closed:
            raise Unavailable("store is closed")
        if self._loaded and self._log_fd is not None and not self._group.leader_active:
            state = self._state
            try:
                size = self.ops.linked_size(self._log_fd)  # None once erased: never served
                if size == state.end or (
                    size == state.size
                    and state.torn_at is None
                    and nothing_after(self.ops, self._log_fd, state.end)
                ):
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
        # Damage not judged under the file lock (``_damage_checked``: an unlocked scan's, whose confirmation
        # failed) is judged again from the file rather than trusted: with the lock held, by reloading here
        # (appends are refused only for real damage); without it, by ``_confirm_damage`` below.
        damage = self._state.corrupt
        unconfirmed = locked and damage is not None and damage != self._damage_checked
        if not self._loaded or self._log_fd is None or unconfirmed:
            with self._state_lock:
                self._load_locked_io()
        else:
            state = self._state
            try:
                # None once erased (logstore.file.erasure) or replaced: never append to a file the path
                # no longer names.
                named = self.ops.size_if_named(self._log_fd, self.paths.log, self._log_id)
                size = named if named is not None else -1
                probe = probe_tail(self.ops, self._log_fd, state, size) if size >= state.end else None
                if probe is not None and state.tail_sig is None and probe.signature is not None:
                    state = replace(state, tail_sig=probe.signature)  # the reference, read once
                    self._publish(state)
                tail_moved = probe is None or probe.signature != state.tail_sig
            except OSError as exc:
                raise self._io_error("stat", exc) from exc
            if tail_moved:  # another process cut the log back (repair): start over
                with self._state_lock:
                    self._load_locked_io()
            elif size > state.end and state.corrupt is None and not unchanged(state, size, probe):
                try:
                    result = scan_log(
                        self.ops,
                        self._log_fd,
                        start=state.end,
                        expected_seq=state.next_seq,
                        last_recorded_at=state.last_at,
                        last_version=state.version,
                        file_size=size,
                    )
                except OSError as exc:
                    raise self._io_error("read", exc) from exc
                self._publish(
                    self._with_created_at(absorb(replace(state, torn_at=None), result, judge(result, None)))
                )
            elif size != state.size and size >= state.end:  # another process grew or trimmed the tail
                self._publish(replace(state, size=size))
        state = self._state
        if not locked and state.corrupt is not None and state.corrupt != self._damage_checked:
            self._confirm_damage()
            state = self._state
        if locked and state.torn_at is not None and state.corrupt is None:
            assert self._log_fd is not None
            try:
                truncate_torn(self.ops, self._log_fd, state.end, path=self.paths.log)
            except OSError as exc:
                self._poison()
                raise self._io_error("truncate torn tail", exc) from exc
            self._publish(replace(state, torn_at=None, size=state.end))
        if locked:
            self._damage_checked = self._state.corrupt

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
            group,
            next_seq=state.next_seq,
            write_start=state.end,
            now=_now_us(),
            last_at=state.last_at,
            version=state.version,
        )
        if encoded is None:
            return
        try:
            done = write_group(
                self.ops, self._log_fd, state, encoded, chunk=self._chunk, directory=self.paths.directory
            )
        except OSError as exc:
            self._poison()
            error = self._io_error("write+fdatasync", exc)
            for req, _ in encoded.accepted:
                req.error, req.done = error, True
            return
        # Durable. Publish, then maybe extend the index (a hint; after the fsync: never leads the log).
        self._chunk, new = done.chunk, done.state
        self._publish(new)
        self._index.write(new.entries, new.frames, new.end)
        for req, first in encoded.accepted:
            req.result, req.done = SeqRange(first, first + req.count - 1), True
        observer = observe.current()
        if observer is not None:
            nbytes = encoded.end - encoded.write_start
            observer.commit(requests=len(encoded.accepted), nbytes=nbytes, fsync_seconds=done.fsync_seconds)
        if self._on_commit is not None:
            assert new.created_at is not None and new.last_at is not None
            self._on_commit(
                CommitInfo(self.conversation_id, new.created_at, new.last_at, new.end, new.next_seq)
            )

    def sync_index(self) -> None:
        """fdatasync the index (on clean close), so the next open scans less of the log."""
        with self._io_lock:
            if not self._closed and self._loaded and self._log_fd is not None:
                self._trim_io()  # the index is written under the file lock only (a stale writer cuts)
            self._index.sync()

    # ------------------------------------------------------------------ reads
    def read(self, start: int | None, limit: int) -> list[MemoryItem]:
        """Items ``[start, start+limit)``; with ``start=None``, the last ``limit`` items."""
        if limit <= 0:
            return []
        self._ensure_fresh()
        checked = False
        for _attempt in range(3):
            with self._state_lock:
                state, generation = self._state, self._generation
            first = max(0, state.next_seq - limit) if start is None else start
            if state.corrupt is not None and (start is None or first + limit > state.next_seq):
                if not checked and state.corrupt != self._damage_checked:
                    checked = True  # seen without the lock: believed once confirmed under it
                    self.check_damage()
                    continue
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
            self._file_lock.acquire(self.lock_timeout)  # a stable tail: see ``_confirm_damage``
            try:
                result = scan_log(self.ops, self._log_fd, start=0, expected_seq=0)
            except OSError as exc:
                raise self._io_error("verify read", exc) from exc
            finally:
                self._file_lock.release()
            state = replace(rescanned_state(result, believed_end), created_at=self._state.created_at)
            with self._state_lock:
                self._state = self._with_created_at(state)
                self._damage_checked = self._state.corrupt  # scanned under the file lock
                self._index.valid = 0
                self._generation += 1
            log.warning(
                "rebuilt in-memory index of %s from the log (%d frames)", self.paths.log, len(result.frames)
            )
