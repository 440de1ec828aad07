"""One process's hold on a site manifest's journals (the mechanics; the listing index is ``site``): which
generation it has read and appends to, how far it has read it, the descriptor it appends with.

- Appending: to the newest journal, found by listing and confirmed by listing again once open
  (``journal.open_current``); after each write one ``statx`` of the held descriptor says whether it is still
  the current one (``journal.stale``: sealed or deleted); if not, catch up to the newest journal by listing
  (any number of generations on) and write the record there too (a duplicate merges away). Once proven
  current, the manifest's fence (``fence``: a counter every sealer and remover bumps first, read from a
  shared mapping) stands for that ``statx`` until it changes (and once per ``CHECK_BYTES`` appended).
- A failed write or sync may leave torn bytes: the descriptor is dropped and the journal marked torn; the
  next record first rolls to a new journal (``journal.roll``), so records never land after torn bytes. So
  is a torn tail found on load, and so is a descriptor whose sync outside the reader's lock failed
  (``journal_sync``: seen by the next write).
- Syncing: a record that needs one is synced through the descriptor's ``journal_sync.SyncGroup``, under
  the reader's lock (``append(sync=True)``) or after it is released (``append_held``, then ``Held.sync``:
  creation records); one fdatasync covers every record written before it began.
- Catching up: the new bytes of the journal read; a compaction's newer snapshot re-bases the reader (what
  a fresh load reads); another file at a journal's name, or ours gone with nothing newer, means the
  manifest was removed and maybe written again (a purge): the reader loads it again.

What it reads goes to its ``Reader`` (``SiteManifest``): records to apply, states to re-base on, a
replacement to reload from. It holds no lock of its own: every call is under the reader's, but for
``Held.sync``/``Held.leave`` and ``settle`` (``journal_sync`` has the locks they take)."""

from __future__ import annotations

import errno
from collections.abc import Callable
from typing import Protocol, TypeVar

from .. import layout
from ..fileio import FileOps
from ..statx import Ident
from .codec import Entry, Generations, decode_journal, generations
from .fence import FenceView
from .journal import open_current, roll, stale
from .journal_sync import Held, SyncGroup, Syncs
from .state import DiskState, read_tail

__all__ = ["SiteJournal", "Reader", "RETRIES"]

_T = TypeVar("_T")
RETRIES = 8  # listings before giving up on a manifest that changes under every read (a compaction each)
# Bytes appended on the fence's word before one ``statx`` again: the journal's size (other processes'
# records too) for the compaction threshold is then off by at most this much per process.
CHECK_BYTES = 64 * 1024


class Reader(Protocol):
    """What the journal mechanics need of the index reading them (``site.SiteManifest``)."""

    @property
    def loaded(self) -> bool:
        """Whether the index holds a state read from these files (else it only writes: the erasure tool)."""

    def read_state(self, base: int, journals: list[int]) -> DiskState: ...

    def take(self, records: list[tuple[str, Entry]]) -> None:
        """Apply records read from the journal."""

    def rebase(self, state: DiskState) -> None:
        """Adopt the state a newer snapshot and its journals hold."""

    def replaced(self) -> None:
        """The manifest on disk is not the one read: load it again."""

    def open_mark(self) -> bytes | None:
        """The session's open mark, written first to a journal opened after a replacement (None: none)."""


