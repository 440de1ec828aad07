"""Online, incremental backup of a data dir into another data dir (``logstore backup``/``restore``).

The destination is an ordinary data dir: a server can run on it, ``logstore fsck`` checks it, and
``restore`` is this same copy in the other direction. Servers keep writing to the source meanwhile.

Per conversation log:
1. under its lock (held only for this), find the end of the last acknowledged frame, as recovery does
   (``logdump.acknowledged_end``: the engine's rule, ``file.recovery``). Every batch acknowledged before the
   backup started ends at or before it; bytes past it are another writer's work in flight, not copied;
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

A crash or error during a backup leaves the destination to be completed by the next run: a backup is
whole when ``backup`` returns (exit 0). Corrupt source logs are reported and not copied.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial

from ..core.errors import InvalidArgument
from ..core.ids import is_valid_id, is_valid_site
from ..file import layout
from ..file.fileio import OS_FILE_OPS, FileOps
from ..file.frame import decode_header
from ..file.index_codec import (
    ENTRY_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    decode_entry,
    encode_entry,
    header_ok,
)
from ..file.layout import ConversationPaths, conversation_paths
from ..file.locking import held
from ..file.manifest_codec import Entry, generations
from ..file.manifest_snapshot import encode_snapshot
from ..file.scanner import ScanState, frame_at, scan_log
from .backup_paths import resolve_backup_paths
from .logdump import acknowledged_end

__all__ = ["BackupReport", "backup", "has_conversations", "TOP_LEVEL_FILES"]

TOP_LEVEL_FILES = (layout.CREDENTIALS, layout.SECRET)
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
    paths = resolve_backup_paths(source, dest)  # before anything is written (backup_paths)
    src, dst = paths.source, paths.dest
    if not os.path.isdir(layout.sites_dir(src)):
        raise InvalidArgument(f"{src} is not a logstore data dir (no sites/ directory)", field="source")
    ops = file_ops
    report = BackupReport(src, dst)
    ops.makedirs_durable(layout.sites_dir(dst))
    for name in TOP_LEVEL_FILES:
        data = ops.read_file(os.path.join(src, name))
        if data is not None and ops.read_file(os.path.join(dst, name)) != data:
            ops.atomic_write(os.path.join(dst, name), data)
    plan = {site: dict(_logs(src, site)) for site in _sites(src)}
    total = sum(size for logs in plan.values() for size in logs.values())
    done = 0
    # Several logs at a time: each copy waits mostly on its fdatasyncs, and concurrent syncs share the
    # file system's journal commits (measured: docs/OPERATIONS.md, Backup).
    with ThreadPoolExecutor(max_workers=_PARALLEL, thread_name_prefix="logstore-backup") as pool:
        for site, logs in plan.items():
            entries: dict[str, Entry] = {}
            copies = pool.map(partial(_copy_log, ops, src, dst, site, lock_timeout=lock_timeout), logs)
            for (cid, size), copied in zip(logs.items(), copies, strict=True):
                if copied.entry is not None:
                    entries[cid] = copied.entry
                    report.bytes_total += copied.entry.log_size
                if copied.corrupt is not None:
                    report.corrupt.append(copied.corrupt)
                    kept = _entry_of_copy(ops, conversation_paths(dst, site, cid))
                    if kept is not None:  # the last good copy stays, listed
                        entries[cid] = kept
                        report.bytes_total += kept.log_size
                report.bytes_copied += copied.copied
                report.whole_copies += copied.whole
                done += size
                if progress is not None:
                    progress(done, total)
            report.removed += _remove_others(ops, dst, site, set(entries))
            _write_manifest(ops, layout.manifest_dir(dst, site), entries)
            report.conversations += len(entries)
    for site in set(_sites(dst)) - set(plan):  # a site purged from the source
        report.removed += _remove_others(ops, dst, site, set())
        _write_manifest(ops, layout.manifest_dir(dst, site), {})
    return report


def has_conversations(root: str | os.PathLike[str]) -> bool:
    """Whether the data dir holds any conversation log (``restore`` refuses to overwrite one)."""
    root = os.path.abspath(os.fspath(root))
    return any(any(True for _ in _logs(root, site)) for site in _sites(root))


def _sites(root: str) -> list[str]:
    try:
        return sorted(n for n in os.listdir(layout.sites_dir(root)) if is_valid_site(n))
    except FileNotFoundError:
        return []


def _logs(root: str, site: str) -> Iterator[tuple[str, int]]:
    """(conversation id, log size) of every log of a site."""
    base = layout.conversations_dir(root, site)
    for d1 in _names(base):
        for d2 in _names(os.path.join(base, d1)):
            leaf = os.path.join(base, d1, d2)
            for name in _names(leaf):
                cid = name.removesuffix(layout.LOG_SUFFIX)
                if cid != name and is_valid_id(cid):
                    try:
                        yield cid, os.stat(os.path.join(leaf, name)).st_size
                    except FileNotFoundError:  # erased meanwhile
                        continue


def _names(path: str) -> list[str]:
    try:
        return sorted(os.listdir(path))
    except (FileNotFoundError, NotADirectoryError):
        return []


@dataclass(frozen=True, slots=True)
class _Copied:
    entry: Entry | None  # None: nothing acknowledged to copy, or corrupt
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
        return _Copied(entry, end - start, start == 0)
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


def _entry_of_copy(ops: FileOps, dp: ConversationPaths) -> Entry | None:
    """The manifest entry of the destination's existing copy (kept when the source log is corrupt)."""
    try:
        fd = ops.open(dp.log, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        result = scan_log(ops, fd, keep_frames=False)
        header = decode_header(ops.pread(fd, 64, 0))
        if result.state is not ScanState.CLEAN or result.last_recorded_at is None or header is None:
            return None
        return Entry(header.recorded_at, result.last_recorded_at, result.end, result.next_seq)
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
    for cid, _ in list(_logs(dst, site)):
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
    found = generations(_names(directory))
    new = max(found.snapshots + found.journals, default=0) + 1
    ops.atomic_write(layout.manifest_file(directory, "snapshot", new), encode_snapshot(entries.items()))
    for kind, gens in (("snapshot", found.snapshots), ("journal", found.journals)):
        for gen in gens:
            if gen < new:
                ops.unlink(layout.manifest_file(directory, kind, gen))
    ops.fsync_dir(directory)
