"""A new conversation's first append (issue 35): what it syncs and writes, counted through ``FileOps``, and
why each sync is there (the power loss cases below; tests/test_torture_powerloss.py is the judge of all).

Per new conversation in a fan-out directory this process already proved durable: 3 syncs - the manifest's
creation record (fdatasync, before the log exists: manifest ⊇ logs), then at once the frame (fdatasync)
and the log's directory entry (directory fsync on a helper thread; both before the first
acknowledgement) - and the commit point written twice:
a record at 0 before the log exists, so that a reader never waits for a creator that stalls, then the
commit's (it used to be written three times: that record, recovery's rewrite of it, the commit's).
"""

from __future__ import annotations

import errno
import multiprocessing
import os
import random
import shutil
import threading

import pytest

from logstore import Store
from logstore.core.errors import Io
from logstore.file import layout
from logstore.file.fileio import FILE_MODE, FileOps
from logstore.file.layout import conversation_paths
from logstore.file.log.commit_point import RECORD_SIZE, decode
from tests.faultfs import NO_SYNC_OPS, FaultFS, materialize, scratch_dir

SITE = "site-a"
ITEMS = [{"role": "user", "content": "hello"}]


class CountingOps(FileOps):
    """Real file operations, with every sync and every commit-point write noted (by path)."""

    def __init__(self) -> None:
        self._paths: dict[int, str] = {}
        self.syncs: list[tuple[str, str]] = []
        self.point_writes: list[str] = []

    def reset(self) -> None:
        self.syncs, self.point_writes = [], []

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        fd = super().open(path, flags, mode)
        self._paths[fd] = path
        return fd

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        path = self._paths.get(fd, "")
        if path.endswith(layout.LOCK_SUFFIX):
            self.point_writes.append(path)
        super().pwrite(fd, data, offset)

    def fdatasync(self, fd: int) -> None:
        self.syncs.append(("fdatasync", self._paths.get(fd, "?")))
        super().fdatasync(fd)

    def fsync(self, fd: int) -> None:
        self.syncs.append(("fsync", self._paths.get(fd, "?")))
        super().fsync(fd)

    def fsync_dir(self, path: str) -> None:
        self.syncs.append(("fsync_dir", path))
        super().fsync_dir(path)


def neighbour(cid: str, n: int = 1) -> list[str]:
    """``n`` other conversation ids in ``cid``'s fan-out directory."""
    want, found, i = layout.fanout(cid), [], 0
    while len(found) < n:
        other = f"neighbour-{i:06d}"
        i += 1
        if layout.fanout(other) == want:
            found.append(other)
    return found


def kinds(syncs: list[tuple[str, str]], paths) -> list[tuple[str, str]]:
    """The syncs by what they made durable: the log, the manifest journal, which directory."""
    named = []
    for kind, path in syncs:
        if path == paths.log:
            what = "log"
        elif os.path.basename(path).startswith("journal."):
            what = "journal"
        elif path == paths.directory:
            what = "fan-out dir"
        elif path == os.path.dirname(paths.directory):
            what = "fan-out parent"
        else:
            what = path
        named.append((kind, what))
    return named


def test_new_conversation_in_a_proven_directory_costs_three_syncs_and_two_records(tmp_path):
    ops = CountingOps()
    with Store(str(tmp_path / "data"), file_ops=ops) as store:
        first = "first-conversation"
        store.append(SITE, first, ITEMS)  # makes (and proves) the fan-out directory
        for cid in neighbour(first, 3):
            ops.reset()
            got = store.append(SITE, cid, ITEMS + ITEMS)
            paths = conversation_paths(store.data_dir, SITE, cid)
            synced = kinds(ops.syncs, paths)
            assert synced[0] == ("fdatasync", "journal")  # the creation record, before the log exists
            assert sorted(synced[1:]) == [  # at once (``log_entry_alongside``), before the acknowledgement
                ("fdatasync", "log"),  # the frame
                ("fsync_dir", "fan-out dir"),  # the log's entry
            ]
            # Twice: a record at 0 before the log exists (readers never wait for its creator), written with
            # the new lock file's header; then the commit's, stored through the header's mapping (no
            # syscall: ``PointFile.write``), read back below.
            assert ops.point_writes == [paths.lock]
            with open(paths.lock, "rb") as f:
                point = decode(f.read(RECORD_SIZE))
            assert point is not None and point.next_seq == got.last + 1 == 2
            assert point.end == os.path.getsize(paths.log) or point.end < os.path.getsize(paths.log)
            ops.reset()
            store.append(SITE, cid, ITEMS)
            assert kinds(ops.syncs, paths) == [("fdatasync", "log")]
            assert [i.seq for i in store.replay(SITE, cid, 0, 10)] == [0, 1, 2]


