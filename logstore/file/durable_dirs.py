"""Which directories this process has proven durable: the fan-out directories a new log goes into.

A new log's directory entry is made durable before its first frames are vouched for (``log_entry``:
by its first commit, ``writer.write_group``, or by a recovery that takes in a dead writer's first
frames, ``LogFiles.load_locked``), but that says nothing about the directory's own entry in its parent,
nor its parent's: a directory that exists may have been made by an attempt, or a process, that died
before fsyncing its parent (``FileOps.makedirs_durable``). Until issue 35 a conversation's first commit
trusted any fan-out directory that existed (a hole: a process killed between its ``mkdir`` and its
parent's fsync, then a power loss after another process acknowledged a log in that directory, lost the
log), and ``makedirs_durable`` paid one extra fsync on every call, proven or not.

Rule: before a log is created in a directory, the directory is in ``DurableDirs``: this process made its
entry durable, and its parent's, up to a level proven before (fsynced each one's parent after making it
or finding it: ``log_dir_alongside``, which adds what it proves). A log created by
another process that died before its first commit gets the same proof at its first commit here
(``log_entry``), and so does one whose creator died after writing frames but before their entry's
fsync, when a recovery here takes them in (``log_entry``; until issue 35 that recovery vouched for them
without it, and an append acknowledged on top, at a non-zero offset and so with no directory fsync, was
lost with the log's entry at a power loss). Then:
- a new conversation in a directory already proven costs no directory work but its own entry's fsync;
- in a new fan-out directory: its ``mkdir`` (and its parent's, if new), then the fsyncs of their parents
  at once with the manifest's creation record (issue 35 P14, ``log_dir_alongside``): all are done before
  the log is created; a power loss between them leaves empty directories, or a record whose directories
  are gone, which every reader treats as a record whose log was never created (test_new_fanout_dirs);
- in a directory that exists but was never proven here: one fsync of its parent, and of its parent's
  parent when that was not proven either, at once, once per process. The fan-out levels are proven
  again whoever made them: made at once, a level may exist with a child while its own entry is not
  durable (its maker died between the ``mkdir``s and the fsyncs), so "it has a child" proves nothing
  there. Above them (the site's ``conversations``, and up) directories are made level by level
  (``FileOps.makedirs_durable``), where "it has a child" does prove its entry.
A directory that goes (a purge removes the site's tree) is forgotten when its removal is seen
(``forget``: the lock file's ENOENT where it was proven, or a ``mkdir`` or fsync ENOENT under a proven
parent), and proven again when it is made again. The set is bounded by the fan-out (65,536 leaves and
256 parents per site). What this cannot see: a purge that removed a directory proven here and another
process that made it again and died before fsyncing its parent, all before this process's next log
there.

A first commit runs its log's entry fsync on a helper thread while it fdatasyncs the frames
(``log_entry_alongside``, issue 35 P14): the two are not ordered against each other, both are done before
the acknowledgement, and so a new conversation's first append waits for two syncs in a row (the
manifest's creation record, with a new fan-out directory's fsyncs at once, then these two at once), not
four.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from functools import partial

from .fileio import FileOps
from .layout import FANOUT_LEVELS

__all__ = ["DurableDirs"]


class _Helper:
    """One helper thread that runs one call at a time, handed over with two plain locks (a thread pool's
    futures cost ~100 us of CPU more per first commit: docs/PERFORMANCE.md, P14). Daemon: it holds no
    descriptor between calls, and waits on its lock at exit."""

    __slots__ = ("_go", "_done", "_call", "error")

    def __init__(self) -> None:
        self._go, self._done = threading.Lock(), threading.Lock()
        self._go.acquire()
        self._done.acquire()
        self._call: Callable[[], None] | None = None
        self.error: BaseException | None = None
        threading.Thread(target=self._run, name="logstore-fsync", daemon=True).start()

    def _run(self) -> None:
        while True:
            self._go.acquire()
            try:
                assert self._call is not None
                self._call()
            except BaseException as exc:  # handed to the caller, who raises it
                self.error = exc
            self._call = None
            self._done.release()

    def start(self, call: Callable[[], None]) -> None:
        self._call, self.error = call, None
        self._go.release()

    def wait(self) -> None:
        self._done.acquire()


# Idle helpers, shared by every store of the process: a first commit takes one (or starts one) and gives
# it back once its call is done, so there are as many as first commits ever ran at once.
_idle: list[_Helper] = []


def _forget_helpers() -> None:
    """In a forked child: the parent's helper threads do not exist here."""
    _idle.clear()


os.register_at_fork(after_in_child=_forget_helpers)


def _at_once(calls: list[Callable[[], None]]) -> None:
    """Run ``calls`` at the same time: the first on this thread, each other one on a helper. Returns only
    once every call is done (also when one raises: no fsync of ours outlives the work that asked for it);
    raises the first error in the list's order. At interpreter exit (no new threads) the rest run here,
    in a row, after the first."""
    helpers: list[_Helper] = []
    here = calls[:1]
    for call in calls[1:]:
        try:
            helper = _idle.pop()
        except IndexError:
            try:
                helper = _Helper()
            except RuntimeError:  # interpreter shutdown: no new threads
                here.append(call)
                continue
        helper.start(call)
        helpers.append(helper)
    errors: list[BaseException] = []
    try:
        for call in here:
            call()
    finally:
        for helper in helpers:
            helper.wait()  # an interrupt here propagates; the helpers not given back finish alone
            if helper.error is not None:
                errors.append(helper.error)
                helper.error = None
            _idle.append(helper)  # given back only after its error was taken: another user resets it
    if errors:
        raise errors[0]


