"""A writer knows its own failed write by its bytes and the commit point, never by an offset alone
(issue 33 §3; logstore/file/log/tail.py, ``LogFiles.load_locked``).

After a failed write (or its ``fdatasync``) the writer cuts the file back to its acknowledged end. If
that cleanup fails too, the failed frames may still read back from the page cache although the disk
never got them (fsyncgate), so the writer remembers them and cuts them before anything is built on
them. The bug: it recognised them by ``write_start == offset`` alone. When the truncate had taken effect
(only its ``fdatasync`` failed), another owner appended at that very offset and was acknowledged; the
failed writer's next commit took that frame for its own failed write, cut it and wrote the same seq:
two acknowledgements of one seq, the other owner's batch gone, fsck clean.

Each test: two lock owners (a second ``Store``, or a real subprocess), ``LogFaults`` failing the exact
calls, an oracle of acknowledged batches (seq -> payload), then every reader, a fresh store and fsck.
"""

from __future__ import annotations

import os
import random
import threading
from contextlib import AbstractContextManager

import pytest

from logstore import Store
from logstore.core.errors import Io, Timeout, Unavailable
from logstore.core.models import SeqRange
from logstore.file import boot
from logstore.file.fileio import OS_FILE_OPS
from logstore.file.layout import conversation_paths
from logstore.file.log import conversation
from logstore.file.log.commit_point import RECORD_SIZE, CommitPoint, decode
from logstore.file.log.scanner import scan_log
from logstore.file.log.tail import FailedWrite, cut_own_failed_write
from logstore.fsck.check import check
from tests.cross_process_support import LogFaults, RemoteStore
from tests.test_read_dead_writer import KillAfterLogSync, Killed

SITE, CID = "site-a", "failed-write-01"
# What an injected fault may cost an operation (a lock wait on a busy machine, a read retried too often);
# anything else (Corrupted above all) fails the stress test.
_RETRYABLE = (Io, Timeout, Unavailable)


class Acked:
    """The oracle: every acknowledged batch by its seq range; no seq acknowledged twice."""

    def __init__(self) -> None:
        self.by_seq: dict[int, object] = {}

    def add(self, got, items: list[dict]) -> None:
        assert got.last - got.first + 1 == len(items)
        for k, item in enumerate(items):
            assert got.first + k not in self.by_seq, f"seq {got.first + k} acknowledged twice"
            self.by_seq[got.first + k] = item

    def assert_held_by(self, items) -> None:
        served = {item.seq: item.payload for item in items}
        for seq, payload in self.by_seq.items():
            assert served.get(seq) == payload, f"acknowledged seq {seq}: {served.get(seq)!r}, not {payload!r}"
        assert [item.seq for item in items] == list(range(len(items)))  # gapless


def _log(data: str) -> str:
    return conversation_paths(data, SITE, CID).log


def _record_end(data: str) -> int:
    with open(conversation_paths(data, SITE, CID).lock, "rb") as fh:
        point = decode(fh.read(RECORD_SIZE))
    assert point is not None
    return point.end


def _frame_seq_at(data: str, offset: int) -> int:
    fd = os.open(_log(data), os.O_RDONLY)
    try:
        frames = scan_log(OS_FILE_OPS, fd).frames
    finally:
        os.close(fd)
    (seq,) = [f.first_seq for f in frames if f.offset == offset]
    return seq


def _other(data: str, kind: str) -> AbstractContextManager:
    return Store(data) if kind == "store" else RemoteStore(f"file:{data}")


def _assert_consistent(data: str, acked: Acked, *, extra: int = 0) -> None:
    """A fresh store serves every acknowledged batch at its seqs (plus ``extra`` items of failed appends
    that were taken in, outcome unknown), and fsck finds nothing."""
    with Store(data) as fresh:
        items = fresh.replay(SITE, CID, 0, 1000)
    acked.assert_held_by(items)
    assert len(items) == len(acked.by_seq) + extra
    report = check(data)
    assert report.exit_code == 0, report


def _start(a: Store, acked: Acked) -> None:
    for n in range(2):
        items = [{"by": "a", "n": n}]
        acked.add(a.append(SITE, CID, items), items)


