"""The lock file's change counter (issue 35; ``logstore/file/log/commit_point.py``): an append that finds
the header (record + counter) as its process left it trusts its state without a syscall - no ``statx`` of
the lock path or the log path, no ``pread`` of the record or past the end - and every holder that changes
the log without moving the record bumps the counter first, so any other holder notices.

Syscalls are counted through ``FileOps`` (and the lock-path proof through ``PathId``); the cross-process
cases with two owners in one process (two ``Store``s: two open file descriptions, two flocks) and in the
torture suites with real processes (tests/test_torture_kill9.py, test_torture_purge.py).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from logstore import Store
from logstore.file import statx
from logstore.file.fileio import FILE_MODE, FileOps
from logstore.file.layout import conversation_paths
from logstore.file.locking import PathLock
from logstore.file.log.commit_point import HEADER_SIZE, RECORD_SIZE, decode

SITE, CID = "site-a", "conv-counter"
ITEMS = [{"role": "user", "content": "hello"}]


class CallOps(FileOps):
    """Real file operations; every call on the conversation's log and lock file noted as (name, file)."""

    def __init__(self) -> None:
        self._paths: dict[int, str] = {}
        self.calls: list[tuple[str, str]] = []
        self.names: dict[str, str] = {}  # path -> "log" / "lock" / "index"

    def _note(self, name: str, fd: int) -> None:
        what = self.names.get(self._paths.get(fd, ""))
        if what is not None:
            self.calls.append((name, what))

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        fd = super().open(path, flags, mode)
        self._paths[fd] = path
        return fd

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        self._note("pwrite", fd)
        super().pwrite(fd, data, offset)

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        self._note("pread", fd)
        return super().pread(fd, size, offset)

    def fdatasync(self, fd: int) -> None:
        self._note("fdatasync", fd)

    def size(self, fd: int) -> int:
        self._note("size", fd)
        return super().size(fd)

    def size_if_named(self, fd: int, path: str, file_id: tuple[int, int, int] | None = None) -> int | None:
        self._note("size_if_named", fd)
        return super().size_if_named(fd, path, file_id)


@pytest.fixture
def lock_proofs(monkeypatch):
    """How many times a ``PathLock`` proved that its path names the file it locked (one ``statx`` each)."""
    proofs = [0]
    real = statx.PathId.file_id

    def counted(self):
        proofs[0] += 1
        return real(self)

    monkeypatch.setattr(statx.PathId, "file_id", counted)
    return proofs


def test_steady_append_makes_only_the_frame_write_and_its_sync(tmp_path, lock_proofs):
    """The record moves through the lock file's shared mapping (no ``pwrite``): another descriptor's
    ``pread`` sees it at once, at the new end, before the append returns."""
    ops = CallOps()
    with Store(str(tmp_path / "data"), file_ops=ops) as store:
        paths = conversation_paths(store.data_dir, SITE, CID)
        ops.names = {paths.log: "log", paths.lock: "lock", paths.index: "index"}
        for _ in range(3):
            store.append(SITE, CID, ITEMS)
        ops.calls.clear()
        lock_proofs[0] = 0
        other, end = os.open(paths.lock, os.O_RDONLY), 0
        try:
            for n in range(40):
                store.append(SITE, CID, ITEMS)
                assert ops.calls == [("pwrite", "log"), ("fdatasync", "log")], n
                ops.calls.clear()
                point = decode(os.pread(other, RECORD_SIZE, 0))
                assert point is not None and point.next_seq == n + 4 and point.end > end, n
                end = point.end
        finally:
            os.close(other)
        assert lock_proofs[0] == 0
        assert [i.seq for i in store.replay(SITE, CID, 0, 100)] == list(range(43))


def test_another_owners_commit_sends_the_next_append_the_whole_way(tmp_path, lock_proofs):
    data = str(tmp_path / "data")
    ops = CallOps()
    with Store(data, file_ops=ops) as a, Store(data) as b:
        paths = conversation_paths(data, SITE, CID)
        ops.names = {paths.log: "log", paths.lock: "lock"}
        a.append(SITE, CID, [{"n": 0}])
        a.append(SITE, CID, [{"n": 1}])
        assert b.append(SITE, CID, [{"n": 2}]).first == 2
        ops.calls.clear()
        lock_proofs[0] = 0
        assert a.append(SITE, CID, [{"n": 3}]).first == 3
        assert lock_proofs[0] == 1  # the record moved: the lock path proved again
        assert ("size_if_named", "log") in ops.calls
        assert [i.payload["n"] for i in a.replay(SITE, CID, 0, 10)] == [0, 1, 2, 3]


