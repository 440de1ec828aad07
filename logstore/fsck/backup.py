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
   otherwise (the source was repaired, or erased and started again) the log is copied whole.

Then per site, the destination's manifest is written afresh as one snapshot built from the copied logs
(the listing of exactly those conversations), after every log it lists is durable. Conversations no
longer in the source (erased) are removed from the destination; a conversation whose source log is
corrupt keeps its last good copy (reported, and not updated). ``credentials.json`` and ``secret`` are
copied first (each is replaced atomically in the source, so a complete version is read).

Before anything is written the destination is checked: it must not overlap the source however spelled
(``backup_paths``) and must be empty or a backup of this same store (``backup_manifest``: the store id of
``file.store_id``). The first write marks it incomplete, the last one writes its backup manifest
(``backup_manifest``): a crash or error leaves it marked incomplete, ``restore`` and ``fsck`` refuse it,
and the next run completes it. Corrupt source logs are reported and not copied (the backup is then
marked incomplete, naming them: ``logstore fsck`` the source, then back up again).
"""

from __future__ import annotations

import fcntl
import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from functools import partial

from ..core.errors import InvalidArgument
from ..file import layout
from ..file.fileio import OS_FILE_OPS, FileOps
from ..file.layout import ConversationPaths, conversation_paths
from ..file.locking import held
from ..file.log.frame import decode_header
from ..file.log.index_codec import (
    ENTRY_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    decode_entry,
    encode_entry,
    header_ok,
)
from ..file.log.scanner import ScanState, frame_at, scan_log
from ..file.manifest.codec import Entry, generations
from ..file.manifest.snapshot import encode_snapshot
from ..file.store_id import StoreIdDamaged, ensure_store_id, read_store_id
from .backup_manifest import (
    BackupManifest,
    LogRecord,
    describe,
    destination_owner,
    digest,
    read_manifest,
    scan_counting,
    utc_now,
    verify,
    write_manifest,
)
from .backup_paths import resolve_backup_paths
from .logdump import acknowledged_end

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
    this store (``backup_manifest.destination_owner``)."""
    paths = resolve_backup_paths(source, dest)  # before anything is written (backup_paths)
    src, dst, ops = paths.source, paths.dest, file_ops
    _require_data_dir(src)
    try:
        _check_owner(ops, dst, read_store_id(ops, src))
        store_id = ensure_store_id(ops, src)
    except StoreIdDamaged as exc:
        raise InvalidArgument(f"{exc}: run `logstore fsck` on the data dir", field="source") from exc
    started = utc_now()
    ops.makedirs_durable(dst)
    with _exclusive(dst):
        _check_owner(ops, dst, store_id)  # again, now that no other backup or restore can write there
        # The first write to the destination: from here on it says "incomplete" until the last write.
        write_manifest(ops, dst, BackupManifest(store_id, started))
        copied = _copy_data_dir(ops, src, dst, lock_timeout=lock_timeout, progress=progress)
        _finish(ops, dst, store_id, started, copied)
    return copied.report


def _check_owner(ops: FileOps, dst: str, store_id: str | None) -> None:
    """Refuse a destination that is neither empty nor a backup of the store ``store_id``."""
    owner = destination_owner(ops, dst)
    if owner is not None and store_id != owner:
        raise InvalidArgument(
            f"the backup destination {dst} holds a backup of another store (store id {owner}; this data "
            f"dir's is {store_id or 'not set'}): refusing to overwrite it. Use an empty or new directory",
            field="dest",
        )


