"""Recovery: torn tails are truncated, corruption is reported with its offset and never dropped, a damaged
or stale index is rebuilt from the log (write -> damage -> reopen -> read -> append -> re-read)."""

from __future__ import annotations

import os

import pytest

from logstore import Corrupted, Store
from logstore.file.layout import conversation_paths
from logstore.file.log.frame import encode_frame, encode_items
from logstore.file.log.index_codec import ENTRY_SIZE, INDEX_HEADER_SIZE
from tests.corruption import append_garbage, flip_byte, truncate, write_at, zero_range
from tests.helpers import log_frames

SITE, CID = "site-a", "conv-0001"


def build(data_dir, batches: int = 5) -> tuple[str, str, list]:
    with Store(data_dir) as s:
        for n in range(batches):
            s.append(SITE, CID, [{"batch": n, "k": i} for i in range(3)])
        items = s.replay(SITE, CID, 0, 1000)
    paths = conversation_paths(str(data_dir), SITE, CID)
    return paths.log, paths.index, items


def reopen_and_check(data_dir, expected, *, appendable: bool = True):
    with Store(data_dir) as s:
        assert s.replay(SITE, CID, 0, 1000) == expected
        if appendable:
            r = s.append(SITE, CID, [{"after": "recovery"}])
            assert r.first == len(expected)
            assert s.recall(SITE, CID, 1)[0].payload == {"after": "recovery"}


@pytest.mark.parametrize("cut", [1, 11, 12, 40, 41])
def test_torn_tail_incomplete_frame_is_truncated(data_dir, cut):
    log, _, items = build(data_dir)
    size = os.path.getsize(log)
    partial = encode_frame(
        first_seq=15, count=1, recorded_at=0, write_start=size, encoded_items=encode_items([b'{"torn":true}'])
    )[:cut]
    append_garbage(log, partial)
    reopen_and_check(data_dir, items)
    assert log_frames(log)[-1].first_seq == 15  # the new append replaced the torn bytes
    assert os.path.getsize(log) == size + len(log_frames(log)[-1].items[0]) + 4 + 40


def test_zero_filled_tail_is_truncated(data_dir):
    log, _, items = build(data_dir)
    append_garbage(log, b"\0" * 4096)
    reopen_and_check(data_dir, items)


def test_garbage_tail_is_truncated(data_dir):
    log, _, items = build(data_dir)
    append_garbage(log, os.urandom(777).replace(b"LSF", b"XXX"))
    reopen_and_check(data_dir, items)


def test_torn_group_write_hole_then_frames_of_same_write_is_truncated(data_dir):
    """A group commit whose fsync never returned: its first sectors never reached disk (zeros), later
    frames of the same write did. Never acknowledged, so it is a torn tail, not corruption."""
    log, _, items = build(data_dir)
    start = os.path.getsize(log)
    f1 = encode_frame(
        first_seq=15, count=1, recorded_at=0, write_start=start, encoded_items=encode_items([b'{"g":1}'])
    )
    f2 = encode_frame(
        first_seq=16, count=1, recorded_at=0, write_start=start, encoded_items=encode_items([b'{"g":2}'])
    )
    append_garbage(log, b"\0" * len(f1) + f2)
    reopen_and_check(data_dir, items)


def test_mid_file_flip_is_corruption_with_offset_and_nothing_truncated(data_dir):
    log, _, items = build(data_dir)
    frames = log_frames(log)
    victim = frames[2]
    size = os.path.getsize(log)
    flip_byte(log, victim.offset + 45)
    with Store(data_dir) as s:
        # Reads entirely before the damage still work; so do reads of later, CRC-valid frames, since
        # opening validates only the index tail (O(1) open) and each frame is verified when read.
        assert s.replay(SITE, CID, 0, victim.first_seq) == items[: victim.first_seq]
        assert s.recall(SITE, CID, 2) == items[-2:]
        # The first read that touches the damaged frame finds it; from then on the conversation is
        # flagged: anything reaching the tail, and appends, raise Corrupted at that offset.
        for call in (
            lambda: s.replay(SITE, CID, 0, 1000),
            lambda: s.replay(SITE, CID, victim.first_seq, 1),
            lambda: s.recall(SITE, CID, 2),
            lambda: s.append(SITE, CID, [{"x": 1}]),
        ):
            with pytest.raises(Corrupted) as info:
                call()
            assert info.value.offset == victim.offset and info.value.path == log
            assert info.value.retryable is False
        assert s.replay(SITE, CID, 0, victim.first_seq) == items[: victim.first_seq]
    with Store(data_dir) as s:  # a fresh process finds it on the first touching read, same offset
        with pytest.raises(Corrupted) as info:
            s.replay(SITE, CID, victim.first_seq - 1, 2)
        assert info.value.offset == victim.offset
    assert os.path.getsize(log) == size  # never truncated


