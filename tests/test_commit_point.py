"""The commit point (logstore/file/log/commit_point.py): what readers of every process trust (issue 20).

A writer stores the durable end of a conversation's log in its ``.lock`` file after each ``fdatasync``
and before it acknowledges; readers ``pread`` it and serve frames up to it only. These are the
scenarios of the former tests/test_unconfirmed_damage.py (torn views of a log another process is
writing) as tests of that design, plus what the record must carry or lose: damage judged under the
lock, another boot's record, erasure and repair invalidating it, and the seqlock a reader's lock-free
scan relies on. Each race is made deterministic by a ``FileOps`` subclass that blocks or runs a hook
at the exact call, and "the reader never waits for the file lock" is checked by holding that lock
(another owner, or a writer stuck in ``fdatasync``) while the reader runs with a tiny ``lock_timeout``:
a reader that went for the lock would raise ``Timeout``.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Callable

import pytest

from logstore import Store
from logstore.core.errors import Corrupted, Io
from logstore.file import boot
from logstore.file.erasure import erase_conversation
from logstore.file.fileio import OS_FILE_OPS, FileOps
from logstore.file.layout import conversation_paths
from logstore.file.locking import PathLock
from logstore.file.log import commit_point
from logstore.file.log.commit_point import NO_RECORD, RECORD_SIZE, CommitPoint, decode, encode
from logstore.file.log.scanner import scan_log
from logstore.fsck.check import check
from tests.cross_process_support import BlockingSyncOps
from tests.faultfs import simulate_reboot

SITE, CID = "site-a", "shared-conv-01"
NO_WAIT = 0.05  # the lock timeout of a reader that must never wait for the file lock


def _seqs(items) -> list[int]:
    return [item.seq for item in items]


def _payloads(items) -> list[object]:
    return [item.payload for item in items]


def _record(data: str) -> CommitPoint | None:
    with open(conversation_paths(data, SITE, CID).lock, "rb") as fh:
        return decode(fh.read(RECORD_SIZE))


def _held_lock(data: str) -> PathLock:
    """The conversation's file lock, held by another owner (a tool, another process's writer)."""
    lock = PathLock(conversation_paths(data, SITE, CID).lock)
    lock.acquire(5.0)
    return lock


class PathOps(FileOps):
    """Remembers which path each descriptor it opened names (``path_of``)."""

    def __init__(self) -> None:
        self._paths: dict[int, str] = {}

    def open(self, path: str, flags: int, mode: int = 0o600) -> int:
        fd = super().open(path, flags, mode)
        self._paths[fd] = os.path.abspath(path)
        return fd

    def close(self, fd: int) -> None:
        self._paths.pop(fd, None)
        super().close(fd)

    def path_of(self, fd: int) -> str:
        return self._paths.get(fd, "")


# ---------------------------------------------------------------------------------------------------------
# (a) A writer of another Store is inside fdatasync: readers serve only what is committed, without waiting.


@pytest.mark.parametrize(
    "end, next_seq", [(0, 0), (1, 1), (12_345, 678), (2**63 - 1, 2**32 - 1), (2**64 - 1, 2**64 - 1)]
)
def test_a_commits_record_from_its_prefix_is_encodes_record_byte_for_byte(end, next_seq):
    """``encode_commit`` (the commit's fast path: the epoch's prefix built once) writes what ``encode``
    writes, and it decodes back to the same record."""
    point = CommitPoint(boot.boot_id(), b"\x01\x02\x03\x04\x05\x06\x07\x08", 987_654_321, end, next_seq)
    prefix = commit_point.commit_prefix(point.boot, point.epoch, point.ino)
    raw = commit_point.encode_commit(prefix, end, next_seq)
    assert raw == encode(point)
    assert decode(raw) == point


def test_the_in_flight_fault_waits_for_the_logs_fdatasync_not_the_manifest_sweeps(tmp_path):
    """The harness (``BlockingSyncOps``): armed, a journal's ``fdatasync`` passes through and the fault
    stays armed for the log's (1 of 3 busy-machine runs of make test failed: the sweep's sync took it, the
    append went on)."""
    ops = BlockingSyncOps()
    ops.armed = True
    ops.proceed.set()  # before the fix the journal's sync took the fault (no wait: proceed is set)
    journal = os.open(tmp_path / "journal.1", os.O_RDWR | os.O_CREAT)
    try:
        ops.fdatasync(journal)
    finally:
        os.close(journal)
    assert ops.armed and not ops.entered.is_set()


@pytest.mark.parametrize("fail", [None, errno.EIO], ids=["sync-succeeds", "sync-fails"])
def test_a_write_in_flight_in_another_store_is_never_read_and_never_waited_for(tmp_path, fail):
    data = str(tmp_path / "data")
    ops = BlockingSyncOps()
    log_path = conversation_paths(data, SITE, CID).log
    with Store(data, file_ops=ops) as writer, Store(data, lock_timeout=NO_WAIT) as reader:
        writer.append(SITE, CID, [{"n": 0}])
        writer.append(SITE, CID, [{"n": 1}])
        assert _seqs(reader.recall(SITE, CID, 10)) == [0, 1]  # the reader's state: two items
        writer.append(SITE, CID, [{"n": 2}])  # acknowledged: the reader has not looked yet
        size = os.path.getsize(log_path)

        ops.armed, ops.fail = True, fail
        outcome: dict[str, object] = {}

        def append_in_flight() -> None:
            try:
                outcome["range"] = writer.append(SITE, CID, [{"n": "NOT DURABLE"}])
            except Exception as exc:  # noqa: BLE001 - asserted below
                outcome["error"] = exc

        thread = threading.Thread(target=append_in_flight)
        thread.start()
        try:
            assert ops.entered.wait(30), "the writer never reached its fdatasync"
            with open(log_path, "rb") as fh:
                on_disk = fh.read()
            assert b"NOT DURABLE" in on_disk and len(on_disk) == size  # in the preallocated tail
            # The writer holds the file lock and its frame is complete in the file: the reader (a lock
            # timeout of NO_WAIT: waiting for the lock would raise Timeout) serves the committed items.
            assert _payloads(reader.recall(SITE, CID, 10)) == [{"n": 0}, {"n": 1}, {"n": 2}]
            assert reader.replay(SITE, CID, 3, 1) == []
            with Store(data, lock_timeout=NO_WAIT) as newcomer:  # no state yet: loads by the record
                assert _payloads(newcomer.recall(SITE, CID, 10)) == [{"n": 0}, {"n": 1}, {"n": 2}]
            assert thread.is_alive()  # all of it while the writer was still inside fdatasync
        finally:
            ops.proceed.set()
            thread.join(30)
        if fail is None:
            assert outcome["range"].first == 3
            assert _payloads(reader.replay(SITE, CID, 3, 1)) == [{"n": "NOT DURABLE"}]  # acknowledged now
        else:
            assert isinstance(outcome["error"], Io), outcome
            assert reader.append(SITE, CID, [{"n": "other"}]).first == 3  # the failed frame was cut
            assert _payloads(reader.replay(SITE, CID, 3, 1)) == [{"n": "other"}]
            assert _payloads(writer.replay(SITE, CID, 3, 1)) == [{"n": "other"}]


# ---------------------------------------------------------------------------------------------------------
# (b) A torn view of the log during a lock-free scan is never taken for damage.


class StaleScanOps(FileOps):
    """Once armed, the next read of more than a frame header starting at ``at`` returns its first ``stale``
    bytes as zeros: the page read before another process's write reached it."""

    def __init__(self) -> None:
        self.at: int | None = None
        self.stale = 0

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        data = super().pread(fd, size, offset)
        if self.at is not None and offset == self.at and size > 64:
            self.at = None
            data = bytes(min(self.stale, len(data))) + data[self.stale :]
        return data


