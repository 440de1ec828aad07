"""``migrate(source_url, target_url)``: copy every site, registry entry, conversation and item from one
store to another (file <-> PostgreSQL, or file -> file), then verify both sides.

1. Plan (nothing written yet): each source registry entry must be absent from the target or equal to it,
   and each source conversation's target copy must be a prefix of it (same count-long CRC below).
   Anything else is ``MigrationConflict``, naming what differs, before a byte is copied.
2. Copy: registry entries as stored (the scrypt hashes: passwords are never needed); then per
   conversation, the source's batches from the target's next seq on, each one import append
   (``core.imported``: one atomic append at an expected first seq, with the source's ``recorded_at``,
   refused if anything else got there first). An interrupted run leaves whole batches only, and a re-run
   continues where the target ends. ``created_at`` is the first batch's time and ``last_appended_at`` the
   last one's in both backends, so the listing order comes with the items.
3. Verify: per conversation, both sides are read again and compared: item count and a CRC32C of every
   item's (seq, recorded_at, payload bytes), plus every registry entry. A difference is
   ``MigrationMismatch`` (e.g. appends made to the source during the copy: run again to copy them).

The source is only read (``readers``). The target is written through its backend's ``import_batch``.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

from crc32c import crc32c

from ..core.errors import InvalidArgument
from ..core.imported import ImportedBatch
from ..core.models import SeqRange
from ..core.registry import SiteExists
from .readers import StoreReader, open_reader

__all__ = ["Digest", "MigrationConflict", "MigrationMismatch", "MigrationReport", "migrate", "digest"]

_ITEM_KEY = struct.Struct("<qq")  # seq, recorded_at: what the CRC covers before each payload
_SHOWN = 10  # conflicts / mismatches named in a message


class MigrationConflict(Exception):
    """The target holds data that differs from the source's; nothing was copied for it."""


class MigrationMismatch(Exception):
    """After the copy, the two sides differ (the source changed meanwhile, or a bug): run again."""


class _Importer(Protocol):
    def import_batch(self, site: str, conversation_id: str, batch: ImportedBatch) -> SeqRange: ...

    def close(self) -> None: ...


class _Registry(Protocol):
    def import_entry(self, site: str, entry: dict[str, Any]) -> None: ...


@dataclass(slots=True)
class Digest:
    """Count and CRC32C of a conversation's items (seq, recorded_at, payload bytes), in seq order."""

    count: int = 0
    crc: int = 0

    def add(self, batch: ImportedBatch) -> None:
        crc = self.crc
        for k, raw in enumerate(batch.items):
            crc = crc32c(raw, crc32c(_ITEM_KEY.pack(batch.first_seq + k, batch.recorded_at), crc))
        self.crc = crc
        self.count += len(batch.items)


def digest(batches: Iterable[ImportedBatch]) -> Digest:
    out = Digest()
    for batch in batches:
        out.add(batch)
    return out


@dataclass(slots=True)
class MigrationReport:
    sites: int = 0
    entries_copied: int = 0
    conversations: int = 0
    items_copied: int = 0
    items_present: int = 0  # already in the target (a resumed run)
    verified: int = 0
    notes: list[str] = field(default_factory=list)


def migrate(
    source_url: str,
    target_url: str,
    *,
    lock_timeout: float = 5.0,
    progress: Callable[[str], None] | None = None,
) -> MigrationReport:
    """Copy ``source_url`` into ``target_url`` and verify; see the module docstring."""
    from ..core.factory import open_registry, open_store

    if _same_store(source_url, target_url):
        raise InvalidArgument("--from and --to name the same store")
    say = progress or (lambda _: None)
    report = MigrationReport()
    source = open_reader(source_url, lock_timeout=lock_timeout)
    try:
        # The target's engine first: it refuses an unmigrated database, and creates an absent data dir.
        store: Any = open_store(target_url, lock_timeout=lock_timeout)
        registry: Any = open_registry(target_url)
        try:
            target = open_reader(target_url, lock_timeout=lock_timeout)
            try:
                plan = _plan(source, target, report)
                say(
                    f"plan: {report.sites} site(s), {report.conversations} conversation(s), "
                    f"{report.items_present} item(s) already in the target"
                )
                _copy(source, store, registry, plan, report, say)
                _verify(source, target, report, say)
            finally:
                target.close()
        finally:
            store.close()
            getattr(registry, "close", lambda: None)()
    finally:
        source.close()
    return report


@dataclass(frozen=True, slots=True)
class _Plan:
    entries: dict[str, dict[str, Any]]  # to add to the target's registry
    starts: dict[tuple[str, str], int]  # (site, conversation) -> the target's next seq