@contextmanager
def _exclusive(dst: str) -> Iterator[None]:
    """One backup or restore at a time writes into ``dst`` (a flock on the directory itself: no file is
    added to it, and the lock goes with the process however it ends)."""
    fd = os.open(dst, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise InvalidArgument(
                f"another backup or restore is writing to {dst}: wait for it to finish", field="dest"
            ) from None
        yield
    finally:
        os.close(fd)


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
    dir that already holds conversations. The data dir holds a restore marker until the copy is done."""
    paths = resolve_backup_paths(backup_dir, data_dir)
    src, dst, ops = paths.source, paths.dest, file_ops
    problems = verify(ops, src)
    if problems:
        raise InvalidArgument(
            f"{src} is not a whole backup; nothing was restored:\n  {describe(problems)}", field="source"
        )
    whole = read_manifest(ops, src)
    assert whole is not None  # verified
    try:
        marker = read_manifest(ops, dst)
    except ValueError:
        marker = None
    resuming = marker is not None and marker.restoring_from == src and marker.store_id == whole.store_id
    if has_conversations(dst, file_ops=ops) and not resuming:
        raise InvalidArgument(
            f"data dir {dst} already holds conversations; restore into a new or empty data dir", field="dest"
        )
    ops.makedirs_durable(layout.sites_dir(dst))
    with _exclusive(dst):
        # Until the copy is done the data dir says it is partial (fsck: backup-incomplete; a rerun resumes).
        write_manifest(ops, dst, BackupManifest(whole.store_id, utc_now(), restoring_from=src))
        report = _copy_data_dir(ops, src, dst, lock_timeout=lock_timeout, progress=progress).report
        ops.unlink(layout.backup_manifest_path(dst))
        ops.fsync_dir(dst)
    return report


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
) -> _TreeCopy:
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
            copies = pool.map(partial(_copy_log, ops, src, dst, site, lock_timeout=lock_timeout), logs)
            for (cid, size), copied in zip(logs.items(), copies, strict=True):
                kept = copied
                if copied.corrupt is not None:
                    report.corrupt.append(copied.corrupt)
                    kept = _copy_kept(ops, conversation_paths(dst, site, cid))  # the last good copy stays
                if kept.entry is not None:
                    entries[cid] = kept.entry
                    report.bytes_total += kept.entry.log_size
                    record = LogRecord(kept.entry.log_size, kept.frames, kept.entry.next_seq)
                    tree.logs[f"{site}/{cid}"] = record
                report.bytes_copied += copied.copied
                report.whole_copies += copied.whole
                done += size
                if progress is not None:
                    progress(done, total)
            report.removed += _remove_others(ops, dst, site, set(entries))
            _write_manifest(ops, layout.manifest_dir(dst, site), entries)
            report.conversations += len(entries)
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


@dataclass(frozen=True, slots=True)
class _Copied:
    entry: Entry | None  # None: nothing acknowledged to copy, or corrupt
    frames: int = 0  # frames the copy holds
    copied: int = 0
    whole: bool = False
    corrupt: str | None = None


def _copy_log(ops: FileOps, src: str, dst: str, site: str, cid: str, *, lock_timeout: float) -> _Copied:
    """Bring the destination's copy of one log up to the source's acknowledged end."""
    sp, dp = conversation_paths(src, site, cid), conversation_paths(dst, site, cid)
    try:
        sfd = ops.open(sp.log, os.O_RDONLY)
    except FileNotFoundError:  # erased since the listing
        return _Copied(None)
    try:
        with held(sp.lock, lock_timeout):
            verdict = acknowledged_end(ops, sp, sfd)
        end = verdict.end
        if verdict.state is ScanState.CORRUPT:
            return _Copied(None, corrupt=f"{site}/{cid}: {verdict.reason} at byte {verdict.stop}")
        if end == 0:
            return _Copied(None)
        ops.makedirs_durable(dp.directory)
        created = not ops.exists(dp.log)
        dfd = ops.open(dp.log, os.O_RDWR | os.O_CREAT)
        try:
            start, seq, last_at, index = _reusable_prefix(ops, sfd, dp, dfd, end)
            result = scan_log(
                ops, sfd, start=start, expected_seq=seq, last_recorded_at=last_at, file_size=end
            )
            # Cannot be: the end was found the same way.
            if result.state is not ScanState.CLEAN or result.end != end:
                return _Copied(None, corrupt=f"{site}/{cid}: {result.reason} at byte {result.stop_offset}")
            if start < end:  # else the copy is complete already (its index is written after its sync)
                for pos in range(start, end, _CHUNK):
                    ops.pwrite(dfd, ops.pread(sfd, min(_CHUNK, end - pos), pos), pos)
                if ops.size(dfd) != end:
                    ops.ftruncate(dfd, end)
                ops.fdatasync(dfd)
            header = decode_header(ops.pread(dfd, 64, 0))
        finally:
            ops.close(dfd)
        if created:
            ops.fsync_dir(dp.directory)
        if start < end:
            _write_index(ops, dp, index, b"".join(encode_entry(f.offset, f.first_seq) for f in result.frames))
        assert header is not None and result.last_recorded_at is not None
        entry = Entry(header.recorded_at, result.last_recorded_at, end, result.next_seq)
        frames = len(index) // ENTRY_SIZE + len(result.frames)
        return _Copied(entry, frames, end - start, start == 0)
    finally:
        ops.close(sfd)


def _reusable_prefix(
    ops: FileOps, sfd: int, dp: ConversationPaths, dfd: int, end: int
) -> tuple[int, int, int | None, bytes]:
    """(offset, next seq, last recorded_at, index entries) of the destination's copy when it is a prefix
    of the source: its index is whole and its last frame is byte-identical in the source. Else a fresh
    start."""
    fresh = (0, 0, None, b"")
    data = ops.read_file(dp.index) or b""
    if not header_ok(data) or (len(data) - INDEX_HEADER_SIZE) % ENTRY_SIZE:
        return fresh
    entries = data[INDEX_HEADER_SIZE:]
    n = len(entries) // ENTRY_SIZE
    last = decode_entry(entries, n - 1) if n else None
    size = ops.size(dfd)
    if last is None or size > end:
        return fresh
    frame = frame_at(ops, dfd, last[0], size)
    if frame is None or frame.first_seq != last[1] or frame.end != size:
        return fresh
    if ops.pread(sfd, frame.size, frame.offset) != ops.pread(dfd, frame.size, frame.offset):
        return fresh
    return frame.end, frame.first_seq + frame.count, frame.recorded_at, entries


def _copy_kept(ops: FileOps, dp: ConversationPaths) -> _Copied:
    """The destination's existing copy, kept when the source log is corrupt: its manifest entry and frame
    count (entry None if there is no clean copy)."""
    try:
        fd = ops.open(dp.log, os.O_RDONLY)
    except FileNotFoundError:
        return _Copied(None)
    try:
        result, frames = scan_counting(ops, fd)
        header = decode_header(ops.pread(fd, 64, 0))
        if result.state is not ScanState.CLEAN or result.last_recorded_at is None or header is None:
            return _Copied(None)
        entry = Entry(header.recorded_at, result.last_recorded_at, result.end, result.next_seq)
        return _Copied(entry, frames)
    finally:
        ops.close(fd)


def _write_index(ops: FileOps, dp: ConversationPaths, kept: bytes, new: bytes) -> None:
    created = not ops.exists(dp.index)
    fd = ops.open(dp.index, os.O_RDWR | os.O_CREAT)
    try:
        if kept:
            ops.pwrite(fd, new, INDEX_HEADER_SIZE + len(kept))
        else:
            ops.pwrite(fd, INDEX_HEADER + new, 0)
        ops.ftruncate(fd, INDEX_HEADER_SIZE + len(kept) + len(new))
        ops.fdatasync(fd)
    finally:
        ops.close(fd)
    if created:
        ops.fsync_dir(dp.directory)


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
