"""Reading a site manifest's state from disk: a snapshot plus journals, into a ``ManifestTable``. Used by
``SiteManifest`` to load, to re-base after a compaction, and by its compactor (the state to fold)."""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field

from .. import layout
from ..fileio import FileOps
from .codec import MARK_OPEN, Entry, Session, decode_journal
from .snapshot import decode_snapshot
from .table import ManifestTable

__all__ = ["DiskState", "read_state"]

log = logging.getLogger("logstore")


@dataclass
class DiskState:
    table: ManifestTable = field(default_factory=ManifestTable)
    sessions: set[Session] = field(default_factory=set)  # open at the end of the last journal
    damaged: bool = False  # a damaged snapshot, or damaged / torn journal bytes
    marked: bool = False  # written by this format: a v2 snapshot, or a session mark in a journal
    pos: int = 0  # end of the last record decoded in the last journal


def read_state(
    ops: FileOps,
    directory: str,
    base: int,
    journals: list[int],
    *,
    discover: Callable[[], list[str]],
) -> DiskState:
    """Snapshot ``base`` (0: none) + ``journals`` in order. A damaged snapshot is replaced by the ids
    ``discover()`` finds, in an unknown state (the reconciliation sweep reads their logs)."""
    state = DiskState()
    if base:
        path = layout.manifest_file(directory, "snapshot", base)
        snapshot = decode_snapshot(ops.read_file(path) or b"")
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
        data = ops.read_file(layout.manifest_file(directory, "journal", gen)) or b""
        decoded = decode_journal(data)
        for cid, entry in decoded.records:
            state.table.apply(cid, entry)
        for mark in decoded.marks:
            (state.sessions.add if mark.kind == MARK_OPEN else state.sessions.discard)(mark.session)
        state.marked = state.marked or bool(decoded.marks)
        if decoded.damaged or decoded.pos < len(data):
            state.damaged = True
            log.warning("manifest journal %s damaged at byte %d; reconciling from logs", gen, decoded.pos)
        state.pos = decoded.pos
    return state
