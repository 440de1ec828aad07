"""The files of one conversation log: descriptors, their generation, the published state, and every
operation on them. ``ConversationLog`` (conversation.py) holds one and runs the protocol: locks, group
commit, settling, reads. Nothing here takes the file lock or decides when to; a method says which of
the owner's locks its caller holds ("the I/O lock": ``_io_lock``). Its own lock, the descriptor guard
``_fd_readers``, is the innermost of conversation.py's lock order, held only briefly.

- ``state`` is ONE immutable ``recovery.LogState``, published by one assignment (``_publish``: only
  the I/O lock's holder builds and publishes states, and readers take the reference once, so no lock
  is needed to swap it); a reload keeps the old state published until the new one replaces it.
  Everything a published state holds is durable, and its ``point`` is the commit-point record
  (``commit_point``) it agrees with.
- A state names the descriptors it was read through (``LogState.generation``; bumped, under the guard,
  whenever descriptors close or are replaced), so a reader never reads a state's frames through a
  descriptor of another generation, nor through a closed one's reused number (``pread``, inside
  ``ReaderGuard``, which closing waits out).
- Two ways to load: ``load_unlocked``, only what the commit point vouches for (never a torn tail or a
  judgement of damage: any disagreement sends the caller to the lock); ``load_locked``, recovery's whole
  rule, after which what it found is made durable and the commit point rewritten.
- Under the file lock, an unchanged lock-file header (``unchanged``) stands for every check: nothing
  changed since this process left the flock (``commit_point``'s change counter).
- A failed write or fsync poisons the files (``poison``): the unacknowledged bytes are cut off (best
  effort; if the truncate fails, ``_failed`` makes the next recovery under the lock cut them, if still
  nobody vouched for them, before taking anything in: ``tail.cut_own_failed_write``).
"""

from __future__ import annotations

import logging
import os
from dataclasses import replace
from typing import Any

from ...core.errors import Io
from .. import boot
from ..durable_dirs import DurableDirs
from ..fileio import FileOps
from ..layout import ConversationPaths
from .commit_point import (
    RECORD_SIZE,
    CommitPoint,
    PointFile,
    commit_prefix,
    decode,
    encode,
    encode_commit,
    new_epoch,
)
from .freshness import Action, Record, decide, observe_locked
from .group_commit import ReaderGuard
from .held import holds
from .loading import mode_of, state_under_lock, vouched_state
from .recovery import EMPTY_STATE, LogState, extended, with_created_at
from .seq_index import SidecarIndex
from .tail import FailedWrite, cut_back, cut_own_failed_write, failed_write_at, trim, truncate_torn
from .writer import EncodedGroup, committed, preallocated, write_group

__all__ = ["LogFiles"]

log = logging.getLogger("logstore")
_NONE, _SAME, _OTHER, _SERVE, _RECOVER = Record.NONE, Record.SAME, Record.OTHER, Action.SERVE, Action.RECOVER