def test_flip_in_last_acknowledged_frame_is_corruption_not_torn_tail(data_dir):
    """The index proves the last frame was acknowledged (entries are written after its fsync)."""
    log, _, items = build(data_dir)
    last = log_frames(log)[-1]
    flip_byte(log, last.offset + 50)
    size = os.path.getsize(log)
    with Store(data_dir) as s, pytest.raises(Corrupted) as info:
        s.recall(SITE, CID)
    assert info.value.offset == last.offset
    assert os.path.getsize(log) == size


def test_missing_acknowledged_tail_is_reported(data_dir):
    log, _, items = build(data_dir)
    truncate(log, log_frames(log)[-1].offset)  # an indexed (acknowledged) frame vanished
    with Store(data_dir) as s, pytest.raises(Corrupted):
        s.recall(SITE, CID)


@pytest.mark.parametrize(
    "damage",
    [
        "delete",
        "zero",
        "truncate-half-entry",
        "flip-tail-entry",
        "garbage",
        "header",
        "lagging",
        "wrong-middle-entry",
    ],
)
def test_damaged_or_stale_index_is_rebuilt_from_the_log(data_dir, damage):
    log, idx, items = build(data_dir, batches=8)
    if damage == "delete":
        os.unlink(idx)
    elif damage == "zero":
        zero_range(idx, 0, os.path.getsize(idx))
    elif damage == "truncate-half-entry":
        truncate(idx, -ENTRY_SIZE // 2)
    elif damage == "flip-tail-entry":
        flip_byte(idx, -3)
    elif damage == "garbage":
        append_garbage(idx, os.urandom(100))
    elif damage == "header":
        flip_byte(idx, 0)
    elif damage == "lagging":
        truncate(idx, INDEX_HEADER_SIZE + 3 * ENTRY_SIZE)
    elif damage == "wrong-middle-entry":
        write_at(idx, INDEX_HEADER_SIZE + 3 * ENTRY_SIZE, os.urandom(ENTRY_SIZE))
    reopen_and_check(data_dir, items)
    with Store(data_dir) as s:  # and the index was rewritten consistently by the append
        assert len(s.replay(SITE, CID, 0, 1000)) == len(items) + 1
    assert os.path.getsize(idx) == INDEX_HEADER_SIZE + ENTRY_SIZE * (len(log_frames(log)))


def test_index_entry_pointing_mid_frame_is_never_served(data_dir):
    log, idx, items = build(data_dir, batches=6)
    from logstore.file.log.index_codec import encode_entry

    frames = log_frames(log)
    # A *checked* but wrong entry (as if written by a buggy writer): it must be caught against the log.
    write_at(idx, INDEX_HEADER_SIZE + 2 * ENTRY_SIZE, encode_entry(frames[2].offset + 7, frames[2].first_seq))
    with Store(data_dir) as s:
        assert s.replay(SITE, CID, 0, 1000) == items
        assert s.replay(SITE, CID, 6, 3) == items[6:9]


def test_index_replaced_by_rename_while_open_is_followed(data_dir):
    """fsck --repair replaces an index by rename; a running store must write into the new file."""
    with Store(data_dir) as s:
        for n in range(4):
            s.append(SITE, CID, [{"n": n}])
        idx = conversation_paths(str(data_dir), SITE, CID).index
        with open(idx, "rb") as f:
            content = f.read()
        tmp = idx + ".tmp"
        with open(tmp, "wb") as f:
            f.write(content)
        os.replace(tmp, idx)
        s.append(SITE, CID, [{"n": 4}])
    log = conversation_paths(str(data_dir), SITE, CID).log
    assert os.path.getsize(idx) == INDEX_HEADER_SIZE + ENTRY_SIZE * len(log_frames(log)) == 16 + 5 * 16
