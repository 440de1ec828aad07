"""When a site manifest may lag its logs, and the background sweep that catches it up (docs/FORMAT.md,
"Site manifest", "Sessions and reconciliation").

A writer's *session* is opened by a mark fdatasynced into the journal before its first log write, and
closed by a mark (fdatasynced) when its store closes cleanly. On load, a session still open whose process
is gone crashed: commits it made durable may lack their journal record. Its boot id says which crash:
the same boot is a process crash (records it wrote are in the page cache; only commits in flight at the
kill, never acknowledged, can lag), another boot a power loss or reboot (unsynced records of
acknowledged commits may be gone). Either way the fix is the same, and never blocks a request: a
background sweep probes every conversation (``log_may_differ``) and asks recovery (by opening the
conversation) only where the log holds more than the manifest says; a conversation touched before the
sweep reaches it is reconciled on that first touch.
"""

from __future__ import annotations

import logging
import os
import secrets
import threading
from collections.abc import Callable, Iterator
from functools import partial
from typing import Protocol

from ...core.errors import Corrupted, Io, LogstoreError, Timeout, Unavailable
from .. import boot, layout
from ..fileio import FileOps
from ..log.freshness import Past, past_end
from ..log.recovery import LogState
from .codec import Entry, Session

__all__ = [
    "new_session",
    "end_session",
    "is_alive",
    "log_may_differ",
    "Reconciliation",
    "SweptIndex",
]

log = logging.getLogger("logstore")


class SweptIndex(Protocol):
    """What the sweep needs of the index it reconciles (``site.SiteManifest`` is the one): defined here, so
    that this module, below ``site``, imports nothing from it while the sweep still calls back into it."""

    @property
    def ops(self) -> FileOps: ...
    @property
    def data_dir(self) -> str: ...
    @property
    def site(self) -> str: ...

    def entry(self, cid: str) -> Entry | None: ...

    def reconciled(self, cid: str, probed: Entry, info: LogState | None, log_path: str) -> None:
        """Take in what recovery says of ``cid``'s log (``probed``: the entry it was compared with)."""

    def sweep_ids(self) -> Iterator[str]:
        """Every conversation the index knows now."""

    def open_conversation(self, cid: str) -> LogState | None:
        """Open ``cid`` (recovery runs if its log needs it): what its log holds, None if no items."""

    def close_sessions(self, dead: set[Session]) -> None:
        """The sweep is done: make its records durable, then close the crashed sessions."""


def _start_ticks(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/<pid>/stat field 22), or None."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            stat = fh.read()
    except OSError:
        return None
    try:
        return int(stat.rpartition(b")")[2].split()[19])
    except (IndexError, ValueError):
        return None


_OURS: set[Session] = set()  # sessions of this process whose store has not closed yet


def new_session() -> Session:
    """A session for a store of this process; ``end_session`` when that store closes."""
    pid = os.getpid()
    session = Session(boot.boot_id(), pid, _start_ticks(pid) or 0, secrets.randbits(64))
    _OURS.add(session)
    return session


def end_session(session: Session) -> None:
    _OURS.discard(session)


def is_alive(session: Session) -> bool:
    """Whether the session's store still runs: in this process, not closed yet; in another, the same
    boot and the same pid with the same start time. A process in another pid namespace on a shared data
    dir reads as gone: only a sweep more."""
    if session.boot_id != boot.boot_id():
        return False
    if session.pid == os.getpid():
        return session in _OURS
    return _start_ticks(session.pid) == session.start != 0


def log_may_differ(ops: FileOps, path: str, entry: Entry) -> bool:
    """Cheap check that a log holds exactly what ``entry`` records. One stat: a file of exactly
    ``log_size`` bytes cannot hold more (the common case, a v1 log or a trimmed v2 one: no data page is
    read); a shorter or missing one changed. A longer one (a v2 preallocated tail, or frames appended) is
    read at the recorded end with the log's own rule (``log.freshness.past_end``: zeros there, no frame).
    The file size is never taken for the data's end. A false positive only costs a recovery."""
    if entry.log_size < 0:  # found by a directory walk: nothing is known
        return True
    size = ops.stat_size(path)
    if size is None:
        return entry.next_seq > 0
    if size <= entry.log_size:
        return size < entry.log_size
    try:
        fd = ops.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return entry.next_seq > 0
    try:
        return past_end(ops, fd, entry.log_size) is Past.FRAME
    finally:
        ops.close(fd)


