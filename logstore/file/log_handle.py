"""The descriptors and the published state of one conversation log: loading it by recovery, closing
and poisoning it. ``ConversationLog`` (conversation.py) builds the protocol on top: refresh, group
commit, reads. Split so that each file holds one concern; the lock order is conversation.py's.

- ``_state`` is ONE immutable ``recovery.LogState``, swapped whole under ``_state_lock`` (``_publish``);
  a reload keeps the old state published until the new one replaces it.
- ``_generation`` is bumped whenever descriptors close, so a reader that took a state with one
  generation never reads through a descriptor of another (``ReaderGuard``).
- A failed write or fsync poisons the handle (``_poison``): the unacknowledged bytes are cut off (best
  effort; if that fails too, ``_unsafe_from`` makes the next commit cut them before building on them).
"""

from __future__ import annotations

import logging
import os
import threading
from dataclasses import replace

from ..core.errors import Io, Unavailable
from .fileio import FileOps
from .frame import decode_header
from .group_commit import ReaderGuard
from .layout import ConversationPaths
from .locking import PathLock
from .log_tail import cut_back, cut_failed_write
from .recovery import EMPTY_STATE, LogState, recover, recovered_state
from .seq_index import SidecarIndex

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
        # Owned by this object alone and closed only by ``close`` (under ``_io_lock``, after which no
        # commit can start): see logstore/locking.py for why there is no shared registry.
        self._file_lock = PathLock(paths.lock)
        self._directory_ready = ops.exists(paths.directory)
        self._state_lock = threading.Lock()  # guards swapping ``_state`` and ``_generation``; brief
        self._io_lock = threading.Lock()  # one thread at a time touches descriptors/refreshes
        self._closed = False
        self._fd_readers = ReaderGuard()
        self._generation = 0  # bumped whenever descriptors are closed or state is rebuilt
        # Start of a failed write whose cleanup (truncate + fdatasync) failed too; survives reloads.
        self._unsafe_from: int | None = None
        self._state: LogState = EMPTY_STATE
        # ``corrupt`` as last judged under the file lock (None: none found). Damage that differs (set by a
        # scan without the lock, which may have read another process's write half done) is not believed
        # until a reload under the lock confirms it: ``_confirm_damage``, ``check_damage``. The damage, not
        # the state object: states derived from a judged one (a new size, the tail signature) keep it.
        self._damage_checked: tuple[int, str] | None = None
        self._log_fd: int | None = None
        self._log_id: tuple[int, int, int] | None = None  # ``FileOps.file_id`` of ``_log_fd``
        self._index = SidecarIndex(ops, paths.index)
        self._loaded = False
        self._chunk = 0  # the last chunk preallocated by this handle (doubles with each growth)

    def _close_fds(self) -> None:
        with self._fd_readers.exclusive():
            self._generation += 1
            if self._log_fd is not None:
                try:
                    self.ops.close(self._log_fd)
                except OSError:
                    pass
            self._log_fd = self._log_id = None
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
            self._log_id = self.ops.file_id(self._log_fd)  # kept: the refresh's one-statx check
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

    def _confirm_damage(self) -> None:
        """Damage seen without the file lock is believed only once recovery finds it under the lock: a
        writer in another process writes into a v2 log's preallocated tail, which the file size does not
        bound, so an unlocked scan can read a hole that is being filled. Caller holds ``_io_lock``."""
        self._file_lock.acquire(self.lock_timeout)
        try:
            with self._state_lock:
                self._load_locked_io()
                self._damage_checked = self._state.corrupt
        finally:
            self._file_lock.release()

    def check_damage(self) -> None:
        """Called by a reader about to report the damage in the state it read. That damage may be an
        unlocked scan's, published a moment before the thread that saw it confirms it under the file
        lock (another thread then raised ``Corrupted`` on a healthy log: kill -9 torture, CI). Waiting
        for ``_io_lock`` waits for that confirmation; if none is under way, confirm it here."""
        with self._io_lock:
            if self._closed:
                raise Unavailable("store is closed")
            if self._state.corrupt is not None and self._state.corrupt != self._damage_checked:
                self._confirm_damage()

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
