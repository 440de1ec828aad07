"""Online, incremental backup of a data dir into another data dir (``logstore backup``/``restore``).

The destination is an ordinary data dir: a server can run on it, ``logstore fsck`` checks it, and
``restore`` is this same copy in the other direction. Servers keep writing to the source meanwhile.

Per conversation log:
1. under its lock (held only for this), find the end of the last acknowledged frame, as recovery does
   (``logdump.acknowledged_end``: the engine's rule, ``file.log.recovery``). Every batch acknowledged
   before the backup started ends at or before it; bytes past it are another writer's work in flight,
   not copied;
2. without the lock, scan the source from where the destination's copy ends to that end (logs are
   append-only, so the bytes before it never change), copy those bytes, ``fdatasync``, and extend the
   destination's index with one entry per new frame (the index then matches the log exactly);
3. incremental: the destination's copy is reused when its last frame is byte-identical in the source;
   otherwise (the source was repaired, or erased and started again) the log is copied whole;
4. a copy that has another name (a hard link: ``cp -al DEST DEST.1``) is never written in place: the new
   copy is written beside it and renamed over it (``backup_log``), so the other name keeps its bytes;
5. the manifest records a CRC32C of each whole copy (carried forward from the last complete manifest and
   extended by the new bytes), so a restore refuses a log that is not the one copied.

Then per site, the destination's manifest is written afresh as one snapshot built from the copied logs
(the listing of exactly those conversations), after every log it lists is durable. Conversations no
longer in the source (erased) are removed from the destination; a conversation whose source log is
corrupt keeps its last good copy (reported, and not updated). ``credentials.json`` and ``secret`` are
copied first (each is replaced atomically in the source, so a complete version is read).

Before anything is written the destination is checked: it must not overlap the source however spelled
(``backup_paths``), must hold no symlink and no hard link to the source's files (``refuse_links``), and
must be empty or a backup of this same store (``backup_manifest``: the store id of ``file.store_id``,
read only: nothing is ever written into the source, which may be read-only). Locks (``data_dir_lock``):
the source's shared (online, beside its servers), the destination's exclusive without waiting (no server
may serve it while conversations are removed and manifests replaced there). The first write is the
backup's mark (``backup_of``: fsck knows a backup even if its manifest is deleted), then it is marked
incomplete, the last one writes its backup manifest
(``backup_manifest``): a crash or error leaves it marked incomplete, ``restore`` and ``fsck`` refuse it,
and the next run completes it. Corrupt source logs are reported and not copied (the backup is then
marked incomplete, naming them: ``logstore fsck`` the source, then back up again).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from ..core.errors import InvalidArgument
from ..file import layout
from ..file.data_dir_lock import DataDirLock
from ..file.fileio import OS_FILE_OPS, FileOps
from ..file.layout import conversation_paths
from ..file.manifest.codec import Entry, generations
from ..file.manifest.snapshot import encode_snapshot
from ..file.store_id import StoreIdDamaged, store_identity
from .backup_log import copy_kept, copy_log
from .backup_manifest import (
    BackupManifest,
    LogRecord,
    describe,
    destination_owner,
    digest,
    read_manifest,
    utc_now,
    verify,
    write_manifest,
)
from .backup_paths import refuse_links, resolve_backup_paths

__all__ = ["BackupReport", "backup", "restore", "has_conversations", "TOP_LEVEL_FILES"]

TOP_LEVEL_FILES = (layout.CREDENTIALS, layout.SECRET, layout.STORE_ID)
_CHUNK = 1 << 20
_PARALLEL = 8


@dataclass
class BackupReport:
    source: str
    dest: str
    conversations: int = 0
    bytes_copied: int = 0  # log bytes written to the destination this run
    bytes_total: int = 0  # acknowledged log bytes the destination now holds
    whole_copies: int = 0  # logs copied from byte 0 (new, or not a prefix of the source any more)
    removed: int = 0  # conversations gone from the source, removed from the destination
    corrupt: list[str] = field(default_factory=list)  # "site/conversation: reason at byte N"


def backup(
    source: str | os.PathLike[str],
    dest: str | os.PathLike[str],
    *,
    file_ops: FileOps = OS_FILE_OPS,
    lock_timeout: float = 5.0,
    progress: Callable[[int, int], None] | None = None,
) -> BackupReport:
    """Back ``source`` up into ``dest`` (module docstring). ``InvalidArgument`` before anything is
    written: overlapping paths (``backup_paths``), a destination that is neither empty nor a backup of
    this store (``backup_manifest.destination_owner``), or that holds links (``refuse_links``).
    ``DataDirInUse``: a server or store has ``dest`` open, or a restore is rewriting ``source``."""
    paths = resolve_backup_paths(source, dest)  # before anything is written (backup_paths)
    src, dst, ops = paths.source, paths.dest, file_ops
    _require_data_dir(src)
    # Shared on the source (a restore into it cannot start meanwhile), exclusive on the destination: no
    # server serves it and no other backup or restore writes there while this one removes and replaces.
    with DataDirLock.shared(ops, src, timeout=lock_timeout):
        store_id = _source_id(ops, src)  # read only: nothing is ever written into the source
        _check_owner(ops, dst, store_id)
        ops.makedirs_durable(dst)
        with DataDirLock.exclusive(ops, dst, what="a backup into it"):
            _check_owner(ops, dst, store_id)  # again, now that nobody else can write there
            refuse_links(dst, src, field="dest")  # one walk of DEST (an lstat per file), under the lock
            known = _known_copies(ops, dst)  # before the incomplete manifest replaces the complete one
            started = utc_now()
            if not ops.exists(layout.backup_of_path(dst)):  # fsck knows a backup even without its manifest
                ops.atomic_write(layout.backup_of_path(dst), f"{store_id}\n".encode())
            # From here on the destination says "incomplete" until the last write.
            write_manifest(ops, dst, BackupManifest(store_id, started))
            copied = _copy_data_dir(
                ops, src, dst, lock_timeout=lock_timeout, progress=progress, known=known, restoring=False
            )
            _finish(ops, dst, store_id, started, copied)
    return copied.report


def _source_id(ops: FileOps, src: str) -> str:
    try:
        store_id = store_identity(ops, src)
    except StoreIdDamaged as exc:
        raise InvalidArgument(f"{exc}: run `logstore fsck` on the data dir", field="source") from exc
    if store_id is None:
        raise InvalidArgument(
            f"{src} has neither a store_id nor a secret: no store has opened it, there is nothing to back up",
            field="source",
        )
    return store_id


def _known_copies(ops: FileOps, dst: str) -> dict[str, LogRecord]:
    """The logs the destination's complete manifest vouches for (their digests are carried forward)."""
    try:
        manifest = read_manifest(ops, dst)
    except ValueError:
        return {}
    return dict(manifest.logs) if manifest is not None and manifest.complete else {}


