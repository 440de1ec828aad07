"""Creation records synced outside the site manifest's lock, shared by concurrent creators
(``logstore/file/manifest/journal_sync.py``): a creator's fdatasync holds up no commit or listing of the
site; concurrent creators share a sync; a failed shared sync fails every creator waiting on it, and none
creates its log; a roll, a compaction or ``close`` racing a held sync never syncs or closes a wrong
descriptor and loses nothing acknowledged; a power loss at any point of concurrent creations leaves every
log on disk in the manifest (manifest ⊇ logs).

Every wait is on an event (the journal sync held inside ``FileOps`` until the test releases it); the
timeouts below are guards against a hang, never the point of a test."""

from __future__ import annotations

import errno
import itertools
import os
import random
import shutil
import threading
from collections.abc import Callable
from typing import Any

import pytest

from logstore import Store
from logstore.core.errors import LogstoreError
from logstore.file import layout
from logstore.file.fileio import OS_FILE_OPS, FileOps
from logstore.file.layout import conversation_paths
from logstore.file.manifest import site
from logstore.file.manifest.codec import MARK_CLOSE, decode_journal
from logstore.file.manifest.journal_sync import SyncGroup, Syncs
from tests.faultfs import NO_SYNC_OPS, FaultFS, materialize, scratch_dir
from tests.helpers import LONG

SITE = "site-a"
ITEMS = [{"role": "user", "content": "hello"}]
GUARD = 30.0  # seconds: a hang guard only
CREATORS = 8


class HeldFS(FaultFS):
    """``FaultFS`` that knows the manifest journal's descriptors: counts their records and syncs, notes a
    sync of a journal descriptor that is not open (closed under it), and lets a test hold a journal sync
    (outside the model's mutex: the other threads go on) and make it fail (``hold`` returns True: EIO
    with the model's fsyncgate fate)."""

    def __init__(self, root: str, **kwargs: Any) -> None:
        # Open journal descriptors -> which open it was (fd numbers are reused: a number alone would take
        # a sync of a closed descriptor whose number a newer journal got for a good one).
        self.journal: dict[int, tuple[str, int]] = {}
        self._opens = itertools.count()
        self.changed = threading.Condition()
        self.journal_writes = self.journal_syncs = 0
        self.bad_syncs: list[int] = []
        self.hold: Callable[[], bool] | None = None  # called once per journal sync while set
        self._failing = threading.local()
        super().__init__(root, fault=self._plan, **kwargs)

    def _plan(self, fs: FaultFS, call: Any) -> int | None:
        return errno.EIO if call.name == "fdatasync" and getattr(self._failing, "on", False) else None

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        if "/manifest/journal." in path:
            with self.changed:
                self.journal[fd] = (path, next(self._opens))
        return fd

    def close(self, fd: int) -> None:
        with self.changed:
            self.journal.pop(fd, None)
        super().close(fd)

    def append(self, fd: int, data: bytes) -> None:
        super().append(fd, data)
        with self.changed:
            if fd in self.journal:
                self.journal_writes += 1
                self.changed.notify_all()

    def fdatasync(self, fd: int) -> None:
        fail = False
        opened = self.journal.get(fd)
        if opened is not None:
            hold = self.hold
            if hold is not None:
                fail = hold()
            with self.changed:
                self.journal_syncs += 1
                if self.journal.get(fd) != opened:  # closed (maybe reused) while the sync was on its way
                    self.bad_syncs.append(fd)
        self._failing.on = fail
        try:
            super().fdatasync(fd)
        finally:
            self._failing.on = False

    def wait_writes(self, count: int) -> bool:
        with self.changed:
            return self.changed.wait_for(lambda: self.journal_writes >= count, GUARD)


class Worker(threading.Thread):
    def __init__(self, fn: Callable[[], object]) -> None:
        super().__init__(daemon=True)
        self.fn, self.error, self.done = fn, None, threading.Event()
        self.error: BaseException | None
        self.start()

    def run(self) -> None:
        try:
            self.fn()
        except BaseException as exc:  # noqa: BLE001 - the test reads it
            self.error = exc
        finally:
            self.done.set()

    def result(self) -> BaseException | None:
        assert self.done.wait(GUARD), "worker hung"
        self.join()
        return self.error


