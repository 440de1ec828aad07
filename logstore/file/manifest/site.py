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
- The journals (which one to append to, following compactions and rolls, noticing a purge's replacement)
  are ``site_journal.SiteJournal``'s; this module is the index over them. In memory: ``ManifestTable``
  (the packed snapshot plus an overlay); every process that reaches a newer snapshot re-bases on it.
- Compaction (a background thread, ``journal.fold``): create journal.<N+1>, seal journal.<N>, read
  snapshot.<N> + journal.<N>, write snapshot.<N+1> (temp + fsync + rename + dir fsync), delete the old
  files. Due when the journal outgrows ``max(COMPACT_THRESHOLD, snapshot / COMPACT_RATIO)`` (the
  snapshot's size: a compaction's cost is proportional to it, so its cost per record stays bounded at
  any site size; the journal a load replays stays proportional too), and checked again by the thread
  before it runs (appends that saw the journal past it while a compaction ran ask for one more).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable

from ...core.cursor import CursorCodec, CursorKey
from ...core.errors import Io
from ...core.models import ConversationListing, ConversationSummary, micros_to_datetime
from .. import layout
from ..fileio import FileOps
from ..log.recovery import LogState
from .codec import MARK_CLOSE, MARK_OPEN, Entry, Session, encode_mark, encode_record, erased_entry
from .compaction import Compactor, compact_locked
from .journal_sync import Held
from .reconcile import Reconciliation, end_session, new_session
from .site_journal import SiteJournal
from .state import DiskState, read_state
from .sweep_side import SweepSide
from .table import ManifestTable

__all__ = ["SiteManifest", "COMPACT_THRESHOLD", "COMPACT_RATIO"]

_new_entry = tuple.__new__
log = logging.getLogger("logstore")
# A compaction is due past max(COMPACT_THRESHOLD, snapshot bytes / COMPACT_RATIO) of journal: the first
# keeps small sites from compacting often, the second bounds the journal a load replays and the overlay
# in memory to a share of the snapshot (docs/PERFORMANCE.md, "Manifest compaction at scale").
COMPACT_THRESHOLD = 4 * 1024 * 1024
COMPACT_RATIO = 16


def _due_past(snapshot_bytes: int) -> int:
    """The rule above: kept per manifest as a number (``_compact_at``), set with the snapshot's size."""
    return max(COMPACT_THRESHOLD, snapshot_bytes // COMPACT_RATIO)


# Seconds ``close`` waits for creation records still being synced before it gives up its close mark.
SETTLE_TIMEOUT = 30.0


class SiteManifest(SweepSide):
    def __init__(
        self,
        ops: FileOps,
        data_dir: str,
        *,
        site: str,
        cursor_key: bytes,
        open_conversation: Callable[[str], LogState | None],
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
        self._loaded = False
        self._damaged = False
        self._compact_at = _due_past(0)  # journal bytes past which a compaction is due (the snapshot's)
        self._fold = False  # a compaction is due whatever the journal's size (a roll, damage, an old format)
        self._reconciliation: Reconciliation | None = None
        self._compactor = Compactor(f"logstore-compact-{site}", self._compact_if_due)
        self._journal = SiteJournal(ops, self.directory, site, schedule=self._fold_soon)
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
                self._fold_soon()

    def _io_error(self, action: str, exc: OSError) -> Io:
        return Io(f"manifest {action} failed for site {self.site}: {exc.strerror or exc}", errno=exc.errno)

    def _load(self) -> None:
        """Memory from the newest snapshot and every journal at or after its generation."""
        found, state = self._journal.load(self)
        self._table, self._sessions = state.table, state.sessions
        self._compact_at = _due_past(state.snapshot_bytes)
        self._damaged, self._marked = state.damaged, state.marked
        self._no_manifest = not found.base and not found.live_journals
        if len(found.live_journals) > 1:  # a roll (or a compaction) not folded yet
            self._fold_soon()

    # ``site_journal.Reader``: what the journal mechanics call back into (always under ``_lock``)
    @property
    def loaded(self) -> bool:
        return self._loaded

    def read_state(self, base: int, journals: list[int]) -> DiskState:
        def discover() -> list[str]:  # a damaged snapshot's last resort: the logs themselves
            return [cid for cid, _ in layout.iter_logs(self.ops, self.data_dir, self.site)]

        return read_state(self.ops, self.directory, base, journals, discover=discover)

    def take(self, records: list[tuple[str, Entry]]) -> None:
        apply = self._table.apply
        for cid, entry in records:
            apply(cid, entry)

    def rebase(self, state: DiskState) -> None:
        """Memory from the newest snapshot and its journals (what a fresh load reads): the overlay shrinks
        back to what changed since the compaction. Records whose journal write failed are applied again."""
        for cid, entry in self._unwritten.items():
            state.table.apply(cid, entry)
        self._table, self._compact_at = state.table, _due_past(state.snapshot_bytes)

    def replaced(self) -> None:
        """The manifest on disk is not the one we read: load it again. Records whose journal write failed
        were the old files' (no clean close mark: the next load reconciles)."""
        log.warning("manifest of site %s was replaced on disk (a purge?): loading it again", self.site)
        self._load()
        self._journal.remark = self._session is not None

    def open_mark(self) -> bytes | None:
        return None if self._session is None else encode_mark(MARK_OPEN, self._session)

    # ------------------------------------------------------------------ records
    def _append_bytes(self, data: bytes, *, sync: bool = False) -> None:
        try:
            size = self._journal.append(self, data, sync=sync)
        except OSError as exc:
            raise self._io_error("write", exc) from exc
        if size > self._compact_at:
            self._compactor.schedule()

    def _append_record(self, cid: str, entry: Entry, *, sync: bool = False) -> None:
        self._append_bytes(encode_record(cid, entry), sync=sync)

    def _append_logged(self, cid: str, entry: Entry) -> None:
        """A record whose loss only makes the listing lag: a failure is logged and remembered (no clean
        close mark then: the next load reconciles), not raised."""
        try:  # ``_append_bytes`` inlined, the journal's ``write``: two Python calls less per commit
            try:
                size = self._journal.write(self, encode_record(cid, entry))[0]
            except OSError as exc:
                raise self._io_error("write", exc) from exc
            if size > self._compact_at:
                self._compactor.schedule()
        except Io as exc:
            self._unwritten[cid] = entry
            log.warning("%s", exc)

    def begin_writes(self) -> None:
        """Before this store's first log write (creation, commit, erasure): the session's open mark,
        fdatasynced, so that a crash from here on is seen by the next load."""
        if self._session is not None:
            return
        with self._lock:
            if self._session is None:
                session = new_session()
                self._append_bytes(encode_mark(MARK_OPEN, session), sync=True)
                self._session = session

    def record_created(self, cid: str) -> None:
        """Durably note that a conversation's log is about to be created (before it is: the caller creates
        it only once this returns). Written even when the manifest already knows ``cid``: the log is
        missing (that is why it is being created), so what is known may be an earlier attempt's record
        whose fdatasync failed (read back from the page cache but never durable), or a log another process
        erased since. Only that rare case costs a sync more.

        Written under ``_lock``, synced after it is released (``journal_sync``): commits and listings of
        the site do not wait for this sync, and concurrent creators share one. Applied to the table only
        once durable (a creation is never listed, but the sweep and ``entry`` then only know durable
        ones); a failed sync raises Io and nothing is applied."""
        entry = Entry(-1, -1, 0, 0)
        held: Held | None = None
        failed = True
        try:
            with self._lock:
                self.ensure_loaded()
                self.begin_writes()
                try:
                    size, held = self._journal.append_held(self, encode_record(cid, entry))
                except OSError as exc:
                    raise self._io_error("write", exc) from exc
                if size > self._compact_at:
                    self._compactor.schedule()
            try:
                held.sync()
            except OSError as exc:
                raise self._io_error("write", exc) from exc
            failed = False
        finally:
            if held is not None:  # the journal's descriptor may close now; ``close`` may go on
                held.leave(failed=failed)
        with self._lock:
            self._table.apply(cid, entry)

    def record_commit(self, cid: str, state: LogState) -> None:
        """Note a durable append (called under the conversation lock, after the log's fdatasync), from
        the conversation's state after it (a log with items: both times set)."""
        assert state.created_at is not None and state.last_at is not None
        # tuple.__new__, not Entry(...): the NamedTuple's own __new__ is a Python call (PERFORMANCE.md)
        entry = _new_entry(Entry, (state.created_at, state.last_at, state.end, state.next_seq))
        with self._lock:
            try:
                if not self._loaded:  # (``ensure_loaded``'s own check, without taking the lock again)
                    self.ensure_loaded()
                self._table.apply(cid, entry)
                self._append_logged(cid, entry)
            except BaseException:  # not only Io (logged by _append_logged): no clean close mark, so the
                self._unwritten[cid] = entry  # next load reconciles
                raise

    def record_erased(self, cid: str) -> None:
        """Durably note that ``cid``'s log was removed (erasure). The caller holds the conversation lock and
        removed the log first, so the manifest still lists every log on disk (manifest ⊇ logs). Works on a
        manifest that was never loaded (the CLI): the record goes to the newest journal."""
        with self._lock:
            self._append_record(cid, erased_entry(), sync=True)
            self._table.apply(cid, erased_entry())

    # ------------------------------------------------------------------ listing
    def list_page(self, cursor: str | None, limit: int) -> ConversationListing:
        with self._lock:
            self.ensure_loaded()
            try:
                self._journal.refresh(self)
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

    # ------------------------------------------------------------------ compaction
    def _fold_soon(self) -> None:
        """A compaction whatever the journal's size (a roll's torn journal, damage, an old format)."""
        self._fold = True
        self._compactor.schedule()

    def _compact_if_due(self) -> bool:
        """The compactor thread's run: compact if asked to fold, or if the current journal (caught up:
        another process may have compacted already) is still past the threshold."""
        with self._lock:
            forced, self._fold = self._fold, False
            if not forced:
                try:
                    self._journal.catch_up(self)
                except OSError as exc:
                    raise self._io_error("refresh", exc) from exc
                if self._journal.size() <= self._compact_at:
                    return False
        return self.compact()

    def compact(self) -> bool:
        """Fold the journals into a new snapshot. Returns False if another process is compacting."""
        return compact_locked(self.ops, self.directory, caught_up=self._caught_up, read=self.read_state)

    def _caught_up(self) -> int:
        with self._lock:
            self._journal.catch_up(self)
            return self._journal.gen

    def close(self) -> None:
        """Stop the background threads; after a clean run, the session's close mark (fdatasynced)."""
        self._closed = True
        if self._reconciliation is not None:
            self._reconciliation.stop()
        self._compactor.close()  # a compaction in flight finishes before the store's files are let go
        with self._lock:
            # Creation records held for a sync outside the lock get their outcome first: the close mark
            # vouches for them (their syncs never take ``_lock``, so waiting under it is safe). Unsettled
            # after the bound: no close mark (the next load reconciles), never a hang.
            settled = self._journal.settle(SETTLE_TIMEOUT)
            session, self._session = self._session, None
            if session is not None:
                end_session(session)
            if session is not None and settled and not self._unwritten and not self._journal.failed:
                try:
                    self._append_bytes(encode_mark(MARK_CLOSE, session), sync=True)
                except Io as exc:  # the next load reconciles: the only cost of a missing close mark
                    log.warning("%s", exc)
            self._journal.close()
