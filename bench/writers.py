"""The engine's writer loop for P1-P3 and the size sweep: ``threads`` writers appending the same batch, each
to its own conversation (or all to one), moving to a fresh conversation when the next batch would not fit
the 100,000-item limit (the cost of creating a conversation, a few fsyncs, is then part of the figure, as
it is in production). ``appends`` runs it in-process and ``procs`` in each worker process: it lives below
both so that neither imports the other.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

from logstore import Store
from logstore.core.limits import MAX_CONVERSATION_ITEMS

from .stats import run_threads

__all__ = ["engine_appends", "engine_run", "SITE"]

SITE = "bench"


class _Rotator:
    """Hands out conversation ids so that no conversation passes the item limit."""

    def __init__(self, prefix: str, batch: int) -> None:
        self._prefix = prefix
        self._batch = batch
        self._lock = threading.Lock()
        self._gen = 0
        self._used = 0

    def reserve(self) -> str:
        with self._lock:
            if self._used + self._batch > MAX_CONVERSATION_ITEMS:
                self._gen += 1
                self._used = 0
            self._used += self._batch
            return f"{self._prefix}-{self._gen:04d}"


_run_counter = [0]


def engine_appends(
    store: Store, items: list[dict[str, Any]], threads: int, duration: float, *, shared: bool = False
) -> float:
    """Batches/s of ``threads`` writers: each on its own conversation, or all on one if ``shared``."""
    count, elapsed = engine_run(store, items, threads, duration, shared=shared)
    return count / elapsed


def engine_run(
    store: Store,
    items: list[dict[str, Any]],
    threads: int,
    duration: float,
    *,
    shared: bool = False,
    prefix: str = "",
    start_at: float | None = None,
    on_start: Callable[[], None] | None = None,
    site: str = SITE,
) -> tuple[int, float]:
    """(batches, seconds) of ``engine_appends``. ``prefix`` keeps the conversations of writer processes
    apart; ``start_at`` (``time.time()``) holds the timed start until then, so that processes start
    together; ``on_start`` runs at the timed start (to read CPU clocks over the timed window only); ``site``:
    where the conversations go (one manifest journal per site)."""
    _run_counter[0] += 1
    tag = f"{prefix}run{_run_counter[0]:05d}"
    common = _Rotator(f"{tag}-shared", len(items))

    def setup(i: int) -> Callable[[], object]:
        rot = common if shared else _Rotator(f"{tag}-w{i:02d}", len(items))
        store.append(site, rot.reserve(), items)  # untimed: creates the conversation
        if start_at is not None:
            time.sleep(max(0.0, start_at - time.time()))
        return lambda: store.append(site, rot.reserve(), items)

    return run_threads(threads, setup, duration, on_start=on_start)
