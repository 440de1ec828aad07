"""The backup manifest (``<backup>/backup_manifest.json``): what a finished backup holds, written last, the
way ``pg_basebackup`` writes ``backup_manifest`` and restic a snapshot. Without it a backup killed
mid-copy, or one that failed, would pass for whole: ``restore`` and ``fsck`` would see an ordinary data
dir with fewer conversations and no way to tell which are missing.

    {"format": "logstore-backup", "version": 2, "store_id": "<32 hex>", "complete": true,
     "started": "2026-12-03T20:31:07Z", "finished": "2026-12-03T20:31:09Z",
     "files": {"secret": "<sha256>", "credentials.json": "<sha256>", "store_id": "<sha256>"},
     "logs": {"<site>/<conversation>": [size, frames, next_seq, crc32c of the whole log], ...},
     "sites": ["<site>", ...], "corrupt": ["<site>/<conversation>: crc-mismatch at byte 880", ...]}

Lifecycle (``backup.backup``): before anything else is written to the destination, the manifest is
replaced by one that says ``"complete": false`` (and names the source store); only after every log, index,
site manifest and top-level file is durable is it replaced (atomically) by the complete one. So at every
instant the destination holds either a complete manifest that matches its files, or an incomplete one.

``restore`` writes the same file into the data dir it fills, with ``"restoring_from"`` set, and removes it
when done: a restore killed midway leaves a data dir that ``fsck`` reports as incomplete and that a rerun
of the same restore completes (instead of refusing it for holding conversations).

Rules (``destination_owner`` and ``verify``, one home for both ``restore`` and ``fsck``):
- a destination is empty, or holds a manifest naming the store being backed up; anything else is refused;
- a backup is whole when its manifest is complete, every log it lists is there with that size, frame count,
  next seq and content digest (CRC32C of the whole log: a log swapped with another conversation's has the
  same frames and seqs) and scans clean (every frame's CRC), no log is there that it does not list, no
  entry is a symbolic link, and the top-level files have the listed digests. A version 1 manifest (no
  digests) is checked without them.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import time
from dataclasses import dataclass, field
from typing import Any

from crc32c import crc32c

from ..core.errors import InvalidArgument
from ..file import layout
from ..file.fileio import FileOps
from ..file.layout import conversation_paths
from ..file.log.scanner import ScanResult, ScanState, scan_log
from .backup_paths import links_in

__all__ = [
    "LogRecord",
    "BackupManifest",
    "Problem",
    "INCOMPLETE",
    "MISMATCH",
    "digest",
    "utc_now",
    "read_manifest",
    "write_manifest",
    "destination_owner",
    "verify",
    "describe",
    "scan_counting",
    "log_digest",
]

FORMAT, VERSION = "logstore-backup", 2
READS = (1, 2)  # version 1: no per-log digest (checked without it; the next backup run adds them)
_CHUNK = 1 << 20
_STORE_ID = re.compile(r"[0-9a-f]{32}")
INCOMPLETE = "backup-incomplete"  # no complete manifest: interrupted, failed, or corrupt source logs
MISMATCH = "backup-mismatch"  # a complete manifest the files disagree with


@dataclass(frozen=True, slots=True)
class LogRecord:
    size: int
    frames: int
    next_seq: int
    crc32c: int | None = None  # of the whole log (``log_digest``); None in a version 1 manifest


@dataclass(frozen=True, slots=True)
class BackupManifest:
    store_id: str
    started: str
    complete: bool = False
    finished: str | None = None
    files: dict[str, str] = field(default_factory=dict)  # top-level file name -> sha256 hex
    logs: dict[str, LogRecord] = field(default_factory=dict)  # "site/conversation" -> record
    sites: tuple[str, ...] = ()
    corrupt: tuple[str, ...] = ()
    restoring_from: str | None = None  # set in a data dir while ``restore`` fills it (removed when done)

    def encode(self) -> bytes:
        body: dict[str, Any] = {
            "format": FORMAT,
            "version": VERSION,
            "store_id": self.store_id,
            "complete": self.complete,
            "started": self.started,
            "finished": self.finished,
            "files": dict(sorted(self.files.items())),
            "logs": {k: [r.size, r.frames, r.next_seq, r.crc32c] for k, r in sorted(self.logs.items())},
            "sites": sorted(self.sites),
            "corrupt": list(self.corrupt),
            "restoring_from": self.restoring_from,
        }
        return json.dumps(body, separators=(",", ":")).encode() + b"\n"

    @classmethod
    def decode(cls, data: bytes) -> BackupManifest:
        """Raises ValueError for anything that is not a manifest this build writes."""
        try:
            body = json.loads(data)
            if body.get("format") != FORMAT or body.get("version") not in READS:
                raise ValueError(f"not a version {' or '.join(map(str, READS))} {FORMAT} manifest")
            return cls(
                store_id=str(body["store_id"]),
                started=str(body["started"]),
                complete=body["complete"] is True,
                finished=body["finished"],
                files={str(k): str(v) for k, v in body["files"].items()},
                logs={str(k): _record(v) for k, v in body["logs"].items()},
                sites=tuple(str(s) for s in body["sites"]),
                corrupt=tuple(str(c) for c in body["corrupt"]),
                restoring_from=body.get("restoring_from"),
            )
        except (KeyError, TypeError, AttributeError, UnicodeDecodeError) as exc:
            raise ValueError(f"damaged: {exc!r}") from exc


def _record(value: list[Any]) -> LogRecord:
    if len(value) == 3:  # version 1
        return LogRecord(int(value[0]), int(value[1]), int(value[2]))
    size, frames, next_seq, crc = value
    return LogRecord(int(size), int(frames), int(next_seq), None if crc is None else int(crc))


@dataclass(frozen=True, slots=True)
class Problem:
    kind: str  # INCOMPLETE | MISMATCH
    path: str  # absolute
    message: str
    site: str | None = None
    conversation: str | None = None


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def log_digest(ops: FileOps, fd: int, size: int, *, start: int = 0, crc: int = 0) -> int:
    """CRC32C of the log's bytes [start, size), continuing ``crc`` (the digest of [0, start)): what a backup
    manifest records per log, so that a log swapped with another conversation's, or replaced by one of the
    same size, frame count and seqs, is refused (frames carry no conversation id)."""
    for pos in range(start, size, _CHUNK):
        crc = crc32c(ops.pread(fd, min(_CHUNK, size - pos), pos), crc)
    return crc


def utc_now() -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())


def read_manifest(ops: FileOps, root: str) -> BackupManifest | None:
    """The manifest of the backup at ``root``, None if there is none. Raises ValueError if damaged."""
    data = ops.read_file(layout.backup_manifest_path(root))
    return None if data is None else BackupManifest.decode(data)


def write_manifest(ops: FileOps, root: str, manifest: BackupManifest) -> None:
    ops.atomic_write(layout.backup_manifest_path(root), manifest.encode())


def destination_owner(ops: FileOps, dest: str) -> str | None:
    """The store id a backup destination belongs to: None when it does not exist or is empty (a new
    backup). ``InvalidArgument`` for anything else: not a directory, not empty and no manifest (another
    data dir, an older logstore's backup, unrelated files), a damaged manifest."""
    if not os.path.lexists(dest):
        return None
    if not os.path.isdir(dest):
        raise InvalidArgument(f"the backup destination {dest} is not a directory", field="dest")
    names = set(os.listdir(dest))
    if not {n for n in names if n != layout.DATA_DIR_LOCK and not n.startswith(layout.BACKUP_OF)}:
        return None  # new, or a first run killed before it wrote more than the lock and the mark
    try:
        manifest = read_manifest(ops, dest)
    except ValueError as exc:
        raise InvalidArgument(
            f"the backup destination {dest} has a damaged {layout.BACKUP_MANIFEST} ({exc}): cannot tell "
            "whose backup it is; move it aside",
            field="dest",
        ) from exc
    if manifest is None:
        marked = (ops.read_file(layout.backup_of_path(dest)) or b"").decode("ascii", "replace").strip()
        if _STORE_ID.fullmatch(marked):
            return marked  # a backup whose manifest is gone (an interrupted first run, or deleted)
        raise InvalidArgument(
            f"the backup destination {dest} is not empty and is not a backup made by `logstore backup` "
            f"(no {layout.BACKUP_MANIFEST}): refusing to overwrite it. Use an empty or new directory (an "
            "older logstore's backup has no manifest: move it aside and back up afresh)",
            field="dest",
        )
    return manifest.store_id


def verify(ops: FileOps, root: str) -> list[Problem]:
    """Why the backup at ``root`` is not whole (module docstring), [] if it is. Reads every listed log."""
    path = layout.backup_manifest_path(root)
    try:
        manifest = read_manifest(ops, root)
    except ValueError as exc:
        return [Problem(INCOMPLETE, path, f"the backup manifest is damaged ({exc})")]
    if manifest is None:
        return [
            Problem(
                INCOMPLETE,
                path,
                f"no {layout.BACKUP_MANIFEST}: not a complete backup made by `logstore backup` (a first "
                "run that was interrupted, or not a backup at all)",
            )
        ]
    if manifest.restoring_from is not None:
        return [
            Problem(
                INCOMPLETE,
                path,
                f"a restore from {manifest.restoring_from} started {manifest.started} did not complete: "
                f"this data dir is partial. Run `logstore restore {manifest.restoring_from}` again",
            )
        ]
    if not manifest.complete:
        why = "; ".join(manifest.corrupt) if manifest.corrupt else "interrupted or failed"
        return [
            Problem(
                INCOMPLETE,
                path,
                f"the backup started {manifest.started} did not complete ({why}): run `logstore backup` "
                "again (after `logstore fsck` of the source if logs were corrupt)",
            )
        ]
    problems = [
        Problem(MISMATCH, link, f"{os.path.relpath(link, root)} is a symbolic link: a backup holds none")
        for link in links_in(root)
    ]
    for name, expected in sorted(manifest.files.items()):
        data = ops.read_file(os.path.join(root, name))
        if data is None or digest(data) != expected:
            state = "missing" if data is None else "changed since the backup"
            problems.append(Problem(MISMATCH, os.path.join(root, name), f"{name} is {state}"))
    for key, record in sorted(manifest.logs.items()):
        site, _, cid = key.partition("/")
        problem = _check_log(ops, conversation_paths(root, site, cid).log, record)
        if problem is not None:
            log = conversation_paths(root, site, cid).log
            problems.append(Problem(MISMATCH, log, f"{key}: {problem}", site, cid))
    for site in layout.iter_sites(ops, root):

        def extra(cid: str, log: str, site: str = site) -> None:
            problems.append(Problem(MISMATCH, log, f"{site}/{cid}: not in the backup manifest", site, cid))

        # A log in the wrong fan-out directory is one a backup never writes: extra too.
        for cid, log in layout.iter_logs(ops, root, site, misplaced=extra):
            if f"{site}/{cid}" not in manifest.logs:
                extra(cid, log)
    return problems


def describe(problems: list[Problem], limit: int = 20) -> str:
    lines = [p.message for p in problems[:limit]]
    if len(problems) > limit:
        lines.append(f"... and {len(problems) - limit} more")
    return "\n  ".join(lines)


def scan_counting(ops: FileOps, fd: int) -> tuple[ScanResult, int]:
    """``scan_log`` of a whole log without keeping its frames, and how many good frames it holds."""
    frames = 0

    def count(_frame: object) -> None:
        nonlocal frames
        frames += 1

    return scan_log(ops, fd, keep_frames=False, on_frame=count), frames


def _check_log(ops: FileOps, log: str, record: LogRecord) -> str | None:
    want = f"{record.next_seq} item(s) in {record.frames} frame(s), {record.size} bytes"
    try:
        fd = ops.open(log, os.O_RDONLY | os.O_NOFOLLOW)
    except FileNotFoundError:
        return f"missing (the manifest lists {want})"
    except OSError as exc:  # ELOOP: a symlink (links_in names it too)
        return f"cannot be read ({exc.strerror or exc})"
    try:
        size = ops.size(fd)
        result, frames = scan_counting(ops, fd)
        crc = log_digest(ops, fd, size) if record.crc32c is not None else None
    finally:
        ops.close(fd)
    if result.state is not ScanState.CLEAN:
        return f"{result.reason} at byte {result.stop_offset} (the manifest lists {want})"
    if (size, frames, result.next_seq) != (record.size, record.frames, record.next_seq):
        holds = f"{result.next_seq} item(s) in {frames} frame(s), {size} bytes"
        return f"holds {holds}; the manifest lists {want}"
    if crc != record.crc32c:
        return (
            f"its content is not the log the backup copied (CRC32C {crc:08x}, the manifest lists "
            f"{record.crc32c:08x}): another conversation's log, or changed since the backup"
        )
    return None