class Reconciliation:
    """One background sweep over a loaded manifest (``SiteManifest`` starts it when the load finds a
    crashed session, damage, or a manifest of an older release); ``touch`` reconciles a conversation
    ahead of it."""

    def __init__(self, manifest: SweptIndex, dead: set[Session]) -> None:
        self._manifest = manifest
        self._dead = dead
        self._paths = layout.log_path_function(manifest.data_dir, manifest.site)
        self._touched: set[str] = set()  # reconciled ahead of the sweep (skipped when it gets there)
        self._stopped = threading.Event()
        self._finished = threading.Event()
        self.failed: BaseException | None = None
        self._thread = threading.Thread(
            target=self._run, name=f"logstore-reconcile-{manifest.site}", daemon=True
        )
        self._thread.start()

    @classmethod
    def start_if_needed(
        cls,
        manifest: SweptIndex,
        sessions: set[Session],
        *,
        damaged: bool,
        marked: bool,
        absent: bool = False,
    ) -> Reconciliation | None:
        """A running sweep if the state loaded may lag the logs (module docstring), else None: every
        session closed or still running, no damaged bytes, and written by this format (``marked``)."""
        dead = {s for s in sessions if not is_alive(s)}
        if not (dead or damaged or not marked):
            return None
        why = (
            "power loss or reboot with sessions open"
            if any(s.boot_id != boot.boot_id() for s in dead)
            else "a store did not close cleanly"
            if dead
            else "damaged manifest bytes"
            if damaged
            else "no manifest yet (a new site, or its manifest was removed)"
            if absent
            else "written by an older release"
        )
        log.info("manifest for site %s: %s; reconciling with the logs in the background", manifest.site, why)
        return cls(manifest, dead)

    @property
    def running(self) -> bool:
        return not self._finished.is_set()

    def wait(self, timeout: float | None = None) -> bool:
        return self._finished.wait(timeout)

    def stop(self) -> None:
        self._stopped.set()
        if self._thread is not threading.current_thread():
            self._thread.join()

    def touch(self, cid: str, summary: Callable[[], LogState | None]) -> None:
        """Reconcile ``cid`` ahead of the sweep. Best effort: a failure leaves it to the sweep (the
        request that touched it meets its own errors)."""
        if cid not in self._touched:
            self._touched.add(cid)
            try:
                self._check(cid, summary)
            except (OSError, LogstoreError) as exc:
                self._touched.discard(cid)
                log.warning("reconciling %s on first use failed (the sweep retries): %s", cid, exc)

    def _check(self, cid: str, summary: Callable[[], LogState | None]) -> None:
        entry = self._manifest.entry(cid)
        path = self._paths(cid)
        if entry is not None and log_may_differ(self._manifest.ops, path, entry):
            self._manifest.reconciled(cid, entry, summary(), path)

    def _run(self) -> None:
        manifest = self._manifest
        try:
            skipped = 0
            for cid in manifest.sweep_ids():
                if self._stopped.is_set():
                    return
                if cid not in self._touched:
                    try:
                        self._check(cid, partial(manifest.open_conversation, cid))
                    except (OSError, Io, Timeout, Corrupted) as exc:  # this one stays as it was
                        skipped += 1
                        log.warning("reconciling %s failed: %s", cid, exc)
            if skipped:  # the crashed sessions stay open: the next load sweeps again
                log.warning("manifest of site %s: %d conversation(s) not reconciled", manifest.site, skipped)
            elif not self._stopped.is_set():
                manifest.close_sessions(self._dead)
        except Unavailable:  # the store closed under the sweep: the next load sweeps again
            return
        except Exception as exc:  # noqa: BLE001 - the next load sweeps again; the listing just lags
            self.failed = exc
            log.exception("manifest reconciliation of site %s stopped", manifest.site)
        finally:
            self._touched.clear()
            self._finished.set()
