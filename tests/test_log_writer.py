"""The append path's fast paths give exactly what the general code gives (issue 12, P1-cpu): the
single-request ``encode_group``, the state ``committed`` builds field by field, and
``FileOps.pwrite``'s one call that still continues a short write, and the index lag remembered
between appends."""

from __future__ import annotations

import dataclasses
import os

import pytest

from logstore.core.errors import ConversationFull
from logstore.core.limits import MAX_CONVERSATION_ITEMS
from logstore.file.durable_dirs import DurableDirs
from logstore.file.fileio import FileOps
from logstore.file.log.group_commit import AppendRequest
from logstore.file.log.index_codec import encode_entry
from logstore.file.log.recovery import LogState
from logstore.file.log.seq_index import LAG_BYTES, LAG_FRAMES, SidecarIndex
from logstore.file.log.writer import committed, encode_group, preallocated, write_group

ITEMS = b'{"k":1,"text":"' + b"x" * 180 + b'"}'


def _req(count: int = 1) -> AppendRequest:
    return AppendRequest(b"".join([ITEMS] * count), count)


@pytest.mark.parametrize("last_at", [None, 5, 10, 99])  # empty log, older, same and newer last time
@pytest.mark.parametrize("version", [1, 2])
def test_one_request_encodes_as_the_first_of_a_group(last_at, version):
    kw = dict(next_seq=7, write_start=1234, now=10, last_at=last_at, version=version)
    one = encode_group([_req(3)], **kw)
    group = encode_group([_req(3), _req(2)], **kw)  # the general loop
    assert one is not None and group is not None
    n = len(one.data)
    assert one.data == group.data[:n]
    assert one.end == 1234 + n and one.next_seq == 10 and one.write_start == 1234
    assert one.entries == group.entries[: len(one.entries)] and len(one.entries) * 2 == len(group.entries)
    assert one.first_at == one.last_at == group.first_at == (10 if last_at is None else max(10, last_at))
    assert [seq for _, seq in one.accepted] == [7]


def test_one_request_past_the_item_limit_is_refused_like_in_a_group():
    req = _req(2)
    assert (
        encode_group(
            [req], next_seq=MAX_CONVERSATION_ITEMS - 1, write_start=0, now=1, last_at=None, version=2
        )
        is None
    )
    assert req.done and isinstance(req.error, ConversationFull)
    assert (req.error.stored, req.error.requested) == (MAX_CONVERSATION_ITEMS - 1, 2)


class _NoSync(FileOps):
    def __init__(self) -> None:
        self.writes: list[tuple[bytes, int]] = []

    def pwrite(self, fd: int, data: bytes | memoryview, offset: int) -> None:
        self.writes.append((bytes(data), offset))

    def fdatasync(self, fd: int) -> None:
        pass

    def fsync_dir(self, path: str) -> None:
        pass


# The fields a commit sets; every other field of LogState must come through unchanged.
_SET_BY_COMMIT = {
    "frames",
    "end",
    "next_seq",
    "created_at",
    "last_at",
    "size",
    "point",
}


def test_a_commit_carries_every_field_it_does_not_set():
    # A distinct object in every field committed() does not compute from, so a field it forgets
    # (e.g. one added to LogState later) comes back as its default and fails the identity check.
    read = {"entries": bytearray(), "frames": 2, "size": 100_000, "version": 2, "created_at": 3}
    state = LogState(**{f.name: read.get(f.name, object()) for f in dataclasses.fields(LogState)})
    encoded = encode_group([_req()], next_seq=9, write_start=500, now=20, last_at=None, version=2)
    assert encoded is not None
    ops = _NoSync()
    dirs = DurableDirs(ops)
    data, size, _chunk = preallocated(state, encoded, 0)
    write_group(ops, 3, data, encoded.write_start, dirs=dirs, directory="/nonexistent")
    after = committed(state, encoded, size=size, point=b"")
    for f in dataclasses.fields(LogState):
        if f.name not in _SET_BY_COMMIT:
            assert getattr(after, f.name) is getattr(state, f.name), f.name
    expected = dataclasses.replace(
        state,
        frames=3,
        end=encoded.end,
        next_seq=10,
        created_at=3,
        last_at=20,
        size=100_000,
        point=b"",
    )
    assert after == expected
    assert ops.writes == [(encoded.data, 500)]  # inside the preallocated tail: no growth


def test_pwrite_continues_a_short_write(tmp_path, monkeypatch):
    real = os.pwrite
    calls: list[int] = []

    def short(fd: int, data: bytes | memoryview, offset: int) -> int:
        calls.append(offset)
        return real(fd, bytes(data)[:3], offset)  # at most 3 bytes per call

    path = str(tmp_path / "f")
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        monkeypatch.setattr(os, "pwrite", short)
        FileOps().pwrite(fd, b"0123456789", 5)
        monkeypatch.undo()
        assert os.pread(fd, 20, 0) == bytes(5) + b"0123456789"
        assert calls == [5, 8, 11, 14]
    finally:
        os.close(fd)


def _entries(offsets: list[int]) -> bytearray:
    return bytearray(b"".join(encode_entry(off, seq) for seq, off in enumerate(offsets)))


def test_index_is_written_once_it_lags_by_frames_or_bytes_also_after_a_rebuild(tmp_path):
    index = SidecarIndex(FileOps(), str(tmp_path / "c.idx"))
    assert index.open_and_read() == bytearray()
    small = list(range(0, 100 * 200, 200))  # 200 B frames
    entries = _entries(small)
    for n in range(1, LAG_FRAMES):
        index.write(entries, n, small[n - 1] + 200)
        assert index.valid == 0  # lagging by fewer than LAG_FRAMES frames and LAG_BYTES: not written
    index.write(entries, LAG_FRAMES, small[LAG_FRAMES - 1] + 200)
    assert index.valid == LAG_FRAMES  # the lag start moved with ``valid``
    index.write(entries, LAG_FRAMES + 1, small[LAG_FRAMES] + 200)
    assert index.valid == LAG_FRAMES
    # A rebuild (a new buffer, valid back to 0): the lag is measured from the new buffer's entry,
    # not from the one remembered for the old buffer at the same ``valid``.
    index.valid = 0
    index.write(entries, 1, 200)  # remembers entry 0 of ``entries``: offset 0
    far = 10 * LAG_BYTES
    index.write(_entries([far, far + 200]), 2, far + 400)
    assert index.valid == 0  # 400 B behind: not written (a stale offset 0 would say 10 MiB)
    index.write(_entries([0, LAG_BYTES]), 2, LAG_BYTES + 200)
    assert index.valid == 2
    index.close()


def test_pread_continues_a_short_read_and_stops_at_the_end(tmp_path, monkeypatch):
    path = str(tmp_path / "f")
    with open(path, "wb") as f:
        f.write(b"0123456789")
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: real(fd, min(n, 3), off))  # 3 bytes a call
    fd = os.open(path, os.O_RDONLY)
    try:
        ops = FileOps()
        assert ops.pread(fd, 6, 2) == b"234567"
        assert ops.pread(fd, 100, 4) == b"456789"  # fewer only at the end of the file
        assert ops.pread(fd, 0, 0) == b"" and ops.pread(fd, 5, 10) == b""
    finally:
        os.close(fd)