class SiteJournal:
    def __init__(self, ops: FileOps, directory: str, site: str, *, schedule: Callable[[], None]) -> None:
        self.ops, self.directory, self.site = ops, directory, site
        self._schedule = schedule  # asks for a compaction (a rolled journal is folded away)
        self.gen = 0  # the generation of the journal read (and appended to)
        self.base_gen = -1  # generation of the snapshot the reader's state is based on
        self.read_pos = 0  # bytes of the active journal already applied
        self._group: SyncGroup | None = None  # the descriptor records go to, and its syncs
        self._syncs = Syncs()  # records held for a sync outside the lock, over every descriptor
        # Which file journal.<gen> was when read or opened: another one there, with no compaction to explain
        # it, means the manifest was removed and written again (a purge, then the site used again).
        self._id: tuple[int, int, int] | None = None
        self._torn: int | None = None  # a journal that may end in torn bytes: roll before appending to it
        self.remark = False  # the reader's open mark goes to the next journal opened (after a replacement)
        self.faulted = False  # a journal write or sync failed: no clean close mark (the next load sweeps)
        # The fence's counter when the held journal was last proven current (None: prove it after each
        # write); the journal's size then, and the bytes this process appended since.
        self._fence = FenceView(ops, directory)
        self._trusted: int | None = None
        self._size = self._since = 0

    def _path(self, gen: int) -> str:
        return layout.manifest_file(self.directory, "journal", gen)

    def generations(self) -> Generations:
        try:
            return generations(self.ops.listdir(self.directory))
        except FileNotFoundError:
            return generations(())

    def listed(self, read: Callable[[Generations], _T]) -> _T:
        """``read(listing)``; listed and read again if a compaction folded a listed file in between (a
        vanished file is never taken for an empty or a damaged one)."""
        for _ in range(RETRIES):
            found = self.generations()
            try:
                return read(found)
            except FileNotFoundError:
                continue
        raise OSError(errno.ESTALE, f"manifest of site {self.site} changed under {RETRIES} reads")

    # ------------------------------------------------------------------ reading
    def load(self, reader: Reader) -> tuple[Generations, DiskState]:
        """The newest snapshot and every journal at or after its generation, read; positioned after them."""
        self.close()

        def read(found: Generations) -> tuple[Generations, tuple[int, int, int] | None, DiskState]:
            named = self._file_id(found.newest)  # before the read: a replacement meanwhile is seen later
            return found, named, reader.read_state(found.base, found.live_journals)

        found, self._id, state = self.listed(read)
        self.gen, self.read_pos, self.base_gen = found.newest, state.pos, found.base
        if state.torn:  # a crash's torn tail (or a record in flight): no record goes after it
            self._torn = found.newest
        return found, state

    def catch_up(self, reader: Reader) -> None:
        """Apply records other processes appended; follow compactions and rolls to the newest journal,
        found by listing however many generations on (a deleted journal is not read: the newer snapshot
        holds it). A reader that never loaded (the erasure tool) is only positioned on the newest journal."""
        self.listed(lambda found: self._advance(reader, found))

    def _advance(self, reader: Reader, found: Generations) -> None:
        named = self._file_id(self.gen)
        # Another file there, or ours gone with nothing newer listed (a compaction starts the next journal
        # before it deletes one): the manifest was removed, and maybe written again.
        other = self._id not in (None, named) and (named is not None or found.newest <= self.gen)
        if reader.loaded and (found.newest < self.gen or other):
            reader.replaced()
            return
        self._id = self._id or named
        if found.newest != self.gen:
            self.close()
        if not reader.loaded:
            self.gen, self.read_pos, self._id = found.newest, 0, self._file_id(found.newest)
        elif found.base > self.base_gen:
            self._id = self._file_id(found.newest)
            state = reader.read_state(found.base, found.live_journals)
            reader.rebase(state)
            self.base_gen, self.read_pos, self.gen = found.base, state.pos, found.newest
        else:
            self._apply(reader, self.gen, strict=False)  # gone only if nothing wrote it yet
            for gen in found.live_journals:
                if gen > self.gen:
                    self.gen, self.read_pos, self._id = gen, 0, self._file_id(gen)
                    self._apply(reader, gen, strict=True)

    def _file_id(self, gen: int) -> tuple[int, int, int] | None:
        named = self.ops.ident_at(self._path(gen))
        return None if named is None else named.file_id

    def _apply(self, reader: Reader, gen: int, *, strict: bool) -> None:
        """Apply the records of ``journal.<gen>`` after ``read_pos`` (FileNotFoundError if it is gone and
        ``strict``)."""
        try:
            data = read_tail(self.ops, self._path(gen), self.read_pos)
        except FileNotFoundError:
            if strict:
                raise
            return
        if data:
            decoded = decode_journal(data)
            reader.take(decoded.records)
            self.read_pos += decoded.pos

    def refresh(self, reader: Reader) -> None:
        """Cheap check for other processes' records: one stat of the active journal (its size: records
        appended; its mode and link count: a newer generation, ``journal.stale``)."""
        named = self.ops.ident_at(self._path(self.gen))
        if named is None or stale(named) or self.base_gen < self.gen or named.file_id != self._id:
            self.catch_up(reader)
        elif named.size > self.read_pos:  # still the current journal: only its new bytes
            self._apply(reader, self.gen, strict=False)

    def size(self) -> int:
        """Bytes in the current journal (0: none yet)."""
        return self.ops.stat_size(self._path(self.gen)) or 0

    # ------------------------------------------------------------------ appending
    def _open(self, reader: Reader) -> SyncGroup:
        """The descriptor records go to: the newest journal, found by listing and confirmed by listing
        again once open (opened as a compaction started the next one, it would be stale at once). A
        journal that may end in torn bytes is rolled first."""
        self.ops.makedirs_durable(self.directory)
        for _ in range(RETRIES):
            self.catch_up(reader)
            if self._torn is not None and self._torn == self.gen:
                roll(self.ops, self.directory, self.gen)
                self._torn = None
                self._schedule()  # folds the torn journal away
                continue
            fd = open_current(self.ops, self.directory, self.gen)
            if fd is None:
                continue
            opened = self.ops.ident(fd).file_id
            if reader.loaded and self._id not in (None, opened):  # not the journal we read
                self.ops.close(fd)
                reader.replaced()
                continue
            self._group, self._id = SyncGroup(self.ops, fd, self.gen, self._syncs), opened
            mark = reader.open_mark() if self.remark else None
            if mark is not None:  # a crash from here on is seen by the next load (no record before it)
                self.ops.append(fd, mark)
                self.ops.fdatasync(fd)
            self.remark = False
            return self._group
        raise OSError(errno.ESTALE, f"no current manifest journal for site {self.site} in {RETRIES} tries")

    def append(self, reader: Reader, data: bytes, *, sync: bool = False) -> int:
        """Append ``data`` to the current journal, never to one nobody reads any more (module docstring);
        the journal's size after it. ``sync``: durable when this returns, synced under the reader's lock
        (with any record written before the sync began). A failed write or sync drops the descriptor and
        marks the journal torn: the next append rolls to a new one."""
        size, group = self.write(reader, data)
        if sync:
            try:
                group.sync(group.wrote())
            except OSError:  # (``group`` is still ours: only a holder of the reader's lock drops it)
                self.faulted, self._torn = True, group.gen
                self.close()
                raise
        return size

    def append_held(self, reader: Reader, data: bytes) -> tuple[int, Held]:
        """``append``, the record to be synced after the reader's lock is released: ``Held.sync``, then
        ``Held.leave`` on every path (the descriptor stays open until then, whatever drops it meanwhile).
        If the journal rolls or is compacted in between, the sync of the descriptor the record went to
        still makes it durable: it was proven in the journal before any seal, so it is in that journal or
        in the durable snapshot that folded it before deleting it (``journal.fold``)."""
        size, group = self.write(reader, data)
        return size, Held(group, group.hold())

    def write(self, reader: Reader, data: bytes) -> tuple[int, SyncGroup]:
        """``append`` without a sync: (the journal's size after it, the descriptor's group). A commit
        record calls it directly (a Python call less than ``append``)."""
        last = self._group
        if last is not None and last.fault is not None:  # a sync outside the lock failed: as below
            self.faulted, self._torn = True, last.gen
            self.close()
        try:
            for _ in range(RETRIES):
                group = self._group if self._group is not None else self._open(reader)
                fd = group.fd
                try:
                    self.ops.append(fd, data)
                    if self._fence.unchanged(self._trusted) and self._since < CHECK_BYTES:
                        self._since += len(data)  # nothing sealed or removed it (``fence``)
                    else:
                        with self._fence.shared() as value:  # the value first, then the statx
                            held = self.ops.ident(fd)
                        self._trusted, self._size, self._since = None, held.size, 0
                        if stale(held) and self._moved(reader, held):
                            continue
                        self._trusted = None if stale(held) else value
                except OSError as exc:
                    self.faulted, self._torn = True, self.gen
                    group.fail(exc)  # records written before it and held for a sync fail too
                    raise
                return self._size + self._since, group
            raise OSError(errno.ESTALE, f"manifest journal of site {self.site} moved {RETRIES} times")
        except OSError:
            self.close()
            raise

    @property
    def failed(self) -> bool:
        """A journal write or sync failed, under the reader's lock or outside it (no clean close mark)."""
        return self.faulted or self._syncs.failed

    def settle(self, timeout: float) -> bool:
        """Wait until every record held for a sync outside the lock has its outcome (``Syncs.settle``)."""
        return self._syncs.settle(timeout)

    def _moved(self, reader: Reader, held: Ident) -> bool:
        """After a write to a journal that looks sealed or deleted: catch up; True if the record must go
        again (a newer journal, or this one deleted), False if nothing newer is listed (listing decides)."""
        gen = self.gen
        self.catch_up(reader)
        if self.gen != gen:
            return True
        if held.nlink == 0:  # deleted with nothing newer: open it anew
            self.close()
            return True
        return False

    def close(self) -> None:
        self._trusted = None
        self._fence.close()
        if self._group is not None:  # closed now, or by the last sync still using it (``journal_sync``)
            group, self._group = self._group, None
            group.retire()
