"""Index codec: entries round-trip, every damaged byte of an entry fails its check, zeros never validate."""

from __future__ import annotations

import pytest

from logstore.file.log.index_codec import (
    ENTRY_SIZE,
    INDEX_HEADER,
    INDEX_HEADER_SIZE,
    decode_entry,
    encode_entry,
    entry_first_seq,
    header_ok,
)


def test_header():
    assert INDEX_HEADER_SIZE == 16 and INDEX_HEADER[:4] == b"LSIX" and header_ok(INDEX_HEADER + b"junk")
    assert not header_ok(b"\0" * 16) and not header_ok(INDEX_HEADER[:10])


def test_round_trip_and_bisect_key():
    entries = b"".join(encode_entry(off, seq) for off, seq in [(0, 0), (57, 2), (2**40, 99_999)])
    assert len(entries) == 3 * ENTRY_SIZE
    assert [decode_entry(entries, i) for i in range(3)] == [(0, 0), (57, 2), (2**40, 99_999)]
    assert [entry_first_seq(entries, i) for i in range(3)] == [0, 2, 99_999]


@pytest.mark.parametrize("pos", range(ENTRY_SIZE))
def test_every_damaged_byte_fails_the_check(pos):
    entry = bytearray(encode_entry(4096, 1234))
    entry[pos] ^= 0x10
    assert decode_entry(bytes(entry), 0) is None


def test_zeros_and_short_entries_never_validate():
    assert decode_entry(b"\0" * ENTRY_SIZE, 0) is None
    assert decode_entry(encode_entry(1, 1)[:12], 0) is None
