"""Erasure: remove one conversation, or every conversation of a site, for right-to-erasure requests.

Erasing a conversation, under its lock (``locking.held(paths.lock)``: the flock every append takes):

0. write the marker ``<id>.erasing`` (``layout.erasure_marker_path``; fsynced, directory fsynced): it
   holds the first bytes of the log being erased (its identity: the first frame's header and time), so
   that fsck can tell "an erasure was interrupted here: finish it" from data loss (``fsck --repair``
   finishes it: ``finish_erasure``), and a log created after the erasure committed from the log it was
   meant to erase;
1. unlink its other files (index, ``.broken-*`` bytes a repair saved, temp files), directory fsync —
   the index goes first: an index left without its log would describe a later log of the same id;
2. unlink the log, directory fsync — the commit point: before it the conversation is whole (an index
   is only a hint, rebuilt from the log), after it none of it is on disk;
3. append an erasure record to the site's manifest journal (fdatasynced), so the listing of every
   process drops it. A crash before this record leaves a manifest entry whose log is gone; every
   ``Store`` drops it when it loads the manifest (reconciliation), and running the erasure again writes
   the record;
4. unlink the marker, directory fsync.

Other processes may hold the conversation open (``serve --workers N``). Their next append takes the same
lock and refreshes against the file; the refresh sees that the path no longer names their open log
(``FileOps.same_file``), reloads, and starts a new, empty conversation in a new file: an append is never
acknowledged into the unlinked inode. Reads check the same before serving from their descriptor.

Erasing one conversation leaves its ``.lock`` file (it holds no data). Purging a site erases each
conversation as above, then deletes what is left of the site's directory bottom-up: each ``.lock`` file
is unlinked only while holding its flock (the rule in locking.py, issue 33), after checking under it
that no log appeared; whoever flocks the old inode afterwards (a process that kept it open, a waiter)
finds that the path no longer names it and locks the new file instead, so two processes never hold
"the" lock on two inodes. Not atomic: an interrupted purge is finished by running it again. Blocks
freed by ``unlink`` are not overwritten: see docs/OPERATIONS.md (Erasure) for backups and the storage
layer.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass
from enum import Enum

from ..core.ids import is_valid_id, validate_conversation_id, validate_site
from . import layout
from .fileio import OS_FILE_OPS, FileOps
from .layout import ConversationPaths, conversation_paths
from .locking import PathLock, held
from .log.commit_point import PointFile, invalidate
from .manifest.fence import withdraw
from .manifest.site import SiteManifest

__all__ = [
    "ErasureResult",
    "Finished",
    "erase_conversation",
    "finish_erasure",
    "marker_names_log",
    "purge_site",
    "site_conversations",
]

_IDENTITY_BYTES = 64


@dataclass(frozen=True, slots=True)
class ErasureResult:
    conversation_id: str
    had_log: bool  # False: there was no log (already erased, or never appended to)
    files_removed: int


def erase_conversation(
    data_dir: str | os.PathLike[str],
    site: str,
    conversation_id: str,
    *,
    file_ops: FileOps = OS_FILE_OPS,
    lock_timeout: float = 5.0,
) -> ErasureResult:
    """Remove the conversation's files (crash-safe, module docstring). Raises ``Timeout`` if its lock is
    busy for ``lock_timeout`` seconds; erasing a conversation that is not there is a no-op (it still
    writes the manifest record, which completes an erasure a crash interrupted)."""
    result = _erase(data_dir, site, conversation_id, file_ops, lock_timeout, finishing=False)
    assert isinstance(result, ErasureResult)
    return result


class Finished(Enum):
    """What ``finish_erasure`` did."""

    ERASED = "erased"  # the interrupted erasure was completed
    MARKER_ONLY = "marker-only"  # the erasure had committed; the log there now is a newer conversation
    NOTHING = "nothing"  # no marker (someone else finished it)


def finish_erasure(
    data_dir: str | os.PathLike[str],
    site: str,
    conversation_id: str,
    *,
    file_ops: FileOps = OS_FILE_OPS,
    lock_timeout: float = 5.0,
) -> Finished:
    """Complete an erasure a crash interrupted (its marker is there), as running it again would, except
    that a log created after the interrupted erasure had committed is kept (only the marker goes)."""
    result = _erase(data_dir, site, conversation_id, file_ops, lock_timeout, finishing=True)
    return result if isinstance(result, Finished) else Finished.ERASED


def marker_names_log(ops: FileOps, paths: ConversationPaths) -> bool | None:
    """Whether the conversation's erasure marker names the log there now (None: no marker). False when
    there is no log, or it is another one (created after the erasure committed)."""
    marker = ops.read_file(layout.erasure_marker_path(paths))
    if marker is None:
        return None
    try:
        fd = ops.open(paths.log, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        return bool(marker) and ops.pread(fd, len(marker), 0) == marker
    finally:
        ops.close(fd)


def _erase(
    data_dir: str | os.PathLike[str], site: str, cid: str, ops: FileOps, timeout: float, *, finishing: bool
) -> ErasureResult | Finished:
    site = validate_site(site)
    cid = validate_conversation_id(cid)
    root = os.path.abspath(os.fspath(data_dir))
    paths = conversation_paths(root, site, cid)
    if not ops.exists(paths.directory):
        return Finished.NOTHING if finishing else ErasureResult(cid, False, 0)
    marker = layout.erasure_marker_path(paths)
    manifest = _manifest(ops, root, site)
    try:
        manifest.begin_writes()  # a crash from here on makes the next load reconcile (the listing drops it)
        with held(paths.lock, timeout):
            if finishing:
                names = marker_names_log(ops, paths)
                if names is None:
                    return Finished.NOTHING
                if not names and ops.exists(paths.log):  # a newer conversation: keep it
                    ops.unlink(marker)
                    ops.fsync_dir(paths.directory)
                    return Finished.MARKER_ONLY
            invalidate(ops, paths.lock)  # before anything goes: no reader serves from the old log after
            keep = {os.path.basename(p) for p in (paths.log, paths.lock, marker)}
            prefix = cid + "."  # ids never contain '.', so the prefix names this conversation only
            had_log = ops.exists(paths.log)
            if not ops.exists(marker) and (had_log or _extras(ops, paths.directory, prefix, keep)):
                ops.atomic_write(marker, _log_identity(ops, paths.log))
            extras = _extras(ops, paths.directory, prefix, keep)
            for path in extras:
                ops.unlink(path)
            if extras:
                ops.fsync_dir(paths.directory)
            if had_log:
                ops.unlink(paths.log)
                ops.fsync_dir(paths.directory)  # the commit point
            manifest.record_erased(cid)
            if ops.exists(marker):
                ops.unlink(marker)
                ops.fsync_dir(paths.directory)
    finally:
        manifest.close()
    return ErasureResult(cid, had_log, len(extras) + had_log)


def _extras(ops: FileOps, directory: str, prefix: str, keep: set[str]) -> list[str]:
    """The conversation's other files (index, saved bytes, temp files): every name with its prefix."""
    names = ops.listdir(directory)
    return sorted(os.path.join(directory, n) for n in names if n.startswith(prefix) and n not in keep)


