"""The freshness decision table (logstore/file/log/freshness.py), row by row, and the observations it is
fed: ``past_in`` on whole, cut and trailing bytes, ``observe_locked`` on real files (longer, shorter,
zero tail, a dead writer's frame, a replaced path, known damage). Then the table through ``LogFiles``:
each row's situation built on disk and the action the engine took (served, took in, loaded, recovered)."""

from __future__ import annotations

import itertools
import os
from dataclasses import replace

import pytest

from logstore import Store
from logstore.file.durable_dirs import DurableDirs
from logstore.file.fileio import FileOps
from logstore.file.layout import conversation_paths
from logstore.file.locking import PathLock
from logstore.file.log.commit_point import NO_RECORD, PointFile, write_raw
from logstore.file.log.files import LogFiles
from logstore.file.log.frame import PREFIX_SIZE, encode_frame, encode_items
from logstore.file.log.freshness import Action, Past, Record, decide, observe_locked, past_end, past_in
from logstore.file.log.recovery import EMPTY_STATE

SITE, CID = "site-a", "conv-fresh-01"

# The table, as docs and the decide() docstring state it: (record, named, past) -> (unlocked, locked).
# None matches any value.
ROWS = [
    ({Record.NONE, Record.OTHER}, None, None, Action.LOAD, Action.RECOVER),
    ({Record.SAME}, False, None, Action.LOAD, Action.RECOVER),
    ({Record.SAME}, True, {Past.FRAME}, Action.SETTLE, Action.RECOVER),
    ({Record.SAME}, True, {Past.NOTHING, Past.UNSEEN}, Action.SERVE, Action.SERVE),
]


def _expected(record: Record, named: bool, past: Past, locked: bool) -> Action:
    hits = [
        row
        for row in ROWS
        if record in row[0] and row[1] in (None, named) and (row[2] is None or past in row[2])
    ]
    assert len(hits) == 1, (record, named, past, hits)  # the rows cover every case exactly once
    return hits[0][4] if locked else hits[0][3]


@pytest.mark.parametrize(
    "record,named,past,locked", list(itertools.product(Record, (True, False), Past, (True, False)))
)
def test_every_combination_decides_as_its_row(record, named, past, locked):
    expected = _expected(record, named, past, locked)
    assert decide(locked=locked, record=record, named=named, past=past) is expected


def test_a_reader_without_the_lock_never_recovers_and_a_locked_refresh_never_settles():
    cases = list(itertools.product(Record, (True, False), Past))
    assert Action.RECOVER not in {decide(locked=False, record=r, named=n, past=p) for r, n, p in cases}
    assert Action.SETTLE not in {decide(locked=True, record=r, named=n, past=p) for r, n, p in cases}


# ---------------------------------------------------------------------------------------------------------
# Observations


def _frame(first_seq: int, write_start: int, recorded_at: int = 1_700_000_000_000_000) -> bytes:
    items = [b'{"n": "dead writer"}']
    return encode_frame(
        first_seq=first_seq,
        count=1,
        recorded_at=recorded_at,
        write_start=write_start,
        encoded_items=encode_items(items),
    )


FRAME = _frame(5, 4096)


@pytest.mark.parametrize(
    "prefix,past",
    [
        (b"", Past.NOTHING),  # the file ends there
        (bytes(PREFIX_SIZE), Past.NOTHING),  # a v2 log's unused tail
        (bytes(3), Past.NOTHING),  # a short zero tail
        (FRAME[:PREFIX_SIZE], Past.FRAME),
        (bytes(PREFIX_SIZE - 1) + b"\x01", Past.FRAME),  # anything not zero may be a writer's bytes
    ],
)
def test_past_in_whole_and_cut_prefixes(prefix, past):
    assert past_in(prefix) is past


def test_past_in_fed_a_frame_byte_by_byte_and_with_trailing_bytes():
    for k in range(1, PREFIX_SIZE + 1):
        assert past_in(FRAME[:k]) is Past.FRAME
    assert past_in(FRAME) is Past.FRAME  # more than the prefix: the same answer


def _preallocated_log(tmp_path) -> tuple[str, int]:
    """A conversation's log with one frame and its preallocated zero tail; returns (path, end)."""
    data = str(tmp_path / "data")
    with Store(data) as store:
        store.append(SITE, CID, [{"n": 0}])
        path = conversation_paths(data, SITE, CID).log
        end = store._handles[(SITE, CID)]._files.state.end
    with open(path, "r+b") as f:  # a clean close trimmed the tail: preallocate it again, as a writer does
        f.truncate(end + 65536)
    return path, end