def test_a_directory_found_existing_is_proven_once_per_process(tmp_path):
    """A fan-out directory this process did not make may have been made by one that died before fsyncing
    its parent, and its parent likewise (the two are made at once): the first log created in it here
    fsyncs the parents of both and of the site's ``conversations`` first, at once; the next ones do not."""
    data = str(tmp_path / "data")
    first = "first-conversation"
    with Store(data) as store:
        store.append(SITE, first, ITEMS)
    a, b = neighbour(first, 2)
    ops = CountingOps()
    with Store(data, file_ops=ops) as store:
        store.append(SITE, first, ITEMS)  # an existing log: no directory work (only the session's)
        conversations = layout.conversations_dir(data, SITE)
        assert not [p for kind, p in ops.syncs if kind == "fsync_dir" and p.startswith(conversations)]
        ops.reset()
        store.append(SITE, a, ITEMS)
        paths = conversation_paths(data, SITE, a)
        synced = kinds(ops.syncs, paths)
        site_dir = layout.site_dir(data, SITE)
        assert set(synced[:4]) == {  # at once, before the log is created
            ("fdatasync", "journal"),  # the creation record
            ("fsync_dir", site_dir),  # proves ``conversations`` (found existing: level by level above)
            ("fsync_dir", conversations),  # proves the fan-out parent
            ("fsync_dir", "fan-out parent"),  # proves the fan-out directory
        }
        assert sorted(synced[4:]) == [("fdatasync", "log"), ("fsync_dir", "fan-out dir")]
        ops.reset()
        store.append(SITE, b, ITEMS)
        assert len(ops.syncs) == 3
        assert ("fsync_dir", "fan-out parent") not in kinds(ops.syncs, conversation_paths(data, SITE, b))


def _crash_and_read(fs: FaultFS, cid: str) -> list:
    crashed = scratch_dir("newconv-")
    try:
        materialize(fs.crash_image(random.Random(0), "drop"), crashed)
        with Store(os.path.join(crashed, "data"), file_ops=NO_SYNC_OPS) as store:
            return [item.payload for item in store.replay(SITE, cid, 0, 100)]
    finally:
        shutil.rmtree(crashed, ignore_errors=True)


@pytest.mark.parametrize("levels", [1, 2])
def test_regression_directory_left_by_a_dead_process_is_proven_before_a_log_goes_in(tmp_path, levels):
    """A process died between its ``mkdir`` of a fan-out directory and the fsync of its parent. A writer
    found the directory and trusted it: its log was acknowledged (the log's own entry fsynced), and a
    power loss took the directory, and the acknowledged log with it. ``levels=2``: both fan-out levels
    were made (at once: ``DurableDirs.make_log_dir``) and neither parent fsynced; the writer proved the
    leaf only ("it has a child" taken to prove the parent's entry), and the power loss took the parent."""
    root = str(tmp_path)
    data = os.path.join(root, "data")
    cid = "conv-in-dead-dir"
    paths = conversation_paths(data, SITE, cid)
    fs = FaultFS(root)
    with Store(data, file_ops=fs) as store:
        store.list_conversations(SITE)  # the site and its manifest exist, durably
        dead = [paths.directory, os.path.dirname(paths.directory)][:levels]
        fs.makedirs_durable(os.path.dirname(dead[-1]))
        for directory in reversed(dead):
            fs.mkdir(directory)  # ... and the process died here: no fsync of the parent
    with Store(data, file_ops=fs) as store:  # another process
        store.append(SITE, cid, ITEMS)
        assert _crash_and_read(fs, cid) == ITEMS


class FailingLogOps(CountingOps):
    """Fails the ``fdatasync`` and the ``ftruncate`` of the log ``failing`` (EIO), while set."""

    failing: str | None = None

    def fdatasync(self, fd: int) -> None:
        if self._paths.get(fd) == self.failing:
            raise OSError(errno.EIO, "injected")
        super().fdatasync(fd)

    def ftruncate(self, fd: int, size: int) -> None:
        if self._paths.get(fd) == self.failing:
            raise OSError(errno.EIO, "injected")
        super().ftruncate(fd, size)