def test_the_harness_fails_only_a_logs_calls_in_the_planned_order(tmp_path):
    """``LogFaults``: a journal's, an index's or a lock file's call never takes a planned fault (a
    manifest sweep runs beside the store); the log's calls named in the plan fail in its order, a torn
    ``pwrite`` leaves exactly ``torn`` bytes, and with the plan spent everything passes."""
    ops = LogFaults()
    ops.plan, ops.torn = ["pwrite", "ftruncate", "fdatasync"], 3
    other = os.open(tmp_path / "journal.1", os.O_RDWR | os.O_CREAT)
    log = os.open(tmp_path / "x.log", os.O_RDWR | os.O_CREAT)
    try:
        for call in (lambda fd: ops.pwrite(fd, b"abcdef", 0), lambda fd: ops.ftruncate(fd, 1)):
            call(other)
        ops.fdatasync(log)  # not the plan's next call: passes
        ops.fdatasync(other)
        with pytest.raises(OSError):
            ops.pwrite(log, b"abcdef", 0)
        assert os.pread(log, 100, 0) == b"abc" and ops.failed_writes == [b"abcdef"]
        with pytest.raises(OSError):
            ops.ftruncate(log, 0)
        assert os.fstat(log).st_size == 3  # a failed ftruncate changes nothing
        with pytest.raises(OSError):
            ops.fdatasync(log)
        assert ops.injected == ["pwrite", "ftruncate", "fdatasync"] and ops.plan == []
        ops.pwrite(log, b"xyz", 3)
        ops.ftruncate(log, 5)
        ops.fdatasync(log)
        assert os.pread(log, 100, 0) == b"abcxy" and os.pread(other, 100, 0) == b"a"
    finally:
        os.close(other)
        os.close(log)


@pytest.mark.parametrize("other", ["store", "process"])
def test_a_failed_write_whose_truncate_took_effect_never_cuts_another_owners_acknowledged_frame(
    tmp_path, other
):
    """The issue's case: A's fdatasync fails, its cut-back truncate takes effect and the truncate's
    fdatasync fails. B appends at the offset A's failed write began and is acknowledged. A's next
    append must come after B's batch, not over it."""
    data = str(tmp_path / "data")
    ops, acked = LogFaults(), Acked()
    with Store(data, file_ops=ops) as a, _other(data, other) as b:
        _start(a, acked)
        cut = _record_end(data)
        ops.plan = ["fdatasync", "fdatasync"]
        with pytest.raises(Io):
            a.append(SITE, CID, [{"by": "a", "failed": True}])
        assert ops.injected == ["fdatasync", "fdatasync"]
        assert os.path.getsize(_log(data)) == cut  # the truncate took effect; its fdatasync did not
        items = [{"by": "b"}]
        got = b.append(SITE, CID, items)
        acked.add(got, items)
        assert _frame_seq_at(data, cut) == got.first == 2  # where A's failed write began
        items = [{"by": "a", "n": 2}]
        acked.add(a.append(SITE, CID, items), items)
        acked.assert_held_by(a.replay(SITE, CID, 0, 100))
        acked.assert_held_by(b.replay(SITE, CID, 0, 100))
    _assert_consistent(data, acked)


@pytest.mark.parametrize("identical", [False, True], ids=["other-bytes", "identical-bytes"])
def test_a_torn_failed_write_never_cuts_the_acknowledged_frame_written_where_it_began(
    tmp_path, monkeypatch, identical
):
    """A's pwrite is torn (a short write, then EIO) and its cut-back truncate fails: the torn bytes stay.
    B's recovery truncates them as a torn tail and B appends there, acknowledged. Even when B's frame is
    byte for byte the frame A failed to write (the same items, the clock stuck at one microsecond), it
    is B's acknowledged batch: the commit point vouches for it, and A's next append goes after it."""
    if identical:
        monkeypatch.setattr(conversation, "_now_us", lambda: 1_800_000_000_000_000)
    data = str(tmp_path / "data")
    ops, acked = LogFaults(), Acked()
    with Store(data, file_ops=ops) as a, Store(data) as b:
        _start(a, acked)
        cut = _record_end(data)
        ops.plan, ops.torn = ["pwrite", "ftruncate"], 20
        failed = [{"by": "a", "failed": True}]
        with pytest.raises(Io):
            a.append(SITE, CID, failed)
        assert ops.injected == ["pwrite", "ftruncate"]
        items = failed if identical else [{"by": "b"}]
        got = b.append(SITE, CID, items)
        acked.add(got, items)
        assert _frame_seq_at(data, cut) == got.first == 2
        (attempt,) = ops.failed_writes
        with open(_log(data), "rb") as fh:
            fh.seek(cut)
            assert (fh.read(len(attempt)) == attempt) is identical
        items = [{"by": "a", "n": 2}]
        acked.add(a.append(SITE, CID, items), items)
        acked.assert_held_by(a.replay(SITE, CID, 0, 100))
        acked.assert_held_by(b.replay(SITE, CID, 0, 100))
    _assert_consistent(data, acked)