def test_a_stale_page_during_a_lock_free_scan_is_never_reported_as_damage(tmp_path):
    data = str(tmp_path / "data")
    ops = StaleScanOps()
    with Store(data) as writer, Store(data, file_ops=ops, lock_timeout=NO_WAIT) as reader:
        writer.append(SITE, CID, [{"n": 0}])
        assert _seqs(reader.recall(SITE, CID, 10)) == [0]
        conv = reader._handles[(SITE, CID)]
        end = conv._files.state.end
        writer.append(SITE, CID, [{"n": 1}])  # at ``end``
        writer.append(SITE, CID, [{"n": 2}])  # a later write: zeros before it would look like a hole
        ops.at, ops.stale = end, 64
        lock = _held_lock(data)  # judging the torn view would need the lock: it is never asked for
        try:
            assert _seqs(reader.recall(SITE, CID, 10)) == [0, 1, 2]
        finally:
            lock.close()
        assert ops.at is None, "the stale view was never served to the scan"
        assert conv._files.state.corrupt is None
        assert reader.append(SITE, CID, [{"n": 3}]).first == 3


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


def test_commits_during_a_lock_free_scan_are_not_damage_and_are_seen_by_the_next_read(tmp_path):
    """The former race without a stale page: while the reader scans, another process commits twice. The
    scan stops at the commit point it read first (the later frames are served by the next read)."""
    data = str(tmp_path / "data")
    ops = HookOps()
    with Store(data) as a, Store(data, file_ops=ops, lock_timeout=NO_WAIT) as b:
        for k in range(5):
            a.append(SITE, CID, [{"k": k}])
        assert _seqs(b.recall(SITE, CID, 3)) == [2, 3, 4]
        a.append(SITE, CID, [{"k": "X0"}])  # acknowledged before B's read starts
        p = a._handles[(SITE, CID)]._files.state.end

        def two_commits() -> None:
            a.append(SITE, CID, [{"k": "X1"}])  # at p
            a.append(SITE, CID, [{"k": "X2"}])

        ops.target, ops.hook = b._handles[(SITE, CID)]._files.state.end, two_commits
        first = _seqs(b.recall(SITE, CID, 10))
        assert ops.hook is None, "the hook never ran"
        assert first[:6] == [0, 1, 2, 3, 4, 5] and first in ([0, 1, 2, 3, 4, 5], list(range(8)))
        assert _payloads(b.recall(SITE, CID, 3)) == [{"k": "X0"}, {"k": "X1"}, {"k": "X2"}]
        assert p < a._handles[(SITE, CID)]._files.state.end