def held_once(fs: HeldFS, store: Store, *, fail: bool = False, until: Callable[[], bool] | None = None):
    """Hold the next journal sync until ``release`` is set (or ``until()`` holds); ``entered`` once held.

    A new site's first use starts a background sweep ("no manifest yet") that ends by syncing a session
    record under the manifest's lock: it is waited for first, so that the sync held is a creator's, not
    the sweep's (under load the sweep's came next and held every creator off the lock)."""
    assert store._manifest(SITE).wait_reconciled(GUARD)
    entered, release, outcome = threading.Event(), threading.Event(), {"waited": True}

    def hold() -> bool:
        fs.hold = None
        entered.set()
        outcome["waited"] = until() if until is not None else release.wait(GUARD)
        return fail

    fs.hold = hold
    return entered, release, outcome


def log_exists(data: str, cid: str) -> bool:
    return os.path.exists(conversation_paths(data, SITE, cid).log)


def listed(store: Store) -> set[str]:
    return {c.conversation_id for c in store.list_conversations(SITE, limit=1000).conversations}


def recovered(fs: FaultFS, mode: str, seed: int = 0) -> tuple[str, str]:
    """The disk after a power loss now, materialized: (scratch dir to remove, its data dir)."""
    scratch = scratch_dir("creators-img-")
    materialize(fs.crash_image(random.Random(seed), mode), scratch)
    return scratch, os.path.join(scratch, "data")


# --------------------------------------------------------------------------- (a) no wait on a creator
def test_a_creator_in_its_journal_sync_holds_up_no_append_or_listing_of_the_site(tmp_path):
    fs = HeldFS(str(tmp_path))
    data = os.path.join(str(tmp_path), "data")
    with Store(data, file_ops=fs) as store:
        store.append(SITE, "steady-conv", ITEMS)
        entered, release, _ = held_once(fs, store)
        creator = Worker(lambda: store.append(SITE, "new-conversation", ITEMS))
        assert entered.wait(GUARD)

        def steady() -> None:
            for _ in range(3):
                store.append(SITE, "steady-conv", ITEMS)
            listed(store)

        appender = Worker(steady)
        finished = appender.done.wait(GUARD)  # a hang guard: with the sync under the lock, never set
        release.set()
        assert finished, "an append of another conversation waited for a creator's journal sync"
        assert appender.result() is None and creator.result() is None
        assert log_exists(data, "new-conversation")
        assert {"steady-conv", "new-conversation"} <= listed(store)
        assert not fs.bad_syncs


# --------------------------------------------------------------------------- (b) one sync for many
def _creators(store: Store, names: list[str]) -> list[Worker]:
    barrier = threading.Barrier(len(names))

    def create(name: str) -> None:
        barrier.wait(GUARD)
        store.append(SITE, name, ITEMS)

    return [Worker(lambda n=name: create(n)) for name in names]


def test_b_concurrent_creators_share_the_journal_sync(tmp_path):
    fs = HeldFS(str(tmp_path))
    data = os.path.join(str(tmp_path), "data")
    with Store(data, file_ops=fs) as store:
        store.append(SITE, "first-conv", ITEMS)  # the session's open mark: synced already
        assert store._manifest(SITE).wait_reconciled(GUARD)  # its last write and sync counted before
        written, synced = fs.journal_writes, fs.journal_syncs
        # The first creation's sync is held until every creator has written its record.
        _, _, outcome = held_once(fs, store, until=lambda: fs.wait_writes(written + CREATORS))
        names = [f"newconv-{i}" for i in range(CREATORS)]
        assert all(w.result() is None for w in _creators(store, names))
        assert outcome["waited"], "the creators' records were not all written while one sync was held"
        syncs = fs.journal_syncs - synced
        assert syncs <= 2 < CREATORS, syncs  # the held one, then one for everything written meanwhile
        assert set(names) <= listed(store)
        assert all(log_exists(data, n) for n in names)


