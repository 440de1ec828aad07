"""A site manifest's compaction: the background thread that runs it, and one compaction under
``compact.lock`` (the fold itself is ``journal.fold``)."""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable

import filelock

from .. import layout
from ..fileio import FILE_MODE, FileOps
from .journal import fold
from .state import DiskState

__all__ = ["Compactor", "compact_locked"]

log = logging.getLogger("logstore")
_MAX_BACKOFF = 60.0  # seconds between retries of a compaction that keeps failing (a full disk)


def compact_locked(
    ops: FileOps,
    directory: str,
    *,
    caught_up: Callable[[], int],
    read: Callable[[int, list[int]], DiskState],
) -> bool:
    """Fold every generation up to the newest (``caught_up()``: catch the caller's memory up, return its
    generation) into a new snapshot, then catch up again. False if another process is compacting."""
    lock = filelock.FileLock(
        os.path.join(directory, layout.COMPACT_LOCK), mode=FILE_MODE, timeout=0, thread_local=False,
        fallback_to_soft=False, preserve_lock_file=True,
    )  # fmt: skip
    try:
        lock.acquire()
    except filelock.Timeout:
        return False
    try:
        fold(ops, directory, caught_up(), read)
        caught_up()
        return True
    finally:
        lock.release()


class Compactor:
    """The thread that compacts one site manifest: started on first need, woken by ``schedule``. A
    compaction that fails (a full disk) is retried with a growing pause until one succeeds, so that a
    rolled journal's torn bytes are folded away once there is room again."""

    def __init__(self, name: str, run: Callable[[], bool]) -> None:
        self._name, self._run = name, run
        self._wanted = threading.Event()
        self._guard = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = False

    def schedule(self) -> None:
        with self._guard:
            if self._closed:
                return
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._loop, name=self._name, daemon=True)
                self._thread.start()
        self._wanted.set()

    def _loop(self) -> None:
        backoff = 0.0
        while not self._closed:
            if not self._wanted.wait(timeout=backoff or 1.0) and not backoff:
                continue
            self._wanted.clear()
            if self._closed:
                return
            try:
                self._run()
                backoff = 0.0
            except Exception:  # noqa: BLE001 - compaction is an optimisation; the journal stays valid
                log.exception("manifest compaction failed (%s); retrying", self._name)
                backoff = min(max(2 * backoff, 1.0), _MAX_BACKOFF)

    def close(self) -> None:
        """Stop the thread; a compaction in flight finishes first (before the store lets its files go)."""
        with self._guard:
            self._closed = True
            thread = self._thread
        self._wanted.set()
        if thread is not None and thread is not threading.current_thread():
            thread.join()