class DiesBeforeItsRecord(FileOps):
    """A writer killed between its frame's ``fdatasync`` and its commit point (``BaseException``: nothing
    catches it; ``finally`` blocks still drop the flock, as the kernel does for a dead process). The
    record moves through the lock file's mapping, so the kill comes as the log's ``fdatasync`` returns."""

    armed = False

    def __init__(self, log_path: str) -> None:
        self.log_path = log_path
        self._paths: dict[int, str] = {}

    def open(self, path: str, flags: int, mode: int = FILE_MODE) -> int:
        fd = super().open(path, flags, mode)
        self._paths[fd] = path
        return fd

    def fdatasync(self, fd: int) -> None:
        super().fdatasync(fd)
        if self.armed and self._paths.get(fd) == self.log_path:
            self.armed = False
            raise Killed()


class Killed(BaseException):
    pass


def test_a_writer_that_died_before_its_record_is_taken_in_not_overwritten(tmp_path):
    """Its frame is past the record, which did not move: only the counter it bumped before writing tells
    the other owner, whose header is otherwise exactly as it left it."""
    data = str(tmp_path / "data")
    paths = conversation_paths(data, SITE, CID)
    dying = DiesBeforeItsRecord(paths.log)
    with Store(data) as a, Store(data, file_ops=dying) as b:
        a.append(SITE, CID, [{"n": 0}])
        assert b.append(SITE, CID, [{"n": 1}]).first == 1
        a.append(SITE, CID, [{"n": 2}])
        with open(paths.lock, "rb") as f:
            before = f.read(RECORD_SIZE)
        dying.armed = True
        with pytest.raises(Killed):
            b.append(SITE, CID, [{"n": "dead writer's"}])
        with open(paths.lock, "rb") as f:
            assert f.read(RECORD_SIZE) == before  # the record did not move
        assert a.append(SITE, CID, [{"n": 4}]).first == 4  # after the dead writer's seq 3
        got = [i.payload["n"] for i in a.replay(SITE, CID, 0, 10)]
        assert got == [0, 1, 2, "dead writer's", 4]


def test_a_trim_by_another_owner_is_seen(tmp_path):
    """Another owner's clean close gives back the preallocated tail without moving the record: the
    counter tells this owner its size is stale (else its next commit would not grow the file)."""
    data = str(tmp_path / "data")
    with Store(data) as a:
        a.append(SITE, CID, ITEMS)
        with Store(data) as b:
            assert len(b.recall(SITE, CID, 10)) == 1  # opens the log; its handle's close trims the tail
        paths = conversation_paths(data, SITE, CID)
        with open(paths.log, "rb") as f:
            assert len(f.read()) < a._handles[(SITE, CID)]._files.state.size  # trimmed; the record unmoved
        a.append(SITE, CID, ITEMS)
        files = a._handles[(SITE, CID)]._files
        assert files.state.size == os.path.getsize(files.paths.log) > files.state.end


def test_an_older_releases_lock_file_is_upgraded_by_the_first_commit(tmp_path):
    """An 84-byte lock file (the record alone) cannot hold the counter: the first commit writes it with
    ``pwrite``, after which the header is mapped, the next append trusts it and moves the record in it."""
    data = str(tmp_path / "data")
    with Store(data) as store:
        store.append(SITE, CID, ITEMS)
    paths = conversation_paths(data, SITE, CID)
    os.truncate(paths.lock, RECORD_SIZE)
    ops = CallOps()
    with Store(data, file_ops=ops) as store:
        ops.names = {paths.log: "log", paths.lock: "lock"}
        store.append(SITE, CID, ITEMS)
        assert os.path.getsize(paths.lock) == HEADER_SIZE
        ops.calls.clear()
        store.append(SITE, CID, ITEMS)
        assert ops.calls == [("pwrite", "log"), ("fdatasync", "log")]  # the record: through the mapping
        assert [i.seq for i in store.replay(SITE, CID, 0, 10)] == [0, 1, 2]