def _log_identity(ops: FileOps, log: str) -> bytes:
    """The first bytes of the log (b"" if there is none): its first frame's header, with its time."""
    try:
        fd = ops.open(log, os.O_RDONLY)
    except FileNotFoundError:
        return b""
    try:
        return ops.pread(fd, _IDENTITY_BYTES, 0)
    finally:
        ops.close(fd)


def _manifest(ops: FileOps, root: str, site: str) -> SiteManifest:
    # Never loaded: record_erased appends to the newest journal without reading the site's state.
    return SiteManifest(ops, root, site=site, cursor_key=b"", open_conversation=lambda cid: None)


def site_conversations(
    data_dir: str | os.PathLike[str], site: str, *, file_ops: FileOps = OS_FILE_OPS
) -> list[str]:
    """Every conversation id that has any file (log, index, saved bytes) under the site, sorted. Walks
    the site by the layout's directory rule (``layout.iter_leaves``: what is not a fan-out directory is not
    entered; ``purge_site`` removes the whole site tree after erasing these anyway)."""
    root = os.path.abspath(os.fspath(data_dir))
    found: set[str] = set()
    for leaf in layout.iter_leaves(file_ops, root, validate_site(site)):
        for entry in leaf.entries:
            cid = entry.name.partition(".")[0]
            if is_valid_id(cid) and not entry.name.endswith(layout.LOCK_SUFFIX):
                found.add(cid)
    return sorted(found)


