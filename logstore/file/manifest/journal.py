"""The manifest's journal generations on disk: how every process finds, fences and folds them (docs/FORMAT.md,
"Site manifest", "Generations"). Used by ``SiteManifest`` and by fsck's manifest rebuild.

A process keeps the journal it appends to open. Two things end a journal's life: a compaction (``fold``)
starts ``journal.<N+1>``, reads ``journal.<N>`` into ``snapshot.<N+1>`` and deletes it; a *roll* (``roll``:
after a failed write, or a torn tail found on load) starts ``journal.<N+1>`` so that no record lands after
the torn bytes. Both *seal* the old journal, after the new one exists and before anything reads the old
one: its mode loses the owner-write bit (0600 -> 0400; descriptors already open still write, and only a
seal ever clears that bit: a journal is created 0600 whatever the umask). So one ``statx`` of the
descriptor a process holds answers "is it still the current one?", with no path lookup:

    0600, linked   current: no newer journal was started before this look, so what was appended
                   before it is read by any later compaction (which seals first, then reads)
    0400           sealed: a newer journal exists and may have been read: catch up, re-append there
    no link        deleted (folded): the newest journal is found by listing, however many generations on

A seal stays with its journal until the journal is deleted; a sealed journal with no newer one listed
(an operator's chmod) is taken for current: listing decides. Every seal, and the removal of a journal
that was never sealed, is fenced first (``fence``): a writer that proved its journal current may stand
the fence's unchanged counter for that ``statx``."""

from __future__ import annotations

import os
import stat
from collections.abc import Callable, Iterable

from .. import layout
from ..fileio import FILE_MODE, FileOps
from ..statx import Ident
from .codec import generations
from .fence import fencing
from .state import DiskState

__all__ = ["fold", "roll", "open_current", "stale", "seal"]

_WRITABLE = stat.S_IWUSR
_SEALED = FILE_MODE & ~_WRITABLE


def _journal(directory: str, gen: int) -> str:
    return layout.manifest_file(directory, "journal", gen)


def stale(held: Ident) -> bool:
    """Whether the journal ``held`` describes (a ``statx`` of its descriptor) may no longer be the
    current one: sealed or deleted (module docstring)."""
    return held.nlink == 0 or not held.mode & _WRITABLE


def open_current(ops: FileOps, directory: str, gen: int) -> int | None:
    """An append descriptor on ``journal.<gen>`` (created if need be), or None if, once it is open, a
    listing shows a newer generation: opened as a compaction started the next journal, it would be stale
    at once (and one this call created then is removed: no process can have written to it, since each
    confirms by the same listing before its first write)."""
    path = _journal(directory, gen)
    fd, created = _open_or_create(ops, path)
    try:
        if created and not ops.ident(fd).mode & _WRITABLE:  # a umask took the bit only a seal clears
            ops.chmod(path, FILE_MODE)
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
    if created:  # another process may have opened it and confirmed it (its listing came first): fence
        with fencing(ops, directory):
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
    """Seal each ``journal.<g>`` (module docstring), fenced (``fence``: a writer that trusts its journal
    by the fence's counter sees it change). The newer journal must exist first."""
    with fencing(ops, directory):
        for gen in gens:
            try:
                ops.chmod(_journal(directory, gen), _SEALED)
            except FileNotFoundError:
                pass  # folded meanwhile


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
    journals)``), write the snapshot atomically, then delete the old files. If
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
    ops.atomic_write(layout.manifest_file(directory, "snapshot", new), state.table.packed(state.sessions))
    del state
    for kind, gens in (("snapshot", found.snapshots), ("journal", found.journals)):
        for old in gens:
            if old < new:
                _unlink(ops, layout.manifest_file(directory, kind, old))
    ops.fsync_dir(directory)


def _unlink(ops: FileOps, path: str) -> None:
    try:
        ops.unlink(path)
    except FileNotFoundError:
        pass