def test_regression_failed_first_write_whose_cleanup_failed_is_cut(tmp_path):
    """The first write of a new log fails (its fdatasync) and so does the cut back to 0. The record at 0
    written before the log existed is still in the failed write's epoch, which is how the writer knows
    nobody vouched for its frame: the next append cuts it instead of taking it in (a batch reported
    failed must never be served)."""
    cid = "conv-first-fails"
    ops = FailingLogOps()
    with Store(str(tmp_path / "data"), file_ops=ops) as store:
        ops.failing = conversation_paths(store.data_dir, SITE, cid).log
        with pytest.raises(Io):
            store.append(SITE, cid, [{"n": 1, "try": 1}])
        assert os.path.getsize(ops.failing) > 0  # the failed frame is still there
        ops.failing = None
        got = store.append(SITE, cid, [{"n": 1, "try": 2}])
        assert got.first == 0
        assert [i.payload for i in store.replay(SITE, cid, 0, 10)] == [{"n": 1, "try": 2}]
    with Store(str(tmp_path / "data"), file_ops=NO_SYNC_OPS) as store:
        assert [i.payload for i in store.replay(SITE, cid, 0, 10)] == [{"n": 1, "try": 2}]


class _Died(BaseException):
    """A process's death at a crash point: nothing after it runs (not an ``OSError``: no poisoning)."""


def test_regression_frames_of_a_creator_that_died_before_its_entry_was_durable(tmp_path):
    """A process created a log and wrote its first frame (fdatasynced), then died before the directory
    fsync that makes the log's entry durable. Another process took that frame in under the lock and
    acknowledged its own append on top: an append at a non-zero offset, so no directory fsync, and a
    power loss took the log's entry and the acknowledged batch with it."""
    root = str(tmp_path)
    data = os.path.join(root, "data")
    cid = "conv-dead-creator"
    paths = conversation_paths(data, SITE, cid)
    fs = FaultFS(root)
    fs.log = []

    def die_before_the_entry_fsync(fs: FaultFS, point: int) -> None:
        assert fs.log is not None
        call = fs.log[-1]
        if call.name == "fsync_dir" and call.path == paths.directory:
            raise _Died

    dead = Store(data, file_ops=fs)
    try:
        dead.list_conversations(SITE)  # the site and its manifest exist, durably
        fs.crash_hook = die_before_the_entry_fsync
        with pytest.raises(_Died):
            dead.append(SITE, cid, [{"by": "dead"}])
        fs.crash_hook = None
        assert fs.unsynced() > 0  # the log's entry is still up in the air
        with Store(data, file_ops=fs) as taker:  # another process (its own lock owner)
            got = taker.append(SITE, cid, [{"by": "taker"}])
            assert got.first == 1  # the dead creator's frame was taken in
            served = [item.payload for item in taker.replay(SITE, cid, 0, 100)]
        assert served == [{"by": "dead"}, {"by": "taker"}]
        assert _crash_and_read(fs, cid) == served  # acknowledged, and served: durable
    finally:
        dead.close()


class AlongsideProbe(CountingOps):
    """Holds the first ``fdatasync`` of the log ``log`` until the fsync of ``directory`` has started (or 10 s
    passed): it can start only if the two run at once. ``fail_entry``: that directory fsync fails (EIO)."""

    def __init__(self, log: str, directory: str, *, fail_entry: bool = False) -> None:
        super().__init__()
        self.log, self.directory, self.fail_entry = log, directory, fail_entry
        self.entry_started = threading.Event()
        self.frames_failed = threading.Event()
        self.entry_done = threading.Event()
        self.overlapped: bool | None = None
        self.entry_done_before_return: bool | None = None

    def fdatasync(self, fd: int) -> None:
        if self._paths.get(fd) == self.log and self.overlapped is None:
            self.overlapped = self.entry_started.wait(timeout=10)
        super().fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        if path != self.directory:
            super().fsync_dir(path)
            return
        self.entry_started.set()
        try:
            if self.fail_entry:
                raise OSError(errno.EIO, "injected")
            super().fsync_dir(path)
        finally:
            self.entry_done.set()


def _probe(tmp_path, cid: str, **kwargs) -> tuple[str, AlongsideProbe]:
    data = str(tmp_path / "data")
    paths = conversation_paths(data, SITE, cid)
    return data, AlongsideProbe(paths.log, paths.directory, **kwargs)


def test_the_first_frames_and_the_log_entry_are_synced_at_once(tmp_path):
    """P14: the first commit's two syncs run at the same time (the entry on a helper thread), so a new
    conversation waits for two syncs in a row, not three; the append returns once both are done."""
    cid = "conv-alongside"
    data, ops = _probe(tmp_path, cid)
    with Store(data, file_ops=ops) as store:
        got = store.append(SITE, cid, ITEMS)
        assert ops.overlapped is True
        assert ops.entry_done.is_set()
        assert got.first == 0 and [i.payload for i in store.replay(SITE, cid, 0, 10)] == ITEMS