# --------------------------------------------------------------------------- (c) a failed shared sync
def test_c_a_failed_shared_sync_fails_every_creator_waiting_on_it_and_none_creates_its_log(tmp_path):
    for seed, mode in enumerate(("drop", "random", "keep")):
        _failed_shared_sync(os.path.join(str(tmp_path), mode), seed, mode)


def _failed_shared_sync(root: str, seed: int, mode: str) -> None:
    fs = HeldFS(root, rng=random.Random(seed))
    data = os.path.join(root, "data")
    manifest_dir = os.path.join(data, "sites", SITE, "manifest")
    with Store(data, file_ops=fs) as store:
        store.append(SITE, "first-conv", ITEMS)
        assert store._manifest(SITE).wait_reconciled(GUARD)  # (as in test_b)
        written = fs.journal_writes
        _, _, outcome = held_once(fs, store, fail=True, until=lambda: fs.wait_writes(written + CREATORS))
        names = [f"doomed-{i}" for i in range(CREATORS)]
        errors = [w.result() for w in _creators(store, names)]
        assert outcome["waited"]
        assert all(isinstance(e, LogstoreError) for e in errors), errors
        assert not any(log_exists(data, n) for n in names)
        assert store._manifest(SITE)._journal.failed  # no clean close mark
        journals = sorted(os.listdir(manifest_dir))
        store.append(SITE, "after-conv", ITEMS)  # a new journal (rolled): creations work again
        assert sorted(os.listdir(manifest_dir)) != journals
        store.append(SITE, "first-conv", ITEMS)
        assert listed(store) == {"first-conv", "after-conv"}
        scratch, image = recovered(fs, mode, seed)
    try:
        with Store(image, file_ops=NO_SYNC_OPS) as store:
            assert store._manifest(SITE).wait_reconciled(GUARD)
            assert listed(store) == {"first-conv", "after-conv"}
            assert len(list(store.replay(SITE, "first-conv"))) == 2
            assert not any(log_exists(image, n) for n in names)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _held_creation(store: Store, fs: HeldFS, create: Callable[[], object], *, fail: bool = False):
    """After a first conversation, ``create`` on a worker until it is held in its journal sync: the
    manifest, the worker, and the event that releases the sync."""
    store.append(SITE, "first-conv", ITEMS)
    entered, release, _ = held_once(fs, store, fail=fail)
    creator = Worker(create)
    assert entered.wait(GUARD)
    return store._manifest(SITE), creator, release


# --------------------------------------------------------------------------- (d) rolls and close
def test_d_a_compaction_and_catch_up_during_a_held_sync_close_the_descriptor_after_it(tmp_path):
    fs = HeldFS(str(tmp_path))
    data = os.path.join(str(tmp_path), "data")
    with Store(data, file_ops=fs) as store:
        manifest, creator, release = _held_creation(
            store, fs, lambda: store.append(SITE, "new-conversation", ITEMS)
        )
        held = set(fs.journal.values())
        assert manifest.compact()  # a new journal; the held one folded into a snapshot and deleted
        listed(store)  # the catch-ups let go of the old descriptor: its close waits for the sync
        store.append(SITE, "first-conv", ITEMS)  # a commit, to the new journal
        assert held <= set(fs.journal.values()), "the descriptor being synced was closed under the sync"
        release.set()
        assert creator.result() is None
        assert not fs.bad_syncs
        assert not held & set(fs.journal.values()), "the last sync's user did not close the old descriptor"
        scratch, image = recovered(fs, "drop")
    try:
        with Store(image, file_ops=NO_SYNC_OPS) as store:
            assert store._manifest(SITE).wait_reconciled(GUARD)
            assert listed(store) == {"first-conv", "new-conversation"}
            assert len(list(store.replay(SITE, "new-conversation"))) == 1
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _close_marks(data: str) -> int:
    directory = os.path.join(data, "sites", SITE, "manifest")
    marks = 0
    for name in os.listdir(directory):
        if name.startswith("journal."):
            with open(os.path.join(directory, name), "rb") as f:
                marks += sum(m.kind == MARK_CLOSE for m in decode_journal(f.read()).marks)
    return marks