def _check_owner(ops: FileOps, dst: str, store_id: str | None) -> None:
    """Refuse a destination that is neither empty nor a backup of the store ``store_id``."""
    owner = destination_owner(ops, dst)
    if owner is not None and store_id != owner:
        raise InvalidArgument(
            f"the backup destination {dst} holds a backup of another store (store id {owner}; this data "
            f"dir's is {store_id or 'not set'}): refusing to overwrite it. Use an empty or new directory",
            field="dest",
        )


def _finish(ops: FileOps, dst: str, store_id: str, started: str, copied: _TreeCopy) -> None:
    report = copied.report
    finished = BackupManifest(
        store_id,
        started,
        complete=not report.corrupt,
        finished=utc_now(),
        files=copied.files,
        logs=copied.logs,
        sites=tuple(copied.sites),
        corrupt=tuple(report.corrupt),
    )
    write_manifest(ops, dst, finished)


def restore(
    backup_dir: str | os.PathLike[str],
    data_dir: str | os.PathLike[str],
    *,
    file_ops: FileOps = OS_FILE_OPS,
    lock_timeout: float = 5.0,
    progress: Callable[[int, int], None] | None = None,
) -> BackupReport:
    """Copy a whole backup into a data dir that holds no conversation yet (or a partial restore of this
    same backup, which is completed). ``InvalidArgument``, before anything is written: overlapping paths,
    a backup that is not whole (``backup_manifest.verify``, naming what is missing or different), a data
    dir that holds data the backup does not (conversations, other credentials) or links.
    ``DataDirInUse``: a server, a store or another command has the data dir open (restore is offline
    only). The data dir holds a restore marker until the copy is done; a log whose bytes do not match
    the manifest's digest as copied is reported in ``corrupt`` and the marker stays."""
    paths = resolve_backup_paths(backup_dir, data_dir)
    src, dst, ops = paths.source, paths.dest, file_ops
    with DataDirLock.shared(ops, src, timeout=lock_timeout):  # no backup writes into it meanwhile
        problems = verify(ops, src)
        if problems:
            raise InvalidArgument(
                f"{src} is not a whole backup; nothing was restored:\n  {describe(problems)}", field="source"
            )
        whole = read_manifest(ops, src)
        assert whole is not None  # verified
        ops.makedirs_durable(dst)
        with DataDirLock.exclusive(ops, dst, what="restore (offline only)"):
            _check_restore_target(ops, src, dst, whole)
            ops.makedirs_durable(layout.sites_dir(dst))
            # Until the copy is done the data dir says it is partial (fsck: backup-incomplete; a rerun
            # resumes).
            write_manifest(ops, dst, BackupManifest(whole.store_id, utc_now(), restoring_from=src))
            report = _copy_data_dir(
                ops, src, dst, lock_timeout=lock_timeout, progress=progress, known=whole.logs, restoring=True
            ).report
            if report.corrupt:  # changed since it was verified: the data dir stays marked partial
                return report
            ops.unlink(layout.backup_manifest_path(dst))
            ops.fsync_dir(dst)
    return report


