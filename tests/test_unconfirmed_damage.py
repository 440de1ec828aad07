"""Damage a reader sees without the file lock is never reported before it is confirmed under the lock.

The race (found by the kill -9 torture in CI: a writer's recall got ``Corrupted ... (bad-magic)``): a
lock-free refresh reads the log while other processes write it, and can take a healthy log for a
damaged one - zeros where the log ended, then a frame of a later write. Two ways: its scan reads zeros
at the end and, before it looks at that spot again (``scanner.zeros_to_end``), another process commits
twice; or one ``pread`` spans two commits and returns the first one's pages as they were before it
(the preallocated zeros). Such a verdict is confirmed by a reload under the file lock before it is
believed, but it used to be published first: another thread of the same process reading in that
window raised ``Corrupted`` on a healthy log, and if the confirmation failed (lock timeout) the damage
stuck, refusing that process's appends.

The torn views are made by ``FileOps`` subclasses (one zeroes a scan read, one lets another store
commit at the right moment), and the confirming thread is held at the file lock by the test.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from collections.abc import Callable

from logstore import Store
from logstore.file.fileio import FileOps
from logstore.file.layout import conversation_paths
from logstore.file.locking import PathLock

SITE, CID = "site-a", "shared-conv-01"
ITEMS = [{"role": "user", "text": "x" * 300}]


class StaleScanOps(FileOps):
    """Once armed, the next read of more than a header starting at ``at`` returns ``stale`` zero bytes
    where the first commit after ``at`` is (the page was read before that commit wrote it)."""

    def __init__(self) -> None:
        self.at: int | None = None
        self.stale = 0

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        data = super().pread(fd, size, offset)
        if self.at is not None and offset == self.at and size > 64:
            self.at = None
            data = bytes(self.stale) + data[self.stale :]
        return data


def _recall_into(results: dict[str, object], name: str, store: Store, count: int) -> None:
    """``recall``'s seqs, or the exception it raised, as ``results[name]`` (run in a thread)."""
    try:
        results[name] = [item.seq for item in store.recall(SITE, CID, count)]
    except Exception as exc:  # noqa: BLE001 - recorded and asserted on by the test
        results[name] = exc


def _wait(predicate, what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.001)


def test_a_reader_never_reports_damage_another_thread_has_not_confirmed(tmp_path):
    data = str(tmp_path / "data")
    ops = StaleScanOps()
    with Store(data) as writer, Store(data, file_ops=ops, lock_timeout=20.0) as reader:
        writer.append(SITE, CID, ITEMS)
        assert len(reader.recall(SITE, CID, 10)) == 1  # the reader's state: one frame
        conv = reader._handles[(SITE, CID)]
        end = conv._state.end
        writer.append(SITE, CID, ITEMS)  # frame 2 at ``end``
        writer.append(SITE, CID, ITEMS)  # frame 3: a later write
        second = conv._state.end  # unchanged: the reader has not looked yet
        assert second == end
        ops.at, ops.stale = end, 64  # the frame-2 page read before it was written: zeros

        paths = conversation_paths(data, SITE, CID)
        lock_fd = os.open(paths.lock, os.O_RDWR)
        fcntl.flock(lock_fd, fcntl.LOCK_EX)  # the confirmation will wait here
        results: dict[str, object] = {}

        first = threading.Thread(target=_recall_into, args=(results, "first", reader, 10))
        first.start()
        try:
            # The first reader saw the torn view and is confirming it, blocked at the file lock.
            _wait(lambda: conv._state.corrupt is not None and conv._io_lock.locked(), "the torn view")
            second_reader = threading.Thread(target=_recall_into, args=(results, "second", reader, 10))
            second_reader.start()
            time.sleep(0.2)  # long enough for a read that does not wait to finish (and fail)
            assert "second" not in results or results["second"] == [0, 1, 2], results
        finally:
            fcntl.flock(lock_fd, fcntl.LOCK_UN)
            os.close(lock_fd)
        first.join(10)
        second_reader.join(10)
    assert results == {"first": [0, 1, 2], "second": [0, 1, 2]}, results


