"""One conversation: the protocol (locks, group commit, settling, reads) over its files (``LogFiles``:
the log, its sidecar index and its commit point, their descriptors and the published state).

- State: ONE immutable ``recovery.LogState`` (entries, end, next seq, timestamps, tail, damage, the
  commit point record it agrees with, the descriptors it was read through), replaced whole by each
  commit and refresh (one assignment, by the ``_io_lock`` holder only); readers take the reference
  once. Everything a published state holds is durable. This class never touches a descriptor or the
  state itself: it calls ``LogFiles``, whose methods say which of this class's locks they need.
- Appends: one leader per group (``group_commit``) takes the cross-process lock, refreshes against the
  commit point and the file, writes every frame with one ``pwrite`` and one ``fdatasync``, moves the
  commit point (``commit_point``), publishes the new state, extends the index (a hint: may lag, never
  lead) and wakes the followers. Acknowledged only after all of that. A failed write or fsync poisons the
  files (``LogFiles.poison``): the unacknowledged bytes are cut off, descriptors closed, the next
  operation reopens with recovery.
- Reads (``reads``) start with one ``pread`` of the commit point: if it is the record the published
  state agrees with, the state is current (no other syscall); if it moved, the frames it vouches for are
  taken in (durable: no torn tail to judge), else the log is loaded again without the file lock. A read
  that starts after any process's acknowledgement sees it (the record was written before it), and no
  read sees a batch before its ``fdatasync`` returned (the record moves after it). While the record
  vouches for the log, a reader takes no flock and waits at most for one commit's ``_io_lock``. It takes
  the flock only where bytes the record does not vouch for must be judged (only recovery under the lock
  may): when the lock-free load cannot tell (no record, another boot's, another file, damage the record
  does not name, a log that disagrees: ``_refresh_under_lock``, waiting up to ``lock_timeout``, also
  behind a local commit's flock wait); when a read finds frames past the record (a dead writer's, to be
  taken in as the next append would: ``_settle_if_free``, one flock try; skipped while a commit holds
  the commit lock, waits for another settle); when the index disagrees with the log (a rescan, up to
  ``lock_timeout``: ``_verify_and_rebuild``).
- An index entry that disagrees with the log is never served: the log is rescanned under the lock and
  the index rewritten. A bad frame inside the acknowledged region is ``Corrupted(path, offset)``: reads
  before it work, appends stop.

Lock order (one name per lock; never take a lock to the left while holding one to its right):
  ``_commit_lock`` (the one thread of this process that may use the file lock: commits, locked
  refreshes, trims)
  -> ``_file_lock`` (the cross-process flock)
  -> ``_io_lock`` (one thread touches descriptors and builds state; the leader holds it only once it has
  the flock, for refresh + write + fsync + publish)
  -> ``LogFiles._fd_readers`` (the descriptor guard: readers mid-``pread`` count in; closing or replacing
  descriptors waits for them; held briefly, never for I/O but closing descriptors).
  The group-commit queue lock is a leaf, taken with none of these held.
"""

from __future__ import annotations

import errno
import logging
import threading
import time
from collections.abc import Callable
from functools import partial

from ...core import observe
from ...core.errors import Corrupted, Io, Timeout, Unavailable
from ...core.models import MemoryItem, SeqRange
from ..durable_dirs import DurableDirs
from ..fileio import FileOps
from ..layout import ConversationPaths
from ..locking import PathLock
from .files import LogFiles
from .frame import PREFIX_SIZE
from .freshness import Action, Record, decide, past_in
from .group_commit import AppendRequest, GroupCommit
from .held import holds, new_lock
from .reads import corrupted, decode_region, items_of
from .recovery import LogState
from .seq_index import IndexMismatch, locate
from .writer import encode_group

__all__ = ["ConversationLog", "AppendRequest"]

log = logging.getLogger("logstore")
_DIRECTORY_TRIES = 8  # creating the directory and locking in it, while a purge may remove it
_SAME, _SETTLE = Record.SAME, Action.SETTLE  # globals: an Enum member off its class costs more (freshness)