class DurableDirs:
    """A set of absolute directory paths; thread-safe by the GIL (``set`` membership and ``update``), and
    a race only makes two threads prove the same directory."""

    __slots__ = ("_ops", "_proven")

    def __init__(self, ops: FileOps) -> None:
        self._ops = ops
        self._proven: set[str] = set()

    def __contains__(self, path: str) -> bool:
        return path in self._proven

    def ensure(self, path: str) -> None:
        """Make ``path`` (absolute) exist with every entry on the way durable, unless already proven: level
        by level (``FileOps.makedirs_durable``; the store's ``sites`` directory). Raises ``OSError``
        (ENOENT: a parent went meanwhile)."""
        if path not in self._proven:
            try:
                self._ops.makedirs_durable(os.path.abspath(path), self._proven)
            except FileNotFoundError:  # a parent proven here went since (a purge): prove again next time
                self.forget()
                raise

    def make_log_dir(self, path: str) -> None:
        """Make the log directory ``path`` (absolute, ``<conversations>/<h1>/<h2>``) exist: its missing
        fan-out levels with ``mkdir``, nothing synced (``log_dir_alongside`` proves them), the levels
        above level by level (``makedirs_durable``). Raises ``OSError`` (ENOENT: a parent went meanwhile)."""
        if path in self._proven:
            return
        try:
            self._levels(path, make=True)
        except FileNotFoundError:  # a parent proven here went since (a purge): prove again next time
            self.forget()
            raise

    def log_dir_alongside(self, path: str, record: Callable[[], None]) -> None:
        """``record()`` (the manifest's creation record of a log about to be created in ``path``, synced)
        and, unless proven, the fsyncs that prove ``path``'s fan-out levels (``_levels``), at once: the
        record on this thread, the fsyncs on helpers. All are done before the log is created; a crash
        between them leaves a durable record whose directories are gone after a power loss, which every
        reader of the manifest treats as a record whose log was never created (test_new_fanout_dirs), or
        durable empty directories. Raises ``record``'s error first, else ``OSError`` (ENOENT: a directory
        went meanwhile: forgotten); proves nothing unless all succeed."""
        if path in self._proven:
            record()
            return
        levels, parents = self._levels(path, make=False)
        try:
            _at_once([record, *[partial(self._ops.fsync_dir, parent) for parent in parents]])
        except FileNotFoundError:  # a purge removed what was proven here: prove again next time
            self.forget()
            raise
        self._proven.update(levels)

    def _levels(self, path: str, *, make: bool) -> tuple[list[str], list[str]]:
        """The fan-out levels of the log directory ``path`` not proven here (deepest first), made if
        ``make``, and the directories whose fsync proves them (their parents). Every such level is proven
        again, whoever made it: one made at once with its child may exist, with a child, while its own
        entry is not durable (its maker died between the two). Above the fan-out levels (the site's
        ``conversations``) the level-by-level rule holds: found existing, one fsync of its parent joins the
        others; missing (a new site), it is made first, level by level (``makedirs_durable``)."""
        levels, base = [], path
        for _ in range(FANOUT_LEVELS):
            if base in self._proven:
                break
            levels.append(base)
            base = os.path.dirname(base)
        else:
            if base not in self._proven:
                if make and not self._ops.exists(base):
                    self._ops.makedirs_durable(base, self._proven)
                else:
                    levels.append(base)
        if make:
            for directory in reversed(levels[:FANOUT_LEVELS]):
                try:
                    self._ops.mkdir(directory)
                except FileExistsError:
                    pass  # made before, or concurrently: its parent's fsync below proves it all the same
        return levels, [os.path.dirname(level) for level in levels]

    def log_entry(self, directory: str) -> None:
        """A log in ``directory`` is about to have its first frames vouched for: by its first commit, or by
        a recovery taking in frames from byte 0 that no record of this boot vouched for (their writer may
        have died before this very fsync). Makes the log's entry durable (fsync of ``directory``) and,
        unless proven, the directory's own and its fan-out parent's (``_levels``), all at once. Raises
        ``OSError``."""
        if directory in self._proven:
            self._ops.fsync_dir(directory)
            return
        levels, parents = self._levels(directory, make=False)
        _at_once([partial(self._ops.fsync_dir, path) for path in (directory, *parents)])
        self._proven.update(levels)

    def log_entry_alongside(self, directory: str, sync: Callable[[], None]) -> None:
        """``sync()`` (the ``fdatasync`` of a new log's first frames) and ``log_entry(directory)`` at once,
        the entry on a helper thread. Neither is ordered against the other, and both are done before the
        first frames are acknowledged: a crash between them leaves an entry with no durable frame or
        durable frames with no entry, never acknowledged either way, the states a crash between the two in
        a row already left. Returns only once both are done (also when ``sync`` raises: no fsync of ours
        outlives a failed commit); raises ``sync``'s error first, else the entry's."""
        _at_once([sync, partial(self.log_entry, directory)])

    def forget(self) -> None:
        """A directory was found gone (a purge): prove everything again from here on."""
        self._proven.clear()
