"""Group commit of a manifest journal's synced records, and the journal descriptor's life while they sync
outside the manifest's lock (``site_journal.SiteJournal`` holds one ``SyncGroup`` per descriptor it opens).

Why: a conversation's creation record must be durable before its log is created (manifest ⊇ logs), but
``SiteManifest``'s lock is taken by every commit of the site. Syncing under it made every append of the site
wait for a creator's fdatasync, and N creators paid N serial syncs. So a creation record is written under
the lock and numbered there (``hold``), and synced after the lock is released (``sync``): one fdatasync
serves every record written before it began, as ``log.group_commit`` shares one for frames. A caller whose
record no sync has covered yet waits for the sync in flight, or, if none is, leads the next one, which
covers every record written so far (``_written`` when it starts; ``_synced``: covered through).

Records synced under the lock (session marks, erasures) go through the same group (``wrote`` then
``sync``): two syncs of one descriptor never run unordered, so an error is never reported to one syncer
while the other takes its success for durability.

The descriptor's life: a use count, not a ``dup`` per creator. The journal drops its descriptor under the
manifest's lock (a roll or compaction seen by a catch-up, a failed write, ``close``: ``retire``); a record
held for a sync outside the lock keeps it open (``hold``/``leave``), and the last user of a retired
descriptor closes it. Who closes is decided once, under the group's lock, so the number is never closed
twice, nor synced after it was closed and maybe reused by another file. (A ``dup`` per creator is as safe,
but costs two syscalls per creation and hides the descriptor from ``FileOps`` wrappers that know files
by the descriptors they opened.)

Failure (fsyncgate): a failed write or sync through the descriptor faults the group for good. Every record
that no successful sync covered fails (its creator creates no log); no later sync through this descriptor
is trusted, since the kernel reports a writeback error once per open file description, to one syncer. The
journal (``SiteJournal``) drops a faulted descriptor and rolls before its next write, and writes no clean
close mark (``Syncs.failed``).

Lock order: the manifest's lock, then a group's lock or ``Syncs``'s; both are leaves (the fdatasync and
the close run without them)."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from ..fileio import FileOps

__all__ = ["Held", "SyncGroup", "Syncs"]


class Syncs:
    """A journal's records held for a sync outside the manifest's lock, over all its descriptors: how many
    are in flight (``settle`` waits for none: a clean close mark only vouches for settled records), and
    whether any sync failed (then no clean close mark)."""

    def __init__(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        self._held = 0
        self.failed = False  # set once, under ``_cond``; read without it (a bool)

    def _add(self) -> None:
        with self._cond:
            self._held += 1

    def _done(self, *, failed: bool) -> None:
        with self._cond:
            self._held -= 1
            self.failed = self.failed or failed
            if not self._held:
                self._cond.notify_all()

    def settle(self, timeout: float) -> bool:
        """Wait until every held record has its outcome (their syncs never take the manifest's lock, so
        the caller may hold it); False if some had none within ``timeout`` seconds (a sync stuck on the
        disk, or a hold an interrupt cut off before its ``leave``: never a hang in ``close``)."""
        with self._cond:
            return self._cond.wait_for(lambda: not self._held, timeout)


class SyncGroup:
    """One journal descriptor (one open file description) and the syncs of the records written to it."""

    def __init__(self, ops: FileOps, fd: int, gen: int, syncs: Syncs) -> None:
        self._ops, self.fd, self.gen, self._syncs = ops, fd, gen, syncs
        self._cond = threading.Condition(threading.Lock())
        self._written = 0  # records written through ``fd`` that asked for a sync (the last one's number)
        self._synced = 0  # every record numbered up to this is durable
        self._syncing = False  # a leader's fdatasync is in flight
        self.fault: OSError | None = None  # the first write or sync failure
        self._users = 0  # records held for a sync outside the manifest's lock (``hold``)
        self._retired = False  # the journal let go of ``fd``: the last user closes it

    def wrote(self) -> int:
        """A record that needs a sync was written and proven in the current journal (caller holds the
        manifest's lock): its number, for ``sync``."""
        with self._cond:
            self._written += 1
            return self._written

    def hold(self) -> int:
        """``wrote``, for a sync after the manifest's lock is released: ``fd`` stays open until ``leave``."""
        with self._cond:
            assert not self._retired  # the journal retires it under the manifest's lock, held by the caller
            self._written += 1
            self._users += 1
        self._syncs._add()
        return self._written

    def leave(self, *, failed: bool) -> None:
        """The held record has its outcome (``failed``: it is not durable); the last user of a retired
        descriptor closes it."""
        with self._cond:
            self._users -= 1
            close = self._retired and not self._users
        if close:
            self._close()
        self._syncs._done(failed=failed)

    def retire(self) -> None:
        """The journal lets go of ``fd`` (under the manifest's lock): closed now, or by its last user."""
        with self._cond:
            self._retired = True
            close = not self._users
        if close:
            self._close()

    def _close(self) -> None:
        try:
            self._ops.close(self.fd)
        except OSError:
            pass

    def fail(self, exc: OSError) -> None:
        """A write or sync through ``fd`` failed: no record not yet covered is ever taken for durable."""
        with self._cond:
            if self.fault is None:
                self.fault = exc
            self._cond.notify_all()

    def sync(self, seq: int) -> None:
        """Return once record ``seq`` is durable: covered by a sync that began after it was written, led
        by another caller or by this one. OSError if the descriptor faulted before that (module doc)."""
        with self._cond:
            while True:
                if self._synced >= seq:  # a sync covered it before any failure (durable stays durable)
                    return
                if self.fault is not None:
                    fault = self.fault
                    raise OSError(fault.errno, f"an earlier sync of this journal failed: {fault.strerror}")
                if not self._syncing:
                    break
                self._cond.wait()
            self._syncing, target = True, self._written
        try:
            self._ops.fdatasync(self.fd)
        except BaseException as exc:  # an interrupt: not synced, not faulted; the next waiter leads
            with self._cond:
                self._syncing = False
                if isinstance(exc, OSError) and self.fault is None:
                    self.fault = exc
                self._cond.notify_all()
            raise
        with self._cond:
            self._syncing = False
            self._synced = max(self._synced, target)
            self._cond.notify_all()


@dataclass(frozen=True, slots=True)
class Held:
    """A record written under the manifest's lock, to be synced after it: its group and number. Its holder
    calls ``leave`` once, on every path (``SiteManifest.record_created``)."""

    group: SyncGroup
    seq: int

    def sync(self) -> None:
        self.group.sync(self.seq)

    def leave(self, *, failed: bool) -> None:
        self.group.leave(failed=failed)