def _nothing() -> None:
    pass


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
        dirs: DurableDirs,
        on_create: Callable[[str], None] | None = None,
        on_commit: Callable[[str, LogState], None] | None = None,
    ) -> None:
        self.conversation_id = conversation_id
        self.paths = paths
        self.lock_timeout = lock_timeout
        # Optimistic: a missing directory shows as the lock file's ENOENT (no ``access`` per open).
        self._directory_ready = True
        self._dirs = dirs
        self._on_create = on_create
        self._on_commit = on_commit
        # Owned by this object alone and closed only by ``close`` (under ``_commit_lock``, after which no
        # commit can start): see logstore/locking.py for why there is no shared registry.
        self._file_lock = PathLock(paths.lock)
        # The one thread of this process that may hold the file lock (flock belongs to the open file
        # description, so two threads of one owner would both "hold" it): commits, locked refreshes,
        # trims. Taken *before* the file lock, so readers (``_io_lock``) never wait behind a flock wait.
        self._commit_lock = new_lock()  # (``held``: a lock that knows its holder with LOGSTORE_DEBUG_LOCKS)
        self._io_lock = new_lock()  # one thread at a time touches descriptors/builds state
        self._files = LogFiles(ops, paths, dirs, io_lock=self._io_lock, file_lock=self._file_lock)
        self._closed = False
        self._group = GroupCommit(self._commit_io)
        self._settling: threading.Event | None = None  # set while a settle holds ``_commit_lock``

    def summary(self) -> LogState | None:
        """The published state, for the manifest's reconciliation after a crash (its created/last
        timestamps, end and next seq); None if the log holds no items. A writer that died may have left
        durable frames no commit point vouches for yet: if the file lock is free at once, recovery under
        it takes them in (so the listing and every later read agree); if a live writer holds it, that
        writer records its own commit."""
        self._ensure_fresh()
        self._settle_if_free()
        state = self._files.state
        return None if state.created_at is None or state.last_at is None else state

    # ------------------------------------------------------------------ closing
    def close(self) -> None:
        """Trim the unused tail (if the lock is free at once), write the index, close everything."""
        with self._commit_lock:  # waits for a commit in flight; none starts after (``_closed``)
            try:
                self._trim_now()
            finally:
                with self._io_lock:
                    self._closed = True
                    self._files.close()
                self._file_lock.close()

    def sync_index(self) -> None:
        """fdatasync the index (on clean close), so the next open scans less of the log."""
        with self._commit_lock:
            self._trim_now()  # the index is written under the file lock only (a stale writer cuts)
            with self._io_lock:
                self._files.sync_index()

    @holds("_commit_lock")
    def _trim_now(self) -> None:
        """Clean close or eviction: give back the preallocated tail and bring the index up to the log,
        so a closed conversation costs no unused chunk and its next open scans nothing. Best effort, and
        only if the file lock is free at once (another process appending owns the tail now). Caller holds
        ``_commit_lock``."""
        if self._closed or not self._files.trim_wanted():
            return  # nothing to give back, nothing to index: no lock taken
        try:
            self._file_locked(self._trim_io, wait=False)  # one try: closing never waits on another process
        except (OSError, Io, Unavailable, Corrupted) as exc:
            log.warning("could not trim %s on close: %s", self.paths.log, exc)

    def _trim_io(self) -> None:
        self._refresh_locked_io()
        self._files.trim_and_index()

    # ------------------------------------------------------------------ freshness
    def _ensure_fresh(self) -> None:
        """Make the published state at least as new as the commit point: every batch acknowledged by
        any process before this call, and nothing that is not durable."""
        if self._closed:
            raise Unavailable("store is closed")
        if self._files.current():
            return  # the fast path: one pread
        with self._io_lock:  # ``with``, not acquire(): an interrupt cannot land between take and try
            fresh = self._refresh_unlocked_io()
        if not fresh:
            self._refresh_under_lock()

    def _settle_if_free(self) -> None:
        """Recovery under the file lock if it is free at once: a read found bytes past the commit point,
        which with the lock free can only be a dead writer's frames, maybe durable, never acknowledged.
        Taking them in now (``LogFiles.load_locked`` fdatasyncs them and moves the record) makes this read
        agree with the next append, which would take them in anyway. A busy lock is a live
        writer mid-commit: its frames are its own to record. A local commit in flight (``_commit_lock``
        taken: it may be waiting for the flock) takes them in itself: a reader never waits behind it.
        Another settle in progress (the reconciliation after a crash runs one per conversation) is waited
        for: it never waits for the flock, and skipping it would serve this read without the frame it takes
        in (a client's "was my batch stored?" would say no, and its resend would be a duplicate)."""
        if self._commit_lock.locked():
            settling = self._settling
            if settling is not None:
                settling.wait(self.lock_timeout)
            return
        done = threading.Event()
        with self._commit_lock:  # ``with``: an interrupt cannot land between take and try
            if self._closed:
                raise Unavailable("store is closed")
            try:
                self._settling = done
                self._file_locked(self._refresh_locked_io, wait=False)
            finally:
                self._settling = None
                done.set()

    @holds("_io_lock")
    def _refresh_unlocked_io(self) -> bool:
        """Take in what the commit point vouches for. False if only recovery under the file lock can tell.
        Caller holds ``_io_lock``."""
        if self._closed:
            raise Unavailable("store is closed")
        return self._files.refresh_unlocked()

    def _refresh_under_lock(self) -> None:
        with self._commit_lock:
            self._file_locked(self._refresh_locked_io, wait=True)

    @holds("_commit_lock")
    def _file_locked(
        self,
        work: Callable[..., None],
        *args: object,
        wait: bool,
        lock: Callable[[float], None] | None = None,
    ) -> bool:
        """The acquire sequence, written once (the lock order above): closed check -> the file lock
        (``lock``, default ``_lock_file``: waiting up to ``lock_timeout`` and raising ``Timeout``, or with
        ``wait=False`` one try, returning False if another owner holds it) -> ``_io_lock`` -> closed check
        -> ``work(*args)``. The file lock is released on every path, interrupts included. Caller holds
        ``_commit_lock`` (taken first, so readers never wait behind a flock wait)."""
        if self._closed:  # before the lock fd could be reopened after close() closed it
            raise Unavailable("store is closed")
        try:
            try:
                (lock or self._lock_file)(self.lock_timeout if wait else 0.0)
            except Timeout:
                if wait:
                    raise
                return False
            with self._io_lock:  # ``with``, not acquire(): an interrupt cannot land between take and try
                if self._closed:
                    raise Unavailable("store is closed")
                work(*args)
            return True
        finally:
            self._file_lock.release()

    @holds("_commit_lock")
    def _lock_file(self, timeout: float) -> None:
        """Take the cross-process file lock (``PathLock``: it proves the path still names the file it
        locked). If that is another file than the one held before (a purge unlinked the old one under its
        flock), the descriptors are dropped, the commit point's among them (it is read through its own
        descriptor of the lock file): the next refresh reloads from the paths. Caller holds
        ``_commit_lock``."""
        if self._file_lock.acquire(timeout, unchanged=self._unchanged):
            with self._io_lock:
                self._files.close()

    @holds("_commit_lock")
    def _unchanged(self) -> bool:
        """Nothing changed the conversation's files since this process left the file lock (no syscall:
        ``LogFiles.unchanged``). Caller holds ``_commit_lock`` and the file lock."""
        with self._io_lock:
            return self._files.unchanged()

    @holds("_commit_lock", "_file_lock", "_io_lock")
    def _refresh_locked_io(self) -> None:
        """Bring the state up to the file (``LogFiles.refresh_locked``: recovery judges any bytes past the
        commit point). Caller holds ``_commit_lock``, the file lock and ``_io_lock``."""
        if self._closed:
            raise Unavailable("store is closed")
        if self._files.refresh_locked():
            self._record_adopted()

    def _record_adopted(self) -> None:
        """Recovery under the lock took in durable frames no commit point vouched for (a writer that died
        after its fdatasync): record them in the manifest as that writer's commit would have. Else the
        listing lags the log until a restart's reconciliation, and a reconciliation that summarised the
        conversation through another handle while this one held the file lock kept the older time."""
        state = self._files.state
        if self._on_commit is None or state.created_at is None or state.last_at is None:
            return
        try:
            self._on_commit(self.conversation_id, state)
        except Exception:  # the listing lags (reconciled at the next load); reads and appends go on
            log.exception("manifest record of frames recovery took in to %s", self.paths.log)

    # ------------------------------------------------------------------ appends
    def append(self, request: AppendRequest) -> SeqRange:
        """Commit one batch (group commit with concurrent callers). Blocks until durable or failed."""
        return self._group.submit(request)

    def _commit_io(self, group: list[AppendRequest]) -> None:
        with self._commit_lock:
            self._file_locked(self._commit_group, group, wait=True, lock=self._lock_in_directory)

    @holds("_commit_lock")
    def _lock_in_directory(self, timeout: float) -> None:
        """``_lock_file`` for a commit, which may create the conversation's directory. The directory, or a
        parent of it, may go while we create it or lock in it (a purge removing the site's tree, from the
        bottom up): a new conversation starts there, as in a directory never created. Bounded: a purge
        removes each directory once. Caller holds ``_commit_lock``."""
        for attempt in range(1, _DIRECTORY_TRIES + 1):
            last = attempt == _DIRECTORY_TRIES
            if not self._directory_ready:  # the file lock lives there
                try:
                    self._dirs.make_log_dir(self.paths.directory)
                except OSError as exc:
                    if exc.errno == errno.ENOENT and not last:
                        continue
                    raise self._files.io_error("mkdir", exc) from exc
                self._directory_ready = True
            try:
                self._lock_file(timeout)
                return
            except Io as exc:
                if exc.errno != errno.ENOENT or last:
                    raise
                if self.paths.directory in self._dirs:  # proven, then removed: a purge
                    self._dirs.forget()
                self._directory_ready = False

    @holds("_commit_lock", "_file_lock", "_io_lock")
    def _commit_group(self, group: list[AppendRequest]) -> None:
        """Caller holds ``_commit_lock``, the file lock and ``_io_lock``."""
        files = self._files
        self._refresh_locked_io()
        if not files.has_log:
            on_create = self._on_create
            record = _nothing if on_create is None else partial(on_create, self.conversation_id)
            try:  # durable manifest record first (manifest ⊇ logs), the directory's entries at once
                self._dirs.log_dir_alongside(self.paths.directory, record)
            except OSError as exc:
                raise files.io_error("mkdir", exc) from exc
            files.create()
        corrupt = files.state.corrupt
        if corrupt is not None:
            offset, reason = corrupt
            raise Corrupted(
                f"conversation log {self.paths.log} is corrupted at byte {offset} ({reason}); "
                "appends are refused until it is repaired (logstore fsck)",
                path=self.paths.log,
                offset=offset,
            )
        self._write_group(group)

    @holds("_commit_lock", "_file_lock", "_io_lock")
    def _write_group(self, group: list[AppendRequest]) -> None:
        state = self._files.state
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
            fsync_seconds = self._files.write(encoded)
        except Io as error:  # the files are poisoned: no batch of the group is acknowledged
            for req, _ in encoded.accepted:
                req.error, req.done = error, True
            return
        new = self._files.state
        for req, first in encoded.accepted:
            req.result, req.done = SeqRange(first, first + req.count - 1), True
        # The batches are durable and acknowledged: a failure from here on is reported, never theirs, and
        # one of these never keeps the other from running (the manifest's listing must not stay behind).
        try:
            if self._on_commit is not None:
                self._on_commit(self.conversation_id, new)  # the manifest's listing: its times, end, seq
        except Exception:
            log.exception("manifest record after a durable commit to %s", self.paths.log)
        try:
            observer = observe.current()
            if observer is not None:
                nbytes = encoded.end - encoded.write_start
                observer.commit(
                    requests=len(encoded.accepted), nbytes=nbytes, fsync_seconds=fsync_seconds
                )
        except Exception:
            log.exception("observer after a durable commit to %s", self.paths.log)

    # ------------------------------------------------------------------ reads
    def read(self, start: int | None, limit: int) -> list[MemoryItem]:
        """Items ``[start, start+limit)``; with ``start=None``, the last ``limit`` items.

        A read that reaches the end also reads the ``PREFIX_SIZE`` bytes past it (the same ``pread``): a
        writer of another process that died between its ``fdatasync`` and its commit point left a frame
        there, durable and never acknowledged, and the record did not move. With the file lock free it is
        taken in first (``_settle_if_free``), as the next append would: else a client's "was my batch
        stored?" read says no and its resend is a duplicate. A live writer's frame is never served."""
        if limit <= 0:
            return []
        self._ensure_fresh()
        files, looked = self._files, False
        for _attempt in range(4):
            state = files.state  # one reference: it names the descriptors it was read through
            first = max(0, state.next_seq - limit) if start is None else start
            if state.corrupt is not None and (start is None or first + limit > state.next_seq):
                # Judged under the file lock (the only place damage is judged). The tail is unknown past
                # the damage, and a short page would wrongly say "end of log".
                raise corrupted(self.paths.log, *state.corrupt)
            stop = min(first + limit, state.next_seq)
            look = not looked and state.corrupt is None and first + limit >= state.next_seq
            if first >= stop and (not look or not files.has_log):  # (no fd: no log, nothing past it)
                return []
            try:
                bounds: list[tuple[int, int]] = []
                region_start = region_end = state.end
                if first < stop:
                    bounds, region_end = locate(state.entries, state.frames, first, stop, state.end)
                    region_start = bounds[0][0]
                size = region_end - region_start
                data = files.pread(state.generation, region_start, size + (PREFIX_SIZE if look else 0))
                if data is None:  # descriptors were swapped under us (poison/reload): take a new snapshot
                    self._ensure_fresh()
                    continue
                past = past_in(data[size:]) if look else None
                if past is not None and decide(locked=False, record=_SAME, past=past) is _SETTLE:
                    looked = True
                    self._settle_if_free()
                    continue
                if first >= stop:
                    return []
                frames = decode_region(data, region_start, bounds, stop, size=size)
            except IndexMismatch:
                self._verify_and_rebuild(state.end)
                continue
            except OSError as exc:
                raise files.io_error("read", exc) from exc
            return items_of(frames, first, stop, path=self.paths.log)
        raise Unavailable(f"conversation {self.conversation_id} kept changing under a read; retry")

    def _verify_and_rebuild(self, believed_end: int) -> None:
        """The index disagreed with the log: rescan the whole log (the truth) under the file lock and
        rebuild the index. If the scan stops inside what we served as good, that is corruption there."""
        def rebuild() -> None:
            if self._files.load_locked(believed_end=believed_end):
                self._record_adopted()

        with self._commit_lock:
            self._file_locked(rebuild, wait=True)
        log.warning(
            "rebuilt in-memory index of %s from the log (%d frames)", self.paths.log, self._files.state.frames
        )
