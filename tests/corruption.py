"""Shared corruption helpers for tests (etcd's habit): damage files in place, in exactly one way each."""

from __future__ import annotations

import os

__all__ = [
    "flip_byte",
    "truncate",
    "zero_range",
    "append_garbage",
    "write_at",
    "file_size",
    "rewrite_frame",
]


def file_size(path: str) -> int:
    return os.path.getsize(path)


def flip_byte(path: str, offset: int, mask: int = 0xFF) -> None:
    """XOR the byte at ``offset`` with ``mask`` (negative offsets count from the end)."""
    with open(path, "r+b") as f:
        if offset < 0:
            offset += os.fstat(f.fileno()).st_size
        f.seek(offset)
        byte = f.read(1)
        assert byte, f"offset {offset} is past the end of {path}"
        f.seek(offset)
        f.write(bytes([byte[0] ^ mask]))


def truncate(path: str, size: int) -> None:
    """Cut the file to ``size`` bytes (negative: remove that many bytes from the end)."""
    if size < 0:
        size += os.path.getsize(path)
    os.truncate(path, size)


def zero_range(path: str, offset: int, length: int) -> None:
    write_at(path, offset, b"\0" * length)


def append_garbage(path: str, data: bytes = b"\x5a" * 37) -> None:
    with open(path, "ab") as f:
        f.write(data)


def write_at(path: str, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def rewrite_frame(
    path: str, offset: int, *, first_seq: int | None = None, recorded_at: int | None = None
) -> None:
    """Re-encode the frame at ``offset`` with a changed header field and a *valid* CRC: damage that only
    logic (seq continuity, timestamp order) can catch. Sizes are unchanged, so later frames stay put."""
    from logstore.file.log.frame import HEADER_SIZE, Frame, decode_frame, encode_frame

    with open(path, "r+b") as f:
        f.seek(offset)
        head = f.read(HEADER_SIZE)
        probe = decode_frame(head)
        f.seek(offset)
        raw = f.read(getattr(probe, "needed", 0))
        frame = decode_frame(raw)
        assert isinstance(frame, Frame), f"no valid frame at {offset} of {path}: {frame}"
        new = encode_frame(
            first_seq=frame.first_seq if first_seq is None else first_seq,
            count=frame.count,
            recorded_at=frame.recorded_at if recorded_at is None else recorded_at,
            write_start=frame.write_start,
            encoded_items=raw[HEADER_SIZE:],
        )
        assert len(new) == len(raw)
        f.seek(offset)
        f.write(new)
