"""Per-site manifest: the listing index (created_at / last_appended_at per conversation).

Files in ``sites/<site>/manifest/`` (byte layout in docs/FORMAT.md, "Site manifest"):

    snapshot.<gen>   packed state of every journal with a lower generation (atomically replaced)
    journal.<gen>    append-only records and session marks; O_APPEND, shared by every process
    compact.lock     filelock taken only by the compactor

Rules:
- The manifest is a rebuildable index over the logs; the logs are the truth.
- A conversation's *creation* record is fdatasynced before its log file is created, so after any crash
  the manifest knows every conversation that exists on disk (manifest ⊇ logs).
- Commit records are written after the log's fdatasync (and before the append is acknowledged) and are
  not synced themselves (no second fsync on the append path).
- Sessions (``reconcile``): before its first log write a store fdatasyncs an *open* mark, at a
  clean close a *close* mark. A load that finds every session closed (or its process still running) and
  no damaged bytes trusts the manifest as is: no stat, no read of any log. Otherwise a background sweep
  reconciles every conversation with its log, and a conversation touched first is reconciled then; the
  sweep closes the crashed sessions when it is done.
- Records merge by max (``codec.merged``); the erasure record drops a conversation.
- Compaction (a background thread): create journal.<N+1>, read snapshot.<N> + journal.<N>, write
  snapshot.<N+1> (temp + fsync + rename + dir fsync), delete the old files. A writer appends to the newest
  journal, then re-appends to a newer one if it finds one. Every process that reaches generation N+1
  re-bases on snapshot.<N+1>. In memory: ``ManifestTable`` (the packed snapshot plus an overlay).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Iterator

import filelock

from ...core.cursor import CursorCodec, CursorKey
from ...core.errors import Io
from ...core.models import ConversationListing, ConversationSummary, micros_to_datetime
from .. import layout
from ..fileio import FILE_MODE, FileOps
from ..log.conversation import CommitInfo
from .codec import (
    MARK_CLOSE,
    MARK_OPEN,
    Entry,
    Generations,
    Session,
    decode_journal,
    encode_mark,
    encode_record,
    erased_entry,
    generations,
)
from .journal import ActiveJournal, read_tail
from .reconcile import Reconciliation, end_session, new_session
from .snapshot import encode_snapshot
from .state import DiskState, read_state
from .table import ManifestTable

__all__ = ["SiteManifest", "COMPACT_THRESHOLD"]

log = logging.getLogger("logstore")
COMPACT_THRESHOLD = 4 * 1024 * 1024  # journal bytes before a compaction is scheduled


class SiteManifest:
    def __init__(
        self,
        ops: FileOps,
        data_dir: str,
        *,
        site: str,
        cursor_key: bytes,
        open_conversation: Callable[[str], CommitInfo | None],
    ) -> None:
        self.ops = ops
        self.site = site
        self.data_dir = data_dir
        self.directory = layout.manifest_dir(data_dir, site)
        self._cursor_key = cursor_key
        self._cursors = CursorCodec(cursor_key, site)
        self.open_conversation = open_conversation
        self._lock = threading.RLock()
        self._table = ManifestTable()
        self._sessions: set[Session] = set()  # open in the state loaded (snapshot sessions + marks)
        # The state holds evidence of sessions (a v2 snapshot or a mark); no snapshot nor journal: a new site.
        self._marked = self._no_manifest = False
        self._session: Session | None = None  # ours, once its open mark is durable
        self._unwritten: dict[str, Entry] = {}  # applied, but their journal write failed
        self._gen, self._successor, self._unchecked = 0, (-1, ""), 0  # the last two: see _append_bytes
        self._base_gen = -1  # generation of the snapshot the table is based on
        self._active, self._remark = ActiveJournal(ops), False  # journal.<gen> as we hold it; _replaced
        self._read_pos = 0  # bytes of the active journal already applied
        self._loaded = False
        self._damaged = False
        self._reconciliation: Reconciliation | None = None
        self._compactor: threading.Thread | None = None
        self._compact_wanted = threading.Event()
        self._closed = False

    # ------------------------------------------------------------------ loading
    def ensure_loaded(self) -> None:
        with self._lock:
            if self._loaded:
                return
            try:
                self._load()
            except OSError as exc:  # reading the manifest failed: retryable
                raise self._io_error("load", exc) from exc
            self._loaded = True
            self._reconciliation = Reconciliation.start_if_needed(
                self, self._sessions, damaged=self._damaged, marked=self._marked, absent=self._no_manifest
            )
            if self._table.base.version == 1:  # written by release 41344b8: repack it, off this path
                self._schedule_compaction()

    def _io_error(self, action: str, exc: OSError) -> Io:
        return Io(f"manifest {action} failed for site {self.site}: {exc.strerror or exc}", errno=exc.errno)

    def _generations(self) -> Generations:
        try:
            return generations(self.ops.listdir(self.directory))
        except FileNotFoundError:
            return generations(())

    def _load(self) -> None:
        """Memory from the newest snapshot and every journal at or after its generation."""
        self._active.close()
        found = self._generations()
        self._gen = found.newest
        self._active.seen(self._path("journal", self._gen))
        state = self._read_state(found.base, found.live_journals)
        self._table, self._sessions, self._read_pos = state.table, state.sessions, state.pos
        self._damaged, self._marked, self._base_gen = state.damaged, state.marked, found.base
        self._no_manifest = not found.base and not found.live_journals

    def _read_state(self, base: int, journals: list[int]) -> DiskState:
        def discover() -> list[str]:  # a damaged snapshot's last resort: the logs themselves
            return [cid for cid, _ in layout.iter_logs(self.ops, self.data_dir, self.site)]

        return read_state(self.ops, self.directory, base, journals, discover=discover)

    # ------------------------------------------------------------------ reconciliation
    @property
    def reconciling(self) -> bool:
        return self._reconciliation is not None and self._reconciliation.running

    def wait_reconciled(self, timeout: float | None = None) -> bool:
        """Wait for the background reconciliation (if any); False on timeout."""
        return self._reconciliation is None or self._reconciliation.wait(timeout)

    def touch(self, cid: str, summary: Callable[[], CommitInfo | None]) -> None:
        """A conversation's first use: while the sweep runs, reconcile it now from its open handle."""
        if self._reconciliation is not None and self._reconciliation.running:
            self._reconciliation.touch(cid, summary)

    def entry(self, cid: str) -> Entry | None:
        with self._lock:
            return self._table.get(cid)

    def reconciled(self, cid: str, probed: Entry, info: CommitInfo | None, log_path: str) -> None:
        """Take in what recovery says of ``cid``'s log (None: no items), ``probed`` being the entry it was
        compared with. Lowering an entry (log gone or empty) only if no commit changed it meanwhile."""
        with self._lock:
            if info is not None:
                record = Entry(info.created_at, info.last_appended_at, info.log_size, info.next_seq)
                if self._table.apply(cid, record):
                    self._append_logged(cid, record)
            elif self._table.get(cid) != probed:
                return
            elif not self.ops.exists(log_path):
                self._append_logged(cid, erased_entry())  # the log is gone (an interrupted erasure)
                self._table.apply(cid, erased_entry())
            else:  # an empty log (cut back by fsck): not listed; fsck rebuilds the manifest
                self._table.force(cid, Entry(-1, -1, 0, 0))

    def sweep_ids(self) -> Iterator[str]:
        """Every conversation known now: the base by index (no list of a million ids), then the rest."""
        with self._lock:
            base, extra = self._table.base, self._table.added()
        yield from (base.id_at(i) for i in range(base.count))
        yield from extra

    def close_sessions(self, dead: set[Session]) -> None:
        """The sweep is done: make its records durable, then close the crashed sessions (in that order:
        a close mark must never outlive a record it vouches for)."""
        with self._lock:
            if self._closed:
                return
            self.begin_writes()  # evidence for the next load, even if nothing needed a record
            self.ops.fdatasync(self._journal())
            marks = b"".join(encode_mark(MARK_CLOSE, s) for s in dead)
            if marks:
                self._append_bytes(marks, sync=True)
            self._sessions -= dead
        log.info("manifest for site %s reconciled with its logs", self.site)

    # ------------------------------------------------------------------ journal
    def _path(self, kind: str, gen: int) -> str:
        return layout.manifest_file(self.directory, kind, gen)

    def _journal(self) -> int:
        active = self._active
        if active.fd is not None:
            if active.holds() or self.ops.exists(self._path("journal", self._gen + 1)):
                return active.fd  # (a compaction's successor: ``_append_bytes`` follows it)
            self._replaced()
        self.ops.makedirs_durable(self.directory)
        while (fd := active.open(self._path("journal", self._gen))) is None:  # None: not what we read
            self._replaced()
        # Always, once per journal per process: the creator may have died before its directory fsync,
        # and creation records synced into an entry that is not durable would vanish with it.
        self.ops.fsync_dir(self.directory)
        if self._remark and self._session is not None:
            self.ops.append(fd, encode_mark(MARK_OPEN, self._session))
            self.ops.fdatasync(fd)
        self._remark = False
        return fd

    def _replaced(self) -> None:
        """journal.<gen> is not the file we read or appended to, and no compaction explains it (journal.py):
        load what is on disk now; our session's open mark goes to the new journal before our next record.
        Records whose journal write failed were the old files' (no close mark: the next load reconciles)."""
        log.warning("manifest of site %s was replaced on disk (a purge?): loading it again", self.site)
        self._load()
        self._successor, self._remark = (-1, ""), self._session is not None

    def _append_bytes(self, data: bytes, *, sync: bool = False) -> None:
        """Append to the newest journal; if a compactor started a newer one meanwhile, append there too."""
        try:
            while True:
                fd = self._journal()
                self.ops.append(fd, data)
                if sync:
                    self.ops.fdatasync(fd)
                if self._successor[0] != self._gen:  # a compactor's next journal: one path per generation
                    self._successor = (self._gen, self._path("journal", self._gen + 1))
                if not self.ops.exists(self._successor[1]):
                    break
                self._catch_up()  # moves self._gen forward (and re-reads what others wrote)
            self._unchecked = (self._unchecked + 1) % 32  # the size only decides when to compact:
            size = self.ops.size(fd) if not self._unchecked else 0  # an fstat every 32 records
        except OSError as exc:
            self._active.close()
            raise self._io_error("write", exc) from exc
        if size > COMPACT_THRESHOLD:
            self._schedule_compaction()

    def _append_record(self, cid: str, entry: Entry, *, sync: bool = False) -> None:
        self._append_bytes(encode_record(cid, entry), sync=sync)

    def _append_logged(self, cid: str, entry: Entry) -> None:
        """A record whose loss only makes the listing lag: a failure is logged and remembered (no clean
        close mark then: the next load reconciles), not raised."""
        try:
            self._append_record(cid, entry)
        except Io as exc:
            self._unwritten[cid] = entry
            log.warning("%s", exc)

    def _seek_newest(self) -> None:
        """Position on the newest journal without loading (the erasure tool's never-loaded manifest)."""
        if not self._loaded and self._active.fd is None:
            self._gen = self._generations().newest
            self._read_pos = self.ops.stat_size(self._path("journal", self._gen)) or 0

    def begin_writes(self) -> None:
        """Before this store's first log write (creation, commit, erasure): the session's open mark,
        fdatasynced, so that a crash from here on is seen by the next load."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is None:
                self._seek_newest()
                session = new_session()
                self._append_bytes(encode_mark(MARK_OPEN, session), sync=True)
                self._session = session

    def record_created(self, cid: str) -> None:
        """Durably note that a conversation's log is about to be created (before it is). Written even when
        the manifest already knows ``cid``: the log is missing (that is why it is being created), so what
        is known may be an earlier attempt's record whose fdatasync failed (read back from the page cache
        but never durable), or a log another process erased since. Only that rare case costs a sync more."""
        with self._lock:
            self.ensure_loaded()
            self.begin_writes()
            entry = Entry(-1, -1, 0, 0)
            self._append_record(cid, entry, sync=True)
            self._table.apply(cid, entry)

    def record_commit(self, info: CommitInfo) -> None:
        """Note a durable append (called under the conversation lock, after the log's fdatasync)."""
        entry = Entry(info.created_at, info.last_appended_at, info.log_size, info.next_seq)
        with self._lock:
            try:
                self.ensure_loaded()
                self._table.apply(info.conversation_id, entry)
                self._append_logged(info.conversation_id, entry)
            except BaseException:  # not only Io (logged by _append_logged): no clean close mark, so the
                self._unwritten[info.conversation_id] = entry  # next load reconciles
                raise

    def record_erased(self, cid: str) -> None:
        """Durably note that ``cid``'s log was removed (erasure). The caller holds the conversation lock and
        removed the log first, so the manifest still lists every log on disk (manifest ⊇ logs). Works on a
        manifest that was never loaded (the CLI): the record goes to the newest journal."""
        with self._lock:
            self._seek_newest()
            self._append_record(cid, erased_entry(), sync=True)
            self._table.apply(cid, erased_entry())

    def _catch_up(self) -> None:
        """Apply records other processes appended; follow compactions to newer journals (re-basing on
        the new snapshot once it is there)."""
        while True:
            self._active.track(self._path("journal", self._gen))  # which file we read (journal.py)
            data = read_tail(self.ops, self._path("journal", self._gen), self._read_pos)
            if data:
                decoded = decode_journal(data)
                for cid, entry in decoded.records:
                    self._table.apply(cid, entry)
                self._read_pos += decoded.pos
            if not self.ops.exists(self._path("journal", self._gen + 1)):
                break
            self._active.close()
            self._gen += 1
            self._read_pos = 0
        if self._base_gen < self._gen and self.ops.exists(self._path("snapshot", self._gen)):
            self._rebase()

    def _rebase(self) -> None:
        """Memory from snapshot.<gen> + journal.<gen> (what a fresh load reads): the overlay shrinks back
        to what changed since the compaction. Records whose journal write failed are applied again."""
        state = self._read_state(self._gen, [self._gen])
        for cid, entry in self._unwritten.items():
            state.table.apply(cid, entry)
        self._table, self._base_gen, self._read_pos = state.table, self._gen, state.pos

    # ------------------------------------------------------------------ listing
    def list_page(self, cursor: str | None, limit: int) -> ConversationListing:
        with self._lock:
            self.ensure_loaded()
            try:
                self._refresh()
            except OSError as exc:
                raise self._io_error("refresh", exc) from exc
            after = None
            if cursor is not None:
                position = self._cursors.decode(cursor)
                after = (-position.last_appended_at, position.conversation_id)
            rows, has_more = self._table.page(after, limit) if limit else ([], False)
            if not limit:
                has_more = bool(self._table.page(after, 1)[0])
        summaries = [
            ConversationSummary(cid, micros_to_datetime(created), micros_to_datetime(last))
            for cid, created, last in rows
        ]
        end = CursorKey(rows[-1][2], rows[-1][0]) if rows else None
        return ConversationListing(summaries, self._cursors.next_cursor(cursor, end, has_more=has_more))

    def _refresh(self) -> None:
        """Cheap check for other processes' records: one stat of the active journal (still ours?)."""
        ours, size = self._active.check()
        if not ours and not self.ops.exists(self._path("journal", self._gen + 1)):
            self._replaced()
            return
        if (
            (size is not None and size > self._read_pos)
            or self.ops.exists(self._path("journal", self._gen + 1))
            or self._base_gen < self._gen
        ):
            self._catch_up()

    # ------------------------------------------------------------------ compaction
    def _schedule_compaction(self) -> None:
        if self._compactor is None or not self._compactor.is_alive():
            self._compactor = threading.Thread(
                target=self._compaction_loop, name=f"logstore-compact-{self.site}", daemon=True
            )
            self._compactor.start()
        self._compact_wanted.set()

    def _compaction_loop(self) -> None:
        while not self._closed:
            if not self._compact_wanted.wait(timeout=1.0):
                continue
            self._compact_wanted.clear()
            if self._closed:
                return
            try:
                self.compact()
            except Exception:  # noqa: BLE001 - compaction is an optimisation; the journal stays valid
                log.exception("manifest compaction failed for site %s", self.site)

    def compact(self) -> bool:
        """Fold the active journal into a new snapshot. Returns False if another process is compacting."""
        lock = filelock.FileLock(
            os.path.join(self.directory, layout.COMPACT_LOCK), mode=FILE_MODE, timeout=0, thread_local=False,
            fallback_to_soft=False, preserve_lock_file=True,
        )  # fmt: skip
        try:
            lock.acquire()
        except filelock.Timeout:
            return False
        try:
            with self._lock:
                self._catch_up()
                gen = self._gen
            new_journal = self._path("journal", gen + 1)
            fd = self.ops.open(new_journal, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            self.ops.close(fd)
            self.ops.fsync_dir(self.directory)
            # State as of snapshot.<gen> + journal.<gen>, read from disk (includes other processes).
            found = self._generations()
            base = max((g for g in found.snapshots if g <= gen), default=0)
            journals = [g for g in found.journals if base <= g <= gen]
            state = self._read_state(base, journals)
            snapshot = encode_snapshot(state.table.items(), state.sessions)
            del state
            self.ops.atomic_write(self._path("snapshot", gen + 1), snapshot)
            for old in (self._path("journal", gen), self._path("snapshot", gen)):
                if self.ops.exists(old):
                    self.ops.unlink(old)
            self.ops.fsync_dir(self.directory)
            with self._lock:
                self._catch_up()
            return True
        finally:
            lock.release()

    def close(self) -> None:
        """Stop the background threads; after a clean run, the session's close mark (fdatasynced)."""
        self._closed = True
        self._compact_wanted.set()
        if self._reconciliation is not None:
            self._reconciliation.stop()
        compactor = self._compactor
        if compactor is not None and compactor is not threading.current_thread():
            compactor.join()  # a compaction in flight finishes before the store's files are let go
        with self._lock:
            session, self._session = self._session, None
            if session is not None:
                end_session(session)
            if session is not None and not self._unwritten:
                try:
                    self._append_bytes(encode_mark(MARK_CLOSE, session), sync=True)
                except Io as exc:  # the next load reconciles: the only cost of a missing close mark
                    log.warning("%s", exc)
            self._active.close()
