"""Shared corruption helpers for tests (etcd's habit): damage files in place, in exactly one way each."""

from __future__ import annotations

import os

__all__ = ["flip_byte", "truncate", "zero_range", "append_garbage", "write_at", "file_size"]


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
