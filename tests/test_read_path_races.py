"""Issue 20 §4, "found by reading the same code": one test each, on the real engine.

- Frames another process left without its ``fdatasync`` are made durable before this process's index
  names them (``_trim_io`` used to write their entries on close: after a power loss the index vouched for
  a frame that was gone, a false ``Corrupted (missing-frames)`` that refused appends).
- A reader racing ``Store.close()`` gets ``Unavailable`` and leaves no descriptor open
  (``_verify_and_rebuild`` used to reopen the log and index of a closed handle, and serve from them).
- An exception after every batch of a group had its outcome (the observer, the manifest's
  ``record_commit``) is logged, the append still succeeds, and the listing does not stay behind.
- A full recovery scan does not run inside the descriptor guard's lock (every reader would wait for it).

(The interrupt between becoming the group's leader and its ``try`` is tested with the other group-commit
interrupts in tests/test_group_commit.py.)
"""

from __future__ import annotations

import logging
import os
import random
import threading
from collections.abc import Iterator
from contextlib import contextmanager

import pytest

from logstore import Store
from logstore.core import observe
from logstore.core.errors import Unavailable
from logstore.file.fileio import FileOps
from logstore.file.layout import conversation_paths
from logstore.file.log.commit_point import invalidate
from logstore.file.log.frame import PREFIX_SIZE
from logstore.file.log.group_commit import ReaderGuard
from logstore.file.manifest.site_journal import SiteJournal
from tests.faultfs import FaultFS, materialize

SITE, CID = "site-a", "shared-conv-01"


# ---------------------------------------------------------------------------------------------------------
# A killed writer's frames, a clean close of another process, then a power loss.


class Killed(BaseException):
    """kill -9 of the writer between its pwrite and its fdatasync: nothing of it runs after (no cut of the
    frame, no commit point), and its file lock is gone (raised as a BaseException, the ``finally``
    blocks release the flock as the kernel would)."""


class KillableFS(FaultFS):
    """The power-loss model shared by both stores; ``kill_next_sync`` kills the next ``fdatasync`` of a
    log by the thread that set it (the manifest's background threads sync their own files)."""

    kill_next_sync: int | None = None  # a thread id

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        if path.endswith(".log"):
            self.logs.add(fd)
        else:
            self.logs.discard(fd)
        return fd

    def fdatasync(self, fd: int) -> None:
        if self.kill_next_sync == threading.get_ident() and fd in self.logs:
            self.kill_next_sync = None
            raise Killed
        super().fdatasync(fd)


@pytest.mark.parametrize("pad", [0, 100_000], ids=["into-the-preallocated-tail", "extending-the-file"])
def test_frames_a_killed_writer_left_are_durable_before_another_store_indexes_them(tmp_path, pad):
    """With small batches, A's close also gives back the preallocated tail, and that trim happened to
    fdatasync the log before the index was written; batches of 64 KiB and more are written without a
    preallocated tail, so nothing is trimmed and nothing synced the killed writer's frame."""
    data = str(tmp_path / "data")
    fs = KillableFS(data)
    fs.logs = set()
    a = Store(data, file_ops=fs)
    b = Store(data, file_ops=fs)
    try:
        a.append(SITE, CID, [{"n": 0, "pad": "x" * pad}])
        a.append(SITE, CID, [{"n": 1, "pad": "x" * pad}])
        assert [i.seq for i in b.recall(SITE, CID, 10)] == [0, 1]
        fs.kill_next_sync = threading.get_ident()
        with pytest.raises(Killed):
            b.append(SITE, CID, [{"n": "killed before its fdatasync", "pad": "x" * pad}])
        assert fs.kill_next_sync is None  # killed at the log's fdatasync: its frame is in the page cache
        with open(conversation_paths(data, SITE, CID).log, "rb") as fh:
            assert b"killed before its fdatasync" in fh.read()
        # B is dead: never closed. A closes cleanly (trims its tail, writes and syncs its index).
        a.close()
        image = fs.crash_image(random.Random(20), "drop")  # the power fails: nothing unsynced survives
    finally:
        a.close()
    after = str(tmp_path / "after")
    materialize(image, after)
    with Store(after) as r:
        items = r.recall(SITE, CID, 10)  # Corrupted (missing-frames) if the index named a lost frame
        assert [i.payload["n"] for i in items][:2] == [0, 1]
        assert r.append(SITE, CID, [{"n": "after"}]).first == len(items)
    b.close()  # the test's own descriptors (B's process would have lost them when it was killed)


# ---------------------------------------------------------------------------------------------------------
# A reader racing Store.close().


def _fds_under(path: str) -> set[str]:
    found = set()
    for name in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(os.path.join("/proc/self/fd", name))
        except OSError:
            continue  # closed meanwhile (the listing's own descriptor, among others)
        if target.startswith(path + os.sep):
            found.add(f"{name} -> {target}")
    return found


class ClosingGuard(ReaderGuard):
    """Sets ``closing`` when ``close()`` (the handle is marked closed) waits for readers to leave."""

    def __init__(self, conv) -> None:
        super().__init__()
        self.conv = conv
        self.closing = threading.Event()

    @contextmanager
    def exclusive(self) -> Iterator[None]:
        if self.conv._closed:
            self.closing.set()
        with super().exclusive():
            yield


