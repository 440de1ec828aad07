"""The backend contract suite's one seam: the list of backends under test.

Every test in tests/contract/ takes the ``backend`` fixture (directly or through ``store``) and so runs once
per entry of ``BACKENDS``. A new backend adds one factory to that list and nothing else: the factory
receives a fresh scratch directory and the test's monkeypatch, and returns a ``Backend`` whose ``open()``
gives a store over *the same* storage each time it is called (close + open is a reopen, as a server
restart), and whose optional ``set_clock`` replaces the clock that stamps ``recorded_at``.

A store is a ``StoreLike``: ``append / append_json / recall / replay / list_conversations / close``,
each taking ``site`` first, with the signatures and defaults of ``logstore.Store``; it must be safe to call
from several threads at once.
"""

from __future__ import annotations

import importlib
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from logstore import Store

# The backend protocol the server depends on (moving to logstore.core with the package split).
from server.mcp.handlers import StoreLike


@dataclass(frozen=True)
class Backend:
    name: str
    open: Callable[[], StoreLike]
    # Installs ``now`` (microseconds since the Unix epoch) as the clock behind recorded_at, for this test
    # only; None when the backend cannot (tests that need it are skipped for that backend).
    set_clock: Callable[[Callable[[], int]], None] | None = None
    # The store URL of the same storage (``logstore.core.factory.open_store``): the operator CLI
    # (tests/contract/test_erasure.py) and other processes (tests/contract/test_cross_process.py).
    url: str | None = None


def file_backend(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    data_dir = scratch / "data"

    def set_clock(now: Callable[[], int]) -> None:
        # Imported here, not at the top: the engine module may move (logstore/file/), and only the tests
        # that steer the clock should notice.
        monkeypatch.setattr(importlib.import_module("logstore.file.log.conversation"), "_now_us", now)

    return Backend("file", lambda: Store(data_dir, lock_timeout=2.0), set_clock, f"file:{data_dir}")


def postgres_backend(scratch: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    """A fresh schema on the test session's PostgreSQL (tests/postgres_support.py)."""
    from logstore.postgres import PostgresStore
    from tests.postgres_support import fresh_url, shared_server

    url = fresh_url(shared_server())

    def set_clock(now: Callable[[], int]) -> None:
        # recorded_at comes from the database clock; the module's test seam replaces it.
        monkeypatch.setattr(importlib.import_module("logstore.postgres.store"), "_now_us", now)

    return Backend("postgres", lambda: PostgresStore(url, lock_timeout=2.0), set_clock, url)


BACKENDS = [pytest.param(file_backend, id="file"), pytest.param(postgres_backend, id="postgres")]


@pytest.fixture(params=BACKENDS)
def backend(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Backend:
    return request.param(tmp_path, monkeypatch)


@pytest.fixture
def store(backend: Backend) -> Iterator[StoreLike]:
    s = backend.open()
    try:
        yield s
    finally:
        s.close()


class Clock:
    """Steers the backend's commit clock: ``freeze(us)`` pins it, ``shift(delta_us)`` offsets real time."""

    def __init__(self, set_clock: Callable[[Callable[[], int]], None]) -> None:
        self._frozen: int | None = None
        self._shift = 0
        set_clock(self._now)

    def _now(self) -> int:
        if self._frozen is not None:
            return self._frozen
        return time.time_ns() // 1000 + self._shift

    def freeze(self, us: int) -> None:
        self._frozen = us

    def shift(self, delta_us: int) -> None:
        self._frozen, self._shift = None, delta_us


@pytest.fixture
def clock(backend: Backend) -> Clock:
    if backend.set_clock is None:
        pytest.skip(f"backend {backend.name} cannot steer its clock")
    return Clock(backend.set_clock)