def test_d_close_waits_for_a_held_sync_and_a_failed_one_leaves_no_clean_close_mark(tmp_path):
    fs = HeldFS(str(tmp_path))
    data = os.path.join(str(tmp_path), "data")
    store = Store(data, file_ops=fs)
    try:
        manifest = store._manifest(SITE)
        manifest, creator, release = _held_creation(
            store, fs, lambda: manifest.record_created("doomed-conv"), fail=True
        )
        assert manifest.compact()
        listed(store)  # the held descriptor is no longer the journal's: ``close`` marks the new one
        closer = Worker(manifest.close)
        # Only a chance for a close that does not wait to show it (the assertions below hold at any load).
        closer.done.wait(0.5)
        release.set()
        assert isinstance(creator.result(), LogstoreError)
        assert closer.result() is None
        assert not fs.bad_syncs
        assert _close_marks(data) == 0, "a clean close mark vouched for a record whose sync failed"
        assert not set(fs.journal), "a journal descriptor outlived the manifest's close"
    finally:
        store.close()


def test_d_close_bounds_its_wait_for_a_hold_never_left_and_writes_no_close_mark(tmp_path, monkeypatch):
    """A hold whose ``leave`` never comes (an interrupt between the hold and its holder's ``try``) makes
    ``close`` give up its close mark after ``SETTLE_TIMEOUT``, not hang."""
    monkeypatch.setattr(site, "SETTLE_TIMEOUT", 0.05)
    fs = HeldFS(str(tmp_path))
    data = os.path.join(str(tmp_path), "data")
    with Store(data, file_ops=fs) as store:
        store.append(SITE, "first-conv", ITEMS)
        manifest = store._manifest(SITE)
        group = manifest._journal._group
        assert group is not None
        group.hold()
        manifest.close()
        assert _close_marks(data) == 0
        assert set(fs.journal), "closed under a hold"
        group.leave(failed=True)  # the last user closes it
        assert not set(fs.journal)


def test_d_a_clean_close_after_held_creations_marks_it_and_keeps_them(tmp_path):
    fs = HeldFS(str(tmp_path))
    data = os.path.join(str(tmp_path), "data")
    with Store(data, file_ops=fs) as store:
        manifest = store._manifest(SITE)
        manifest, creator, release = _held_creation(store, fs, lambda: manifest.record_created("direct-conv"))
        closer = Worker(manifest.close)
        closer.done.wait(0.5)
        release.set()
        assert creator.result() is None and closer.result() is None
        assert not fs.bad_syncs
        assert _close_marks(data) == 1
        scratch, image = recovered(fs, "drop")
    try:
        with Store(image, file_ops=NO_SYNC_OPS) as store:
            assert store._manifest(SITE).entry("direct-conv") is not None
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


# --------------------------------------------------------------------------- (e) power loss, concurrent
def test_e_power_loss_at_every_point_of_concurrent_creations_keeps_every_log_in_the_manifest():
    """Creators started together over ``FaultFS``; at every crash point the disk is imaged ("all
    unsynced lost" and a random mix) with the conversations acknowledged by then. Each image must list
    every conversation whose log holds items (manifest ⊇ logs) and replay every acknowledged one.
    LOGSTORE_LONG=1: more seeds and creators."""
    seeds, creators = (range(6), 8) if LONG else (range(2), 4)
    checked = 0
    for seed in seeds:
        for image, done in _concurrent_creations(seed, creators):
            checked += 1
            _check_image(image, done)
    assert checked > 20 * len(seeds)


