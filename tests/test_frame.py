"""Frame codec: round trips, every header field corrupted, decoder fed whole, byte by byte, with trailers."""

from __future__ import annotations

import struct

import pytest
from crc32c import crc32c
from hypothesis import given
from hypothesis import strategies as st

from logstore.file.log.frame import (
    HEADER_SIZE,
    MAGIC,
    MAX_FRAME_SIZE,
    Frame,
    FrameDecoder,
    FrameHeader,
    Invalid,
    NeedMore,
    decode_frame,
    decode_header,
    encode_frame,
    encode_items,
)

ITEMS = [b'{"a":1}', b'{"role":"user","text":"h\\u00e9"}', b"{}"]


def make(
    first_seq: int = 7,
    items: list[bytes] = ITEMS,
    recorded_at: int = 1_764_000_000_000_000,
    write_start: int = 0,
) -> bytes:
    return encode_frame(
        first_seq=first_seq,
        count=len(items),
        recorded_at=recorded_at,
        write_start=write_start,
        encoded_items=encode_items(items),
    )


def test_round_trip_fields():
    raw = make()
    frame = decode_frame(raw)
    assert isinstance(frame, Frame)
    assert (frame.offset, frame.size, frame.first_seq, frame.count) == (0, len(raw), 7, 3)
    assert frame.recorded_at == 1_764_000_000_000_000 and frame.write_start == 0
    assert frame.items == tuple(ITEMS)
    assert frame.last_seq == 9 and frame.end == len(raw)


def test_layout_matches_format_doc():
    raw = make(first_seq=0, items=[b"{}"], recorded_at=1, write_start=0)
    assert raw[:4] == MAGIC == b"LSF\x02"
    length = struct.unpack_from("<I", raw, 8)[0]
    assert length == len(raw) - 12 == 28 + 4 + 2
    assert struct.unpack_from("<I", raw, 4)[0] == crc32c(raw[8:])  # CRC covers the length field too
    assert struct.unpack_from("<QIqQ", raw, 12) == (0, 1, 1, 0)
    assert raw[HEADER_SIZE:] == struct.pack("<I", 2) + b"{}"


def test_decode_header_probe():
    raw = make(first_seq=3)
    assert decode_header(raw) == FrameHeader(len(raw), 3, 3, 1_764_000_000_000_000, 0)
    assert decode_header(b"\0" * 64) is None


def test_v1_frames_have_the_v2_layout_and_stay_decodable():
    fields = dict(first_seq=5, count=1, recorded_at=9, write_start=3, encoded_items=encode_items([b"{}"]))
    v1, v2 = encode_frame(**fields, version=1), encode_frame(**fields)
    assert v1[:4] == b"LSF\x01" and v2[:4] == b"LSF\x02" and v1[4:] == v2[4:]  # only the version differs
    a, b = decode_frame(v1), decode_frame(v2)
    assert isinstance(a, Frame) and isinstance(b, Frame)
    assert (a.version, b.version) == (1, 2) and a.items == b.items == (b"{}",)
    header = decode_header(v1)
    assert header is not None and header.version == 1


def test_unknown_version_is_unsupported_not_bad_magic():
    raw = bytearray(make())
    raw[3] = 3  # b"LSF" + a version this build does not know
    assert decode_frame(raw) == Invalid(0, "unsupported-version")
    raw[0] ^= 0xFF
    assert decode_frame(raw) == Invalid(0, "bad-magic")


def test_base_offset_and_position():
    raw = make()
    buf = b"xx" + raw
    frame = decode_frame(buf, 2, 1000)
    assert isinstance(frame, Frame) and frame.offset == 1002


@pytest.mark.parametrize("offset", range(0, HEADER_SIZE))
def test_every_header_byte_corrupted_is_detected(offset):
    raw = bytearray(make())
    raw[offset] ^= 0x41
    event = decode_frame(bytes(raw))
    # A damaged length may make the frame look longer than the buffer: that is "need more", never a frame.
    assert not isinstance(event, Frame)
    if offset < 3:
        assert isinstance(event, Invalid) and event.reason == "bad-magic"
    elif offset == 3:  # the version byte
        assert isinstance(event, Invalid) and event.reason == "unsupported-version"
    elif offset >= 12:
        assert isinstance(event, Invalid) and event.reason == "crc-mismatch"


@pytest.mark.parametrize("offset", [HEADER_SIZE, HEADER_SIZE + 3, HEADER_SIZE + 6, -1])
def test_item_bytes_corrupted_is_detected(offset):
    raw = bytearray(make())
    raw[offset] ^= 0x01
    event = decode_frame(bytes(raw))
    assert isinstance(event, Invalid) and event.reason == "crc-mismatch"


