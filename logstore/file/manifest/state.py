"""Reading a site manifest's state from disk: a snapshot plus journals, into a ``ManifestTable``. Used by
``SiteManifest`` to load, to re-base after a compaction, and by its compactor (the state to fold)."""

from __future__ import annotations

import errno
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import layout
from ..fileio import FileOps
from .codec import MARK_OPEN, Entry, Session, decode_journal, first_gap
from .snapshot import decode_snapshot
from .table import ManifestTable

__all__ = ["DiskState", "read_state", "read_tail"]

log = logging.getLogger("logstore")


@dataclass
class DiskState:
    table: ManifestTable = field(default_factory=ManifestTable)
    sessions: set[Session] = field(default_factory=set)  # open at the end of the last journal
    damaged: bool = False  # a damaged snapshot, or damaged journal bytes with valid records after them
    marked: bool = False  # written by this format: a v2 snapshot, or a session mark in a journal
    pos: int = 0  # end of the last record decoded in the last journal
    torn: bool = False  # the last journal ends in bytes that are no record: a torn tail (or one in flight)
    snapshot_bytes: int = 0  # the size of the snapshot file read


def read_state(
    ops: FileOps,
    directory: str,
    base: int,
    journals: list[int],
    *,
    discover: Callable[[], list[str]],
) -> DiskState:
    """Snapshot ``base`` (0: none) + ``journals`` in order. A damaged snapshot is replaced by the ids
    ``discover()`` finds, in an unknown state (the reconciliation sweep reads their logs).
    FileNotFoundError if one of them is gone: a compaction folded it since the caller listed them (the
    caller lists again: a vanished file is never taken for an empty or damaged one).

    One verdict per journal, as for a log: damaged bytes with valid records after them are reported
    (``damaged``: the sweep reconciles from the logs); bytes after the last record are a torn tail, never
    a record anyone relied on (``torn`` for the last journal: its next writer rolls to a new journal
    rather than append after them)."""
    state = DiskState()
    if base:
        path = layout.manifest_file(directory, "snapshot", base)
        data = _read(ops, path)
        state.snapshot_bytes = len(data)
        snapshot = decode_snapshot(data)
        if snapshot is None:
            log.warning("manifest snapshot %s damaged; the logs will be rescanned", path)
            state.damaged = True
            for cid in discover():
                if state.table.get(cid) is None:
                    state.table.force(cid, Entry(-1, -1, -1, 0))
        else:
            state.table = ManifestTable(snapshot)
            state.sessions = set(snapshot.sessions)
            state.marked = snapshot.version >= 2
    for gen in journals:
        path = layout.manifest_file(directory, "journal", gen)
        data = _read(ops, path)
        decoded = decode_journal(data)
        for cid, entry in decoded.records:
            state.table.apply(cid, entry)
        for mark in decoded.marks:
            (state.sessions.add if mark.kind == MARK_OPEN else state.sessions.discard)(mark.session)
        state.marked = state.marked or bool(decoded.marks)
        if decoded.damaged:
            state.damaged = True
            where = first_gap(data)
            log.warning("manifest journal %s damaged at byte %d; reconciling from logs", path, where)
        state.pos, state.torn = decoded.pos, decoded.pos < len(data)
    return state


def _read(ops: FileOps, path: str) -> bytes:
    data = ops.read_file(path)
    if data is None:
        raise FileNotFoundError(errno.ENOENT, "manifest file folded by a compaction", path)
    return data


def read_tail(ops: FileOps, path: str, pos: int) -> bytes:
    """The bytes of the journal ``path`` from ``pos`` to its end (FileNotFoundError if it is gone)."""
    fd = ops.open(path, os.O_RDONLY)
    try:
        size = ops.size(fd)
        return ops.pread(fd, size - pos, pos) if size > pos else b""
    finally:
        ops.close(fd)