def purge_site(
    data_dir: str | os.PathLike[str],
    site: str,
    *,
    file_ops: FileOps = OS_FILE_OPS,
    lock_timeout: float = 5.0,
) -> int:
    """Erase every conversation of ``site``, then delete its directory. Returns how many conversations
    held a log. The caller revokes the site's credentials first, so that no server admits new appends.
    Raises ``OSError`` (e.g. ENOTEMPTY) if something appeared in the site meanwhile: run it again."""
    root = os.path.abspath(os.fspath(data_dir))
    site = validate_site(site)
    erased = 0
    for cid in site_conversations(root, site, file_ops=file_ops):
        erased += erase_conversation(root, site, cid, file_ops=file_ops, lock_timeout=lock_timeout).had_log
    site_dir = layout.site_dir(root, site)
    if file_ops.exists(site_dir):
        # Before any manifest file goes: no writer stands the fence's word for its journal any more
        # (``manifest.fence``); the fence file itself is unlinked under its flock below, a lock file.
        withdraw(file_ops, layout.manifest_dir(root, site))
        _remove_tree(file_ops, site_dir, lock_timeout)
        file_ops.fsync_dir(os.path.dirname(site_dir))
    return erased


def _remove_tree(ops: FileOps, path: str, timeout: float) -> None:
    """Bottom-up removal of what erasure leaves (lock files, the manifest, directories). Only data-free
    files remain by now; any log that appeared since is still erased under its lock first."""
    for name in ops.listdir(path):
        child = os.path.join(path, name)
        if os.path.isdir(child) and not os.path.islink(child):
            _remove_tree(ops, child, timeout)
            continue
        if name.endswith(layout.LOCK_SUFFIX):
            _unlink_lock(ops, child, timeout)
            continue
        if name.endswith(layout.LOG_SUFFIX) and is_valid_id(name.partition(".")[0]):
            raise _log_appeared(child)
        ops.unlink(child)
    ops.rmdir(path)


def _unlink_lock(ops: FileOps, path: str, timeout: float) -> None:
    """Unlink a lock file while holding its flock (the rule in locking.py): whoever flocks the old inode
    afterwards, a waiter or a process that kept it open, finds that the path no longer names it and opens
    the path again, so two owners never hold "the" lock on two inodes. A conversation's log found under
    its lock (a request already past authentication appended after its erasure) stops the purge."""
    lock = PathLock(path)
    try:
        lock.acquire(timeout)
        base = path[: -len(layout.LOCK_SUFFIX)]
        log = base + layout.LOG_SUFFIX
        if is_valid_id(os.path.basename(base)) and ops.exists(log):
            raise _log_appeared(log)
        fence = PointFile.open(ops, path)  # its header changes first: an owner that trusts the header
        try:  # it left (``commit_point``'s change counter) proves the path again at its next flock
            fence.bump()
        finally:
            fence.close()
        ops.unlink(path)
    finally:
        lock.close()


def _log_appeared(path: str) -> OSError:
    return OSError(errno.ENOTEMPTY, "a conversation log appeared during the purge (run it again)", path)