def test_path_lock_asks_the_owner_only_for_the_file_it_proved(tmp_path):
    path = str(tmp_path / "c.lock")
    lock = PathLock(path)
    asked: list[bool] = []

    def unchanged() -> bool:
        asked.append(True)
        return False  # the owner cannot vouch: the path's statx decides

    try:
        assert lock.acquire(5, unchanged=unchanged) is False
        assert asked == []  # nothing proved yet: never asked
        lock.release()
        os.replace(_new_file(tmp_path), path)  # a holder of the flock replaced it (purge, restore)
        assert lock.acquire(5, unchanged=unchanged) is True  # asked, said no: the statx found it
        assert asked == [True]
        lock.release()
        assert lock.acquire(5, unchanged=lambda: True) is False  # the owner's word: no statx
    finally:
        lock.close()


def _new_file(tmp_path) -> str:
    other = str(tmp_path / "replacement")
    with open(other, "wb"):
        pass
    return other


def test_the_suite_checks_caller_holds_preconditions(tmp_path):
    """LOGSTORE_DEBUG_LOCKS=1 (tests/conftest.py): a method whose caller must hold a lock refuses a caller
    that does not."""
    from logstore.file.log.held import DEBUG_LOCKS

    assert DEBUG_LOCKS
    with Store(str(tmp_path / "data")) as store:
        store.append(SITE, CID, ITEMS)
        conv = store._handles[(SITE, CID)]
        with pytest.raises(AssertionError, match="does not hold _commit_lock"):
            conv._refresh_locked_io()
        with conv._commit_lock, pytest.raises(AssertionError, match="does not hold _file_lock"):
            conv._refresh_locked_io()
        with pytest.raises(AssertionError, match="does not hold _file_lock"):
            conv._files.refresh_locked()


def test_a_process_killed_before_its_record_is_taken_in_by_a_trusting_ones_next_append(tmp_path):
    """The same with a real process, SIGKILLed after its frame's fdatasync and before its commit point:
    the kernel drops its flock, and only the counter it bumped tells this process, whose last commit
    left it trusting the header."""
    from tests.test_read_dead_writer import _CHILD, ROOT
    from tests.test_read_dead_writer import CID as DEAD_CID

    data = str(tmp_path / "data")
    with Store(data) as store:
        store.append(SITE, DEAD_CID, [{"n": 0}])
        store.append(SITE, DEAD_CID, [{"n": 1}])
        child = subprocess.run([sys.executable, "-c", _CHILD, data, ROOT], capture_output=True, timeout=120)
        assert child.returncode == -signal.SIGKILL, child.stderr.decode()
        assert store.append(SITE, DEAD_CID, [{"n": 3}]).first == 3
        got = [i.payload["n"] for i in store.replay(SITE, DEAD_CID, 0, 10)]
        assert got == [0, 1, "stored, never acknowledged", 3]


class NoMapDies(DiesBeforeItsRecord):
    """A writer that cannot map the header (``vm.max_map_count``, a file system without shared mappings):
    it bumps the counter with ``pread`` + ``pwrite`` (and moves the record with ``pwrite``)."""

    def map_shared(self, fd: int, size: int) -> None:
        return None


def test_a_writer_without_the_mapping_bumps_through_pwrite(tmp_path):
    data = str(tmp_path / "data")
    paths = conversation_paths(data, SITE, CID)
    dying = NoMapDies(paths.log)
    with Store(data) as a, Store(data, file_ops=dying) as b:
        a.append(SITE, CID, [{"n": 0}])
        assert b.append(SITE, CID, [{"n": 1}]).first == 1
        a.append(SITE, CID, [{"n": 2}])
        dying.armed = True
        with pytest.raises(Killed):
            b.append(SITE, CID, [{"n": "dead writer's"}])
        assert a.append(SITE, CID, [{"n": 4}]).first == 4
        assert [i.payload["n"] for i in b.replay(SITE, CID, 0, 10)] == [0, 1, 2, "dead writer's", 4]