def _check_restore_target(ops: FileOps, src: str, dst: str, whole: BackupManifest) -> None:
    """Refuse a data dir holding anything a restore would overwrite or remove that it did not copy there
    itself: a conversation (unless this is a rerun of the same restore and every log is a prefix of the
    backup's), credentials other than the backup's, links. Runs under the exclusive lock."""
    refuse_links(dst, src, field="dest")
    try:
        marker = read_manifest(ops, dst)
    except ValueError:
        marker = None
    resuming = marker is not None and marker.restoring_from == src and marker.store_id == whole.store_id
    if has_conversations(dst, file_ops=ops) and not resuming:
        raise InvalidArgument(
            f"data dir {dst} already holds conversations; restore into a new or empty data dir", field="dest"
        )
    theirs = ops.read_file(os.path.join(dst, layout.CREDENTIALS))
    if theirs is not None and theirs != ops.read_file(os.path.join(src, layout.CREDENTIALS)):
        raise InvalidArgument(
            f"data dir {dst} holds a {layout.CREDENTIALS} that is not the backup's (sites added there?): "
            "move it aside to restore the backup's; nothing was changed",
            field="dest",
        )
    for site in layout.iter_sites(ops, dst):
        for cid, log in layout.iter_logs(ops, dst, site):
            record = whole.logs.get(f"{site}/{cid}")
            original = conversation_paths(src, site, cid).log
            if record is None or not _is_prefix(ops, log, original, record.size):
                raise InvalidArgument(
                    f"data dir {dst} holds {site}/{cid}, which is not part of this backup's partial "
                    "restore (written since?): restore into a new or empty data dir; nothing was changed",
                    field="dest",
                )


def _is_prefix(ops: FileOps, log: str, original: str, limit: int) -> bool:
    fd = ops.open(log, os.O_RDONLY | os.O_NOFOLLOW)
    try:
        size = ops.size(fd)
        if size > limit:
            return False
        ofd = ops.open(original, os.O_RDONLY | os.O_NOFOLLOW)
        try:
            return all(
                ops.pread(fd, min(_CHUNK, size - pos), pos) == ops.pread(ofd, min(_CHUNK, size - pos), pos)
                for pos in range(0, size, _CHUNK)
            )
        finally:
            ops.close(ofd)
    finally:
        ops.close(fd)


def _require_data_dir(root: str) -> None:
    if not os.path.isdir(layout.sites_dir(root)):
        raise InvalidArgument(f"{root} is not a logstore data dir (no sites/ directory)", field="source")


@dataclass
class _TreeCopy:
    report: BackupReport
    files: dict[str, str] = field(default_factory=dict)  # top-level file -> sha256 of what was copied
    logs: dict[str, LogRecord] = field(default_factory=dict)  # "site/cid" -> what the copy holds
    sites: list[str] = field(default_factory=list)


