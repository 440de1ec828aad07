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
"""

from __future__ import annotations

import os

from .fileio import FileOps

__all__ = ["DurableDirs"]


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

    def forget(self) -> None:
        """A directory was found gone (a purge): prove everything again from here on."""
        self._proven.clear()
