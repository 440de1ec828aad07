"""Which directories this process has proven durable: the fan-out directories a new log goes into.

A new log's directory entry is made durable by its first commit (``writer.write_group``'s directory
fsync), but that says nothing about the directory's own entry in its parent, nor its parent's: a
directory that exists may have been made by an attempt, or a process, that died before fsyncing its
parent (``FileOps.makedirs_durable``). Until issue 35 a conversation's first commit trusted any fan-out
directory that existed (a hole: a process killed between its ``mkdir`` and its parent's fsync, then a
power loss after another process acknowledged a log in that directory, lost the log), and
``makedirs_durable`` paid one extra fsync on every call, proven or not.

Rule: before a log's first frame is acknowledged (and before the commit point vouches for it), its
directory is in ``DurableDirs``: this process made the directory's entry durable (fsynced its parent
after making it or finding it: ``makedirs_durable``, which adds what it proves). ``make`` (before the
lock file can be opened there) creates a missing directory with every level above it proven, and leaves
its own parent's fsync to ``ensure`` at the first commit, after the frame's ``fdatasync`` and the log's
directory fsync: on ext4 the ``mkdir`` was committed with the manifest's creation record, so that fsync
finds nothing left to write. Then:
- a new conversation in a directory already proven costs no directory work but its own entry's fsync;
- in a new fan-out directory under a proven parent: ``mkdir`` and one fsync of the parent (the extra
  fsync of the deepest existing level is skipped: that level is proven);
- in a directory that exists but was never proven here: one fsync of its parent, once per process.
A directory that goes (a purge removes the site's tree) is forgotten when its removal is seen
(``forget``: the lock file's ENOENT where it was proven, or a ``mkdir`` under a proven parent), and
proven again when it is made again. The set is bounded by the
fan-out (65,536 leaves and 256 parents per site).
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

    def make(self, path: str) -> None:
        """Create ``path`` (absolute) if missing, every level above it proven; its own entry is proven
        by ``ensure`` before anything in it is acknowledged. Raises ``OSError``."""
        self.ensure(os.path.dirname(path))
        try:
            self._ops.mkdir(path)
        except FileExistsError:
            pass
        except FileNotFoundError:  # a parent proven here went since (a purge): prove again next time
            self.forget()
            raise

    def forget(self) -> None:
        """A directory was found gone (a purge): prove everything again from here on."""
        self._proven.clear()
