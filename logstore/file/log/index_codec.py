"""Pure codec for the sidecar seq index (``<conversation>.idx``). No I/O.

File layout (little-endian):

    header (16 bytes):  magic b"LSIX" | u32 version (1) | u64 reserved (0)
    entry i (16 bytes): u64 frame_offset | u32 first_seq | u32 check

``check`` is CRC32C of the entry's first 12 bytes, so a zero-filled or torn entry never validates.
Entry i describes frame i of the log. A frame's item count is the next entry's first_seq minus its own
(the last frame's count comes from the log). The index is a hint: entries are written only after the
frames they describe are fdatasynced, so it may lag the log but never lead it; any disagreement with the
log is settled by the log.
"""

from __future__ import annotations

import struct

from crc32c import crc32c

__all__ = [
    "INDEX_MAGIC",
    "INDEX_HEADER",
    "INDEX_HEADER_SIZE",
    "ENTRY_SIZE",
    "encode_entry",
    "decode_entry",
    "entry_first_seq",
    "header_ok",
    "index_entries",
]

INDEX_MAGIC = b"LSIX"
INDEX_VERSION = 1
INDEX_HEADER = struct.pack("<4sIQ", INDEX_MAGIC, INDEX_VERSION, 0)
INDEX_HEADER_SIZE = len(INDEX_HEADER)
_ENTRY_BODY = struct.Struct("<QI")
_CHECK = struct.Struct("<I")
_FIRST_SEQ = struct.Struct("<I")
ENTRY_SIZE = 16


def header_ok(buf: bytes | bytearray | memoryview) -> bool:
    return bytes(buf[:INDEX_HEADER_SIZE]) == INDEX_HEADER


def index_entries(data: bytes | bytearray | None) -> bytes:
    """The whole entries of an index file's bytes: header stripped, a partial last entry dropped; empty
    if the file is missing or its header is wrong."""
    if not data or not header_ok(data):
        return b""
    body = bytes(data[INDEX_HEADER_SIZE:])
    return body[: len(body) - len(body) % ENTRY_SIZE]


def encode_entry(frame_offset: int, first_seq: int) -> bytes:
    body = _ENTRY_BODY.pack(frame_offset, first_seq)
    return body + _CHECK.pack(crc32c(body))


def decode_entry(entries: bytes | bytearray | memoryview, i: int) -> tuple[int, int] | None:
    """(frame_offset, first_seq) of entry ``i`` in an entries buffer (header stripped), or None if its
    check fails."""
    pos = i * ENTRY_SIZE
    if len(entries) < pos + ENTRY_SIZE:
        return None
    body = bytes(entries[pos : pos + 12])
    if _CHECK.unpack_from(entries, pos + 12)[0] != crc32c(body):
        return None
    return _ENTRY_BODY.unpack(body)


def entry_first_seq(entries: bytes | bytearray | memoryview, i: int) -> int:
    """Unchecked first_seq of entry ``i``: the bisect key. Callers verify the entry they land on."""
    first_seq: int = _FIRST_SEQ.unpack_from(entries, i * ENTRY_SIZE + 8)[0]
    return first_seq
