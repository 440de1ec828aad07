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
- Compaction (a background thread, ``journal.fold``): create journal.<N+1>, seal journal.<N>, read
  snapshot.<N> + journal.<N>, write snapshot.<N+1> (temp + fsync + rename + dir fsync), delete the old
  files. A writer appends to the journal it holds, then one ``statx`` of its descriptor says whether it
  is still the current one (``journal.stale``); if not, it finds the newest journal by listing (any number of
  generations on), catches up and re-appends there. Every process that reaches a newer snapshot re-bases
  on it. In memory: ``ManifestTable`` (the packed snapshot plus an overlay).
- A failed journal write or sync may leave torn bytes: the journal is dropped and, before the next
  record, rolled (``journal.roll``): records never land after torn bytes, and the next compaction folds
  them away. So is a torn tail found on load.
"""

from __future__ import annotations

import errno
import logging
import threading
from collections.abc import Callable
from typing import TypeVar

from ...core.cursor import CursorCodec, CursorKey
from ...core.errors import Io
from ...core.models import ConversationListing, ConversationSummary, micros_to_datetime
from .. import layout
from ..fileio import FileOps
from ..log.conversation import CommitInfo
from ..statx import Ident
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
from .compaction import Compactor, compact_locked
from .journal import open_current, roll, stale
from .reconcile import Reconciliation, end_session, new_session
from .state import DiskState, read_state, read_tail
from .sweep_side import SweepSide
from .table import ManifestTable

__all__ = ["SiteManifest", "COMPACT_THRESHOLD"]

log = logging.getLogger("logstore")
COMPACT_THRESHOLD = 4 * 1024 * 1024  # journal bytes before a compaction is scheduled
_T = TypeVar("_T")
_RETRIES = 8  # listings before giving up on a manifest that changes under every read (a compaction each)


class SiteManifest(SweepSide):
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
        self._faulted = False  # a journal write or sync failed: no clean close mark (the next load sweeps)
        self._torn: int | None = None  # a journal that may end in torn bytes: roll before appending to it
        self._gen = 0  # the generation of the journal read (and appended to)
        self._base_gen = -1  # generation of the snapshot the table is based on
        self._journal_fd: int | None = None
        # Which file journal.<gen> was when read or opened: another one there, with no compaction to explain
        # it, means the manifest was removed and written again (a purge, then the site used again).
        self._journal_id: tuple[int, int, int] | None = None
        self._remark = False  # our session's open mark goes to the next journal opened (after a replacement)
        self._read_pos = 0  # bytes of the active journal already applied
        self._loaded = False
        self._damaged = False
        self._reconciliation: Reconciliation | None = None
        self._compactor = Compactor(f"logstore-compact-{site}", self.compact)
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
                self._compactor.schedule()

    def _io_error(self, action: str, exc: OSError) -> Io:
        return Io(f"manifest {action} failed for site {self.site}: {exc.strerror or exc}", errno=exc.errno)

    def _generations(self) -> Generations:
        try:
            return generations(self.ops.listdir(self.directory))
        except FileNotFoundError:
            return generations(())

    def _load(self) -> None:
        """Memory from the newest snapshot and every journal at or after its generation."""
        self._close_journal()

        def read(found: Generations) -> tuple[Generations, tuple[int, int, int] | None, DiskState]:
            named = self._file_id(found.newest)  # before the read: a replacement meanwhile is seen later
            return found, named, self._read_state(found.base, found.live_journals)

        found, self._journal_id, state = self._listed(read)
        self._gen = found.newest
        self._table, self._sessions, self._read_pos = state.table, state.sessions, state.pos
        self._damaged, self._marked, self._base_gen = state.damaged, state.marked, found.base
        self._no_manifest = not found.base and not found.live_journals
        if state.torn:  # a crash's torn tail (or a record in flight): no record goes after it
            self._torn = found.newest
        if len(found.live_journals) > 1:  # a roll (or a compaction) not folded yet
            self._compactor.schedule()

    def _listed(self, read: Callable[[Generations], _T]) -> _T:
        """``read(listing)``; listed and read again if a compaction folded a listed file in between (a
        vanished file is never taken for an empty or a damaged one)."""
        for _ in range(_RETRIES):
            found = self._generations()
            try:
                return read(found)
            except FileNotFoundError:
                continue
        raise OSError(errno.ESTALE, f"manifest of site {self.site} changed under {_RETRIES} reads")

    def _read_state(self, base: int, journals: list[int]) -> DiskState:
        def discover() -> list[str]:  # a damaged snapshot's last resort: the logs themselves
            return [cid for cid, _ in layout.iter_logs(self.ops, self.data_dir, self.site)]

        return read_state(self.ops, self.directory, base, journals, discover=discover)

    # ------------------------------------------------------------------ journal
    def _path(self, kind: str, gen: int) -> str:
        return layout.manifest_file(self.directory, kind, gen)

    def _close_journal(self) -> None:
        if self._journal_fd is not None:
            try:
                self.ops.close(self._journal_fd)
            except OSError:
                pass
            self._journal_fd = None

    def _journal(self) -> int:
        """The descriptor records go to: the newest journal, found by listing and confirmed by listing
        again once open (opened as a compaction started the next one, it would be stale at once). A
        journal that may end in torn bytes is rolled first."""
        if self._journal_fd is not None:
            return self._journal_fd
        self.ops.makedirs_durable(self.directory)
        for _ in range(_RETRIES):
            self._catch_up()
            if self._torn is not None and self._torn == self._gen:
                roll(self.ops, self.directory, self._gen)
                self._torn = None
                self._compactor.schedule()  # folds the torn journal away
                continue
            fd = open_current(self.ops, self.directory, self._gen)
            if fd is None:
                continue
            opened = self.ops.ident(fd).file_id
            if self._loaded and self._journal_id not in (None, opened):  # not the journal we read
                self.ops.close(fd)
                self._replaced()
                continue
            self._journal_fd, self._journal_id = fd, opened
            if self._remark and self._session is not None:  # a crash from here on is seen by the next load
                self.ops.append(fd, encode_mark(MARK_OPEN, self._session))
                self.ops.fdatasync(fd)
            self._remark = False
            return fd
        raise OSError(errno.ESTALE, f"no current manifest journal for site {self.site} in {_RETRIES} tries")

    def _append_bytes(self, data: bytes, *, sync: bool = False) -> None:
        """Append to the current journal, never to one nobody reads any more: after each write one
        ``statx`` of the descriptor says whether it is still current (``journal.stale``); if not, catch up
        to the newest journal by listing and append there too (a duplicate merges away). A failed write
        or sync drops the descriptor and marks the journal torn: the next append rolls to a new one."""
        try:
            for _ in range(_RETRIES):
                fd = self._journal()
                try:
                    self.ops.append(fd, data)
                    held = self.ops.ident(fd)
                    if stale(held) and self._moved(held):
                        continue
                    if sync:
                        self.ops.fdatasync(fd)
                except OSError:
                    self._faulted, self._torn = True, self._gen
                    raise
                break
            else:
                raise OSError(errno.ESTALE, f"manifest journal of site {self.site} moved {_RETRIES} times")
        except OSError as exc:
            self._close_journal()
            raise self._io_error("write", exc) from exc
        if held.size > COMPACT_THRESHOLD:
            self._compactor.schedule()

    def _moved(self, held: Ident) -> bool:
        """After a write to a journal that looks sealed or deleted: catch up; True if the record must go
        again (a newer journal, or this one deleted), False if nothing newer is listed (listing decides)."""
        gen = self._gen
        self._catch_up()
        if self._gen != gen:
            return True
        if held.nlink == 0:  # deleted with nothing newer: open it anew
            self._close_journal()
            return True
        return False

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
            self._append_record(cid, erased_entry(), sync=True)
            self._table.apply(cid, erased_entry())

    def _catch_up(self) -> None:
        """Apply records other processes appended; follow compactions and rolls to the newest journal,
        found by listing however many generations on (a deleted journal is not read: the newer snapshot
        holds it). A manifest never loaded (the erasure tool) is only positioned on the newest journal."""
        self._listed(self._advance)

    def _advance(self, found: Generations) -> None:
        named = self._file_id(self._gen)
        # Another file there, or ours gone with nothing newer listed (a compaction starts the next journal
        # before it deletes one): the manifest was removed, and maybe written again.
        other = self._journal_id not in (None, named) and (named is not None or found.newest <= self._gen)
        if self._loaded and (found.newest < self._gen or other):
            self._replaced()
            return
        self._journal_id = self._journal_id or named
        if found.newest != self._gen:
            self._close_journal()
        if not self._loaded:
            self._gen, self._read_pos, self._journal_id = found.newest, 0, self._file_id(found.newest)
        elif found.base > self._base_gen:
            self._rebase(found)
        else:
            self._apply_journal(self._gen, strict=False)  # gone only if nothing wrote it yet
            for gen in found.live_journals:
                if gen > self._gen:
                    self._gen, self._read_pos, self._journal_id = gen, 0, self._file_id(gen)
                    self._apply_journal(gen, strict=True)

    def _rebase(self, found: Generations) -> None:
        """Memory from the newest snapshot and its journals (what a fresh load reads): the overlay shrinks
        back to what changed since the compaction. Records whose journal write failed are applied again."""
        self._journal_id = self._file_id(found.newest)
        state = self._read_state(found.base, found.live_journals)
        for cid, entry in self._unwritten.items():
            state.table.apply(cid, entry)
        self._table, self._base_gen, self._read_pos = state.table, found.base, state.pos
        self._gen = found.newest

    def _replaced(self) -> None:
        """The manifest on disk is not the one we read (``_journal_id``): load it again. Records whose
        journal write failed were the old files' (no clean close mark: the next load reconciles)."""
        log.warning("manifest of site %s was replaced on disk (a purge?): loading it again", self.site)
        self._load()
        self._remark = self._session is not None

    def _file_id(self, gen: int) -> tuple[int, int, int] | None:
        named = self.ops.ident_at(self._path("journal", gen))
        return None if named is None else named.file_id

    def _apply_journal(self, gen: int, *, strict: bool) -> None:
        """Apply the records of ``journal.<gen>`` after ``_read_pos`` (FileNotFoundError if it is gone and
        ``strict``)."""
        try:
            data = read_tail(self.ops, self._path("journal", gen), self._read_pos)
        except FileNotFoundError:
            if strict:
                raise
            return
        if data:
            decoded = decode_journal(data)
            for cid, entry in decoded.records:
                self._table.apply(cid, entry)
            self._read_pos += decoded.pos

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
        """Cheap check for other processes' records: one stat of the active journal (its size: records
        appended; its mode and link count: a newer generation, ``journal.stale``)."""
        named = self.ops.ident_at(self._path("journal", self._gen))
        if named is None or stale(named) or self._base_gen < self._gen or named.file_id != self._journal_id:
            self._catch_up()
        elif named.size > self._read_pos:  # still the current journal: only its new bytes
            self._apply_journal(self._gen, strict=False)

    # ------------------------------------------------------------------ compaction
    def compact(self) -> bool:
        """Fold the journals into a new snapshot. Returns False if another process is compacting."""
        return compact_locked(self.ops, self.directory, caught_up=self._caught_up, read=self._read_state)

    def _caught_up(self) -> int:
        with self._lock:
            self._catch_up()
            return self._gen

    def close(self) -> None:
        """Stop the background threads; after a clean run, the session's close mark (fdatasynced)."""
        self._closed = True
        if self._reconciliation is not None:
            self._reconciliation.stop()
        self._compactor.close()  # a compaction in flight finishes before the store's files are let go
        with self._lock:
            session, self._session = self._session, None
            if session is not None:
                end_session(session)
            if session is not None and not self._unwritten and not self._faulted:
                try:
                    self._append_bytes(encode_mark(MARK_CLOSE, session), sync=True)
                except Io as exc:  # the next load reconciles: the only cost of a missing close mark
                    log.warning("%s", exc)
            self._close_journal()