def _copy_data_dir(
    ops: FileOps,
    src: str,
    dst: str,
    *,
    lock_timeout: float,
    progress: Callable[[int, int], None] | None,
    known: dict[str, LogRecord],
    restoring: bool,
) -> _TreeCopy:
    """Copy ``src`` into ``dst``. ``known``: the manifest records of the logs (a backup: its destination's
    last complete copies, whose digests are carried forward; a restore: the backup's, which every copy
    must match). A restore never removes anything (``_check_restore_target`` proved there is nothing it
    did not copy itself)."""
    tree = _TreeCopy(BackupReport(src, dst))
    report = tree.report
    ops.makedirs_durable(layout.sites_dir(dst))
    for name in TOP_LEVEL_FILES:
        data = ops.read_file(os.path.join(src, name))
        if data is not None:
            if ops.read_file(os.path.join(dst, name)) != data:
                ops.atomic_write(os.path.join(dst, name), data)
            tree.files[name] = digest(data)
    plan = {site: dict(_logs(ops, src, site)) for site in layout.iter_sites(ops, src)}
    tree.sites = sorted(plan)
    total = sum(size for logs in plan.values() for size in logs.values())
    done = 0
    # Several logs at a time: each copy waits mostly on its fdatasyncs, and concurrent syncs share the
    # file system's journal commits (measured: docs/OPERATIONS.md, Backup).
    with ThreadPoolExecutor(max_workers=_PARALLEL, thread_name_prefix="logstore-backup") as pool:
        for site, logs in plan.items():
            entries: dict[str, Entry] = {}
            copy = partial(
                copy_log, ops, src, dst, site, lock_timeout=lock_timeout, known=known, restoring=restoring
            )
            for (cid, size), copied in zip(logs.items(), pool.map(copy, logs), strict=True):
                kept = copied
                if copied.corrupt is not None:
                    report.corrupt.append(copied.corrupt)
                    if not restoring:  # the last good copy stays
                        kept = copy_kept(ops, conversation_paths(dst, site, cid), known.get(f"{site}/{cid}"))
                if kept.entry is not None:
                    entries[cid] = kept.entry
                    report.bytes_total += kept.entry.log_size
                    record = LogRecord(kept.entry.log_size, kept.frames, kept.entry.next_seq, kept.crc)
                    tree.logs[f"{site}/{cid}"] = record
                report.bytes_copied += copied.copied
                report.whole_copies += copied.whole
                done += size
                if progress is not None:
                    progress(done, total)
            if not restoring:
                report.removed += _remove_others(ops, dst, site, set(entries))
            _write_manifest(ops, layout.manifest_dir(dst, site), entries)
            report.conversations += len(entries)
    if not restoring:
        for site in set(layout.iter_sites(ops, dst)) - set(plan):  # a site purged from the source
            report.removed += _remove_others(ops, dst, site, set())
            _write_manifest(ops, layout.manifest_dir(dst, site), {})
    return tree


def has_conversations(root: str | os.PathLike[str], *, file_ops: FileOps = OS_FILE_OPS) -> bool:
    """Whether the data dir holds any conversation log (``restore`` refuses to overwrite one)."""
    root = os.path.abspath(os.fspath(root))
    sites = layout.iter_sites(file_ops, root)
    return any(any(True for _ in layout.iter_logs(file_ops, root, site)) for site in sites)


def _logs(ops: FileOps, root: str, site: str) -> Iterator[tuple[str, int]]:
    """(conversation id, log size) of every log of a site."""
    for cid, path in layout.iter_logs(ops, root, site):
        size = ops.stat_size(path)
        if size is not None:  # else erased meanwhile
            yield cid, size


def _remove_others(ops: FileOps, dst: str, site: str, keep: set[str]) -> int:
    """Remove the destination's conversations that are not in ``keep`` (erased from the source)."""
    removed = 0
    for cid, _ in list(_logs(ops, dst, site)):
        if cid in keep:
            continue
        paths = conversation_paths(dst, site, cid)
        for path in (paths.index, paths.log):  # the index first, as erasure does
            if ops.exists(path):
                ops.unlink(path)
        ops.fsync_dir(paths.directory)
        removed += 1
    return removed


def _write_manifest(ops: FileOps, directory: str, entries: dict[str, Entry]) -> None:
    """Replace the destination site's manifest (``directory``) by one snapshot of ``entries`` (a newer
    generation than any file there, then the older files go), after the logs it lists were made durable."""
    ops.makedirs_durable(directory)
    found = generations(sorted(ops.listdir(directory)))
    new = max(found.snapshots + found.journals, default=0) + 1
    ops.atomic_write(layout.manifest_file(directory, "snapshot", new), encode_snapshot(entries.items()))
    for kind, gens in (("snapshot", found.snapshots), ("journal", found.journals)):
        for gen in gens:
            if gen < new:
                ops.unlink(layout.manifest_file(directory, kind, gen))
    ops.fsync_dir(directory)
