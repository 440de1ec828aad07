"""Scanner: classifies what follows the last good frame (clean / torn / corrupt) by the documented rules."""

from __future__ import annotations

import os

import pytest

from logstore.file.fileio import OS_FILE_OPS
from logstore.file.log.frame import encode_frame, encode_items
from logstore.file.log.scanner import ScanState, first_valid_frame_after, scan_log


def frames(n: int, start_seq: int = 0, base: int = 0, group: bool = False) -> bytes:
    out = b""
    for k in range(n):
        write_start = base if group else base + len(out)
        out += encode_frame(
            first_seq=start_seq + k,
            count=1,
            recorded_at=1000 + k,
            write_start=write_start,
            encoded_items=encode_items([b'{"k":%d}' % k]),
        )
    return out


def scan_bytes(tmp_path, data: bytes, **kw):
    path = tmp_path / "x.log"
    path.write_bytes(data)
    fd = os.open(path, os.O_RDONLY)
    try:
        return scan_log(OS_FILE_OPS, fd, **kw)
    finally:
        os.close(fd)


def test_clean(tmp_path):
    data = frames(5)
    r = scan_bytes(tmp_path, data)
    assert (r.state, r.end, r.next_seq, len(r.frames)) == (ScanState.CLEAN, len(data), 5, 5)
    assert r.last_recorded_at == 1004


def test_start_mid_log(tmp_path):
    data = frames(5)
    first = len(frames(2))
    r = scan_bytes(tmp_path, data, start=first, expected_seq=2)
    assert [f.first_seq for f in r.frames] == [2, 3, 4]


def test_empty_file_is_clean(tmp_path):
    assert scan_bytes(tmp_path, b"").state is ScanState.CLEAN


@pytest.mark.parametrize("tail", [b"\0" * 100, b"LSF\x01\x00", b"garbage!" * 9])
def test_torn_tails(tmp_path, tail):
    good = frames(3)
    r = scan_bytes(tmp_path, good + tail)
    assert (r.state, r.stop_offset, r.end) == (ScanState.TORN, len(good), len(good))


def test_incomplete_last_frame_is_torn(tmp_path):
    good = frames(3)
    r = scan_bytes(tmp_path, good + frames(1, 3, len(good))[:-1])
    assert (r.state, r.reason) == (ScanState.TORN, "incomplete")


def test_hole_then_frames_of_the_same_write_is_torn(tmp_path):
    good = frames(2)
    group = frames(3, 2, len(good), group=True)
    first_len = len(frames(1, 2, len(good)))
    data = good + b"\0" * first_len + group[first_len:]
    r = scan_bytes(tmp_path, data)
    assert (r.state, r.stop_offset) == (ScanState.TORN, len(good))


def test_bad_frame_then_later_write_is_corrupt(tmp_path):
    data = bytearray(frames(4))
    victim = len(frames(1))
    data[victim + 44] ^= 1
    r = scan_bytes(tmp_path, bytes(data))
    assert (r.state, r.stop_offset, r.reason, r.next_seq) == (ScanState.CORRUPT, victim, "crc-mismatch", 1)


def test_seq_gap_is_corrupt(tmp_path):
    first = frames(2)
    data = first + frames(1, 5, len(first))
    r = scan_bytes(tmp_path, data)
    assert (r.state, r.reason, r.stop_offset) == (ScanState.CORRUPT, "seq-gap", len(first))


def test_timestamp_regression_is_reported(tmp_path):
    a = encode_frame(
        first_seq=0, count=1, recorded_at=2000, write_start=0, encoded_items=encode_items([b"{}"])
    )
    b = encode_frame(
        first_seq=1, count=1, recorded_at=1000, write_start=len(a), encoded_items=encode_items([b"{}"])
    )
    r = scan_bytes(tmp_path, a + b)
    assert r.state is ScanState.CLEAN and r.timestamp_regressions == [len(a)]


def test_first_valid_frame_after(tmp_path):
    data = frames(3)
    path = tmp_path / "y.log"
    path.write_bytes(b"\0" * 10 + data)
    fd = os.open(path, os.O_RDONLY)
    try:
        found = first_valid_frame_after(OS_FILE_OPS, fd, 0, len(data) + 10)
        assert found is not None and found.offset == 10
        assert first_valid_frame_after(OS_FILE_OPS, fd, len(data), len(data) + 10) is None
    finally:
        os.close(fd)


def frame_at(data: bytes, seq: int, recorded_at: int) -> bytes:
    return data + encode_frame(
        first_seq=seq,
        count=1,
        recorded_at=recorded_at,
        write_start=len(data),
        encoded_items=encode_items([b"{}"]),
    )


@pytest.mark.parametrize("tail", [b"", b"\0" * 100, b"garbage!" * 9])
def test_a_scan_continued_from_its_end_is_the_whole_scan(tmp_path, tail):
    head = frame_at(frame_at(b"", 0, 2000), 1, 1000)  # a timestamp regression in each part
    data = frame_at(frame_at(head, 2, 500), 3, 600) + tail
    whole = scan_bytes(tmp_path, data)
    first = scan_bytes(tmp_path, data, file_size=len(head))  # as a scan made before the last two appends
    assert (first.state, first.end, len(first.timestamp_regressions)) == (ScanState.CLEAN, len(head), 1)
    rest = scan_bytes(
        tmp_path,
        data,
        start=first.end,
        expected_seq=first.next_seq,
        last_recorded_at=first.last_recorded_at,
        last_version=first.last_version,
    )
    assert first.continued_by(rest) == whole
    assert len(whole.frames) == 4 and len(whole.timestamp_regressions) == 3  # 1000, 500, 600 < 2000
