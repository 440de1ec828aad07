"""The engine's figures for whoever watches them (the server's ``/metrics``), neither importing the other.

A backend reports what only it can see — how long a commit's fsync took, how many callers' batches one
group commit carried, how many bytes became durable, how many conversations it holds open — to the one
process-wide observer, if one is installed. Nothing here does I/O or keeps state beyond the reference;
with no observer installed the cost is one global read per commit.

Process-wide rather than passed to each store: stores are built from a URL (``open_store``) that carries
no server objects, and a metrics registry is process-wide anyway (each ``--workers`` process reports its
own figures and ``/metrics`` adds them up).
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["EngineObserver", "set_observer", "current"]


class EngineObserver(Protocol):
    def commit(self, *, requests: int, nbytes: int, fsync_seconds: float) -> None:
        """One durable group commit: ``requests`` callers' batches, ``nbytes`` written, the fsync's time."""
        ...

    def conversations_opened(self, delta: int) -> None:
        """The number of conversations held open changed by ``delta`` (negative on eviction/close)."""
        ...


_observer: EngineObserver | None = None


def set_observer(observer: EngineObserver | None) -> EngineObserver | None:
    """Install ``observer`` (None removes it); returns the one it replaces."""
    global _observer
    previous, _observer = _observer, observer
    return previous


def current() -> EngineObserver | None:
    return _observer