def test_observe_locked_zero_tail_frame_damage_shorter_and_replaced(tmp_path):
    ops = FileOps()
    path, end = _preallocated_log(tmp_path)
    size = os.path.getsize(path)
    fd = ops.open(path, os.O_RDWR)
    try:
        file_id = ops.file_id(fd)
        state = replace(EMPTY_STATE, end=end)
        assert observe_locked(ops, fd, path, file_id, state) == (size, Past.NOTHING)
        assert past_end(ops, fd, end) is Past.NOTHING
        ops.pwrite(fd, _frame(1, end), end)  # a writer that died before its commit point
        assert observe_locked(ops, fd, path, file_id, state) == (size, Past.FRAME)
        assert past_end(ops, fd, end) is Past.FRAME
        damaged = replace(state, corrupt=(end, "bad-crc"))
        assert observe_locked(ops, fd, path, file_id, damaged) == (size, Past.UNSEEN)  # never read
        beyond = replace(state, end=size + 10)  # the file is shorter than the state: nothing to read
        assert observe_locked(ops, fd, path, file_id, beyond) == (size, Past.NOTHING)
        os.rename(path, path + ".old")
        with open(path, "wb"):
            pass
        assert observe_locked(ops, fd, path, file_id, state) == (None, Past.UNSEEN)  # not named
    finally:
        ops.close(fd)


# ---------------------------------------------------------------------------------------------------------
# The table through LogFiles: each row's situation built on disk, and what the engine did.


class CountingOps(FileOps):
    """Counts loads: every load, with or without the file lock, opens the log again."""

    def __init__(self) -> None:
        self.loads = 0

    def open(self, path: str, flags: int, mode: int = 0o644) -> int:
        if path.endswith(".log"):
            self.loads += 1
        return super().open(path, flags, mode)


def _invalidate(files: LogFiles) -> None:
    fd = os.open(files.paths.lock, os.O_RDWR)
    try:
        write_raw(FileOps(), fd, NO_RECORD)
    finally:
        os.close(fd)


def _bump(files: LogFiles) -> None:
    """What every holder of the flock does before it changes the log without moving the record (the
    change counter: ``commit_point``). Without it the holder that left the flock trusts its state."""
    fd = os.open(files.paths.lock, os.O_RDWR)
    point = PointFile(FileOps(), fd)
    try:
        point.bump()
    finally:
        point.close()


def test_the_rows_through_log_files(tmp_path):
    data = str(tmp_path / "data")
    writer = Store(data)
    writer.append(SITE, CID, [{"n": 0}])
    ops = CountingOps()
    files = LogFiles(ops, conversation_paths(data, SITE, CID), DurableDirs(ops))
    lock = PathLock(files.paths.lock)
    try:
        # NONE, no lock: LOAD (what the commit point vouches for).
        assert files.refresh_unlocked() and ops.loads == 1 and files.state.next_seq == 1
        # SAME: SERVE, nothing read but the record.
        assert files.refresh_unlocked() and ops.loads == 1
        # MOVED: TAKE_IN another process's commit, no load.
        writer.append(SITE, CID, [{"n": 1}])
        assert files.refresh_unlocked() and ops.loads == 1 and files.state.next_seq == 2
        writer.close()
        # OTHER (a tool invalidated the record), no lock: LOAD, which cannot tell: the caller recovers.
        _invalidate(files)
        assert not files.refresh_unlocked() and ops.loads == 2
        lock.acquire(5)
        try:
            # OTHER with the lock: RECOVER (a load), which writes a new record.
            files.refresh_locked()
            assert ops.loads == 3 and files.state.next_seq == 2
            # SAME, the path names our file, nothing past the end: SERVE.
            files.refresh_locked()
            assert ops.loads == 3
            # SAME, a dead writer's frame past the end: RECOVER, which takes it in.
            end = files.state.end
            _bump(files)
            with open(files.paths.log, "r+b") as f:
                f.seek(end)
                f.write(_frame(2, end, files.state.last_at or 0))
            files.refresh_locked()
            assert ops.loads == 4 and files.state.next_seq == 3
            # SAME, but the path names another file (a copy put in place): RECOVER from the new file.
            with open(files.paths.log, "rb") as f:
                copy = f.read()
            with open(files.paths.log + ".new", "wb") as f:
                f.write(copy)
            _bump(files)
            os.replace(files.paths.log + ".new", files.paths.log)
            files.refresh_locked()
            assert ops.loads == 5 and files.state.next_seq == 3
            # The same without the counter's bump: the holder trusts what it left (no syscall).
            with open(files.paths.log, "r+b") as f:
                f.seek(files.state.end)
                f.write(_frame(3, files.state.end, files.state.last_at or 0))
            files.refresh_locked()
            assert ops.loads == 5 and files.state.next_seq == 3
            _bump(files)
            files.refresh_locked()
            assert ops.loads == 6 and files.state.next_seq == 4
        finally:
            lock.release()
    finally:
        files.close()
        lock.close()
        writer.close()