class MismatchOps(FileOps):
    """Once armed with the read's ``(offset, size)``: runs ``hook`` inside that ``pread`` (the reader is
    mid-``pread``) and returns zeros, which disagree with the index (``IndexMismatch``)."""

    def __init__(self) -> None:
        self.target: tuple[int, int] | None = None
        self.hook = None

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        data = super().pread(fd, size, offset)
        if self.target == (offset, size) and self.hook is not None:
            hook, self.hook = self.hook, None
            hook()
            return bytes(len(data))
        return data


def test_a_reader_racing_close_gets_unavailable_and_leaves_no_descriptor_open(tmp_path):
    data = str(tmp_path / "data")
    os.makedirs(data)
    assert _fds_under(data) == set()
    ops = MismatchOps()
    store = Store(data, file_ops=ops)
    for k in range(3):
        store.append(SITE, CID, [{"k": k}])
    assert len(store.recall(SITE, CID, 10)) == 3
    conv = store._handles[(SITE, CID)]
    guard = ClosingGuard(conv)
    conv._files._fd_readers = guard
    closer = threading.Thread(target=store.close)

    def close_while_reading() -> None:
        closer.start()
        # close() has marked the handle closed and waits for this pread to end: it holds every lock of
        # the conversation until it has closed the descriptors.
        assert guard.closing.wait(30), "close() never reached the descriptors"

    # The read's pread: the region and the look past its end.
    ops.target, ops.hook = (0, conv._files.state.end + PREFIX_SIZE), close_while_reading
    with pytest.raises(Unavailable):
        store.recall(SITE, CID, 10)  # the zeros disagree with the index: it rescans, after close()
    assert ops.hook is None, "the race was not set up"
    closer.join(30)
    assert not closer.is_alive()
    assert _fds_under(data) == set()


# ---------------------------------------------------------------------------------------------------------
# Errors after every batch had its outcome.


class FailingObserver:
    def commit(self, *, requests: int, nbytes: int, fsync_seconds: float) -> None:
        raise RuntimeError("observer broke")

    def conversations_opened(self, delta: int) -> None:
        pass


def _listed(store: Store) -> dict[str, object]:
    return {c.conversation_id: c.last_appended_at for c in store.list_conversations(SITE).conversations}


def test_an_observer_that_raises_is_logged_and_neither_fails_the_append_nor_the_listing(tmp_path, caplog):
    data = str(tmp_path / "data")
    with Store(data) as store:
        store.append(SITE, CID, [{"n": 0}])
        previous = observe.set_observer(FailingObserver())
        try:
            with caplog.at_level(logging.ERROR, logger="logstore"):
                assert store.append(SITE, CID, [{"n": 1}]).first == 1
        finally:
            observe.set_observer(previous)
        assert "observer broke" in caplog.text
        last = store.recall(SITE, CID, 1)[0].recorded_at
        assert _listed(store) == {CID: last}  # the manifest heard of the commit all the same
    with Store(data) as again:
        assert _listed(again) == {CID: last}


def test_a_manifest_record_that_fails_after_the_commit_is_logged_and_the_next_store_lists_it(
    tmp_path, caplog, monkeypatch
):
    """Not an ``Io`` (those the manifest already logs and remembers): any exception. The append is
    durable and acknowledged; the manifest no longer writes its clean close mark, so the next store
    reconciles the listing with the logs instead of trusting a journal that misses the commit."""
    data = str(tmp_path / "data")
    real = SiteJournal.write
    broken = threading.Event()

    def write(self, reader, data):  # every journal write; while broken, only the commit's record comes
        if broken.is_set():
            raise RuntimeError("manifest broke")
        return real(self, reader, data)

    monkeypatch.setattr(SiteJournal, "write", write)
    with Store(data) as store:
        store.append(SITE, CID, [{"n": 0}])
        broken.set()
        with caplog.at_level(logging.ERROR, logger="logstore"):
            assert store.append(SITE, CID, [{"n": 1}]).first == 1
        broken.clear()
        assert "manifest broke" in caplog.text
        last = store.recall(SITE, CID, 1)[0].recorded_at
    with Store(data) as again:
        assert again._manifest(SITE).wait_reconciled(60)  # the background sweep (never a request) fixes it
        assert _listed(again) == {CID: last}


# ---------------------------------------------------------------------------------------------------------
# Recovery does not hold the descriptor guard's lock.


class GuardLockProbe(FileOps):
    """Notes, at every read of the conversation's log, whether its descriptor guard's lock is held (a
    reader could not enter)."""

    def __init__(self) -> None:
        self.store: Store | None = None
        self.held: list[bool] = []

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        conv = self.store._handles.get((SITE, CID)) if self.store is not None else None
        if conv is not None and conv._files._log_fd == fd:
            cond = conv._files._fd_readers._cond
            free = cond.acquire(False)
            if free:
                cond.release()
            self.held.append(not free)
        return super().pread(fd, size, offset)


@pytest.mark.parametrize("record", ["with-record", "record-invalidated"])
def test_a_full_recovery_scan_does_not_hold_the_descriptor_guard(tmp_path, record):
    data = str(tmp_path / "data")
    paths = conversation_paths(data, SITE, CID)
    with Store(data) as w:
        for k in range(20):
            w.append(SITE, CID, [{"k": k}])
    os.unlink(paths.index)  # recovery scans the whole log
    if record == "record-invalidated":
        invalidate(FileOps(), paths.lock)  # recovery under the file lock
    probe = GuardLockProbe()
    with Store(data, file_ops=probe) as r:
        probe.store = r
        assert len(r.recall(SITE, CID, 50)) == 20
    assert len(probe.held) > 1 and not any(probe.held), probe.held