def _concurrent_creations(seed: int, creators: int) -> list[tuple[Any, frozenset[str]]]:
    """Crash images taken at every point of ``creators`` concurrent creations, each with the
    conversations acknowledged by then."""
    base = scratch_dir("creators-torture-")
    rng = random.Random(seed)
    acked: set[str] = set()
    images: list[tuple[Any, frozenset[str]]] = []

    def hook(fs: FaultFS, point: int) -> None:
        done = frozenset(acked)
        images.append((fs.crash_image(rng, "drop"), done))
        images.append((fs.crash_image(rng, "random"), done))

    barrier = threading.Barrier(creators)
    try:
        fs = FaultFS(base, rng=random.Random(seed))
        with Store(os.path.join(base, "data"), file_ops=fs) as store:

            def create(name: str) -> None:
                barrier.wait(GUARD)
                store.append(SITE, name, ITEMS)
                acked.add(name)

            store.append(SITE, "first-conv", ITEMS)
            acked.add("first-conv")
            fs.crash_hook = hook
            workers = [Worker(lambda n=f"creator-{seed}-{i}": create(n)) for i in range(creators)]
            assert all(w.result() is None for w in workers)
            fs.crash_hook = None
        return images
    finally:
        shutil.rmtree(base, ignore_errors=True)


def _check_image(image: Any, acked: frozenset[str]) -> None:
    scratch = scratch_dir("creators-img-")
    try:
        materialize(image, scratch)
        data = os.path.join(scratch, "data")
        with Store(data, file_ops=NO_SYNC_OPS) as store:
            assert store._manifest(SITE).wait_reconciled(GUARD)
            shown = listed(store)  # before any replay: a conversation's first use reconciles it
            with_items = {name for name in acked | _logs_named(data) if list(store.replay(SITE, name))}
            assert acked <= with_items, acked - with_items
            assert with_items <= shown, with_items - shown  # manifest ⊇ logs
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _logs_named(data: str) -> set[str]:
    """Conversation ids whose log file exists under the site (whatever the manifest says)."""
    return {cid for cid, _ in layout.iter_logs(OS_FILE_OPS, data, SITE)}


# --------------------------------------------------------------------------- the group alone
class ScriptedOps(FileOps):
    """No files: each fdatasync raises the next scripted exception (None: succeeds); closes noted."""

    def __init__(self, *outcomes: BaseException | None) -> None:
        self.outcomes, self.syncs, self.closed = list(outcomes), 0, []

    def fdatasync(self, fd: int) -> None:
        self.syncs += 1
        outcome = self.outcomes.pop(0) if self.outcomes else None
        if outcome is not None:
            raise outcome

    def close(self, fd: int) -> None:
        self.closed.append(fd)


def test_an_interrupted_sync_is_neither_durable_nor_a_fault_and_the_next_caller_syncs_again():
    ops = ScriptedOps(KeyboardInterrupt())
    group = SyncGroup(ops, 99, 1, Syncs())
    seq = group.wrote()
    with pytest.raises(KeyboardInterrupt):
        group.sync(seq)
    assert group.fault is None
    group.sync(seq)
    assert ops.syncs == 2


def test_a_failed_sync_fails_what_it_did_not_cover_for_good_and_keeps_what_an_earlier_one_did():
    ops = ScriptedOps(None, OSError(errno.EIO, "injected"))
    group = SyncGroup(ops, 99, 1, Syncs())
    first = group.wrote()
    group.sync(first)
    second = group.wrote()
    with pytest.raises(OSError):
        group.sync(second)
    group.sync(first)  # durable before the failure: still durable
    with pytest.raises(OSError):  # never synced again through this descriptor and trusted
        group.sync(group.wrote())
    assert ops.syncs == 2


def test_a_retired_descriptor_is_closed_once_by_its_last_user():
    ops, syncs = ScriptedOps(), Syncs()
    group = SyncGroup(ops, 99, 1, syncs)
    seqs = [group.hold(), group.hold()]
    group.retire()
    assert ops.closed == []
    group.sync(seqs[0])
    group.leave(failed=False)
    assert ops.closed == []
    group.sync(seqs[1])  # covered by the first sync: none more
    group.leave(failed=False)
    assert ops.closed == [99] and ops.syncs == 1
    assert syncs.settle(GUARD)
    assert not syncs.failed
    idle = SyncGroup(ops, 98, 1, syncs)
    idle.retire()
    assert ops.closed == [99, 98]