@pytest.mark.parametrize("then", ["reads", "appends"])
def test_a_failed_write_another_owner_took_in_is_left_alone(tmp_path, then):
    """A's fdatasync fails and its cut-back truncate fails: the failed frame stays in the file. B takes
    it in first (a read's settle or its own commit's recovery: it cannot tell it from a dead writer's
    durable frame) and the commit point vouches for it. From then on it is part of the log every reader
    may have been served: A's next append goes after it, never over it (the failed append's outcome was
    unknown: its batch is stored once)."""
    data = str(tmp_path / "data")
    ops, acked = LogFaults(), Acked()
    failed = [{"by": "a", "failed": True}]
    with Store(data, file_ops=ops) as a, Store(data) as b:
        _start(a, acked)
        cut = _record_end(data)
        ops.plan = ["fdatasync", "ftruncate"]
        with pytest.raises(Io):
            a.append(SITE, CID, failed)
        if then == "reads":
            seen = b.replay(SITE, CID, 0, 100)
        else:
            items = [{"by": "b"}]
            acked.add(b.append(SITE, CID, items), items)
            seen = b.replay(SITE, CID, 0, 100)
        assert [i.payload for i in seen][2] == failed[0]  # B took it in: vouched for
        assert _record_end(data) > cut
        items = [{"by": "a", "n": 2}]
        got = a.append(SITE, CID, items)
        acked.add(got, items)
        assert got.first == len(seen)
        for reader in (a, b):
            served = reader.replay(SITE, CID, 0, 100)
            assert served[: len(seen)] == seen  # what B was served stays true
            acked.assert_held_by(served)
    _assert_consistent(data, acked, extra=1)


@pytest.mark.parametrize("first", ["append", "read", "close"])
def test_a_failed_write_nobody_took_in_is_cut_by_its_writer_before_anything_is_built_on_it(tmp_path, first):
    """A's fdatasync and its cut-back truncate fail, and no other owner comes: the failed frame, past
    the commit point and byte for byte A's, is cut by A under the lock before anything takes it in -
    before its next append, before a read of its own would serve it (no reader ever saw it), or when it
    closes the conversation (what it remembers goes with it)."""
    data = str(tmp_path / "data")
    ops, acked = LogFaults(), Acked()
    a = Store(data, file_ops=ops)
    try:
        _start(a, acked)
        cut = _record_end(data)
        ops.plan = ["fdatasync", "ftruncate"]
        with pytest.raises(Io):
            a.append(SITE, CID, [{"by": "a", "failed": True}])
        assert os.path.getsize(_log(data)) > cut  # the failed frame is still there
        if first == "read":
            acked.assert_held_by(a.replay(SITE, CID, 0, 100))  # not the failed batch
            assert os.path.getsize(_log(data)) == cut == _record_end(data)
        if first == "close":
            a.close()  # trims the unused tail too: the file ends at the last acknowledged frame
            assert os.path.getsize(_log(data)) == cut == _record_end(data)
            a = Store(data, file_ops=ops)
        items = [{"by": "a", "n": 2}]
        got = a.append(SITE, CID, items)
        acked.add(got, items)
        assert got.first == 2 and _frame_seq_at(data, cut) == 2
        acked.assert_held_by(a.replay(SITE, CID, 0, 100))
    finally:
        a.close()
    _assert_consistent(data, acked)


