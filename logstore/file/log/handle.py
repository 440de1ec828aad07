"""The descriptors and the published state of one conversation log: loading it (by the commit point, or
by recovery under the file lock), closing and poisoning it. ``ConversationLog`` (conversation.py) builds
the protocol on top: freshness, group commit, reads. The lock order is conversation.py's.

- ``_state`` is ONE immutable ``recovery.LogState``, swapped whole under ``_state_lock`` (``_publish``);
  a reload keeps the old state published until the new one replaces it. Everything a published state
  holds is durable, and its ``point`` is the commit-point record (``commit_point``) it agrees with.
- ``_generation`` is bumped whenever descriptors close, so a reader that took a state with one
  generation never reads through a descriptor of another (``ReaderGuard``).
- Two ways to load (``_load_unlocked_io``, ``_load_locked_io``): without the file lock, only what the
  commit point vouches for (never a torn tail, never a judgement of damage: any disagreement sends the
  caller to the lock); with it, recovery's whole rule, after which what it found is made durable and
  the commit point rewritten. Damage is therefore only ever judged under the file lock.
- A failed write or fsync poisons the handle (``_poison``): the unacknowledged bytes are cut off (best
  effort; if that fails too, ``_unsafe_from`` makes the next commit cut them before building on them).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace

from ...core.errors import Io
from .. import boot
from ..fileio import FileOps
from ..layout import ConversationPaths
from ..locking import PathLock
from .commit_point import NO_RECORD, CommitPoint, decode, encode, new_epoch, read_raw, write_raw
from .frame import decode_header
from .group_commit import ReaderGuard
from .recovery import EMPTY_STATE, LogState, absorb, judge, recover, recovered_state, rescanned_state
from .scanner import ScanState, scan_log
from .seq_index import SidecarIndex
from .tail import cut_back, cut_failed_write, truncate_torn

__all__ = ["LogHandle"]

log = logging.getLogger("logstore")


class LogHandle:
    def __init__(
        self,
        ops: FileOps,
        conversation_id: str,
        paths: ConversationPaths,
        *,
        lock_timeout: float,
    ) -> None:
        self.ops = ops
        self.conversation_id = conversation_id
        self.paths = paths
        self.lock_timeout = lock_timeout
        # Owned by this object alone and closed only by ``close`` (under ``_commit_lock``, after which no
        # commit can start): see logstore/locking.py for why there is no shared registry.
        self._file_lock = PathLock(paths.lock)
        self._directory_ready = ops.exists(paths.directory)
        # The one thread of this process that may hold the file lock (flock belongs to the open file
        # description, so two threads of one owner would both "hold" it): commits, locked refreshes,
        # trims. Taken *before* the file lock, so readers (``_io_lock``) never wait behind a flock wait.
        self._commit_lock = threading.Lock()
        self._io_lock = threading.Lock()  # one thread at a time touches descriptors/builds state
        self._state_lock = threading.Lock()  # guards swapping ``_state`` and ``_generation``; brief
        self._closed = False
        self._fd_readers = ReaderGuard()
        self._generation = 0  # bumped whenever descriptors are closed or state is rebuilt
        # Start of a failed write whose cleanup (truncate + fdatasync) failed too; survives reloads.
        self._unsafe_from: int | None = None
        self._state: LogState = EMPTY_STATE
        self._epoch = b""  # the commit point's epoch the published state belongs to
        self._log_fd: int | None = None
        self._log_id: tuple[int, int, int] | None = None  # ``FileOps.file_id`` of ``_log_fd``
        self._point_fd: int | None = None  # the ``.lock`` file, for the commit point record
        self._index = SidecarIndex(ops, paths.index)
        self._loaded = False
        self._chunk = 0  # the last chunk preallocated by this handle (doubles with each growth)

    def _close_fds(self) -> None:
        with self._fd_readers.exclusive():
            self._generation += 1
            for fd in (self._log_fd, self._point_fd):
                if fd is not None:
                    try:
                        self.ops.close(fd)
                    except OSError:
                        pass
            self._log_fd = self._log_id = self._point_fd = None
            self._index.close()
            self._loaded = False

    def _io_error(self, action: str, exc: OSError) -> Io:
        return Io(
            f"{action} failed for conversation log {self.paths.log}: {exc.strerror or exc}", errno=exc.errno
        )

    def _publish(self, state: LogState) -> None:
        with self._state_lock:
            self._state = state

    def _install(self, state: LogState, epoch: bytes) -> None:
        with self._state_lock:
            self._state, self._epoch, self._loaded = state, epoch, True

    @property
    def _ino(self) -> int:
        assert self._log_id is not None
        return self._log_id[2]  # ``file_id`` is (device major, device minor, inode)

    def _read_point(self) -> bytes | None:
        """The commit point record, lock-free (the fast path of every read); None without a log open."""
        with self._fd_readers:  # descriptors close only when no reader is inside
            fd = self._point_fd
            return None if fd is None else read_raw(self.ops, fd)

    # ------------------------------------------------------------------ loading
    def _open_io(self) -> bool:
        """(Re)open the log and its lock file. False: there is no log (the empty state is installed).
        Caller holds ``_io_lock``."""
        with self._state_lock:
            self._close_fds()  # the old state stays published until the new one replaces it whole
        try:
            fd = self.ops.open(self.paths.log, os.O_RDWR)
        except FileNotFoundError:
            self._install(EMPTY_STATE, b"")
            return False
        except OSError as exc:
            raise self._io_error("open", exc) from exc
        try:
            self._log_id = self.ops.file_id(fd)
            self._point_fd = self.ops.open(self.paths.lock, os.O_RDWR | os.O_CREAT)
        except OSError as exc:
            try:
                self.ops.close(fd)
            except OSError:
                pass
            self._log_id = None
            raise self._io_error("open", exc) from exc
        self._log_fd = fd
        return True

    def _load_unlocked_io(self) -> bool:
        """Load what the commit point vouches for, without the file lock. False when only recovery under
        the lock can tell (no record, another boot's, damage, another file, or the log disagrees): the
        caller then takes the lock. Caller holds ``_io_lock``."""
        try:
            if not self._open_io():
                return True
            assert self._log_fd is not None and self._point_fd is not None
            raw = read_raw(self.ops, self._point_fd)
            point = decode(raw)
            for _again in range(2):  # a read racing the record's pwrite may see it half written
                if point is not None:
                    break
                raw = read_raw(self.ops, self._point_fd)
                point = decode(raw)
            if point is None or not point.trusted_for(self._ino):
                return False
            entries = self._index.open_and_read()
            recovered = recover(self.ops, self._log_fd, entries, point.end)
            verdict = recovered.verdict
            # With damage, index entries past ``end`` make the bounded scan's verdict "missing-frames"
            # at ``end``: the same good prefix, which is all that has to agree.
            if verdict.end != point.end or (verdict.state is not ScanState.CLEAN and point.damage is None):
                return False
            if recovered.scan.next_seq != point.next_seq or read_raw(self.ops, self._point_fd) != raw:
                return False  # the record moved while we read: start over
            # Damage past ``end`` was judged under the lock by whoever wrote the record: the same verdict.
            size = self.ops.size(self._log_fd)  # with a v2 log's preallocated tail (trimmed on close)
            state = replace(
                recovered_state(recovered, entries),
                point=raw,
                corrupt=point.damage,
                size=max(size, point.end),
            )
            state = self._with_created_at(state)
        except OSError as exc:
            with self._state_lock:
                self._close_fds()
            raise self._io_error("recovery read", exc) from exc
        self._index.valid = recovered.anchor.kept
        self._install(state, point.epoch)
        return True

    def _load_locked_io(self, *, believed_end: int | None = None) -> None:
        """Recover under the file lock: the one place that judges torn tails and damage. What it finds is
        made durable before the commit point vouches for it. ``believed_end``: ignore the index and rescan
        from byte 0 (it disagreed with the log), where frames up to ``believed_end`` were served. Caller
        holds ``_commit_lock``, the file lock and ``_io_lock``."""
        try:
            if not self._open_io():
                return
            fd, pfd = self._log_fd, self._point_fd
            assert fd is not None and pfd is not None
            raw = read_raw(self.ops, pfd)
            point = decode(raw)
            size = self.ops.size(fd)
            same_log = point is not None and point.boot == boot.boot_id() and point.ino == self._ino
            if believed_end is None:
                # Index first, log size second (both above): entries are written after their frame's
                # fdatasync, so every entry read covers a frame the size covers.
                entries = self._index.open_and_read()
                damage = point.damage if same_log and point is not None else None
                # Damage the record carries was found by a scan this recovery may not repeat (the index
                # anchors past it): keep that verdict, with the frames before it.
                bound = point.end if damage is not None and point is not None else size
                recovered = recover(self.ops, fd, entries, bound)
                if recovered.anchor.wrong:
                    log.warning("index %s disagrees with the log; rebuilding", self.paths.index)
                self._index.valid = recovered.anchor.kept
                state = recovered_state(recovered, entries)
                if damage is not None and recovered.verdict.end == bound:  # the good prefix it vouched for
                    state = replace(state, corrupt=damage)
                elif damage is not None:  # not what the record says: judge the whole log again
                    entries = self._index.open_and_read()
                    recovered = recover(self.ops, fd, entries, size)
                    self._index.valid = recovered.anchor.kept
                    state = recovered_state(recovered, entries)
            else:
                scan = scan_log(self.ops, fd, start=0, expected_seq=0, file_size=size)
                self._index.open_and_read()  # open, and valid = 0: rewritten whole from the rescan
                state = rescanned_state(scan, believed_end)
            state = self._with_created_at(state)
        except OSError as exc:
            with self._state_lock:
                self._close_fds()
            raise self._io_error("recovery read", exc) from exc
        # Keep the epoch only if every frame the old record vouched for is still there.
        keep = same_log and point is not None and point.end <= state.end
        vouched = point.end if keep and point is not None else 0
        epoch = point.epoch if keep and point is not None else new_epoch()
        try:
            if state.corrupt is None and state.torn_at is not None:
                truncate_torn(self.ops, fd, state.end, path=self.paths.log)  # never vouched for
                state = replace(state, torn_at=None, size=state.end)
            if state.end > vouched:
                # Frames a writer left without a record (it crashed between its write and its record,
                # or before its fdatasync): durable first, then vouched for. The index waits for this too.
                self.ops.fdatasync(fd)
            record = encode(
                CommitPoint(boot.boot_id(), epoch, self._ino, state.end, state.next_seq, state.corrupt)
            )
            if record != raw:
                write_raw(self.ops, pfd, record)
        except OSError as exc:
            # Never retry an fsync and trust it: cut what was not vouched for (never acknowledged) and
            # reopen from scratch next time.
            if keep:
                cut_back(self.ops, fd, vouched)
            with self._state_lock:
                self._close_fds()
            raise self._io_error("recovery", exc) from exc
        self._install(replace(state, point=record), epoch)

    def _extend_io(self, state: LogState, raw: bytes) -> bool:
        """Take in the frames the commit point ``raw`` vouches for past ``state`` (durable, so no verdict
        to make); False if it does not simply extend ``state`` in the same epoch (the caller reloads).
        Without the file lock, the record is read again after the scan (a seqlock: a tool invalidates it
        before it cuts). Caller holds ``_io_lock``."""
        point = decode(raw)
        if (
            point is None
            or point.epoch != self._epoch
            or not point.trusted_for(self._ino)
            or point.end < state.end
            or point.damage is not None
            or state.corrupt is not None
        ):
            return False
        assert self._log_fd is not None and self._point_fd is not None
        if point.end > state.end:
            result = scan_log(
                self.ops,
                self._log_fd,
                start=state.end,
                expected_seq=state.next_seq,
                last_recorded_at=state.last_at,
                last_version=state.version,
                file_size=point.end,
            )
            if result.state is not ScanState.CLEAN or result.end != point.end:
                return False
            again = decode(read_raw(self.ops, self._point_fd))
            if again is None or again.epoch != point.epoch or again.ino != point.ino:
                return False
            state = replace(absorb(state, result, judge(result, None)), size=max(state.size, point.end))
        if state.next_seq != point.next_seq:
            return False
        self._publish(self._with_created_at(replace(state, point=raw)))
        return True

    def _with_created_at(self, state: LogState) -> LogState:
        if state.created_at is not None or state.next_seq == 0 or self._log_fd is None:
            return state
        header = decode_header(self.ops.pread(self._log_fd, 64, 0))
        return replace(state, created_at=header.recorded_at if header else state.last_at)

    # ------------------------------------------------------------------ failures
    def _poison(self) -> None:
        """After a failed write/fsync: close everything; the next operation reopens with recovery.

        The failed write may sit in the page cache looking complete while the disk never got it
        (fsyncgate): cut the file back to the last acknowledged end so it is never served, and if even
        that fails, remember where it began: the next commit cuts it off before building on it. The
        commit point was not moved, so no reader took any of it in."""
        if self._log_fd is not None and not cut_back(self.ops, self._log_fd, self._state.end):
            self._unsafe_from = self._state.end
        with self._state_lock:
            self._close_fds()

    def _drop_unsafe_tail(self) -> None:
        """Cut off what a failed write left behind (see ``_poison``) before appending after it. Caller
        holds the file lock, with state just refreshed. Another process may have taken those frames in
        (recovery under the lock, its fdatasync "succeeding" after ours failed) and vouched for them:
        the commit point is invalidated before the cut, and the reload starts a new epoch."""
        cut, self._unsafe_from = self._unsafe_from, None
        assert cut is not None and self._log_fd is not None and self._point_fd is not None
        if self._state.end <= cut:
            return  # nothing of the failed write was taken in (a torn tail is truncated by recovery)
        try:
            write_raw(self.ops, self._point_fd, NO_RECORD)
            cut_failed_write(self.ops, self._log_fd, cut, self._state.end, path=self.paths.log)
        except OSError as exc:
            self._unsafe_from = cut  # still unsafe: try again at the next commit
            with self._state_lock:
                self._close_fds()
            raise self._io_error("truncate after a failed write", exc) from exc
        self._load_locked_io()  # a new epoch either way: the record was invalidated
