"""Which directories this process has proven durable: the fan-out directories a new log goes into.

A new log's directory entry is made durable before its first frames are vouched for (``log_entry``:
by its first commit, ``writer.write_group``, or by a recovery that takes in a dead writer's first
frames, ``LogFiles.load_locked``), but that says nothing about the directory's own entry in its parent,
nor its parent's: a directory that exists may have been made by an attempt, or a process, that died
before fsyncing its parent (``FileOps.makedirs_durable``). Until issue 35 a conversation's first commit
trusted any fan-out directory that existed (a hole: a process killed between its ``mkdir`` and its
parent's fsync, then a power loss after another process acknowledged a log in that directory, lost the
log), and ``makedirs_durable`` paid one extra fsync on every call, proven or not.

Rule: before a log is created in a directory (and so before the manifest's creation record of it, which
fsck and the reconciliation then expect to find a directory for), the directory is in ``DurableDirs``:
this process made its entry durable (fsynced its parent after making it or finding it:
``makedirs_durable``, which adds what it proves). A log created by another process that died before
its first commit gets the same proof at its first commit here (``prove``), and so does one whose
creator died after writing frames but before their entry's fsync, when a recovery here takes them in
(``log_entry``; until issue 35 that recovery vouched for them without it, and an append acknowledged on
top, at a non-zero offset and so with no directory fsync, was lost with the log's entry at a power
loss). Then:
- a new conversation in a directory already proven costs no directory work but its own entry's fsync;
- in a new fan-out directory under a proven parent: ``mkdir`` and one fsync of the parent (the extra
  fsync of the deepest existing level is skipped: that level is proven);
- in a directory that exists but was never proven here: one fsync of its parent, once per process.
A directory that goes (a purge removes the site's tree) is forgotten when its removal is seen
(``forget``: the lock file's ENOENT where it was proven, or a ``mkdir`` ENOENT under a proven parent), and
proven again when it is made again. The set is bounded by the fan-out (65,536 leaves and 256 parents
per site). What this cannot see: a purge that removed a directory proven here and another process that
made it again and died before fsyncing its parent, all before this process's next log there.

A first commit runs its log's entry fsync on a helper thread while it fdatasyncs the frames
(``log_entry_alongside``, issue 35 P14): the two are not ordered against each other, both are done before
the acknowledgement, and so a new conversation's first append waits for two syncs in a row (the
manifest's creation record, then these two at once), not three.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable

from .fileio import FileOps

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
        threading.Thread(target=self._run, name="logstore-entry-fsync", daemon=True).start()

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


class DurableDirs:
    """A set of absolute directory paths; thread-safe by the GIL (``set`` membership and ``add``), and
    a race only makes two threads prove the same directory."""

    __slots__ = ("_ops", "_proven")

    def __init__(self, ops: FileOps) -> None:
        self._ops = ops
        self._proven: set[str] = set()

    def __contains__(self, path: str) -> bool:
        return path in self._proven

    def ensure(self, path: str) -> None:
        """Make ``path`` (absolute) exist with every entry on the way durable, unless already proven.
        Raises ``OSError`` (ENOENT: a parent went meanwhile)."""
        if path not in self._proven:
            try:
                self._ops.makedirs_durable(os.path.abspath(path), self._proven)
            except FileNotFoundError:  # a parent proven here went since (a purge): prove again next time
                self.forget()
                raise

    def prove(self, path: str) -> None:
        """``ensure`` of a directory known to exist (a log was just created in it): no walk, one fsync of
        its parent unless proven (the levels above: ``makedirs_durable``'s rule for the deepest existing
        level). Raises ``OSError``."""
        if path not in self._proven:
            self._ops.fsync_dir(os.path.dirname(path))
            self._proven.add(path)

    def log_entry(self, directory: str) -> None:
        """A log in ``directory`` is about to have its first frames vouched for: by its first commit, or by
        a recovery taking in frames from byte 0 that no record of this boot vouched for (their writer may
        have died before this very fsync). Makes the log's entry durable (fsync of ``directory``), then the
        directory's own (``prove``). Raises ``OSError``."""
        self._ops.fsync_dir(directory)
        self.prove(directory)

    def log_entry_alongside(self, directory: str, sync: Callable[[], None]) -> None:
        """``sync()`` (the ``fdatasync`` of a new log's first frames) and ``log_entry(directory)`` at once,
        the entry on a helper thread. Neither is ordered against the other, and both are done before the
        first frames are acknowledged: a crash between them leaves an entry with no durable frame or
        durable frames with no entry, never acknowledged either way, the states a crash between the two in
        a row already left. Returns only once both are done (also when ``sync`` raises: no fsync of ours
        outlives a failed commit); raises ``sync``'s error first, else the entry's. At interpreter exit
        (no new threads) the two run in a row."""
        try:
            helper = _idle.pop()
        except IndexError:
            try:
                helper = _Helper()
            except RuntimeError:  # interpreter shutdown: no new threads; the two in a row
                sync()
                self.log_entry(directory)
                return
        helper.start(lambda: self.log_entry(directory))
        try:
            sync()
        finally:
            helper.wait()  # an interrupt here propagates; the helper, never given back, finishes alone
        error, helper.error = helper.error, None
        _idle.append(helper)  # given back only after its error was taken: another commit resets it
        if error is not None:
            raise error

    def forget(self) -> None:
        """A directory was found gone (a purge): prove everything again from here on."""
        self._proven.clear()