def _torn_view_left_unconfirmed(data: str, ops: StaleScanOps, reader: Store, writer: Store) -> None:
    """The reader sees the torn view and its confirmation fails (the lock stays busy past its timeout):
    the unconfirmed damage stays in its published state."""
    writer.append(SITE, CID, ITEMS)
    assert len(reader.recall(SITE, CID, 10)) == 1
    end = reader._handles[(SITE, CID)]._state.end
    writer.append(SITE, CID, ITEMS)
    writer.append(SITE, CID, ITEMS)
    ops.at, ops.stale = end, 64
    lock_fd = os.open(conversation_paths(data, SITE, CID).lock, os.O_RDWR)
    fcntl.flock(lock_fd, fcntl.LOCK_EX)
    try:
        try:
            reader.recall(SITE, CID, 10)
        except Exception as exc:  # noqa: BLE001 - the lock timeout, from the confirmation
            assert type(exc).__name__ == "Timeout", exc
        else:
            raise AssertionError("the confirmation should have timed out")
    finally:
        fcntl.flock(lock_fd, fcntl.LOCK_UN)
        os.close(lock_fd)
    assert reader._handles[(SITE, CID)]._state.corrupt is not None  # published, never confirmed


def test_damage_left_unconfirmed_is_judged_again_by_the_next_read(tmp_path):
    data = str(tmp_path / "data")
    ops = StaleScanOps()
    with Store(data) as writer, Store(data, file_ops=ops, lock_timeout=0.3) as reader:
        _torn_view_left_unconfirmed(data, ops, reader, writer)
        assert [item.seq for item in reader.recall(SITE, CID, 10)] == [0, 1, 2]
        assert reader._handles[(SITE, CID)]._state.corrupt is None


def test_damage_left_unconfirmed_does_not_refuse_the_next_append(tmp_path):
    data = str(tmp_path / "data")
    ops = StaleScanOps()
    with Store(data) as writer, Store(data, file_ops=ops, lock_timeout=0.3) as reader:
        _torn_view_left_unconfirmed(data, ops, reader, writer)
        assert reader.append(SITE, CID, ITEMS).first == 3
        assert [item.seq for item in writer.recall(SITE, CID, 10)] == [0, 1, 2, 3]


class HookOps(FileOps):
    """Runs ``hook`` once, just before a read of more than a frame header at ``target``."""

    def __init__(self) -> None:
        self.target: int | None = None
        self.hook: Callable[[], None] | None = None

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        if self.target is not None and offset == self.target and size > 12 and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
        return super().pread(fd, size, offset)


def test_two_commits_between_a_scan_and_its_second_look_are_not_reported_as_damage(tmp_path):
    """The same race without a stale page (helper's reproduction): the scan reads zeros at the end, and
    before its second look at that spot (``zeros_to_end``) another process commits twice, so it finds
    a frame of a later write after what it took for a hole: damage, published, pending confirmation."""
    data = str(tmp_path / "data")
    ops = HookOps()
    with Store(data, lock_timeout=30.0) as a, Store(data, lock_timeout=30.0, file_ops=ops) as b:
        for k in range(5):
            a.append(SITE, CID, [{"k": k}])
        assert [i.seq for i in b.recall(SITE, CID, 3)] == [2, 3, 4]
        a.append(SITE, CID, [{"k": "X0"}])  # B has not looked yet
        p = a._handles[(SITE, CID)]._state.end
        blocker = PathLock(b._handles[(SITE, CID)].paths.lock)

        def two_commits_then_hold_the_lock() -> None:
            a.append(SITE, CID, [{"k": "X1"}])  # at p
            a.append(SITE, CID, [{"k": "X2"}])  # a later write
            blocker.acquire(5.0)

        ops.target, ops.hook = p, two_commits_then_hold_the_lock
        out: dict[str, object] = {}

        t1 = threading.Thread(target=_recall_into, args=(out, "t1", b, 3))
        t1.start()
        try:
            _wait(lambda: ops.hook is None and b._handles[(SITE, CID)]._io_lock.locked(), "the hook")
            time.sleep(0.05)
            t2 = threading.Thread(target=_recall_into, args=(out, "t2", b, 3))
            t2.start()
            t2.join(0.3)  # a read that does not wait for the confirmation has failed by now
        finally:
            blocker.release()
            blocker.close()
        t1.join(10)
        t2.join(10)
    assert out == {"t1": [5, 6, 7], "t2": [5, 6, 7]}, out
