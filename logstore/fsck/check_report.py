"""Findings and reports of ``logstore.fsck.check`` (fsck): the vocabulary of the checker modules and the CLI.

A finding is one problem at one place: site, conversation, file (relative to the data dir), byte offset,
kind, the seqs affected, and whether it was fixed. Severity decides the exit code, as e2fsck does it
(the code is the OR of the conditions present):

    0  clean (warnings do not count)
    1  errors were found and corrected
    4  errors were left uncorrected
    8  operational error: bad path, lock timeout, permission, I/O error
   16  an erasure (conversation delete, site remove --purge) was interrupted: no data is lost; run it
       again or ``--repair`` (which finishes it: exit 1)

Kinds are listed in ``KINDS`` with their severity; docs/FSCK.md explains each one and what repair does.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from typing import Any

from ..file.fileio import FileOps

__all__ = [
    "stray_kind",
    "ERROR",
    "WARNING",
    "OPERATIONAL",
    "UNFINISHED",
    "EXIT_UNFINISHED",
    "KINDS",
    "EXIT_CLEAN",
    "EXIT_CORRECTED",
    "EXIT_UNCORRECTED",
    "EXIT_OPERATIONAL",
    "Finding",
    "CheckReport",
    "CheckContext",
    "ProgressCallback",
]

ERROR = "error"
WARNING = "warning"
OPERATIONAL = "operational"
UNFINISHED = "unfinished"  # an operator's action was interrupted (exit 16); repair finishes it

KINDS: dict[str, str] = {
    # log file
    "torn-tail": ERROR,  # unacknowledged partial write after the last good frame (repair truncates)
    "crc-mismatch": ERROR,  # mid-file corruption: only --truncate-corrupt removes it
    "bad-magic": ERROR,
    "unsupported-version": ERROR,  # a frame of a format version this build cannot read
    "bad-length": ERROR,
    "bad-count": ERROR,
    "bad-item-length": ERROR,
    "truncated-frame": ERROR,  # a frame runs past the end of the file, and it was acknowledged
    "seq-gap": ERROR,  # two valid frames whose seqs do not follow
    "missing-frames": ERROR,  # the index proves acknowledged frames past the end of the log
    "timestamp-regression": ERROR,  # a frame's recorded_at is older than its predecessor's
    # index file
    "index-missing": ERROR,
    "index-stale": ERROR,  # lags the log, or has a torn tail (normal after power loss; repair rebuilds)
    "index-wrong": ERROR,  # disagrees with the log (repair rebuilds)
    # site manifest
    "manifest-stale": ERROR,
    "manifest-damaged": ERROR,
    "missing-log": ERROR,  # the manifest lists items for a conversation whose log is gone
    "erasure-interrupted": UNFINISHED,  # <id>.erasing: a delete/purge was killed midway (check_erasure)
    "orphan-index": ERROR,  # an index without its log: the engine refuses appends (repair moves it aside)
    # a backup (backup_manifest.json present): `logstore backup` again makes it whole; repair cannot
    "backup-incomplete": ERROR,  # interrupted, failed or skipped corrupt source logs: not restorable
    "backup-mismatch": ERROR,  # its files disagree with its complete manifest (missing, changed, extra)
    # top-level files (check_top)
    "credentials-damaged": ERROR,  # servers refuse every client; not repaired
    "secret-damaged": ERROR,  # missing or not 32 bytes; repair writes a new one
    "store-id-damaged": ERROR,  # not repaired (backups name it)
    # files
    "misplaced-file": ERROR,  # a conversation file in the wrong fan-out directory: invisible to the engine
    "orphan-file": WARNING,  # an index in the wrong fan-out directory, a superseded manifest generation
    "unknown-file": WARNING,  # a file logstore never writes there
    "stale-temp-file": WARNING,  # a leftover temp file of an interrupted atomic replace
    "loose-permissions": WARNING,  # readable or writable by group/others (logstore creates 0600/0700)
    # operational
    "lock-timeout": OPERATIONAL,
    "io-error": OPERATIONAL,
}

EXIT_CLEAN = 0
EXIT_CORRECTED = 1
EXIT_UNCORRECTED = 4
EXIT_OPERATIONAL = 8
EXIT_UNFINISHED = 16

ProgressCallback = Callable[[int, int], None]  # (bytes done, bytes total)


@dataclass(frozen=True, slots=True)
class Finding:
    kind: str
    file: str  # relative to the data dir
    message: str
    site: str | None = None
    conversation: str | None = None
    offset: int | None = None
    seqs: tuple[int, int | None] | None = None  # inclusive; last None: "and everything after"
    fixed: bool = False
    saved_to: str | None = None  # the .broken file holding bytes a repair removed

    @property
    def severity(self) -> str:
        return KINDS.get(self.kind, ERROR)  # an unlisted kind (a new scanner reason) is an error

    def to_dict(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "severity": self.severity,
            "site": self.site,
            "conversation": self.conversation,
            "file": self.file,
            "offset": self.offset,
            "seqs": list(self.seqs) if self.seqs is not None else None,
            "fixed": self.fixed,
            "saved_to": self.saved_to,
            "message": self.message,
        }


@dataclass(slots=True)
class CheckReport:
    data_dir: str
    findings: list[Finding] = field(default_factory=list)
    sites: int = 0
    conversations: int = 0
    frames: int = 0
    items: int = 0
    bytes: int = 0  # log bytes verified
    index_bytes: int = 0
    preallocated_bytes: int = 0  # unused zero tails of v2 logs (informational: a clean close trims them)
    broken_files: int = 0  # .broken-* files kept from earlier repairs (never counted as findings)
    elapsed: float = 0.0

    @property
    def exit_code(self) -> int:
        code = EXIT_CLEAN
        for f in self.findings:
            if f.severity == OPERATIONAL:
                code |= EXIT_OPERATIONAL
            elif f.severity == UNFINISHED:
                code |= EXIT_CORRECTED if f.fixed else EXIT_UNFINISHED
            elif f.severity == ERROR:
                code |= EXIT_CORRECTED if f.fixed else EXIT_UNCORRECTED
        return code

    @property
    def clean(self) -> bool:
        return self.exit_code == EXIT_CLEAN

    def count(self, severity: str, *, fixed: bool | None = None) -> int:
        return sum(1 for f in self.findings if f.severity == severity and (fixed is None or f.fixed == fixed))

    def summary(self) -> dict[str, Any]:
        return {
            "sites": self.sites,
            "conversations": self.conversations,
            "frames": self.frames,
            "items": self.items,
            "bytes": self.bytes,
            "index_bytes": self.index_bytes,
            "preallocated_bytes": self.preallocated_bytes,
            "broken_files": self.broken_files,
            "elapsed": round(self.elapsed, 6),
            "mb_per_s": round(self.bytes / 1e6 / self.elapsed, 1) if self.elapsed > 0 else None,
            "errors": self.count(ERROR),
            "fixed": self.count(ERROR, fixed=True),
            "warnings": self.count(WARNING),
            "operational": self.count(OPERATIONAL),
            "unfinished": self.count(UNFINISHED),
            "exit_code": self.exit_code,
        }

    def to_dict(self) -> dict[str, Any]:
        return {
            "data_dir": self.data_dir,
            "findings": [f.to_dict() for f in self.findings],
            "summary": self.summary(),
        }


@dataclass(slots=True)
class CheckContext:
    """What every checker module needs: options, the file seam, the report being filled, progress."""

    ops: FileOps
    data_dir: str
    report: CheckReport
    repair: bool = False
    truncate_corrupt: bool = False
    lock_timeout: float = 5.0
    progress: ProgressCallback | None = None
    erasing: dict[str, set[str]] = field(default_factory=dict)  # site -> ids with an erasure marker
    total_bytes: int = 0
    done_bytes: int = 0
    _last_progress: float = 0.0

    def rel(self, path: str) -> str:
        return os.path.relpath(path, self.data_dir)

    def add(self, finding: Finding) -> Finding:
        self.report.findings.append(finding)
        return finding

    def amend(self, finding: Finding, *, fixed: bool, note: str) -> Finding:
        """Replace a reported finding by one with ``fixed`` set and ``note`` added to its message (a
        repair that ran after it was found)."""
        amended = replace(finding, fixed=fixed, message=finding.message + note)
        findings = self.report.findings
        findings[next(i for i, f in enumerate(findings) if f is finding)] = amended
        return amended

    def found(self, kind: str, path: str, message: str, **fields: Any) -> Finding:
        """Record a finding about ``path`` (absolute; reported relative to the data dir)."""
        return self.add(Finding(kind, self.rel(path), message, **fields))

    def add_fixed(self, kind: str, path: str, message: str, **fields: Any) -> Finding:
        """Record a finding a repair has already fixed."""
        return self.add(Finding(kind, self.rel(path), message, fixed=True, **fields))

    def advance(self, nbytes: int, *, force: bool = False) -> None:
        """Count verified bytes; call ``progress`` at most ~20 times a second (it may draw a bar)."""
        self.done_bytes += nbytes
        if self.progress is None:
            return
        now = time.monotonic()
        if force or now - self._last_progress >= 0.05:
            self._last_progress = now
            self.progress(min(self.done_bytes, self.total_bytes), self.total_bytes)


def stray_kind(name: str) -> str | None:
    """Kind of finding for a file logstore did not expect: None for a temp file of a live process (an
    atomic replace in progress), ``stale-temp-file`` for one whose process is gone, else ``unknown-file``."""
    _, tmp, pid = name.rpartition(".tmp-")
    if not (tmp and pid.isdigit()):
        return "unknown-file"
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return "stale-temp-file"
    except (PermissionError, OverflowError):
        pass
    return None
