"""The manifest's journal generations on disk: how every process finds, fences and folds them (docs/FORMAT.md,
"Site manifest", "Generations"). Used by ``SiteManifest`` and by fsck's manifest rebuild.

A process keeps the journal it appends to open. Two things end a journal's life: a compaction (``fold``)
starts ``journal.<N+1>``, reads ``journal.<N>`` into ``snapshot.<N+1>`` and deletes it; a *roll* (``roll``:
after a failed write, or a torn tail found on load) starts ``journal.<N+1>`` so that no record lands after
the torn bytes. Both give the old journal a second name, ``journal.<N>.tmp-<pid>`` (a *seal*), after the
new journal exists and before anything reads the old one. So one ``statx`` of the path of the journal a
process holds answers "is it still the current one?" (it never fails while it is):

    names it, 1 link   current: no newer journal was started before this look, so what was appended
                       before it is read by any later compaction (which seals first, then reads)
    names it, > 1      sealed: a newer journal exists and may have been read: catch up, re-append there
    gone, or another   deleted (folded) or replaced: the newest journal is found by listing, however
                       many generations on

Both are needed: a compaction removes a folded journal's names one by one (journal, then seals), so its
link count passes through 1 again on the way to 0; the path is gone by then.

A link count above 1 with no newer journal in the listing is not a seal (a hard-linked copy of the data
dir): the journal is current. A seal is removed only with its journal, by the compaction that folds it:
lifted earlier, it would let a stale writer append to a journal the processes already on the newer one
never read again. Seals are named like a live process's temp file, so fsck ignores them while their
process runs (and reports a dead one's as a stale temp file)."""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable

from .. import layout
from ..fileio import FileOps
from ..statx import Ident
from .codec import generations
from .snapshot import encode_snapshot
from .state import DiskState

__all__ = ["fold", "roll", "open_current", "stale", "seal", "drop_seals"]

_SEAL = ".tmp-"


def _journal(directory: str, gen: int) -> str:
    return layout.manifest_file(directory, "journal", gen)


def stale(named: Ident | None, held: tuple[int, int, int]) -> bool:
    """Whether the journal held open (``held``: its ``file_id``) may no longer be the current one, by
    what its path names now (``named``: a ``statx``, None if gone). Listing decides (module docstring)."""
    return named is None or named.file_id != held or named.nlink != 1


def open_current(ops: FileOps, directory: str, gen: int) -> int | None:
    """An append descriptor on ``journal.<gen>`` (created if need be), or None if, once it is open, a
    listing shows a newer generation: opened as a compaction started the next journal, it would be stale
    at once (and one this call created then is removed: no process can have written to it, since each
    confirms by the same listing before its first write)."""
    path = _journal(directory, gen)
    fd, created = _open_or_create(ops, path)
    try:
        # Always, once per journal per process: its creator may have died before its directory fsync,
        # and creation records synced into an entry that is not durable would vanish with it.
        ops.fsync_dir(directory)
        current = generations(ops.listdir(directory)).newest == gen
    except BaseException:
        ops.close(fd)
        raise
    if current:
        return fd
    ops.close(fd)
    if created:
        _unlink(ops, path)
    return None


def _open_or_create(ops: FileOps, path: str) -> tuple[int, bool]:
    while True:
        try:
            return ops.open(path, os.O_WRONLY | os.O_APPEND), False
        except FileNotFoundError:
            pass
        try:
            return ops.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_EXCL), True
        except FileExistsError:
            continue  # created meanwhile by another process: open it


def seal(ops: FileOps, directory: str, gens: Iterable[int]) -> None:
    """Seal each ``journal.<g>`` (module docstring). The newer journal must exist first."""
    for gen in gens:
        path = _journal(directory, gen)
        try:
            ops.link(path, f"{path}{_SEAL}{os.getpid()}")
        except (FileExistsError, FileNotFoundError):
            pass  # sealed already by this pid (a roll, then a fold), or folded meanwhile


def _seal_gen(name: str) -> int | None:
    """The generation a seal name seals, or None if ``name`` is no seal."""
    head, sep, pid = name.partition(_SEAL)
    parsed = layout.parse_manifest_name(head)
    if not sep or not pid.isdigit() or parsed is None or parsed[0] != "journal":
        return None
    return parsed[1]


def start_next(ops: FileOps, directory: str, gen: int) -> None:
    """Create ``journal.<gen + 1>`` (unless a roll or another compactor did) and make it durable."""
    try:
        ops.close(ops.open(_journal(directory, gen + 1), os.O_WRONLY | os.O_CREAT | os.O_EXCL))
    except FileExistsError:
        pass
    ops.fsync_dir(directory)


def roll(ops: FileOps, directory: str, gen: int) -> None:
    """Stop every process appending to ``journal.<gen>`` (it may hold torn bytes): start the next journal
    and seal this one. The next compaction folds it, torn bytes skipped, and deletes it."""
    start_next(ops, directory, gen)
    seal(ops, directory, [gen])


def fold(ops: FileOps, directory: str, gen: int, read: Callable[[int, list[int]], DiskState]) -> None:
    """Compact every generation up to ``gen``, the current one, into ``snapshot.<gen + 1>`` (the caller
    holds ``compact.lock``): start the next journal, seal the old ones, read them (``read(base,
    journals)``), write the snapshot atomically, then delete the old files and their seals. If
    ``journal.<gen>`` is empty (started by a roll or by a fold that failed on a full disk: retries do not
    pile up generations), the generations before it go into ``snapshot.<gen>`` instead."""
    if gen and ops.stat_size(_journal(directory, gen)) == 0:
        new = gen  # the current journal is new and empty (a roll, a failed fold): fold those before it
    else:
        start_next(ops, directory, gen)
        new = gen + 1
    found = generations(ops.listdir(directory))
    if new in found.snapshots:
        return  # nothing before the current journal
    base = max((g for g in found.snapshots if g < new), default=0)
    folded = [g for g in found.journals if base <= g < new]
    seal(ops, directory, folded)
    state = read(base, folded)
    ops.atomic_write(layout.manifest_file(directory, "snapshot", new), encode_snapshot(
        state.table.items(), state.sessions
    ))  # fmt: skip
    del state
    for kind, gens in (("snapshot", found.snapshots), ("journal", found.journals)):
        for old in gens:
            if old < new:
                _unlink(ops, layout.manifest_file(directory, kind, old))
    drop_seals(ops, directory, new - 1)
    ops.fsync_dir(directory)


def drop_seals(ops: FileOps, directory: str, gen: int) -> None:
    """Remove the seals of every journal up to ``gen``, once those journals are deleted."""
    for name in ops.listdir(directory):
        sealed = _seal_gen(name)
        if sealed is not None and sealed <= gen:
            _unlink(ops, os.path.join(directory, name))


def _unlink(ops: FileOps, path: str) -> None:
    try:
        ops.unlink(path)
    except FileNotFoundError:
        pass
