"""The index's side of the crash sweep: what ``reconcile.Reconciliation`` calls back into
(``reconcile.SweptIndex``) and what the store asks of it while it runs. A base class of ``SiteManifest``
(``site``), apart for the module size only: it owns no state; the attributes and the four methods
below are ``SiteManifest``'s."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable, Iterator

from ..fileio import FileOps
from ..log.recovery import LogState
from .codec import MARK_CLOSE, Entry, Session, encode_mark, erased_entry
from .reconcile import Reconciliation
from .table import ManifestTable

__all__ = ["SweepSide"]

log = logging.getLogger("logstore")


class SweepSide:
    ops: FileOps
    site: str
    _lock: threading.RLock
    _table: ManifestTable
    _sessions: set[Session]
    _damaged: bool
    _closed: bool
    _reconciliation: Reconciliation | None

    def begin_writes(self) -> None:
        raise NotImplementedError

    def _append_bytes(self, data: bytes, *, sync: bool = False) -> None:
        raise NotImplementedError

    def _append_logged(self, cid: str, entry: Entry) -> None:
        raise NotImplementedError

    def _fold_soon(self) -> None:
        raise NotImplementedError

    @property
    def reconciling(self) -> bool:
        return self._reconciliation is not None and self._reconciliation.running

    def wait_reconciled(self, timeout: float | None = None) -> bool:
        """Wait for the background reconciliation (if any); False on timeout."""
        return self._reconciliation is None or self._reconciliation.wait(timeout)

    def touch(self, cid: str, summary: Callable[[], LogState | None]) -> None:
        """A conversation's first use: while the sweep runs, reconcile it now from its open handle."""
        if self._reconciliation is not None and self._reconciliation.running:
            self._reconciliation.touch(cid, summary)

    def entry(self, cid: str) -> Entry | None:
        with self._lock:
            return self._table.get(cid)

    def reconciled(self, cid: str, probed: Entry, info: LogState | None, log_path: str) -> None:
        """Take in what recovery says of ``cid``'s log (None: no items), ``probed`` being the entry it was
        compared with. Lowering an entry (log gone or empty) only if no commit changed it meanwhile."""
        with self._lock:
            if info is not None:
                assert info.created_at is not None and info.last_at is not None  # (``summary``: items)
                record = Entry(info.created_at, info.last_at, info.end, info.next_seq)
                if self._table.apply(cid, record):
                    self._append_logged(cid, record)
            elif self._table.get(cid) != probed:
                return
            elif not self.ops.exists(log_path):
                self._append_logged(cid, erased_entry())  # the log is gone (an interrupted erasure)
                self._table.apply(cid, erased_entry())
            else:  # an empty log (cut back by fsck): not listed; fsck rebuilds the manifest
                self._table.force(cid, Entry(-1, -1, 0, 0))

    def sweep_ids(self) -> Iterator[str]:
        """Every conversation known now: the base by index (no list of a million ids), then the rest."""
        with self._lock:
            base, extra = self._table.base, self._table.added()
        yield from (base.id_at(i) for i in range(base.count))
        yield from extra

    def close_sessions(self, dead: set[Session]) -> None:
        """The sweep is done: make its records durable, then close the crashed sessions (in that order:
        a close mark must never outlive a record it vouches for)."""
        with self._lock:
            if self._closed:
                return
            self.begin_writes()  # evidence for the next load, even if nothing needed a record
            self._append_bytes(b"", sync=True)
            marks = b"".join(encode_mark(MARK_CLOSE, s) for s in dead)
            if marks:
                self._append_bytes(marks, sync=True)
            self._sessions -= dead
            if self._damaged:  # reported at load, reconciled from the logs: now fold the damage away
                self._damaged = False
                self._fold_soon()
        log.info("manifest for site %s reconciled with its logs", self.site)
