"""A data dir's identity (``<data_dir>/store_id``: 32 hex digits and a newline), so that a backup can tell
"an earlier backup of this store" from "somebody else's backup" (``logstore.fsck.backup``).

Created once, on first need, exclusively: the id is written to a temp file and fsynced, then ``link``ed
into place. ``link`` fails with EEXIST if another process got there first, and then that process's id is
the store's (it was whole before it had its name). It is never rewritten; a backup copies it, so a
restored store keeps the identity of the store it was backed up from.
"""

from __future__ import annotations

import os
import re
import secrets
import threading

from . import layout
from .fileio import FILE_MODE, FileOps

__all__ = ["StoreIdDamaged", "read_store_id", "ensure_store_id"]

_VALID = re.compile(r"[0-9a-f]{32}")
_creating = threading.Lock()  # one temp name per process (``.tmp-<pid>``, what fsck knows as a temp file)


class StoreIdDamaged(ValueError):
    """The store_id file exists but does not hold an id."""


def read_store_id(ops: FileOps, data_dir: str) -> str | None:
    """The store's id, or None if it has none yet. Raises ``StoreIdDamaged``."""
    path = layout.store_id_path(data_dir)
    data = ops.read_file(path)
    if data is None:
        return None
    text = data.decode("ascii", "replace").strip()
    if not _VALID.fullmatch(text):
        raise StoreIdDamaged(f"{path} does not hold a store id (32 hex digits): {data[:40]!r}")
    return text


def ensure_store_id(ops: FileOps, data_dir: str) -> str:
    """The store's id, created if it has none (exclusively: module docstring)."""
    existing = read_store_id(ops, data_dir)
    if existing is not None:
        return existing
    path = layout.store_id_path(data_dir)
    with _creating:
        tmp = f"{path}.tmp-{os.getpid()}"
        fd = ops.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, FILE_MODE)
        try:
            ops.pwrite(fd, (secrets.token_hex(16) + "\n").encode(), 0)
            ops.fsync(fd)
        finally:
            ops.close(fd)
        try:
            ops.link(tmp, path)
        except FileExistsError:
            pass  # another process's id won: it is the store's
        finally:
            ops.unlink(tmp)
        ops.fsync_dir(data_dir)
    created = read_store_id(ops, data_dir)
    assert created is not None
    return created
