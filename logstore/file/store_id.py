"""A data dir's identity (``<data_dir>/store_id``: 32 hex digits and a newline), so that a backup can tell
"an earlier backup of this store" from "somebody else's backup" (``logstore.fsck.backup``).

Older data dirs have the file (``ensure_store_id`` made it on their first backup: created exclusively,
the id written to a temp file and fsynced, then ``link``ed into place; EEXIST means another process's id
won). A backup no longer writes into its source (a read-only snapshot must back up too): a data dir
without the file is identified by ``store_identity``, a digest of its ``secret`` (the 32 random bytes
every store makes on its first open, replaced only by ``fsck --repair`` of a damaged one). Neither is
rewritten; a backup copies both, so a restored store keeps the identity of the store it was backed up
from.
"""

from __future__ import annotations

import hashlib
import os
import re
import secrets
import threading

from . import layout
from .fileio import FILE_MODE, FileOps

__all__ = ["StoreIdDamaged", "read_store_id", "ensure_store_id", "store_identity"]

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


def store_identity(ops: FileOps, data_dir: str) -> str | None:
    """The store's id without writing anything: the ``store_id`` file's, else derived from the ``secret``
    (None when there is neither: no store has opened this data dir). Raises ``StoreIdDamaged``."""
    existing = read_store_id(ops, data_dir)
    if existing is not None:
        return existing
    secret = ops.read_file(layout.secret_path(data_dir))
    if not secret:
        return None
    return hashlib.blake2b(secret, digest_size=16, person=b"logstore-storeid").hexdigest()


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