def test_zeros_are_never_a_frame():
    assert decode_frame(b"\0" * 200) == Invalid(0, "bad-magic")


def test_implausible_length_is_invalid_not_need_more():
    raw = bytearray(make())
    struct.pack_into("<I", raw, 8, MAX_FRAME_SIZE)  # beyond the largest legal frame
    assert decode_frame(bytes(raw)) == Invalid(0, "bad-length")
    struct.pack_into("<I", raw, 8, 3)
    assert decode_frame(bytes(raw)) == Invalid(0, "bad-length")


def test_count_and_item_lengths_must_match_length():
    items = encode_items(ITEMS)
    # count says 4 but only 3 items present: CRC is valid, structure is not
    assert (
        decode_frame(
            encode_frame(first_seq=0, count=4, recorded_at=0, write_start=0, encoded_items=items)
        ).reason
        == "bad-item-length"
    )  # type: ignore[union-attr]
    assert (
        decode_frame(
            encode_frame(first_seq=0, count=2, recorded_at=0, write_start=0, encoded_items=items)
        ).reason
        == "bad-item-length"
    )  # type: ignore[union-attr]
    assert (
        decode_frame(
            encode_frame(first_seq=0, count=0, recorded_at=0, write_start=0, encoded_items=items)
        ).reason
        == "bad-count"
    )  # type: ignore[union-attr]


def test_truncated_frame_needs_more():
    raw = make()
    for cut in range(len(raw)):
        event = decode_frame(raw[:cut])
        assert isinstance(event, NeedMore), cut
        assert event.needed == (12 if cut < 12 else len(raw))


def _stream(frames: list[bytes]) -> bytes:
    return b"".join(frames)


FRAMES = [make(0, [b'{"x":0}']), make(1, ITEMS), make(4, [b'{"y":"' + b"z" * 500 + b'"}'])]


def _drain(decoder: FrameDecoder) -> list[Frame]:
    out = []
    while isinstance(event := decoder.next_event(), Frame):
        out.append(event)
    return out


def test_decoder_fed_whole():
    decoder = FrameDecoder()
    decoder.feed(_stream(FRAMES))
    frames = _drain(decoder)
    assert [f.first_seq for f in frames] == [0, 1, 4]
    assert decoder.offset == len(_stream(FRAMES)) and decoder.buffered == 0


def test_decoder_fed_byte_by_byte():
    decoder = FrameDecoder()
    frames: list[Frame] = []
    for byte in _stream(FRAMES):
        decoder.feed(bytes([byte]))
        frames.extend(_drain(decoder))
    assert [f.first_seq for f in frames] == [0, 1, 4]
    assert [f.offset for f in frames] == [0, len(FRAMES[0]), len(FRAMES[0]) + len(FRAMES[1])]


def test_decoder_with_trailing_bytes():
    for trailing, expected in [(b"LS", NeedMore), (b"\0\0\0\0\0", Invalid), (FRAMES[0][:20], NeedMore)]:
        decoder = FrameDecoder()
        decoder.feed(_stream(FRAMES) + trailing)
        assert len(_drain(decoder)) == 3
        event = decoder.next_event()
        assert isinstance(event, expected)
        assert event.offset == len(_stream(FRAMES))


json_objects = st.dictionaries(st.text(max_size=8), st.integers() | st.text(max_size=20), max_size=5)


@given(
    st.lists(st.binary(min_size=2, max_size=300), min_size=1, max_size=30),
    st.integers(0, 2**40),
    st.integers(-(2**62), 2**62),
    st.integers(0, 2**40),
)
def test_round_trip_property(items, first_seq, recorded_at, write_start):
    raw = encode_frame(
        first_seq=first_seq,
        count=len(items),
        recorded_at=recorded_at,
        write_start=write_start,
        encoded_items=encode_items(items),
    )
    frame = decode_frame(raw)
    assert isinstance(frame, Frame)
    assert frame.items == tuple(items) and frame.first_seq == first_seq
    assert frame.recorded_at == recorded_at and frame.write_start == write_start


@pytest.mark.parametrize("sizes", [[4095], [4096], [0, 1, 4095, 4096, 70_000], [255, 256, 65_536]])
def test_item_lengths_are_packed_alike_on_both_sides_of_the_table(sizes):
    """``encode_items`` takes short items' u32 lengths from a table built once, longer ones from
    ``struct``: the same bytes either way, one item or several."""
    items = [b"x" * n for n in sizes]
    assert encode_items(items) == b"".join(struct.pack("<I", len(raw)) + raw for raw in items)
