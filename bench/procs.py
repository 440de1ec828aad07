"""P2 as the issue states it: N writers on N conversations as P processes x N/P threads, on one data dir
(the engine is multi-process safe: a flock per conversation, a shared manifest journal).

The worker processes are started once per bench section (``WriterProcesses``) and reused every round, so
no interpreter start-up is timed. Each round, every process opens the store, creates its conversations
(untimed), waits for a common wall-clock start and runs its threads for the round's duration. The figure
is the sum of the processes' batches divided by the span from the earliest start to the latest end, so
a process that starts late lowers it instead of inflating it.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from concurrent.futures import ProcessPoolExecutor
from types import TracebackType
from typing import Any

from logstore import Store

from .writers import engine_run

__all__ = ["WriterProcesses"]

_START_MARGIN = 1.0  # seconds from dispatch to the common start: store open + conversation creation


def _run(
    directory: str, proc: int, items: list[dict[str, Any]], threads: int, duration: float, start_at: float
) -> tuple[int, float, float]:
    """(batches, wall-clock start, wall-clock end) of one process's round."""
    with Store(directory) as store:
        prefix = f"p{os.getpid()}-{proc}-"
        count, elapsed = engine_run(store, items, threads, duration, prefix=prefix, start_at=start_at)
        end = time.time()
    return count, end - elapsed, end


class WriterProcesses:
    """``processes`` worker processes, each running ``threads`` writer threads per round."""

    def __init__(self, processes: int, threads: int) -> None:
        self.processes = processes
        self.threads = threads
        self._pool = ProcessPoolExecutor(processes, mp_context=multiprocessing.get_context("spawn"))

    def __enter__(self) -> WriterProcesses:
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._pool.shutdown(wait=True, cancel_futures=True)

    def rate(self, directory: str, items: list[dict[str, Any]], duration: float) -> float:
        """Batches/s of all processes together for one round."""
        start_at = time.time() + _START_MARGIN
        futures = [
            self._pool.submit(_run, directory, p, items, self.threads, duration, start_at)
            for p in range(self.processes)
        ]
        results = [f.result() for f in futures]
        batches = sum(r[0] for r in results)
        span = max(r[2] for r in results) - min(r[1] for r in results)
        return batches / span
