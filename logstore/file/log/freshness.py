"""Did the log change since the state we published? What is observed, and the one decision table every
freshness check of the conversation (``ConversationLog``, ``LogFiles``) follows.

Strategy: three observations, each as cheap as its question allows, and a pure ``decide`` over them.
- ``Record``: the commit point (``commit_point``) against the record the published state agrees with,
  once what it vouches for past our state is taken in (durable frames: no verdict to make, so observing
  it takes them in). Every process moves it after its ``fdatasync``, so it says what every acknowledged
  commit added: ``SAME`` (the fast path of every read: the mapped record compared), ``OTHER`` (moved in
  a way that does not simply extend our state: another epoch or file, damage, a record invalidated by a
  tool), ``NONE`` (nothing loaded, or no descriptors).
- ``named``: whether the log's path still names the file we hold (erasure, a restore, a repair replace
  it). Only asked under the file lock, where an append must never go to an unlinked file; the lock-free
  paths trust the record, which every such tool invalidates first.
- ``Past``: whether a frame starts at our end (``past_end``): bytes past the commit point can only be a
  writer's that died between its write and its record; zeros are a v2 log's unused tail. A read that
  reaches the end sees them in its own ``pread``; the locked refresh reads them when the file is longer.

Acting on it (``Action``): serve what is published; load again without the lock (only what the record
vouches for); settle (recovery under the file lock if it is free at once: a live writer mid-commit owns
its frames); recover (under the file lock, waiting: the one place a torn tail or damage is judged).
``TABLE`` is the logic: ``decide`` looks the case up (h11's state table is the model). Under the file
lock, an unchanged lock-file header stands for the whole observation (``LogFiles.unchanged``: SAME,
named, nothing past). The manifest's reconciliation asks the same ``past_end`` question of a log
against its recorded end.
"""

from __future__ import annotations

import enum

from ..fileio import FileOps
from .frame import PREFIX_SIZE
from .recovery import LogState

__all__ = ["Action", "Past", "Record", "TABLE", "decide", "observe_locked", "past_end", "past_in"]


class Record(enum.Enum):
    NONE = "none"
    SAME = "same"
    OTHER = "other"


class Past(enum.Enum):
    UNSEEN = "unseen"  # not looked at (not needed, or the bytes there are known damage)
    NOTHING = "nothing"  # the file ends there, or zeros (a v2 log's unused tail)
    FRAME = "frame"  # a frame starts there: a dead writer's, never acknowledged, maybe durable


class Action(enum.Enum):
    SERVE = "serve"
    LOAD = "load"
    SETTLE = "settle"
    RECOVER = "recover"


_NONE, _SAME, _OTHER = Record.NONE, Record.SAME, Record.OTHER
_UNSEEN, _NOTHING, _FRAME = Past.UNSEEN, Past.NOTHING, Past.FRAME
_SERVE, _LOAD, _SETTLE, _RECOVER = Action.SERVE, Action.LOAD, Action.SETTLE, Action.RECOVER

# (record, path still names our file, what starts past the end) -> (without the lock, with the lock).
# Every case once (tests/test_freshness.py walks them all); lookups pass plain tuples, members as module
# globals: on 3.11 an Enum member read off its class costs 70-180 ns (docs/PERFORMANCE.md).
TABLE: dict[tuple[Record, bool, Past], tuple[Action, Action]] = {}
for _past in Past:
    for _named in (True, False):
        for _record in (_NONE, _OTHER):  # nothing to trust: load what a record vouches for, or recover
            TABLE[_record, _named, _past] = (_LOAD, _RECOVER)
        TABLE[_SAME, False, _past] = (_LOAD, _RECOVER)  # erased, replaced: never append to the old file
    TABLE[_SAME, True, _past] = (_SETTLE, _RECOVER) if _past is _FRAME else (_SERVE, _SERVE)
del _past, _named, _record


def decide(*, locked: bool, record: Record, named: bool = True, past: Past = Past.UNSEEN) -> Action:
    """What to do (``TABLE``). A ``LOAD`` that cannot tell (no record, another boot's, damage it does not
    name) ends in ``RECOVER``; a ``SETTLE`` whose lock is busy serves (a live writer's frame)."""
    return TABLE[record, named, past][locked]


def past_in(prefix: bytes) -> Past:
    """What ``prefix``, the (up to) ``PREFIX_SIZE`` bytes at a log's end, starts: nothing if it is all
    zero (a v2 log's unused tail) or absent, else a frame."""
    return _NOTHING if prefix.count(0) == len(prefix) else _FRAME


def past_end(ops: FileOps, fd: int, end: int) -> Past:
    """What starts at ``end``: one ``pread`` of ``PREFIX_SIZE`` bytes."""
    return past_in(ops.pread(fd, PREFIX_SIZE, end))


def observe_locked(
    ops: FileOps, fd: int, path: str, file_id: tuple[int, int, int] | None, state: LogState
) -> tuple[int | None, Past]:
    """Under the file lock: the file's size (None when ``path`` no longer names ``fd``'s file), and what
    starts at ``state``'s end. One ``statx`` (given ``file_id``), plus one ``pread`` only when the file
    is longer (a v2 log's preallocated tail, or a dead writer's frames). Past known damage nothing is
    read: those bytes are the damage, already judged."""
    size = ops.size_if_named(fd, path, file_id)
    if size is None:
        return None, _UNSEEN
    end, damaged = state.end, state.corrupt is not None
    if size <= end or damaged:
        return size, _UNSEEN if damaged else _NOTHING
    return size, past_end(ops, fd, end)