def _plan(source: StoreReader, target: StoreReader, report: MigrationReport) -> _Plan:
    conflicts: list[str] = []
    theirs = target.registry()
    entries = {}
    for site, entry in sorted(source.registry().items()):
        if site not in theirs:
            entries[site] = entry
        elif theirs[site] != entry:
            conflicts.append(
                f"site {site}: the target has a different credential entry (if the target's {site} is "
                f"unused, e.g. created by a first `serve` of an older release, `logstore site remove {site} "
                "--store TARGET` makes way)"
            )
    starts = {}
    for site in source.sites():
        report.sites += 1
        for cid in source.conversations(site):
            report.conversations += 1
            have = digest(target.batches(site, cid))
            if have.count:
                mine = _prefix(source.batches(site, cid), have.count)
                if mine != have:
                    conflicts.append(
                        f"conversation {site}/{cid}: the target holds {have.count} item(s) that are not "
                        "the source's first ones"
                    )
                    continue
            starts[(site, cid)] = have.count
            report.items_present += have.count
    if conflicts:
        more = f" (and {len(conflicts) - _SHOWN} more)" if len(conflicts) > _SHOWN else ""
        raise MigrationConflict(
            f"the target holds data that differs from the source; nothing was copied: "
            f"{'; '.join(conflicts[:_SHOWN])}{more}"
        )
    return _Plan(entries, starts)


def _prefix(batches: Iterator[ImportedBatch], count: int) -> Digest:
    """Digest of the first ``count`` items (a batch straddling ``count`` is cut)."""
    out = Digest()
    for batch in batches:
        if out.count >= count:
            break
        out.add(_from(batch, batch.first_seq, stop=count))
    return out


def _from(batch: ImportedBatch, start: int, *, stop: int | None = None) -> ImportedBatch:
    """The part of ``batch`` at seqs ``start..stop`` (same time)."""
    lo = max(start - batch.first_seq, 0)
    hi = len(batch.items) if stop is None else min(stop - batch.first_seq, len(batch.items))
    if lo == 0 and hi == len(batch.items):
        return batch
    return ImportedBatch(batch.first_seq + lo, batch.recorded_at, batch.items[lo:hi])


def _copy(
    source: StoreReader,
    store: _Importer,
    registry: _Registry,
    plan: _Plan,
    report: MigrationReport,
    say: Callable[[str], None],
) -> None:
    for site, entry in plan.entries.items():
        try:
            registry.import_entry(site, entry)
            report.entries_copied += 1
        except SiteExists as exc:  # added since the plan
            raise MigrationConflict(f"site {site} was added to the target during the migration") from exc
    done = 0
    for (site, cid), start in plan.starts.items():
        for batch in source.batches(site, cid, start):
            part = _from(batch, start)
            if not part.items:
                continue
            try:
                store.import_batch(site, cid, part)
            except InvalidArgument as exc:
                if exc.field not in ("first_seq", "recorded_at"):
                    raise
                raise MigrationConflict(
                    f"conversation {site}/{cid} changed in the target during the migration: {exc}"
                ) from exc
            report.items_copied += len(part.items)
        done += 1
        if done % 1000 == 0:
            say(f"copied {done} of {len(plan.starts)} conversation(s), {report.items_copied} item(s)")


def _verify(
    source: StoreReader, target: StoreReader, report: MigrationReport, say: Callable[[str], None]
) -> None:
    mismatches: list[str] = []
    theirs = target.registry()
    for site, entry in source.registry().items():
        if theirs.get(site) != entry:
            mismatches.append(f"site {site}: credential entry differs")
    for site in source.sites():
        for cid in source.conversations(site):
            mine, have = digest(source.batches(site, cid)), digest(target.batches(site, cid))
            if mine != have:
                mismatches.append(
                    f"conversation {site}/{cid}: source {mine.count} item(s) crc {mine.crc:08x}, target "
                    f"{have.count} item(s) crc {have.crc:08x}"
                )
            else:
                report.verified += 1
    if mismatches:
        more = f" (and {len(mismatches) - _SHOWN} more)" if len(mismatches) > _SHOWN else ""
        raise MigrationMismatch(
            f"verification failed: {'; '.join(mismatches[:_SHOWN])}{more}. If writers used the source "
            "during the copy, stop them and run the migration again: it copies only what is missing"
        )
    say(f"verified {report.verified} conversation(s): counts and CRC32C equal on both sides")


def _same_store(a: str, b: str) -> bool:
    import os

    from ..core.factory import parse_store_url

    (sa, ra), (sb, rb) = parse_store_url(a), parse_store_url(b)
    if sa == "file" and sb == "file":
        return os.path.abspath(ra) == os.path.abspath(rb)
    return a == b