def test_the_harness_fails_log_calls_at_random_only_with_the_plan_spent(tmp_path):
    """``LogFaults(rate=...)``: with a plan pending only the plan acts; then log calls fail at about the
    rate (seeded), a failed ``pwrite`` leaves a prefix of its data, and other files never fail."""
    ops = LogFaults(rate=0.5, rng=random.Random(3))
    ops.plan = ["ftruncate"]
    other = os.open(tmp_path / "x.idx", os.O_RDWR | os.O_CREAT)
    log = os.open(tmp_path / "x.log", os.O_RDWR | os.O_CREAT)
    try:
        ops.fdatasync(log)  # the plan waits for an ftruncate: no random fault meanwhile
        with pytest.raises(OSError):
            ops.ftruncate(log, 0)
        failed = 0
        for k in range(400):
            ops.fdatasync(other)  # never fails
            os.ftruncate(log, 0)
            data = b"%04d" % k
            try:
                ops.pwrite(log, data, 0)
            except OSError:
                failed += 1
                assert data.startswith(os.pread(log, 4, 0))  # a prefix, maybe empty
            else:
                assert os.pread(log, 4, 0) == data
        assert 150 < failed < 250 and len(ops.failed_writes) == failed
        assert ops.injected.count("pwrite") == failed and ops.injected[0] == "ftruncate"
    finally:
        os.close(other)
        os.close(log)


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_two_owners_under_random_log_io_errors_never_lose_or_double_an_acknowledged_batch(tmp_path, seed):
    """Two lock owners append to and read one conversation while 15% of their log writes, fdatasyncs and
    truncates fail (seeded; a failed pwrite leaves a random prefix). After each failure the owner lets the
    other go first (one operation, waited for as an event): the other then works on what the failure
    left, before the failed writer's next commit - the issue's schedule. The oracle: no seq acknowledged
    twice, every acknowledged batch at its seqs in the end, every item there acknowledged or of a failed
    append (outcome unknown) and stored once, every read a prefix-consistent view of the end state (a
    frame once served is never cut), fsck clean."""
    data = str(tmp_path / "data")
    with Store(data):
        pass  # the data dir and its secret exist before two stores open it at once
    results: dict[str, list] = {"a": [], "b": []}
    errors: list[BaseException] = []
    turn = threading.Condition()
    progress, waiting, done = {"a": 0, "b": 0}, set(), set()

    def let_the_other_go_first(who: str) -> None:
        other = "b" if who == "a" else "a"
        with turn:
            if other in waiting or other in done:
                return  # it is waiting for us (or finished): never both wait
            waiting.add(who)
            seen = progress[other]
            assert turn.wait_for(lambda: progress[other] > seen or other in done, timeout=120)
            waiting.discard(who)

    def one_op(who: str, store: Store, rng: random.Random, k: int) -> bool:
        """One read or append; True if it failed."""
        if rng.random() < 0.3:
            try:
                items = store.replay(SITE, CID, 0, 1000)
            except _RETRYABLE:
                return True
            results[who].append(("read", [(i.seq, i.payload) for i in items]))
            return False
        payload = {"by": who, "k": k}
        try:
            got = store.append(SITE, CID, [payload])
        except _RETRYABLE:
            results[who].append(("failed", payload))
            return True
        results[who].append(("acked", got.first, payload))
        return False

    def run(who: str, store: Store, rng: random.Random) -> None:
        try:
            for k in range(150):
                failed = one_op(who, store, rng, k)
                with turn:
                    progress[who] += 1
                    turn.notify_all()
                if failed:
                    let_the_other_go_first(who)
        except BaseException as exc:  # noqa: BLE001 - re-raised in the test's thread
            errors.append(exc)
        finally:
            with turn:
                done.add(who)
                turn.notify_all()

    ops = {who: LogFaults(rate=0.15, rng=random.Random(seed * 10 + n)) for n, who in enumerate("ab")}
    with Store(data, file_ops=ops["a"]) as a, Store(data, file_ops=ops["b"]) as b:
        threads = [
            threading.Thread(target=run, args=(who, store, random.Random(seed * 100 + n)))
            for n, (who, store) in enumerate((("a", a), ("b", b)))
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    assert not errors, errors
    assert all(o.injected for o in ops.values())
    acked, failed = Acked(), []
    for outcome in results["a"] + results["b"]:
        if outcome[0] == "acked":
            acked.add(SeqRange(outcome[1], outcome[1]), [outcome[2]])
        elif outcome[0] == "failed":
            failed.append(outcome[1])
    with Store(data) as fresh:
        items = fresh.replay(SITE, CID, 0, 1000)
    acked.assert_held_by(items)
    final = [(i.seq, i.payload) for i in items]
    stored = [payload for _, payload in final]
    assert all(p in acked.by_seq.values() or p in failed for p in stored)
    assert len({(p["by"], p["k"]) for p in stored}) == len(stored)  # no batch stored twice
    for outcome in results["a"] + results["b"]:
        if outcome[0] == "read":
            assert outcome[1] == final[: len(outcome[1])], "a frame once served was cut or replaced"
    assert check(data).exit_code == 0


_OURS = bytes(range(1, 31)) + bytes(range(101, 141))  # two frames' bytes: 30 + 40
_EPOCH = b"epoch-01"


@pytest.mark.parametrize(
    ("case", "end", "cut"),
    [
        ("ours", 170, True),  # every frame of the failed write, nothing vouched for past 100
        ("ours", 130, True),  # a torn write: its complete first frame
        ("ours", 100, False),  # nothing good past the record: a torn tail, recovery's to cut
        ("ours", 200, False),  # more good frames than the failed write wrote: not all ours
        ("other bytes", 170, False),  # another writer's frames there (it died before its record)
        ("other epoch", 170, False),  # a repair or an erasure since: nothing of ours to know
        ("other boot", 170, False),
        ("no record", 170, False),
        ("vouched", 170, False),  # another process took them in: the record ends past 100
    ],
)
def test_cut_own_failed_write_cuts_only_its_own_unvouched_bytes(tmp_path, caplog, case, end, cut):
    """The rule in ``tail.cut_own_failed_write``, case by case, on a log of 100 acknowledged bytes with
    the failed write's 70 bytes after them."""
    path = tmp_path / "x.log"
    tail_bytes = bytes(70) if case == "other bytes" else _OURS
    path.write_bytes(b"a" * 100 + (tail_bytes + b"z" * 30 if end == 200 else tail_bytes))
    fd = os.open(path, os.O_RDWR)
    try:
        ino = os.fstat(fd).st_ino
        point: CommitPoint | None = CommitPoint(
            os.urandom(16) if case == "other boot" else boot.boot_id(),
            b"epoch-02" if case == "other epoch" else _EPOCH,
            ino,
            130 if case == "vouched" else 100,
            5,
        )
        if case == "no record":
            point = None
        failed = FailedWrite(_EPOCH, 100, _OURS)
        size = os.fstat(fd).st_size
        assert cut_own_failed_write(OS_FILE_OPS, fd, failed, point, ino=ino, end=end, path="x.log") is cut
        assert os.fstat(fd).st_size == (100 if cut else size)
        assert ("leaving it" in caplog.text) is (case == "vouched")
    finally:
        os.close(fd)


def test_a_dead_writers_frame_whose_adoption_failed_is_cut_not_taken_in_by_a_retry(tmp_path):
    """Recovery takes in a dead writer's frame (past the record, never acknowledged) by fdatasyncing it
    first. If that fdatasync fails and so does the cut back, the frame is a failed write of the
    recovering process: a later recovery's fdatasync may succeed without writing it (fsyncgate), so the
    retry cuts it instead of vouching for it, and the next append takes its seq."""
    data = str(tmp_path / "data")
    killer, ops = KillAfterLogSync(), LogFaults()
    reader, writer = Store(data, file_ops=ops), Store(data, file_ops=killer)
    try:
        reader.append(SITE, CID, [{"n": 0}])
        writer.append(SITE, CID, [{"n": 1}])
        assert [i.seq for i in reader.recall(SITE, CID, 10)] == [0, 1]
        killer.armed = True
        with pytest.raises(Killed):
            writer.append(SITE, CID, [{"n": "stored, never acknowledged"}])
        cut = _record_end(data)
        ops.plan = ["fdatasync", "ftruncate"]
        with pytest.raises(Io):
            reader.replay(SITE, CID, 0, 10)  # the settle's recovery: its fdatasync and its cut fail
        assert ops.injected == ["fdatasync", "ftruncate"] and _record_end(data) == cut
        assert [i.payload for i in reader.replay(SITE, CID, 0, 10)] == [{"n": 0}, {"n": 1}]
        assert os.path.getsize(_log(data)) == cut == _record_end(data)
        assert reader.append(SITE, CID, [{"n": 2}]).first == 2
    finally:
        reader.close()
        writer.close()
    with Store(data) as fresh:
        assert [i.payload for i in fresh.replay(SITE, CID, 0, 10)] == [{"n": 0}, {"n": 1}, {"n": 2}]
    assert check(data).exit_code == 0