class LogFiles:
    def __init__(
        self, ops: FileOps, paths: ConversationPaths, dirs: DurableDirs, *, io_lock: Any = None,
        file_lock: Any = None
    ) -> None:
        self.ops, self.paths = ops, paths
        self._io_lock, self._file_lock = io_lock, file_lock  # the owner's, for ``held.holds`` (or None)
        self._dirs = dirs  # proven before a first frame is vouched for (``write``, ``load_locked``)
        # The descriptors' guard: readers mid-``pread`` count in; closing or replacing descriptors (and
        # bumping ``_generation``, which states name) waits for them and keeps new ones out.
        self._fd_readers = ReaderGuard()
        self._generation = 0  # of the open descriptors: bumped (under the guard) whenever they change
        # A failed write whose cut-back truncate failed too (still in the file); survives reloads until
        # the next recovery under the lock has cut it or found it is not ours to cut.
        self._failed: FailedWrite | None = None
        self._state: LogState = EMPTY_STATE
        self._epoch = b""  # the commit point's epoch the published state belongs to
        self._prefix: tuple[bytes, bytes] | None = None  # (boot id, its ``commit_prefix``); None: redo
        self._log_fd: int | None = None
        self._log_id: tuple[int, int, int] | None = None  # ``FileOps.file_id`` of ``_log_fd``
        self._point: PointFile | None = None  # the ``.lock`` file, for the commit point and its header
        self._trusted: bytes | None = None  # the header as we left the flock (``unchanged``), or None
        self._index = SidecarIndex(ops, paths.index)
        self._loaded = False
        self._chunk = 0  # the last chunk preallocated here (doubles with each growth)

    # ------------------------------------------------------------------ what readers see (no lock)
    @property
    def state(self) -> LogState:
        """The published state: one reference, never changed in place."""
        return self._state

    @property
    def has_log(self) -> bool:  # False before the first load, after close or poison, or with no log file
        return self._log_fd is not None

    def current(self) -> bool:
        """The fast path of every read, lock-free: the state agrees with the commit point (one ``pread``:
        ``freshness.decide``'s SAME -> SERVE, inline), or still no log. False (a failed read too): refresh."""
        if not self._loaded:
            return False
        try:
            with self._fd_readers:  # descriptors close only when no reader is inside
                point = self._point
                raw = None if point is None else point.read()
        except OSError:
            return False
        if raw is not None:
            return raw == self._state.point
        return self._log_fd is None and not self.ops.exists(self.paths.log)

    def pread(self, generation: int, offset: int, length: int) -> bytes | None:
        """``length`` bytes of the log at ``offset``, or None if its descriptors are not of ``generation``
        (a state's: ``LogState.generation``)."""
        with self._fd_readers:
            if self._generation != generation or self._log_fd is None:
                return None
            return self.ops.pread(self._log_fd, length, offset)

    def io_error(self, action: str, exc: OSError) -> Io:
        reason = exc.strerror or exc
        return Io(f"{action} failed for conversation log {self.paths.log}: {reason}", errno=exc.errno)

    # ------------------------------------------------------------------ internals
    def close(self) -> None:
        """Close every descriptor; a later load reopens them. Caller holds the I/O lock."""
        with self._fd_readers.exclusive():  # after every reader mid-``pread``
            self._generation += 1
            try:
                if self._log_fd is not None:
                    self.ops.close(self._log_fd)
            except OSError:
                pass
            if self._point is not None:
                self._point.close()
            self._log_fd = self._log_id = self._point = self._trusted = self._prefix = None
            self._index.close()
            self._loaded = False

    def _publish(self, state: LogState) -> None:
        self._state = state  # one reference (see the module docstring); its generation is the open one

    def _install(self, state: LogState, epoch: bytes) -> None:
        """A (re)loaded state: it names the descriptors it was read through."""
        if state.generation != self._generation:
            state = replace(state, generation=self._generation)
        # ``_loaded`` last (``current``); the commit point's prefix is the new epoch's (``write``).
        self._state, self._epoch, self._prefix, self._loaded = state, epoch, None, True

    @property
    def _ino(self) -> int:
        assert self._log_id is not None
        return self._log_id[2]  # ``file_id`` is (device major, device minor, inode)

    # ------------------------------------------------------------------ refreshing
    @holds("_io_lock")
    def refresh_unlocked(self) -> bool:
        """Take in what the commit point vouches for (``freshness.decide``: SERVE or LOAD). False if only
        recovery under the file lock can tell. Caller holds the I/O lock."""
        try:
            record = self._record()
        except OSError as exc:
            raise self.io_error("read", exc) from exc
        if decide(locked=False, record=record) is _SERVE:
            return True
        return self.load_unlocked()

    @holds("_file_lock", "_io_lock")
    def refresh_locked(self) -> bool:
        """Bring the state up to the file (``freshness.decide``: SERVE or RECOVER). Caller holds the file
        lock and the I/O lock. Bytes past the commit point can only be a writer's that died before its
        record or its fdatasync: recovery judges them and fdatasyncs what it keeps before vouching for it.
        A file the path no longer names (erased, replaced) is never appended to (tools also invalidate
        the record). Returns what ``load_locked`` returns (False when it was not needed)."""
        if self.unchanged():
            return False  # nothing changed since this process left the flock (``commit_point``)
        try:
            record, state, size = self._record(), self._state, None
            if record is _SAME:
                assert self._log_fd is not None
                size, past = observe_locked(self.ops, self._log_fd, self.paths.log, self._log_id, state)
                action = decide(locked=True, record=record, named=size is not None, past=past)
            else:
                action = decide(locked=True, record=record)
        except OSError as exc:
            raise self.io_error("refresh", exc) from exc
        if action is _RECOVER:
            return self.load_locked()
        if size is not None and size != state.size:  # another process grew or trimmed the unused tail
            self._publish(replace(state, size=size))
        self._trust()
        return False

    def unchanged(self) -> bool:
        """Under the file lock, no syscall: the lock file's header is as this process left it, so the state
        is every file's truth (``commit_point``'s change counter). Caller holds the I/O lock."""
        trusted, point = self._trusted, self._point
        return trusted is not None and point is not None and point.header() == trusted

    def _trust(self) -> None:
        """Under the file lock, proven to name the file locked, the state just brought up to every file:
        note the header as this holder leaves it. Caller holds the I/O lock."""
        point = self._point
        header = None if point is None or self._log_fd is None else point.header()
        self._trusted = header if header is not None and header[:RECORD_SIZE] == self._state.point else None

    def _record(self) -> Record:
        """The commit point against the published state once what it vouches for is taken in: ``SAME``
        or ``OTHER``; ``NONE`` if nothing is loaded. Holds the I/O lock."""
        if not self._loaded or self._log_fd is None or self._point is None:
            return _NONE
        raw = self._point.read()
        state = self._state
        if raw == state.point or self._extend(state, raw):
            return _SAME
        return _OTHER

    # ------------------------------------------------------------------ loading
    def _open_io(self) -> bool:
        """(Re)open the log and its lock file. False: there is no log (the empty state is installed).
        Caller holds the I/O lock."""
        self.close()  # the old state stays published until the new one replaces it whole
        try:
            fd = self.ops.open_writable(self.paths.log, os.O_RDWR)  # read-only data dir: reads work
        except FileNotFoundError:
            self._install(EMPTY_STATE, b"")
            return False
        except OSError as exc:
            raise self.io_error("open", exc) from exc
        try:
            self._log_id = self.ops.file_id(fd)
            self._point = PointFile.open(self.ops, self.paths.lock)
        except OSError as exc:
            try:
                self.ops.close(fd)
            except OSError:
                pass
            self._log_id = None
            raise self.io_error("open", exc) from exc
        self._log_fd = fd
        return True

    @holds("_io_lock")
    def load_unlocked(self) -> bool:
        """Load what the commit point vouches for, without the file lock. False when only recovery under
        the lock can tell (no record, another boot's, damage, another file, or the log disagrees): the
        caller then takes the lock. Caller holds the I/O lock."""
        try:
            if not self._open_io():
                return True
            assert self._log_fd is not None and self._point is not None
            found = vouched_state(self.ops, self._log_fd, self._point, self._index, ino=self._ino)
        except OSError as exc:
            self.close()
            raise self.io_error("recovery read", exc) from exc
        if found is None:
            return False
        self._install(*found)
        return True

    @holds("_file_lock", "_io_lock")
    def load_locked(self, *, believed_end: int | None = None) -> bool:
        """Recover under the file lock: the one place that judges torn tails and damage. What it finds is
        made durable before the commit point vouches for it. ``believed_end``: ignore the index and rescan
        from byte 0 (it disagreed with the log), where frames up to ``believed_end`` were served. Caller
        holds the file lock and the I/O lock. True: it took in frames no record vouched for (listed next)."""
        try:
            if not self._open_io():
                return False
            fd, pf = self._log_fd, self._point
            assert fd is not None and pf is not None
            raw = pf.load()
            point = decode(raw)
            size = self.ops.size(fd)
            same_log = point is not None and point.boot == boot.boot_id() and point.ino == self._ino
            mode = mode_of(point, same_log=same_log, believed_end=believed_end)
            state = state_under_lock(
                self.ops, fd, self._index, point, mode=mode, size=size, believed_end=believed_end
            )
            state = with_created_at(self.ops, self._log_fd, state)
        except OSError as exc:
            self.close()
            raise self.io_error("recovery read", exc) from exc
        if self._failed is not None and state.corrupt is None:  # (damage: the one verdict, and fsck's)
            try:
                pf.bump()  # before the log may change without the record moving (``commit_point``)
                cut = cut_own_failed_write(
                    self.ops, fd, self._failed, point, ino=self._ino, end=state.end, path=self.paths.log
                )
            except OSError as exc:
                self.close()  # still ours to cut: the next recovery tries again
                raise self.io_error("truncate after a failed write", exc) from exc
            self._failed = None
            if cut:  # nothing past the record now: recover again, from what it vouches for
                return self.load_locked(believed_end=believed_end)
        # Keep the epoch only if every frame the old record vouched for is still there.
        keep = same_log and point is not None and point.end <= state.end
        vouched = point.end if keep and point is not None else 0
        epoch = point.epoch if keep and point is not None else new_epoch()
        try:
            if state.corrupt is None and state.torn_at is not None:
                pf.bump()
                truncate_torn(self.ops, fd, state.end, path=self.paths.log)  # never vouched for
                state = replace(state, torn_at=None, size=state.end)
            if state.end > vouched:
                # Frames a writer left without a record (it crashed between its write and its record,
                # or before its fdatasync): durable first, then vouched for. The index waits for this too.
                self.ops.fdatasync(fd)
                if vouched == 0:  # its first frames: their writer may have died before their entry's fsync
                    self._dirs.log_entry(self.paths.directory)
            record = encode(
                CommitPoint(boot.boot_id(), epoch, self._ino, state.end, state.next_seq, state.corrupt)
            )
            if record != raw:
                pf.write(record)
        except OSError as exc:
            # Never retry an fsync and trust it: cut what was not vouched for (never acknowledged) and
            # reopen from scratch next time; if that cut fails, it is a failed write of ours (``poison``).
            if keep and not cut_back(self.ops, fd, vouched):
                self._failed = failed_write_at(self.ops, fd, epoch, vouched, state.end)
            self.close()
            raise self.io_error("recovery", exc) from exc
        self._install(replace(state, point=record), epoch)
        self._trust()
        return state.end > vouched

    def _extend(self, state: LogState, raw: bytes) -> bool:
        """Publish ``state`` extended to what the commit point ``raw`` vouches for (``recovery.extended``);
        False if it does not simply extend it (the caller reloads). Caller holds the I/O lock."""
        assert self._log_fd is not None and self._point is not None
        new = extended(self.ops, self._log_fd, self._point, state, raw, epoch=self._epoch, ino=self._ino)
        if new is None:
            return False
        self._publish(new)
        return True

    # ------------------------------------------------------------------ writing
    @holds("_file_lock", "_io_lock")
    def create(self) -> None:
        """Create the log (there is none: ``has_log`` is False after a refresh) and load it as new, with
        no scan. Caller holds the file lock and the I/O lock, and has made the manifest's record of it
        durable first (manifest ⊇ logs). The log's entry and its directory's (``durable_dirs``) are made
        durable by its first commit (``write``), also for a log an attempt left before syncing them, or by
        the recovery that takes in the first frames of a writer that died before syncing them.
        Before the log exists, a record at 0 in the new state's epoch: it holds for any inode, so a
        reader that finds the log serves it empty without waiting for a creator that stalls (without it,
        test_torture_kill9's readers timed out behind SIGSTOPped creators), and a failed first write is
        known as ours by its epoch. The first commit writes the second and last record of creation."""
        epoch = new_epoch()
        record = encode(CommitPoint(boot.boot_id(), epoch, 0, 0, 0))
        try:
            point = PointFile.open(self.ops, self.paths.lock)
        except OSError as exc:
            raise self.io_error("create", exc) from exc
        fd = -1
        try:
            point.write_new(record)  # a whole header, mapped: the first commit bumps its counter
            fd = self.ops.open(self.paths.log, os.O_RDWR | os.O_CREAT | os.O_EXCL)
            log_id = self.ops.file_id(fd)
        except FileExistsError:  # not under this lock: judge what is there like any log
            point.close()
            self.load_locked()
            return
        except BaseException as exc:  # an interrupt too: nothing owns them yet
            if fd >= 0:
                self.ops.close(fd)
            point.close()
            if isinstance(exc, OSError):
                raise self.io_error("create", exc) from exc
            raise
        with self._fd_readers.exclusive():
            self._generation += 1
            self._log_fd, self._log_id, self._point = fd, log_id, point
        self._index.open_new()
        self._chunk = 0
        self._install(LogState(bytearray(), point=record, generation=self._generation), epoch)
        self._trust()

    @holds("_file_lock", "_io_lock")
    def write(self, encoded: EncodedGroup) -> float:
        """Write a group's frames at the published end, make them durable, move the commit point, publish
        the new state and maybe extend the index (a hint, after the fsync: it never leads the log). Caller
        holds the file lock and the I/O lock, with state just refreshed (``encoded`` was built from it).
        Returns the ``fdatasync``'s seconds. Raises ``Io`` after poisoning: nothing of the group is
        acknowledged."""
        state, pf, fd = self._state, self._point, self._log_fd
        assert fd is not None and pf is not None and encoded.write_start == state.end
        boot_id, prefix = boot.boot_id(), self._prefix
        if prefix is None or prefix[0] is not boot_id:
            self._prefix = prefix = (boot_id, commit_prefix(boot_id, self._epoch, self._ino))
        point = encode_commit(prefix[1], encoded.end, encoded.next_seq)
        data, size, chunk = preallocated(state, encoded, self._chunk)
        try:
            pf.bump()  # before the frames: a writer killed before its record leaves them past it
            seconds = write_group(
                self.ops, fd, data, encoded.write_start, dirs=self._dirs, directory=self.paths.directory
            )
            pf.write(point)  # durable: the commit point moves, for everyone
        except OSError as exc:
            self.poison(encoded.data)
            raise self.io_error("write+fdatasync", exc) from exc
        self._chunk = chunk
        self._failed = None  # written at an end recovery found clean: nothing of a failed write is left
        new = committed(state, encoded, size=size, point=point)
        self._publish(new)
        self._trust()
        self._index.write(new.entries, new.frames, new.end)
        return seconds

    def trim_wanted(self) -> bool:
        """A preallocated tail to give back, index entries to write, or a failed write to cut (``poison``:
        a recovery under the lock cuts it before this object, and what it remembers, is gone)."""
        s, loaded = self._state, self._loaded and self._log_fd is not None
        return self._failed is not None or loaded and (s.size > s.end or self._index.valid < s.frames)

    @holds("_file_lock", "_io_lock")
    def trim_and_index(self) -> None:
        """Give back the unused tail, bring the index up to the log. Caller holds the file lock and the I/O
        lock, state just refreshed (frames taken in from another process are durable before indexed)."""
        state = self._state
        if self._log_fd is None:
            return
        if state.size > state.end and state.corrupt is None:
            assert self._point is not None
            self._point.bump()
            trim(self.ops, self._log_fd, state.end)
            self._publish(replace(state, size=state.end))
            self._trust()
        self._index.write(state.entries, state.frames, state.end, force=True)

    def sync_index(self) -> None:  # caller holds the I/O lock
        self._index.sync()

    def poison(self, frames: bytes = b"") -> None:
        """After a failed write/fsync of ``frames`` (at the published end): close everything; the next
        operation reopens with recovery.

        The failed write may sit in the page cache looking complete while the disk never got it
        (fsyncgate): cut the file back to the last acknowledged end so it is never served. If even the
        truncate fails, remember the write as only this writer knows it (``FailedWrite``): the next
        recovery under the lock cuts it before taking it in, unless another process vouched for it first.
        The commit point was not moved, so no reader took any of it in."""
        state = self._state
        if self._log_fd is not None and not cut_back(self.ops, self._log_fd, state.end) and frames:
            self._failed = FailedWrite(self._epoch, state.end, frames)
        self.close()