def test_a_failed_entry_fsync_on_the_helper_fails_the_first_append(tmp_path):
    """The log's entry fsync fails on the helper thread: the append fails (retryable ``Io``), nothing of it
    is acknowledged or served, and the retry makes the entry durable and lands at seq 0."""
    cid = "conv-entry-fails"
    data, ops = _probe(tmp_path, cid, fail_entry=True)
    with Store(data, file_ops=ops) as store:
        with pytest.raises(Io):
            store.append(SITE, cid, [{"try": 1}])
        assert ops.overlapped is True
        assert store.replay(SITE, cid, 0, 10) == []
        ops.fail_entry = False
        ops.reset()
        got = store.append(SITE, cid, [{"try": 2}])
        assert got.first == 0
        assert ("fsync_dir", "fan-out dir") in kinds(ops.syncs, conversation_paths(data, SITE, cid))
        assert [i.payload for i in store.replay(SITE, cid, 0, 10)] == [{"try": 2}]


class FailingFramesOps(AlongsideProbe):
    """The log's first ``fdatasync`` fails (EIO) once the entry fsync started; the entry fsync is held
    until then, so the failure returns while the helper still works unless the commit waits for it."""

    def fdatasync(self, fd: int) -> None:
        if self._paths.get(fd) == self.log and self.overlapped is None:
            self.overlapped = self.entry_started.wait(timeout=10)
            self.frames_failed.set()
            raise OSError(errno.EIO, "injected")
        super().fdatasync(fd)

    def fsync_dir(self, path: str) -> None:
        if path == self.directory and not self.entry_started.is_set():
            self.entry_started.set()
            self.frames_failed.wait(timeout=10)
            threading.Event().wait(0.2)  # still in it well after: a commit that did not wait has returned
            super().fsync_dir(path)
            self.entry_done.set()
            return
        super().fsync_dir(path)


def test_a_failed_first_fdatasync_returns_only_after_the_entry_fsync(tmp_path):
    """No fsync of a failed commit outlives it: the error comes back once the helper is done."""
    cid = "conv-frames-fail"
    data, ops = _probe(tmp_path, cid)
    ops.__class__ = FailingFramesOps
    with Store(data, file_ops=ops) as store:
        with pytest.raises(Io):
            store.append(SITE, cid, [{"try": 1}])
        assert ops.overlapped is True and ops.entry_done.is_set()
        assert store.append(SITE, cid, [{"try": 2}]).first == 0


def _child_creates(data: str) -> None:
    with Store(data) as store:
        store.append(SITE, "conv-in-child", ITEMS)


def test_a_forked_child_creates_conversations_after_its_parent_did(tmp_path):
    """The helper threads are the parent's: a forked child (``serve --workers``, the torture's fork
    server) starts its own instead of queueing on a pool no thread of it runs (it hung)."""
    data = str(tmp_path / "data")
    with Store(data) as store:
        store.append(SITE, "conv-in-parent", ITEMS)  # the parent's helper threads exist
        child = multiprocessing.get_context("fork").Process(target=_child_creates, args=(data,))
        child.start()
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
            child.join()
        assert child.exitcode == 0
        assert [i.payload for i in store.replay(SITE, "conv-in-child", 0, 10)] == ITEMS


class _Interrupting(FileOps):
    """Raises ``KeyboardInterrupt`` at one step of a new log's creation, once armed."""

    def __init__(self, step: str) -> None:
        self.step, self.armed = step, False

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        if self.armed and self.step == "open" and path.endswith(".log") and flags & os.O_CREAT:
            self.armed = False
            raise KeyboardInterrupt
        return super().open(path, flags, mode)

    def file_id(self, fd: int):  # type: ignore[no-untyped-def]
        if self.armed and self.step == "file_id" and os.readlink(f"/proc/self/fd/{fd}").endswith(".log"):
            self.armed = False
            raise KeyboardInterrupt
        return super().file_id(fd)


def _descriptors_of(name: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc/self/fd"):
        try:
            if name in os.readlink(f"/proc/self/fd/{entry}"):
                found.append(int(entry))
        except OSError:  # the listing's own descriptor, closed by now
            pass
    return found


@pytest.mark.parametrize("step", ["open", "file_id"])
def test_an_interrupt_while_the_log_is_created_leaves_no_descriptor_open(tmp_path, step):
    """A KeyboardInterrupt at the log's creation propagates, the flock is released, the next append
    creates the conversation, and once the store is closed no descriptor of it is left (the commit point's
    descriptor of the lock file, opened just before, leaked on this path)."""
    ops = _Interrupting(step)
    cid = "conv-interrupted"
    with Store(str(tmp_path / "data"), file_ops=ops) as store:
        store.append("local", "warm-conversation", [{"n": 0}])
        ops.armed = True
        with pytest.raises(KeyboardInterrupt):
            store.append("local", cid, [{"n": 1}])
        assert not ops.armed  # the interrupt came from the step named
        assert store.append("local", cid, [{"n": 2}]).first == 0
    assert _descriptors_of(cid) == []