# ---------------------------------------------------------------------------------------------------------
# (c) Damage judged under the lock is carried by the record: one verdict for every process.


def _frames(log_path: str):
    fd = os.open(log_path, os.O_RDONLY)
    try:
        return scan_log(OS_FILE_OPS, fd).frames
    finally:
        os.close(fd)


class LogReadsOps(PathOps):
    """Records ``(offset, size)`` of every read of the conversation's log."""

    def __init__(self) -> None:
        super().__init__()
        self.log_reads: list[tuple[int, int]] = []

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        if self.path_of(fd).endswith(".log"):
            self.log_reads.append((offset, size))
        return super().pread(fd, size, offset)


@pytest.mark.parametrize("index", ["index-removed", "index-intact"])
def test_damage_found_under_the_lock_is_reported_alike_by_every_store_until_fsck_repairs_it(tmp_path, index):
    data = str(tmp_path / "data")
    paths = conversation_paths(data, SITE, CID)
    with Store(data) as w:
        for k in range(3):
            w.append(SITE, CID, [{"k": k, "pad": "x" * 200}])
    frames = _frames(paths.log)
    assert len(frames) == 3
    bad = frames[1]
    with open(paths.log, "r+b") as fh:  # bit rot in the middle of frame 1 (its CRC no longer matches)
        fh.seek(bad.offset + bad.size // 2)
        byte = fh.read(1)
        fh.seek(bad.offset + bad.size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    if index == "index-removed":
        os.unlink(paths.index)  # recovery scans the log: it finds the damage on load
    # else the index anchors past the damage: a read of frame 1 finds it (and rescans under the lock)

    with Store(data) as a:
        assert _payloads(a.replay(SITE, CID, 0, 1)) == [{"k": 0, "pad": "x" * 200}]
        with pytest.raises(Corrupted) as first:
            a.replay(SITE, CID, 0, 10)
        assert first.value.offset == bad.offset
        record = _record(data)
        assert record is not None and record.damage is not None
        assert record.damage[0] == bad.offset and record.end == bad.offset and record.next_seq == 1

        ops = LogReadsOps()
        with Store(data, file_ops=ops, lock_timeout=NO_WAIT) as b:
            lock = _held_lock(data)  # B never takes the lock to read: it has nothing to judge
            try:
                with pytest.raises(Corrupted) as second:
                    b.recall(SITE, CID, 10)
                assert (second.value.offset, str(second.value)) == (first.value.offset, str(first.value))
                assert _payloads(b.replay(SITE, CID, 0, 1)) == [{"k": 0, "pad": "x" * 200}]
            finally:
                lock.close()
            # What B read of the log: the frames before the damage, never the damaged bytes.
            assert ops.log_reads and all(offset + size <= bad.offset for offset, size in ops.log_reads)
            with pytest.raises(Corrupted) as refused:
                b.append(SITE, CID, [{"k": "refused"}])
            assert refused.value.offset == bad.offset
        assert _record(data) == record
        with Store(data) as c:  # a newcomer's first operation is an append: the same verdict
            with pytest.raises(Corrupted) as refused:
                c.append(SITE, CID, [{"k": "refused"}])
            assert refused.value.offset == bad.offset
        assert _record(data) == record  # only a repair clears it

        with Store(data) as b:
            report = check(data, truncate_corrupt=True)
            assert report.count("error", fixed=True) >= 1 and report.count("error", fixed=False) == 0, report
            assert _record(data) is None  # invalidated before the cut
            for store in (a, b):
                assert _seqs(store.recall(SITE, CID, 10)) == [0]
            assert a.append(SITE, CID, [{"k": "after repair"}]).first == 1
            assert _payloads(b.replay(SITE, CID, 1, 10)) == [{"k": "after repair"}]
            assert b.append(SITE, CID, [{"k": "and another"}]).first == 2
            assert _seqs(a.recall(SITE, CID, 10)) == [0, 1, 2]
    record = _record(data)
    assert record is not None and record.damage is None


# ---------------------------------------------------------------------------------------------------------
# (d) A record from another boot is not trusted.


def test_a_record_from_another_boot_is_not_trusted(tmp_path):
    """The record is never fsynced: after a power loss it may be older than the log (or newer than what
    survived of it). A stale record that vouched for less than the log holds shows it: trusted, it would
    hide the last two batches."""
    data = str(tmp_path / "data")
    paths = conversation_paths(data, SITE, CID)
    with Store(data) as w:
        w.append(SITE, CID, [{"n": 0}])
        stale = _record(data)
        w.append(SITE, CID, [{"n": 1}])
        w.append(SITE, CID, [{"n": 2}])
    assert stale is not None and stale.boot == boot.boot_id()
    with open(paths.lock, "r+b") as fh:  # the record write of the last two commits was lost
        fh.write(encode(stale))
    os.unlink(paths.index)  # and the index (not fsynced either): nothing else says there is more
    simulate_reboot()

    lock = _held_lock(data)
    try:
        with Store(data, lock_timeout=NO_WAIT) as r:  # the record is another boot's: only the lock tells
            with pytest.raises(Exception) as waited:
                r.recall(SITE, CID, 10)
            assert type(waited.value).__name__ == "Timeout", waited.value
    finally:
        lock.close()
    with Store(data) as r:
        assert _seqs(r.recall(SITE, CID, 10)) == [0, 1, 2]
    record = _record(data)
    assert record is not None
    assert record.boot == boot.boot_id() != stale.boot  # rewritten in this boot
    assert (record.end, record.next_seq) == (_frames(paths.log)[-1].end, 3)
    assert record.epoch != stale.epoch  # the old boot's record vouched for nothing in this one
    with Store(data, lock_timeout=NO_WAIT) as r:
        lock = _held_lock(data)
        try:
            assert _seqs(r.recall(SITE, CID, 10)) == [0, 1, 2]  # trusted now: no lock needed
        finally:
            lock.close()


def test_a_record_names_its_log_by_inode_and_is_not_trusted_for_another_file(tmp_path):
    """A log replaced in place (a backup restored while the lock file stayed) is another file: the old
    log's record says nothing about it, however well its frames happen to match."""
    data = str(tmp_path / "data")
    paths = conversation_paths(data, SITE, CID)
    with Store(data) as w:
        for k in range(3):
            w.append(SITE, CID, [{"k": k}])
        older = _record(data)
        w.append(SITE, CID, [{"k": 3}])
        w.append(SITE, CID, [{"k": 4}])
    assert older is not None and older.ino == os.stat(paths.log).st_ino
    restored = paths.log + ".restored"
    with open(paths.log, "rb") as src, open(restored, "wb") as dst:
        dst.write(src.read())
    os.replace(restored, paths.log)  # same frames, another inode
    os.unlink(paths.index)
    with open(paths.lock, "r+b") as fh:  # the record of the old file, vouching for three batches
        fh.write(encode(older))
    lock = _held_lock(data)
    try:
        with Store(data, lock_timeout=NO_WAIT) as r:
            with pytest.raises(Exception) as waited:
                r.recall(SITE, CID, 10)
            assert type(waited.value).__name__ == "Timeout", waited.value
    finally:
        lock.close()
    with Store(data) as r:
        assert _seqs(r.recall(SITE, CID, 10)) == [0, 1, 2, 3, 4]
    record = _record(data)
    assert record is not None and record.ino == os.stat(paths.log).st_ino != older.ino


# ---------------------------------------------------------------------------------------------------------
# (e) Erasure invalidates the record.


def test_erasure_is_seen_at_once_by_a_store_that_had_the_conversation_open(tmp_path):
    data = str(tmp_path / "data")
    with Store(data) as a, Store(data) as b:
        for k in range(3):
            a.append(SITE, CID, [{"k": k}])
        assert _seqs(a.recall(SITE, CID, 10)) == [0, 1, 2]
        assert _seqs(b.recall(SITE, CID, 10)) == [0, 1, 2]
        assert erase_conversation(data, SITE, CID).had_log
        assert a.recall(SITE, CID, 10) == []  # its published state agreed with a record now gone
        assert b.replay(SITE, CID, 0, 10) == []
        assert _record(data) is None
        assert b.append(SITE, CID, [{"k": "new"}]).first == 0
        assert _payloads(a.recall(SITE, CID, 10)) == [{"k": "new"}]


# ---------------------------------------------------------------------------------------------------------
# (f) The seqlock: a reader's lock-free scan that a tool's cut overtakes serves none of what was cut.


class SeqlockOps(PathOps):
    """Once armed: after a read of the log at ``target`` (the lock-free scan), the next read of the commit
    point (the scan's second look at it) first runs ``hook``."""

    def __init__(self) -> None:
        super().__init__()
        self.target: int | None = None
        self.hook: Callable[[], None] | None = None
        self._scanned = False

    def map_shared(self, fd: int, size: int) -> None:
        return None  # every read of the record through ``pread``, where the hook sees it

    def pread(self, fd: int, size: int, offset: int) -> bytes:
        path = self.path_of(fd)
        if self.hook is not None and self._scanned and path.endswith(".lock"):
            hook, self.hook = self.hook, None
            hook()
        data = super().pread(fd, size, offset)
        if self.hook is not None and offset == self.target and size > 12 and path.endswith(".log"):
            self._scanned = True
        return data


def test_a_cut_during_a_lock_free_scan_is_never_served(tmp_path):
    data = str(tmp_path / "data")
    paths = conversation_paths(data, SITE, CID)
    ops = SeqlockOps()
    with Store(data) as w, Store(data, file_ops=ops, lock_timeout=5.0) as r:
        w.append(SITE, CID, [{"n": 0}])
        assert _seqs(r.recall(SITE, CID, 10)) == [0]
        end = r._handles[(SITE, CID)]._files.state.end
        w.append(SITE, CID, [{"n": "cut 1"}])
        w.append(SITE, CID, [{"n": "cut 2"}])

        def tool_cuts_then_writer_appends() -> None:
            # What a repair does (fsck's _cut_log): under the lock, invalidate, then cut.
            lock = _held_lock(data)
            try:
                commit_point.invalidate(OS_FILE_OPS, paths.lock)
                fd = os.open(paths.log, os.O_RDWR)
                try:
                    os.ftruncate(fd, end)
                    os.fsync(fd)
                finally:
                    os.close(fd)
            finally:
                lock.close()
            w.append(SITE, CID, [{"n": "other"}])  # seq 1 again, in a new epoch

        ops.target, ops.hook = end, tool_cuts_then_writer_appends
        got = r.recall(SITE, CID, 10)
        assert ops.hook is None, "the hook never ran"
        assert _payloads(got) == [{"n": 0}, {"n": "other"}], got
        assert _payloads(r.recall(SITE, CID, 10)) == [{"n": 0}, {"n": "other"}]


# ---------------------------------------------------------------------------------------------------------
# (g) The codec.

POINT = CommitPoint(b"B" * 16, b"E" * 8, 12345, 4096, 77)
DAMAGED = POINT._replace(damage=(2048, "bad-crc"))


@pytest.mark.parametrize("point", [POINT, DAMAGED], ids=["clean", "damaged"])
def test_codec_round_trip_whole_prefixes_and_trailing_bytes(point):
    raw = encode(point)
    assert len(raw) == RECORD_SIZE == 84
    assert decode(raw) == point
    assert decode(raw + b"\xff" * 100) == point  # a lock file longer than the record
    for n in range(RECORD_SIZE):  # fed byte by byte: no prefix is a record
        assert decode(raw[:n]) is None, n


def test_codec_rejects_torn_corrupt_invalidated_and_unknown_records():
    raw = encode(DAMAGED)
    other = encode(POINT._replace(end=8192, next_seq=99))
    for cut in range(1, RECORD_SIZE):  # a record torn by a concurrent write: half of each
        torn = raw[:cut] + other[cut:]
        if torn not in (raw, other):
            assert decode(torn) is None, cut
    for k in range(RECORD_SIZE):  # any one flipped byte: magic, fields or CRC
        flipped = bytearray(raw)
        flipped[k] ^= 0x01
        assert decode(bytes(flipped)) is None, k
    assert decode(NO_RECORD) is None and bytes(RECORD_SIZE) == NO_RECORD
    assert decode(b"") is None
    # Another version, with a valid CRC: not ours to read.
    from crc32c import crc32c

    body = bytearray(raw[:80])
    body[4] = commit_point.VERSION + 1
    assert decode(bytes(body) + crc32c(bytes(body)).to_bytes(4, "little")) is None
    assert decode(bytes(raw[:80]) + crc32c(raw[:80]).to_bytes(4, "little")) == DAMAGED  # the same, checked


def test_codec_reason_is_ascii_and_bounded_and_trust_needs_this_boot_and_log():
    long = POINT._replace(damage=(1, "x" * 40))
    assert decode(encode(long)) == POINT._replace(damage=(1, "x" * 16))
    assert decode(encode(POINT._replace(damage=(5, "")))) == POINT  # no reason: no damage
    here = POINT._replace(boot=boot.boot_id())
    assert here.trusted_for(12345)
    assert not here.trusted_for(12346)
    assert not POINT.trusted_for(12345)  # another boot's
