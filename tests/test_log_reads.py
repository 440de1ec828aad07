"""Serving items from decoded frames (``file.log.reads.items_of``): the range cut, the frame's time, and a
CRC-valid item that is not JSON reported as ``Corrupted`` at its frame's offset."""

from __future__ import annotations

import pytest

from logstore.core.errors import Corrupted
from logstore.core.models import micros_to_datetime
from logstore.file.log.frame import Frame, decode_frame, encode_frame, encode_items
from logstore.file.log.reads import items_of

AT = 1_764_000_000_000_000


def frame(items: list[bytes], *, first_seq: int, offset: int) -> Frame:
    data = encode_frame(
        first_seq=first_seq,
        count=len(items),
        recorded_at=AT,
        write_start=0,
        encoded_items=encode_items(items),
    )
    decoded = decode_frame(data, 0, offset)
    assert isinstance(decoded, Frame)  # the CRC holds: whatever is wrong is inside an item
    return decoded


def test_items_in_range_carry_their_frame_time():
    frames = [
        frame([b'{"a":0}', b'{"a":1}'], first_seq=0, offset=0),
        frame([b'{"a":2}'], first_seq=2, offset=64),
    ]
    items = items_of(frames, 1, 3, path="x.log")
    assert [(i.seq, i.payload) for i in items] == [(1, {"a": 1}), (2, {"a": 2})]
    assert {i.recorded_at for i in items} == {micros_to_datetime(AT)}


def test_an_item_that_is_not_json_is_corrupted_at_its_frame():
    frames = [frame([b'{"a":0}', b'{"a":'], first_seq=5, offset=4096)]
    assert [i.seq for i in items_of(frames, 5, 6, path="x.log")] == [5]  # not read, not judged
    with pytest.raises(Corrupted) as info:
        items_of(frames, 5, 7, path="x.log")
    assert (info.value.path, info.value.offset) == ("x.log", 4096)
    assert "item 6 is not JSON" in info.value.message
