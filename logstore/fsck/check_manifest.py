"""fsck of a site manifest: read it as stored, compare it with the logs, rebuild it from the logs.

``SiteManifest`` itself is not used to read: its load reconciles and appends records, and fsck without
``--repair`` must not write. ``ManifestView`` reads the same files with the same merge rule (a record wins
if it is newer, a record without created_at keeps the known one) and notes where they are damaged.

Rebuild (docs/FSCK.md), under the manifest's ``compact.lock`` like a compaction, so it never runs beside one:
1. create ``journal.<N+1>`` (N = the newest generation) and fsync the directory: from then on every
   writer's record lands there too (``SiteManifest`` re-appends to a newer journal when it sees one);
2. take each conversation's state from the check, re-reading (under its lock) only the logs that changed
   since, and any conversation created meanwhile;
3. write ``snapshot.<N+1>`` (temp + fsync + rename + directory fsync);
4. append the corrected records to ``journal.<N+1>`` too: running servers follow the journal, not the
   snapshot (records merge by max, so a manifest that claimed *more* than a truncated log still holds is
   corrected in memory only by a restart; docs/FSCK.md);
5. remove every older generation and fsync the directory.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable

import filelock

from ..core.errors import Timeout
from ..core.models import micros_to_datetime, rfc3339
from ..file import layout
from ..file.fileio import FILE_MODE
from ..file.manifest.codec import (
    MARK_OPEN,
    Entry,
    Generations,
    Session,
    decode_journal,
    encode_record,
    first_gap,
    generations,
    merge_record,
)
from ..file.manifest.journal import seal
from ..file.manifest.snapshot import decode_snapshot, encode_snapshot
from .check_report import CheckContext, Finding, stray_kind

__all__ = ["ManifestView", "describe_mismatch", "stray_findings"]

_APPEND_CHUNK = 64 * 1024


class ManifestView:
    """A site manifest as stored on disk. ``load`` reads it whole; ``refresh`` reads what was appended
    to the newest journal since (reloading if a compaction started a newer generation)."""

    def __init__(self, ctx: CheckContext, site: str) -> None:
        self.ctx = ctx
        self.site = site
        self.directory = layout.manifest_dir(ctx.data_dir, site)
        self.entries: dict[str, Entry] = {}
        self.sessions: set[Session] = set()  # open sessions: kept by a rebuild (their stores may run)
        self.damage: list[tuple[str, int, str]] = []  # (path, offset, message)
        self.strays: list[tuple[str, str, str]] = []  # (kind, path, message)
        self._gen = 0
        self._pos = 0

    def _path(self, kind: str, gen: int) -> str:
        return layout.manifest_file(self.directory, kind, gen)

    def _listing(self) -> Generations:
        try:
            return generations(self.ctx.ops.listdir(self.directory))
        except FileNotFoundError:
            return generations(())

    def load(self) -> None:
        for _attempt in range(5):  # a compaction may delete files between listing and reading them
            try:
                self._load()
                return
            except FileNotFoundError:
                time.sleep(0.01)
        self._load()

    def _load(self) -> None:
        self.entries, self.sessions, self.damage, self.strays = {}, set(), [], []
        found = self._listing()
        base = found.base
        if found.snapshots:
            self._read_snapshot(self._path("snapshot", base))
        live = found.live_journals
        self._gen = live[-1] if live else base
        self._pos = 0
        for gen in live:
            self._read_journal(gen, newest=gen == self._gen)
        superseded = [("snapshot", g) for g in found.snapshots[:-1]]
        superseded += [("journal", g) for g in found.journals if g < base]
        for kind, gen in superseded:
            self._stray("orphan-file", self._path(kind, gen), f"superseded manifest {kind} (ignored)")
        for name in found.others:
            stray = None if name in (layout.COMPACT_LOCK, layout.MANIFEST_FENCE) else stray_kind(name)
            if stray is not None:
                self._stray(stray, os.path.join(self.directory, name), "not a manifest file (ignored)")

    def _stray(self, kind: str, path: str, message: str) -> None:
        self.strays.append((kind, path, message))

    def _read_snapshot(self, path: str) -> None:
        data = self.ctx.ops.read_file(path)
        if data is None:
            raise FileNotFoundError(path)
        snapshot = decode_snapshot(data)
        if snapshot is None:
            self.damage.append(
                (path, 0, "snapshot fails its magic, checksum or layout: its records are not used")
            )
            return
        self.sessions.update(snapshot.sessions)
        self._apply(list(snapshot.items()))

    def _read_journal(self, gen: int, *, newest: bool) -> None:
        path = self._path("journal", gen)
        data = self.ctx.ops.read_file(path)
        if data is None:
            raise FileNotFoundError(path)
        decoded = decode_journal(data)
        if decoded.pos < len(data) and newest:
            time.sleep(0.02)  # maybe a record being appended right now: look again before calling it torn
            data = self.ctx.ops.read_file(path) or data
            decoded = decode_journal(data)
        if decoded.damaged:  # damaged bytes are skipped when valid records follow: say where they are
            self.damage.append((path, first_gap(data), "damaged bytes between records (skipped)"))
        if decoded.pos < len(data):
            self.damage.append((path, decoded.pos, "incomplete or damaged record at the end (torn write)"))
        self._apply(decoded.records)
        for mark in decoded.marks:
            (self.sessions.add if mark.kind == MARK_OPEN else self.sessions.discard)(mark.session)
        if newest:
            self._pos = decoded.pos

    def refresh(self) -> None:
        """Take in records appended since ``load`` (cheap: one stat, the new bytes)."""
        if self.ctx.ops.exists(self._path("journal", self._gen + 1)):
            self.load()
            return
        path = self._path("journal", self._gen)
        size = self.ctx.ops.stat_size(path)
        if size is None or size <= self._pos:
            return
        data = self.ctx.ops.read_file(path) or b""
        decoded = decode_journal(data, self._pos)
        self._apply(decoded.records)
        self._pos = decoded.pos

    def _apply(self, records: list[tuple[str, Entry]]) -> None:
        # SiteManifest's rule, so the view equals what a server would load.
        for cid, entry in records:
            merge_record(self.entries, cid, entry)  # the engine's rule: the view equals what it loads

    # ------------------------------------------------------------------ repair
    def append_records(self, records: dict[str, Entry]) -> None:
        """Append records to the newest journal (and to a newer one a compactor may start meanwhile)."""
        ops = self.ctx.ops
        ops.makedirs_durable(self.directory)
        chunks: list[bytes] = []
        chunk: list[bytes] = []
        used = 0
        for cid, entry in records.items():  # whole records per write: a record is never split
            record = encode_record(cid, entry)
            if used + len(record) > _APPEND_CHUNK and chunk:
                chunks.append(b"".join(chunk))
                chunk, used = [], 0
            chunk.append(record)
            used += len(record)
        if chunk:
            chunks.append(b"".join(chunk))
        while True:
            path = self._path("journal", self._gen)
            existed = ops.exists(path)
            fd = ops.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)
            try:
                for data in chunks:
                    ops.append(fd, data)
                ops.fdatasync(fd)
            finally:
                ops.close(fd)
            if not existed:
                ops.fsync_dir(self.directory)
            if not ops.exists(self._path("journal", self._gen + 1)):
                return
            self._gen += 1

    def rebuild(
        self,
        checked: dict[str, Entry],
        current: Callable[[str, Entry | None], Entry | None],
        keep: set[str],
    ) -> None:
        """Replace the manifest by one built from the logs (module docstring). ``checked``: the entries
        the check derived; ``current(cid, known)``: a conversation's entry now, re-read under its lock
        (None: no log); ``keep``: conversations not checked (lock timeout), whose records are kept."""
        ops = self.ctx.ops
        ops.makedirs_durable(self.directory)
        lock = filelock.FileLock(
            os.path.join(self.directory, layout.COMPACT_LOCK),
            mode=FILE_MODE,
            timeout=self.ctx.lock_timeout,
            thread_local=False,
            preserve_lock_file=True,
        )
        try:
            lock.acquire()
        except filelock.Timeout as exc:
            raise Timeout(f"manifest compact.lock of site {self.site} not acquired") from exc
        try:
            found = self._listing()
            snaps, journals = found.snapshots, found.journals
            new = max(snaps + journals, default=0) + 1
            fd = ops.open(self._path("journal", new), os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            ops.close(fd)
            ops.fsync_dir(self.directory)
            seal(ops, self.directory, journals)  # writers holding them move to journal.<new> (journal.py)
            self.refresh()  # records written before journal.<new> existed (conversations created meanwhile)
            before = dict(self.entries)
            entries: dict[str, Entry] = {}
            for cid in sorted(set(checked) | set(before)):
                if cid in keep and cid in before:
                    entries[cid] = before[cid]
                    continue
                entry = current(cid, checked.get(cid))
                if entry is not None:
                    entries[cid] = entry
                elif cid in before and before[cid].next_seq == 0 and cid not in checked:
                    entries[cid] = before[cid]  # created, its log not yet: keep (manifest ⊇ logs)
            ops.atomic_write(self._path("snapshot", new), encode_snapshot(entries.items(), self.sessions))
            self._gen = new
            fixes = {cid: e for cid, e in entries.items() if before.get(cid) != e}
            if fixes:
                self.append_records(fixes)
            for gen in snaps:
                ops.unlink(self._path("snapshot", gen))
            for gen in journals:
                if gen < new:
                    ops.unlink(self._path("journal", gen))
            ops.fsync_dir(self.directory)
        finally:
            lock.release()


def describe_mismatch(stored: Entry | None, derived: Entry) -> str | None:
    """How a manifest entry disagrees with the state of its log, or None if it agrees."""
    if stored is None:
        return "on disk but missing from the manifest: never listed"
    if derived.next_seq == 0:
        return None if stored.next_seq == 0 else f"manifest lists {stored.next_seq} item(s); the log has none"
    got = (stored.created_at, stored.last_appended_at, stored.next_seq, stored.log_size)
    want = (derived.created_at, derived.last_appended_at, derived.next_seq, derived.log_size)
    if got == want:
        return None
    names = ("created_at", "last_appended_at", "next_seq", "log_size")
    shown: tuple[Callable[[int], str], ...] = (_timestamp, _timestamp, str, str)
    diffs = [
        f"{n} {f(g)} (log: {f(w)})" for n, f, g, w in zip(names, shown, got, want, strict=True) if g != w
    ]
    return "manifest says " + ", ".join(diffs)


def _timestamp(micros: int) -> str:
    """RFC 3339 for a manifest time (microseconds since the epoch); -1 means none recorded yet."""
    if micros < 0:
        return "none"
    try:
        return rfc3339(micros_to_datetime(micros))
    except (OverflowError, ValueError, OSError):
        return f"{micros}us (out of range)"


def stray_findings(view: ManifestView) -> list[Finding]:
    ctx = view.ctx
    return [Finding(kind, ctx.rel(path), msg, site=view.site) for kind, path, msg in view.strays]
